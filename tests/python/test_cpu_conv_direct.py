"""The cpu kernels' direct convolution for few input channels (src/kernels/cpu/conv_direct.cpp:
C_in <= 4, kernel <= 7x7, C_in * kH * kW <= 64, stride 1 or 2, e.g. an RGB 3x3 stem) against eager, at 1 and 2
threads, with the fused activations and the edge cases of its row building (padding wider than
half the kernel, odd widths, output rows narrower than one register tile)."""
import pytest
import torch

from oprunner import check_cpu_kernels_match_eager

torch.set_num_threads(1)

ACT = {None: None, "relu": torch.nn.ReLU, "hardswish": torch.nn.Hardswish, "relu6": torch.nn.ReLU6}

# (C_in, C_out, kernel, stride, padding, H, W, activation)
CASES = [
    (3, 16, 3, 2, 1, 64, 64, "hardswish"),   # mobilenet_v3 stem, smaller image
    (1, 64, 7, 2, 3, 40, 52, "relu"),        # 7x7 stem of one channel (K 49)
    (1, 8, 3, 1, 1, 20, 33, None),           # stride 1, one input channel
    (4, 5, 5, 1, 2, 17, 40, None),           # C_out not a multiple of 4
    (2, 7, 2, 2, 0, 31, 29, "relu6"),        # even kernel, no padding
    (3, 9, 3, 2, 1, 9, 16, None),            # 8 output columns: one partial tile
    (3, 6, (3, 5), 1, (1, 2), 12, 19, "hardswish"),  # rectangular kernel and padding
    (3, 4, 3, 2, 5, 10, 21, None),           # padding wider than the kernel
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "_".join(map(str, c)))
def test_direct_conv_matches_eager(case):
    cin, cout, k, s, p, h, w, act = case
    torch.manual_seed(sum(map(hash, map(str, case))) % 1000)
    layers = [torch.nn.Conv2d(cin, cout, k, stride=s, padding=p)]
    if act is not None:
        layers.append(ACT[act]())
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(2, cin, h, w)
    check_cpu_kernels_match_eager(model, x, what=str(case))


def test_direct_conv_fewer_output_rows_than_threads():
    """Two output rows of enough work for the pool, on 3 and 9 threads (one part per row; it
    used to divide by zero)."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 64, 7, padding=3), torch.nn.ReLU()).eval()
    x = torch.randn(1, 1, 2, 300)
    check_cpu_kernels_match_eager(model, x, what="2 rows", selected=False, threads=(2, 3, 9))

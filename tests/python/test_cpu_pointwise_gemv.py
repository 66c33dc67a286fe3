"""The cpu kernels' one-pixel pointwise convolution (src/kernels/cpu/conv.cpp, pointwise_gemv: a
1x1 convolution of [N, C, 1, 1], the squeeze-excite layers after the global average pool; weights
packed in blocks of 32 output channels) against eager, at 1 and 2 threads: output channel counts
that leave partial blocks, no bias, batch 2, each fused activation kind, and weights large enough
to be split over the threads."""
import pytest
import torch

from oprunner import check_cpu_kernels_match_eager

torch.set_num_threads(1)

ACT = {None: None, "relu": torch.nn.ReLU, "hardswish": torch.nn.Hardswish, "hardsigmoid": torch.nn.Hardsigmoid}

# (batch, C_in, C_out, bias, activation)
CASES = [
    (1, 240, 960, True, "hardsigmoid"),  # mobilenet_v3_large's SE expand (split over the threads)
    (1, 960, 240, True, "relu"),         # its SE squeeze
    (2, 200, 170, True, "hardswish"),    # batch 2, a partial last block (170 = 5 * 32 + 10)
    (1, 7, 37, False, None),             # few input channels, no bias, 37 = 32 + 5
    (3, 64, 5, True, "relu"),            # one partial block only
    (1, 3, 1, True, "hardsigmoid"),      # one output channel
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "_".join(map(str, c)))
def test_one_pixel_pointwise_matches_eager(case):
    n, cin, cout, bias, act = case
    torch.manual_seed(sum(map(hash, map(str, case))) % 1000)
    layers = [torch.nn.Conv2d(cin, cout, 1, bias=bias)]
    if act is not None:
        layers.append(ACT[act]())
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(n, cin, 1, 1)
    # with fewer than 16 inputs the sums may round alike: only then is selection not checked
    check_cpu_kernels_match_eager(model, x, what=str(case), selected=cin >= 16)


def test_squeeze_excite_block_matches_eager():
    """The whole block as mobilenet_v3 has it: pool, 1x1 + relu, 1x1 + hardsigmoid, multiply."""
    class SE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(72, 24, 1)
            self.b = torch.nn.Conv2d(24, 72, 1)

        def forward(self, x):
            y = torch.nn.functional.adaptive_avg_pool2d(x, 1)
            return x * torch.nn.functional.hardsigmoid(self.b(torch.relu(self.a(y))))

    torch.manual_seed(5)
    model = SE().eval()
    x = torch.randn(2, 72, 9, 11)
    check_cpu_kernels_match_eager(model, x, what="squeeze-excite", selected=False)

"""The cpu kernels' depthwise convolution (src/kernels/cpu/conv.cpp) against eager, at 1 and 2
threads: the row kernel for 3x3 and 5x5 taps (dw_plane_rows: output rows wider than 32 columns or a
channel multiplier > 1; blocks of 64 columns, then a remainder of 1..8 vectors, the last one
masked) with each fused activation kind, strides 1, 2 and 3, dilation, padding wider than half the
kernel, and the 8-channel blocked kernel (depthwise_c8: rows of at most 32 columns) next to it."""
import pytest
import torch

import kiln
from oprunner import assert_close, check_cpu_kernels_match_eager

torch.set_num_threads(1)

ACT = {None: None, "relu": torch.nn.ReLU, "hardswish": torch.nn.Hardswish, "relu6": torch.nn.ReLU6}

# (channels, multiplier, kernel, stride, padding, dilation, H, W, activation)
CASES = [
    (5, 1, 3, 1, 1, 1, 9, 112, "relu"),        # mobilenet_v3 112x112 layer, narrower: 64 + 48 columns
    (4, 1, 3, 2, 1, 1, 11, 113, "relu"),       # stride 2, odd width: 57 columns (8 vectors, last partial)
    (3, 1, 5, 1, 2, 1, 7, 71, "hardswish"),    # 5x5: 64 + 7 columns (one masked vector)
    (6, 1, 5, 2, 2, 1, 10, 131, None),         # 5x5 stride 2: 66 columns (64 + 2)
    (3, 1, 3, 1, 0, 1, 6, 66, "relu6"),        # no padding: exactly 64 columns; generic activation
    (2, 1, 3, 3, 2, 1, 8, 200, None),          # stride 3 (element-wise phase split), wide padding
    (3, 1, 3, 1, 2, 2, 7, 40, "relu"),         # dilation 2 (taps two apart)
    (4, 2, 3, 1, 1, 1, 6, 20, "hardswish"),    # multiplier 2 (narrow rows still take the row kernel)
    (2, 3, 5, 2, 3, 1, 9, 35, None),           # multiplier 3, 5x5 stride 2, padding > kernel // 2
    (3, 1, (3, 5), 1, (1, 2), 1, 5, 50, "relu"),  # rectangular 3x5 (15 taps: flat kernel) next to them
    (16, 1, 3, 1, 1, 1, 14, 14, "hardswish"),  # 14x14: the 8-channel blocked kernel
    (11, 1, 5, 2, 2, 1, 13, 29, "relu"),       # blocked kernel, channels not a multiple of 8
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "_".join(map(str, c)))
def test_depthwise_matches_eager(case):
    c, mult, k, s, p, d, h, w, act = case
    torch.manual_seed(sum(map(hash, map(str, case))) % 1000)
    layers = [torch.nn.Conv2d(c, c * mult, k, stride=s, padding=p, dilation=d, groups=c)]
    if act is not None:
        layers.append(ACT[act]())
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(2, c, h, w)
    check_cpu_kernels_match_eager(model, x, what=str(case))


def test_depthwise_rows_many_planes_two_threads():
    """Enough planes and work for the pool to split them (mobilenet_v3's 16 x 112 x 112 layer
    with a bias-free convolution), so that each thread's first plane and later planes (the padded
    buffer reused) are checked."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), torch.nn.ReLU()).eval()
    x = torch.randn(1, 16, 112, 112)
    check_cpu_kernels_match_eager(model, x, what="16 x 112 x 112", selected=False)


def test_depthwise_layers_of_different_layouts_in_sequence():
    """Consecutive depthwise layers whose padded buffers differ (padding 2 then 1 on the same plane
    size, then stride 2, then the first layout again): each thread's buffer, kept between calls,
    is laid out and zeroed again for each, so no interior value of one layer lands in another's
    padding."""
    torch.manual_seed(9)
    c = 6
    model = torch.nn.Sequential(
        torch.nn.Conv2d(c, c, 5, padding=2, groups=c), torch.nn.ReLU(),
        torch.nn.Conv2d(c, c, 3, padding=1, groups=c),
        torch.nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c), torch.nn.Hardswish(),
        torch.nn.Conv2d(c, c, 5, padding=2, groups=c)).eval()
    x = torch.randn(1, c, 36, 70) + 3.0  # nonzero everywhere: stale values in the padding would show
    data = kiln.export(model, (x,), verbose=False).data
    with torch.no_grad():
        expected = model(x).numpy()
    for threads in (1, 2):
        prog = kiln.load_bytes(data, num_threads=threads)
        for _ in range(2):
            assert_close(prog.run(x.numpy())[0], expected, rel=1e-5, what=f"{threads} threads")

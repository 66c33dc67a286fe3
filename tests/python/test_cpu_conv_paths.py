"""Special paths of the cpu convolution kernel (src/kernels/cpu/conv.cpp) against PyTorch eager,
at 1 and 2 threads: the direct pointwise kernel (1x1, stride 1, one group, C_in <= 256, or up to
1024 on planes of at most 64 pixels: every tile shape, column tails of 1..15 (a tail of 1 column
has its own kernel, pw_one_column), channel tails of 1..5, batch > 1, fused activations with a
compile-time kind and the generic one, no bias, fused residual adds), and the GEMM path just
past its limits.

fp32 tolerance: max abs error <= 1e-5 * max|expected| (sums of at most 1025 products).
"""
import pytest
import torch

import kiln
from oprunner import assert_close

torch.set_num_threads(1)

ACTS = {"none": None, "relu": torch.nn.ReLU, "hardswish": torch.nn.Hardswish, "sigmoid": torch.nn.Sigmoid}

# (batch, C_in, C_out, H, W, bias, activation)
POINTWISE = [
    (1, 16, 64, 24, 24, True, "relu"),      # full 6x16 tiles, channel tail 4
    (2, 3, 7, 5, 9, True, "hardswish"),     # 45 columns: tail 13; channel tail 1; batch 2
    (1, 24, 6, 7, 7, False, "none"),        # 49 columns: tail of 1 (one-vector path); no bias
    (1, 1, 2, 4, 4, True, "sigmoid"),       # one input channel, 16 columns, generic post-op
    (1, 256, 12, 14, 14, True, "relu"),     # the largest C_in the direct path takes
    (1, 257, 12, 14, 14, True, "none"),     # just past it: the GEMM path
    (3, 40, 20, 33, 31, True, "hardswish"), # odd plane (1023 columns), several column blocks
    (1, 200, 242, 7, 7, True, "relu"),      # few column blocks: at 2 threads the channels are split too
    (1, 960, 20, 7, 7, True, "hardswish"),  # C_in > 256 on a 7x7 plane: direct, one-column tail
    (2, 301, 13, 1, 33, True, "none"),      # 33 columns (tail of 1), channel tail 1, batch 2
    (1, 3, 5, 1, 17, True, "relu"),         # one-column tail with fewer than 4 input channels
    (1, 1024, 7, 8, 8, False, "sigmoid"),   # the largest C_in on a small plane; 64 columns, no bias
    (1, 1025, 8, 7, 7, True, "none"),       # just past it: the GEMM path
    (1, 300, 8, 9, 9, True, "relu"),        # C_in > 256 on 81 pixels: the GEMM path
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", POINTWISE, ids=[f"n{c[0]}_{c[1]}to{c[2]}_{c[3]}x{c[4]}_{c[6]}" for c in POINTWISE])
def test_pointwise_matches_eager(case, threads):
    n, cin, cout, h, w, bias, act = case
    torch.manual_seed(cin * 1000 + cout)
    layers = [torch.nn.Conv2d(cin, cout, 1, bias=bias)]
    if ACTS[act] is not None:
        layers.append(ACTS[act]())
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(n, cin, h, w)
    with torch.no_grad():
        expected = model(x).numpy()
    res = kiln.export(model, (x,), verbose=False)
    prog = kiln.load_bytes(res.data, num_threads=threads)
    assert_close(prog.run(x.numpy())[0], expected, what=f"{case}, {threads} threads")
    if act != "none":
        assert prog.method().num_fused_instructions == 1


class Residual(torch.nn.Module):
    """Inverted-residual-like block: expand 1x1 + relu, depthwise 3x3, project 1x1, then the
    residual aten.add in the order and with the alpha of `mode`:
      "conv_first": project(y) + x; "conv_second": x + project(y); "alpha2": x + 2 * project(y)
      (not fused: alpha != 1); "act": relu(project(y)) + x (the relu is fused, the add is not);
      "self": x + c(x) where c reads x directly (C_in == C_out)."""

    def __init__(self, c, mode):
        super().__init__()
        self.mode = mode
        self.expand = torch.nn.Conv2d(c, 3 * c, 1)
        self.dw = torch.nn.Conv2d(3 * c, 3 * c, 3, padding=1, groups=3 * c)
        self.project = torch.nn.Conv2d(3 * c, c, 1)
        self.direct = torch.nn.Conv2d(c, c, 1)

    def forward(self, x):
        if self.mode == "self":
            return x + self.direct(x)
        y = self.project(self.dw(torch.relu(self.expand(x))))
        if self.mode == "conv_first":
            return y + x
        if self.mode == "conv_second":
            return x + y
        if self.mode == "alpha2":
            return torch.add(x, y, alpha=2.0)
        return torch.relu(y) + x


# (mode, batch, C, H, W, fused instructions with the cpu kernels: the expand conv's relu, plus the add)
RESIDUAL = [
    ("conv_first", 1, 16, 12, 12, 2),
    ("conv_second", 2, 8, 5, 9, 2),   # 45 columns: tile tails; batch 2
    ("alpha2", 1, 8, 6, 6, 1),
    ("act", 1, 8, 7, 7, 2),           # relu fused instead of the add
    ("self", 1, 7, 9, 11, 1),         # the residual is the convolution's own input
    ("conv_first", 1, 96, 7, 7, 2),   # project conv 288 -> 96 on 7x7: C_in > 256, one-column tail
    ("conv_second", 2, 100, 1, 17, 2),  # 300 -> 100 on 17 columns (16 + 1), batch 2
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", RESIDUAL, ids=[c[0] for c in RESIDUAL])
def test_residual_add_fusion_matches_eager(case, threads):
    mode, n, c, h, w, fused = case
    torch.manual_seed(c * 100 + h)
    model = Residual(c, mode).eval()
    x = torch.randn(n, c, h, w)
    with torch.no_grad():
        expected = model(x).numpy()
    res = kiln.export(model, (x,), verbose=False)
    prog = kiln.load_bytes(res.data, num_threads=threads)
    assert_close(prog.run(x.numpy())[0], expected, what=f"{case}, {threads} threads")
    ref = kiln.load_bytes(res.data, num_threads=threads, portable_kernels_only=True)
    assert_close(ref.run(x.numpy())[0], expected, what=f"{case}, portable kernels")
    assert prog.method().num_fused_instructions == fused

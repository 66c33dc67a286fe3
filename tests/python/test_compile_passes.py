"""Compile passes that rewrite what exporters spell out elementwise (include/kiln/compiler.h):
fuse_hardswish (x * clamp(x + 3, 0, 6) / 6, as Paddle2ONNX writes hardswish in the PP-OCR models)
and fold_scalar_affine (a scalar mul/add after a convolution, PP-LCNetV3's learnable affine
block). The programs' results equal PyTorch eager's, and each rewrite happens only where it is exact.

fp32 tolerance: max abs error <= 1e-5 * max|expected|.
"""
import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close, has_avx2_fma


class Spelled(torch.nn.Module):
    """conv, then hardswish spelled `variant`; `extra` also returns the clamp (an intermediate
    read twice: must not be rewritten)."""

    def __init__(self, variant: str, extra: bool = False):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.variant, self.extra = variant, extra

    def forward(self, x):
        x = self.conv(x)
        if self.variant == "div":
            c = torch.clamp(x + 3, 0, 6)
            y = x * c / 6
        elif self.variant == "swapped":
            c = torch.nn.functional.hardtanh(3 + x, 0.0, 6.0)
            y = (c * x) / 6
        elif self.variant == "mul_sixth":
            c = torch.clamp(x + 3, 0, 6)
            y = x * c * torch.tensor(1.0 / 6.0)
        elif self.variant == "not_three":
            c = torch.clamp(x + 3.5, 0, 6)
            y = x * c / 6
        else:  # "relu6": clamp(0, 6) with another max: not hardswish
            c = torch.clamp(x + 3, 0, 5)
            y = x * c / 6
        return (y, c) if self.extra else y


@pytest.mark.parametrize("variant,extra,recognized", [
    ("div", False, 1), ("swapped", False, 1), ("mul_sixth", False, 1),
    ("not_three", False, 0), ("relu6", False, 0), ("div", True, 0)])
def test_hardswish_spelled_out(variant, extra, recognized):
    torch.manual_seed(0)
    m = Spelled(variant, extra).eval()
    x = torch.randn(1, 3, 12, 10) * 3
    with torch.no_grad():
        want = m(x)
    want = [t.numpy() for t in (want if extra else (want,))]
    res = kiln.export(m, (x,), verbose=False)
    assert res.report["methods"][0]["num_hardswish"] == recognized
    for portable in (False, True):
        got = kiln.load_bytes(res.data, portable_kernels_only=portable).run(x.numpy())
        for g, w in zip(got, want):
            assert_close(g, w, rel=1e-5, what=f"{variant} extra={extra} portable={portable}")
    if recognized and not extra:  # the recognized activation is fused into the convolution
        assert kiln.load_bytes(res.data).method().num_fused_instructions >= 1 or not has_avx2_fma()


class Affine(torch.nn.Module):
    """conv, then a scalar affine spelled `variant` (PP-LCNetV3's learnable affine block)."""

    def __init__(self, variant: str, bias: bool = True):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=bias)
        self.variant = variant
        self.s = torch.nn.Parameter(torch.tensor([1.7]))
        self.t = torch.nn.Parameter(torch.tensor([-0.4]))

    def forward(self, x):
        y = self.conv(x)
        if self.variant == "mul_add":
            return torch.nn.functional.hardswish(y * self.s + self.t)
        if self.variant == "add":
            return self.t + y
        if self.variant == "mul":
            return self.s * y
        if self.variant == "read_twice":  # y also feeds the residual: nothing to fold
            return y * self.s + self.t + y
        return y * torch.ones(1, 8, 1, 1) * 2  # "per_channel": not a scalar, not folded


@pytest.mark.parametrize("variant,bias,folded", [
    ("mul_add", True, 1), ("mul_add", False, 1), ("add", True, 1), ("mul", False, 1),
    ("read_twice", True, 0), ("per_channel", True, 0)])
def test_scalar_affine_folded_into_conv(variant, bias, folded):
    torch.manual_seed(3)
    m = Affine(variant, bias).eval()
    x = torch.randn(2, 3, 9, 7)
    with torch.no_grad():
        want = m(x).numpy()
    res = kiln.export(m, (x,), verbose=False)
    assert res.report["methods"][0]["num_affine_folded"] == folded
    for portable in (False, True):
        got = kiln.load_bytes(res.data, portable_kernels_only=portable).run(x.numpy())[0]
        assert_close(got, want, rel=1e-5, what=f"{variant} bias={bias} portable={portable}")


@pytest.mark.parametrize("scale", [1e38, 1e-42])
def test_extreme_scale_is_not_folded(scale):
    """conv * 1e38 + 1: folding would put the scale into the convolution's partial sums (overflow
    where eager's result is finite); such scales are left as a separate multiplication."""
    torch.manual_seed(4)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1).eval()

    class M(torch.nn.Module):
        def forward(self, x):
            return conv(x) * scale + 1

    x = torch.randn(1, 3, 16, 16) * 4
    with torch.no_grad():
        want = M()(x).numpy()
    res = kiln.export(M(), (x,), verbose=False)
    assert res.report["methods"][0]["num_affine_folded"] == 0
    got = kiln.load_bytes(res.data).run(x.numpy())[0]
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    assert_close(got[finite], want[finite], rel=1e-5, what=f"scale {scale}")

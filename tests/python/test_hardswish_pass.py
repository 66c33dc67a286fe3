"""The compile pass that recognizes hardswish written out elementwise (fuse_hardswish,
include/kiln/compiler.h), as Paddle2ONNX writes it in the PP-OCR models: the program's results
equal PyTorch eager's, and the pattern is rewritten only where it is exactly hardswish.

fp32 tolerance: max abs error <= 1e-5 * max|expected|.
"""
import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close


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
        assert kiln.load_bytes(res.data).method().num_fused_instructions >= 1 or not _has_avx2_fma()


def _has_avx2_fma():
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags

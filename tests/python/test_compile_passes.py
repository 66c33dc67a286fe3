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
from oprunner import assert_close


def export_matching_eager(m, x, what, rel=1e-5, kernel_sets=(False, True)):
    """Exports m on input x and checks every output against eager's m(x) (assert_close, `rel`)
    with the cpu kernels and the portable ones (portable_kernels_only in `kernel_sets`).
    Returns the ExportResult and its method's compiler report."""
    with torch.no_grad():
        want = m(x)
    want = [t.numpy() for t in (want if isinstance(want, tuple) else (want,))]
    res = kiln.export(m, (x,), verbose=False)
    for portable in kernel_sets:
        got = kiln.load_bytes(res.data, portable_kernels_only=portable).run(x.numpy())
        for g, w in zip(got, want):
            assert_close(g, w, rel=rel, what=f"{what} portable={portable}")
    return res, res.report["methods"][0]


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
    res, rep = export_matching_eager(m, x, f"{variant} extra={extra}")
    assert rep["num_hardswish"] == recognized
    if recognized and not extra:  # the recognized activation is fused into the convolution
        assert kiln.load_bytes(res.data).method().num_fused_instructions >= 1


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
    _, rep = export_matching_eager(m, x, f"{variant} bias={bias}")
    assert rep["num_affine_folded"] == folded


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


class ClipMlp(torch.nn.Module):
    """A CLIP MLP: fc1, quick-GELU spelled `variant`, fc2 (OpenAI CLIP model.py: x * sigmoid(1.702 x))."""

    def __init__(self, variant: str):
        super().__init__()
        self.fc1 = torch.nn.Linear(24, 40)
        self.fc2 = torch.nn.Linear(40, 24)
        self.variant = variant

    def forward(self, h):
        x = self.fc1(h)
        if self.variant == "clip":
            g = x * torch.sigmoid(1.702 * x)
        elif self.variant == "swapped":
            g = torch.sigmoid(x * 1.702) * x
        elif self.variant == "negative":  # any nonzero c: silu(c x) / c = x sigmoid(c x)
            g = x * torch.sigmoid(-0.75 * x)
        elif self.variant == "gate_read_twice":  # the sigmoid also feeds the output: not rewritten
            s = torch.sigmoid(1.702 * x)
            return self.fc2(x * s), s
        elif self.variant == "input":  # x is the method input and a pad reads the product: rewritten, nothing folded
            g = h * torch.sigmoid(1.702 * h)
            return self.fc2(torch.nn.functional.pad(g, (0, 16)))
        else:  # "other_x": sigmoid(c * x) times another tensor: not quick-GELU
            g = (x + 1) * torch.sigmoid(1.702 * x)
        return self.fc2(g)


@pytest.mark.parametrize("variant,rewritten,folded", [
    ("clip", 1, 2), ("swapped", 1, 2), ("negative", 1, 2), ("gate_read_twice", 0, 0), ("input", 1, 0),
    ("other_x", 0, 0)])
def test_quick_gelu_rewritten_and_folded_into_the_linears(variant, rewritten, folded):
    """x * sigmoid(c x) becomes silu(c x) * (1 / c); c folds into fc1 (whose stores then apply the
    silu) and 1 / c into fc2. Results equal eager's with the portable and the cpu kernels."""
    torch.manual_seed(5)
    m = ClipMlp(variant).eval()
    h = torch.randn(2, 7, 24) * 2
    res, rep = export_matching_eager(m, h, variant)
    assert rep["num_quick_gelu"] == rewritten
    assert rep["num_affine_folded"] == folded
    if folded == 2:  # fc1 + silu + fc2: three kernel calls, the silu fused into fc1
        assert rep["num_nodes"] == 3
        assert kiln.load_bytes(res.data).method().num_fused_instructions == 1


class Views(torch.nn.Module):
    """Views (view / flatten / unsqueeze / squeeze) between computing ops, one read after its
    source was read elsewhere, one of the method input and one returned."""

    def forward(self, x):
        y = torch.relu(x * 2)                  # [2, 6, 4]
        v = y.view(2, 24)                      # zero-copy: y's bytes
        w = v.unsqueeze(1)                     # a view of a view: still y's bytes
        s = torch.sigmoid(y)                   # y read again after the views were made
        z = (w.squeeze(1) * 3).sum(dim=1)      # the views read after y's other reader
        q = x.view(12, 4) + 1                  # a view of the method input: copied
        return z, s, q, s.view(48)             # a returned view: copied


def test_views_share_their_input_bytes():
    """Planned views take their input's bytes (no copy, no arena space of their own); views of a
    method input and returned views keep their own. Results equal eager's."""
    x = torch.randn(2, 6, 4)
    _, rep = export_matching_eager(Views(), x, "views", rel=1e-6)
    # Planned values without reuse: x (48 floats), x * 2, y, s, the squeeze's product, z (2),
    # x.view (48), q (48), s.view (48); the three zero-copy views (v, w, w.squeeze) take none.
    floats = [48, 48, 48, 48, 48, 2, 48, 48, 48]
    assert rep["activation_bytes"] == sum((f * 4 + 63) // 64 * 64 for f in floats), rep


@pytest.mark.parametrize("bias_shape,folded", [((45,), 1), ((1,), 0), ((5, 1), 0), ((5, 45), 0), (None, 1)])
def test_scalar_affine_after_a_linear_only_with_a_per_feature_bias(bias_shape, folded):
    """F.linear(x, w, b) * 2 + 1: folded into the weight and bias when b is [out_features] or
    absent; a bias that broadcasts from another shape ([1], [rows, 1], [rows, out]) is left alone."""
    torch.manual_seed(6)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(45, 37))
            self.b = torch.nn.Parameter(torch.randn(*bias_shape)) if bias_shape else None

        def forward(self, x):
            return torch.nn.functional.linear(x, self.w, self.b) * 2 + 1

    m = M().eval()
    x = torch.randn(5, 37)
    _, rep = export_matching_eager(m, x, f"bias {bias_shape}")
    assert rep["num_affine_folded"] == folded


def test_hardswish_times_a_sixth_before_a_conv_is_still_recognized():
    """y * clamp(y + 3, 0, 6) * (1/6) feeding a convolution: recognized as hardswish (the affine
    folding, which runs after it, would otherwise take the 1/6 into the convolution's weights)."""
    torch.manual_seed(7)
    c1, c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 4, 1)

    class M(torch.nn.Module):
        def forward(self, x):
            y = c1(x)
            return c2(y * torch.clamp(y + 3, 0, 6) * torch.tensor(1.0 / 6.0))

    x = torch.randn(1, 3, 10, 9) * 3
    _, rep = export_matching_eager(M(), x, "hardswish before conv", kernel_sets=(False,))
    assert rep["num_hardswish"] == 1 and rep["num_affine_folded"] == 0
    assert rep["num_nodes"] == 3


def test_quick_gelu_with_an_out_of_range_scale_is_left_alone():
    """x * sigmoid(c x) with |c| > 1e3 is not rewritten (the rewrite's c x could overflow where
    eager's result is finite); it still equals eager's."""
    torch.manual_seed(8)
    fc = torch.nn.Linear(6, 6)

    class M(torch.nn.Module):
        def forward(self, h):
            x = fc(h)
            return x * torch.sigmoid(5e3 * x)

    h = torch.randn(3, 6)
    _, rep = export_matching_eager(M(), h, "c = 5e3", kernel_sets=(False,))
    assert rep["num_quick_gelu"] == 0


class RmsNormSpelled(torch.nn.Module):
    """The RMS norm as transformers' models write it out (LlamaRMSNorm / Qwen3RMSNorm: x *
    rsqrt(mean(x^2) + eps) * w; Gemma3RMSNorm: * (1 + w)), spelled `variant`, between two linears."""

    def __init__(self, variant: str):
        super().__init__()
        self.fc = torch.nn.Linear(24, 24)
        self.out = torch.nn.Linear(24, 8)
        self.weight = torch.nn.Parameter(torch.randn(24))
        self.variant = variant

    def forward(self, h):
        x = self.fc(h)
        v = self.variant
        sq = x * x if v == "square_mul" else x.pow(2)
        r = torch.rsqrt(sq.mean(-1, keepdim=True) + 1e-6)
        if v == "llama":
            y = self.weight * (x * r)
        elif v in ("swapped", "square_mul"):
            y = (r * x) * self.weight
        elif v == "gemma":
            y = (x * r) * (1.0 + self.weight)
        elif v == "no_weight":
            y = x * r
        elif v == "mean_dim0":  # not a norm over the last dim: left alone
            y = self.weight * (x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6))
        elif v == "cube":  # pow 3: left alone
            y = self.weight * (x * torch.rsqrt(x.pow(3).abs().mean(-1, keepdim=True) + 1e-6))
        elif v == "rsqrt_read_twice":  # an intermediate read elsewhere: left alone
            y = self.weight * (x * r) + r
        else:
            raise ValueError(v)
        return self.out(y)


@pytest.mark.parametrize("variant,rewritten", [
    ("llama", 1), ("swapped", 1), ("square_mul", 1), ("gemma", 1), ("no_weight", 1), ("mean_dim0", 0),
    ("cube", 0), ("rsqrt_read_twice", 0)])
def test_rms_norm_recognized(variant, rewritten):
    """w * (x * rsqrt(mean(x^2, -1, keepdim) + eps)) becomes one aten.rms_norm (the cpu kernels' one
    pass per row); other spellings are left as they are. Results equal eager's with the portable and
    the cpu kernels."""
    torch.manual_seed(11)
    m = RmsNormSpelled(variant).eval()
    h = torch.randn(2, 5, 24) * 3
    res, rep = export_matching_eager(m, h, variant)
    assert rep["num_rms_norm"] == rewritten
    if rewritten:  # fc, rms_norm, out
        assert rep["num_nodes"] == 3, rep

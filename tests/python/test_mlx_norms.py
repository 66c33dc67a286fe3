"""Numerically stable norms on the mlx delegate (issue 22), on MLX's CPU device.

Inputs whose mean is large against their spread (1000 + 0.01 * randn): a float32 mean of such
values is off by up to half an ulp of 1000 (3e-5), i.e. 3e-3 of the spread, so a norm that
normalizes x with that mean, or folds it into one shift (x * scale + shift, PyTorch's CPU form),
inherits that error. The reference is therefore the math in float64 (PyTorch eager on the float64
copy of the same float32 input): PyTorch eager in float32 is itself off by 3.3e-3 on outputs of
~3 for issue 22's case 3 (1e-3 relative), so "matches eager within 1e-4" is measured against
eager in float64. float32: max abs error <= 1e-5 x max|reference| (issue 22's float32 table
tolerance; the 1e-4 of the must-show is looser). float16 compute: <= 2e-2 (docs/mlx.md
"Precision") against the math on the float32 input, and <= 1e-3 against the math on the input
rounded to float16: the segment's input conversion is the only float16 rounding, the statistics
run in float32.

Also: support decided by building (Backend::check_build) for mlx — a payload node that does not
build is named, and only that node is refused.
"""
import os

import numpy as np
import pytest
import torch

os.environ["KILN_MLX_DEVICE"] = "cpu"

import kiln  # noqa: E402
from delegate_util import check_all_delegated  # noqa: E402

F = torch.nn.functional
torch.set_num_threads(1)
REL32 = 1e-5
HALF_REL = 2e-2    # docs/mlx.md "Precision": tests require <= 2e-2 (fp16, bf16)
HALF_ROUNDED = 1e-3  # issue 22: reduced precision fp16 <= 1e-3, here against the fp16-rounded input

pytestmark = pytest.mark.skipif("mlx" not in kiln._kiln.backend_names(),
                                reason="the mlx backend is not built (no MLX CMake package from `python -m mlx --cmake-dir`)")


def rel_err(out, ref):
    ref = np.asarray(ref, np.float64)
    return float(np.abs(np.asarray(out, np.float64) - ref).max() / np.abs(ref).max())


def export_mlx(module, x, compute_dtype="float32"):
    """Exports `module` on (x,) with require_delegation='mlx' (every node on mlx), runs it."""
    res = kiln.export(module, (x,), backends=("mlx",), require_delegation="mlx", compute_dtype=compute_dtype,
                      verbose=False)
    check_all_delegated(res.report["methods"][0]["delegation"], "mlx")
    (out,) = res.load().run(x.numpy())
    return out


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def offset(shape, mean, spread, seed):
    g = torch.Generator().manual_seed(seed)
    return mean + spread * torch.randn(*shape, generator=g)


# ---------------------------------------------------------------- issue 22, case 3


def test_issue22_case3_group_norm_matches_eager():
    torch.manual_seed(0)
    x = 1000 + 0.01 * torch.randn(1, 4, 8, 8)
    out = export_mlx(Fn(lambda t: F.group_norm(t, 2, eps=1e-6)), x)
    ref = F.group_norm(x.double(), 2, eps=1e-6).numpy()
    err = rel_err(out, ref)
    assert err <= 1e-4, err
    assert err <= REL32, err


# ---------------------------------------------------------------- every norm, mean 1000, spread 0.01


def _affine(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g), torch.randn(n, generator=g)


W8, B8 = _affine(8, 1)
W64, B64 = _affine(64, 2)
BN_MEAN = 1000 + 0.01 * torch.randn(6, generator=torch.Generator().manual_seed(3))
BN_VAR = 1e-4 * (0.5 + torch.rand(6, generator=torch.Generator().manual_seed(4)))

# (name, input shape, f(x) on float32 or float64 tensors of the same values)
NORMS = [
    ("group_norm affine", (2, 8, 5, 7), lambda t: F.group_norm(t, 4, W8.to(t.dtype), B8.to(t.dtype), eps=1e-5)),
    ("layer_norm [64]", (3, 5, 64), lambda t: F.layer_norm(t, [64], W64.to(t.dtype), B64.to(t.dtype), eps=1e-5)),
    ("layer_norm [8, 8]", (2, 3, 8, 8), lambda t: F.layer_norm(t, [8, 8], eps=1e-6)),
    ("layer_norm [4096]", (2, 4096), lambda t: F.layer_norm(t, [4096], eps=1e-6)),
    # Instance norm is GroupNorm(C, C) (kiln capture's advice for InstanceNorm without running
    # statistics); the reference is PyTorch's instance_norm.
    ("instance norm", (2, 6, 9, 9), None),
    ("batch_norm eval", (2, 6, 5, 5), lambda t: F.batch_norm(t, BN_MEAN.to(t.dtype), BN_VAR.to(t.dtype),
                                                             W8[:6].to(t.dtype), B8[:6].to(t.dtype), False, 0.1, 1e-8)),
    ("rms_norm", (3, 64), lambda t: F.rms_norm(t, [64], W64.to(t.dtype), eps=1e-6)),
    ("var dim", (3, 7, 50), lambda t: torch.var(t, dim=[1, 2], keepdim=True)),
    ("var all, correction 0", (5, 200), lambda t: torch.var(t, correction=0)),
    ("std", (4, 300), lambda t: torch.std(t, dim=1)),
    ("var_mean[0]", (4, 300), lambda t: torch.var_mean(t, dim=1)[0]),
]


def _instance_ref(t):
    return F.instance_norm(t, eps=1e-5)


def _module(name, f, shape):
    if name == "instance norm":
        return torch.nn.GroupNorm(shape[1], shape[1], eps=1e-5, affine=False), _instance_ref
    if name == "batch_norm eval":
        bn = torch.nn.BatchNorm2d(6, eps=1e-8)
        with torch.no_grad():
            bn.running_mean.copy_(BN_MEAN)
            bn.running_var.copy_(BN_VAR)
            bn.weight.copy_(W8[:6])
            bn.bias.copy_(B8[:6])
        return bn.eval(), f
    return Fn(f), f


@pytest.mark.parametrize("name,shape,f", NORMS, ids=[n[0] for n in NORMS])
def test_norm_of_large_mean_small_spread_matches_float64(name, shape, f):
    x = offset(shape, 1000.0, 0.01, seed=10)
    module, ref_fn = _module(name, f, shape)
    out = export_mlx(module, x)
    with torch.no_grad():
        ref = ref_fn(x.double()).numpy()
    err = rel_err(out, ref)
    assert err <= REL32, f"{name}: {err}"


# ---------------------------------------------------------------- float16 compute, 100 + randn


HALF_NORMS = [
    ("group_norm", (1, 4, 8, 8), lambda t: F.group_norm(t, 2, eps=1e-6)),
    ("layer_norm", (3, 64), lambda t: F.layer_norm(t, [64], W64.to(t.dtype), B64.to(t.dtype), eps=1e-5)),
    ("var", (3, 64), lambda t: torch.var(t, dim=1)),
]


@pytest.mark.parametrize("name,shape,f", HALF_NORMS, ids=[n[0] for n in HALF_NORMS])
def test_float16_norm_of_offset_mean_input(name, shape, f):
    x = offset(shape, 100.0, 1.0, seed=11)
    out = export_mlx(Fn(f), x, compute_dtype="float16")
    assert out.dtype == np.float32
    err = rel_err(out, f(x.double()).numpy())
    assert err <= HALF_REL, f"{name}: {err}"
    # The only float16 rounding is the input's: against the math on the rounded input the error is
    # that of float32 statistics (a float16 E[x^2] - E[x]^2 at mean 100 would be off by ~1).
    err16 = rel_err(out, f(x.half().double()).numpy())
    assert err16 <= HALF_ROUNDED, f"{name}: {err16}"


def test_float16_batch_norm_of_offset_mean_input():
    x = offset((2, 6, 5, 5), 100.0, 1.0, seed=12)
    mean = 100 + torch.randn(6, generator=torch.Generator().manual_seed(13)) * 0.1
    var = 0.5 + torch.rand(6, generator=torch.Generator().manual_seed(14))
    bn = torch.nn.BatchNorm2d(6)
    with torch.no_grad():
        bn.running_mean.copy_(mean)
        bn.running_var.copy_(var)
    out = export_mlx(bn.eval(), x, compute_dtype="float16")
    with torch.no_grad():
        bn = bn.double()
        ref, ref16 = bn(x.double()).numpy(), bn(x.half().double()).numpy()
    err = rel_err(out, ref)
    assert err <= HALF_REL, err
    # The running statistics stay float32 (only x is rounded to float16).
    err16 = rel_err(out, ref16)
    assert err16 <= HALF_ROUNDED, err16

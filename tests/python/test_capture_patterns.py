"""Patterns that real models write, found by a tester who had not written the capture: each one
exported with kiln.export and compared with PyTorch eager (exact: integer, bool and data-movement
results), or refused with a clear ExportError where PyTorch's semantics cannot be kept."""
import numpy as np
import pytest
import torch

import kiln
from kiln.capture import ExportError


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def export_and_run(module, *inputs, tmp_path):
    path = str(tmp_path / "m.kiln")
    kiln.export(module, inputs, out=path, verbose=False)
    return kiln.load(path).run(*[x.numpy() for x in inputs])[0]


def assert_exact(module, *inputs, tmp_path):
    out = export_and_run(module, *inputs, tmp_path=tmp_path)
    ref = module(*inputs).numpy()
    assert out.dtype == ref.dtype and out.shape == ref.shape
    np.testing.assert_array_equal(out, ref)


I = torch.arange(-5, 5)
X = torch.tensor([[1.5, -2.0, float("inf"), 0.0], [float("nan"), 3.0, -float("inf"), -0.5]])


@pytest.mark.parametrize("name,fn", [
    ("clamp(min) int64", lambda a: a.clamp(min=0)),
    ("clamp(lo, hi) int64", lambda a: a.clamp(-2, 3)),
    ("clamp(max) int64", lambda a: torch.clamp(a, max=1)),
    ("clamp(min=0.5) int64 promotes", lambda a: a.clamp(min=0.5)),
])
def test_integer_clamp_with_number_bounds(name, fn, tmp_path):
    assert_exact(Fn(fn), I, tmp_path=tmp_path)


def test_isfinite_and_bool_products(tmp_path):
    assert_exact(Fn(torch.isfinite), X, tmp_path=tmp_path)
    assert_exact(Fn(lambda a, b: (a > 0) * (b > 0)), X, X.flip(0), tmp_path=tmp_path)


def test_getitem_with_a_constant_bool_mask(tmp_path):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("m", torch.tensor([True, False, True, True, False, False]))

        def forward(self, a):
            return a[:, self.m] * 2

    assert_exact(M(), torch.arange(24.).reshape(4, 6), tmp_path=tmp_path)


def test_getitem_with_a_runtime_bool_mask_is_refused(tmp_path):
    with pytest.raises(ExportError, match="data-dependent"):
        export_and_run(Fn(lambda a: a[a > 0]), X, tmp_path=tmp_path)


def test_as_strided_of_a_whole_tensor_and_of_its_reshape(tmp_path):
    x = torch.arange(12.).reshape(3, 4)
    assert_exact(Fn(lambda a: torch.as_strided(a, (2, 3), (1, 4), 1)), x, tmp_path=tmp_path)
    assert_exact(Fn(lambda a: torch.as_strided(a.reshape(4, 3), (2, 3), (1, 4), 1)), x, tmp_path=tmp_path)


@pytest.mark.parametrize("view", [lambda a: a[1], lambda a: a.transpose(-1, -2), lambda a: a[:, 1:]])
def test_as_strided_of_a_view_is_refused_not_wrong(view, tmp_path):
    # PyTorch indexes the storage under the view; Kiln's values are contiguous copies
    m = Fn(lambda a: torch.as_strided(view(a), (2, 3), (1, 5), 0))
    with pytest.raises(ExportError, match="as_strided of a view"):
        export_and_run(m, torch.arange(40.).reshape(2, 4, 5), tmp_path=tmp_path)


def test_instance_norm_without_running_stats_names_the_alternative(tmp_path):
    m = torch.nn.InstanceNorm2d(3).eval()
    with pytest.raises(ExportError, match=r"GroupNorm\(C, C\)"):
        export_and_run(m, torch.randn(1, 3, 5, 5), tmp_path=tmp_path)

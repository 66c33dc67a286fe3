"""aten.mm / aten.bmm / aten.addmm / aten.linear against PyTorch eager."""
import itertools

import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close, run_op

A = torch.ops.aten
torch.set_num_threads(1)  # eager on a shared 2-core machine: threads only add overhead here


def _randn(rng, shape):
    return rng.standard_normal(shape, dtype=np.float32)


def _t(x):
    return None if x is None else torch.from_numpy(x)


@pytest.mark.parametrize("n,k,m", [(3, 4, 5), (1, 1, 1), (7, 0, 3), (0, 3, 2), (17, 65, 9), (64, 300, 33)])
def test_mm_matches_torch(n, k, m):
    rng = np.random.default_rng(n * 1000 + k * 10 + m)
    a, b = _randn(rng, (n, k)), _randn(rng, (k, m))
    (out,) = run_op("aten.mm", [a, b])
    assert_close(out, A.mm(_t(a), _t(b)).numpy())


@pytest.mark.parametrize("bs,n,k,m", [(2, 3, 4, 5), (1, 1, 1, 1), (0, 2, 3, 4), (5, 7, 13, 2)])
def test_bmm_matches_torch(bs, n, k, m):
    rng = np.random.default_rng(bs + n + k + m)
    a, b = _randn(rng, (bs, n, k)), _randn(rng, (bs, k, m))
    (out,) = run_op("aten.bmm", [a, b])
    assert_close(out, A.bmm(_t(a), _t(b)).numpy())


ADDMM_SELF = [(6, 5), (5,), (1, 5), (6, 1), (), (1, 1)]


@pytest.mark.parametrize("self_shape,beta,alpha",
                         list(itertools.product(ADDMM_SELF, [1, 0.5, -2], [1, 0.5, -2])))
def test_addmm_matches_torch(self_shape, beta, alpha):
    rng = np.random.default_rng(len(self_shape))
    s, a, b = _randn(rng, self_shape), _randn(rng, (6, 7)), _randn(rng, (7, 5))
    (out,) = run_op("aten.addmm", [s, a, b], dict(beta=beta, alpha=alpha))
    ref = A.addmm(_t(s), _t(a), _t(b), beta=beta, alpha=alpha).numpy()
    assert_close(out, ref, what=f"self {self_shape} beta={beta} alpha={alpha}")


def test_addmm_beta_zero_ignores_self_nan():
    rng = np.random.default_rng(5)
    s = np.full((4, 3), np.nan, np.float32)
    a, b = _randn(rng, (4, 2)), _randn(rng, (2, 3))
    (out,) = run_op("aten.addmm", [s, a, b], dict(beta=0, alpha=0.5))
    ref = A.addmm(_t(s), _t(a), _t(b), beta=0, alpha=0.5).numpy()
    assert not np.isnan(ref).any()
    assert_close(out, ref)


@pytest.mark.parametrize("in_shape,out_f,bias", [
    ((5,), 3, True), ((5,), 3, False), ((4, 5), 3, True), ((2, 4, 5), 3, True), ((2, 4, 5), 3, False),
    ((2, 3, 4, 5), 7, True), ((0, 5), 3, True), ((4, 0), 3, True), ((2, 4, 64), 128, True),
])
def test_linear_matches_torch(in_shape, out_f, bias):
    rng = np.random.default_rng(len(in_shape) * 100 + out_f)
    x, w = _randn(rng, in_shape), _randn(rng, (out_f, in_shape[-1]))
    b = _randn(rng, (out_f,)) if bias else None
    (out,) = run_op("aten.linear", [x, w, b])
    assert_close(out, A.linear(_t(x), _t(w), _t(b)).numpy(), what=f"{in_shape}->{out_f}")
    (out,) = run_op("aten.linear", [x, w, b], constants=(1, 2))
    assert_close(out, torch.nn.functional.linear(_t(x), _t(w), _t(b)).numpy(), what=f"const {in_shape}->{out_f}")


def test_linear_broadcast_bias():
    rng = np.random.default_rng(9)
    x, w = _randn(rng, (2, 4, 5)), _randn(rng, (3, 5))
    for bshape in [(1,), (4, 3), ()]:
        b = _randn(rng, bshape)
        (out,) = run_op("aten.linear", [x, w, b])
        assert_close(out, A.linear(_t(x), _t(w), _t(b)).numpy(), what=str(bshape))


def _build_error(op, shapes, attrs=None):
    g = kiln.Graph()
    ids = [-1 if s is None else g.add_input(f"x{i}", "float32", list(s)) for i, s in enumerate(shapes)]
    with pytest.raises(kiln.KilnError) as ei:
        g.add_node(op, ids, attrs or {})
    return ei.value.args


@pytest.mark.parametrize("op,shapes,words", [
    ("aten.mm", [(3, 4), (5, 6)], ["cannot be multiplied", "3x4", "5x6"]),
    ("aten.mm", [(3, 4, 1), (4, 6)], ["self", "2-D"]),
    ("aten.bmm", [(2, 3, 4), (3, 4, 5)], ["batch"]),
    ("aten.bmm", [(2, 3, 4), (2, 5, 5)], ["cannot be multiplied"]),
    ("aten.bmm", [(3, 4), (4, 5)], ["3-D"]),
    ("aten.addmm", [(3, 5), (2, 4), (4, 5)], ["self", "broadcast"]),
    ("aten.addmm", [(2, 5), (2, 4), (3, 5)], ["mat1", "mat2", "cannot be multiplied"]),
    ("aten.linear", [(2, 5), (3, 4), None], ["weight", "in_features"]),
    ("aten.linear", [(2, 5), (3, 5), (4,)], ["bias", "broadcast"]),
    ("aten.linear", [(2, 5), (3, 5, 1), None], ["weight", "2-D"]),
    ("aten.linear", [(), (3, 5), None], ["input"]),
])
def test_linear_family_rejects_invalid_shapes(op, shapes, words):
    msg, code = _build_error(op, shapes)
    assert code == "InvalidArgument", msg
    for w in words:
        assert w in msg, (w, msg)
    fn = getattr(torch.ops.aten, op.split(".")[1])
    with pytest.raises(RuntimeError):
        fn(*[None if s is None else torch.zeros(s) for s in shapes])


def test_linear_family_declines_other_dtypes():
    g = kiln.Graph()
    a = g.add_input("a", "int64", [2, 3])
    b = g.add_input("b", "int64", [3, 2])
    with pytest.raises(kiln.KilnError) as ei:
        g.add_node("aten.mm", [a, b], {})
    assert ei.value.args[1] == "NotSupported" and "float32" in ei.value.args[0]

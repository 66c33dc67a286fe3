"""Reduction ops (sum, mean, amax, amin, argmax, _softmax, _log_softmax) against PyTorch eager.

Every case runs one node through the real compiler and runtime (oprunner.run_op) and compares
with torch.ops.aten.<op> on the same data. Tolerance: max abs error <= 1e-5 * max|expected|;
integer results are compared exactly.
"""
import itertools

import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close, run_op
from reference import softmax_float64

SHAPES = [(), (7,), (3, 5), (2, 3, 4), (3, 1, 5, 2), (2, 0, 3)]


def make(shape, dtype, rng):
    return np.asarray(_make(shape, dtype, rng))


def _make(shape, dtype, rng):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 3).astype(dtype)
    if dtype == np.uint8:
        return rng.integers(0, 256, shape).astype(dtype)
    if dtype == np.int8:
        return rng.integers(-128, 128, shape).astype(dtype)
    return rng.integers(-1000, 1000, shape).astype(dtype)


def dim_lists(rank):
    """None, [], every single dim (positive and negative), every pair, all dims."""
    out = [None, []]
    for d in range(rank):
        out += [[d], [d - rank]]
    for a, b in itertools.combinations(range(rank), 2):
        out += [[a, b], [b - rank, a]]
    if rank > 2:
        out.append(list(range(rank)))
    if rank == 0:
        out += [[0], [-1]]
    return out


def check(op, x, attrs, expected, rel=1e-5):
    (out,) = run_op(op, [x], attrs)
    assert_close(out, np.asarray(expected), rel, what=f"{op} {x.dtype}{list(x.shape)} {attrs}")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_sum_mean_float32(shape):
    rng = np.random.default_rng(1)
    x = make(shape, np.float32, rng)
    t = torch.from_numpy(x)
    for dims, keepdim in itertools.product(dim_lists(len(shape)), (False, True)):
        attrs = {"dim": dims, "keepdim": keepdim}
        check("aten.sum", x, attrs, torch.ops.aten.sum.dim_IntList(t, dims, keepdim).numpy())
        check("aten.mean", x, attrs, torch.ops.aten.mean.dim(t, dims, keepdim).numpy())


def test_sum_default_attrs_and_long_rows():
    rng = np.random.default_rng(2)
    x = make((3, 1001), np.float32, rng) + 5.0  # long rows, large mean: accumulation accuracy
    t = torch.from_numpy(x)
    check("aten.sum", x, {}, torch.sum(t).numpy())
    check("aten.mean", x, {}, torch.mean(t).numpy())
    check("aten.sum", x, {"dim": [1]}, torch.sum(t, 1).numpy())
    check("aten.mean", x, {"dim": -1, "keepdim": True}, torch.mean(t, -1, keepdim=True).numpy())


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint8, np.bool_], ids=str)
def test_sum_integer_gives_int64(dtype):
    rng = np.random.default_rng(3)
    for shape in [(), (6,), (4, 5), (2, 3, 4)]:
        x = make(shape, dtype, rng)
        t = torch.from_numpy(x)
        for dims, keepdim in itertools.product(dim_lists(len(shape)), (False, True)):
            ref = torch.ops.aten.sum.dim_IntList(t, dims, keepdim).numpy()
            assert ref.dtype == np.int64
            check("aten.sum", x, {"dim": dims, "keepdim": keepdim}, ref)


def test_sum_int64_wraps_like_torch():
    x = np.array([2**62, 2**62, 2**62, 5], dtype=np.int64)
    check("aten.sum", x, {}, torch.sum(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("op", ["aten.amax", "aten.amin"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.int8, np.uint8, np.bool_], ids=str)
def test_amax_amin(op, dtype):
    rng = np.random.default_rng(4)
    fn = getattr(torch.ops.aten, op.split(".")[1])
    for shape in [(), (7,), (3, 5), (2, 3, 4), (3, 1, 5, 2)]:
        x = make(shape, dtype, rng)
        t = torch.from_numpy(x)
        for dims, keepdim in itertools.product(dim_lists(len(shape)), (False, True)):
            d = [] if dims is None else dims
            check(op, x, {"dim": d, "keepdim": keepdim}, fn(t, d, keepdim).numpy())
    # default dim=[] reduces everything
    x = make((4, 3), dtype, rng)
    check(op, x, {}, fn(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("op", ["aten.amax", "aten.amin"])
def test_amax_amin_nan_propagates(op):
    # NaN propagates (ATen's rule; np.amax/np.amin's too, computed the same on every CPU)
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, -1.0], [np.nan, 2.0, np.nan]], dtype=np.float32)
    fn = np.amax if op == "aten.amax" else np.amin
    for dims in ([0], [1], []):
        check(op, x, {"dim": dims}, np.asarray(fn(x, axis=tuple(dims) if dims else None)))


def test_reductions_over_nonempty_dims_of_empty_tensor():
    x = np.zeros((2, 0, 3), np.float32)
    t = torch.from_numpy(x)
    check("aten.amax", x, {"dim": [2]}, torch.amax(t, [2]).numpy())
    check("aten.argmax", x, {"dim": 0}, torch.argmax(t, 0).numpy())
    check("aten.mean", x, {"dim": [1]}, torch.mean(t, [1]).numpy())  # NaN, as torch


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.int8, np.uint8], ids=str)
def test_argmax(dtype):
    rng = np.random.default_rng(5)
    for shape in [(), (7,), (3, 5), (2, 3, 4), (3, 1, 5, 2)]:
        # few distinct values: many ties, so "first index of the max" is exercised
        x = np.asarray(rng.integers(0, 4, shape).astype(dtype))
        if dtype == np.float32:
            x = np.asarray(x + np.float32(0.5))
        t = torch.from_numpy(x)
        dims = [None] + [d for k in range(len(shape)) for d in (k, k - len(shape))] + ([0, -1] if not shape else [])
        for dim, keepdim in itertools.product(dims, (False, True)):
            ref = torch.ops.aten.argmax(t, dim, keepdim).numpy()
            check("aten.argmax", x, {"dim": dim, "keepdim": keepdim}, ref)


def test_argmax_nan_and_ties():
    x = np.array([[1.0, np.nan, 3.0, np.nan], [3.0, 1.0, 3.0, 2.0], [-np.inf, -np.inf, -np.inf, -np.inf]], np.float32)
    # the first NaN counts as the maximum (ATen's rule, and np.argmax's), else the first maximum
    for dim in (None, 0, 1, -1):
        check("aten.argmax", x, {"dim": dim}, np.asarray(np.argmax(x, axis=dim), np.int64))


@pytest.mark.parametrize("op", ["aten._softmax", "aten._log_softmax"])
def test_softmax(op):
    rng = np.random.default_rng(6)
    fn = getattr(torch.ops.aten, op.split(".")[1])
    for shape in [(), (7,), (3, 5), (2, 3, 4), (3, 1, 5, 2), (2, 0, 3)]:
        for scale in (1.0, 50.0):  # large logits: the max must be subtracted
            x = np.asarray((make(shape, np.float32, rng) * scale).astype(np.float32))
            t = torch.from_numpy(x)
            rank = len(shape)
            for dim in sorted({d for k in range(max(rank, 1)) for d in (k, k - max(rank, 1))}):
                check(op, x, {"dim": dim, "half_to_float": False}, fn(t, dim, False).numpy())


@pytest.mark.parametrize("op", ["aten._softmax", "aten._log_softmax"])
def test_softmax_extreme_rows(op):
    x = np.array([[1000.0, 999.0, -1000.0], [-np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf]], np.float32)
    (out,) = run_op(op, [x], {"dim": 1})
    ref = softmax_float64(x, 1, log=op == "aten._log_softmax")  # special values: float64 reference
    # row 2 is all -inf: NaN in torch and here; rows 0-1 compared with the usual tolerance
    assert np.isnan(out[2]).all() and np.isnan(ref[2]).all()
    if op == "aten._softmax":
        assert_close(out[:2], ref[:2])
    else:  # -inf entries must match exactly; the finite ones within tolerance
        assert np.array_equal(np.isinf(out[:2]), np.isinf(ref[:2]))
        fin = np.isfinite(ref[:2])
        assert_close(out[:2][fin], ref[:2][fin])


# ---- invalid arguments: rejected when the node is added, with a message naming the problem ----

def build_error(op, inputs, attrs):
    g = kiln.Graph()
    ids = [g.add_input(f"x{i}", dt, list(shape)) for i, (dt, shape) in enumerate(inputs)]
    with pytest.raises(kiln.KilnError) as e:
        g.add_node(op, ids, attrs)
    return str(e.value)


@pytest.mark.parametrize(
    "op,inputs,attrs,needle",
    [
        ("aten.sum", [("float32", [2, 3])], {"dim": [2]}, "out of range"),
        ("aten.sum", [("float32", [2, 3])], {"dim": [-3]}, "out of range"),
        ("aten.sum", [("float32", [2, 3])], {"dim": [0, -2]}, "multiple times"),
        ("aten.mean", [("int64", [2, 3])], {}, "float32"),
        ("aten.sum", [("float16", [2, 3])], {}, "float16"),
        ("aten.amax", [("float32", [2, 0])], {"dim": [1]}, "non-zero size"),
        ("aten.amin", [("float32", [2, 0])], {}, "non-zero size"),
        ("aten.amax", [("float32", [2, 3])], {"dim": [1, 1]}, "multiple times"),
        ("aten.argmax", [("float32", [2, 3])], {"dim": 2}, "out of range"),
        ("aten.argmax", [("float32", [0, 3])], {}, "empty"),
        ("aten.argmax", [("float32", [0, 3])], {"dim": 0}, "non-zero size"),
        ("aten.argmax", [("bool", [3])], {}, "bool"),
        ("aten._softmax", [("float32", [2, 3])], {"dim": 2, "half_to_float": False}, "out of range"),
        ("aten._softmax", [("float32", [2, 3])], {"dim": 1, "half_to_float": True}, "half_to_float"),
        ("aten._log_softmax", [("float32", [2, 3])], {}, "missing required attribute 'dim'"),
        ("aten._log_softmax", [("int32", [2, 3])], {"dim": 0}, "int32"),
    ],
)
def test_invalid_arguments_rejected_at_build(op, inputs, attrs, needle):
    msg = build_error(op, inputs, attrs)
    assert op in msg and needle in msg, msg

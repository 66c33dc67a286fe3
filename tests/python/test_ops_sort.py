"""Reductions with indices, sorting, creation and layout ops (aten.any, argmin, max/min (dim),
prod, var, sort, topk, arange, full, full_like, scalar_tensor, fill, copy, flip, repeat, diagonal,
as_strided) against PyTorch eager, through the real compiler and runtime (oprunner.run_op), plus
their capture from torch.export and the mlx / xnnpack delegates' decisions.

Ordinary values are compared with torch eager (max abs error <= 1e-5 * max|expected|, integers and
indices exact); NaN and tie cases are compared with the definition of PyTorch's rules, written
out in Python (NaN sorts as the largest value; max/min/argmin return the first NaN's index).
"""
import itertools
import math
import os

import numpy as np
import pytest
import torch

import kiln
from kiln.capture import capture
from delegate_util import check_all_delegated, compile_graph, declined_reasons
from oprunner import assert_close, run_op

A = torch.ops.aten
NAN = float("nan")


def rnd(shape, dtype=np.float32, seed=0, ties=False):
    rng = np.random.default_rng(seed)
    if ties:  # few distinct values: ties everywhere
        return np.asarray(rng.integers(-2, 3, shape).astype(dtype))
    if np.dtype(dtype).kind == "f":
        return np.asarray((rng.standard_normal(shape) * 3).astype(dtype))
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) > 0.5)
    lo = 0 if dtype == np.uint8 else (-100 if dtype == np.int8 else -1000)
    return np.asarray(rng.integers(lo, 100 if dtype in (np.int8, np.uint8) else 1000, shape).astype(dtype))


def T(x):
    return torch.from_numpy(np.array(x, order="C"))  # keeps 0-d arrays 0-d


def expect_error(op, inputs, attrs, code, words):
    with pytest.raises(kiln.KilnError) as e:
        run_op(op, inputs, attrs)
    assert e.value.args[1] == code, e.value.args
    for w in words:
        assert w in e.value.args[0], e.value.args[0]


# ---------------------------------------------------------------- reductions

DTYPES = [np.float32, np.float64, np.int64, np.int32, np.int8, np.uint8, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_max_min_dim_any_argmin(dtype):
    for shape in [(), (7,), (3, 5), (2, 3, 4)]:
        x = rnd(shape, dtype, seed=len(shape), ties=dtype != np.bool_)
        t = T(x)
        dims = list(range(-len(shape), len(shape))) or [0, -1]
        for dim, keep in itertools.product(dims, (False, True)):
            for op in ("max", "min"):
                v, i = run_op(f"aten.{op}", [x], {"dim": dim, "keepdim": keep})
                rv, ri = getattr(A, op).dim(t, dim, keep)
                assert_close(v, rv.numpy(), what=f"{op} values {shape} {dim}")
                assert_close(i, ri.numpy(), what=f"{op} indices {shape} {dim}")  # ties: first index
            if dtype != np.bool_:
                (i,) = run_op("aten.argmin", [x], {"dim": dim, "keepdim": keep})
                assert_close(i, A.argmin(t, dim, keep).numpy(), what=f"argmin {shape} {dim}")
            (y,) = run_op("aten.any", [x], {"dim": [dim], "keepdim": keep})
            assert_close(y, A.any.dims(t, [dim], keep).numpy(), what=f"any {shape} {dim}")
        if dtype != np.bool_:
            (i,) = run_op("aten.argmin", [x], {})
            assert_close(i, A.argmin(t).numpy(), what="argmin flattened")
        for dims in (None, []):
            (y,) = run_op("aten.any", [x], {"dim": dims})
            assert_close(y, A.any.dims(t, dims).numpy(), what=f"any dim={dims}")  # []: no dim reduced


def test_nan_rules_of_max_min_argmin_any():
    x = np.array([[1.0, NAN, 3.0, NAN], [4.0, 5.0, -1.0, 0.0], [NAN, -7.0, 2.0, 2.0]], np.float32)
    first_nan = lambda row: next((k for k, v in enumerate(row) if math.isnan(v)), None)
    for op in ("max", "min"):
        v, i = run_op(f"aten.{op}", [x], {"dim": 1})
        for r, row in enumerate(x.tolist()):
            k = first_nan(row)
            if k is None:
                best = max(row) if op == "max" else min(row)
                assert v[r] == best and i[r] == row.index(best)
            else:  # NaN propagates with the index of the first NaN
                assert math.isnan(v[r]) and i[r] == k
    (i,) = run_op("aten.argmin", [x], {"dim": 1})
    assert i.tolist() == [1, 2, 0]
    (i,) = run_op("aten.argmin", [x], {})
    assert i.tolist() == 1
    (y,) = run_op("aten.any", [np.array([0.0, -0.0, NAN], np.float32)], {})
    assert y.tolist() is True  # NaN != 0
    (y,) = run_op("aten.any", [np.array([0.0, -0.0], np.float32)], {})
    assert y.tolist() is False


def test_reductions_of_empty_tensors():
    x = np.zeros((2, 0, 3), np.float32)
    v, i = run_op("aten.max", [x], {"dim": 2})
    assert v.shape == (2, 0) and i.shape == (2, 0) and i.dtype == np.int64
    expect_error("aten.max", [x], {"dim": 1}, "InvalidArgument", ["aten.max", "non-zero size"])
    expect_error("aten.argmin", [x], {}, "InvalidArgument", ["aten.argmin", "empty"])
    # max() / min() without dim are captured as amax / amin over every dim: an error for an empty input, as torch
    expect_error("aten.amax", [x], {"dim": []}, "InvalidArgument", ["aten.amax", "non-zero size"])
    (y,) = run_op("aten.any", [x], {"dim": [1]})
    assert_close(y, A.any.dims(T(x), [1]).numpy())  # false: nothing is nonzero
    (p,) = run_op("aten.prod", [x], {"dim": 1})
    assert_close(p, A.prod.dim_int(T(x), 1).numpy())  # ones
    (v,) = run_op("aten.var", [x], {"dim": [1]})
    assert np.isnan(v).all() and v.shape == (2, 3)  # 0 / 0, as torch


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32, np.int8, np.uint8, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_prod(dtype):
    for shape in [(), (6,), (3, 4), (2, 3, 2)]:
        x = rnd(shape, dtype, seed=3, ties=dtype != np.bool_)
        if np.dtype(dtype).kind == "f":
            x = np.asarray(x * 0.5 + 0.25).astype(dtype)
        t = T(x)
        (p,) = run_op("aten.prod", [x], {})
        assert_close(p, A.prod.default(t).numpy(), what=f"prod {shape}")  # integer/bool -> int64
        for dim, keep in itertools.product(range(-len(shape), len(shape)), (False, True)):
            (p,) = run_op("aten.prod", [x], {"dim": dim, "keepdim": keep})
            assert_close(p, A.prod.dim_int(t, dim, keep).numpy(), what=f"prod {shape} {dim}")
    x = rnd((3, 4), dtype, seed=4, ties=dtype != np.bool_)
    for out in ("float32", "int64") if np.dtype(dtype).kind != "f" else ("float64",):
        (p,) = run_op("aten.prod", [x], {"dim": 1, "dtype": out})
        assert_close(p, A.prod.dim_int(T(x), 1, dtype=getattr(torch, out)).numpy(), what=f"prod dtype={out}")


def test_prod_int64_wraps_like_torch():
    x = np.array([2**40, 2**40, 3], np.int64)
    (p,) = run_op("aten.prod", [x], {})
    assert p == A.prod.default(T(x)).numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=str)
def test_var(dtype):
    for shape in [(7,), (3, 5), (2, 3, 4)]:
        x = np.asarray(rnd(shape, dtype, seed=5) + 1000.0).astype(dtype)  # large mean: two passes
        t = T(x)
        dim_lists = [None, []] + [[d] for d in range(-len(shape), len(shape))] + ([[0, -1]] if len(shape) > 1 else [])
        for dims, corr, keep in itertools.product(dim_lists, (None, 0, 1, 2.5), (False, True)):
            (v,) = run_op("aten.var", [x], {"dim": dims, "correction": corr, "keepdim": keep})
            ref = A.var.correction(t, dims, correction=corr, keepdim=keep).numpy()
            assert_close(v, ref, what=f"var {shape} {dims} {corr}")
    (v,) = run_op("aten.var", [np.ones((1,), np.float32)], {})
    assert np.isnan(v)  # N - correction = 0: 0 / 0
    expect_error("aten.var", [np.ones((2,), np.int64)], {}, "NotSupported", ["aten.var", "int64"])


# ---------------------------------------------------------------- sort, topk

def sorted_order(row, descending):
    """PyTorch's stable order: NaN is the largest value; equal values keep their input order."""
    key = (lambda i: (not math.isnan(row[i]), -row[i] if not math.isnan(row[i]) else 0)) if descending else \
          (lambda i: (math.isnan(row[i]), row[i] if not math.isnan(row[i]) else 0))
    return sorted(range(len(row)), key=key)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_sort_stable_exact(dtype):
    for shape in [(), (9,), (4, 6), (2, 3, 5)]:
        x = rnd(shape, dtype, seed=6, ties=dtype != np.bool_)
        t = T(x)
        for dim, desc in itertools.product(list(range(-len(shape), len(shape))) or [0], (False, True)):
            v, i = run_op("aten.sort", [x], {"dim": dim, "descending": desc, "stable": True})
            rv, ri = A.sort.stable(t, stable=True, dim=dim, descending=desc)
            assert_close(v, rv.numpy(), what=f"sort values {shape} {dim} {desc}")
            assert_close(i, ri.numpy(), what=f"sort indices {shape} {dim} {desc}")


def test_sort_and_topk_nan_rules():
    row = [2.0, NAN, -1.0, 2.0, NAN, 0.0, -np.inf, np.inf]
    x = np.array([row, row[::-1]], np.float32)
    for desc in (False, True):
        v, i = run_op("aten.sort", [x], {"dim": 1, "descending": desc})
        for r in range(2):
            order = sorted_order(x[r].tolist(), desc)
            assert i[r].tolist() == order, (desc, r)
            np.testing.assert_array_equal(v[r], x[r][order])
    for largest in (True, False):
        v, i = run_op("aten.topk", [x], {"k": 4, "dim": -1, "largest": largest})
        for r in range(2):
            order = sorted_order(x[r].tolist(), largest)[:4]
            np.testing.assert_array_equal(v[r], x[r][order])
            np.testing.assert_array_equal(x[r][i[r]], v[r])  # the indices gather the values


def test_topk_against_eager_and_ties():
    x = rnd((4, 10), seed=7)
    t = T(x)
    for k, dim, largest in itertools.product((0, 1, 3, 10), (-1, 1), (True, False)):
        v, i = run_op("aten.topk", [x], {"k": k, "dim": dim, "largest": largest})
        rv, ri = A.topk(t, k, dim, largest)
        assert_close(v, rv.numpy(), what=f"topk {k} {dim} {largest}")
        assert_close(i, ri.numpy(), what=f"topk indices {k} {dim} {largest}")
    x = rnd((3, 8), np.float32, seed=8, ties=True)
    for largest in (True, False):
        v, i = run_op("aten.topk", [x], {"k": 5, "largest": largest})
        rv, _ = A.topk(T(x), 5, -1, largest)
        assert_close(v, rv.numpy(), what="topk tie values")  # equal values ...
        np.testing.assert_array_equal(np.take_along_axis(x, i, 1), v)  # ... and indices that gather them
        assert all(len(set(r)) == 5 for r in i.tolist())
    x = rnd((5, 2), np.int32, seed=9)
    v, i = run_op("aten.topk", [x], {"k": 2, "dim": 0})
    assert_close(v, A.topk(T(x), 2, 0)[0].numpy())
    expect_error("aten.topk", [x], {"k": 6, "dim": 0}, "InvalidArgument", ["aten.topk", "k=6"])
    v, i = run_op("aten.topk", [np.array(3.5, np.float32)], {"k": 1})  # 0-d: one element
    assert v.shape == () and v == 3.5 and i == 0


# ---------------------------------------------------------------- creation (nodes without tensor inputs)

def test_arange_full_scalar_tensor_run_without_tensor_inputs():
    # A method with no inputs whose nodes have no tensor inputs: compiled, serialized, loaded, run.
    cases = [((0, 5, 1), torch.int64), ((-1, 5, 1.5), torch.int32), ((0, 5.5, 1), torch.int64),
             ((1.0, -2.0, -0.3), torch.float32), ((0, 1, 0.1), torch.float64), ((3, 3, 1), torch.float32),
             ((0, 20, 3), torch.uint8)]
    for (start, end, step), dt in cases:
        (y,) = run_op("aten.arange", [], {"start": start, "end": end, "step": step, "dtype": str(dt)[6:]})
        assert_close(y, torch.arange(start, end, step, dtype=dt).numpy(), what=f"arange {start} {end} {step} {dt}")
    (y,) = run_op("aten.arange", [], {"end": 4})
    assert_close(y, np.arange(4, dtype=np.float32))  # dtype None: float32
    # with constant folding on (the default) too: the node stays a kernel call (nothing to fold from)
    outs, _, _, _ = compile_graph(lambda g, ids: [g.add_node("aten.arange", [], {"end": 3, "dtype": "int64"})[0],
                                                  g.add_node("aten.add", [ids[0], g.add_node(
                                                      "aten.full", [], {"size": [2], "fill_value": 1.5})[0]], {})[0]],
                                  [np.array([1.0, 2.0], np.float32)], [])
    assert outs[0].tolist() == [0, 1, 2] and outs[1].tolist() == [2.5, 3.5]
    expect_error("aten.arange", [], {"start": 0, "end": 5, "step": -1}, "InvalidArgument", ["step sign"])
    expect_error("aten.arange", [], {"start": 0, "end": 5, "step": 0}, "InvalidArgument", ["step"])
    for size, value, dt in [([2, 3], 2.5, torch.float32), ([4], -3, torch.int64), ([2, 2], 0.0, torch.bool),
                            ([3], 7.9, torch.int32), ([0, 2], 1.0, torch.float32), ([], 300, torch.uint8)]:
        (y,) = run_op("aten.full", [], {"size": size, "fill_value": value, "dtype": str(dt)[6:]})
        assert_close(y, torch.full(size, value).to(dt).numpy(), what=f"full {size} {value} {dt}")
    (y,) = run_op("aten.scalar_tensor", [], {"s": 1.5, "dtype": "float64"})
    assert y.shape == () and y.dtype == np.float64 and y == 1.5
    x = rnd((2, 3), np.int32)
    (y,) = run_op("aten.full_like", [x], {"fill_value": 4})
    assert_close(y, torch.full_like(T(x), 4).numpy())
    (y,) = run_op("aten.full_like", [x], {"fill_value": 0.5, "dtype": "float32"})
    assert_close(y, torch.full_like(T(x), 0.5, dtype=torch.float32).numpy())


def test_fill_and_copy_convert_and_broadcast():
    x = rnd((2, 3, 4), np.int32)
    for src in (rnd((3, 1), np.float32, seed=1), rnd((4,), np.int64, seed=2), rnd((2, 3, 4), np.bool_, seed=3),
                np.array(-2.7, np.float32)):
        (y,) = run_op("aten.copy", [x, src])
        assert_close(y, A.copy(T(x), T(src)).numpy(), what=f"copy from {src.dtype}{list(src.shape)}")
    (y,) = run_op("aten.fill", [rnd((3, 2), np.float32), np.array(7, np.int64)])
    assert_close(y, A.fill.Tensor(T(rnd((3, 2), np.float32)), torch.tensor(7)).numpy())
    expect_error("aten.copy", [x, rnd((3, 3), np.float32)], {}, "InvalidArgument", ["src", "broadcast"])
    expect_error("aten.fill", [x, rnd((1,), np.float32)], {}, "InvalidArgument", ["value", "0-d"])


# ---------------------------------------------------------------- layout

LAYOUT_DTYPES = [np.float32, np.int64, np.int8, np.bool_, np.float16]


@pytest.mark.parametrize("dtype", LAYOUT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_flip_repeat_diagonal(dtype):
    x = rnd((2, 3, 4), dtype if dtype != np.float16 else np.float32, seed=10).astype(dtype)
    t = T(x)
    for dims in ([0], [-1], [0, 2], [2, 1, 0], []):
        (y,) = run_op("aten.flip", [x], {"dims": dims})
        assert_close(y, A.flip(t, dims).numpy(), what=f"flip {dims}")
    for reps in ([1, 1, 1], [2, 1, 3], [2, 2, 1, 2], [0, 1, 1], [3, 1, 1, 1, 1]):
        (y,) = run_op("aten.repeat", [x], {"repeats": reps})
        assert_close(y, A.repeat(t, reps).numpy(), what=f"repeat {reps}")
    for off, d1, d2 in [(0, 0, 1), (1, 1, 2), (-1, 1, 2), (2, -1, 0), (-5, 0, 2), (5, 0, 2), (0, 2, 1)]:
        (y,) = run_op("aten.diagonal", [x], {"offset": off, "dim1": d1, "dim2": d2})
        assert_close(y, A.diagonal(t, off, d1, d2).contiguous().numpy(), what=f"diagonal {off} {d1} {d2}")


def test_layout_edge_cases_and_errors():
    (y,) = run_op("aten.flip", [np.array(2.0, np.float32)], {"dims": [0]})
    assert y == 2.0
    (y,) = run_op("aten.repeat", [np.array(5, np.int32)], {"repeats": [2, 3]})
    assert_close(y, A.repeat(torch.tensor(5, dtype=torch.int32), [2, 3]).numpy())
    (y,) = run_op("aten.flip", [np.zeros((0, 3), np.float32)], {"dims": [0, 1]})
    assert y.shape == (0, 3)
    x = rnd((3, 4))
    expect_error("aten.flip", [x], {"dims": [0, 0]}, "InvalidArgument", ["dims", "multiple times"])
    expect_error("aten.flip", [x], {"dims": [2]}, "InvalidArgument", ["dims", "out of range"])
    expect_error("aten.repeat", [x], {"repeats": [2]}, "InvalidArgument", ["repeats"])
    expect_error("aten.diagonal", [x], {"dim1": 1, "dim2": -1}, "InvalidArgument", ["dim1 and dim2"])
    expect_error("aten.diagonal", [rnd((3,))], {}, "InvalidArgument", ["rank >= 2"])


def test_as_strided_views_and_out_of_range():
    x = rnd((4, 5), np.float32, seed=11)
    t = T(x)
    for size, stride, off in [([2, 2], [1, 2], 0), ([3, 3], [5, 1], 1), ([4], [6], None), ([2, 3, 2], [0, 2, 1], 13),
                              ([20], [1], 0), ([0, 4], [100, 100], 50), ([], [], 19)]:
        (y,) = run_op("aten.as_strided", [x], {"size": size, "stride": stride, "storage_offset": off})
        assert_close(y, A.as_strided(t, size, stride, off).contiguous().numpy(), what=f"as_strided {size} {stride} {off}")
    expect_error("aten.as_strided", [x], {"size": [3, 3], "stride": [8, 2]}, "InvalidArgument",
                 ["aten.as_strided", "reaches element 20", "outside"])
    expect_error("aten.as_strided", [x], {"size": [2], "stride": [1], "storage_offset": 19}, "InvalidArgument",
                 ["outside the input's 20 elements"])
    expect_error("aten.as_strided", [x], {"size": [2], "stride": [-1], "storage_offset": 3}, "InvalidArgument",
                 ["negative"])
    expect_error("aten.as_strided", [x], {"size": [2, 2], "stride": [1]}, "InvalidArgument", ["stride"])


# ---------------------------------------------------------------- capture

class Calls(torch.nn.Module):
    def forward(self, x, xi, m):
        mx, amx = torch.max(x, dim=1)
        mn, amn = torch.min(xi, dim=0, keepdim=True)
        s, si = torch.sort(x, dim=-1, descending=True, stable=True)
        s2, si2 = torch.sort(xi, dim=0)
        tv, ti = torch.topk(x, 2, dim=1)
        vm = torch.var_mean(x, dim=1, correction=0)
        ones = torch.ones_like(x).fill_(m.sum())  # fill.Tensor with a computed value
        z = (x * 2).copy_(xi[0])  # copy into a computed tensor: broadcast, int64 -> float32
        return (mx, amx, mn, amn, s, si, s2, si2, tv, ti, torch.argmin(x, 1), torch.argmin(xi), m.any(), m.any(0),
                torch.any(m, dim=(0, 1)), torch.prod(xi, 1), torch.prod(x), torch.var(x, 0), torch.var(x, 1, unbiased=False),
                vm[0], vm[1], torch.flip(x, [0, 1]), x.repeat(2, 1, 2), torch.diagonal(x, 1), ones,
                torch.as_strided(x, (2, 2), (1, 3), 1), torch.amax(xi), torch.max(xi), z)


def test_capture_maps_the_ops_natively():
    x = T(rnd((3, 4), seed=12))
    xi = T(rnd((3, 4), np.int64, seed=13, ties=True))
    m = T(rnd((3, 4), np.bool_, seed=14))
    model = Calls().eval()
    cap = capture(model, (x, xi, m))
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", cap.graph)
    data, rep = pb.compile()
    outs = kiln.load_bytes(data).run(x.numpy(), xi.numpy(), m.numpy())
    with torch.no_grad():
        ref = model(x, xi, m)
    assert len(outs) == len(ref)
    for k, (o, r) in enumerate(zip(outs, ref)):
        assert_close(o, r.numpy(), what=f"output {k}")
    if "xnnpack" in kiln._kiln.backend_names():  # xnnpack declines them all: the report lists the ops
        _, rep = pb.compile(backends=["xnnpack"])
        ops = {c["op"] for c in rep["methods"][0]["delegation"]["cpu_ops"]}
        assert {"aten.max", "aten.min", "aten.sort", "aten.topk", "aten.flip", "aten.repeat", "aten.var",
                "aten.argmin", "aten.any", "aten.prod", "aten.diagonal", "aten.as_strided"} <= ops, ops
        assert "aten.copy" in ops, ops
        assert "aten.embedding" not in ops and "aten.neg" not in ops  # no gather-based flip, no argmax(-x)


def test_empty_is_captured_as_zeros():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.empty(2, 3) * 0 + x, torch.empty_like(x).shape[0] + x
    x = T(rnd((2, 3)))
    out = kiln.load_bytes(kiln.export(M(), (x,), verbose=False).data).run(x.numpy())
    assert_close(out[0], x.numpy())


# ---------------------------------------------------------------- delegates

def test_xnnpack_declines_with_reasons():
    if "xnnpack" not in kiln._kiln.backend_names():
        pytest.skip("xnnpack not built")
    x = rnd((3, 4))
    def build(g, ids):
        outs = list(g.add_node("aten.sort", [ids[0]], {}))
        outs += g.add_node("aten.flip", [ids[0]], {"dims": [0]})
        outs += g.add_node("aten.var", [ids[0]], {"dim": [1]})
        return outs
    outs, dl, _, _ = compile_graph(build, [x], ["xnnpack"])
    assert_close(outs[2], np.flip(x, 0).copy())
    for op, why in (("aten.sort", "has 2 outputs"), ("aten.flip", "no xnnpack lowering"),
                    ("aten.var", "no xnnpack lowering")):
        rs = declined_reasons(dl, op, "xnnpack")
        assert rs and all(why in r for r in rs), (op, rs)


MLX_CASES = [
    ("aten.any", [rnd((3, 4), seed=20, ties=True)], {"dim": [1], "keepdim": True}, lambda x: A.any.dims(x, [1], True)),
    ("aten.any", [rnd((3, 4), np.int32, seed=21, ties=True)], {}, lambda x: A.any.default(x)),
    ("aten.any", [np.array([[0.0, NAN], [0.0, -0.0]], np.float32)], {"dim": [1]}, None),  # NaN counts
    ("aten.any", [rnd((2, 3), seed=22, ties=True)], {"dim": []}, lambda x: A.any.dims(x, [])),
    ("aten.prod", [rnd((3, 5), seed=23) * 0.5], {"dim": 1}, lambda x: A.prod.dim_int(x, 1)),
    ("aten.prod", [rnd((2, 3), seed=24)], {}, lambda x: A.prod.default(x)),
    ("aten.var", [rnd((4, 6), seed=25) + 100], {"dim": [1], "correction": 1}, lambda x: A.var.correction(x, [1], correction=1)),
    ("aten.var", [rnd((4, 6), seed=26)], {"dim": None, "correction": 0, "keepdim": True},
     lambda x: A.var.correction(x, None, correction=0, keepdim=True)),
    ("aten.flip", [rnd((2, 3, 4), seed=27)], {"dims": [0, -1]}, lambda x: A.flip(x, [0, -1])),
    ("aten.repeat", [rnd((2, 3), np.int64, seed=28)], {"repeats": [2, 1, 3]}, lambda x: A.repeat(x, [2, 1, 3])),
    ("aten.diagonal", [rnd((3, 4, 5), seed=29)], {"offset": -1, "dim1": 2, "dim2": 0},
     lambda x: A.diagonal(x, -1, 2, 0).contiguous()),
    ("aten.as_strided", [rnd((4, 5), seed=30)], {"size": [3, 2], "stride": [4, 3], "storage_offset": 2},
     lambda x: A.as_strided(x, [3, 2], [4, 3], 2).contiguous()),
    ("aten.copy", [rnd((2, 3), np.int32, seed=31), rnd((3,), np.int64, seed=32)], {}, lambda x, s: A.copy(x, s)),
    ("aten.fill", [rnd((2, 3), seed=33), np.array(True)], {}, lambda x, v: A.fill.Tensor(x, v)),
    ("aten.full_like", [rnd((2, 3), seed=34)], {"fill_value": -2.5}, lambda x: torch.full_like(x, -2.5)),
]


@pytest.mark.parametrize("case", range(len(MLX_CASES)))
def test_mlx_lowerings_match_eager(case, monkeypatch):
    if "mlx" not in kiln._kiln.backend_names():
        pytest.skip("the mlx backend is not built")
    monkeypatch.setenv("KILN_MLX_DEVICE", "cpu")
    op, inputs, attrs, ref = MLX_CASES[case]
    inputs = [np.asarray(x).astype(x.dtype) for x in inputs]
    outs, dl, _, _ = compile_graph(lambda g, ids: g.add_node(op, ids, attrs), inputs, ["mlx"], fold_constants=False)
    check_all_delegated(dl, "mlx", 1)
    expected = ref(*[T(x) for x in inputs]).numpy() if ref else np.array([True, False])
    assert_close(outs[0], expected, rel=1e-4, what=f"mlx {op} {attrs}")


def test_mlx_creation_ops_and_declines(monkeypatch):
    if "mlx" not in kiln._kiln.backend_names():
        pytest.skip("the mlx backend is not built")
    monkeypatch.setenv("KILN_MLX_DEVICE", "cpu")
    x = rnd((3, 4), seed=35)

    def build(g, ids):
        ar = g.add_node("aten.arange", [], {"start": -1, "end": 2, "step": 0.25, "dtype": "float32"})[0]
        ai = g.add_node("aten.arange", [], {"start": 0, "end": 12, "step": 3, "dtype": "int64"})[0]
        fu = g.add_node("aten.full", [], {"size": [4], "fill_value": 3, "dtype": "int32"})[0]
        ex = g.add_node("aten.add", [g.add_node("aten.view", [ar], {"size": [3, 4]})[0], ids[0]], {})[0]
        mx_ = list(g.add_node("aten.max", [ids[0]], {"dim": 1}))
        srt = list(g.add_node("aten.sort", [ids[0]], {}))
        am = g.add_node("aten.argmin", [ids[0]], {"dim": 0})[0]
        return [ex, ai, fu] + mx_ + srt + [am]

    outs, dl, _, _ = compile_graph(build, [x], ["mlx"], fold_constants=False)
    t = T(x)
    assert_close(outs[0], (torch.arange(-1, 2, 0.25).view(3, 4) + t).numpy())
    assert_close(outs[1], torch.arange(0, 12, 3).numpy())
    assert_close(outs[2], torch.full((4,), 3, dtype=torch.int32).numpy())
    assert_close(outs[3], torch.max(t, 1)[0].numpy())
    assert_close(outs[4], torch.max(t, 1)[1].numpy())
    assert_close(outs[6], torch.sort(t)[1].numpy())
    assert_close(outs[7], torch.argmin(t, 0).numpy())
    assert all("has 2 outputs" in r for r in declined_reasons(dl, "aten.max", "mlx"))
    assert all("has 2 outputs" in r for r in declined_reasons(dl, "aten.sort", "mlx"))
    assert declined_reasons(dl, "aten.argmin", "mlx") and "tie and NaN" in declined_reasons(dl, "aten.argmin", "mlx")[0]
    assert not declined_reasons(dl, "aten.arange", "mlx") and not declined_reasons(dl, "aten.full", "mlx")

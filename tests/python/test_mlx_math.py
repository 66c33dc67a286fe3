"""The math family (src/backends/mlx/mlx_math.cpp) on the mlx delegate, MLX's CPU device, against
PyTorch eager: every lowered op is delegated (one segment, nothing left to the CPU kernels) and
matches eager within 1e-4 * max|expected| (float32), exactly for integers and bools; PyTorch's
special cases (round half to even, sign(NaN) = 0, NaN-propagating maximum/minimum, remainder's
sign) are checked on special values against float64 NumPy. The xnnpack delegate declines these ops
with a reason.
"""
import math
import os

import numpy as np
import pytest
import torch

os.environ["KILN_MLX_DEVICE"] = "cpu"

import kiln  # noqa: E402
from delegate_util import compile_graph, declined_reasons, segment  # noqa: E402
from oprunner import assert_close  # noqa: E402
from test_ops_elementwise import SPECIAL  # noqa: E402

A = torch.ops.aten
REL = 1e-4

needs_mlx = pytest.mark.skipif("mlx" not in kiln._kiln.backend_names(), reason="the mlx backend is not built")


def t(x):
    return torch.from_numpy(np.array(x, copy=True))


def run_many(nodes, feeds, backends=("mlx",)):
    """nodes: list of (op, input indices into feeds, attrs). One graph, one output per node; the
    nodes read clones of the inputs so that they form one connected segment.
    Returns (outputs, delegation report)."""
    def build(g, ids):
        ids = [g.add_node("aten.clone", [i], {})[0] for i in ids]
        return [g.add_node(op, [ids[i] for i in idx], attrs)[0] for op, idx, attrs in nodes]
    outs, dl, _, _ = compile_graph(build, feeds, backends, fold_constants=False)
    return outs, dl


def check_delegated(dl, nodes, feeds):
    """Every node (and the input clones) delegated to mlx, nothing left to the CPU kernels (at
    most one segment per input: unconnected branches are separate segments)."""
    b = segment(dl, "mlx")
    assert b["nodes"] == len(nodes) + len(feeds) and dl["cpu_ops"] == [] and b["segments"] <= len(feeds), dl


UNARY_FLOAT = [("aten.acos", torch.acos), ("aten.acosh", torch.acosh), ("aten.asin", torch.asin),
               ("aten.asinh", torch.asinh), ("aten.atan", torch.atan), ("aten.atanh", torch.atanh),
               ("aten.cosh", torch.cosh), ("aten.sinh", torch.sinh), ("aten.tan", torch.tan),
               ("aten.expm1", torch.expm1), ("aten.log1p", torch.log1p), ("aten.log2", torch.log2),
               ("aten.log10", torch.log10), ("aten.ceil", torch.ceil), ("aten.floor", torch.floor),
               ("aten.trunc", torch.trunc), ("aten.round", torch.round), ("aten.sign", torch.sign),
               ("aten.isinf", torch.isinf), ("aten.isnan", torch.isnan), ("aten.elu", torch.nn.functional.elu)]


@needs_mlx
def test_unary_float32_delegated_and_match_eager():
    rng = np.random.default_rng(0)
    x = rng.uniform(-0.95, 0.95, (3, 40)).astype(np.float32)  # inside every domain but acosh's
    y = rng.uniform(1.0, 9.0, (3, 40)).astype(np.float32)
    nodes = [(op, [1 if op == "aten.acosh" else 0], {}) for op, _ in UNARY_FLOAT]
    nodes += [("aten.round", [0], {"decimals": 1}), ("aten.round", [1], {"decimals": -1}),
              ("aten.elu", [0], {"alpha": 0.5, "scale": 2.0, "input_scale": 1.5})]
    outs, dl = run_many(nodes, [x, y])
    check_delegated(dl, nodes, [x, y])
    refs = [ref(t(y if op == "aten.acosh" else x)) for op, ref in UNARY_FLOAT]
    refs += [torch.round(t(x), decimals=1), torch.round(t(y), decimals=-1), A.elu(t(x), 0.5, 2.0, 1.5)]
    for (op, _, attrs), out, exp in zip(nodes, outs, refs):
        assert_close(out, exp.numpy(), rel=REL, what=f"{op} {attrs}")


@needs_mlx
def test_special_values_follow_pytorch():
    a, b = [np.ascontiguousarray(v) for v in np.meshgrid(SPECIAL, SPECIAL, indexing="ij")]
    ties = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5], np.float32)
    nodes = [("aten.round", [2], {}), ("aten.sign", [0], {}), ("aten.maximum", [0, 1], {}),
             ("aten.minimum", [0, 1], {}), ("aten.remainder", [0, 1], {}), ("aten.isnan", [0], {}),
             ("aten.isinf", [0], {}), ("aten.atan2", [0, 1], {})]
    outs, dl = run_many(nodes, [a, b, ties])
    check_delegated(dl, nodes, [a, b, ties])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(all="ignore"):
        rem = np.fmod(a64, b64)
        rem = np.where((rem != 0) & ((b64 < 0) != (rem < 0)), rem + b64, rem)
        expected = [np.round(ties), ((a > 0).astype(np.float32) - (a < 0)), np.maximum(a, b), np.minimum(a, b),
                    rem.astype(np.float32), np.isnan(a), np.isinf(a), np.arctan2(a64, b64).astype(np.float32)]
    for (op, _, _), out, exp in zip(nodes, outs, expected):
        assert_close(out, exp, rel=REL, what=op)


@needs_mlx
def test_erf_of_small_arguments_elementwise():
    # MLX's erf is accurate to ~1e-7 absolute only (erf(1e-7) = 0); the lowering uses the Maclaurin
    # series below 0.1. Reference: math.erf in float64, elementwise relative error.
    mags = np.array([1e-38, 1e-30, 1e-10, 1e-7, 1e-6, 3e-5, 1e-3, 0.01, 0.0999, 0.1, 0.1001, 0.5, 1.0, 2.5, 4.0])
    x = np.concatenate([mags, -mags, SPECIAL]).astype(np.float32)
    outs, dl = run_many([("aten.erf", [0], {})], [x])
    check_delegated(dl, [("aten.erf", [0], {})], [x])
    ref = np.array([math.erf(float(v)) if not math.isnan(v) else math.nan for v in x])
    np.testing.assert_array_equal(np.isnan(outs[0]), np.isnan(ref))
    ok = ~np.isnan(ref)
    err = np.abs(outs[0][ok].astype(np.float64) - ref[ok]) / np.maximum(np.abs(ref[ok]), 1e-45)
    assert err.max() <= 1e-6, dict(zip(x[ok][err > 1e-6], err[err > 1e-6]))


INT_BINARY = [("aten.remainder", torch.remainder), ("aten.fmod", torch.fmod), ("aten.maximum", torch.maximum),
              ("aten.minimum", torch.minimum), ("aten.bitwise_and", torch.bitwise_and),
              ("aten.bitwise_or", torch.bitwise_or), ("aten.bitwise_xor", torch.bitwise_xor),
              ("aten.logical_xor", torch.logical_xor), ("aten.atan2", torch.atan2)]


@needs_mlx
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8], ids=lambda d: np.dtype(d).name)
def test_integer_ops_delegated_and_exact(dtype):
    rng = np.random.default_rng(1)
    lo = 0 if dtype == np.uint8 else -40
    a = rng.integers(lo, 40, (4, 5)).astype(dtype)
    b = rng.integers(lo, 9, (5,)).astype(dtype)
    b[b == 0] = 3
    if dtype != np.uint8:
        b[0] = -1
        a[0, 0] = np.iinfo(dtype).min  # INT_MIN % -1 = 0
    nodes = [(op, [0, 1], {}) for op, _ in INT_BINARY]
    nodes += [("aten.bitwise_not", [0], {}), ("aten.sign", [0], {}), ("aten.floor", [0], {}),
              ("aten.round", [0], {}), ("aten.log1p", [1], {})]
    outs, dl = run_many(nodes, [a, b])
    check_delegated(dl, nodes, [a, b])
    refs = [ref(t(a), t(b)) for _, ref in INT_BINARY]
    refs += [torch.bitwise_not(t(a)), torch.sign(t(a)), torch.floor(t(a)), torch.round(t(a)), torch.log1p(t(b))]
    for (op, _, _), out, exp in zip(nodes, outs, refs):
        assert_close(out, exp.numpy(), rel=REL, what=f"{op} {np.dtype(dtype).name}")


@needs_mlx
def test_bool_and_mixed_dtypes():
    x = np.array([True, False, True, False])
    y = np.array([[True], [False]])
    i = np.array([3, -2, 0, 7], np.int32)
    f = np.array([[0.5], [-4.0]], np.float32)
    nodes = [("aten.bitwise_and", [0, 1], {}), ("aten.bitwise_or", [0, 1], {}), ("aten.bitwise_xor", [0, 1], {}),
             ("aten.bitwise_not", [0], {}), ("aten.maximum", [0, 1], {}), ("aten.minimum", [0, 1], {}),
             ("aten.maximum", [2, 3], {}), ("aten.remainder", [2, 3], {}), ("aten.bitwise_and", [0, 2], {}),
             ("aten.logical_xor", [3, 2], {}), ("aten.sign", [0], {})]
    outs, dl = run_many(nodes, [x, y, i, f])
    check_delegated(dl, nodes, [x, y, i, f])
    tx, ty, ti, tf = t(x), t(y), t(i), t(f)
    refs = [tx & ty, tx | ty, tx ^ ty, ~tx, torch.maximum(tx, ty), torch.minimum(tx, ty), torch.maximum(ti, tf),
            torch.remainder(ti, tf), tx & ti, torch.logical_xor(tf, ti), torch.sign(tx)]
    for (op, _, _), out, exp in zip(nodes, outs, refs):
        assert_close(out, exp.numpy(), rel=REL, what=op)


@needs_mlx
@pytest.mark.parametrize("op", ["aten.remainder", "aten.fmod"])
def test_integer_division_by_zero_is_an_error(op):
    a, b = np.array([4, 5, 6], np.int64), np.array([1, 0, 2], np.int64)
    def build(g, ids):
        return g.add_node(op, ids, {})
    with pytest.raises(kiln.KilnError, match=f"{op}: integer division by zero") as e:
        compile_graph(build, [a, b], ("mlx",), fold_constants=False)
    assert e.value.args[1] == "InvalidArgument"


@needs_mlx
def test_declined_with_reasons():
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    outs, dl = run_many([("aten.fmod", [0, 0], {}), ("aten.elu", [1], {})], [x, x.astype(np.float64)])
    assert any("fmod of floating tensors" in r for r in declined_reasons(dl, "aten.fmod", "mlx"))
    assert any("float64" in r for r in declined_reasons(dl, "aten.elu", "mlx"))
    assert_close(outs[0], torch.fmod(t(x), t(x)).numpy(), what="fmod on the CPU kernels")


@pytest.mark.skipif("xnnpack" not in kiln._kiln.backend_names(), reason="the xnnpack backend is not built")
def test_xnnpack_declines_math_ops():
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    ops = ["aten.elu", "aten.floor", "aten.round", "aten.sign", "aten.expm1", "aten.maximum", "aten.remainder",
           "aten.atan2", "aten.isnan"]
    nodes = [(op, [0, 0] if op in ("aten.maximum", "aten.remainder", "aten.atan2") else [0], {}) for op in ops]
    outs, dl = run_many(nodes, [x], backends=("xnnpack",))
    for op in ops:
        reasons = declined_reasons(dl, op, "xnnpack")
        assert reasons and all(reasons), (op, dl)
        if op != "aten.isnan":  # isnan is declined first for its bool output
            assert any("has no xnnpack lowering" in r for r in reasons), (op, reasons)
    assert_close(outs[0], torch.nn.functional.elu(t(x)).numpy(), what="elu on the CPU kernels")

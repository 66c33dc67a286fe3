"""The elementwise math family (docs/op-set.md "math": src/ir/ops/math.cpp, src/kernels/portable/math.cpp)
against PyTorch eager and float64 math.

Ordinary values are compared with torch eager on CPU; special values (+-inf, NaN, +-0, tiny, huge:
SPECIAL of test_ops_elementwise) with the mathematical result computed in float64 (NumPy / Python
math) and rounded to float32, not with eager float32 (whose vectorized paths differ between
AVX2 and AVX-512 machines). Tolerance: max abs error <= 1e-5 * max|expected| (and per element for
special values); NaN/inf positions exact; integers and bools exact.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from oprunner import run_op
from test_ops_elementwise import SPECIAL, check, rand

A = torch.ops.aten


def run(op, inputs, attrs=None):
    (out,) = run_op(op, inputs, attrs)
    return out


def t(x):
    return torch.from_numpy(np.array(x, copy=True))


def f64_ref(fn, x: np.ndarray) -> np.ndarray:
    """fn evaluated in float64 on float32 inputs, rounded to float32 (the correctly rounded result
    up to float64's own error)."""
    with np.errstate(all="ignore"):
        return np.asarray(fn(x.astype(np.float64))).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# floating unary math
# ----------------------------------------------------------------------------------------------

# op, torch reference, float64 reference, domain of random inputs (low, high)
FLOAT_MATH = [
    ("aten.acos", torch.acos, np.arccos, (-1, 1)),
    ("aten.acosh", torch.acosh, np.arccosh, (1, 20)),
    ("aten.asin", torch.asin, np.arcsin, (-1, 1)),
    ("aten.asinh", torch.asinh, np.arcsinh, (-20, 20)),
    ("aten.atan", torch.atan, np.arctan, (-20, 20)),
    ("aten.atanh", torch.atanh, np.arctanh, (-0.999, 0.999)),
    ("aten.cosh", torch.cosh, np.cosh, (-10, 10)),
    ("aten.sinh", torch.sinh, np.sinh, (-10, 10)),
    ("aten.tan", torch.tan, np.tan, (-1.5, 1.5)),
    ("aten.expm1", torch.expm1, np.expm1, (-5, 5)),
    ("aten.log1p", torch.log1p, np.log1p, (-0.99, 20)),
    ("aten.log2", torch.log2, np.log2, (1e-3, 100)),
    ("aten.log10", torch.log10, np.log10, (1e-3, 100)),
]
FLOAT_MATH_IDS = [m[0] for m in FLOAT_MATH]


@pytest.mark.parametrize("op,ref,ref64,domain", FLOAT_MATH, ids=FLOAT_MATH_IDS)
def test_float_math(op, ref, ref64, domain):
    rng = np.random.default_rng(len(op))
    x = rng.uniform(*domain, (3, 41)).astype(np.float32)
    check(run(op, [x]), ref(t(x)), f"{op} random")
    check(run(op, [SPECIAL]), f64_ref(ref64, SPECIAL), f"{op} special", elementwise=True)
    # float64 in, float64 out, computed in double
    x64 = x.astype(np.float64)
    out = run(op, [x64])
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref(t(x64)).numpy(), rtol=1e-12, atol=0)
    # integer inputs promote to float32 (PyTorch); 0-d and empty keep their shape
    xi = np.array([1, 2, 3, 7], np.int64) if domain[0] >= 0 or op == "aten.log1p" else np.array([-1, 0, 1, 0], np.int32)
    if op in ("aten.atanh",):
        xi = np.array([0, 0], np.int32)
    out = run(op, [xi])
    assert out.dtype == np.float32
    check(out, ref(t(xi)), f"{op} int")
    x0 = np.array(np.float32(domain[0] * 0.5 + domain[1] * 0.5))
    check(run(op, [x0]), ref(t(x0)), f"{op} 0-d")
    assert run(op, [np.zeros((0, 3), np.float32)]).shape == (0, 3)


def test_float_math_large_parallel():
    x = rand((5, 30011), seed=4)  # above the kernel's parallel threshold
    check(run("aten.atan", [x]), torch.atan(t(x)), "atan large")


# ----------------------------------------------------------------------------------------------
# rounding, sign, isinf/isnan
# ----------------------------------------------------------------------------------------------

TIES = np.array([-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 4.5, -0.49999997, 0.49999997, 1e7 + 1, 8388609.0],
                np.float32)

# op, attrs, torch reference, float64 reference
ROUNDING = [
    ("aten.ceil", {}, torch.ceil, np.ceil),
    ("aten.floor", {}, torch.floor, np.floor),
    ("aten.trunc", {}, torch.trunc, np.trunc),
    ("aten.round", {}, torch.round, np.round),  # NumPy rounds half to even, as PyTorch
]


@pytest.mark.parametrize("op,attrs,ref,ref64", ROUNDING, ids=[r[0] for r in ROUNDING])
def test_rounding(op, attrs, ref, ref64):
    x = rand((4, 33), seed=5) * 10
    check(run(op, [x], attrs), ref(t(x)), f"{op} random")
    for name, v in [("special", SPECIAL), ("ties", TIES)]:
        out = run(op, [v], attrs)
        exp = f64_ref(ref64, v)
        check(out, exp, f"{op} {name}", elementwise=True)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(exp), err_msg=f"{op} {name}: signed zeros")
    # integers are unchanged (PyTorch), bool is refused
    for dt in (np.int64, np.int32, np.int8, np.uint8):
        xi = np.array([0, 1, 5, 100, 127], dt) if dt in (np.uint8, np.int8) else np.array([np.iinfo(dt).min, -7, 0, 9, np.iinfo(dt).max], dt)
        check(run(op, [xi], attrs), ref(t(xi)), f"{op} {dt}")
    with pytest.raises(kiln.KilnError) as e:
        run(op, [np.array([True, False])], attrs)
    assert e.value.args[1] == "NotSupported"
    x64 = rand((7,), seed=6).astype(np.float64) * 10
    np.testing.assert_array_equal(run(op, [x64], attrs), ref(t(x64)).numpy())


@pytest.mark.parametrize("decimals", [1, 2, 3, -1, -2, 40, -40])
def test_round_decimals(decimals):
    x = np.concatenate([rand((50,), seed=7) * 300, np.array([1.25, 1.35, 2.5, -2.5, 125.0, 150.0, 0.0, -0.0],
                                                             np.float32)]).astype(np.float32)
    out = run("aten.round", [x], {"decimals": decimals})
    exp = torch.round(t(x), decimals=decimals)
    np.testing.assert_array_equal(out, exp.numpy())  # same float32 operations: exact
    with pytest.raises(kiln.KilnError) as e:
        run("aten.round", [np.array([15, 25])], {"decimals": -1})
    assert e.value.args[1] == "NotSupported"


def test_sign():
    x = rand((3, 17), seed=8)
    check(run("aten.sign", [x]), torch.sign(t(x)), "sign random")
    # PyTorch's CPU kernel is (0 < x) - (x < 0): sign(NaN) = 0 and sign(-0.0) = +0.0
    out = run("aten.sign", [SPECIAL])
    exp = ((SPECIAL > 0).astype(np.float64) - (SPECIAL < 0)).astype(np.float32)
    np.testing.assert_array_equal(out, exp)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(exp), err_msg="sign: signed zeros")
    for dt in (np.int64, np.int32, np.int8, np.uint8, np.bool_):
        xi = np.array([0, 1, 0, 1, 0], np.bool_) if dt == np.bool_ else \
            np.array([0, 3, 200, 1, 0], dt) if dt == np.uint8 else np.array([np.iinfo(dt).min, -3, 0, 1, np.iinfo(dt).max], dt)
        check(run("aten.sign", [xi]), torch.sign(t(xi)), f"sign {dt}")


@pytest.mark.parametrize("op,ref", [("aten.isinf", np.isinf), ("aten.isnan", np.isnan)])
def test_isinf_isnan(op, ref):
    check(run(op, [SPECIAL]), ref(SPECIAL), f"{op} special")
    check(run(op, [SPECIAL.astype(np.float64)]), ref(SPECIAL), f"{op} float64")
    with np.errstate(over="ignore"):
        h = SPECIAL.astype(np.float16)  # +-1e30 become +-inf
    check(run(op, [h]), ref(h), f"{op} float16")
    for x in (np.array([0, -5, 2 ** 62], np.int64), np.array([0, 255], np.uint8), np.array([True, False])):
        check(run(op, [x]), np.zeros(x.shape, bool), f"{op} {x.dtype}")
    assert run(op, [np.array(math.nan, np.float32)]).shape == ()


# ----------------------------------------------------------------------------------------------
# binary ops
# ----------------------------------------------------------------------------------------------

SHAPE_PAIRS = [((2, 3, 4), (3, 1)), ((1,), (5, 1, 1)), ((), (2, 3)), ((2, 3), ()), ((0, 3), (1, 3))]
SHAPE_IDS = [f"{a}x{b}" for a, b in SHAPE_PAIRS]

BINARY_FLOAT = [
    ("aten.atan2", torch.atan2, np.arctan2),
    ("aten.remainder", torch.remainder, lambda a, b: a - np.floor(a / b) * b),
    ("aten.fmod", torch.fmod, np.fmod),
    ("aten.maximum", torch.maximum, np.maximum),
    ("aten.minimum", torch.minimum, np.minimum),
]


@pytest.mark.parametrize("sa,sb", SHAPE_PAIRS, ids=SHAPE_IDS)
@pytest.mark.parametrize("op,ref,_ref64", BINARY_FLOAT, ids=[b[0] for b in BINARY_FLOAT])
def test_binary_float_broadcast(op, ref, _ref64, sa, sb):
    a, b = rand(sa, seed=9), rand(sb, seed=10)
    check(run(op, [a, b]), ref(t(a), t(b)), f"{op} {sa} {sb}")


def _special_pairs():
    a, b = np.meshgrid(SPECIAL, SPECIAL, indexing="ij")
    return np.ascontiguousarray(a), np.ascontiguousarray(b)


def remainder64(a, b):
    """Python's float % (the divisor's sign; math.fmod then + b, as CPython's float_rem), NaN for b == 0."""
    out = np.empty(a.shape, np.float64)
    for i, (x, y) in enumerate(zip(a.astype(np.float64).ravel(), b.astype(np.float64).ravel())):
        if y == 0 or math.isnan(x) or math.isnan(y) or math.isinf(x):
            out.flat[i] = math.nan
        else:
            m = math.fmod(x, y)
            out.flat[i] = m + y if m != 0 and (y < 0) != (m < 0) else m
    return out.astype(np.float32)


def test_binary_special_values():
    a, b = _special_pairs()
    with np.errstate(all="ignore"):
        refs = {
            "aten.atan2": f64_ref(lambda x: np.arctan2(x, b.astype(np.float64)), a),  # C99 special cases
            "aten.fmod": f64_ref(lambda x: np.fmod(x, b.astype(np.float64)), a),
            "aten.remainder": remainder64(a, b),
            "aten.maximum": np.maximum(a, b),  # NumPy propagates NaN, as torch.maximum
            "aten.minimum": np.minimum(a, b),
        }
    for op, exp in refs.items():
        out = run(op, [a, b])
        check(out, exp, f"{op} special", elementwise=True)
        if op != "aten.maximum" and op != "aten.minimum":
            zero = (exp == 0) & ~np.isnan(exp)
            np.testing.assert_array_equal(np.signbit(out[zero]), np.signbit(exp[zero]), err_msg=f"{op}: signed zeros")


def test_remainder_fmod_signs():
    a = np.array([5, -5, 5, -5, 7.5, -7.5, 1, -1, 0, 3], np.float32)
    b = np.array([3, 3, -3, -3, 2, 2, math.inf, math.inf, -2, 3], np.float32)
    check(run("aten.remainder", [a, b]), np.array([2, 1, -1, -2, 1.5, 0.5, 1, math.inf, 0, 0], np.float32), "remainder")
    check(run("aten.fmod", [a, b]), np.array([2, -2, 2, -2, 1.5, -1.5, 1, -1, 0, 0], np.float32), "fmod")


INT_DTYPES = [np.int64, np.int32, np.int8, np.uint8]


def int_pair(dtype, seed):
    rng = np.random.default_rng(seed)
    lo = 0 if dtype == np.uint8 else -50
    a = rng.integers(lo, 50, (4, 6)).astype(dtype)
    b = rng.integers(lo, 12, (6,)).astype(dtype)
    b[b == 0] = 3
    return a, b


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_binary_int(dtype):
    a, b = int_pair(dtype, seed=11)
    for op, ref in [("aten.remainder", torch.remainder), ("aten.fmod", torch.fmod), ("aten.maximum", torch.maximum),
                    ("aten.minimum", torch.minimum), ("aten.bitwise_and", torch.bitwise_and),
                    ("aten.bitwise_or", torch.bitwise_or), ("aten.bitwise_xor", torch.bitwise_xor)]:
        check(run(op, [a, b]), ref(t(a), t(b)), f"{op} {dtype}")
    check(run("aten.bitwise_not", [a]), torch.bitwise_not(t(a)), f"bitwise_not {dtype}")
    out = run("aten.atan2", [a, b])
    assert out.dtype == np.float32
    check(out, torch.atan2(t(a), t(b)), f"atan2 {dtype}")


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_int_extremes(dtype):
    info = np.iinfo(dtype)
    a = np.array([info.min, info.min, info.max, info.min, -7, 7], dtype)
    b = np.array([-1, 1, -1, info.max, info.min, -2], dtype)
    for op, ref in [("aten.remainder", torch.remainder), ("aten.fmod", torch.fmod)]:
        check(run(op, [a, b]), ref(t(a), t(b)), f"{op} {dtype} extremes")


@pytest.mark.parametrize("op", ["aten.remainder", "aten.fmod"])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
def test_int_division_by_zero_is_an_error(op, dtype):
    a, b = np.array([4, 5, 6], dtype), np.array([1, 0, 2], dtype)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        getattr(torch, op.split(".")[1])(t(a), t(b))
    with pytest.raises(kiln.KilnError) as e:
        run(op, [a, b])
    assert e.value.args[1] == "InvalidArgument"
    assert op in e.value.args[0] and "division by zero" in e.value.args[0]
    # a float zero divisor is NaN, not an error
    assert np.isnan(run(op, [a.astype(np.float32), b.astype(np.float32)])[1])


def test_maximum_minimum_nan_and_mixed_dtypes():
    a = np.array([1.0, math.nan, 2.0, -0.0, math.inf], np.float32)
    b = np.array([math.nan, 1.0, 3.0, 0.0, -math.inf], np.float32)
    check(run("aten.maximum", [a, b]), np.array([math.nan, math.nan, 3.0, 0.0, math.inf], np.float32), "maximum NaN")
    check(run("aten.minimum", [a, b]), np.array([math.nan, math.nan, 2.0, 0.0, -math.inf], np.float32), "minimum NaN")
    ai, bb = np.array([[-3, 4, 9]], np.int32), np.array([[0.5], [7.0]], np.float32)
    for op, ref in [("aten.maximum", torch.maximum), ("aten.minimum", torch.minimum)]:
        check(run(op, [ai, bb]), ref(t(ai), t(bb)), f"{op} int32 x float32")
        x, y = np.array([True, False, True, False]), np.array([True, True, False, False])
        check(run(op, [x, y]), ref(t(x), t(y)), f"{op} bool")
        # a 0-d int64 operand does not widen int32 (PyTorch's result_type)
        out = run(op, [ai, np.array(5, np.int64)])
        check(out, ref(t(ai), torch.tensor(5)), f"{op} 0-d")


def test_bitwise_bool_and_mixed():
    x, y = np.array([True, False, True, False]), np.array([True, True, False, False])
    for op, ref in [("aten.bitwise_and", torch.bitwise_and), ("aten.bitwise_or", torch.bitwise_or),
                    ("aten.bitwise_xor", torch.bitwise_xor), ("aten.logical_xor", torch.logical_xor)]:
        check(run(op, [x, y]), ref(t(x), t(y)), f"{op} bool")
    check(run("aten.bitwise_not", [x]), torch.bitwise_not(t(x)), "bitwise_not bool")
    a, b = np.array([6, -1, 12], np.int64), np.array([[3], [-8]], np.int8)
    for op, ref in [("aten.bitwise_and", torch.bitwise_and), ("aten.bitwise_xor", torch.bitwise_xor)]:
        check(run(op, [a, b]), ref(t(a), t(b)), f"{op} int64 x int8")
        check(run(op, [x.reshape(4, 1), a]), ref(t(x.reshape(4, 1)), t(a)), f"{op} bool x int64")
    for bad in ([np.ones(2, np.float32), np.ones(2, np.int64)], [np.ones(2, np.float32)]):
        with pytest.raises(kiln.KilnError) as e:
            run("aten.bitwise_or" if len(bad) == 2 else "aten.bitwise_not", bad)
        assert e.value.args[1] == "NotSupported"


def test_logical_xor_any_dtype():
    a = np.array([0.0, -0.0, math.nan, 2.5, 0.0], np.float32)
    b = np.array([[0], [3]], np.int64)
    check(run("aten.logical_xor", [a, b]), torch.logical_xor(t(a), t(b)), "logical_xor float x int")
    assert run("aten.logical_xor", [np.zeros((0,), np.uint8), np.ones((1,), np.float32)]).shape == (0,)


def test_broadcast_mismatch_rejected():
    with pytest.raises(kiln.KilnError) as e:
        run("aten.atan2", [np.ones((2, 3), np.float32), np.ones((4,), np.float32)])
    assert e.value.args[1] == "InvalidArgument"


# ----------------------------------------------------------------------------------------------
# elu
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.5}, {"alpha": 1.6732632, "scale": 1.0507010},
                                   {"alpha": 2.0, "scale": 0.5, "input_scale": 3.0}], ids=str)
def test_elu(attrs):
    alpha, scale, iscale = attrs.get("alpha", 1.0), attrs.get("scale", 1.0), attrs.get("input_scale", 1.0)
    x = rand((3, 29), seed=12)
    check(run("aten.elu", [x], attrs), A.elu(t(x), alpha, scale, iscale), f"elu {attrs} random")
    ref64 = lambda v: np.where(v <= 0, np.expm1(v * iscale) * alpha * scale, v * scale)
    check(run("aten.elu", [SPECIAL], attrs), f64_ref(ref64, SPECIAL), f"elu {attrs} special", elementwise=True)


def test_elu_float64_and_int_refused():
    x = rand((9,), seed=13).astype(np.float64)
    np.testing.assert_allclose(run("aten.elu", [x]), F.elu(t(x)).numpy(), rtol=1e-12)
    with pytest.raises(kiln.KilnError) as e:
        run("aten.elu", [np.array([1, 2])])
    assert e.value.args[1] == "NotSupported"


# ----------------------------------------------------------------------------------------------
# capture: the overloads torch.export produces
# ----------------------------------------------------------------------------------------------

class Overloads(torch.nn.Module):
    def forward(self, x, i, j, m):
        return (
            torch.remainder(x, 1.5), torch.remainder(-7, j), torch.remainder(i, j), torch.fmod(x, -2.0),
            torch.fmod(i, 3), torch.round(x * 10, decimals=-1), torch.round(x, decimals=2), torch.floor(i),
            torch.maximum(x, i), torch.minimum(i, j), i & j, i | 6, i ^ j, ~i, m & (x > 0), ~m, m ^ (i > 0),
            torch.logical_xor(x, i), torch.atan2(x, i), torch.sign(i), torch.isnan(x / x), torch.isinf(i),
            F.elu(x, alpha=0.7), torch.ops.aten.elu(x, 1.2, 0.9, 1.1), torch.expm1(x), torch.log1p(x.abs()),
            torch.acosh(x.abs() + 1), torch.trunc(x * 3), torch.ceil(x), x.tan(),
        )


def test_capture_overloads_match_eager():
    from kiln.capture import capture
    rng = np.random.default_rng(14)
    x = torch.from_numpy((rng.standard_normal((3, 4)) * 3).astype(np.float32))
    i = torch.from_numpy(rng.integers(-9, 9, (3, 4)).astype(np.int32))
    j = torch.from_numpy(rng.integers(1, 9, (4,)).astype(np.int32))
    m = torch.from_numpy(rng.integers(0, 2, (3, 4)).astype(bool))
    model = Overloads()
    cap = capture(model, (x, i, j, m))
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", cap.graph)
    data, _ = pb.compile()
    outs = kiln.load_bytes(data).run(x.numpy(), i.numpy(), j.numpy(), m.numpy())
    with torch.no_grad():
        expected = model(x, i, j, m)
    assert len(outs) == len(expected)
    for k, (o, e) in enumerate(zip(outs, expected)):
        check(o, e, f"output {k}")


def test_capture_int_division_by_zero_is_an_error():
    class M(torch.nn.Module):
        def forward(self, i, j):
            return torch.remainder(i, j)
    i, j = torch.tensor([3, 4]), torch.tensor([1, 0])
    data = kiln.export(M(), (i, torch.tensor([1, 2])), verbose=False).data
    with pytest.raises(kiln.KilnError, match="aten.remainder: integer division by zero"):
        kiln.load_bytes(data).run(i.numpy(), j.numpy())


# ----------------------------------------------------------------------------------------------
# integer pow (src/kernels/portable/elementwise.cpp int_pow)
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint8], ids=lambda d: np.dtype(d).name)
def test_pow_int(dtype):
    signed = dtype != np.uint8
    base = np.array([-3, -2, -1, 0, 1, 2, 3, 7] if signed else [0, 1, 2, 3, 5, 7, 200, 255], dtype)
    exp = np.array([[0], [1], [2], [3], [5], [31], [63]] + ([[-1], [-2], [-3]] if signed else []), dtype)
    check(run("aten.pow", [base, exp]), torch.pow(t(base), t(exp)), f"pow {dtype}")  # wraps like PyTorch
    # Tensor_Scalar / Scalar_Tensor as captured: a 0-d exponent or base
    check(run("aten.pow", [base, np.array(3, dtype)]), torch.pow(t(base), 3), f"pow {dtype} scalar exponent")
    check(run("aten.pow", [np.array(2, dtype), exp]), torch.pow(torch.tensor(2, dtype=t(exp).dtype), t(exp)),
          f"pow {dtype} scalar base")
    # an integer base with a float exponent computes in float32
    out = run("aten.pow", [base, np.array([0.5], np.float32)])
    assert out.dtype == np.float32
    check(out, torch.pow(t(base), t(np.array([0.5], np.float32))), f"pow {dtype} float exponent")

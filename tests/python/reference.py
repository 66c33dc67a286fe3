"""Float64 references for special values, the same on every CPU.

PyTorch eager's float32 results at special inputs depend on the machine: its vectorized kernels
differ between instruction sets (on AVX-512 machines eager's gelu returns NaN for +inf, its AVX2
path returns +inf). So where the suite checks special values (+-inf, NaN, +-0, denormals, huge and
tiny magnitudes) it compares with the op's defining formula evaluated in float64 IEEE arithmetic
(NumPy's float64 ufuncs and scipy.special.erf, whose special-value results are fixed by IEEE 754
and C99 Annex F on every CPU), rounded to float32 once. Ordinary values keep eager as the reference.

The formulas are PyTorch's documented definitions (torch.nn.functional docs, torch.* docs):
where such a formula yields NaN from inf * 0 (gelu(-inf), silu(-inf), hardswish(-inf)), eager
does so on every CPU too, and Kiln follows the formula.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np
import scipy.special

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # tanh-GELU constant, Hendrycks & Gimpel (2016)


def _relu6(x):
    return np.minimum(np.maximum(x, 0.0), 6.0)  # np.minimum/maximum propagate NaN, as ATen does


def _clamp(x, lo, hi):
    # torch.clamp: min(max(x, lo), hi) -- with lo > hi every element is hi; NaN propagates
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return x


def _gelu(x, approximate: str):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + scipy.special.erf(x * _SQRT1_2))


def _leaky_relu(x, slope):
    return np.where(x > 0, x, x * slope)  # NaN > 0 is false: NaN * slope is NaN


# op name -> f(x: float64 array, attrs) -> float64 array
_UNARY: dict[str, Callable[[np.ndarray, Mapping], np.ndarray]] = {
    "aten.exp": lambda x, a: np.exp(x),
    "aten.log": lambda x, a: np.log(x),
    "aten.sqrt": lambda x, a: np.sqrt(x),
    "aten.rsqrt": lambda x, a: 1.0 / np.sqrt(x),
    "aten.reciprocal": lambda x, a: 1.0 / x,
    "aten.erf": lambda x, a: scipy.special.erf(x),
    "aten.sin": lambda x, a: np.sin(x),
    "aten.cos": lambda x, a: np.cos(x),
    "aten.neg": lambda x, a: -x,
    "aten.abs": lambda x, a: np.abs(x),
    "aten.relu": lambda x, a: np.maximum(x, 0.0),
    "aten.sigmoid": lambda x, a: 1.0 / (1.0 + np.exp(-x)),
    "aten.tanh": lambda x, a: np.tanh(x),
    "aten.silu": lambda x, a: x / (1.0 + np.exp(-x)),
    "aten.hardswish": lambda x, a: x * _relu6(x + 3.0) / 6.0,
    "aten.hardsigmoid": lambda x, a: _relu6(x + 3.0) / 6.0,
    "aten.hardtanh": lambda x, a: _clamp(x, float(a.get("min_val", -1.0)), float(a.get("max_val", 1.0))),
    "aten.leaky_relu": lambda x, a: _leaky_relu(x, float(a.get("negative_slope", 0.01))),
    "aten.gelu": lambda x, a: _gelu(x, a.get("approximate", "none")),
    "aten.clamp": lambda x, a: _clamp(x, a.get("min"), a.get("max")),
}


def unary_math(op: str, x: np.ndarray, attrs: Mapping | None = None) -> np.ndarray:
    """Unary `op` ("aten.gelu", ...) with normalized `attrs` on `x` (any float dtype), evaluated by
    the op's definition in float64 and not rounded: a float64 array shaped as x. KeyError for an op
    without a float64 definition here."""
    fn = _UNARY[op]
    with np.errstate(all="ignore"):
        return np.asarray(fn(np.asarray(x, np.float64), dict(attrs or {})), np.float64)


def unary_float64(op: str, x: np.ndarray, attrs: Mapping | None = None) -> np.ndarray:
    """The float32 result of unary `op` ("aten.gelu", ...) with normalized `attrs` on the float32
    array `x`, computed in float64 by the op's definition and rounded to float32 once.
    Shape as x; dtype float32. KeyError for an op without a float64 definition here."""
    with np.errstate(all="ignore"):
        return unary_math(op, x, attrs).astype(np.float32)


def has_unary_float64(op: str) -> bool:
    """True when unary_float64 defines `op`."""
    return op in _UNARY


# op name (and rounding mode) -> f(a, b) on float64 arrays
_BINARY: dict[tuple[str, str | None], Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    ("aten.add", None): np.add,
    ("aten.sub", None): np.subtract,
    ("aten.mul", None): np.multiply,
    ("aten.div", None): np.divide,
    # torch.div(rounding_mode="trunc"): trunc(a / b); "floor": Python's a // b (floor of the exact
    # quotient, NaN for inf // finite), which np.floor_divide implements (npy_divmod)
    ("aten.div", "trunc"): lambda a, b: np.trunc(a / b),
    ("aten.div", "floor"): np.floor_divide,
    ("aten.pow", None): np.power,
    ("aten.eq", None): np.equal, ("aten.ne", None): np.not_equal, ("aten.lt", None): np.less,
    ("aten.le", None): np.less_equal, ("aten.gt", None): np.greater, ("aten.ge", None): np.greater_equal,
    ("aten.logical_and", None): np.logical_and, ("aten.logical_or", None): np.logical_or,
}


def binary_math(op: str, a: np.ndarray, b: np.ndarray, attrs: Mapping | None = None) -> np.ndarray:
    """Binary `op` on a, b (broadcast) evaluated in float64 and not rounded (bool for comparisons
    and logical ops). KeyError when undefined."""
    mode = (attrs or {}).get("rounding_mode")
    fn = _BINARY[(op, mode)]
    with np.errstate(all="ignore"):
        return fn(np.asarray(a, np.float64), np.asarray(b, np.float64))


def binary_float64(op: str, a: np.ndarray, b: np.ndarray, attrs: Mapping | None = None) -> np.ndarray:
    """The result of binary `op` on float32 arrays a, b (broadcast), computed in float64 and
    rounded to float32 once (bool for comparisons and logical ops). For +, -, *, / and sqrt the
    float64 result rounded to float32 equals the correctly rounded float32 result (53 >= 2 * 24 + 2
    bits: double rounding is innocuous), so these are exact references. KeyError when undefined."""
    r = binary_math(op, a, b, attrs)
    if r.dtype == np.bool_:
        return r
    with np.errstate(all="ignore"):
        return r.astype(np.float32)


def softmax_math(x: np.ndarray, dim: int, log: bool = False) -> np.ndarray:
    """softmax (or log_softmax) of `x` along `dim` evaluated in float64, not rounded:
    exp(x - max) / sum(exp(x - max)) and x - max - log(sum(exp(x - max))) (the max subtracted as
    in ATen). A row of only -inf gives NaN (-inf - -inf), as in ATen on every CPU; a NaN anywhere
    in a row makes the row NaN (np.max propagates it)."""
    with np.errstate(all="ignore"):
        xd = np.asarray(x, np.float64)
        if xd.size == 0:
            return xd.copy()
        m = np.max(xd, axis=dim, keepdims=True)
        z = xd - m
        s = np.sum(np.exp(z), axis=dim, keepdims=True)
        return z - np.log(s) if log else np.exp(z) / s


def softmax_float64(x: np.ndarray, dim: int, log: bool = False) -> np.ndarray:
    """softmax (or log_softmax) of float32 `x` along `dim` in float64 (softmax_math), rounded to
    float32."""
    with np.errstate(all="ignore"):
        return softmax_math(x, dim, log).astype(np.float32)

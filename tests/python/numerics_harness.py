"""Differential numerics across backends (issue 22): each op where numerics matter, run over
adversarial input distributions on every backend, against a float64 reference computed from the
op's mathematical definition (NumPy/SciPy, or PyTorch on float64 tensors for convolution).

Pieces (each one table, read by tests/python/test_numerics.py and tools/numerics_report.py, which
writes docs/numerics.md):
- DISTRIBUTIONS: seeded input generators (large mean against small spread, huge / tiny magnitudes,
  denormals, +-inf and NaN, float32 extremes, ...);
- CASES: the ops, each with its input shapes (odd sizes, 1-element and empty tensors), the
  distributions that make sense for it and its float64 reference;
- backends(): portable (Kiln's reference kernels), cpu (the optimized kernels, one entry per
  instruction-set target this build and CPU have), xnnpack, mlx on MLX's CPU device at float32,
  and mlx with compute_dtype float16 / bfloat16;
- TOLERANCES: op -> relative tolerance per precision; every entry looser than DEFAULT_TOL says why;
- DOCUMENTED: (op, backend, distribution) -> why a backend's result differs from the math there
  (a backend library's own behaviour, or a written-down limit of Kiln's op set); such records are
  reported, not failed;
- PENDING: disagreements in Kiln code that other branches own (src/backends/mlx, xnnpack), listed
  until they are fixed (the full sweep fails once one no longer occurs).

The error of one run is max |kiln - ref| / max(|ref|) over the entries whose correctly rounded
float32 reference is finite (the floor of the denominator is the smallest normal float32), i.e.
relative to the output's magnitude. NaN, +inf and -inf must appear at exactly the positions of the
reference rounded to float32 (a reference whose magnitude reaches the compute format's largest
finite value, less the tolerance, may be inf or finite). Shapes must be equal, empty outputs
included.

Reduced precision (mlx with compute_dtype float16 / bfloat16): inputs and constants are first
rounded to the compute dtype (and passed as float32), so the reference is exact for the values the
backend computes on and the error measures its arithmetic, not the rounding of the inputs; only
distributions the format represents are used (no 1000 + 0.01 N in float16: its spread is below
float16's resolution at 1000).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
import os
import warnings
import zlib
from typing import Callable, Sequence

import numpy as np

import kiln
from oprunner import one_node_graph
import reference

F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)  # smallest normal float32
F32_DENORM = float(np.finfo(np.float32).smallest_subnormal)
F32_EPS = float(np.finfo(np.float32).eps)

# ---------------------------------------------------------------- distributions


@dataclasses.dataclass(frozen=True)
class Dist:
    """A seeded input generator: gen(rng, shape) -> float64 values (rounded to the run's precision
    by the harness); doc: what the values are, for docs/numerics.md."""
    doc: str
    gen: Callable[[np.random.Generator, tuple], np.ndarray]


def _normal(loc: float, scale: float):
    return lambda rng, s: loc + scale * rng.standard_normal(s)


def _wide(rng, s):
    # magnitudes log-uniform over float32's normal range, random signs
    return rng.choice([-1.0, 1.0], size=s) * 10.0 ** rng.uniform(-37.0, 38.0, size=s)


def _sprinkle(values: Sequence[float], frac: float):
    """N(0, 1) with a fraction `frac` of the entries replaced by `values` (cycled, shuffled)."""
    def gen(rng, s):
        x = rng.standard_normal(s)
        flat = x.reshape(-1)
        n = flat.size
        k = min(n, max(len(values) if n >= 2 * len(values) else 1, int(round(frac * n)))) if n else 0
        if k:
            pos = rng.choice(n, size=k, replace=False)
            flat[pos] = np.resize(np.asarray(values, np.float64), k)[rng.permutation(k)]
        return x
    return gen


SPECIAL_VALUES = (math.inf, -math.inf, math.nan, 0.0, -0.0)
EXTREME_VALUES = (F32_MAX, -F32_MAX, F32_TINY, -F32_TINY, F32_DENORM, -F32_DENORM, 88.72, -88.72, -103.9, 1e-20,
                  -1e-20, 1e19, -1e19, 0.0, -0.0)

DISTRIBUTIONS: dict[str, Dist] = {
    "normal": Dist("N(0, 1)", _normal(0.0, 1.0)),
    "offset": Dist("1000 + 0.01 N(0, 1): large mean against small spread (mean / spread = 1e5)", _normal(1000.0, 0.01)),
    "offset_small": Dist("1e-3 + 1e-6 N(0, 1): small mean, smaller spread (mean / spread = 1e3)", _normal(1e-3, 1e-6)),
    "offset100": Dist("100 + N(0, 1): an offset mean that float16 and bfloat16 represent well", _normal(100.0, 1.0)),
    "large": Dist("30 N(0, 1): where exp overflows and sigmoid/tanh/gelu saturate", _normal(0.0, 30.0)),
    "huge": Dist("1e30 N(0, 1): squares overflow float32", _normal(0.0, 1e30)),
    "tiny": Dist("1e-30 N(0, 1): squares underflow float32", _normal(0.0, 1e-30)),
    "denormal": Dist("1e-40 N(0, 1): float32 denormals", _normal(0.0, 1e-40)),
    "wide": Dist("+-10^U(-37, 38): magnitudes across float32's normal range", _wide),
    "special": Dist("N(0, 1) with 15% of the entries +inf, -inf, NaN, +0, -0", _sprinkle(SPECIAL_VALUES, 0.15)),
    "extremes": Dist("N(0, 1) with 40% of the entries +-FLT_MAX, +-FLT_MIN, +-smallest denormal, +-88.72, -103.9, "
                     "+-1e-20, +-1e19, +-0", _sprinkle(EXTREME_VALUES, 0.4)),
}

#: distributions each family of ops runs on at float32 (large mean against small spread where a
#: mean is subtracted: norms, softmax, variance)
NORM_DISTS = ("normal", "offset", "offset_small", "huge", "tiny", "denormal", "special")
SOFTMAX_DISTS = ("normal", "offset", "large", "huge", "wide", "tiny", "special")
REDUCE_DISTS = ("normal", "offset", "offset_small", "huge", "tiny", "denormal", "special")
UNARY_DISTS = ("normal", "large", "wide", "huge", "tiny", "denormal", "special", "extremes")
BINARY_DISTS = ("normal", "wide", "tiny", "denormal", "special", "extremes")
LINEAR_DISTS = ("normal", "offset", "huge", "tiny", "denormal", "special")
#: distributions for reduced precision: values the format represents
REDUCED_DISTS = ("normal", "offset100", "special")


def seed_of(*parts) -> int:
    """A stable seed from the parts' text (the same inputs on every run and machine)."""
    return zlib.crc32("|".join(map(str, parts)).encode())


def round_to(x: np.ndarray, precision: str) -> np.ndarray:
    """x (float64 or float32) rounded to `precision` ("float32", "float16", "bfloat16"), returned
    as float32 (round to nearest even; torch's conversion for bfloat16)."""
    with np.errstate(over="ignore"):
        x32 = np.asarray(x, np.float64).astype(np.float32)
        if precision == "float32":
            return x32
        if precision == "float16":
            return x32.astype(np.float16).astype(np.float32)
    import torch
    return torch.from_numpy(np.ascontiguousarray(x32)).to(torch.bfloat16).to(torch.float32).numpy()


# ---------------------------------------------------------------- float64 references


def _moments(x: np.ndarray, axis):
    m = np.mean(x, axis=axis, keepdims=True)
    return m, np.mean((x - m) ** 2, axis=axis, keepdims=True)


def layer_norm_ref(x, w, b, normalized_shape, eps):
    """(x - E[x]) / sqrt(Var[x] + eps) * w + b over the last len(normalized_shape) dims, biased
    variance (torch.nn.functional.layer_norm's documented formula)."""
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    m, v = _moments(x, axes)
    y = (x - m) / np.sqrt(v + eps)
    return y * (1.0 if w is None else w) + (0.0 if b is None else b)


def group_norm_ref(x, w, b, groups, eps):
    """torch.nn.functional.group_norm: the channels split into `groups`, statistics over each
    group's channels and spatial positions (biased variance), then per-channel w, b."""
    n, c = x.shape[0], x.shape[1]
    xg = x.reshape(n, groups, (c // groups) * int(np.prod(x.shape[2:])))
    m, v = _moments(xg, 2)
    y = ((xg - m) / np.sqrt(v + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return y * (1.0 if w is None else w.reshape(shape)) + (0.0 if b is None else b.reshape(shape))


def batch_norm_ref(x, w, b, mean, var, eps):
    """Inference batch norm: (x - mean[c]) / sqrt(var[c] + eps) * w[c] + b[c], c = dim 1."""
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    return y * w.reshape(shape) + b.reshape(shape)


def rms_norm_ref(x, w, normalized_shape, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last dims; eps None = finfo(float32).eps
    (torch.nn.functional.rms_norm)."""
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    eps = F32_EPS if eps is None else eps
    return x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps) * (1.0 if w is None else w)


def var_ref(x, dims, correction):
    """sum((x - mean)^2) / max(0, N - correction) over dims (torch.var); N = 0 gives NaN."""
    n = int(np.prod([x.shape[d] for d in dims])) if x.ndim else 1
    if n == 0:
        return np.full(np.delete(np.array(x.shape), dims) if x.ndim else (), np.nan)
    m = np.mean(x, axis=tuple(dims), keepdims=True)
    return np.sum((x - m) ** 2, axis=tuple(dims)) / max(0.0, n - correction)


def logsumexp_ref(x, dim):
    """log(sum_j exp(x_j)) along dim (torch.logsumexp), evaluated as m + log(sum exp(x - m)) with
    m the row's maximum (0 when it is infinite, so all -inf gives -inf and any +inf gives +inf)."""
    m = np.max(x, axis=dim, keepdims=True)
    m = np.where(np.isinf(m), 0.0, m)
    return np.squeeze(m, dim) + np.log(np.sum(np.exp(x - m), axis=dim))


def sdpa_ref(q, k, v):
    """softmax(q k^T / sqrt(E)) v (torch.nn.functional.scaled_dot_product_attention, no mask)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    return reference.softmax_math(s, -1) @ v


def conv_ref(x, w, b, stride, padding, dilation, groups):
    """The convolution evaluated by PyTorch on float64 tensors (aten.convolution in float64)."""
    import torch
    t = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a, np.float64))  # noqa: E731
    return torch.ops.aten.convolution(t(x), t(w), t(b), list(stride), list(padding), list(dilation), False,
                                      [0] * len(stride), groups).numpy()


# ---------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Arg:
    """One input of a case. kind "x": a method input drawn from the distribution under test;
    "param": a constant, N(0, 1) * scale (weights, biases) or gen(rng, shape); "absent": an omitted
    optional input. shape: a function of the swept shape."""
    shape: Callable[[tuple], tuple]
    kind: str = "x"
    scale: float = 1.0
    gen: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Case:
    """One op of the sweep. name: the row of the tables; op: the Kiln op (None for `module`, a
    torch function captured with kiln.capture, for ops that are compositions in Kiln's op set);
    args(shape) -> list of Arg; attrs(shape) -> dict; ref(arrays float64..., shape) -> float64
    output; shapes: swept shapes (which run in CI and which with KILN_NUMERICS_FULL=1: plan());
    dists: the distributions at float32; params(x, shape) may derive constants from the inputs
    (batch-norm statistics)."""
    name: str
    op: str | None
    args: Callable[[tuple], list]
    attrs: Callable[[tuple], dict]
    ref: Callable
    shapes: tuple
    dists: tuple
    module: Callable | None = None
    params: Callable | None = None


def _same(s):
    return s


def _x(shape_fn=_same, **kw):
    return Arg(shape_fn, "x", **kw)


def _param(shape_fn, scale=1.0):
    return Arg(shape_fn, "param", scale)


def _last(s):
    return (s[-1],) if s else ()


def _chan(s):
    return (s[1],)


UNARY_SHAPES = ((1023,), (1, 3, 7, 5), (17,), (2, 0, 3), (1,), ())
UNARY_OPS = {  # case name -> (op, attrs); references: reference.unary_math (the ops' definitions)
    "exp": ("aten.exp", {}), "log": ("aten.log", {}), "tanh": ("aten.tanh", {}), "sigmoid": ("aten.sigmoid", {}),
    "gelu": ("aten.gelu", {"approximate": "none"}), "gelu_tanh": ("aten.gelu", {"approximate": "tanh"}),
    "silu": ("aten.silu", {}), "erf": ("aten.erf", {}), "sqrt": ("aten.sqrt", {}), "rsqrt": ("aten.rsqrt", {}),
    "reciprocal": ("aten.reciprocal", {}), "sin": ("aten.sin", {}), "cos": ("aten.cos", {}),
    "relu": ("aten.relu", {}), "clamp": ("aten.clamp", {"min": -0.5, "max": 2.0}),
    "hardtanh": ("aten.hardtanh", {"min_val": -1.0, "max_val": 1.0}), "hardswish": ("aten.hardswish", {}),
    "hardsigmoid": ("aten.hardsigmoid", {}), "leaky_relu": ("aten.leaky_relu", {"negative_slope": 0.01}),
}
BINARY_OPS = {"add": "aten.add", "mul": "aten.mul", "div": "aten.div", "pow": "aten.pow"}


def _unary_case(name, op, attrs):
    return Case(name, op, lambda s: [_x()], lambda s: dict(attrs), lambda x, s: reference.unary_math(op, x, attrs),
                UNARY_SHAPES, UNARY_DISTS)


def _binary_case(name, op):
    # both operands from the distribution; pow's exponent is a constant in [-3, 3] (step 0.5, so
    # integers and halves appear: negative bases give NaN for the halves, as the math says)
    if op == "aten.pow":
        exponent = Arg(_same, "param", gen=lambda rng, s: rng.integers(-6, 7, size=s) * 0.5)
        args = lambda s: [_x(), exponent]  # noqa: E731
    else:
        args = lambda s: [_x(), _x()]  # noqa: E731
    return Case(name, op, args, lambda s: {}, lambda a, b, s: reference.binary_math(op, a, b), UNARY_SHAPES[:4],
                BINARY_DISTS)


def _ln_shape(s):
    # layer norm over the last two dims of a rank > 2 input, else the last
    return tuple(s[-2:] if len(s) > 2 else s[-1:])


def _gn_groups(s):
    return {4: 2, 6: 3}.get(s[1], 1)


def _conv(stride, padding, dilation, groups):
    def attrs(s):
        k = len(s) - 2
        return dict(stride=[stride] * k, padding=[padding] * k, dilation=[dilation] * k, transposed=False,
                    output_padding=[0] * k, groups=groups)
    return attrs


def _bn_params(arrays, s):
    # running statistics: the batch's own mean and variance per channel (finite entries; 1 where
    # the variance does not fit float32), as a trained model's would be for data like this
    x = arrays[0].astype(np.float64)
    axes = tuple(d for d in range(x.ndim) if d != 1)
    fin = np.where(np.isfinite(x), x, np.nan)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN channels: handled below
        m = np.nan_to_num(np.nanmean(fin, axis=axes), nan=0.0)
        v = np.nan_to_num(np.nanvar(fin, axis=axes), nan=1.0)
    v = np.where((v > 1e37) | (v <= 0), 1.0, v)
    return {3: m, 4: v}


CASES: list[Case] = [
    # ---- norms (numerically stable variance on every backend: large mean against small spread)
    Case("layer_norm", "aten.native_layer_norm", lambda s: [_x(), _param(_ln_shape), _param(_ln_shape, 0.5)],
         lambda s: {"normalized_shape": list(_ln_shape(s)), "eps": 1e-6},
         lambda x, w, b, s: layer_norm_ref(x, w, b, _ln_shape(s), 1e-6),
         ((3, 1023), (1, 3, 7, 5), (4, 17), (2, 4099), (2, 1), (0, 8), (1, 1)), NORM_DISTS),
    Case("group_norm", "aten.native_group_norm", lambda s: [_x(), _param(_chan), _param(_chan, 0.5)],
         lambda s: {"N": s[0], "C": s[1], "HxW": int(np.prod(s[2:])), "group": _gn_groups(s), "eps": 1e-6},
         lambda x, w, b, s: group_norm_ref(x, w, b, _gn_groups(s), 1e-6),
         ((1, 4, 8, 8), (2, 6, 7, 5), (1, 3, 17), (1, 4, 48, 48), (1, 1, 1), (0, 4, 3)), NORM_DISTS),
    Case("instance_norm", "aten.native_group_norm", lambda s: [_x(), _param(_chan), _param(_chan, 0.5)],
         lambda s: {"N": s[0], "C": s[1], "HxW": int(np.prod(s[2:])), "group": s[1], "eps": 1e-5},
         lambda x, w, b, s: group_norm_ref(x, w, b, s[1], 1e-5),
         ((2, 3, 7, 5), (1, 5, 33), (1, 4, 1, 1), (0, 3, 2)), NORM_DISTS),
    Case("batch_norm", "aten.native_batch_norm",
         lambda s: [_x(), _param(_chan), _param(_chan, 0.5), _param(_chan), _param(_chan)],
         lambda s: {"training": False, "momentum": 0.1, "eps": 1e-5},
         lambda x, w, b, m, v, s: batch_norm_ref(x, w, b, m, v, 1e-5),
         ((2, 3, 7, 5), (1, 16, 9, 9), (4, 5), (1, 1, 1, 1), (0, 3, 4, 4)), NORM_DISTS, params=_bn_params),
    Case("rms_norm", "aten.rms_norm", lambda s: [_x(), _param(_last)],
         lambda s: {"normalized_shape": [s[-1]], "eps": None},
         lambda x, w, s: rms_norm_ref(x, w, [s[-1]], None),
         ((3, 1023), (1, 3, 7, 5), (4, 17), (2, 4099), (1, 1), (0, 8)), NORM_DISTS),
    # ---- softmax family
    Case("softmax", "aten._softmax", lambda s: [_x()], lambda s: {"dim": -1, "half_to_float": False},
         lambda x, s: reference.softmax_math(x, -1), ((3, 1023), (2, 17), (1, 3, 7, 5), (2, 5000), (1,), (0, 5)),
         SOFTMAX_DISTS),
    Case("softmax_dim1", "aten._softmax", lambda s: [_x()], lambda s: {"dim": 1, "half_to_float": False},
         lambda x, s: reference.softmax_math(x, 1), ((1, 3, 7, 5), (2, 33, 9), (1, 1, 1), (2, 0, 3)), SOFTMAX_DISTS),
    Case("log_softmax", "aten._log_softmax", lambda s: [_x()], lambda s: {"dim": -1, "half_to_float": False},
         lambda x, s: reference.softmax_math(x, -1, log=True), ((3, 1023), (2, 17), (1, 3, 7, 5), (1,), (0, 5)),
         SOFTMAX_DISTS),
    Case("logsumexp", None, lambda s: [_x()], lambda s: {}, lambda x, s: logsumexp_ref(x, -1),
         ((3, 1023), (1, 3, 7, 5), (1,)), SOFTMAX_DISTS, module=lambda x: __import__("torch").logsumexp(x, -1)),
    # ---- reductions
    Case("sum", "aten.sum", lambda s: [_x()], lambda s: {"dim": [-1], "keepdim": False},
         lambda x, s: np.sum(x, axis=-1), ((3, 1023), (1, 3, 7, 5), (17,), (1,), (0,)), REDUCE_DISTS),
    Case("mean", "aten.mean", lambda s: [_x()], lambda s: {"dim": [2, 3], "keepdim": True},
         lambda x, s: np.mean(x, axis=(2, 3), keepdims=True), ((2, 3, 33, 31), (1, 3, 7, 5), (1, 1, 1, 1), (1, 2, 0, 3)),
         REDUCE_DISTS),
    Case("var", "aten.var", lambda s: [_x()], lambda s: {"dim": [-1], "correction": 1.0, "keepdim": False},
         lambda x, s: var_ref(x, [x.ndim - 1], 1.0), ((3, 1023), (1, 3, 7, 5), (17,), (1,), (0,)), REDUCE_DISTS),
    Case("var_all", "aten.var", lambda s: [_x()], lambda s: {"dim": None, "correction": 0.0, "keepdim": False},
         lambda x, s: var_ref(x, list(range(x.ndim)), 0.0), ((1, 3, 7, 5), (4099,), (1,)), REDUCE_DISTS),
    Case("std", None, lambda s: [_x()], lambda s: {}, lambda x, s: np.sqrt(var_ref(x, [x.ndim - 1], 1.0)),
         ((3, 1023), (1, 3, 7, 5), (1,)), REDUCE_DISTS, module=lambda x: __import__("torch").std(x, -1)),
    Case("cumsum", "aten.cumsum", lambda s: [_x()], lambda s: {"dim": -1},
         lambda x, s: np.cumsum(x, axis=-1), ((1023,), (1, 3, 7, 5), (1,), (0,)), REDUCE_DISTS),
    # ---- matrix products and convolution (the second operand a N(0, 1) constant)
    Case("mm", "aten.mm", lambda s: [_x(), _param(lambda s: (s[1], 5))], lambda s: {},
         lambda a, b, s: a @ b, ((7, 1023), (33, 64), (1, 17), (1, 1), (0, 4)), LINEAR_DISTS),
    Case("linear", "aten.linear", lambda s: [_x(), _param(lambda s: (9, s[-1])), _param(lambda s: (9,))], lambda s: {},
         lambda x, w, b, s: x @ w.T + b, ((5, 1023), (1, 3, 7, 5), (2, 17), (1, 1), (0, 3)), LINEAR_DISTS),
    Case("conv2d", "aten.convolution", lambda s: [_x(), _param(lambda s: (8, s[1], 3, 3)), _param(lambda s: (8,))],
         _conv(1, 1, 1, 1), lambda x, w, b, s: conv_ref(x, w, b, (1, 1), (1, 1), (1, 1), 1),
         ((1, 3, 7, 5), (2, 16, 13, 11), (1, 1, 1, 1)), LINEAR_DISTS),
    Case("conv2d_depthwise", "aten.convolution",
         lambda s: [_x(), _param(lambda s: (s[1], 1, 3, 3)), _param(lambda s: (s[1],))],
         lambda s: _conv(2, 1, 1, s[1])(s), lambda x, w, b, s: conv_ref(x, w, b, (2, 2), (1, 1), (1, 1), s[1]),
         ((1, 8, 9, 9), (1, 3, 7, 5), (1, 1, 1, 1)), LINEAR_DISTS),
    Case("conv1d", "aten.convolution", lambda s: [_x(), _param(lambda s: (4, s[1], 5)), Arg(_same, "absent")],
         _conv(1, 4, 2, 1), lambda x, w, b, s: conv_ref(x, w, None, (1,), (4,), (2,), 1), ((2, 3, 17), (1, 1, 9), (1, 1, 1)),
         LINEAR_DISTS),
    Case("sdpa", "aten.scaled_dot_product_attention",
         lambda s: [_x(), _param(lambda s: s[:-2] + (11, s[-1])), _param(lambda s: s[:-2] + (11, 6)), Arg(_same, "absent")],
         lambda s: {}, lambda q, k, v, m, s: sdpa_ref(q, k, v), ((1, 2, 7, 16), (2, 5, 8), (1, 1, 1)), LINEAR_DISTS),
]
CASES += [_unary_case(n, op, a) for n, (op, a) in UNARY_OPS.items()]
CASES += [_binary_case(n, op) for n, op in BINARY_OPS.items()]
CASE_BY_NAME = {c.name: c for c in CASES}

# ---------------------------------------------------------------- tolerances


@dataclasses.dataclass(frozen=True)
class Tol:
    """Relative tolerances (max |kiln - ref| / max |ref|) per precision; `why` for any entry
    looser than DEFAULT_TOL: a bound that someone other than us published, or an analysis."""
    float32: float = 1e-5
    float16: float = 1e-3
    bfloat16: float = 1e-2
    why: str = ""

    def of(self, precision: str) -> float:
        return getattr(self, precision)


DEFAULT_TOL = Tol()

#: op -> tolerances; every case has its entry (test_numerics checks that, and that every entry
#: looser than DEFAULT_TOL has its reason).
TOLERANCES: dict[str, Tol] = {name: DEFAULT_TOL for name in CASE_BY_NAME}

# ---------------------------------------------------------------- documented differences


@dataclasses.dataclass(frozen=True)
class Diff:
    """A known difference from the math: records of a case matching `case` on `backend` at
    `precision` for a distribution matching `dist` (fnmatch patterns). kind: what it covers, "specials"
    (NaN/inf positions; the error over finite entries must still be within tolerance), "error" (the
    tolerance; NaN/inf positions must still match) or "any" (both, and run errors)."""
    case: str
    backend: str
    dist: str
    why: str
    kind: str = "any"
    precision: str = "*"
    shapes: tuple = ()  # the input shapes it covers; () = all

    def matches(self, case: str, backend: str, dist: str, precision: str, shape=None) -> bool:
        if shape is not None and self.shapes and tuple(shape) not in self.shapes:
            return False
        return all(fnmatch.fnmatchcase(v, p) for v, p in ((case, self.case), (backend, self.backend),
                                                           (dist, self.dist), (precision, self.precision)))

    def covers(self, rec: "Record") -> bool:
        """Whether this difference explains every way in which `rec` disagrees."""
        if not self.matches(rec.case, rec.backend, rec.dist, rec.precision, rec.shape):
            return False
        if self.kind == "any":
            return True
        if rec.status == "error":
            return False
        return (self.kind == "specials" or not rec.special) and (self.kind == "error" or rec.err <= rec.tol)


_XNN_CLAMP = ("XNNPACK (the 2022 snapshot Kiln links) applies every operator's output range [output_min, output_max] "
              "with x86 max/min instructions, which return the non-NaN operand: a NaN result becomes -inf "
              "(output_min = -inf), or the lower bound for relu / clamp / hardtanh / hardsigmoid (0, min, -1, 0); "
              "ATen and the math propagate NaN")
_XNN_DENORMALS = ("XNNPACK runs its operators with denormals flushed to zero (pthreadpool's "
                  "PTHREADPOOL_FLAG_DISABLE_DENORMALS; measured: relu(1e-40) = 0, relu(2e-38) = 2e-38): denormal inputs "
                  "read as 0 (x / denormal = inf) and denormal results are 0")
_XNN_SIGMOID = ("XNNPACK's f32 sigmoid returns NaN for some |x| from about 4.9e26 up (measured on this build: 4.9e26 "
                "and 5.6e26 NaN, 3.2e27 not) where sigmoid is 0 or 1; silu is lowered as x * sigmoid(x), whose NaN "
                "the output clamp then turns into -inf")

#: Documented differences: a backend library's own behaviour, or a limit of Kiln's op set that is
#: written down; reported in docs/numerics.md instead of failing.
DOCUMENTED: list[Diff] = [
    Diff("*", "xnnpack", "special", _XNN_CLAMP, "specials"),
    Diff("div", "xnnpack", "extremes", _XNN_CLAMP + "; " + _XNN_DENORMALS),
    Diff("*", "xnnpack", "denormal", _XNN_DENORMALS),
    Diff("sigmoid", "xnnpack", "[wh][iu]*", _XNN_SIGMOID, "specials"),  # wide, huge
    Diff("silu", "xnnpack", "[wh][iu]*", _XNN_SIGMOID, "specials"),
    Diff("exp", "mlx", "extremes", "MLX's exp (mlx/backend/cpu/simd/math.h) returns +inf for x > 88.0 (exp(88.0) = "
         "1.65e38: the finite results up to FLT_MAX = exp(88.72) are lost) and 0 for x < -88.0 (no denormal results)",
         "specials"),
    Diff("erf", "mlx", "[tdw]*", "MLX's erf (mlx/backend/cpu/simd/math.h, taken from PyTorch's vec256 erf) is "  # tiny, denormal, wide
         "Abramowitz & Stegun 7.1.26, whose documented bound is an absolute error of 1.5e-7: relative to a small "
         "output it loses accuracy (measured: > 1e-3 relative below |x| = 2.4e-4) and is 0 below |x| = 1.8e-7 "
         "(erf(x) = 1.128 x there)", "error", "float32"),
    Diff("std", "*", "[htd]*", "Kiln captures torch.std as sqrt(aten.var(x)) (PyTorch's decomposition), and the "  # huge, tiny, denormal
         "float32 variance overflows for spreads above ~1.8e19 (std = inf) and underflows below ~1e-19 (std = 0 or "
         "inexact) where the standard deviation itself is representable; eager's std accumulates in double. Needs an "
         "aten.std op (portable kernel and mlx lowering)"),
    # MLX's float32 reductions (mlx 0.32.4, CPU device) sum recursively: the error bound is
    # gamma_(n-1) ~ (n - 1) u (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed.,
    # eq. 4.4), 2.4e-4 at n = 4099, against 1e-5 here; measured 1.5e-5 to 2.1e-5.
    Diff("rms_norm", "mlx", "offset", "mx::fast::rms_norm sums the 4099 squares of a row in float32, recursively "
         "(Higham eq. 4.4: error up to (n - 1) u); measured 1.5e-5 at 1000 + 0.01 N", "error", "float32", ((2, 4099),)),
    Diff("var_all", "mlx", "offset", "the variance of 4099 values sums d^2 with MLX's recursive float32 sum (Higham "
         "eq. 4.4: error up to (n - 1) u = 2.4e-4); measured 2.1e-5", "error", "float32", ((4099,),)),
    Diff("[lgir]*_norm", "mlx", "huge", "MLX's fast layer_norm / rms_norm accumulate the squares in float32, which "
         "overflow for a spread above ~1.8e19: the output is then 0 or the bias (Kiln's cpu kernels recompute such "
         "rows in double)", precision="float32"),
]

#: Disagreements in Kiln code owned by other branches of this issue (src/backends/mlx,
#: src/backends/xnnpack), listed so that the suite stays green meanwhile: test_numerics expects each
#: to fail where it is run (strict: when one is fixed, the test says to remove it here).
PENDING: list[Diff] = []


def documented(rec: "Record") -> Diff | None:
    """The documented difference that explains `rec`, if any."""
    for d in DOCUMENTED:
        if d.covers(rec):
            return d
    return None


def pending(rec: "Record") -> Diff | None:
    """The PENDING entry that explains `rec`, if any."""
    for d in PENDING:
        if d.covers(rec):
            return d
    return None


# ---------------------------------------------------------------- backends


@dataclasses.dataclass(frozen=True)
class Backend:
    """How one backend runs a program: compile with `backends` (and `precision` as compute_dtype),
    load with `load` options. `delegate`: the backend whose delegation report must show the node
    (None for Kiln's own kernels)."""
    name: str
    backends: tuple
    precision: str = "float32"
    load: dict = dataclasses.field(default_factory=dict)
    delegate: str | None = None


def cpu_targets() -> list[str]:
    """The instruction-set targets of Kiln's optimized cpu kernels that the harness runs.
    The kernels (src/kernels/cpu) are written once over Google Highway and compiled for several
    targets (x86: avx3_dl, avx3, avx2; Arm: sve2, sve, neon; and "scalar" everywhere); a process
    runs one of them, chosen once (include/kiln/cpu_target.h): the best one this CPU supports, or
    the one named by the environment variable KILN_CPU_TARGET. So the "cpu" kernels run on every
    CPU, and the harness runs the one target of its process (set KILN_CPU_TARGET to check
    another)."""
    return [os.environ.get("KILN_CPU_TARGET") or "best"]


def backends() -> list[Backend]:
    """Every backend available in this build, in report order."""
    out = [Backend("portable", (), load={"portable_kernels_only": True, "num_threads": 1})]
    out += [Backend(f"cpu-{t}" if len(cpu_targets()) > 1 else "cpu", (), load={"num_threads": 2}) for t in cpu_targets()]
    have = set(kiln._kiln.backend_names())
    if "xnnpack" in have:
        out.append(Backend("xnnpack", ("xnnpack",), delegate="xnnpack", load={"num_threads": 1}))
    if "mlx" in have:
        settings = {"backend_settings": {"mlx.device": "cpu"}}
        out.append(Backend("mlx", ("mlx",), delegate="mlx", load=settings))
        out.append(Backend("mlx", ("mlx",), "float16", delegate="mlx", load=settings))
        out.append(Backend("mlx", ("mlx",), "bfloat16", delegate="mlx", load=settings))
    return out


# ---------------------------------------------------------------- running and comparing


@dataclasses.dataclass
class Record:
    """The outcome of one (case, backend, precision, distribution, shape) run. status: "ok" (compared),
    "declined" (the delegate left the node to Kiln's kernels: not compared), "error" (compile or run
    failed). err: relative error over the finite entries; special: a description of NaN/inf
    positions or shapes that differ from the reference ("" when they agree)."""
    case: str
    backend: str
    precision: str
    dist: str
    shape: tuple
    status: str
    err: float = 0.0
    tol: float = 0.0
    special: str = ""
    detail: str = ""
    diff: Diff | None = None     # the DOCUMENTED entry explaining a disagreement
    pending: Diff | None = None  # the PENDING entry explaining a disagreement

    @property
    def beyond(self) -> bool:
        """True when this run disagrees with the reference (error, tolerance or specials)."""
        return self.status == "error" or (self.status == "ok" and (self.err > self.tol or bool(self.special)))

    @property
    def failed(self) -> bool:
        """A disagreement that is neither a documented difference nor PENDING."""
        return self.beyond and self.diff is None and self.pending is None

    def __str__(self) -> str:
        what = f"{self.case} {self.backend}/{self.precision} {self.dist} {list(self.shape)}"
        if self.status != "ok":
            return f"{what}: {self.status} {self.detail}"
        return f"{what}: err {self.err:.3g} (tol {self.tol:g}){' ' + self.special if self.special else ''}"


#: largest finite value of each compute precision: a result beyond it may overflow to inf
MAX_FINITE = {"float32": F32_MAX, "float16": 65504.0, "bfloat16": 3.3895313892515355e38}


def compare(out: np.ndarray, ref64: np.ndarray, tol: float, precision: str = "float32") -> tuple[float, str]:
    """(relative error over finite entries, description of NaN/inf/shape mismatches or "").
    Entries whose reference magnitude reaches the compute precision's largest finite value (less
    the tolerance) may be inf of the same sign or finite."""
    ref64 = np.asarray(ref64, np.float64)
    if out.shape != ref64.shape:
        return math.inf, f"shape {list(out.shape)} != {list(ref64.shape)}"
    if out.dtype != np.float32:
        return math.inf, f"dtype {out.dtype} != float32"
    if out.size == 0:
        return 0.0, ""
    a = out.astype(np.float64)
    with np.errstate(over="ignore"):
        e32 = ref64.astype(np.float32).astype(np.float64)
    top = MAX_FINITE[precision] / (1.0 + tol)
    edge = (np.abs(ref64) >= top) & (np.sign(a) == np.sign(ref64)) & (np.abs(a) >= top)
    msgs = []
    for label, f in (("NaN", np.isnan), ("+inf", lambda v: v == math.inf), ("-inf", lambda v: v == -math.inf)):
        bad = (f(a) != f(e32)) & ~edge
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            msgs.append(f"{label} positions differ at {int(bad.sum())} entries (first: flat {i}, kiln {out.reshape(-1)[i]!r}, "
                        f"ref {ref64.reshape(-1)[i]!r})")
    fin = np.isfinite(e32) & np.isfinite(a)
    if not fin.any():
        return 0.0, "; ".join(msgs)
    scale = max(float(np.max(np.abs(ref64[fin]))), F32_TINY)
    return float(np.max(np.abs(a[fin] - ref64[fin]))) / scale, "; ".join(msgs)


def make_inputs(case: Case, shape: tuple, dist: str, precision: str = "float32"):
    """The case's arrays (float32, None for absent inputs) and the indices that are constants."""
    rng = np.random.default_rng(seed_of(case.name, dist, shape))
    arrays, consts = [], []
    for i, arg in enumerate(case.args(shape)):
        if arg.kind == "absent":
            arrays.append(None)
        elif arg.kind == "x":
            arrays.append(round_to(DISTRIBUTIONS[dist].gen(rng, arg.shape(shape)), precision))
        else:
            ps = arg.shape(shape)
            arrays.append(round_to(arg.gen(rng, ps) if arg.gen else arg.scale * rng.standard_normal(ps), precision))
            consts.append(i)
    if case.params is not None:
        for i, v in case.params(arrays, shape).items():
            arrays[i] = round_to(v, precision)
    return arrays, consts


_CAPTURED: dict = {}


def _graph(case: Case, shape: tuple, arrays, consts):
    """A kiln.Graph of the case (one node, or the capture of `module`) and its method inputs."""
    if case.module is not None:
        key = (case.name, shape)
        if key not in _CAPTURED:
            import torch
            from kiln.capture import capture

            class M(torch.nn.Module):
                def forward(self, x):
                    return case.module(x)
            _CAPTURED[key] = capture(M(), (torch.from_numpy(arrays[0]),), progress=lambda s: None).graph
        return _CAPTURED[key], [arrays[0]]
    return one_node_graph(case.op, arrays, case.attrs(shape), consts)


def run_one(case: Case, backend: Backend, shape: tuple, dist: str) -> Record:
    """Compiles and runs the case on `backend` for inputs of `dist`; compares with the reference."""
    prec = backend.precision
    rec = Record(case.name, backend.name, prec, dist, tuple(shape), "ok", tol=TOLERANCES[case.name].of(prec))
    _run(rec, case, backend, shape, dist)
    if rec.beyond:
        rec.diff = documented(rec)
        rec.pending = None if rec.diff else pending(rec)
    return rec


def _run(rec: Record, case: Case, backend: Backend, shape: tuple, dist: str) -> None:
    prec = backend.precision
    arrays, consts = make_inputs(case, shape, dist, prec)
    try:
        g, feeds = _graph(case, shape, arrays, consts)
        pb = kiln.ProgramBuilder()
        pb.add_method("forward", g)
        data, rep = pb.compile(backends=list(backend.backends), fold_constants=False, compute_dtype=prec)
        if backend.delegate is not None:
            dl = rep["methods"][0]["delegation"]
            seg = [b for b in dl["backends"] if b["backend"] == backend.delegate]
            if not seg or seg[0]["nodes"] == 0:
                rec.status = "declined"
                rec.detail = "; ".join(f"{c['op']}: {r}" for c in dl["cpu_ops"] for b, r in c["reasons"]
                                       if b == backend.delegate)[:300]
                return
            if dl["cpu_ops"]:
                rec.detail = "partly delegated: " + ", ".join(c["op"] for c in dl["cpu_ops"])
        (out,) = kiln.load_bytes(data, **backend.load).run(*feeds)
    except kiln.KilnError as e:
        rec.status = "error"
        rec.detail = str(e.args[0] if e.args else e)[:300]
        return
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's "mean of empty slice": NaN, as torch
        ref = case.ref(*[None if a is None else a.astype(np.float64) for a in arrays], tuple(shape))
    rec.err, rec.special = compare(out, ref, rec.tol, prec)


def _is_edge(shape: tuple) -> bool:
    return int(np.prod(shape)) <= 1


def plan(case: Case, backend: Backend, full: bool) -> list[tuple[tuple, str]]:
    """(shape, distribution) pairs of a sweep. With `full`: every shape on every distribution.
    Else (CI): the first two shapes on every distribution and the edge shapes (1 element, empty,
    rank 0) on the first; for mlx one shape and one edge shape (MLX's CPU device compiles every
    fused kernel per shape with the system compiler, 1-2 s each on a cold cache: docs/mlx.md), at
    reduced precision no edge shape. Reduced precision runs on REDUCED_DISTS."""
    reduced = backend.precision != "float32"
    dists = REDUCED_DISTS if reduced else case.dists
    main = [s for s in case.shapes if not _is_edge(s)]
    edge = [s for s in case.shapes if _is_edge(s)]
    if not full:
        main = main[:1] if backend.name == "mlx" else main[:2]
        edge = [] if reduced else edge[:1] if backend.name == "mlx" else edge
    out = [(s, d) for s in main for d in dists]
    for s in edge:
        out += [(s, d) for d in (dists if full else dists[:1])]
    return out


def sweep(cases: Sequence[Case] | None = None, full: bool | None = None, progress=None) -> list[Record]:
    """Runs `cases` (default CASES) on every available backend; full defaults to
    KILN_NUMERICS_FULL=1. Returns every Record."""
    full = os.environ.get("KILN_NUMERICS_FULL", "") == "1" if full is None else full
    records = []
    bks = backends()
    for case in (CASES if cases is None else cases):
        for b in bks:
            for shape, dist in plan(case, b, full):
                records.append(run_one(case, b, shape, dist))
        if progress:
            progress(case.name)
    return records

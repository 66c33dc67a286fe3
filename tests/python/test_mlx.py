"""The mlx delegate (src/backends/mlx/) against PyTorch eager, on MLX's CPU device.

Every test builds a graph with kiln.Graph, compiles it with backends=["mlx"], checks from the
delegation report that the nodes were delegated (one mlx segment, nothing left to CPU kernels)
and compares the run with torch eager: fp32 max abs error <= 1e-4 * max|expected| (issue 5).
The test process sets KILN_MLX_DEVICE=cpu (this machine has no GPU); the unavailable-device test
runs in a subprocess without it.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

os.environ["KILN_MLX_DEVICE"] = "cpu"

import kiln  # noqa: E402
from delegate_util import add_const, check_all_delegated, compile_graph, declined_reasons, segment  # noqa: E402
from oprunner import assert_close, kiln_dtype  # noqa: E402

A = torch.ops.aten
F = torch.nn.functional
torch.set_num_threads(1)
REL = 1e-4

pytestmark = pytest.mark.skipif("mlx" not in kiln._kiln.backend_names(),
                                reason="the mlx backend is not built (no MLX CMake package from `python -m mlx --cmake-dir`)")


def _rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _add_const(g, name, arr):
    return add_const(g, name, arr)


def mlx_segment(delegation):
    return segment(delegation, "mlx")


def compile_run(build, feeds, backends=("mlx",), **opts):
    """build(g, input_ids) -> output ids. Returns (outputs, delegation report, compiled bytes)."""
    opts.setdefault("fold_constants", False)
    outs, delegation, data, _ = compile_graph(build, feeds, backends, **opts)
    return outs, delegation, data


def check_delegated(delegation, nodes=None):
    check_all_delegated(delegation, "mlx", nodes)


def reasons(delegation, op):
    return declined_reasons(delegation, op, "mlx")


def run_one(op, inputs, attrs=None, constants=()):
    """One node of `op`; inputs: arrays or None; `constants`: indices embedded as constants.
    Asserts the node was delegated; returns its output."""
    def build(g, ids):
        it = iter(ids)
        args = []
        for i, x in enumerate(inputs):
            if x is None:
                args.append(-1)
            elif i in constants:
                args.append(_add_const(g, f"c{i}", x))
            else:
                args.append(next(it))
        return g.add_node(op, args, attrs or {})

    feeds = [x for i, x in enumerate(inputs) if x is not None and i not in constants]
    (out,), dl, _ = compile_run(build, feeds)
    check_delegated(dl, nodes=1)
    return out


def T(x):
    return None if x is None else torch.from_numpy(np.ascontiguousarray(x))


# ---------------------------------------------------------------- convolution

CONV_CASES = [
    # (input shape, out channels, kernel, stride, padding, dilation, groups, bias)
    ((1, 3, 9, 9), 8, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    ((2, 4, 10, 7), 6, (3, 2), (2, 1), (0, 1), (1, 1), 1, False),
    ((1, 8, 12, 12), 8, (3, 3), (2, 2), (1, 1), (1, 1), 8, True),     # depthwise
    ((1, 8, 13, 11), 8, (3, 3), (1, 1), (2, 2), (2, 2), 8, True),     # depthwise, dilation 2
    ((1, 4, 11, 11), 8, (5, 5), (2, 2), (2, 2), (1, 1), 4, False),    # depthwise, multiplier 2
    ((1, 6, 8, 8), 9, (1, 1), (1, 1), (0, 0), (1, 1), 3, True),       # grouped 1x1
    ((1, 4, 9, 9), 5, (3, 3), (1, 2), (1, 0), (2, 1), 1, True),
    ((3, 5, 17), 7, (3,), (2,), (1,), (1,), 1, True),                  # 1-D
    ((2, 4, 15), 4, (5,), (1,), (4,), (2,), 2, False),                 # 1-D grouped dilated
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
@pytest.mark.parametrize("weight_input", [False, True], ids=["wconst", "winput"])
@pytest.mark.parametrize("impl", ["taps", "native"])
def test_convolution(case, weight_input, impl, monkeypatch):
    # On MLX's CPU device 2-D convolutions (groups 1, depthwise) are built from strided slices;
    # KILN_MLX_CONV=native uses MLX's convolution (what a GPU runs) for every case.
    if impl == "native":
        monkeypatch.setenv("KILN_MLX_CONV", "native")
    shape, cout, k, s, p, d, groups, bias = case
    x = _rand(*shape, seed=1)
    w = _rand(cout, shape[1] // groups, *k, seed=2)
    b = _rand(cout, seed=3) if bias else None
    attrs = dict(stride=list(s), padding=list(p), dilation=list(d), transposed=False, output_padding=[0] * len(k),
                 groups=groups)
    out = run_one("aten.convolution", [x, w, b], attrs, constants=(2,) if weight_input else (1, 2))
    ref = A.convolution(T(x), T(w), T(b), list(s), list(p), list(d), False, [0] * len(k), groups).numpy()
    assert_close(out, ref, REL, "conv")


TCONV_CASES = [
    # (input shape, out channels, kernel, stride, padding, output_padding, dilation, groups, bias)
    ((1, 4, 5, 5), 3, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), 1, True),
    ((2, 4, 4, 6), 6, (4, 4), (2, 2), (1, 1), (0, 0), (1, 1), 2, False),   # grouped
    ((1, 3, 5, 4), 2, (3, 2), (1, 2), (0, 1), (0, 1), (2, 1), 1, True),    # dilated
    ((1, 2, 6, 6), 2, (2, 2), (1, 1), (1, 1), (0, 0), (1, 1), 1, True),    # padding > d(k-1): crop
    ((2, 3, 9), 4, (3,), (3,), (1,), (2,), (1,), 1, True),                 # 1-D
]


@pytest.mark.parametrize("case", TCONV_CASES, ids=[str(i) for i in range(len(TCONV_CASES))])
def test_transposed_convolution(case):
    shape, cout, k, s, p, op, d, groups, bias = case
    x = _rand(*shape, seed=4)
    w = _rand(shape[1], cout // groups, *k, seed=5)
    b = _rand(cout, seed=6) if bias else None
    attrs = dict(stride=list(s), padding=list(p), dilation=list(d), transposed=True, output_padding=list(op),
                 groups=groups)
    out = run_one("aten.convolution", [x, w, b], attrs, constants=(1, 2))
    ref = A.convolution(T(x), T(w), T(b), list(s), list(p), list(d), True, list(op), groups).numpy()
    assert_close(out, ref, REL, "conv_transpose")


# ---------------------------------------------------------------- elementwise

BINARY_SHAPES = [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (1, 3, 1, 1)), ((2, 3, 4, 5), (5,)),
                 ((3, 1, 5), (4, 1)), ((7,), ())]


@pytest.mark.parametrize("op,attrs,ref", [
    ("aten.add", {}, lambda a, b: a + b),
    ("aten.add", {"alpha": 2.5}, lambda a, b: torch.add(a, b, alpha=2.5)),
    ("aten.sub", {"alpha": -0.5}, lambda a, b: torch.sub(a, b, alpha=-0.5)),
    ("aten.mul", {}, lambda a, b: a * b),
    ("aten.div", {}, lambda a, b: a / b),
], ids=["add", "add_alpha", "sub_alpha", "mul", "div"])
@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=[str(i) for i in range(len(BINARY_SHAPES))])
def test_binary(op, attrs, ref, shapes):
    a, b = _rand(*shapes[0], seed=7), _rand(*shapes[1], seed=8) + (3.0 if op == "aten.div" else 0.0)
    out = run_one(op, [a, b], attrs)
    assert_close(out, ref(T(a), T(b)).numpy(), REL, op)


def test_binary_constant_operand_and_pow():
    x = np.abs(_rand(2, 3, 4, 5, seed=9)) + 0.5
    c = _rand(1, 3, 1, 1, seed=10)
    assert_close(run_one("aten.mul", [x, c], constants=(1,)), x * c, REL, "mul const")
    e = _rand(4, 5, seed=11)
    assert_close(run_one("aten.pow", [x, e]), torch.pow(T(x), T(e)).numpy(), REL, "pow")


def test_div_rounding_mode_is_declined_with_reason():
    a, b = _rand(3, 4, seed=12), _rand(3, 4, seed=13) + 3
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.div", ids, {"rounding_mode": "floor"}), [a, b])
    assert mlx_segment(dl)["segments"] == 0
    assert any("rounding_mode" in r for r in reasons(dl, "aten.div")), dl
    assert_close(out, torch.div(T(a), T(b), rounding_mode="floor").numpy(), 1e-6, "div floor")


UNARY = [
    ("aten.relu", {}, torch.relu),
    ("aten.hardtanh", {}, F.hardtanh),
    ("aten.hardtanh", {"min_val": 0.0, "max_val": 6.0}, lambda t: F.hardtanh(t, 0.0, 6.0)),
    ("aten.clamp", {"min": -0.5}, lambda t: torch.clamp(t, min=-0.5)),
    ("aten.clamp", {"min": -0.5, "max": 0.25}, lambda t: torch.clamp(t, -0.5, 0.25)),
    ("aten.clamp", {"max": 0.3}, lambda t: torch.clamp(t, max=0.3)),
    ("aten.clamp", {"min": 1.0, "max": -1.0}, lambda t: torch.clamp(t, 1.0, -1.0)),
    ("aten.hardswish", {}, F.hardswish),
    ("aten.hardsigmoid", {}, F.hardsigmoid),
    ("aten.sigmoid", {}, torch.sigmoid),
    ("aten.tanh", {}, torch.tanh),
    ("aten.silu", {}, F.silu),
    ("aten.gelu", {}, F.gelu),
    ("aten.gelu", {"approximate": "tanh"}, lambda t: F.gelu(t, approximate="tanh")),
    ("aten.leaky_relu", {"negative_slope": 0.2}, lambda t: F.leaky_relu(t, 0.2)),
    ("aten.neg", {}, torch.neg),
    ("aten.exp", {}, torch.exp),
    ("aten.abs", {}, torch.abs),
    ("aten.erf", {}, torch.erf),
    ("aten.sin", {}, torch.sin),
    ("aten.cos", {}, torch.cos),
]


@pytest.mark.parametrize("op,attrs,ref", UNARY, ids=[f"{u[0][5:]}{i}" for i, u in enumerate(UNARY)])
def test_unary(op, attrs, ref):
    x = _rand(2, 3, 5, 7, seed=14, scale=3.0)
    assert_close(run_one(op, [x], attrs), ref(T(x)).numpy(), REL, op)


@pytest.mark.parametrize("op,ref", [("aten.log", torch.log), ("aten.sqrt", torch.sqrt), ("aten.rsqrt", torch.rsqrt),
                                    ("aten.reciprocal", torch.reciprocal)])
def test_unary_positive_domain(op, ref):
    x = np.abs(_rand(3, 11, seed=15)) + 0.1
    assert_close(run_one(op, [x]), ref(T(x)).numpy(), REL, op)


def test_where_comparisons_logical_and_casts():
    a, b = _rand(3, 1, 5, seed=16), _rand(4, 5, seed=17)
    for op, ref in [("aten.eq", torch.eq), ("aten.ne", torch.ne), ("aten.lt", torch.lt), ("aten.le", torch.le),
                    ("aten.gt", torch.gt), ("aten.ge", torch.ge)]:
        assert_close(run_one(op, [a, b]), ref(T(a), T(b)).numpy(), 0, op)
    c = a > 0
    assert_close(run_one("aten.where", [c, a, b]), torch.where(T(c), T(a), T(b)).numpy(), 0, "where")
    d = b > 0.3
    assert_close(run_one("aten.logical_and", [c, d]), (T(c) & T(d)).numpy(), 0, "and")
    assert_close(run_one("aten.logical_or", [c, d]), (T(c) | T(d)).numpy(), 0, "or")
    assert_close(run_one("aten.logical_not", [d]), (~T(d)).numpy(), 0, "not")
    i = np.arange(-6, 6, dtype=np.int64).reshape(3, 4)
    assert_close(run_one("aten._to_copy", [i], {"dtype": "float32"}), i.astype(np.float32), 0, "int->float")
    assert_close(run_one("aten._to_copy", [a], {"dtype": "bool"}), T(a).bool().numpy(), 0, "float->bool")


# ---------------------------------------------------------------- reductions, softmax

@pytest.mark.parametrize("op", ["aten.mean", "aten.sum", "aten.amax", "aten.amin"])
@pytest.mark.parametrize("dim,keepdim", [([2, 3], True), ([-1], False), ([0, 2], False), (None, False)])
def test_reduction(op, dim, keepdim):
    x = _rand(2, 5, 6, 7, seed=18)
    if dim is None and op in ("aten.amax", "aten.amin"):
        dim = []
    attrs = {"keepdim": keepdim} if dim is None else {"dim": dim, "keepdim": keepdim}
    t = T(x)
    fn = {"aten.mean": torch.mean, "aten.sum": torch.sum, "aten.amax": torch.amax, "aten.amin": torch.amin}[op]
    ref = fn(t) if not dim else fn(t, dim, keepdim)
    assert_close(run_one(op, [x], attrs), ref.numpy(), REL, op)


@pytest.mark.parametrize("op", ["aten._softmax", "aten._log_softmax"])
@pytest.mark.parametrize("dim", [-1, 1])
def test_softmax(op, dim):
    x = _rand(2, 7, 9, seed=19, scale=4.0)
    ref = (torch.softmax if op == "aten._softmax" else torch.log_softmax)(T(x), dim).numpy()
    assert_close(run_one(op, [x], {"dim": dim}), ref, REL, op)


def test_mean_of_4096_twenties_is_exact():
    x = np.full((1, 4096), 20.0, np.float32)
    assert run_one("aten.mean", [x], {"dim": [1]})[0] == 20.0
    assert run_one("aten.sum", [x], {"dim": [1]})[0] == 81920.0


# ---------------------------------------------------------------- pooling

MAXPOOL = [
    dict(kernel_size=[3, 3], stride=[2, 2], padding=[1, 1], dilation=[1, 1], ceil_mode=False),
    dict(kernel_size=[3, 3], stride=[2, 2], padding=[0, 0], dilation=[1, 1], ceil_mode=True),
    dict(kernel_size=[3, 3], stride=[2, 2], padding=[1, 1], dilation=[1, 1], ceil_mode=True),
    dict(kernel_size=[2, 3], stride=[2, 1], padding=[1, 0], dilation=[2, 1], ceil_mode=True),
    dict(kernel_size=[2, 2], stride=[], padding=[0], dilation=[1], ceil_mode=False),
]


@pytest.mark.parametrize("attrs", MAXPOOL, ids=[str(i) for i in range(len(MAXPOOL))])
@pytest.mark.parametrize("hw", [(8, 8), (9, 11)])
def test_max_pool(attrs, hw):
    x = _rand(2, 3, *hw, seed=20) - 3.0  # mostly negative: padding must never win
    ref = F.max_pool2d(T(x), attrs["kernel_size"], attrs["stride"] or None, attrs["padding"], attrs["dilation"],
                       ceil_mode=attrs["ceil_mode"]).numpy()
    assert_close(run_one("aten.max_pool2d", [x], attrs), ref, REL, "maxpool")


AVGPOOL = [
    dict(kernel_size=[2, 2], stride=[2, 2], padding=[0, 0]),
    dict(kernel_size=[3, 3], stride=[2, 2], padding=[1, 1]),
    dict(kernel_size=[3, 3], stride=[2, 2], padding=[1, 1], count_include_pad=False),
    dict(kernel_size=[3, 2], stride=[2, 2], padding=[1, 1], ceil_mode=True),
    dict(kernel_size=[3, 3], stride=[2, 2], padding=[1, 1], ceil_mode=True, count_include_pad=False),
    dict(kernel_size=[3, 3], stride=[1, 2], padding=[0, 1], divisor_override=5),
]


@pytest.mark.parametrize("attrs", AVGPOOL, ids=[str(i) for i in range(len(AVGPOOL))])
def test_avg_pool(attrs):
    x = _rand(2, 3, 9, 10, seed=21)
    ref = F.avg_pool2d(T(x), attrs["kernel_size"], attrs["stride"], attrs["padding"], attrs.get("ceil_mode", False),
                       attrs.get("count_include_pad", True), attrs.get("divisor_override")).numpy()
    assert_close(run_one("aten.avg_pool2d", [x], attrs), ref, REL, "avgpool")


@pytest.mark.parametrize("shape,out_size", [((1, 4, 6, 9), [1, 1]), ((2, 3, 6, 9), [2, 3]), ((1, 4, 7, 10), [3, 4]),
                                            ((3, 5, 5), [2, 2])])
def test_adaptive_avg_pool(shape, out_size):
    x = _rand(*shape, seed=22)
    ref = F.adaptive_avg_pool2d(T(x), out_size).numpy()
    assert_close(run_one("aten.adaptive_avg_pool2d", [x], {"output_size": out_size}), ref, REL, "adaptive")


# ---------------------------------------------------------------- linear algebra

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 16), (2, 5, 16), (16,)])
def test_linear(bias, shape):
    x, w, b = _rand(*shape, seed=23), _rand(10, 16, seed=24), _rand(10, seed=25)
    out = run_one("aten.linear", [x, w, b if bias else None], constants=(1, 2))
    assert_close(out, F.linear(T(x), T(w), T(b) if bias else None).numpy(), REL, "linear")


def test_addmm_mm_bmm():
    x, w, b = _rand(3, 16, seed=26), _rand(16, 10, seed=27), _rand(10, seed=28)
    assert_close(run_one("aten.addmm", [b, x, w], constants=(0, 2)), torch.addmm(T(b), T(x), T(w)).numpy(), REL, "addmm")
    out = run_one("aten.addmm", [b, x, w], {"alpha": 0.5, "beta": 2.0})
    assert_close(out, torch.addmm(T(b), T(x), T(w), alpha=0.5, beta=2.0).numpy(), REL, "addmm ab")
    assert_close(run_one("aten.mm", [x, w]), (T(x) @ T(w)).numpy(), REL, "mm")
    p, q = _rand(4, 3, 7, seed=29), _rand(4, 7, 5, seed=30)
    assert_close(run_one("aten.bmm", [p, q]), torch.bmm(T(p), T(q)).numpy(), REL, "bmm")


# ---------------------------------------------------------------- normalization

@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm(affine):
    x = _rand(2, 5, 7, 3, seed=31)
    w, b = _rand(5, seed=32), _rand(5, seed=33)
    mean, var = _rand(5, seed=34), np.abs(_rand(5, seed=35)) + 0.5
    out = run_one("aten.native_batch_norm", [x, w if affine else None, b if affine else None, mean, var],
                  {"training": False, "momentum": 0.1, "eps": 1e-3}, constants=(1, 2, 3, 4))
    ref = F.batch_norm(T(x), T(mean), T(var), T(w) if affine else None, T(b) if affine else None, False, 0.1, 1e-3)
    assert_close(out, ref.numpy(), REL, "bn")


@pytest.mark.parametrize("shape,norm", [((2, 7, 33), [33]), ((3, 4, 6), [4, 6])])
def test_layer_norm(shape, norm):
    x = _rand(*shape, seed=36) * 3 + 1
    w, b = _rand(*norm, seed=37), _rand(*norm, seed=38)
    out = run_one("aten.native_layer_norm", [x, w, b], {"normalized_shape": norm, "eps": 1e-5}, constants=(1, 2))
    assert_close(out, F.layer_norm(T(x), norm, T(w), T(b), 1e-5).numpy(), REL, "ln")


def test_layer_norm_near_1e_3_matches_eager():
    x = (np.sign(_rand(4, 64, seed=39)) * 1e-3 + _rand(4, 64, seed=40) * 1e-6).astype(np.float32)
    out = run_one("aten.native_layer_norm", [x, None, None], {"normalized_shape": [64], "eps": 1e-12})
    assert_close(out, F.layer_norm(T(x), [64], eps=1e-12).numpy(), REL, "ln small")


@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 7), 3), ((1, 8, 9), 2), ((2, 4, 3, 3), 4)])
def test_group_norm(shape, groups):
    x = _rand(*shape, seed=41) * 2 + 0.5
    c = shape[1]
    w, b = _rand(c, seed=42), _rand(c, seed=43)
    hxw = int(np.prod(shape[2:]))
    out = run_one("aten.native_group_norm", [x, w, b], {"N": shape[0], "C": c, "HxW": hxw, "group": groups, "eps": 1e-5},
                  constants=(1, 2))
    assert_close(out, F.group_norm(T(x), groups, T(w), T(b), 1e-5).numpy(), REL, "gn")


@pytest.mark.parametrize("eps", [None, 1e-6])
def test_rms_norm(eps):
    x, w = _rand(3, 5, 16, seed=44), _rand(16, seed=45)
    out = run_one("aten.rms_norm", [x, w], {"normalized_shape": [16], "eps": eps}, constants=(1,))
    assert_close(out, F.rms_norm(T(x), [16], T(w), eps).numpy(), REL, "rms")


# ---------------------------------------------------------------- attention

SDPA = [
    # (q shape, k shape, v shape, mask kind, is_causal, scale, enable_gqa)
    ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), None, False, None, False),
    ((1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 6, 8), None, True, None, False),       # causal, L == S (fused)
    ((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8), None, True, None, False),       # causal, L != S
    ((2, 2, 5, 4), (2, 2, 7, 4), (2, 2, 7, 4), "bool", False, 0.3, False),
    ((2, 2, 5, 4), (2, 2, 7, 4), (2, 2, 7, 4), "float", False, None, False),
    ((1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8), None, False, None, True),       # gqa
    ((3, 5, 6), (3, 7, 6), (3, 7, 9), None, False, None, False),               # rank 3, Ev != E
]


@pytest.mark.parametrize("case", SDPA, ids=[str(i) for i in range(len(SDPA))])
def test_sdpa(case):
    qs, ks, vs, mask, causal, scale, gqa = case
    q, k, v = _rand(*qs, seed=46), _rand(*ks, seed=47), _rand(*vs, seed=48)
    L, S = qs[-2], ks[-2]
    m = None
    if mask == "bool":
        m = np.random.default_rng(49).random((L, S)) > 0.3
        m[:, 0] = True  # no fully masked row
    elif mask == "float":
        m = _rand(1, 1, L, S, seed=50)
    attrs = {"is_causal": causal, "scale": scale, "enable_gqa": gqa}
    out = run_one("aten.scaled_dot_product_attention", [q, k, v, m], attrs)
    ref = F.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=T(m), is_causal=causal, scale=scale,
                                         enable_gqa=gqa).numpy()
    assert_close(out, ref, REL, "sdpa")


# ---------------------------------------------------------------- upsampling

@pytest.mark.parametrize("out_size,scales", [([10, 14], None), ([8, 11], (1.6, 1.6)), ([3, 4], None), ([5, 7], None)])
def test_upsample_nearest(out_size, scales):
    x = _rand(2, 3, 5, 7, seed=51)
    attrs = {"output_size": out_size}
    if scales:
        attrs.update(scales_h=scales[0], scales_w=scales[1])
    out = run_one("aten.upsample_nearest2d", [x], attrs)
    ref = A.upsample_nearest2d(T(x), out_size, *(scales or (None, None))).numpy()
    assert_close(out, ref, 0, "nearest")


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("out_size,scales", [([10, 14], None), ([8, 11], (1.6, 1.6)), ([3, 4], None), ([1, 7], None)])
def test_upsample_bilinear(align, out_size, scales):
    x = _rand(2, 3, 5, 7, seed=52)
    attrs = {"output_size": out_size, "align_corners": align}
    if scales and not align:
        attrs.update(scales_h=scales[0], scales_w=scales[1])
    out = run_one("aten.upsample_bilinear2d", [x], attrs)
    sc = scales if (scales and not align) else (None, None)
    ref = A.upsample_bilinear2d(T(x), out_size, align, *sc).numpy()
    assert_close(out, ref, REL, "bilinear")


# ---------------------------------------------------------------- shape and data movement

def test_shape_ops():
    x = _rand(2, 3, 4, 5, seed=53)
    t = T(x)
    assert_close(run_one("aten.view", [x], {"size": [6, -1]}), t.view(6, -1).numpy(), 0, "view")
    assert_close(run_one("aten.permute", [x], {"dims": [0, 2, 3, 1]}), t.permute(0, 2, 3, 1).numpy(), 0, "permute")
    assert_close(run_one("aten.transpose", [x], {"dim0": 1, "dim1": -1}), t.transpose(1, -1).numpy(), 0, "transpose")
    y = _rand(3, 1, 5, seed=54)
    assert_close(run_one("aten.expand", [y], {"size": [2, 3, 4, -1]}), T(y).expand(2, 3, 4, -1).numpy(), 0, "expand")
    assert_close(run_one("aten.slice", [x], {"dim": 3, "start": 1, "end": -1, "step": 2}), t[..., 1:-1:2].numpy(), 0,
                 "slice")
    assert_close(run_one("aten.slice", [x], {"dim": 1, "start": -2, "end": 100}), t[:, -2:].numpy(), 0, "slice end")
    assert_close(run_one("aten.select", [x], {"dim": 2, "index": -1}), t[:, :, -1].numpy(), 0, "select")
    assert_close(run_one("aten.unsqueeze", [x], {"dim": 1}), t.unsqueeze(1).numpy(), 0, "unsqueeze")
    assert_close(run_one("aten.squeeze", [y], {"dim": [1]}), T(y).squeeze(1).numpy(), 0, "squeeze")
    z = _rand(2, 2, 4, 5, seed=55)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.cat", ids, {"dim": 1}), [x, z])
    check_delegated(dl)
    assert_close(out, torch.cat([t, T(z)], 1).numpy(), 0, "cat")
    pad = [1, 2, -1, 0, 0, 3]
    assert_close(run_one("aten.constant_pad_nd", [x], {"pad": pad, "value": 0.5}),
                 F.pad(t, pad, value=0.5).numpy(), 0, "pad")
    assert_close(run_one("aten.clone", [x]), x, 0, "clone")


def test_embedding_and_out_of_range_index():
    w = _rand(11, 6, seed=56)
    idx = np.array([[0, 10, 3], [4, 4, 1]], np.int64)
    out = run_one("aten.embedding", [w, idx], constants=(0,))
    assert_close(out, F.embedding(T(idx), T(w)).numpy(), 0, "embedding")
    g = kiln.Graph()
    i = g.add_input("i", "int64", [2, 3])
    (y,) = g.add_node("aten.embedding", [_add_const(g, "w", w), i], {})
    g.set_outputs([y])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, rep = pb.compile(backends=["mlx"], fold_constants=False)
    check_delegated(rep["methods"][0]["delegation"])
    prog = kiln.load_bytes(data)
    with pytest.raises(kiln.KilnError, match="out of range"):
        prog.run(np.array([[0, 11, 3], [4, 4, 1]], np.int64))
    with pytest.raises(kiln.KilnError, match="out of range"):
        prog.run(np.array([[0, 1, 3], [-1, 4, 1]], np.int64))
    assert_close(prog.run(idx)[0], F.embedding(T(idx), T(w)).numpy(), 0, "embedding after error")


# ---------------------------------------------------------------- segments, whole models

def test_conv_bn_relu_pool_head_is_one_segment():
    x = _rand(2, 3, 13, 11, seed=57)
    w = _rand(8, 3, 3, 3, seed=58)
    mean, var = _rand(8, seed=59), np.abs(_rand(8, seed=60)) + 0.5
    fw, fb = _rand(5, 8, seed=61), _rand(5, seed=62)

    def build(g, ids):
        (c,) = g.add_node("aten.convolution", [ids[0], _add_const(g, "w", w), -1],
                          dict(stride=[2, 2], padding=[1, 1], dilation=[1, 1], transposed=False, output_padding=[0, 0],
                               groups=1))
        (b,) = g.add_node("aten.native_batch_norm", [c, -1, -1, _add_const(g, "m", mean), _add_const(g, "v", var)],
                          {"eps": 1e-5})
        (h,) = g.add_node("aten.hardswish", [b])
        (p,) = g.add_node("aten.max_pool2d", [h], dict(kernel_size=[3, 3], stride=[2, 2], ceil_mode=True))
        (m,) = g.add_node("aten.mean", [p], {"dim": [2, 3], "keepdim": False})
        return g.add_node("aten.linear", [m, _add_const(g, "fw", fw), _add_const(g, "fb", fb)])

    # fold_batch_norm=False: the batch norm is lowered by mlx, not folded into the convolution.
    (out,), dl, _ = compile_run(build, [x], fold_batch_norm=False)
    check_delegated(dl, nodes=6)
    t = A.convolution(T(x), T(w), None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    t = F.batch_norm(t, T(mean), T(var), None, None, False, 0.1, 1e-5)
    t = F.max_pool2d(F.hardswish(t), 3, 2, ceil_mode=True).mean([2, 3])
    assert_close(out, F.linear(t, T(fw), T(fb)).numpy(), REL, "head")


def _model(name):
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    m = getattr(tv.models, name)(weights=None).eval()
    # Non-trivial batch-norm statistics (random init has mean 0, var 1).
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "resnet18", "mobilenet_v3_large"])
def test_whole_model_is_one_mlx_segment_and_matches_eager(name):
    from kiln.capture import capture

    m = _model(name)
    x = torch.from_numpy(_rand(1, 3, 224, 224, seed=63))
    cap = capture(m, (x,), progress=lambda s: None)
    pb = kiln._kiln.ProgramBuilder()
    pb.add_method("forward", cap.graph)
    data, rep = pb.compile(backends=["mlx"], require_delegation="mlx")
    dl = rep["methods"][0]["delegation"]
    check_delegated(dl)
    (out,) = kiln.load_bytes(data).run(x.numpy())
    with torch.no_grad():
        ref = m(x).numpy()
    assert_close(out, ref, REL, name)


def test_unavailable_without_cpu_override_is_notfound_naming_mlx(tmp_path):
    x = _rand(1, 3, 4, 4, seed=64)
    g = kiln.Graph()
    i = g.add_input("x", "float32", list(x.shape))
    (y,) = g.add_node("aten.relu", [i])
    g.set_outputs([y])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile(backends=["mlx"])
    path = tmp_path / "relu_mlx.kiln"
    path.write_bytes(data)
    code = textwrap.dedent(f"""
        import kiln
        try:
            kiln.load({str(path)!r})
        except kiln.KilnError as e:
            print("ERROR", e)
        else:
            print("LOADED")
    """)
    env = {k: v for k, v in os.environ.items() if k != "KILN_MLX_DEVICE"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import mlx.core as mxc
    if mxc.is_available(mxc.gpu):
        assert "LOADED" in r.stdout, r.stdout
        return
    assert "ERROR" in r.stdout and "mlx" in r.stdout and "no GPU device" in r.stdout and "NotFound" in r.stdout, r.stdout
    env["KILN_MLX_DEVICE"] = "tpu"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "ERROR" in r.stdout and "KILN_MLX_DEVICE" in r.stdout, r.stdout
    # The load option does what the environment variable does, and takes precedence over it.
    env.pop("KILN_MLX_DEVICE")
    for settings, want in (({"mlx.device": "cpu"}, "OUT"), ({"mlx.device": "tpu"}, "setting mlx.device='tpu'"),
                           ({"mlx.devcie": "cpu"}, "unknown setting 'mlx.devcie'")):
        code2 = textwrap.dedent(f"""
            import numpy as np, kiln
            try:
                p = kiln.load({str(path)!r}, backend_settings={settings!r})
                print("OUT", float(np.abs(p.run(np.load({str(tmp_path / 'x.npy')!r}))[0]).max()))
            except kiln.KilnError as e:
                print("ERROR", e)
        """)
        np.save(tmp_path / "x.npy", x)
        r = subprocess.run([sys.executable, "-c", code2], env=env, capture_output=True, text=True, timeout=120)
        assert want in r.stdout, (settings, r.stdout, r.stderr)
        if want == "OUT":
            assert abs(float(r.stdout.split()[-1]) - float(np.maximum(x, 0).max())) < 1e-6
        else:
            assert "NotFound" in r.stdout


def test_corrupted_payload_gives_errors_not_crashes():
    # Bytes of a real payload are replaced by hostile values; loading and running must either work
    # or raise KilnError (init re-validates every node with Kiln's op definitions).
    x = _rand(1, 3, 8, 8, seed=65)
    w = _rand(4, 3, 3, 3, seed=66)
    fw = _rand(2, 4, seed=67)
    g = kiln.Graph()
    xi = g.add_input("x", "float32", list(x.shape))
    (c,) = g.add_node("aten.convolution", [xi, _add_const(g, "w", w), -1],
                      dict(stride=[2, 2], padding=[1, 1], dilation=[1, 1], transposed=False, output_padding=[0, 0],
                           groups=1))
    # relu, not a chain of elementwise ops: a fused chain makes MLX compile a new CPU kernel (a C++
    # compiler run) for many corrupted variants, which makes the test slow.
    (p,) = g.add_node("aten.relu", [c])
    (m,) = g.add_node("aten.mean", [p], {"dim": [2, 3], "keepdim": False})
    (y,) = g.add_node("aten.linear", [m, _add_const(g, "fw", fw), -1])
    g.set_outputs([y])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, rep = pb.compile(backends=["mlx"])
    assert mlx_segment(rep["methods"][0]["delegation"])["segments"] == 1
    start = data.find(b"KMLX")
    assert start > 0 and start % 4096 == 0
    good = kiln.load_bytes(data).run(x)[0]
    end = len(data) if data.find(b"\0" * 64, start) < 0 else data.find(b"\0" * 64, start)
    outcomes = {"error": 0, "ran": 0}
    for off in range(start, end, 3):
        for value in (b"\x00", b"\xff"):
            bad = bytearray(data)
            bad[off:off + 1] = value
            try:
                out = kiln.load_bytes(bytes(bad)).run(x)[0]
                assert out.shape == good.shape
                outcomes["ran"] += 1
            except kiln.KilnError:
                outcomes["error"] += 1
    assert outcomes["error"] > 0 and outcomes["ran"] > 0, outcomes


def test_non_contiguous_intermediates():
    # permute / transpose / slice / expand results (MLX views) feeding conv, add, norm, matmul and
    # a graph output.
    x = _rand(2, 7, 5, 3, seed=68)                      # NHWC-like input
    w = _rand(4, 3, 3, 3, seed=69)
    y = _rand(2, 5, 4, seed=70)

    def build(g, ids):
        (p,) = g.add_node("aten.permute", [ids[0]], {"dims": [0, 3, 1, 2]})            # [2, 3, 7, 5]
        (c,) = g.add_node("aten.convolution", [p, _add_const(g, "w", w), -1],
                          dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], transposed=False,
                               output_padding=[0, 0], groups=1))                          # [2, 4, 7, 5]
        (s,) = g.add_node("aten.slice", [c], {"dim": 2, "start": 1, "end": 7, "step": 2})  # [2, 4, 3, 5]
        (t,) = g.add_node("aten.transpose", [s], {"dim0": 1, "dim1": 3})                   # [2, 5, 3, 4]
        (yt,) = g.add_node("aten.unsqueeze", [ids[1]], {"dim": 2})                         # [2, 5, 1, 4]
        (a,) = g.add_node("aten.add", [t, yt])
        (n,) = g.add_node("aten.native_layer_norm", [a, -1, -1], {"normalized_shape": [4], "eps": 1e-5})
        m = n
        (e,) = g.add_node("aten.expand", [_add_const(g, "e", _rand(1, 1, 1, 4, seed=71))], {"size": [2, 5, 3, 4]})
        (o,) = g.add_node("aten.mul", [m, e])
        return [o, t]

    (o, t), dl, _ = compile_run(build, [x, y])
    check_delegated(dl)
    c = A.convolution(T(x).permute(0, 3, 1, 2), T(w), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    tt = c[:, :, 1:7:2].transpose(1, 3)
    n = F.layer_norm(tt + T(y).unsqueeze(2), [4], eps=1e-5)
    assert_close(t, tt.numpy(), REL, "view output")
    assert_close(o, (n * T(_rand(1, 1, 1, 4, seed=71))).numpy(), REL, "non-contiguous chain")


def test_declined_ops_name_their_reason():
    x = _rand(3, 4, seed=72) * 5
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten._to_copy", ids, {"dtype": "int32"}), [x])
    assert mlx_segment(dl)["segments"] == 0
    assert any("float32 -> int32" in r for r in reasons(dl, "aten._to_copy")), dl
    np.testing.assert_array_equal(out, T(x).to(torch.int32).numpy())
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.argmax", ids, {"dim": 1}), [x])
    assert mlx_segment(dl)["segments"] == 0 and reasons(dl, "aten.argmax"), dl
    g = kiln.Graph()
    i = g.add_input("x", "float32", [3, 4])
    (a,) = g.add_node("aten.relu", [i], {}, "act")
    (b,) = g.add_node("aten.argmax", [a], {"dim": 1}, "pick")
    g.set_outputs([b])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    with pytest.raises(kiln.KilnError) as e:
        pb.compile(require_delegation="mlx")
    assert "aten.argmax (pick)" in str(e.value) and "act" not in str(e.value).split("mlx")[-1], str(e.value)


# ---------------------------------------------------------------- diffusion / CLIP-like blocks
# Small stand-ins for the SD-1.5 UNet, a CLIP text encoder and a TAESD-like decoder
# (tests/python/tiny_models.py; bench/mlx_boundary.py uses them too).
from tiny_models import TAESDish, TextEnc, TinyUNet  # noqa: E402

BLOCKS = {
    "unet": (TinyUNet, lambda: (torch.randn(1, 4, 16, 16), torch.rand(1, 1))),
    "text_encoder": (TextEnc, lambda: (torch.randint(0, 100, (2, 16)),)),
    "taesd_decoder": (TAESDish, lambda: (torch.randn(1, 4, 9, 11),)),
}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_diffusion_and_clip_blocks_are_one_mlx_segment(name):
    from kiln.capture import capture

    torch.manual_seed(0)
    cls, make_args = BLOCKS[name]
    m = cls().eval()
    args = make_args()
    cap = capture(m, args, progress=lambda s: None)
    pb = kiln._kiln.ProgramBuilder()
    pb.add_method("forward", cap.graph)
    data, rep = pb.compile(backends=["mlx"], require_delegation="mlx")
    check_delegated(rep["methods"][0]["delegation"])
    (out,) = kiln.load_bytes(data).run(*[a.numpy() for a in args])
    with torch.no_grad():
        ref = m(*args).numpy()
    assert_close(out, ref, REL, name)


# ---------------------------------------------------------------- reduced precision (compute_dtype)

HALF_REL = 2e-2  # issue 5: fp16 <= 2e-2 relative to the output's max magnitude


def run_half(build, feeds, dtype):
    g = kiln.Graph()
    ids = [g.add_input(f"x{i}", kiln_dtype(x), list(x.shape)) for i, x in enumerate(feeds)]
    g.set_outputs(list(build(g, ids)))
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, rep = pb.compile(backends=["mlx"], require_delegation="mlx", fold_constants=False, compute_dtype=dtype)
    return kiln.load_bytes(data).run(*feeds)


HALF_OPS = [
    ("conv", lambda g, i, c: g.add_node("aten.convolution", [i[0], c("w", _rand(6, 3, 3, 3, seed=80)), -1],
                                        dict(stride=[2, 2], padding=[1, 1], dilation=[1, 1], transposed=False,
                                             output_padding=[0, 0], groups=1)),
     lambda x: A.convolution(x, T(_rand(6, 3, 3, 3, seed=80)), None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)),
    ("group_norm", lambda g, i, c: g.add_node("aten.native_group_norm", [i[0], -1, -1],
                                              {"N": 2, "C": 3, "HxW": 99, "group": 3, "eps": 1e-5}),
     lambda x: F.group_norm(x, 3, eps=1e-5)),
    ("softmax", lambda g, i, c: g.add_node("aten._softmax", [i[0]], {"dim": -1}), lambda x: torch.softmax(x * 3, -1)),
    ("gelu", lambda g, i, c: g.add_node("aten.gelu", [i[0]], {}), F.gelu),
    ("bilinear", lambda g, i, c: g.add_node("aten.upsample_bilinear2d", [i[0]],
                                            {"output_size": [15, 17], "align_corners": False}),
     lambda x: F.interpolate(x, size=[15, 17], mode="bilinear", align_corners=False)),
    ("mean", lambda g, i, c: g.add_node("aten.mean", [i[0]], {"dim": [2, 3], "keepdim": True}),
     lambda x: x.mean([2, 3], keepdim=True)),
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,build,ref", HALF_OPS, ids=[h[0] for h in HALF_OPS])
def test_reduced_precision_ops(dtype, name, build, ref):
    x = _rand(2, 3, 9, 11, seed=81)
    if name == "softmax":
        def b(g, ids):
            (s,) = g.add_node("aten.mul", [ids[0], _add_const(g, "k", np.array(3.0, np.float32))], {})
            return g.add_node("aten._softmax", [s], {"dim": -1})
    else:
        def b(g, ids):
            return build(g, ids, lambda n, a: _add_const(g, n, a))
    (out,) = run_half(b, [x], dtype)
    assert out.dtype == np.float32
    rel = HALF_REL
    assert_close(out, ref(T(x)).numpy(), rel, f"{name} {dtype}")


def test_float16_mean_and_sum_of_4096_twenties_are_exact():
    x = np.full((2, 4096), 20.0, np.float32)
    (m, s), = [run_half(lambda g, ids: [g.add_node("aten.mean", ids, {"dim": [1]})[0],
                                        g.add_node("aten.sum", ids, {"dim": [1]})[0]], [x], "float16")]
    assert (m == 20.0).all(), m
    assert (s == 81920.0).all(), s  # beyond float16's range: the reduction and its output stay float32


def test_float16_layer_norm_near_1e_3_matches_eager():
    x = (np.sign(_rand(4, 64, seed=82)) * 1e-3 + _rand(4, 64, seed=83) * 1e-5).astype(np.float32)
    (out,) = run_half(lambda g, ids: g.add_node("aten.native_layer_norm", [ids[0], -1, -1],
                                                {"normalized_shape": [64], "eps": 1e-12}), [x], "float16")
    assert_close(out, F.layer_norm(T(x), [64], eps=1e-12).numpy(), HALF_REL, "ln fp16")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reduced_precision_whole_model(dtype):
    from kiln.capture import capture

    m = _model("mobilenet_v3_small")
    x = torch.from_numpy(_rand(1, 3, 224, 224, seed=63))
    cap = capture(m, (x,), progress=lambda s: None)
    pb = kiln._kiln.ProgramBuilder()
    pb.add_method("forward", cap.graph)
    data, rep = pb.compile(backends=["mlx"], require_delegation="mlx", compute_dtype=dtype)
    check_delegated(rep["methods"][0]["delegation"])
    (out,) = kiln.load_bytes(data).run(x.numpy())
    with torch.no_grad():
        ref = m(x).numpy()
    assert_close(out, ref, HALF_REL, f"mv3 {dtype}")
    # The top 5 in order, up to ties at the output's precision: a float16 / bfloat16 output keeps
    # 11 / 8 significant bits, so logits closer than its spacing (2^-10 / 2^-7 relative) may round to
    # one number and swap (bf16: ref 0.010260 and 0.010204 both give 0.010254).
    spacing = (2.0 ** -10 if dtype == "float16" else 2.0 ** -7) * float(np.abs(ref).max())
    top, want = np.argsort(-out[0], kind="stable")[:5], np.sort(ref[0])[::-1][:5]
    assert np.all(np.abs(ref[0][top] - want) <= spacing), (top, ref[0][top], want)


def test_compute_dtype_must_be_a_float_type():
    g = kiln.Graph()
    i = g.add_input("x", "float32", [2])
    g.set_outputs([g.add_node("aten.relu", [i])[0]])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    for bad in ("int32", "float64"):
        with pytest.raises(kiln.KilnError, match="compute_dtype"):
            pb.compile(backends=["mlx"], compute_dtype=bad)


def test_two_segments_around_a_cpu_node_and_int64_boundaries():
    # relu -> argmax (declined: CPU) -> _to_copy float -> mul: two mlx segments; the second takes
    # an int64 boundary input.
    x = _rand(4, 9, seed=90)

    def build(g, ids):
        (r,) = g.add_node("aten.relu", ids, {})
        (a,) = g.add_node("aten.argmax", [r], {"dim": 1, "keepdim": True})
        (f,) = g.add_node("aten._to_copy", [a], {"dtype": "float32"})
        (m,) = g.add_node("aten.mul", [f, r], {})
        return [m]

    (out,), dl, _ = compile_run(build, [x])
    assert mlx_segment(dl)["segments"] == 2 and [c["op"] for c in dl["cpu_ops"]] == ["aten.argmax"], dl
    r = torch.relu(T(x))
    assert_close(out, (r.argmax(1, keepdim=True).float() * r).numpy(), REL, "two segments")


def test_two_methods_share_a_weight():
    w = _rand(6, 8, seed=91)
    pb = kiln.ProgramBuilder()
    for name, act in (("a", "aten.relu"), ("b", "aten.sigmoid")):
        g = kiln.Graph()
        i = g.add_input("x", "float32", [3, 8])
        (y,) = g.add_node("aten.linear", [i, _add_const(g, "w", w), -1], {})
        g.set_outputs([g.add_node(act, [y])[0]])
        pb.add_method(name, g)
    data, rep = pb.compile(backends=["mlx"], require_delegation="mlx")
    assert rep["constant_bytes"] == w.nbytes  # stored once
    prog = kiln.load_bytes(data)
    x = _rand(3, 8, seed=92)
    assert_close(prog.run(x, method="a")[0], torch.relu(F.linear(T(x), T(w))).numpy(), REL, "a")
    assert_close(prog.run(x, method="b")[0], torch.sigmoid(F.linear(T(x), T(w))).numpy(), REL, "b")


def test_kiln_export_with_mlx_backend(tmp_path):
    m = _model("resnet18")
    x = torch.from_numpy(_rand(1, 3, 64, 64, seed=93))
    res = kiln.export(m, (x,), out=tmp_path / "r18_mlx.kiln", backends=("mlx",), require_delegation="mlx",
                      verbose=False)
    (out,) = kiln.load(str(tmp_path / "r18_mlx.kiln")).run(x.numpy())
    with torch.no_grad():
        assert_close(out, m(x).numpy(), REL, "export mlx")
    assert res.report["methods"][0]["delegation"]["backends"][0]["segments"] == 1


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("rank", [4, 3])
def test_sdpa_fully_masked_row_is_zero_like_eager(kind, rank):
    # PyTorch gives 0 for a query row whose mask excludes every key (not NaN, not mean(V)).
    shape = (1, 2, 3, 4) if rank == 4 else (2, 3, 4)
    q, k, v = _rand(*shape, seed=51), _rand(*shape, seed=52), _rand(*shape, seed=53)
    keep = np.array([[True, True, False], [False, False, False], [True, False, True]])
    m = keep if kind == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float32)
    out = run_one("aten.scaled_dot_product_attention", [q, k, v, m], {})
    ref = F.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=T(m)).numpy()
    assert np.isfinite(out).all()
    assert_close(out, ref, REL, "sdpa fully masked row")


# ---------------------------------------------------------------- spatial family (pads, distances)

@pytest.mark.parametrize("op,x,pads", [
    ("aten.reflection_pad1d", _rand(2, 3, 6, seed=1), [2, -1]),
    ("aten.reflection_pad2d", _rand(1, 2, 4, 5, seed=2), [1, 3, -1, 2]),
    ("aten.reflection_pad3d", _rand(1, 1, 3, 4, 5, seed=3), [1, 1, 2, 0, -1, 2]),
    ("aten.replication_pad1d", _rand(3, 4, seed=4), [3, -2]),
    ("aten.replication_pad2d", _rand(2, 2, 3, 3, seed=5), [4, 1, 0, -1]),
    ("aten.replication_pad3d", _rand(2, 2, 2, 3, 2, seed=6), [1, 2, 2, 1, 1, 0]),
])
def test_pads_match_torch(op, x, pads):
    out = run_one(op, [x], {"padding": pads})
    ref = getattr(A, op.split(".")[1])(torch.from_numpy(x), pads).numpy()
    np.testing.assert_array_equal(out, ref)  # data movement: exact


def test_pad_int_dtype_and_declined_reason():
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    out = run_one("aten.reflection_pad1d", [x], {"padding": [3, 1]})
    np.testing.assert_array_equal(out, A.reflection_pad1d(torch.from_numpy(x), [3, 1]).numpy())

    def build(g, ids):
        return g.add_node("aten.grid_sampler_2d", ids, {"interpolation_mode": 2, "padding_mode": 0, "align_corners": False})
    _, dl, _ = compile_run(build, [_rand(1, 1, 3, 3), _rand(1, 2, 2, 2)])
    assert any("bilinear only" in r for r in reasons(dl, "aten.grid_sampler_2d"))


@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sampler_bilinear_matches_torch(padding, align):
    x, g = _rand(2, 3, 5, 4, seed=9), _rand(2, 3, 6, 2, seed=10)
    g[0, 0, :3, 0] = [3.0, -2.5, 1.0]  # outside [-1, 1] and on the edge
    attrs = {"interpolation_mode": 0, "padding_mode": padding, "align_corners": align}
    out = run_one("aten.grid_sampler_2d", [x, g], attrs)
    assert_close(out, A.grid_sampler_2d(torch.from_numpy(x), torch.from_numpy(g), 0, padding, align).numpy(), rel=REL)
    # non-finite coordinates: the float64 rule of test_ops_spatial (NaN clips to 0; zeros padding -> NaN)
    from test_ops_spatial import _bilinear_ref
    g[1, 1, 0] = [np.nan, 0.2]
    g[1, 1, 1] = [np.inf, -0.3]
    out = run_one("aten.grid_sampler_2d", [x, g], attrs)
    for w in (0, 1):
        want = [_bilinear_ref(x[1, c].astype(np.float64), float(g[1, 1, w, 0]), float(g[1, 1, w, 1]), padding, align)
                for c in range(3)]
        assert_close(out[1, :, 1, w], np.array(want, np.float32), rel=REL, what=f"non-finite {w}")


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, float("inf"), 3.0])
def test_cdist_pdist_match_torch(p):
    a, b = _rand(2, 5, 3, seed=7), _rand(1, 4, 3, seed=8)
    if p == 0.0:
        b[..., 0] = a[0, 0, 0]
        a[..., 0] = a[0, 0, 0]
    out = run_one("aten._cdist_forward", [a, b], {"p": p})
    assert_close(out, A._cdist_forward(torch.from_numpy(a), torch.from_numpy(b), p, 2).numpy(), rel=REL)
    out = run_one("aten._pdist_forward", [a[0]], {"p": p})
    assert_close(out, A._pdist_forward(torch.from_numpy(a[0]), p).numpy(), rel=REL)

"""Optimized cpu kernels (src/kernels/cpu/{attention,norm,softmax,activation,elementwise}.cpp) vs
PyTorch eager, next to the portable kernels on the same program.

Every case compiles one op, loads the program twice (portable_kernels_only=True and False, at 1
and 2 threads) and compares each run with torch eager (max abs err <= rel * max|expected|,
oprunner.assert_close). The C++ suite (tests/cpp/cpu_misc_kernels_test.cpp) checks that the cpu
kernels are the ones selected; here both kernel sets are held to eager.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from oprunner import assert_close, kiln_dtype
from reference import unary_float64

A = torch.ops.aten
CONFIGS = [(True, 1), (False, 1), (False, 2)]  # (portable_kernels_only, num_threads)


def T(x):
    return None if x is None else torch.from_numpy(x)


def rand(rng, *shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def compile_op(op, inputs, attrs):
    g = kiln.Graph()
    ids, feeds = [], []
    for i, x in enumerate(inputs):
        if x is None:
            ids.append(-1)
            continue
        ids.append(g.add_input(f"x{i}", kiln_dtype(x), list(x.shape)))
        feeds.append(np.asarray(x, order="C"))
    outs = g.add_node(op, ids, attrs)
    g.set_outputs(list(outs))
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile(fold_constants=False)
    return data, feeds


def check_all(op, inputs, attrs, expected, rel=1e-5, what=""):
    """Runs `op` under every CONFIGS entry and compares each output with `expected` (eager)."""
    data, feeds = compile_op(op, inputs, attrs)
    for portable, threads in CONFIGS:
        prog = kiln.load_bytes(data, num_threads=threads, portable_kernels_only=portable)
        (out,) = prog.run(*feeds)
        assert_close(out, expected, rel=rel, what=f"{what} portable={portable} threads={threads}")


# ------------------------------------------------------------------------------------ attention

def sdpa_ref(q, k, v, mask=None, is_causal=False, scale=None, gqa=False):
    kw = {"enable_gqa": True} if gqa else {}
    return F.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=T(mask), is_causal=is_causal, scale=scale,
                                          **kw).numpy()


def check_sdpa(q, k, v, mask=None, is_causal=False, scale=None, gqa=False, what=""):
    attrs = {"is_causal": is_causal, "enable_gqa": gqa}
    if scale is not None:
        attrs["scale"] = scale
    check_all("aten.scaled_dot_product_attention", [q, k, v, mask], attrs,
              sdpa_ref(q, k, v, mask, is_causal, scale, gqa), what=what)


SDPA_SHAPES = [
    # (q, k, v)
    ((1, 12, 77, 64), (1, 12, 77, 64), (1, 12, 77, 64)),     # CLIP text
    ((2, 3, 50, 13), (2, 3, 170, 13), (2, 3, 170, 7)),       # L != S, odd head dims
    ((1, 2, 1024, 64), (1, 2, 1024, 64), (1, 2, 1024, 64)),  # long: several key/query blocks
    ((1, 1, 300, 40), (1, 1, 1024, 40), (1, 1, 1024, 40)),
    ((4, 33, 24), (4, 65, 24), (4, 65, 24)),                 # rank 3
]


def test_sdpa_large_scores_and_nan_rows():
    """Scaled scores near 1e10 (the row maximum must give exactly e^0, however the scaling is
    rounded) and NaN in a query row or in one feature of every key (the row's output is NaN, as in
    eager, not the fully-masked 0), against eager, at 1 and 2 threads, over 1 and 3 key blocks."""
    rng = np.random.default_rng(7)
    for L, S in ((16, 16), (40, 300)):
        q, k, v = rand(rng, 1, 2, L, 40), rand(rng, 1, 2, S, 40), rand(rng, 1, 2, S, 40)
        check_sdpa(q * 3e4, k * 3e4, v, what=f"scores ~1e10, S={S}")
        check_sdpa(q, k, v, scale=1e30, what=f"scale 1e30, S={S}")
        qn = q.copy()
        qn[0, 1, 2, 5] = np.nan
        check_sdpa(qn, k, v, what=f"NaN in a query row, S={S}")
        kn = k.copy()
        kn[..., 3] = np.nan
        check_sdpa(q, kn, v, what=f"NaN in every key, S={S}")


@pytest.mark.parametrize("shapes", SDPA_SHAPES, ids=lambda s: "x".join(map(str, s[0])) + "_S" + str(s[1][-2]))
@pytest.mark.parametrize("variant", ["plain", "causal", "bool_mask", "float_mask", "scale", "negative_scale"])
def test_sdpa(shapes, variant):
    rng = np.random.default_rng(sum(shapes[0]) + len(variant))
    q, k, v = (rand(rng, *s) for s in shapes)
    L, S = shapes[0][-2], shapes[1][-2]
    mask = None
    if variant == "bool_mask":
        mask = rng.uniform(size=(L, S)) < 0.8
    elif variant == "float_mask":
        mask = rand(rng, *shapes[0][:-2], L, S, lo=-4, hi=1)
    scale = {"scale": 0.3, "negative_scale": -0.3}.get(variant)  # scale > 0 is applied inside the softmax update
    check_sdpa(q, k, v, mask, is_causal=variant == "causal", scale=scale, what=f"sdpa {variant} {shapes}")


@pytest.mark.parametrize("mask_shape", [(2, 3, 40, 90), (2, 1, 40, 90), (1, 3, 1, 90), (40, 1), (1, 90), (1, 1)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_mask_broadcasting(mask_shape, kind):
    rng = np.random.default_rng(len(mask_shape))
    q, k, v = rand(rng, 2, 3, 40, 16), rand(rng, 2, 3, 90, 16), rand(rng, 2, 3, 90, 16)
    mask = rng.uniform(size=mask_shape) < 0.7 if kind == "bool" else rand(rng, *mask_shape, lo=-3, hi=1)
    if kind == "bool" and mask_shape == (1, 1):
        mask[...] = True
    check_sdpa(q, k, v, mask, what=f"mask {kind} {mask_shape}")


def test_sdpa_fully_masked_rows_are_zero_like_eager():
    rng = np.random.default_rng(3)
    L, S = 130, 200
    q, k, v = rand(rng, 1, 2, L, 32), rand(rng, 1, 2, S, 32), rand(rng, 1, 2, S, 32)
    mask = rng.uniform(size=(L, S)) < 0.5
    mask[[0, 7, 64, 129]] = False
    fmask = rand(rng, L, S)
    fmask[[3, 100]] = -np.inf
    for m in (mask, fmask):
        ref = sdpa_ref(q, k, v, m)
        assert np.all(ref[:, :, 0 if m is mask else 3] == 0)  # what eager gives: zeros, not NaN
        check_sdpa(q, k, v, m, what="fully masked rows")


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_sdpa_gqa(kv_heads):
    rng = np.random.default_rng(kv_heads)
    q = rand(rng, 2, 8, 70, 24)
    k, v = rand(rng, 2, kv_heads, 90, 24), rand(rng, 2, kv_heads, 90, 24)
    check_sdpa(q, k, v, gqa=True, what=f"gqa {kv_heads}")
    check_sdpa(q, k, v, gqa=True, is_causal=True, what=f"gqa causal {kv_heads}")


def test_sdpa_large_scores_stay_finite():
    """Scores up to ~1e3: the online softmax must not overflow. Float32 scores carry ~1e-4 absolute
    rounding there (eager float32 itself is off by ~4e-5 relative), so the reference is eager in
    float64 on the same inputs, with rel=2e-4."""
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 1, 2, 90, 16, lo=-15, hi=15), rand(rng, 1, 2, 300, 16, lo=-15, hi=15), rand(rng, 1, 2, 300, 16)
    ref = F.scaled_dot_product_attention(T(q).double(), T(k).double(), T(v).double()).numpy().astype(np.float32)
    check_all("aten.scaled_dot_product_attention", [q, k, v, None], {}, ref, rel=2e-4, what="large scores")


# ------------------------------------------------------------------------------------ norms

@pytest.mark.parametrize("shape,normalized", [((2, 77, 768), [768]), ((3, 5, 7), [5, 7]), ((4, 1001), [1001])])
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm(shape, normalized, affine):
    rng = np.random.default_rng(len(shape) + affine)
    x = rand(rng, *shape, lo=-1, hi=3)
    w = rand(rng, *normalized) if affine else None
    b = rand(rng, *normalized) if affine else None
    ref = A.native_layer_norm(T(x), normalized, T(w), T(b), 1e-5)[0].numpy()
    check_all("aten.native_layer_norm", [x, w, b], {"normalized_shape": normalized, "eps": 1e-5}, ref,
              what=f"layer_norm {shape}")


@pytest.mark.parametrize("shape,groups", [((2, 320, 16, 16), 32), ((1, 6, 5, 7), 3), ((3, 8, 9), 8), ((2, 4, 3, 3, 3), 1)])
@pytest.mark.parametrize("affine", [False, True])
def test_group_norm(shape, groups, affine):
    rng = np.random.default_rng(groups + affine)
    c = shape[1]
    x = rand(rng, *shape, lo=-1, hi=3)
    w = rand(rng, c) if affine else None
    b = rand(rng, c) if affine else None
    hxw = int(np.prod(shape[2:]))
    ref = A.native_group_norm(T(x), T(w), T(b), shape[0], c, hxw, groups, 1e-6)[0].numpy()
    check_all("aten.native_group_norm", [x, w, b], {"N": shape[0], "C": c, "HxW": hxw, "group": groups, "eps": 1e-6},
              ref, what=f"group_norm {shape}")


@pytest.mark.parametrize("shape", [(2, 16, 13, 11), (3, 7), (1, 5, 2, 3, 4)])
def test_batch_norm(shape):
    rng = np.random.default_rng(len(shape))
    c = shape[1]
    x, w, b, mean = rand(rng, *shape, lo=-3, hi=5), rand(rng, c), rand(rng, c), rand(rng, c)
    var = rng.uniform(0.05, 3, size=c).astype(np.float32)
    ref = A.native_batch_norm(T(x), T(w), T(b), T(mean), T(var), False, 0.1, 1e-3)[0].numpy()
    check_all("aten.native_batch_norm", [x, w, b, mean, var], {"training": False, "momentum": 0.1, "eps": 1e-3}, ref,
              what=f"batch_norm {shape}")


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("eps", [None, 1e-6])
def test_rms_norm(weighted, eps):
    rng = np.random.default_rng(int(weighted))
    x = rand(rng, 2, 77, 768)
    w = rand(rng, 768) if weighted else None
    ref = A.rms_norm(T(x), [768], T(w), eps).numpy()
    attrs = {"normalized_shape": [768]}
    if eps is not None:
        attrs["eps"] = eps
    check_all("aten.rms_norm", [x, w], attrs, ref, what="rms_norm")


def test_norms_of_values_whose_squares_overflow_float():
    # Spread 1e30: the squared deviations (and rms_norm's squares) overflow float32 although every
    # statistic is representable; the outputs must still be the normalized values (found by the
    # numerics harness, tests/python/numerics_harness.py: the cpu kernels returned the bias).
    from numerics_harness import group_norm_ref, layer_norm_ref, rms_norm_ref

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 1023)) * 1e30).astype(np.float32)
    w, b = rand(rng, 1023), rand(rng, 1023)
    x64 = x.astype(np.float64)
    check_all("aten.native_layer_norm", [x, w, b], {"normalized_shape": [1023], "eps": 1e-5},
              layer_norm_ref(x64, w, b, [1023], 1e-5).astype(np.float32), what="layer_norm of 1e30 N(0, 1)")
    check_all("aten.rms_norm", [x, w], {"normalized_shape": [1023]},
              rms_norm_ref(x64, w, [1023], None).astype(np.float32), what="rms_norm of 1e30 N(0, 1)")
    xg = x.reshape(1, 3, 31, 33)
    check_all("aten.native_group_norm", [xg, None, None], {"N": 1, "C": 3, "HxW": 1023, "group": 3, "eps": 1e-6},
              group_norm_ref(xg.astype(np.float64), None, None, 3, 1e-6).astype(np.float32), what="group_norm 1e30")


# ------------------------------------------------------------------------------------ softmax

@pytest.mark.parametrize("shape", [(4, 1000), (2, 12, 77, 77), (3, 5, 33), (1, 2049)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_every_dim(shape, log):
    rng = np.random.default_rng(len(shape) + log)
    x = rand(rng, *shape, lo=-8, hi=8)
    op = "aten._log_softmax" if log else "aten._softmax"
    for dim in range(-len(shape), len(shape)):
        ref = (A._log_softmax if log else A._softmax)(T(x), dim, False).numpy()
        check_all(op, [x], {"dim": dim, "half_to_float": False}, ref, what=f"{op} {shape} dim={dim}")


# ------------------------------------------------------------------------------------ activations

UNARY = [
    ("aten.relu", {}, lambda t: torch.relu(t)),
    ("aten.gelu", {}, lambda t: F.gelu(t)),
    ("aten.gelu", {"approximate": "tanh"}, lambda t: F.gelu(t, approximate="tanh")),
    ("aten.silu", {}, F.silu),
    ("aten.sigmoid", {}, torch.sigmoid),
    ("aten.tanh", {}, torch.tanh),
    ("aten.exp", {}, torch.exp),
    ("aten.hardswish", {}, F.hardswish),
    ("aten.hardsigmoid", {}, F.hardsigmoid),
    ("aten.hardtanh", {"min_val": -0.5, "max_val": 2.0}, lambda t: F.hardtanh(t, -0.5, 2.0)),
    ("aten.clamp", {"min": -1.0, "max": 0.5}, lambda t: torch.clamp(t, -1.0, 0.5)),
    ("aten.leaky_relu", {"negative_slope": 0.1}, lambda t: F.leaky_relu(t, 0.1)),
    ("aten.neg", {}, torch.neg),
    ("aten.abs", {}, torch.abs),
    ("aten.sqrt", {}, lambda t: torch.sqrt(t.abs())),
]


@pytest.mark.parametrize("op,attrs,fn", UNARY, ids=[f"{u[0]}{'_' + str(u[1]) if u[1] else ''}" for u in UNARY])
@pytest.mark.parametrize("shape", [(7,), (3, 17, 19), (2, 64, 56, 57)])
def test_unary(op, attrs, fn, shape):
    rng = np.random.default_rng(len(op) + len(shape))
    x = rand(rng, *shape, lo=-7, hi=7)
    if op == "aten.sqrt":
        x = np.abs(x)
    check_all(op, [x], attrs, fn(T(x)).numpy(), rel=1e-6 if op not in ("aten.gelu",) else 2e-6, what=f"{op} {shape}")


def test_unary_special_values():
    # Against the op's definition in float64 (tests/python/reference.py), not eager's float32 result,
    # which changes with the CPU at these inputs (eager's gelu(+inf) is NaN on AVX-512 machines).
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 3.0, -3.0, 88.0, -88.0, 20.0, -20.0], np.float32)
    for op, attrs, fn in UNARY:
        if op == "aten.sqrt":
            continue
        check_all(op, [x], attrs, unary_float64(op, x, attrs), rel=1e-6, what=f"{op} specials")


def test_hardswish_of_values_above_flt_max_over_6_is_x():
    # hardswish(x) = x for x >= 3; x * relu6(x + 3) overflowed to inf before the division for
    # x > FLT_MAX / 6 (found by the numerics harness). Reference: the definition in float64.
    x = np.array([3.0, 5.7e37, 1e38, 3.4e38, -1e38, 2.5, -2.5, 0.5], np.float32)  # finite: assert_close checks them all
    check_all("aten.hardswish", [x], {}, unary_float64("aten.hardswish", x), rel=1e-7, what="hardswish large")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_of_inf_is_inf(approximate):
    """gelu(+inf) = +inf (the limit of x * Phi(x)) and gelu(-inf) is NaN (the definition's -inf * 0,
    as eager computes it), on every kernel set and CPU: a NaN at +inf fails here."""
    x = np.array([np.inf, -np.inf, 1e30], np.float32)
    data, feeds = compile_op("aten.gelu", [x], {"approximate": approximate})
    for portable, threads in CONFIGS:
        (out,) = kiln.load_bytes(data, num_threads=threads, portable_kernels_only=portable).run(*feeds)
        assert out[0] == np.inf, f"gelu(+inf) = {out[0]} (portable={portable})"
        assert np.isnan(out[1]), f"gelu(-inf) = {out[1]} (portable={portable})"
        assert out[2] == np.float32(1e30), f"gelu(1e30) = {out[2]} (portable={portable})"


BINARY_SHAPES = [((2, 24, 28, 28), (2, 24, 28, 28)), ((1, 96, 14, 14), (1, 96, 1, 1)), ((3, 16, 9, 9), (16, 1, 1)),
                 ((5, 77, 768), ()), ((), (40, 41)), ((6, 1, 70), (6, 5, 70))]


@pytest.mark.parametrize("sa,sb", BINARY_SHAPES)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary(sa, sb, op):
    rng = np.random.default_rng(len(sa) * 3 + len(sb))
    a = np.asarray(rand(rng, *sa))
    b = np.asarray(rng.uniform(0.5, 2.0, size=sb).astype(np.float32))
    attrs = {"alpha": 2.5} if op in ("add", "sub") else {}
    fn = {"add": lambda x, y: torch.add(x, y, alpha=2.5), "sub": lambda x, y: torch.sub(x, y, alpha=2.5),
          "mul": torch.mul, "div": torch.div}[op]
    check_all(f"aten.{op}", [a, b], attrs, fn(T(a), T(b)).numpy(), rel=1e-6, what=f"{op} {sa} {sb}")


@pytest.mark.parametrize("approximate,rel", [("none", 1e-6), ("tanh", 2e-5)])
def test_gelu_negative_tail_matches_float64_eager(approximate, rel):
    """Each element of the cpu kernel's gelu on x in [-9, 0) within `rel` of float64 eager (float32
    eager and the portable kernel cancel in 1 + erf / 1 + tanh there, ~1e-4 relative). The erf
    form rounds x / sqrt(2) to float32 first, as float32 eager does, so the reference does too;
    tanh's bound covers float32 rounding of u = sqrt(2/pi) (x + 0.044715 x^3)."""
    x = -np.linspace(9.0, 1e-3, 20001).astype(np.float32)
    data, feeds = compile_op("aten.gelu", [x], {"approximate": approximate})
    (out,) = kiln.load_bytes(data, num_threads=1).run(*feeds)
    xd = torch.from_numpy(x).double()
    if approximate == "none":
        z = (torch.from_numpy(x) * np.float32(0.7071067811865476)).double()
        ref = 0.5 * xd * torch.special.erfc(-z)
    else:
        u = 0.7978845608028654 * (xd + 0.044715 * xd ** 3)
        ref = xd / (1 + torch.exp(-2 * u))
    ref = ref.numpy()
    keep = np.abs(ref) > 1e-30
    err = np.abs(out[keep] - ref[keep]) / np.abs(ref[keep])
    assert err.max() <= rel, f"max relative error {err.max():.3e} at x={x[keep][err.argmax()]}"

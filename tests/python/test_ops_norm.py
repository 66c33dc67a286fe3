"""Norm and attention ops (src/ir/ops/norm.cpp, src/kernels/portable/norm.cpp) against PyTorch eager.

Every reference is torch.ops.aten.* / torch.nn.functional on the same inputs; tolerance
max abs err <= 1e-5 * max|expected| (oprunner.assert_close).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from oprunner import assert_close, kiln_dtype, run_op

A = torch.ops.aten


def T(x):
    return None if x is None else torch.from_numpy(x)


def rand(rng, *shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def expect_rejected(op, inputs, attrs, code, *words):
    """Adding the node to a Graph must raise KilnError with `code` and a message naming `words`."""
    g = kiln.Graph()
    ids = [-1 if x is None else g.add_input(f"x{i}", kiln_dtype(x), list(x.shape)) for i, x in enumerate(inputs)]
    with pytest.raises(kiln.KilnError) as ei:
        g.add_node(op, ids, attrs)
    message, got_code = ei.value.args
    assert got_code == code, message
    for w in words:
        assert w in message, f"{w!r} not in {message!r}"


# ---------------------------------------------------------------- batch norm (inference)

BN_SHAPES = [(2, 3, 23, 23), (1, 1, 1, 1), (2, 4, 7, 5), (3, 5), (2, 3, 4, 5, 6), (4, 2, 9)]


@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_batch_norm_matches_torch(shape, affine, eps):
    rng = np.random.default_rng(sum(shape) + int(affine))
    c = shape[1]
    x = rand(rng, *shape, lo=-3, hi=5)
    mean = rand(rng, c)
    var = rng.uniform(0.05, 3.0, size=c).astype(np.float32)
    w = rand(rng, c) if affine else None
    b = rand(rng, c) if affine else None
    (out,) = run_op("aten.native_batch_norm", [x, w, b, mean, var], {"training": False, "momentum": 0.1, "eps": eps})
    ref = A.native_batch_norm(T(x), T(w), T(b), T(mean), T(var), False, 0.1, eps)[0].numpy()
    assert_close(out, ref, what=f"batch_norm {shape} affine={affine}")


def test_batch_norm_weight_only_and_defaults():
    rng = np.random.default_rng(1)
    x, mean = rand(rng, 2, 3, 7, 5), rand(rng, 3)
    var, w = rng.uniform(0.1, 2, 3).astype(np.float32), rand(rng, 3)
    (out,) = run_op("aten.native_batch_norm", [x, w, None, mean, var], {})  # defaults: training False, eps 1e-5
    ref = A.native_batch_norm(T(x), T(w), None, T(mean), T(var), False, 0.1, 1e-5)[0].numpy()
    assert_close(out, ref)


def test_batch_norm_rejections():
    x, c3 = np.zeros((2, 3, 4, 4), np.float32), np.ones(3, np.float32)
    op = "aten.native_batch_norm"
    expect_rejected(op, [x, c3, c3, c3, c3], {"training": True}, "NotSupported", "training")
    expect_rejected(op, [x, c3, c3, None, c3], {}, "InvalidArgument", "running_mean")
    expect_rejected(op, [x, c3, c3, c3, None], {}, "InvalidArgument", "running_var")
    expect_rejected(op, [x, np.ones(4, np.float32), c3, c3, c3], {}, "InvalidArgument", "weight", "[3]")
    expect_rejected(op, [x, c3, c3, c3, np.ones((3, 1), np.float32)], {}, "InvalidArgument", "running_var")
    expect_rejected(op, [np.zeros(3, np.float32), None, None, c3, c3], {}, "InvalidArgument", "rank")
    expect_rejected(op, [x.astype(np.int64), None, None, c3, c3], {}, "NotSupported", "int64")
    expect_rejected(op, [x, None, None, c3, c3], {"eps": "small"}, "InvalidArgument", "eps")
    expect_rejected(op, [x, None, None, c3, c3], {"epsilon": 1e-5}, "InvalidArgument", "epsilon")


# ---------------------------------------------------------------- layer norm

LN_CASES = [
    ((2, 23, 23), [23]), ((2, 23, 23), [23, 23]), ((1, 1, 1), [1]), ((3, 7, 5), [5]), ((3, 7, 5), [7, 5]),
    ((4, 6), [6]), ((2, 3, 4, 5), [3, 4, 5]), ((9,), [9]),
]


@pytest.mark.parametrize("shape,normalized", LN_CASES)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm_matches_torch(shape, normalized, affine):
    rng = np.random.default_rng(len(shape) * 31 + sum(normalized))
    x = rand(rng, *shape, lo=-4, hi=6)
    w = rand(rng, *normalized) if affine != "none" else None
    b = rand(rng, *normalized) if affine == "both" else None
    for eps in (1e-5, 1e-6):
        (out,) = run_op("aten.native_layer_norm", [x, w, b], {"normalized_shape": normalized, "eps": eps})
        ref = A.native_layer_norm(T(x), normalized, T(w), T(b), eps)[0].numpy()
        assert_close(out, ref, what=f"layer_norm {shape} {normalized} {affine} eps={eps}")


@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_layer_norm_values_near_1e_3(eps):
    """Tiny values: the variance (~1e-7 .. 1e-12) is comparable to eps, so eps placement matters.

    With eps=1e-12 the last input (1e-3 plus 1e-6 noise) is ill-conditioned: PyTorch's float32
    statistics are off by ~1e-4 relative there, so the reference is PyTorch eager in float64 on
    the same float32 inputs (Kiln keeps its statistics in double).
    """
    rng = np.random.default_rng(7)
    signs = rng.choice([-1.0, 1.0], size=(3, 23, 23))
    inputs = [
        (signs * 1e-3 + rng.standard_normal((3, 23, 23)) * 1e-5).astype(np.float32),
        rng.uniform(-1e-3, 1e-3, size=(3, 23, 23)).astype(np.float32),
        (1e-3 + rng.standard_normal((3, 23, 23)) * 1e-6).astype(np.float32),
    ]
    w, b = rand(rng, 23), rand(rng, 23)
    for k, x in enumerate(inputs):
        for normalized in ([23], [23, 23]):
            ww = w if normalized == [23] else None
            bb = b if normalized == [23] else None
            (out,) = run_op("aten.native_layer_norm", [x, ww, bb], {"normalized_shape": normalized, "eps": eps})
            ref32 = A.native_layer_norm(T(x), normalized, T(ww), T(bb), eps)[0].numpy()
            to64 = lambda a: None if a is None else T(a).double()  # noqa: E731
            ref64 = A.native_layer_norm(to64(x), normalized, to64(ww), to64(bb), eps)[0].numpy()
            if eps == 1e-5:
                assert_close(out, ref32, what=f"input {k} {normalized} eps={eps}")
            assert_close(out, ref64.astype(np.float32), what=f"float64 reference: input {k} {normalized} eps={eps}")
            err_kiln = np.abs(out.astype(np.float64) - ref64).max()
            assert err_kiln <= np.abs(ref32.astype(np.float64) - ref64).max() + 1e-6 * np.abs(ref64).max()


def test_layer_norm_rejections():
    x = np.zeros((2, 3, 4), np.float32)
    op = "aten.native_layer_norm"
    expect_rejected(op, [x, None, None], {"normalized_shape": [3], "eps": 1e-5}, "InvalidArgument", "normalized_shape")
    expect_rejected(op, [x, None, None], {"normalized_shape": [], "eps": 1e-5}, "InvalidArgument", "normalized_shape")
    expect_rejected(op, [x, None, None], {"normalized_shape": [1, 2, 3, 4], "eps": 1e-5}, "InvalidArgument", "normalized_shape")
    expect_rejected(op, [x, np.ones(1, np.float32), None], {"normalized_shape": [4], "eps": 1e-5}, "InvalidArgument", "weight")
    expect_rejected(op, [x, None, np.ones((3, 4), np.float32)], {"normalized_shape": [4], "eps": 1e-5}, "InvalidArgument", "bias")
    expect_rejected(op, [x, None, None], {"eps": 1e-5}, "InvalidArgument", "normalized_shape")
    expect_rejected(op, [x, None, None], {"normalized_shape": [4]}, "InvalidArgument", "eps")


# ---------------------------------------------------------------- group norm

GN_CASES = [
    ((2, 6, 23, 23), [1, 2, 3, 6]), ((1, 4, 7, 5), [1, 2, 4]), ((3, 8, 5), [2, 4, 8]), ((2, 6, 1, 1), [3, 6]),
    ((1, 1, 1, 1), [1]), ((2, 6, 3, 4, 2), [3]), ((2, 4), [2]),
]


@pytest.mark.parametrize("shape,groups", GN_CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_matches_torch(shape, groups, affine):
    rng = np.random.default_rng(sum(shape) + len(groups))
    n, c = shape[0], shape[1]
    hxw = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    x = rand(rng, *shape, lo=-3, hi=4)
    w = rand(rng, c) if affine else None
    b = rand(rng, c) if affine else None
    for g in groups:
        for eps in (1e-5, 1e-6):
            attrs = {"N": n, "C": c, "HxW": hxw, "group": g, "eps": eps}
            (out,) = run_op("aten.native_group_norm", [x, w, b], attrs)
            ref = A.native_group_norm(T(x), T(w), T(b), n, c, hxw, g, eps)[0].numpy()
            if (c // g) * hxw > 1:
                assert_close(out, ref, what=f"group_norm {shape} group={g} affine={affine}")
                ref2 = F.group_norm(T(x), g, T(w), T(b), eps).numpy()  # the public API agrees
                assert_close(out, ref2, what=f"F.group_norm {shape} group={g}")
            else:
                # One element per group: the exact answer is bias (x - mean == 0), but PyTorch's
                # float32 mean leaves a rounding residue that rstd = 1/sqrt(eps) amplifies to ~3e-5;
                # compare with PyTorch eager in float64 instead (Kiln's statistics are in double).
                to64 = lambda a: None if a is None else T(a).double()  # noqa: E731
                ref64 = A.native_group_norm(to64(x), to64(w), to64(b), n, c, hxw, g, eps)[0].numpy()
                assert_close(out, ref64.astype(np.float32), what=f"group_norm {shape} group={g} (float64 reference)")


def test_group_norm_rejections():
    x = np.zeros((2, 6, 5, 3), np.float32)
    op = "aten.native_group_norm"
    ok = {"N": 2, "C": 6, "HxW": 15, "group": 3, "eps": 1e-5}
    expect_rejected(op, [x, None, None], {**ok, "group": 4}, "InvalidArgument", "group=4", "C=6")
    expect_rejected(op, [x, None, None], {**ok, "group": 0}, "InvalidArgument", "group")
    expect_rejected(op, [x, None, None], {**ok, "group": -3}, "InvalidArgument", "group")
    expect_rejected(op, [x, None, None], {**ok, "N": 3}, "InvalidArgument", "N=3")
    expect_rejected(op, [x, None, None], {**ok, "C": 3}, "InvalidArgument", "C=3")
    expect_rejected(op, [x, None, None], {**ok, "HxW": 16}, "InvalidArgument", "HxW=16")
    expect_rejected(op, [x, np.ones(3, np.float32), None], ok, "InvalidArgument", "weight")
    expect_rejected(op, [x, None, None], {k: v for k, v in ok.items() if k != "group"}, "InvalidArgument", "group")
    expect_rejected(op, [np.zeros(12, np.float32), None, None], {**ok, "HxW": 1}, "InvalidArgument", "rank")


# ---------------------------------------------------------------- RMS norm

RMS_CASES = [((2, 23, 23), [23]), ((2, 23, 23), [23, 23]), ((1, 1), [1]), ((3, 7, 5), [5]), ((3, 7, 5), [7, 5]), ((6,), [6])]


@pytest.mark.parametrize("shape,normalized", RMS_CASES)
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("eps", [None, 1e-6, 0.1])
def test_rms_norm_matches_torch(shape, normalized, with_weight, eps):
    rng = np.random.default_rng(sum(shape) + len(normalized))
    x = rand(rng, *shape, lo=-3, hi=3)
    w = rand(rng, *normalized) if with_weight else None
    (out,) = run_op("aten.rms_norm", [x, w], {"normalized_shape": normalized, "eps": eps})
    ref = A.rms_norm(T(x), normalized, T(w), eps).numpy()
    assert_close(out, ref, what=f"rms_norm {shape} {normalized} w={with_weight} eps={eps}")


def test_rms_norm_default_eps_is_float32_eps():
    """Tiny inputs make mean(x^2) comparable to finfo(float32).eps, so the default eps is visible."""
    x = np.full((2, 8), 1e-4, np.float32)
    x[1] *= -3
    (out,) = run_op("aten.rms_norm", [x, None], {"normalized_shape": [8]})  # eps omitted: None
    ref = F.rms_norm(T(x), [8]).numpy()
    assert_close(out, ref)
    assert abs(float(ref[0, 0]) - 1.0) > 1e-3  # eps really matters here: the test can fail


def test_rms_norm_rejections():
    x = np.zeros((2, 3, 4), np.float32)
    expect_rejected("aten.rms_norm", [x, None], {"normalized_shape": [3]}, "InvalidArgument", "normalized_shape")
    expect_rejected("aten.rms_norm", [x, np.ones(3, np.float32)], {"normalized_shape": [4]}, "InvalidArgument", "weight")
    expect_rejected("aten.rms_norm", [x, None], {}, "InvalidArgument", "normalized_shape")
    expect_rejected("aten.rms_norm", [x.astype(np.float16), None], {"normalized_shape": [4]}, "NotSupported", "float16")


# ---------------------------------------------------------------- scaled dot-product attention

def sdpa_ref(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False):
    return F.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=T(mask), is_causal=is_causal, scale=scale,
                                          enable_gqa=enable_gqa).numpy()


def sdpa_kiln(q, k, v, mask=None, **attrs):
    (out,) = run_op("aten.scaled_dot_product_attention", [q, k, v, mask], attrs)
    return out


SDPA_SHAPES = [  # (q shape, k shape, v shape)
    ((1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)),  # L == S
    ((2, 3, 4, 16), (2, 3, 7, 16), (2, 3, 7, 5)),  # L != S, Ev != E
    ((2, 7, 8), (2, 11, 8), (2, 11, 8)),  # rank 3
    ((1, 1, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1)),
    ((2, 1, 3, 4), (1, 3, 5, 4), (1, 3, 5, 6)),  # broadcast batch dims
    ((2, 2, 9, 6), (2, 2, 3, 6), (2, 2, 3, 6)),  # L > S
]


@pytest.mark.parametrize("shapes", SDPA_SHAPES)
@pytest.mark.parametrize("variant", ["plain", "causal", "scale", "bool_mask", "float_mask", "bool_mask_2d", "float_mask_row"])
def test_sdpa_matches_torch(shapes, variant):
    rng = np.random.default_rng(sum(map(sum, shapes)) + len(variant))
    q, k, v = (rand(rng, *s) for s in shapes)
    L, S = shapes[0][-2], shapes[1][-2]
    batch = np.broadcast_shapes(shapes[0][:-2], shapes[1][:-2], shapes[2][:-2])
    kw, mask = {}, None
    if variant == "causal":
        kw["is_causal"] = True
    elif variant == "scale":
        kw["scale"] = 0.37
    elif variant == "bool_mask":
        mask = rng.random(tuple(batch) + (L, S)) > 0.3
        mask[..., 0] = True  # at least one kept position per row
    elif variant == "bool_mask_2d":
        mask = rng.random((L, S)) > 0.5
    elif variant == "float_mask":
        mask = rand(rng, *(tuple(batch) + (L, S)), lo=-3, hi=3)
    elif variant == "float_mask_row":
        mask = rand(rng, 1, S, lo=-3, hi=3)  # broadcasts over the query rows
    out = sdpa_kiln(q, k, v, mask, **kw)
    ref = sdpa_ref(q, k, v, mask, **kw)
    assert_close(out, ref, what=f"sdpa {shapes} {variant}")


def test_sdpa_fully_masked_rows_and_minus_inf():
    """Rows whose positions are all masked give 0 (PyTorch's _safe_softmax); -inf in a float mask masks."""
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 6, 8), rand(rng, 1, 2, 6, 3)
    bmask = rng.random((4, 6)) > 0.4
    bmask[1] = False
    bmask[2, :] = False
    bmask[2, 5] = True
    fmask = np.where(bmask, rand(rng, 4, 6), -np.inf).astype(np.float32)
    for m in (bmask, fmask):
        ref = sdpa_ref(q, k, v, m)
        assert np.all(ref[..., 1, :] == 0)
        assert_close(sdpa_kiln(q, k, v, m), ref, what=str(m.dtype))


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_sdpa_gqa(kv_heads):
    rng = np.random.default_rng(kv_heads)
    q, k, v = rand(rng, 2, 4, 5, 8), rand(rng, 2, kv_heads, 7, 8), rand(rng, 2, kv_heads, 7, 6)
    for causal in (False, True):
        ref = sdpa_ref(q, k, v, is_causal=causal, enable_gqa=True)
        assert_close(sdpa_kiln(q, k, v, is_causal=causal, enable_gqa=True), ref, what=f"gqa {kv_heads} causal={causal}")


def test_sdpa_large_scores_are_stable():
    rng = np.random.default_rng(11)
    q, k, v = rand(rng, 1, 3, 16) * 30, rand(rng, 1, 9, 16) * 30, rand(rng, 1, 9, 4)
    assert_close(sdpa_kiln(q, k, v), sdpa_ref(q, k, v))


def test_sdpa_rejections():
    q, k, v = np.zeros((1, 2, 3, 4), np.float32), np.zeros((1, 2, 5, 4), np.float32), np.zeros((1, 2, 5, 6), np.float32)
    op = "aten.scaled_dot_product_attention"
    expect_rejected(op, [q, k, v, None], {"dropout_p": 0.1}, "NotSupported", "dropout_p")
    expect_rejected(op, [q, k, v, np.ones((3, 5), bool)], {"is_causal": True}, "InvalidArgument", "attn_mask", "is_causal")
    expect_rejected(op, [q, k, v, np.ones((3, 4), bool)], {}, "InvalidArgument", "attn_mask")
    expect_rejected(op, [q, k, v, np.ones((2, 2, 3, 5), bool)], {}, "InvalidArgument", "attn_mask")  # would enlarge
    expect_rejected(op, [q, k, v, np.ones((3, 5), np.int64)], {}, "InvalidArgument", "attn_mask", "int64")
    expect_rejected(op, [q, np.zeros((1, 2, 5, 3), np.float32), v, None], {}, "InvalidArgument", "key")
    expect_rejected(op, [q, k, np.zeros((1, 2, 6, 6), np.float32), None], {}, "InvalidArgument", "value")
    expect_rejected(op, [np.zeros((1, 4, 3, 4), np.float32), np.zeros((1, 3, 5, 4), np.float32),
                         np.zeros((1, 3, 5, 6), np.float32), None], {"enable_gqa": True}, "InvalidArgument", "enable_gqa")
    expect_rejected(op, [np.zeros((1, 4, 3, 4), np.float32), k, v, None], {}, "InvalidArgument", "batch")
    expect_rejected(op, [np.zeros((3, 4), np.float32), np.zeros((5, 4), np.float32), np.zeros((5, 6), np.float32), None],
                    {}, "NotSupported", "rank")
    expect_rejected(op, [q.astype(np.float16), k, v, None], {}, "NotSupported", "float16")


def test_larger_inputs_split_across_threads():
    """Sizes large enough that the kernels split rows over the thread pool."""
    rng = np.random.default_rng(21)
    x, c16 = rand(rng, 8, 16, 64, 64), rand(rng, 16)
    var = rng.uniform(0.1, 2, 16).astype(np.float32)
    (out,) = run_op("aten.native_batch_norm", [x, c16, c16, c16, var], {})
    assert_close(out, A.native_batch_norm(T(x), T(c16), T(c16), T(c16), T(var), False, 0.1, 1e-5)[0].numpy())
    x = rand(rng, 256, 300, 8)
    (out,) = run_op("aten.native_layer_norm", [x, None, None], {"normalized_shape": [8], "eps": 1e-5})
    assert_close(out, A.native_layer_norm(T(x), [8], None, None, 1e-5)[0].numpy())
    x = rand(rng, 4, 32, 32, 32)
    (out,) = run_op("aten.native_group_norm", [x, None, None], {"N": 4, "C": 32, "HxW": 1024, "group": 8, "eps": 1e-5})
    assert_close(out, A.native_group_norm(T(x), None, None, 4, 32, 1024, 8, 1e-5)[0].numpy())
    x = rand(rng, 4096, 64)
    (out,) = run_op("aten.rms_norm", [x, None], {"normalized_shape": [64], "eps": 1e-6})
    assert_close(out, A.rms_norm(T(x), [64], None, 1e-6).numpy())
    q, k, v = rand(rng, 2, 4, 128, 32), rand(rng, 2, 4, 128, 32), rand(rng, 2, 4, 128, 32)
    assert_close(sdpa_kiln(q, k, v, is_causal=True), sdpa_ref(q, k, v, is_causal=True))

"""The mlx delegate's lowerings of Kiln's LLM ops (src/backends/mlx/mlx_llm.cpp), on MLX's CPU device.

kiln.sdpa_kv_cache is compared with torch.nn.functional.scaled_dot_product_attention in float64
over the whole cache with the mask written here from the op's definition (src/ir/ops/llm.cpp):
key j is visible to query row t iff j <= p + t and (window == 0 or j > p + t - window). One
compiled program runs at several positions p (input_pos is data in the MLX graph, so no shape
depends on it), and input_pos outside the cache is an error from execute. kiln.check_range
passes values through and fails naming `what` and the range.
"""
import os

import numpy as np
import pytest
import torch

os.environ["KILN_MLX_DEVICE"] = "cpu"

import kiln  # noqa: E402
from delegate_util import check_all_delegated  # noqa: E402
from oprunner import assert_close, kiln_dtype  # noqa: E402

F = torch.nn.functional
torch.set_num_threads(1)
REL = 1e-4       # fp32: max abs error <= REL * max |expected| (as tests/python/test_mlx.py)
HALF_REL = 2e-2  # compute_dtype float16 (as tests/python/test_mlx.py)

pytestmark = pytest.mark.skipif("mlx" not in kiln._kiln.backend_names(),
                                reason="the mlx backend is not built (no MLX CMake package from `python -m mlx --cmake-dir`)")


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _program(build, feeds, **opts):
    """Compiles build(g, ids) (one input per array of `feeds`, which give dtypes and shapes) for
    mlx, checks that its one node was delegated; returns the loaded program (not run)."""
    g = kiln.Graph()
    ids = [g.add_input(f"x{i}", kiln_dtype(x), list(x.shape)) for i, x in enumerate(feeds)]
    g.set_outputs(list(build(g, ids)))
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, rep = pb.compile(backends=["mlx"], fold_constants=False, **opts)
    check_all_delegated(rep["methods"][0]["delegation"], "mlx", nodes=1)
    return kiln.load_bytes(data)


def reference_sdpa(q, k, v, p, window, scale):
    """Attention of q [B, Hq, T, D] over the whole cache k [B, Hkv, S, D], v [B, Hkv, S, Dv] in
    float64 with the explicit mask [T, S] of kiln.sdpa_kv_cache at position p; kv heads repeated
    for grouped-query attention (head h reads kv head h // (Hq // Hkv))."""
    T, S = q.shape[2], k.shape[2]
    rows = p + np.arange(T)[:, None]
    keys = np.arange(S)[None, :]
    mask = keys <= rows
    if window > 0:
        mask &= keys > rows - window
    group = q.shape[1] // k.shape[1]
    kk = torch.from_numpy(k).double().repeat_interleave(group, dim=1)
    vv = torch.from_numpy(v).double().repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(torch.from_numpy(q).double(), kk, vv, attn_mask=torch.from_numpy(mask),
                                          scale=scale).numpy().astype(np.float32)


SDPA_CASES = [
    # (B, Hq, Hkv, T, S, D, Dv, sliding_window, scale, positions p)
    (1, 4, 2, 1, 16, 8, 8, 0, None, [0, 7, 15]),     # decode, GQA
    (2, 4, 2, 5, 16, 8, 6, 0, 0.3, [0, 4, 11]),      # prefill at 0 and at offsets, GQA, D != Dv
    (1, 3, 3, 4, 12, 8, 8, 3, None, [0, 5, 8]),      # prefill, Hq == Hkv, window 3
    (1, 4, 2, 1, 16, 8, 8, 3, 0.5, [0, 2, 15]),      # decode, GQA, window 3
    (1, 2, 1, 3, 8, 4, 4, 20, None, [0, 5]),         # window beyond S (excludes nothing)
]


def _sdpa_program(B, Hq, Hkv, T, S, D, Dv, window, scale, **opts):
    feeds = [_rand(B, Hq, T, D), _rand(B, Hkv, S, D), _rand(B, Hkv, S, Dv), np.zeros(1, np.int64)]
    attrs = {"scale": scale, "sliding_window": window}
    return _program(lambda g, ids: g.add_node("kiln.sdpa_kv_cache", ids, attrs), feeds, **opts)


@pytest.mark.parametrize("case", SDPA_CASES, ids=[str(i) for i in range(len(SDPA_CASES))])
def test_sdpa_kv_cache(case):
    B, Hq, Hkv, T, S, D, Dv, window, scale, positions = case
    prog = _sdpa_program(B, Hq, Hkv, T, S, D, Dv, window, scale)
    # The whole cache holds data (also past p + T): the mask alone decides what is read.
    k, v = _rand(B, Hkv, S, D, seed=2), _rand(B, Hkv, S, Dv, seed=3)
    for i, p in enumerate(positions):
        q = _rand(B, Hq, T, D, seed=10 + i)
        (out,) = prog.run(q, k, v, np.array([p], np.int64))
        assert out.shape == (B, Hq, T, Dv) and out.dtype == np.float32
        assert_close(out, reference_sdpa(q, k, v, p, window, scale), REL, f"sdpa_kv_cache p={p}")


def test_sdpa_kv_cache_input_pos_out_of_range():
    B, Hq, Hkv, T, S, D = 1, 4, 2, 3, 8, 4
    prog = _sdpa_program(B, Hq, Hkv, T, S, D, D, 0, None)
    q, k, v = _rand(B, Hq, T, D, seed=4), _rand(B, Hkv, S, D, seed=5), _rand(B, Hkv, S, D, seed=6)
    for p in (-1, S - T + 1, 1 << 40):
        with pytest.raises(kiln.KilnError, match=r"input_pos p .*T=3 .*does not fit the cache of S=8 .*p \+ T <= S"):
            prog.run(q, k, v, np.array([p], np.int64))
    # The last position that fits still runs, after the errors.
    (out,) = prog.run(q, k, v, np.array([S - T], np.int64))
    assert_close(out, reference_sdpa(q, k, v, S - T, 0, None), REL, "sdpa_kv_cache after errors")


def test_sdpa_kv_cache_float16():
    B, Hq, Hkv, T, S, D, Dv = 1, 4, 2, 4, 16, 8, 8
    prog = _sdpa_program(B, Hq, Hkv, T, S, D, Dv, 3, None, compute_dtype="float16")
    q, k, v = _rand(B, Hq, T, D, seed=7), _rand(B, Hkv, S, D, seed=8), _rand(B, Hkv, S, Dv, seed=9)
    for p in (0, 9):
        (out,) = prog.run(q, k, v, np.array([p], np.int64))
        assert out.dtype == np.float32
        assert_close(out, reference_sdpa(q, k, v, p, 3, None), HALF_REL, f"sdpa_kv_cache fp16 p={p}")


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_check_range(dtype):
    x = np.array([[0, 3, 7], [5, 1, 2]], dtype)
    prog = _program(lambda g, ids: g.add_node("kiln.check_range", ids, {"lo": 0, "hi": 7, "what": "input_pos"}), [x])
    (out,) = prog.run(x)
    assert out.dtype == x.dtype and (out == x).all()
    for bad in (8, -1):
        y = x.copy()
        y[1, 2] = bad
        with pytest.raises(kiln.KilnError, match=r"input_pos is .*outside \[0, 7\]"):
            prog.run(y)
    (out,) = prog.run(x)  # fine again after the errors
    assert (out == x).all()


def test_check_range_bounds_beyond_int32():
    x = np.array([-(2 ** 31), 0, 2 ** 31 - 1], np.int32)
    prog = _program(lambda g, ids: g.add_node("kiln.check_range", ids, {"lo": -(2 ** 40), "hi": 2 ** 40}), [x])
    (out,) = prog.run(x)
    assert (out == x).all()
    prog = _program(lambda g, ids: g.add_node("kiln.check_range", ids, {"lo": 2 ** 40, "hi": 2 ** 41}), [x])
    with pytest.raises(kiln.KilnError, match=r"value is .*outside \[1099511627776, 2199023255552\]"):
        prog.run(x)


def test_sdpa_kv_cache_with_too_many_scores_is_declined():
    T = S = 46341  # T * S > 2^31: the scores MLX's attention materializes off its fused kernels
    g = kiln.Graph()
    ids = [g.add_input("q", "float32", [1, 1, T, 1]), g.add_input("k", "float32", [1, 1, S, 1]),
           g.add_input("v", "float32", [1, 1, S, 1]), g.add_input("p", "int64", [1])]
    g.set_outputs(list(g.add_node("kiln.sdpa_kv_cache", ids, {})))
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    _, rep = pb.compile(backends=["mlx"])
    (op,) = rep["methods"][0]["delegation"]["cpu_ops"]
    assert op["op"] == "kiln.sdpa_kv_cache"
    assert any(b == "mlx" and "more than 2^31 elements" in r for b, r in op["reasons"]), op

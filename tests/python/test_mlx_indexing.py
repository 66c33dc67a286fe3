"""The indexing ops on the mlx delegate (MLX's CPU device) against PyTorch eager, their run-time
range checks, and the xnnpack delegate declining them with a reason."""
import os

import numpy as np
import pytest
import torch

os.environ["KILN_MLX_DEVICE"] = "cpu"

import kiln  # noqa: E402
from delegate_util import check_all_delegated, compile_graph, declined_reasons  # noqa: E402
from oprunner import assert_close  # noqa: E402

RNG = np.random.default_rng(3)
I = lambda *v: np.array(v, np.int64)  # noqa: E731
T = torch.from_numpy
mlx = pytest.mark.skipif("mlx" not in kiln._kiln.backend_names(), reason="the mlx backend is not built")


def one_node(op, feeds, attrs, backend="mlx"):
    def build(g, ids):
        return g.add_node(op, ids, attrs)
    outs, dl, data, _ = compile_graph(build, feeds, [backend], fold_constants=False)
    return outs[0], dl, kiln.load_bytes(data)


@mlx
@pytest.mark.parametrize("indices", [
    [None, I(2, 0, -1)],                                          # x[:, i]
    [I(1, -3), None, I(4, 0)],                                    # x[i, :, j]: separated -> bcast first
    [None, I(3, 0).reshape(2, 1), I(1, 2, 3).reshape(1, 3)],      # adjacent, broadcast
    [None, None, I(-1)],                                          # x[..., j]
    [np.array(2), None, np.array(-1)],                            # 0-d indices, separated
    [None, np.array(1)],                                          # one 0-d index
])
def test_index_on_mlx(indices):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    tensors = [t for t in indices if t is not None]
    dims = [d for d, t in enumerate(indices) if t is not None]
    out, dl, prog = one_node("aten.index", [x] + tensors, {"dims": dims})
    check_all_delegated(dl, "mlx", 1)
    exp = torch.ops.aten.index.Tensor(T(x), [None if t is None else T(t) for t in indices])
    assert_close(out, exp.numpy(), 1e-6, "index")
    bad = [t.copy() for t in tensors]
    bad[0].flat[0] = 7
    with pytest.raises(kiln.KilnError, match="aten.index: an index is out of range"):
        prog.run(x, *bad)


@mlx
def test_gather_index_select_scatter_on_mlx():
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    gi = RNG.integers(0, 5, (4, 3))
    out, dl, prog = one_node("aten.gather", [x, gi], {"dim": 1})
    check_all_delegated(dl, "mlx", 1)
    assert_close(out, torch.gather(T(x), 1, T(gi)).numpy(), 1e-6, "gather")
    for bad in (5, -1):  # PyTorch's gather refuses negative indices too
        with pytest.raises(kiln.KilnError, match="aten.gather: an index is out of range for dim 1 of size 5"):
            prog.run(x, np.full((4, 3), bad, np.int64))

    out, dl, prog = one_node("aten.index_select", [x, I(3, 1, 0)], {"dim": 0})
    check_all_delegated(dl, "mlx", 1)
    assert_close(out, T(x)[[3, 1, 0]].numpy(), 1e-6, "index_select")
    with pytest.raises(kiln.KilnError, match="aten.index_select: an index is out of range for dim 0 of size 4"):
        prog.run(x, I(3, -1, 0))

    idx = np.stack([RNG.permutation(4) for _ in range(5)], 1)  # no duplicate targets
    src = RNG.standard_normal((4, 6)).astype(np.float32)
    for op, attrs, ref in [("aten.scatter", {"dim": 0}, torch.scatter(T(x), 0, T(idx), T(src))),
                           ("aten.scatter_add", {"dim": 0}, torch.scatter_add(T(x), 0, T(idx), T(src)))]:
        out, dl, _ = one_node(op, [x, idx, src], attrs)
        check_all_delegated(dl, "mlx", 1)
        assert_close(out, ref.numpy(), 1e-6, op)
    dup = np.zeros((3, 5), np.int64)  # scatter_add sums duplicates
    out, _, _ = one_node("aten.scatter_add", [x, dup, src], {"dim": 0})
    assert_close(out, torch.scatter_add(T(x), 0, T(dup), T(src)).numpy(), 1e-6, "scatter_add duplicates")


@mlx
def test_slice_select_scatter_on_mlx():
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    s = RNG.standard_normal((4, 2)).astype(np.float32)
    out, dl, _ = one_node("aten.slice_scatter", [x, s], {"dim": 1, "start": 1, "end": None, "step": 3})
    check_all_delegated(dl, "mlx", 1)
    assert_close(out, torch.slice_scatter(T(x), T(s), 1, 1, None, 3).numpy(), 0, "slice_scatter")
    r = RNG.standard_normal((6,)).astype(np.float32)
    out, dl, _ = one_node("aten.select_scatter", [x, r], {"dim": 0, "index": -1})
    check_all_delegated(dl, "mlx", 1)
    assert_close(out, torch.select_scatter(T(x), T(r), 0, -1).numpy(), 0, "select_scatter")


@mlx
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_on_mlx(accumulate):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    cases = [([I(2, 0, 2) if accumulate else I(2, 0, 1)], RNG.standard_normal((3, 4, 5)).astype(np.float32)),
             ([None, I(1, 3), I(0, 4)], RNG.standard_normal((3, 2)).astype(np.float32)),    # adjacent, bcast in place
             ([I(1, -1), None, I(4, 0)], RNG.standard_normal((2, 4)).astype(np.float32)),   # separated
             ([None, I(3).reshape(1, 1)], np.array(7.0, np.float32))]                       # broadcast 0-d values
    for indices, v in cases:
        tensors = [t for t in indices if t is not None]
        dims = [d for d, t in enumerate(indices) if t is not None]
        out, dl, prog = one_node("aten.index_put", [x, v] + tensors, {"dims": dims, "accumulate": accumulate})
        check_all_delegated(dl, "mlx", 1)
        exp = torch.ops.aten.index_put.default(T(x), [None if t is None else T(t) for t in indices], T(v), accumulate)
        assert_close(out, exp.numpy(), 1e-6, f"index_put dims {dims}")
    _, _, prog = one_node("aten.index_put", [x, cases[0][1], I(0, 2, 1)], {"dims": [0], "accumulate": accumulate})
    with pytest.raises(kiln.KilnError, match="aten.index_put: an index is out of range for dim 0 of size 3"):
        prog.run(x, cases[0][1], I(0, 3, 1))


@mlx
def test_unlowered_indexing_ops_are_declined_with_reason():
    x = np.zeros((3, 2), np.float32)
    mask = np.array([True, False, True])
    out, dl, _ = one_node("aten.index_put", [x, np.ones((2,), np.float32), mask], {"dims": [0], "accumulate": True})
    assert any("bool mask" in r for r in declined_reasons(dl, "aten.index_put", "mlx")), dl
    assert_close(out, np.array([[1, 1], [0, 0], [1, 1]], np.float32), 0, "index_put on the cpu")
    idx = np.zeros((1, 2), np.int64)
    out, dl, _ = one_node("aten.scatter_reduce", [x, idx, np.ones((1, 2), np.float32)],
                          {"dim": 0, "reduce": "amax", "include_self": True})
    assert any("no mlx lowering" in r for r in declined_reasons(dl, "aten.scatter_reduce", "mlx")), dl


@pytest.mark.skipif("xnnpack" not in kiln._kiln.backend_names(), reason="the xnnpack backend is not built")
def test_xnnpack_declines_indexing_with_reason():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    for op, feeds, attrs in [("aten.index", [x, I(2, 0)], {"dims": [0]}),
                             ("aten.gather", [x, np.zeros((3, 1), np.int64)], {"dim": 1})]:
        out, dl, _ = one_node(op, feeds, attrs, backend="xnnpack")
        assert dl["backends"][0]["segments"] == 0 and declined_reasons(dl, op, "xnnpack"), dl  # a reason is given
        ref = x[[2, 0]] if op == "aten.index" else x[:, :1]
        assert_close(out, ref, 0, f"{op} on the cpu kernels")

"""Indexing ops (aten.index, index_put, gather, index_select, scatter*, select/slice_scatter,
masked_scatter, _embedding_bag) against PyTorch eager: one-node programs (oprunner.run_op) and
end-to-end exports of small modules (torch.export -> kiln.export -> run)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close, run_op

RNG = np.random.default_rng(0)

# every Kiln dtype for the data; bfloat16 travels as its uint16 bits (compared bit-exactly)
DTYPES = ["float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"]
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64,
         "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}


def data(shape, dtype: str) -> torch.Tensor:
    """Small exact values (integers in [-8, 8], or 0..8 for uint8) in `dtype`."""
    if dtype == "bool":
        return torch.from_numpy(RNG.integers(0, 2, shape).astype(bool))
    lo = 0 if dtype == "uint8" else -8
    return torch.from_numpy(RNG.integers(lo, 9, shape).astype(np.int64)).to(TORCH[dtype])


def to_np(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def run(op, inputs, attrs, **kw):
    """run_op on torch tensors (bfloat16 passed as its bits); returns torch tensors."""
    bf = [isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in inputs]
    if any(bf):
        return _run_bf16(op, inputs, attrs, **kw)
    outs = run_op(op, [None if t is None else t.numpy() for t in inputs], attrs, **kw)
    return [torch.from_numpy(np.asarray(o)) for o in outs]


def _run_bf16(op, inputs, attrs, constants=()):
    g = kiln.Graph()
    ids, feeds = [], []
    for i, t in enumerate(inputs):
        if t is None:
            ids.append(-1)
            continue
        dt = "bfloat16" if t.dtype == torch.bfloat16 else str(t.dtype).replace("torch.", "")
        arr = t.contiguous().view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
        ids.append(g.add_input(f"x{i}", dt, list(t.shape)))
        feeds.append(arr)
    outs = g.add_node(op, ids, attrs)
    g.set_outputs(list(outs))
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data_, _ = pb.compile(fold_constants=False)
    res = kiln.load_bytes(data_).run(*feeds)
    return [torch.from_numpy(np.asarray(r).view(np.int16).copy()).view(torch.bfloat16) if r.dtype == np.uint16
            else torch.from_numpy(np.asarray(r)) for r in res]


def same(got: torch.Tensor, exp: torch.Tensor, what=""):
    assert got.dtype == exp.dtype and tuple(got.shape) == tuple(exp.shape), f"{what}: {got.dtype}{list(got.shape)} " \
                                                                             f"!= {exp.dtype}{list(exp.shape)}"
    assert_close(to_np(got), to_np(exp), what=what)


def index_inputs(indices):
    """ATen index list -> (tensors, dims) as the capture builds them (int indices only)."""
    tensors, dims = [], []
    for d, t in enumerate(indices):
        if t is not None:
            tensors.append(t)
            dims.append(d)
    return tensors, dims


def check_index(x, indices, what=""):
    exp = torch.ops.aten.index.Tensor(x, indices)
    tensors, dims = index_inputs(indices)
    got = run("aten.index", [x] + tensors, {"dims": dims})[0]
    same(got, exp, what)


# --------------------------------------------------------------------------------------------------
# aten.index

I = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_every_dtype(dtype):
    x = data((4, 3, 5), dtype)
    check_index(x, [None, I(2, 0, -1)], dtype)          # x[:, idx]
    check_index(x, [I(1, -4), None, I(4, 0)], dtype)    # x[i, :, j]: separated -> bcast dims first


def test_index_patterns():
    x = data((3, 4, 5, 6), "float32")
    check_index(x, [I(0, 2)], "x[idx]")
    check_index(x, [None, None, None, I(5, -6, 0)], "x[..., idx]")
    check_index(x, [None, I(1, 3), I(0, 4)], "adjacent pair stays in place")
    check_index(x, [I(1, 2), None, None, I(0, 5)], "separated pair goes first")
    # broadcasting index tensors (the attention-mask pattern: batch_idx[:, None] with kv_idx[None, :])
    check_index(x, [None, torch.arange(4)[:, None], torch.arange(5)[None, :]], "broadcast 2-D")
    check_index(x, [torch.arange(3).view(3, 1, 1), None, torch.arange(5).view(1, 5, 1), torch.tensor([[[0, 5]]])],
                "three indices, broadcast, separated")
    check_index(x, [torch.tensor(2), None, torch.tensor(-1)], "0-d indices")
    check_index(x, [I(1, 2).to(torch.int32), I(3, 0)], "int32 and int64 mixed")


def test_index_empty():
    x = data((3, 4), "float32")
    check_index(x, [None, torch.zeros(0, dtype=torch.int64)], "empty index")
    check_index(data((0, 4), "int32"), [None, I(1, 3)], "empty self")


def test_index_out_of_range_names_op_index_and_dim():
    x = data((3, 4), "float32")
    for bad in (4, -5):
        with pytest.raises(kiln.KilnError, match=rf"aten.index: index {bad} is out of range for dim 1 of size 4"):
            run("aten.index", [x, I(0, bad)], {"dims": [1]})


def test_index_refuses_bool_mask_with_reason():
    with pytest.raises(kiln.KilnError, match="boolean-mask indexing has a data-dependent output shape"):
        run("aten.index", [data((3,), "float32"), torch.tensor([True, False, True])], {"dims": [0]})


# --------------------------------------------------------------------------------------------------
# aten.index_put

@pytest.mark.parametrize("dtype", DTYPES)
def test_index_put_every_dtype(dtype):
    x = data((4, 3, 5), dtype)
    idx = [I(3, 0), None, I(-1, 2)]
    v = data((2, 3), dtype)
    tensors, dims = index_inputs(idx)
    for acc in (False, True):
        exp = torch.ops.aten.index_put.default(x, idx, v, acc)
        got = run("aten.index_put", [x, v] + tensors, {"dims": dims, "accumulate": acc})[0]
        same(got, exp, f"{dtype} accumulate={acc}")


def test_index_put_accumulate_sums_duplicates():
    x = data((5, 3), "float32")
    i = I(1, 1, 4, 1, -4)
    v = data((5, 3), "float32")
    exp = torch.ops.aten.index_put.default(x, [i], v, True)
    same(run("aten.index_put", [x, v, i], {"dims": [0], "accumulate": True})[0], exp)
    # int64 with broadcast 0-d values and two index tensors
    x, v = data((4, 4), "int64"), torch.tensor(3)
    idx = [I(0, 0, 2), I(1, 1, 3)]
    exp = torch.ops.aten.index_put.default(x, idx, v, True)
    same(run("aten.index_put", [x, v] + idx, {"dims": [0, 1], "accumulate": True})[0], exp)


def test_index_put_duplicates_without_accumulate_take_one_of_the_values():
    x = torch.zeros(3)
    got = run("aten.index_put", [x, torch.tensor([1.0, 2.0]), I(1, 1)], {"dims": [0], "accumulate": False})[0]
    assert got[1].item() in (1.0, 2.0) and got[0] == 0 and got[2] == 0


def test_index_put_bool_mask():
    x = data((3, 4, 2), "float32")
    mask = torch.from_numpy(RNG.integers(0, 2, (3, 4)).astype(bool))
    for v in (torch.tensor(7.0), data((int(mask.sum()), 2), "float32"), data((2,), "float32")):
        exp = torch.ops.aten.index_put.default(x, [mask], v, False)
        same(run("aten.index_put", [x, v, mask], {"dims": [0], "accumulate": False})[0], exp, f"values {list(v.shape)}")
    with pytest.raises(kiln.KilnError, match="aten.index_put: values of shape"):
        run("aten.index_put", [x, data((int(mask.sum()) + 1, 2), "float32"), mask], {"dims": [0], "accumulate": False})


def test_index_put_out_of_range():
    with pytest.raises(kiln.KilnError, match="aten.index_put: index 3 is out of range for dim 0 of size 3"):
        run("aten.index_put", [torch.zeros(3), torch.tensor(1.0), I(0, 3)], {"dims": [0], "accumulate": True})


# --------------------------------------------------------------------------------------------------
# gather, index_select

@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_and_index_select_every_dtype(dtype):
    x = data((4, 5, 3), dtype)
    idx = torch.from_numpy(RNG.integers(-5, 5, (3, 4, 2)))
    for dim in (1, -2):
        exp = torch.gather(x, dim, idx.remainder(5))  # torch.gather refuses negatives; Kiln's kernel wraps them
        same(run("aten.gather", [x, idx.remainder(5)], {"dim": dim})[0], exp, f"gather {dtype}")
    sel = I(2, -1, 0, 2)
    for dim in (0, 2, -1):
        size = x.shape[dim]
        exp = torch.index_select(x, dim, sel.remainder(size))
        same(run("aten.index_select", [x, sel.remainder(size)], {"dim": dim})[0], exp, f"index_select {dtype}")


def test_gather_index_select_edges():
    x = data((3, 4), "float32")
    same(run("aten.index_select", [x, torch.tensor(2)], {"dim": 1})[0], torch.index_select(x, 1, torch.tensor(2)), "0-d")
    # negative indices are out of range for index_select, gather and the scatters (PyTorch raises
    # "index -1 is out of bounds"); aten.index counts them from the end
    for op, args in (("aten.index_select", [x, I(-1)]), ("aten.gather", [x, torch.tensor([[0], [-1], [1]])])):
        with pytest.raises(kiln.KilnError, match=f"{op}: index -1 is out of range"):
            run(op, args, {"dim": 0})
        with pytest.raises((RuntimeError, IndexError)):  # the reference refuses them too
            getattr(torch, op.split(".")[1])(x, 0, args[1])
    with pytest.raises(kiln.KilnError, match="aten.scatter_add: index -1 is out of range"):
        run("aten.scatter_add", [x, torch.tensor([[0, -1]]), x], {"dim": 1})
    same(run("aten.index", [x, I(-1)], {"dims": [0]})[0], x[[-1]], "negative aten.index")
    e = torch.zeros(0, dtype=torch.int64)
    same(run("aten.index_select", [x, e], {"dim": 1})[0], torch.index_select(x, 1, e), "empty index")
    same(run("aten.gather", [x, torch.zeros(3, 0, dtype=torch.int64)], {"dim": 1})[0],
         torch.gather(x, 1, torch.zeros(3, 0, dtype=torch.int64)), "empty gather")
    with pytest.raises(kiln.KilnError, match="aten.gather: index 4 is out of range for dim 1 of size 4"):
        run("aten.gather", [x, torch.tensor([[0], [4], [1]])], {"dim": 1})
    with pytest.raises(kiln.KilnError, match="aten.index_select: index -4 is out of range for dim 0 of size 3"):
        run("aten.index_select", [x, I(0, -4)], {"dim": 0})


# --------------------------------------------------------------------------------------------------
# scatter family

@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_every_dtype(dtype):
    x = data((4, 5), dtype)
    # a permutation per column: no duplicate targets (PyTorch leaves which duplicate wins undefined)
    idx = torch.stack([torch.randperm(4, generator=torch.Generator().manual_seed(k))[:3] for k in range(4)], 1)
    src = data((3, 6), dtype)
    same(run("aten.scatter", [x, idx, src], {"dim": 0})[0], torch.scatter(x, 0, idx, src), f"scatter {dtype}")
    if dtype != "bool":
        same(run("aten.scatter_add", [x, idx, src], {"dim": 0})[0], torch.scatter_add(x, 0, idx, src), dtype)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "int64", "float16"])
def test_scatter_reduce(reduce, include_self, dtype):
    x = data((4, 3), dtype)
    idx = torch.from_numpy(RNG.integers(0, 4, (6, 3)))  # duplicates on purpose
    src = data((6, 3), dtype)
    if dtype == "float16" and reduce == "prod":
        src = src.clamp(-2, 2)
    exp = torch.scatter_reduce(x, 0, idx, src, reduce, include_self=include_self)
    got = run("aten.scatter_reduce", [x, idx, src], {"dim": 0, "reduce": reduce, "include_self": include_self})[0]
    same(got, exp, f"{reduce} include_self={include_self}")


def test_scatter_reduce_nan_propagates_in_amax():
    x = torch.tensor([1.0, 2.0, 3.0])
    src = torch.tensor([float("nan"), 5.0])
    idx = I(0, 0)
    got = run("aten.scatter_reduce", [x, idx, src], {"dim": 0, "reduce": "amax", "include_self": True})[0]
    assert np.isnan(got[0].item()) and got[1] == 2.0 and got[2] == 3.0  # max(1, NaN, 5) = NaN by definition


def test_scatter_reduce_attr_and_errors():
    x = data((3, 4), "float32")
    idx = I(1, 2, 0).view(3, 1)
    src = data((3, 4), "float32")
    exp = torch.scatter(x, 0, idx, src, reduce="multiply")
    same(run("aten.scatter", [x, idx, src], {"dim": 0, "reduce": "multiply"})[0], exp)
    with pytest.raises(kiln.KilnError, match="aten.scatter_add: index 3 is out of range for dim 0 of size 3"):
        run("aten.scatter_add", [x, I(3).view(1, 1), src], {"dim": 0})
    with pytest.raises(kiln.KilnError, match="index: size"):
        run("aten.scatter_add", [x, torch.zeros(3, 5, dtype=torch.int64), src], {"dim": 0})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "bool"])
def test_select_slice_scatter(dtype):
    x = data((4, 6, 3), dtype)
    s = data((4, 3), dtype)
    same(run("aten.select_scatter", [x, s], {"dim": 1, "index": -2})[0], torch.select_scatter(x, s, 1, -2), "select")
    s = data((4, 2, 3), dtype)
    same(run("aten.slice_scatter", [x, s], {"dim": 1, "start": 1, "end": -1, "step": 3})[0],
         torch.slice_scatter(x, s, 1, 1, -1, 3), "slice step 3")
    s = data((4, 6, 3), dtype)
    same(run("aten.slice_scatter", [x, s], {"dim": 1, "start": None, "end": None, "step": 1})[0],
         torch.slice_scatter(x, s, 1), "whole")


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "bool"])
def test_masked_scatter(dtype):
    x = data((3, 4), dtype)
    mask = torch.from_numpy(RNG.integers(0, 2, (4,)).astype(bool))  # broadcast over rows
    src = data((5, 3), dtype)
    src = torch.cat([src.reshape(-1)] * 2).reshape(6, 5)  # more elements than needed
    same(run("aten.masked_scatter", [x, mask, src], {})[0], torch.masked_scatter(x, mask, src), dtype)
    row, mask2 = data((4,), dtype), torch.from_numpy(RNG.integers(0, 2, (3, 4)).astype(bool))  # self broadcasts too
    same(run("aten.masked_scatter", [row, mask2, src], {})[0], torch.masked_scatter(row, mask2, src), f"{dtype} bcast")
    with pytest.raises(kiln.KilnError, match="aten.masked_scatter: the mask selects 12 elements but source has only 2"):
        run("aten.masked_scatter", [x, torch.ones(3, 4, dtype=torch.bool), data((2,), dtype)], {})


# --------------------------------------------------------------------------------------------------
# _embedding_bag

@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag(mode, include_last_offset):
    w = torch.randn(10, 4, generator=torch.Generator().manual_seed(1))
    ind = I(1, 2, 4, 5, 4, 3, 2, 9)
    off = I(0, 2, 2, 5) if not include_last_offset else I(0, 2, 2, 5, 8)
    psw = torch.rand(8) if mode == 0 else None
    for pad in (-1, 2):
        exp = torch.ops.aten._embedding_bag.default(w, ind, off, False, mode, False, psw, include_last_offset, pad)[0]
        got = run("aten._embedding_bag", [w, ind, off, psw],
                  {"mode": mode, "include_last_offset": include_last_offset, "padding_idx": pad})[0]
        same(got, exp, f"mode {mode} padding_idx {pad}")
    with pytest.raises(kiln.KilnError, match="aten._embedding_bag: index 10 is out of range for dim 0 of size 10"):
        run("aten._embedding_bag", [w, I(1, 10), I(0), None], {"mode": mode})


# --------------------------------------------------------------------------------------------------
# end to end: torch.export -> kiln.export -> run

class _Patterns(torch.nn.Module):
    def forward(self, x, i, j, mask, src):
        y = x.clone()
        y[i] = 5.0                        # index_put with an index tensor
        y[:, 1, 2] += 1                    # x[:, i, j] += 1 (index_put on a select/slice chain)
        y[mask] = 0.0                      # bool mask assignment (values broadcast)
        z = y.clone()
        z[i, :, j] += 2.0                  # advanced indices separated by a slice
        z.index_put_((i,), torch.ones(5), accumulate=True)
        g = torch.gather(x, 2, torch.where(j < 0, j + 5, j).view(1, 1, -1).expand(x.shape[0], x.shape[1], -1))
        s = x.clone().scatter_(1, i.view(1, -1, 1).expand(x.shape[0], -1, x.shape[2]), src)
        return y, z, g, s, x[:, i], x[i, :, j], x[..., j]


def test_export_getitem_and_index_put_patterns():
    torch.manual_seed(0)
    m = _Patterns().eval()
    x = torch.randn(3, 4, 5)
    i, j = I(2, 0), I(4, -1)
    mask = x > 0.5
    src = torch.randn(3, 2, 5)
    args = (x, i, j, mask, src)
    prog = kiln.load_bytes(kiln.export(m, args, verbose=False).data)
    outs = prog.run(*[a.numpy() for a in args])
    with torch.no_grad():
        exp = m(*args)
    assert len(outs) == len(exp)
    for k, (o, e) in enumerate(zip(outs, exp)):
        assert_close(o, e.numpy(), what=f"output {k}")


class _Misc(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(7, 3, mode="mean")

    def forward(self, x, idx, ind, off):
        a = torch.gather(x, 1, idx)
        b = x.scatter_reduce(1, idx, x[:, :2] * 2, "amax", include_self=False)
        c = torch.index_select(x, 0, idx[:, 0])
        d = x.masked_scatter(x < 0, x * 10)
        e = torch.slice_scatter(x, x[:, ::2] + 1, 1, 0, None, 2)
        f = x.index_fill(1, idx[0], -3.0)  # decomposed into index_put by torch.export
        g = x.scatter(1, idx, 2.5)         # scatter.value
        h = x.scatter(1, idx[:, :1], 4.0, reduce="multiply")
        return a, b, c, d, e, f, g, h, self.bag(ind, off)


def test_export_gather_scatter_embedding_bag():
    torch.manual_seed(0)
    m = _Misc().eval()
    x = torch.randn(4, 6)
    idx = torch.tensor([[0, 5], [1, 1], [3, 2], [2, 0]])
    ind, off = I(0, 2, 6, 1, 1), I(0, 3)
    args = (x, idx, ind, off)
    res = kiln.export(m, args, verbose=False)
    outs = kiln.load_bytes(res.data).run(*[a.numpy() for a in args])
    with torch.no_grad():
        exp = m(*args)
    for k, (o, e) in enumerate(zip(outs, exp)):
        assert_close(o, e.numpy(), what=f"output {k}")


def test_export_out_of_range_index_is_an_error():
    class M(torch.nn.Module):
        def forward(self, x, i):
            return x[:, i]
    x, i = torch.randn(2, 3), I(0, 2)
    prog = kiln.load_bytes(kiln.export(M(), (x, i), verbose=False).data)
    assert_close(prog.run(x.numpy(), i.numpy())[0], x[:, i].numpy())
    with pytest.raises(kiln.KilnError, match="aten.index: index 3 is out of range for dim 1 of size 3"):
        prog.run(x.numpy(), I(0, 3).numpy())


def test_export_bool_mask_getitem_is_refused_with_reason():
    class M(torch.nn.Module):
        def forward(self, x, m):
            return x[m]
    x = torch.randn(4)
    with pytest.raises(Exception, match="data-dependent|boolean"):
        kiln.export(M(), (x, x > 0), verbose=False)


def test_export_restores_each_submodules_mode():
    # kiln.export runs in eval mode and must give back every submodule's own train/eval flag (a
    # recursive module.train(True) on the wrapper re-enabled the dropout of an eval-mode model).
    inner = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5)).eval()
    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner
        def forward(self, x):
            return self.inner(x)
    w = Wrap()
    assert w.training and not inner[1].training
    kiln.export(w, (torch.randn(2, 3),), verbose=False)
    assert w.training and not inner.training and not inner[1].training


def test_tiny_gpt2_attention_mask_indexing_exports_and_matches_eager():
    # Hugging Face's mask construction (masking_utils) indexes with several broadcast index tensors
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits

    w = Logits().eval()
    ids = torch.randint(0, 64, (2, 7))
    out = kiln.load_bytes(kiln.export(w, (ids,), verbose=False).data).run(ids.numpy())[0]
    with torch.no_grad():
        assert_close(out, w(ids).numpy(), what="gpt2 logits")


def test_export_constant_bool_mask_assignment():
    # y[:, mask] = v with a constant mask: the capture turns the mask into integer index tensors
    # (x[mask] itself has a data-dependent size in torch.export's graph and stays refused)
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.tensor([[True, False, True], [False, False, True]]))

        def forward(self, x):
            y = x.clone()
            y[:, self.mask] = -1.0
            return (y,)
    x = torch.randn(4, 2, 3)
    outs = kiln.load_bytes(kiln.export(M(), (x,), verbose=False).data).run(x.numpy())
    for k, (o, e) in enumerate(zip(outs, M()(x))):
        assert_close(o, e.numpy(), what=f"output {k}")

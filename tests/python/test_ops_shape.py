"""Shape / data-movement ops against PyTorch eager, exact (bit for bit), for every dtype NumPy can
carry (float32, float16, int64, int32, int8, uint8, bool; bfloat16 separately as uint16 bits).

Each case runs one node through the real compiler and runtime (oprunner.run_op) and compares
with torch.ops.aten.<op> on the same data.
"""
import itertools

import numpy as np
import pytest
import torch

import kiln
from oprunner import run_op

DTYPES = [np.float32, np.float16, np.int64, np.int32, np.int8, np.uint8, np.bool_]
INT64_MAX = 2**63 - 1


def make(shape, dtype, rng):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        x = rng.random(shape) > 0.5
    elif dtype.kind == "f":
        x = rng.standard_normal(shape).astype(dtype)
    elif dtype == np.int64:
        x = rng.integers(-(2**62), 2**62, shape, dtype=np.int64)  # all 8 bytes matter
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
    return np.asarray(x)


def assert_exact(actual, expected, what=""):
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.tobytes() == np.ascontiguousarray(expected).tobytes(), f"{what}: values differ"


def check(op, inputs, attrs, expected):
    (out,) = run_op(op, inputs, attrs)
    shapes = [f"{x.dtype}{list(x.shape)}" for x in inputs]
    assert_exact(out, expected.contiguous().numpy(), what=f"{op} {shapes} {attrs}")


def T(x):
    return torch.from_numpy(np.asarray(x))


dtype_param = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)


@dtype_param
def test_view(dtype):
    rng = np.random.default_rng(10)
    cases = [
        ((2, 3, 4), [24]), ((2, 3, 4), [-1]), ((2, 3, 4), [4, -1]), ((2, 3, 4), [2, 2, 3, 2]),
        ((2, 3, 4), [-1, 1, 3]), ((5,), [1, 5, 1]), ((), [1]), ((), []), ((1, 1), []), ((), [-1]),
        ((0, 3), [-1, 3]), ((0, 3), [3, 0, 7]), ((7, 3), [3, 7]),
    ]
    for shape, size in cases:
        x = make(shape, dtype, rng)
        check("aten.view", [x], {"size": size}, torch.ops.aten.view(T(x), size))


@dtype_param
def test_permute(dtype):
    rng = np.random.default_rng(11)
    for shape in [(), (5,), (3, 4), (2, 3, 5), (2, 1, 3, 4)]:
        x = make(shape, dtype, rng)
        r = len(shape)
        for perm in itertools.permutations(range(r)):
            for dims in (list(perm), [d - r if i % 2 else d for i, d in enumerate(perm)]):
                check("aten.permute", [x], {"dims": dims}, torch.ops.aten.permute(T(x), dims))


@dtype_param
def test_transpose(dtype):
    rng = np.random.default_rng(12)
    for shape in [(), (5,), (3, 4), (2, 3, 5), (2, 1, 3, 4)]:
        x = make(shape, dtype, rng)
        r = max(len(shape), 1)
        for d0, d1 in itertools.product(range(-r, r), repeat=2):
            check("aten.transpose", [x], {"dim0": d0, "dim1": d1}, torch.ops.aten.transpose(T(x), d0, d1))


@dtype_param
def test_expand(dtype):
    rng = np.random.default_rng(13)
    cases = [
        ((3, 1), [3, 4]), ((3, 1), [-1, 5]), ((3, 1), [2, -1, 4]), ((3, 1), [2, 2, 3, 0]),
        ((1,), [7]), ((), [2, 3]), ((), []), ((2, 3), [2, 3]), ((1, 3, 1), [4, -1, 5]),
        ((2, 1, 3), [6, 2, 5, 3]), ((0, 1), [0, 4]), ((2, 3), [0, 2, 3]),
    ]
    for shape, size in cases:
        x = make(shape, dtype, rng)
        check("aten.expand", [x], {"size": size}, torch.ops.aten.expand(T(x), size))


@dtype_param
def test_slice(dtype):
    rng = np.random.default_rng(14)
    starts = [None, -100, -3, 0, 2, 5, 100]
    ends = [None, -100, -1, 3, 6, 100, INT64_MAX]
    steps = [1, 2, 3, 7]
    for shape in [(7,), (4, 9), (3, 5, 6)]:
        x = make(shape, dtype, rng)
        r = len(shape)
        for dim in range(-r, r):
            for start, end, step in itertools.product(starts, ends, steps):
                ref = torch.ops.aten.slice(T(x), dim, start, end, step)
                check("aten.slice", [x], {"dim": dim, "start": start, "end": end, "step": step}, ref)


def test_slice_defaults():
    x = make((4, 5), np.float32, np.random.default_rng(15))
    check("aten.slice", [x], {}, torch.ops.aten.slice(T(x)))
    check("aten.slice", [x], {"dim": 1, "start": 1}, torch.ops.aten.slice(T(x), 1, 1))
    x0 = np.zeros((0, 3), np.float32)
    check("aten.slice", [x0], {"dim": 0, "start": 1, "end": 5}, torch.ops.aten.slice(T(x0), 0, 1, 5))


@dtype_param
def test_select(dtype):
    rng = np.random.default_rng(16)
    for shape in [(5,), (3, 4), (2, 3, 5)]:
        x = make(shape, dtype, rng)
        r = len(shape)
        for dim in range(-r, r):
            n = shape[dim]
            for index in range(-n, n):
                check("aten.select", [x], {"dim": dim, "index": index}, torch.ops.aten.select(T(x), dim, index))


@dtype_param
def test_squeeze_unsqueeze(dtype):
    rng = np.random.default_rng(17)
    for shape in [(), (1,), (3,), (1, 3, 1, 4), (2, 1, 1), (1, 0, 1)]:
        x = make(shape, dtype, rng)
        r = len(shape)
        check("aten.squeeze", [x], {"dim": None}, torch.ops.aten.squeeze(T(x)))
        check("aten.squeeze", [x], {}, torch.ops.aten.squeeze(T(x)))
        dim_lists = [[]] + [[d] for d in range(-max(r, 1), max(r, 1))]
        if r >= 2:
            dim_lists += [[0, -1], list(range(r))]
        for dims in dim_lists:
            check("aten.squeeze", [x], {"dim": dims}, torch.ops.aten.squeeze.dims(T(x), dims))
        for dim in range(-(r + 1), r + 1):
            check("aten.unsqueeze", [x], {"dim": dim}, torch.ops.aten.unsqueeze(T(x), dim))


@dtype_param
def test_cat(dtype):
    rng = np.random.default_rng(18)
    base = (2, 3, 4)
    for dim in range(-3, 3):
        for count in (2, 3, 4):
            xs = []
            for k in range(count):
                shape = list(base)
                shape[dim] = [1, 3, 0, 2][k]  # one input has size 0 along dim
                xs.append(make(tuple(shape), dtype, rng))
            check("aten.cat", xs, {"dim": dim}, torch.ops.aten.cat([T(x) for x in xs], dim))
    # default dim, 1-D inputs, a single input
    xs = [make((n,), dtype, rng) for n in (3, 1, 5)]
    check("aten.cat", xs, {}, torch.ops.aten.cat([T(x) for x in xs]))
    check("aten.cat", xs[:1], {"dim": -1}, torch.ops.aten.cat([T(xs[0])], -1))


def test_cat_skips_legacy_empty_1d():
    rng = np.random.default_rng(19)
    a, b = make((2, 3), np.float32, rng), make((2, 5), np.float32, rng)
    e = np.zeros((0,), np.float32)
    check("aten.cat", [e, a, e, b], {"dim": 1}, torch.cat([T(e), T(a), T(e), T(b)], 1))
    check("aten.cat", [e, e], {"dim": 0}, torch.cat([T(e), T(e)], 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.int8, np.bool_], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32], ids=lambda d: np.dtype(d).name)
def test_embedding(dtype, index_dtype):
    rng = np.random.default_rng(20)
    w = make((11, 5), dtype, rng)
    for shape in [(), (7,), (3, 4), (2, 0), (2, 3, 2)]:
        idx = np.asarray(rng.integers(0, 11, shape).astype(index_dtype))
        ref = torch.ops.aten.embedding(T(w), T(idx).long() if index_dtype == np.int32 else T(idx))
        for attrs in ({}, {"padding_idx": 3, "scale_grad_by_freq": False, "sparse": False}):
            check("aten.embedding", [w, idx], attrs, ref)
    # weight as a constant, as it is in a real model
    idx = np.array([[10, 0], [4, 4]], index_dtype)
    (out,) = run_op("aten.embedding", [w, idx], {}, constants=(0,))
    assert_exact(out, torch.ops.aten.embedding(T(w), T(idx).long()).numpy(), "constant weight")


@pytest.mark.parametrize("bad", [11, 12, -1, 2**40])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32], ids=lambda d: np.dtype(d).name)
def test_embedding_out_of_range_index_is_error_at_execute(bad, index_dtype):
    if index_dtype == np.int32 and bad == 2**40:
        bad = 2**31 - 1
    w = np.ones((11, 4), np.float32)
    idx = np.array([0, 3, bad, 1], index_dtype)
    with pytest.raises(kiln.KilnError) as e:
        run_op("aten.embedding", [w, idx], {})
    assert e.value.args[1] == "InvalidArgument"
    assert "out of range" in e.value.args[0] and str(bad) in e.value.args[0], e.value.args[0]


@dtype_param
def test_constant_pad_nd(dtype):
    rng = np.random.default_rng(21)
    cases = [
        ((5,), [2, 3]), ((5,), [-2, 1]), ((5,), [0, -5]), ((5,), [-5, 0]), ((5,), [-4, -1]),
        ((3, 4), [1, 1]), ((3, 4), [1, 2, 3, 0]), ((3, 4), [-1, 2, 0, -2]), ((3, 4), [-4, 1, 1, 1]),
        ((2, 3, 4), [1, 0, -1, 2, 2, -1]), ((2, 3, 4), []), ((2, 3, 4), [0, 0, 0, 0, 1, 1]),
        ((0, 3), [1, 1, 2, 0]), ((3, 4), [5, -4]), ((3, 4), [-1, -3, 0, 0]), ((), []),
    ]
    values = [0.0, 1.0, -2.0] if dtype in (np.float32, np.float16, np.int64, np.int32, np.int8) else [0.0, 1.0]
    if dtype in (np.float32, np.float16):
        values.append(2.5)
    if dtype in (np.int32, np.int64):
        values.append(1.7)  # truncated toward zero, as torch does
    if dtype == np.bool_:
        values.append(0.5)  # any nonzero value is True
    for (shape, pad), value in itertools.product(cases, values):
        x = make(shape, dtype, rng)
        ref = torch.ops.aten.constant_pad_nd(T(x), pad, value)
        check("aten.constant_pad_nd", [x], {"pad": pad, "value": value}, ref)
    x = make((2, 3), dtype, rng)
    check("aten.constant_pad_nd", [x], {"pad": [1, 2]}, torch.ops.aten.constant_pad_nd(T(x), [1, 2]))


def test_bfloat16_data_movement():
    """bfloat16 crosses the binding as uint16 bit patterns; every op here only moves bits."""
    rng = np.random.default_rng(22)
    t = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    bits = t.view(torch.int16).numpy().view(np.uint16)
    cases = [
        ("aten.permute", {"dims": [2, 0, 1]}, torch.ops.aten.permute(t, [2, 0, 1])),
        ("aten.slice", {"dim": -1, "start": 1, "end": None, "step": 2}, torch.ops.aten.slice(t, -1, 1, None, 2)),
        ("aten.expand", {"size": [2, 2, 3, 4]}, torch.ops.aten.expand(t, [2, 2, 3, 4])),
        ("aten.constant_pad_nd", {"pad": [1, -1], "value": 1.5}, torch.ops.aten.constant_pad_nd(t, [1, -1], 1.5)),
        ("aten.select", {"dim": 1, "index": -1}, torch.ops.aten.select(t, 1, -1)),
    ]
    for op, attrs, ref in cases:
        g = kiln.Graph()
        x = g.add_input("x", "bfloat16", [2, 3, 4])
        (o,) = g.add_node(op, [x], attrs)
        g.set_outputs([o])
        pb = kiln.ProgramBuilder()
        pb.add_method("forward", g)
        data, _ = pb.compile()
        (out,) = kiln.load_bytes(data).run(bits)
        expected = ref.contiguous().view(torch.int16).numpy().view(np.uint16)
        assert_exact(out, expected, op)
    del rng


# ---- invalid arguments: rejected when the node is added, with a message naming the problem ----

def build_error(op, inputs, attrs):
    g = kiln.Graph()
    ids = [g.add_input(f"x{i}", dt, list(shape)) for i, (dt, shape) in enumerate(inputs)]
    with pytest.raises(kiln.KilnError) as e:
        g.add_node(op, ids, attrs)
    return str(e.value)


F = "float32"


@pytest.mark.parametrize(
    "op,inputs,attrs,needle",
    [
        ("aten.view", [(F, [2, 3])], {"size": [4, 2]}, "numel mismatch"),
        ("aten.view", [(F, [2, 3])], {"size": [-1, 4]}, "numel mismatch"),
        ("aten.view", [(F, [2, 3])], {"size": [-1, -1]}, "only one dimension can be inferred"),
        ("aten.view", [(F, [2, 3])], {"size": [-2, -3]}, "invalid shape dimension"),
        ("aten.view", [(F, [0, 3])], {"size": [-1, 0]}, "ambiguous"),
        ("aten.view", [(F, [2, 3])], {"size": [2**40, 2**40, 2**40]}, "too large"),
        ("aten.permute", [(F, [2, 3, 4])], {"dims": [0, 1, 1]}, "repeated"),
        ("aten.permute", [(F, [2, 3, 4])], {"dims": [0, -3, 2]}, "repeated"),
        ("aten.permute", [(F, [2, 3, 4])], {"dims": [0, 1]}, "does not match the input rank"),
        ("aten.permute", [(F, [2, 3, 4])], {"dims": [0, 1, 3]}, "out of range"),
        ("aten.transpose", [(F, [2, 3])], {"dim0": 0, "dim1": 2}, "out of range"),
        ("aten.transpose", [(F, [2, 3])], {"dim0": -3, "dim1": 0}, "out of range"),
        ("aten.expand", [(F, [2, 3])], {"size": [3]}, "greater or equal"),
        ("aten.expand", [(F, [2, 3])], {"size": [4, 3]}, "must match the existing size"),
        ("aten.expand", [(F, [2, 3])], {"size": [-1, 2, 3]}, "leading, non-existing"),
        ("aten.expand", [(F, [1, 3])], {"size": [-2, 3]}, "invalid expanded size"),
        ("aten.slice", [(F, [2, 3])], {"dim": 2}, "out of range"),
        ("aten.slice", [(F, [2, 3])], {"dim": 0, "step": 0}, "step must be positive"),
        ("aten.slice", [(F, [2, 3])], {"dim": 0, "step": -1}, "step must be positive"),
        ("aten.slice", [(F, [])], {"dim": 0}, "0-dim"),
        ("aten.select", [(F, [2, 3])], {"dim": 1, "index": 3}, "out of range"),
        ("aten.select", [(F, [2, 3])], {"dim": 1, "index": -4}, "out of range"),
        ("aten.select", [(F, [2, 3])], {"dim": -3, "index": 0}, "out of range"),
        ("aten.select", [(F, [])], {"dim": 0, "index": 0}, "0-dim"),
        ("aten.squeeze", [(F, [1, 3])], {"dim": [2]}, "out of range"),
        ("aten.squeeze", [(F, [1, 3])], {"dim": [0, -2]}, "multiple times"),
        ("aten.unsqueeze", [(F, [2, 3])], {"dim": 3}, "out of range"),
        ("aten.unsqueeze", [(F, [2, 3])], {"dim": -4}, "out of range"),
        ("aten.cat", [(F, [2, 3]), (F, [2, 4])], {"dim": 0}, "sizes must match except in dimension 0"),
        ("aten.cat", [(F, [2, 3]), ("int64", [2, 3])], {"dim": 0}, "same dtype"),
        ("aten.cat", [(F, [2, 3]), (F, [2, 3, 1])], {"dim": 0}, "rank"),
        ("aten.cat", [(F, [2, 3]), (F, [2, 3])], {"dim": 2}, "out of range"),
        ("aten.cat", [(F, []), (F, [2])], {"dim": 0}, "zero-dimensional"),
        ("aten.embedding", [(F, [4, 3]), (F, [2])], {}, "int64 or int32"),
        ("aten.embedding", [(F, [4, 3, 1]), ("int64", [2])], {}, "2-D"),
        ("aten.constant_pad_nd", [(F, [2, 3])], {"pad": [1]}, "even"),
        ("aten.constant_pad_nd", [(F, [2, 3])], {"pad": [1, 1, 1, 1, 1, 1]}, "too large for an input of rank 2"),
        ("aten.constant_pad_nd", [(F, [2, 3])], {"pad": [-2, -2]}, "would crop more than its size"),
        ("aten.constant_pad_nd", [(F, [2, 4])], {"pad": [5, -7]}, "would crop more than its size"),
        ("aten.constant_pad_nd", [(F, [2, 4])], {"pad": [-2**63, 0]}, "would crop more than its size"),
        ("aten.constant_pad_nd", [(F, [2, 3])], {"pad": [2**62, 2**62]}, "too large"),
        ("aten.constant_pad_nd", [("int8", [2, 3])], {"pad": [1, 1], "value": 300.0}, "without overflow"),
        ("aten.constant_pad_nd", [("int32", [2, 3])], {"pad": [1, 1], "value": float("nan")}, "without overflow"),
    ],
)
def test_invalid_arguments_rejected_at_build(op, inputs, attrs, needle):
    msg = build_error(op, inputs, attrs)
    assert op in msg and needle in msg, msg


def test_cat_needs_a_tensor():
    g = kiln.Graph()
    with pytest.raises(kiln.KilnError, match="at least one tensor"):
        g.add_node("aten.cat", [], {"dim": 0})

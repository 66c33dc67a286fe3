"""The xnnpack delegate (src/backends/xnnpack/) against PyTorch eager.

Each test builds a small graph with kiln.Graph, compiles it with backends=["xnnpack"], checks from
the delegation report that the nodes were delegated (or declined with the expected reason) and
compares the run with torch eager. fp32 tolerance: max abs error <= 1e-5 * max|expected|.
"""
import os

import numpy as np
import pytest
import torch

import kiln
from delegate_util import add_const, compile_graph, declined_reasons, segment
from delegate_util import check_all_delegated as check_all
from oprunner import assert_close

A = torch.ops.aten
torch.set_num_threads(1)

pytestmark = pytest.mark.skipif("xnnpack" not in kiln._kiln.backend_names(),
                                reason="the xnnpack backend is not built (libxnnpack-dev/libpthreadpool-dev missing)")


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _const(g, name, arr):
    return add_const(g, name, arr, np.float32)


def compile_run(build, feeds, backends=("xnnpack",), **opts):
    """build(g, input_ids) -> output ids. Returns (outputs, delegation report, report text)."""
    outs, delegation, _, text = compile_graph(build, feeds, backends, **opts)
    return outs, delegation, text


def xnn(delegation):
    return segment(delegation, "xnnpack")


def check_all_delegated(delegation, nodes=None):
    check_all(delegation, "xnnpack", nodes)


def reasons(delegation, op):
    return declined_reasons(delegation, op, "xnnpack")


CONV_CASES = [
    # (input shape, out channels, kernel, stride, padding, dilation, groups, bias)
    ((1, 3, 9, 9), 8, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    ((2, 4, 10, 7), 6, (3, 2), (2, 1), (0, 1), (1, 1), 1, False),
    ((1, 8, 12, 12), 8, (3, 3), (2, 2), (1, 1), (1, 1), 8, True),     # depthwise
    ((1, 8, 12, 12), 8, (3, 3), (1, 1), (2, 2), (2, 2), 8, True),     # depthwise, dilation 2
    ((1, 4, 11, 11), 8, (5, 5), (2, 2), (2, 2), (1, 1), 4, False),    # depthwise, multiplier 2
    ((1, 6, 8, 8), 9, (1, 1), (1, 1), (0, 0), (1, 1), 3, True),       # grouped 1x1
    ((1, 4, 9, 9), 5, (3, 3), (1, 2), (1, 0), (2, 1), 1, True),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_convolution(case):
    shape, cout, k, s, p, d, groups, bias = case
    x = _rand(*shape, seed=1)
    w = _rand(cout, shape[1] // groups, *k, seed=2)
    b = _rand(cout, seed=3) if bias else None
    attrs = dict(stride=list(s), padding=list(p), dilation=list(d), transposed=False, output_padding=[0, 0], groups=groups)

    def build(g, ids):
        return g.add_node("aten.convolution", [ids[0], _const(g, "w", w), _const(g, "b", b) if bias else -1], attrs)

    (out,), dl, _ = compile_run(build, [x])
    check_all_delegated(dl, nodes=1)
    ref = A.convolution(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b) if bias else None,
                        list(s), list(p), list(d), False, [0, 0], groups).numpy()
    assert_close(out, ref, 1e-5, "conv")


def test_transposed_convolution_is_declined_with_reason():
    x = _rand(1, 2, 4, 4)
    w = _rand(2, 3, 3, 3)
    attrs = dict(stride=[1, 1], padding=[0, 0], dilation=[1, 1], transposed=True, output_padding=[0, 0], groups=1)
    g = kiln.Graph()
    xi = g.add_input("x", "float32", list(x.shape))
    (y,) = g.add_node("aten.convolution", [xi, _const(g, "w", w), -1], attrs)
    g.set_outputs([y])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    try:
        _, rep = pb.compile(backends=["xnnpack"])
    except kiln.KilnError as e:  # no CPU kernel for transposed conv in this build is fine too
        pytest.skip(f"transposed convolution does not compile here: {e}")
    dl = rep["methods"][0]["delegation"]
    assert xnn(dl)["segments"] == 0
    assert any("transposed" in r for r in reasons(dl, "aten.convolution")), dl


@pytest.mark.parametrize("op", ["aten.add", "aten.mul", "aten.sub", "aten.div"])
@pytest.mark.parametrize("shapes", [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (1, 3, 1, 1)),
                                    ((2, 3, 4, 5), (2, 3, 1, 5)), ((4, 7), (7,)), ((3, 1, 5), (4, 1))])
def test_binary(op, shapes):
    a, b = _rand(*shapes[0], seed=4), _rand(*shapes[1], seed=5)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node(op, ids, {}), [a, b])
    check_all_delegated(dl, nodes=1)
    fn = {"aten.add": A.add, "aten.mul": A.mul, "aten.sub": A.sub, "aten.div": A.div}[op]
    ref = fn(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert_close(out, ref, 1e-5, op)


def test_binary_with_constant_nchw_operand():
    # A rank-4 constant is permuted to NHWC inside the delegate like the activation.
    x = _rand(1, 3, 4, 5, seed=6)
    c = _rand(1, 3, 4, 1, seed=7)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.mul", [ids[0], _const(g, "c", c)], {}), [x])
    check_all_delegated(dl)
    assert_close(out, x * c, 1e-6, "mul const")


def test_binary_with_constant_low_rank_operand():
    # Non-rank-4 constants used as operands are copied into padded buffers at init.
    x = _rand(4, 7, seed=33)
    c = _rand(7, seed=34)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.add", [_const(g, "c", c), ids[0]], {}), [x])
    check_all_delegated(dl)
    assert_close(out, c + x, 1e-6, "add const")


def test_add_alpha_is_declined_with_reason():
    a, b = _rand(2, 3, seed=8), _rand(2, 3, seed=9)
    (out,), dl, text = compile_run(lambda g, ids: g.add_node("aten.add", ids, {"alpha": 10.0}), [a, b])
    assert xnn(dl)["segments"] == 0
    (r,) = reasons(dl, "aten.add")
    assert "alpha=10" in r, r
    assert "alpha=10" in text
    assert_close(out, A.add(torch.from_numpy(a), torch.from_numpy(b), alpha=10).numpy(), 1e-6, "add alpha")


@pytest.mark.parametrize("op,attrs,want", [("aten.sub", {"alpha": 2.0}, "alpha=2"),
                                           ("aten.div", {"rounding_mode": "floor"}, "rounding_mode='floor'"),
                                           ("aten.div", {"rounding_mode": "trunc"}, "rounding_mode='trunc'")])
def test_sub_div_attributes_declined_with_reason(op, attrs, want):
    a, b = _rand(2, 3, 4, 5, seed=8), _rand(2, 3, 4, 5, seed=9) + 3
    (out,), dl, text = compile_run(lambda g, ids: g.add_node(op, ids, attrs), [a, b])
    assert xnn(dl)["segments"] == 0
    (r,) = reasons(dl, op)
    assert want in r and want in text, r
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    ref = A.sub(ta, tb, alpha=2.0) if op == "aten.sub" else A.div(ta, tb, rounding_mode=attrs["rounding_mode"])
    assert_close(out, ref.numpy(), 1e-6, op)


@pytest.mark.parametrize("shape,dim", [((4, 10), -1), ((4, 10), 1), ((2, 3, 7), 2), ((2, 5, 3, 4), 1),
                                       ((2, 5, 3, 4), -3), ((9,), 0)])
def test_softmax(shape, dim):
    # Rank 4 is NHWC inside the delegate: softmax over the channels (dim 1) is its innermost dim.
    x = _rand(*shape, seed=40) * 3
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten._softmax", ids, {"dim": dim}), [x])
    check_all_delegated(dl, nodes=1)
    assert_close(out, A._softmax(torch.from_numpy(x), dim, False).numpy(), 1e-5, "softmax")


@pytest.mark.parametrize("shape,dim", [((4, 10), 0), ((2, 5, 3, 4), 3), ((2, 3, 7), 1)])
def test_softmax_over_other_dims_is_declined(shape, dim):
    x = _rand(*shape, seed=41)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten._softmax", ids, {"dim": dim}), [x])
    assert xnn(dl)["segments"] == 0
    (r,) = reasons(dl, "aten._softmax")
    assert "innermost" in r, r
    assert_close(out, A._softmax(torch.from_numpy(x), dim, False).numpy(), 1e-5, "softmax")


@pytest.mark.parametrize("shape,pad,value", [((1, 3, 5, 6), [1, 2], 0.0), ((1, 3, 5, 6), [1, 0, 2, 3], -1.5),
                                             ((2, 3, 4, 4), [0, 1, 1, 0, 2, 1], 0.25),
                                             ((2, 3, 4, 4), [1, 1, 1, 1, 0, 0, 1, 0], 0.0),
                                             ((3, 7), [2, 1], 5.0), ((2, 3, 7), [0, 0, 3, 1], 0.0)])
def test_constant_pad(shape, pad, value):
    x = _rand(*shape, seed=42)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.constant_pad_nd", ids, {"pad": pad, "value": value}),
                                [x])
    check_all_delegated(dl, nodes=1)
    assert_close(out, A.constant_pad_nd(torch.from_numpy(x), pad, value).numpy(), 1e-6, "pad")


def test_constant_pad_crop_is_declined():
    x = _rand(1, 3, 5, 6, seed=43)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.constant_pad_nd", ids, {"pad": [1, -2]}), [x])
    assert xnn(dl)["segments"] == 0
    assert "negative padding" in reasons(dl, "aten.constant_pad_nd")[0]
    assert_close(out, A.constant_pad_nd(torch.from_numpy(x), [1, -2]).numpy(), 1e-6, "crop")


@pytest.mark.parametrize("op,attrs", [("aten.permute", {"dims": [0, 2, 3, 1]}),
                                      ("aten.transpose", {"dim0": 1, "dim1": 2})])
def test_transpose_ops_declined_with_reason(op, attrs):
    x = _rand(1, 3, 4, 5, seed=44)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node(op, ids, attrs), [x])
    assert xnn(dl)["segments"] == 0
    assert "no static transpose or concatenate" in reasons(dl, op)[0]


def test_cat_declined_with_reason():
    a, b = _rand(1, 3, 4, 5, seed=45), _rand(1, 2, 4, 5, seed=46)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.cat", ids, {"dim": 1}), [a, b])
    assert xnn(dl)["segments"] == 0
    assert "no static transpose or concatenate" in reasons(dl, "aten.cat")[0]
    assert_close(out, np.concatenate([a, b], 1), 0, "cat")


@pytest.mark.parametrize("shape,affine", [((2, 5, 4, 3), True), ((2, 5, 4, 3), False), ((3, 5), True),
                                          ((2, 5, 7), True)])
def test_unfolded_batch_norm(shape, affine):
    # A batch norm after an add (nothing to fold it into) is lowered as a per-channel multiply-add.
    rng = np.random.default_rng(47)
    c = shape[1]
    a, b = _rand(*shape, seed=48), _rand(*shape, seed=49)
    w, bias = rng.random(c).astype(np.float32) + 0.5, rng.standard_normal(c).astype(np.float32)
    mean, var = rng.standard_normal(c).astype(np.float32), rng.random(c).astype(np.float32) + 0.1

    def build(g, ids):
        (s,) = g.add_node("aten.add", ids, {})
        ins = [s, _const(g, "w", w) if affine else -1, _const(g, "b", bias) if affine else -1,
               _const(g, "m", mean), _const(g, "v", var)]
        return g.add_node("aten.native_batch_norm", ins, {"training": False, "eps": 1e-3})

    (out,), dl, _ = compile_run(build, [a, b])
    check_all_delegated(dl, nodes=2)
    t = lambda v: torch.from_numpy(v) if v is not None else None  # noqa: E731
    ref = torch.nn.functional.batch_norm(t(a) + t(b), t(mean), t(var), t(w) if affine else None,
                                         t(bias) if affine else None, False, 0.1, 1e-3).numpy()
    assert_close(out, ref, 1e-5, "bn")


def test_rank4_broadcast_against_lower_rank_is_declined():
    a, b = _rand(1, 3, 2, 4, seed=10), _rand(4, seed=11)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.add", ids, {}), [a, b])
    assert xnn(dl)["segments"] == 0
    assert any("rank-4" in r for r in reasons(dl, "aten.add")), dl
    assert_close(out, a + b, 1e-6, "add bcast")


@pytest.mark.parametrize("scalar_shape,as_input", [((), False), ((1,), False), ((1, 1, 1), False), ((), True)])
@pytest.mark.parametrize("op", ["aten.add", "aten.mul", "aten.sub", "aten.div"])
def test_rank4_against_one_element_operand_is_delegated(op, scalar_shape, as_input):
    # A one-element operand broadcasts the same in NCHW and NHWC, so the delegate takes it (the
    # scalar constants of ONNX HardSigmoid/Clip decompositions, e.g. PP-OCR's).
    x = _rand(2, 3, 4, 5, seed=40)
    c = np.full(scalar_shape, 0.75, np.float32)
    if as_input:
        (out,), dl, _ = compile_run(lambda g, ids: g.add_node(op, [ids[0], ids[1]], {}), [x, c])
    else:
        (out,), dl, _ = compile_run(lambda g, ids: g.add_node(op, [_const(g, "c", c), ids[0]], {}), [x])
    check_all_delegated(dl, nodes=1)
    fn = {"aten.add": A.add, "aten.mul": A.mul, "aten.sub": A.sub, "aten.div": A.div}[op]
    ref = (fn(torch.from_numpy(x), torch.from_numpy(c)) if as_input else fn(torch.from_numpy(c), torch.from_numpy(x)))
    assert_close(out, ref.numpy(), 1e-6, op)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_segments_share_one_thread_pool():
    # 12 xnnpack segments separated by nodes it declines (add with alpha), run at 2 threads: the
    # segments share one pthreadpool, so loading adds a handful of threads, not one pool per segment.
    x = _rand(1, 4, 6, 6, seed=41)

    def build(g, ids):
        v = ids[0]
        for _ in range(12):
            (v,) = g.add_node("aten.relu", [v], {})
            (v,) = g.add_node("aten.add", [v, ids[0]], {"alpha": 0.5})
        return [v]
    g = kiln.Graph()
    xid = g.add_input("x", "float32", list(x.shape))
    g.set_outputs(build(g, [xid]))
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, rep = pb.compile(backends=["xnnpack"])
    assert xnn(rep["methods"][0]["delegation"])["segments"] == 12
    before = _threads()
    prog = kiln.load_bytes(data, num_threads=2)
    (out,) = prog.run(x)
    during = _threads()
    ref = torch.from_numpy(x)
    v = ref
    for _ in range(12):
        v = A.relu(v) + 0.5 * ref
    assert_close(out, v.numpy(), 1e-5, "segments")
    assert during - before <= 4, (before, during)
    del prog


UNARY = [
    ("aten.relu", {}, lambda t: A.relu(t)),
    ("aten.hardtanh", {}, lambda t: A.hardtanh(t)),
    ("aten.hardtanh", {"min_val": 0.0, "max_val": 6.0}, lambda t: A.hardtanh(t, 0.0, 6.0)),
    ("aten.clamp", {"min": -0.5}, lambda t: A.clamp(t, min=-0.5)),
    ("aten.clamp", {"min": -0.5, "max": 0.25}, lambda t: A.clamp(t, -0.5, 0.25)),
    ("aten.clamp", {"max": 0.3}, lambda t: A.clamp(t, max=0.3)),
    ("aten.hardswish", {}, lambda t: A.hardswish(t)),
    ("aten.hardsigmoid", {}, lambda t: A.hardsigmoid(t)),
    ("aten.sigmoid", {}, lambda t: A.sigmoid(t)),
    ("aten.silu", {}, lambda t: A.silu(t)),
    ("aten.leaky_relu", {}, lambda t: A.leaky_relu(t)),
    ("aten.leaky_relu", {"negative_slope": 0.2}, lambda t: A.leaky_relu(t, 0.2)),
    ("aten.leaky_relu", {"negative_slope": -1.5}, lambda t: A.leaky_relu(t, -1.5)),
]


@pytest.mark.parametrize("op,attrs,ref", UNARY, ids=[f"{u[0]}{i}" for i, u in enumerate(UNARY)])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (7, 9)])
def test_unary(op, attrs, ref, shape):
    x = _rand(*shape, seed=12) * 4
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node(op, ids, attrs), [x])
    check_all_delegated(dl)
    assert_close(out, ref(torch.from_numpy(x)).numpy(), 1e-5, op)


@pytest.mark.parametrize("dim,keepdim", [([2, 3], True), ([-1, -2], True), ([2, 3], False)])
def test_mean_global_average(dim, keepdim):
    x = _rand(2, 5, 6, 7, seed=13)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.mean", ids, {"dim": dim, "keepdim": keepdim}), [x])
    check_all_delegated(dl)
    assert_close(out, A.mean(torch.from_numpy(x), dim, keepdim).numpy(), 1e-5, "mean")


def test_mean_over_channels_is_declined():
    x = _rand(2, 5, 6, 7, seed=13)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.mean", ids, {"dim": [1], "keepdim": True}), [x])
    assert xnn(dl)["segments"] == 0 and reasons(dl, "aten.mean"), dl
    assert_close(out, A.mean(torch.from_numpy(x), [1], True).numpy(), 1e-5, "mean c")


@pytest.mark.parametrize("out_size", [[1, 1], [2, 3]])
def test_adaptive_avg_pool(out_size):
    x = _rand(1, 4, 6, 9, seed=14)
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.adaptive_avg_pool2d", ids, {"output_size": out_size}), [x])
    check_all_delegated(dl)
    assert_close(out, A.adaptive_avg_pool2d(torch.from_numpy(x), out_size).numpy(), 1e-5, "adaptive")


MAXPOOL = [
    dict(kernel_size=[3, 3], stride=[2, 2], padding=[1, 1], dilation=[1, 1], ceil_mode=False),
    dict(kernel_size=[3, 3], stride=[2, 2], padding=[0, 0], dilation=[1, 1], ceil_mode=True),
    dict(kernel_size=[3, 3], stride=[2, 2], padding=[1, 1], dilation=[1, 1], ceil_mode=True),
    dict(kernel_size=[2, 3], stride=[2, 1], padding=[1, 0], dilation=[2, 1], ceil_mode=True),
    dict(kernel_size=[2, 2], stride=[], padding=[0], dilation=[1], ceil_mode=False),
]


@pytest.mark.parametrize("attrs", MAXPOOL, ids=[str(i) for i in range(len(MAXPOOL))])
@pytest.mark.parametrize("hw", [(8, 8), (9, 10)])
def test_max_pool(attrs, hw):
    x = _rand(2, 3, *hw, seed=15) - 3.0  # mostly negative: padding must never win
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.max_pool2d", ids, attrs), [x])
    check_all_delegated(dl)
    ref = A.max_pool2d(torch.from_numpy(x), attrs["kernel_size"], attrs["stride"], attrs["padding"],
                       attrs["dilation"], attrs["ceil_mode"]).numpy()
    assert_close(out, ref, 1e-6, "maxpool")


def test_avg_pool_and_declined_padding():
    x = _rand(1, 3, 8, 10, seed=16)
    attrs = dict(kernel_size=[2, 2], stride=[2, 2], padding=[0, 0])
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.avg_pool2d", ids, attrs), [x])
    check_all_delegated(dl)
    assert_close(out, A.avg_pool2d(torch.from_numpy(x), [2, 2], [2, 2]).numpy(), 1e-6, "avgpool")
    attrs = dict(kernel_size=[3, 3], stride=[2, 2], padding=[1, 1])
    (out,), dl, _ = compile_run(lambda g, ids: g.add_node("aten.avg_pool2d", ids, attrs), [x])
    assert xnn(dl)["segments"] == 0
    assert any("padding" in r for r in reasons(dl, "aten.avg_pool2d")), dl
    assert_close(out, A.avg_pool2d(torch.from_numpy(x), [3, 3], [2, 2], [1, 1]).numpy(), 1e-5, "avgpool pad")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 16), (2, 4, 16)])
def test_linear(bias, shape):
    x, w, b = _rand(*shape, seed=17), _rand(10, 16, seed=18), _rand(10, seed=19)
    (out,), dl, _ = compile_run(
        lambda g, ids: g.add_node("aten.linear", [ids[0], _const(g, "w", w), _const(g, "b", b) if bias else -1], {}), [x])
    check_all_delegated(dl)
    ref = A.linear(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b) if bias else None).numpy()
    assert_close(out, ref, 1e-5, "linear")


def test_addmm():
    x, w, b = _rand(3, 16, seed=20), _rand(16, 10, seed=21), _rand(10, seed=22)
    (out,), dl, _ = compile_run(
        lambda g, ids: g.add_node("aten.addmm", [_const(g, "b", b), ids[0], _const(g, "w", w)], {}), [x])
    check_all_delegated(dl)
    assert_close(out, A.addmm(torch.from_numpy(b), torch.from_numpy(x), torch.from_numpy(w)).numpy(), 1e-5, "addmm")


def test_classifier_head_is_one_segment():
    # conv -> hardswish -> global average pool (keepdim) -> view -> linear -> relu: one segment.
    x = _rand(2, 3, 10, 10, seed=23)
    w = _rand(8, 3, 3, 3, seed=24)
    fw, fb = _rand(5, 8, seed=25), _rand(5, seed=26)

    def build(g, ids):
        (c,) = g.add_node("aten.convolution", [ids[0], _const(g, "w", w), -1],
                          dict(stride=[2, 2], padding=[1, 1], dilation=[1, 1], transposed=False, output_padding=[0, 0],
                               groups=1))
        (h,) = g.add_node("aten.hardswish", [c])
        (p,) = g.add_node("aten.mean", [h], {"dim": [2, 3], "keepdim": True})
        (v,) = g.add_node("aten.view", [p], {"size": [2, 8]})
        (l,) = g.add_node("aten.linear", [v, _const(g, "fw", fw), _const(g, "fb", fb)])
        return g.add_node("aten.relu", [l])

    (out,), dl, _ = compile_run(build, [x])
    check_all_delegated(dl, nodes=6)
    t = A.convolution(torch.from_numpy(x), torch.from_numpy(w), None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    t = A.relu(A.linear(A.hardswish(t).mean([2, 3]), torch.from_numpy(fw), torch.from_numpy(fb)))
    assert_close(out, t.numpy(), 1e-5, "head")


class _Mixed(torch.nn.Module):
    """add(x, y, alpha=10), max pool with ceil_mode, depthwise conv with dilation 2."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.dw = torch.nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=4)
        self.pool = torch.nn.MaxPool2d(3, stride=2, ceil_mode=True)

    def forward(self, x, y):
        return self.dw(self.pool(torch.add(x, y, alpha=10)))


def test_mixed_module_matches_eager_with_reasons():
    m = _Mixed().eval()
    x, y = _rand(1, 4, 10, 10, seed=27), _rand(1, 4, 10, 10, seed=28)
    w = m.dw.weight.detach().numpy()
    b = m.dw.bias.detach().numpy()

    def build(g, ids):
        (a,) = g.add_node("aten.add", ids, {"alpha": 10.0}, "add")
        (p,) = g.add_node("aten.max_pool2d", [a], dict(kernel_size=[3, 3], stride=[2, 2], padding=[0, 0],
                                                        dilation=[1, 1], ceil_mode=True), "pool")
        return g.add_node("aten.convolution", [p, _const(g, "w", w), _const(g, "b", b)],
                          dict(stride=[1, 1], padding=[2, 2], dilation=[2, 2], transposed=False,
                               output_padding=[0, 0], groups=4), "dw")

    (out,), dl, text = compile_run(build, [x, y])
    with torch.no_grad():
        ref = m(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    assert_close(out, ref, 1e-5, "mixed")
    # add(alpha=10) is declined with its reason; pool and depthwise conv are one segment.
    assert xnn(dl)["segments"] == 1 and xnn(dl)["nodes"] == 2, dl
    assert [c["op"] for c in dl["cpu_ops"]] == ["aten.add"]
    assert "alpha=10" in reasons(dl, "aten.add")[0]
    assert "aten.add x1" in text

    g = kiln.Graph()
    ids = [g.add_input(f"x{i}", "float32", [1, 4, 10, 10]) for i in range(2)]
    g.set_outputs(list(build(g, ids)))
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    with pytest.raises(kiln.KilnError) as e:
        pb.compile(require_delegation="xnnpack")
    msg = str(e.value)
    assert "aten.add (add)" in msg and "alpha=10" in msg and "pool" not in msg.split("xnnpack':")[1], msg


def test_corrupted_payload_words_give_errors_not_crashes():
    # Every 32-bit word of a real payload is replaced by hostile values in turn; loading and
    # running must either work or raise KilnError (init re-infers shapes before XNNPACK sees them).
    x = _rand(1, 3, 8, 8, seed=29)
    w = _rand(4, 3, 3, 3, seed=30)
    fw = _rand(2, 4, seed=31)
    g = kiln.Graph()
    xi = g.add_input("x", "float32", list(x.shape))
    (c,) = g.add_node("aten.convolution", [xi, _const(g, "w", w), -1],
                      dict(stride=[2, 2], padding=[1, 1], dilation=[1, 1], transposed=False, output_padding=[0, 0],
                           groups=1))
    (p,) = g.add_node("aten.max_pool2d", [c], dict(kernel_size=[2, 2], stride=[2, 2], ceil_mode=True))
    (m,) = g.add_node("aten.mean", [p], {"dim": [2, 3], "keepdim": False})
    (y,) = g.add_node("aten.linear", [m, _const(g, "fw", fw), -1])
    g.set_outputs([y])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, rep = pb.compile(backends=["xnnpack"])
    assert xnn(rep["methods"][0]["delegation"])["segments"] == 1
    start = data.find(b"KXN1")
    assert start > 0 and start % 4096 == 0
    good = kiln.load_bytes(data).run(x)[0]
    end = len(data)
    outcomes = {"error": 0, "ran": 0}
    for off in range(start, end, 4):
        for value in (0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 3):
            bad = bytearray(data)
            bad[off:off + 4] = value.to_bytes(4, "little")
            try:
                out = kiln.load_bytes(bytes(bad)).run(x)[0]
                assert out.shape == good.shape
                outcomes["ran"] += 1
            except kiln.KilnError:
                outcomes["error"] += 1
    assert outcomes["error"] > 0 and outcomes["ran"] > 0, outcomes

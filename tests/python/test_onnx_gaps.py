"""ONNX attributes that map onto ATen-style ops: GatherND batch_dims, ScatterND / ScatterElements
reduction add/mul (duplicates accumulate in update order), CumSum exclusive/reverse, MaxPool's
Indices output, and float64 (DOUBLE) models. Reference: onnxruntime (and PyTorch eager where it
has the op)."""
from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ort = pytest.importorskip("onnxruntime")
if not kiln.onnx.available():
    pytest.skip("Kiln built without the ONNX importer", allow_module_level=True)

from oprunner import assert_close  # noqa: E402

NP_TO_ONNX = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("float64"): TensorProto.DOUBLE,
              np.dtype("int32"): TensorProto.INT32, np.dtype("int64"): TensorProto.INT64}


def model_bytes(nodes, inputs, outputs, initializers=(), opset=16):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def vi(name, a):
    return helper.make_tensor_value_info(name, NP_TO_ONNX[a.dtype], list(a.shape))


def run_both(data: bytes, feeds: dict, tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    r = kiln.onnx.compile_onnx(str(path), input_shapes={k: list(v.shape) for k, v in feeds.items()})
    got = kiln.load_bytes(r.data).run(*feeds.values())
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, want


def check(data, feeds, tmp_path, rel=1e-6):
    got, want = run_both(data, feeds, tmp_path)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        assert_close(g, w, rel=rel)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_gathernd_batch_dims_1_matches_onnxruntime(dtype, tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 4, 5, 2)) * 10).astype(dtype)
    idx = np.stack([rng.integers(-4, 4, size=(3, 6)), rng.integers(-5, 5, size=(3, 6))], -1).astype(np.int64)
    y = np.zeros(0, dtype)
    data = model_bytes([helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)],
                       [vi("x", x), vi("i", idx)], [helper.make_tensor_value_info("y", NP_TO_ONNX[y.dtype], None)])
    check(data, {"x": x, "i": idx}, tmp_path)


def test_gathernd_batch_dims_2_and_k_1(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    idx = rng.integers(0, 4, size=(2, 3, 7, 1)).astype(np.int64)
    data = model_bytes([helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=2)],
                       [vi("x", x), vi("i", idx)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    check(data, {"x": x, "i": idx}, tmp_path)


@pytest.mark.parametrize("bad", [[0, 5], [3, 0], [-4, 0], [0, -6]])
def test_gathernd_out_of_range_index_is_an_error_not_a_neighbouring_row(bad, tmp_path):
    # [0, 5] with a row length of 5 would otherwise read element [1, 0].
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    idx = np.array([[1, 1], bad], np.int64)
    data = model_bytes([helper.make_node("GatherND", ["x", "i"], ["y"])],
                       [vi("x", x), vi("i", idx)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    r = kiln.onnx.compile_onnx(str(path), input_shapes={"x": [3, 5], "i": [2, 2]})
    with pytest.raises(kiln.KilnError) as e:
        kiln.load_bytes(r.data).run(x, idx)
    assert e.value.args[1] == "InvalidArgument"


@pytest.mark.parametrize("reduction", ["add", "mul"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_scatternd_reduction_with_duplicates_matches_onnxruntime(reduction, dtype, tmp_path):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 3, 2)) * 3).astype(dtype)
    ind = np.array([[0, 1], [2, 2], [0, 1], [3, 0], [0, 1]], np.int64)  # [0, 1] three times
    u = (rng.standard_normal((5, 2)) * 3).astype(dtype)
    data = model_bytes([helper.make_node("ScatterND", ["x", "ind", "u"], ["y"], reduction=reduction)],
                       [vi("x", x), vi("u", u)], [helper.make_tensor_value_info("y", NP_TO_ONNX[x.dtype], None)],
                       [numpy_helper.from_array(ind, "ind")])
    check(data, {"x": x, "u": u}, tmp_path, rel=1e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("reduction", ["add", "mul"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_reduction_with_duplicates_matches_torch(reduction, axis, tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 5)).astype(np.float64)
    ind = rng.integers(0, 4 if axis == 0 else 5, size=(3, 4)).astype(np.int64)
    u = rng.standard_normal((3, 4)).astype(np.float64)
    data = model_bytes([helper.make_node("ScatterElements", ["x", "ind", "u"], ["y"], axis=axis, reduction=reduction)],
                       [vi("x", x), vi("u", u)], [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
                       [numpy_helper.from_array(ind, "ind")])
    got, want = run_both(data, {"x": x, "u": u}, tmp_path)
    ref = torch.from_numpy(x).scatter_reduce(axis, torch.from_numpy(ind), torch.from_numpy(u),
                                             "sum" if reduction == "add" else "prod").numpy()
    assert_close(got[0], ref, rel=1e-12)
    assert_close(got[0], want[0], rel=1e-12)


@pytest.mark.parametrize("reduction", ["max", "min"])
@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_scatter_reduction_max_min_opset18_matches_onnxruntime(op, reduction, tmp_path):
    # Opset 18 added reduction "max" / "min" (duplicates combine in update order).
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    u = rng.standard_normal((5, 3)).astype(np.float32)
    ind = (np.array([[0], [2], [0], [3], [0]], np.int64) if op == "ScatterND"
           else np.array([[0, 1, 2], [2, 2, 2], [0, 1, 1], [3, 0, 0], [0, 1, 2]], np.int64))
    data = model_bytes([helper.make_node(op, ["x", "ind", "u"], ["y"], reduction=reduction)],
                       [vi("x", x), vi("u", u)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                       [numpy_helper.from_array(ind, "ind")], opset=18)
    check(data, {"x": x, "u": u}, tmp_path)


def test_scatter_reduction_max_before_opset18_is_refused(tmp_path):
    x = np.zeros((3,), np.float32)
    data = model_bytes([helper.make_node("ScatterElements", ["x", "ind", "u"], ["y"], reduction="max")],
                       [vi("x", x), vi("u", x)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                       [numpy_helper.from_array(np.array([0, 1, 1], np.int64), "ind")], opset=16)
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    with pytest.raises(kiln.KilnError, match="reduction"):
        kiln.onnx.compile_onnx(str(path), input_shapes={"x": [3], "u": [3]})


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype,axis", [(np.float32, 1), (np.float64, 0), (np.int32, -1), (np.int64, 2)])
def test_cumsum_matches_onnxruntime(exclusive, reverse, dtype, axis, tmp_path):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 4, 5)) * 100).astype(dtype)
    data = model_bytes([helper.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)],
                       [vi("x", x)], [helper.make_tensor_value_info("y", NP_TO_ONNX[x.dtype], None)],
                       [numpy_helper.from_array(np.array(axis, np.int64), "a")])
    check(data, {"x": x}, tmp_path, rel=1e-6 if dtype == np.float32 else 1e-12)


def test_float64_model_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 7))
    w = numpy_helper.from_array(rng.standard_normal((7,)), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]),
             helper.make_node("Sigmoid", ["m"], ["s"]),
             helper.make_node("ReduceLogSumExp", ["s"], ["r"], axes=[1], keepdims=1),
             helper.make_node("Sub", ["s", "r"], ["d"]),
             helper.make_node("Softmax", ["d"], ["y"], axis=-1),
             helper.make_node("Cast", ["y"], ["y32"], to=TensorProto.FLOAT)]
    data = model_bytes(nodes, [vi("x", x)], [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None),
                                            helper.make_tensor_value_info("y32", TensorProto.FLOAT, None)], [w],
                       opset=13)
    got, want = run_both(data, {"x": x}, tmp_path)
    assert got[0].dtype == np.float64 and got[1].dtype == np.float32
    assert_close(got[0], want[0], rel=1e-12)
    assert_close(got[1], want[1], rel=1e-6)


# --------------------------------------------------------------------------------------------------
# MaxPool's Indices output (aten.max_pool2d_with_indices)

@pytest.mark.parametrize("cfg", [
    dict(kernel_size=[2, 2], stride=[2, 2], padding=[0, 0], dilation=[1, 1], ceil_mode=False),
    dict(kernel_size=[3, 3], stride=[1, 2], padding=[1, 1], dilation=[1, 1], ceil_mode=True),
    dict(kernel_size=[2, 3], stride=[2, 1], padding=[1, 0], dilation=[2, 1], ceil_mode=False),
])
def test_max_pool2d_with_indices_op_matches_torch(cfg):
    torch = pytest.importorskip("torch")
    from oprunner import run_op
    rng = np.random.default_rng(6)
    x = rng.integers(-3, 3, size=(2, 3, 7, 8)).astype(np.float32)  # many ties: the first maximum wins
    x[0, 0, 1, 1] = np.nan
    x[1, 2, 3, 3] = x[1, 2, 3, 5] = np.nan  # two NaNs in a window: ATen keeps the last one
    x[1, 1] = -np.inf
    vals, idx = run_op("aten.max_pool2d_with_indices", [x], cfg)
    rv, ri = torch.ops.aten.max_pool2d_with_indices(torch.from_numpy(x), cfg["kernel_size"], cfg["stride"],
                                                    cfg["padding"], cfg["dilation"], cfg["ceil_mode"])
    np.testing.assert_array_equal(vals, rv.numpy())
    np.testing.assert_array_equal(idx, ri.numpy())
    (plain,) = run_op("aten.max_pool2d", [x], cfg)
    np.testing.assert_array_equal(plain, rv.numpy())


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 0], ceil_mode=1),
])
def test_onnx_maxpool_indices_match_onnxruntime(storage_order, attrs, tmp_path):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    data = model_bytes([helper.make_node("MaxPool", ["x"], ["y", "i"], storage_order=storage_order, **attrs)],
                       [vi("x", x)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                                      helper.make_tensor_value_info("i", TensorProto.INT64, None)], opset=12)
    got, want = run_both(data, {"x": x}, tmp_path)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_onnx_maxpool_indices_1d_and_refusals(tmp_path):
    x = np.random.default_rng(8).standard_normal((2, 3, 9)).astype(np.float32)
    data = model_bytes([helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[3], strides=[2])],
                       [vi("x", x)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                                      helper.make_tensor_value_info("i", TensorProto.INT64, None)], opset=12)
    got, want = run_both(data, {"x": x}, tmp_path)
    np.testing.assert_array_equal(got[1], want[1])
    asym = model_bytes([helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[3], pads=[0, 2])],
                       [vi("x", x)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                                      helper.make_tensor_value_info("i", TensorProto.INT64, None)], opset=12)
    path = tmp_path / "a.onnx"
    path.write_bytes(asym)
    with pytest.raises(kiln.KilnError, match="Indices output with asymmetric pads"):
        kiln.onnx.compile_onnx(str(path), input_shapes={"x": [2, 3, 9]})


@pytest.mark.parametrize("bad", [5, -6])
def test_gather_elements_out_of_range_index_is_an_error(bad, tmp_path):
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    idx = np.array([[1, bad], [0, 0]], np.int64)  # 5 along axis 1 would otherwise read x[1, 0]
    data = model_bytes([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)],
                       [vi("x", x), vi("i", idx)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    r = kiln.onnx.compile_onnx(str(path), input_shapes={"x": [3, 5], "i": [2, 2]})
    prog = kiln.load_bytes(r.data)
    with pytest.raises(kiln.KilnError) as e:
        prog.run(x, idx)
    assert e.value.args[1] == "InvalidArgument"
    ok = np.array([[1, -1], [0, 4]], np.int64)
    (y,) = prog.run(x, ok)
    np.testing.assert_array_equal(y, np.take_along_axis(x[:2], np.where(ok < 0, ok + 5, ok), 1))

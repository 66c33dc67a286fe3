"""ONNX If / Loop folded at import by Kiln's ONNX importer (src/frontends/onnx/importer.cpp fold_if /
fold_loop): results against ONNX Runtime on the same file, and NotSupported naming the node for
control flow that is not known once the input shapes are fixed. Also the opset range (the
importer stops at opset 22). Small hand-built opset-21 models; about 2 s."""
import numpy as np
import pytest

import kiln
import kiln.onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ort = pytest.importorskip("onnxruntime")
if not kiln.onnx.available():
    pytest.skip("Kiln built without the ONNX importer", allow_module_level=True)

OPSET = 21


def model(nodes, inputs, outputs, inits=(), opset=OPSET):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def save(m, tmp_path, name="m.onnx"):
    p = str(tmp_path / name)
    onnx.save(m, p)
    return p


def kiln_run(path, shapes, *inputs):
    graph, _ = kiln.onnx.import_onnx(path, shapes)
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", graph)
    data, _ = pb.compile()
    return kiln.load_bytes(data).run(*inputs)


def ort_run(path, feeds):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)


def if_on_batch_model():
    """y = If(Shape(x)[0] > 2, then: Relu(x) * 2, else: Neg(x)); x float32 [N, 4] (N dynamic)."""
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["t_out"])],
        "then", [], [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Greater", ["n", "limit"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], name="batch_if", then_branch=then_g, else_branch=else_g),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(2, np.int64), "limit"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    return model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)


@pytest.mark.parametrize("n", [1, 3])  # else and then branch
def test_if_on_shape_folded_matches_onnxruntime(tmp_path, n):
    p = save(if_on_batch_model(), tmp_path)
    x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
    got = kiln_run(p, {"x": (n, 4)}, x)
    want = ort_run(p, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=0)


def test_if_on_data_refused_naming_the_node(tmp_path):
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["a"])], "then", [],
                               [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "else", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    m = model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
               helper.make_node("Greater", ["s", "z"], ["c"]),
               helper.make_node("If", ["c"], ["y"], name="data_if", then_branch=then_g, else_branch=else_g)],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
              [numpy_helper.from_array(np.array(0, np.float32), "z")])
    with pytest.raises(kiln.KilnError, match=r"node 'data_if' \(#2, If\): the condition must be a constant") as e:
        kiln.onnx.import_onnx(save(m, tmp_path))
    assert e.value.args[1] == "NotSupported"


def loop_model(trip_count_is_input=False, cond_from_data=False):
    """Loop M times over (acc): acc = acc * 0.5 + x + float(i); scan output: acc each iteration."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["acc_in", "half"], ["h"]),
         helper.make_node("Add", ["h", "x"], ["hx"]),
         helper.make_node("Add", ["hx", "fi"], ["acc_out"]),
         (helper.make_node("ReduceMax", ["acc_out"], ["mx"], keepdims=0) if cond_from_data else
          helper.make_node("Identity", ["cond_in"], ["cond_out"])),
         *([helper.make_node("Less", ["mx", "ten"], ["cond_out"])] if cond_from_data else []),
         helper.make_node("Identity", ["acc_out"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [2, 3])])
    inits = [numpy_helper.from_array(np.array(True), "cond"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(10.0, np.float32), "ten")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
              helper.make_tensor_value_info("acc0", TensorProto.FLOAT, [2, 3])]
    if trip_count_is_input:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(4, np.int64), "M"))
    return model([helper.make_node("Loop", ["M", "cond", "acc0"], ["acc", "accs"], name="the_loop", body=body)],
                 inputs,
                 [helper.make_tensor_value_info("acc", TensorProto.FLOAT, [2, 3]),
                  helper.make_tensor_value_info("accs", TensorProto.FLOAT, [4, 2, 3])], inits)


def test_loop_with_constant_trip_count_unrolled_matches_onnxruntime(tmp_path):
    p = save(loop_model(), tmp_path)
    rng = np.random.default_rng(0)
    x, acc0 = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    graph, info = kiln.onnx.import_onnx(p)
    got = kiln_run(p, None, x, acc0)
    want = ort_run(p, {"x": x, "acc0": acc0})
    assert [g.shape for g in got] == [(2, 3), (4, 2, 3)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_loop_trip_count_bound_as_constant_input(tmp_path):
    # M fed as a graph input: known once bound (constant_inputs), refused otherwise.
    p = save(loop_model(trip_count_is_input=True), tmp_path)
    with pytest.raises(kiln.KilnError, match=r"node 'the_loop' \(#0, Loop\): the trip count M must be a constant") as e:
        kiln.onnx.import_onnx(p)
    assert e.value.args[1] == "NotSupported"
    rng = np.random.default_rng(1)
    x, acc0 = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    graph, _ = kiln.onnx.import_onnx(p, constant_inputs={"M": np.array(4, np.int64)})
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", graph)
    got = kiln.load_bytes(pb.compile()[0]).run(x, acc0)
    want = ort_run(p, {"x": x, "acc0": acc0, "M": np.array(4, np.int64)})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_compile_onnx_binds_constant_inputs(tmp_path):
    """compile_onnx passes constant_inputs to the import: the trip count fed as a graph input is
    bound, leaves the program's inputs, and the program matches ONNX Runtime."""
    p = save(loop_model(trip_count_is_input=True), tmp_path)
    with pytest.raises(kiln.KilnError, match="the trip count M must be a constant"):
        kiln.onnx.compile_onnx(p)
    m = np.array(4, np.int64)
    r = kiln.onnx.compile_onnx(p, out=tmp_path / "m.kiln", constant_inputs={"M": m})
    prog = kiln.load(tmp_path / "m.kiln")
    assert [i["name"] for i in prog.method_meta()["inputs"]] == ["x", "acc0"]
    rng = np.random.default_rng(2)
    x, acc0 = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    got = prog.run(x, acc0)
    want = ort_run(p, {"x": x, "acc0": acc0, "M": m})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    assert r.path is not None


def test_loop_condition_on_data_refused_naming_the_node(tmp_path):
    p = save(loop_model(cond_from_data=True), tmp_path)
    with pytest.raises(kiln.KilnError, match=r"node 'the_loop' \(#0, Loop\): the body's condition output "
                                             r"\(iteration 0\) must be a constant") as e:
        kiln.onnx.import_onnx(p)
    assert e.value.args[1] == "NotSupported"


def test_scan_refused_naming_the_node(tmp_path):
    body = helper.make_graph([helper.make_node("Add", ["s_in", "e"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["o"])], "body",
                             [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2]),
                              helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
                             [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2]),
                              helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])])
    m = model([helper.make_node("Scan", ["s0", "xs"], ["s", "os"], name="the_scan", body=body, num_scan_inputs=1)],
              [helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2]),
               helper.make_tensor_value_info("xs", TensorProto.FLOAT, [3, 2])],
              [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2]),
               helper.make_tensor_value_info("os", TensorProto.FLOAT, [3, 2])])
    with pytest.raises(kiln.KilnError, match=r"node 'the_scan' \(#0, Scan\): control flow: Scan is not folded") as e:
        kiln.onnx.import_onnx(save(m, tmp_path))
    assert e.value.args[1] == "NotSupported"


def test_opset_range(tmp_path):
    lo, hi = kiln.onnx.opset_range()
    assert (lo, hi) == (1, 22)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    ok = save(model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], opset=hi), tmp_path, "ok.onnx")
    assert kiln.onnx.import_onnx(ok)[1]["opset"] == hi
    bad = save(model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], opset=hi + 1), tmp_path, "bad.onnx")
    with pytest.raises(kiln.KilnError, match=rf"opset {hi + 1} is outside the supported range 1\.\.{hi}") as e:
        kiln.onnx.import_onnx(bad)
    assert e.value.args[1] == "NotSupported"


def test_malformed_and_oversized_control_flow_is_an_error(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    branch = helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "b", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    t = numpy_helper.from_array(np.array(True), "t")
    # If without else_branch (the checker would refuse it: built unchecked)
    g = helper.make_graph([helper.make_node("If", ["t"], ["y"], name="half_if", then_branch=branch)], "g", [x], [y], [t])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    with pytest.raises(kiln.KilnError, match=r"node 'half_if' \(#0, If\): needs graph attributes") as e:
        kiln.onnx.import_onnx(save(m, tmp_path, "a.onnx"))
    assert e.value.args[1] == "InvalidProgram"
    # Loop of 10^6 iterations: refused before unrolling anything
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["c2"]), helper.make_node("Neg", ["v"], ["v2"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v", TensorProto.FLOAT, [2])],
                             [helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v2", TensorProto.FLOAT, [2])])
    big = numpy_helper.from_array(np.array(10 ** 6, np.int64), "M")
    m = model([helper.make_node("Loop", ["M", "", "x"], ["y"], name="long_loop", body=body)], [x], [y], [big])
    with pytest.raises(kiln.KilnError, match=r"node 'long_loop' \(#0, Loop\): trip count 1000000 exceeds") as e:
        kiln.onnx.import_onnx(save(m, tmp_path, "b.onnx"))
    assert e.value.args[1] == "NotSupported"
    # the same body 3 times (cond absent: a for loop) matches ONNX Runtime: y = -(-(-x))
    three = numpy_helper.from_array(np.array(3, np.int64), "M")
    p = save(model([helper.make_node("Loop", ["M", "", "x"], ["y"], name="for_loop", body=body)], [x], [y], [three]),
             tmp_path, "c.onnx")
    xv = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(kiln_run(p, None, xv)[0], ort_run(p, {"x": xv})[0])

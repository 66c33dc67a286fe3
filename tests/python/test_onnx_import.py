"""Kiln's ONNX importer on small hand-built models: results against ONNX Runtime, clear errors for
malformed and hostile files (never a crash), external data confined to the model's directory,
and the `kiln compile model.onnx` CLI."""
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

import kiln
import kiln.onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ort = pytest.importorskip("onnxruntime")
if not kiln.onnx.available():
    pytest.skip("Kiln built without the ONNX importer", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_CLI = os.path.join(ROOT, "build", "tools", "kiln")


def make_model(nodes, inputs, outputs, initializers=(), opset=13):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def conv_model():
    rs = np.random.RandomState(0)
    w = numpy_helper.from_array(rs.randn(4, 3, 3, 3).astype(np.float32), "w")
    b = numpy_helper.from_array(rs.randn(4).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return make_model(nodes, [f32("x", ["N", 3, "H", "W"])], [f32("y", None)], [w, b])


def save(m, tmp_path, name="m.onnx"):
    p = os.path.join(tmp_path, name)
    with open(p, "wb") as f:
        f.write(m.SerializeToString())
    return p


def compile_run(path, shapes, *inputs, backends=()):
    r = kiln.onnx.compile_onnx(path, input_shapes=shapes, backends=backends)
    return kiln.load_bytes(r.data).run(*inputs)


def test_conv_relu_matches_onnxruntime(tmp_path):
    p = save(conv_model(), tmp_path)
    x = np.random.RandomState(1).randn(1, 3, 8, 10).astype(np.float32)
    (got,) = compile_run(p, {"x": x.shape}, x)
    (want,) = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_shape_subgraph_folds_for_static_shapes(tmp_path):
    # y = Reshape(x, Concat(Shape(x)[0:1], [-1])): folded to a constant shape at import.
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "one"], ["n"]),
             helper.make_node("Concat", ["n", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    p = save(make_model(nodes, [f32("x", ["N", 3, 4])], [f32("y", None)], inits), tmp_path)
    g, info = kiln.onnx.import_onnx(p, {"x": (2, 3, 4)})
    assert info["folded_nodes"] == 3 and g.num_nodes == 1  # only the view is left
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (got,) = compile_run(p, {"x": x.shape}, x)
    np.testing.assert_array_equal(got, x.reshape(2, 12))


def expect_error(path_or_bytes, code, match, tmp_path=None, shapes=None):
    path = path_or_bytes
    if isinstance(path_or_bytes, bytes):
        path = os.path.join(tmp_path, "bad.onnx")
        with open(path, "wb") as f:
            f.write(path_or_bytes)
    with pytest.raises(kiln.KilnError) as e:
        kiln.onnx.import_onnx(path, {"x": (1, 3, 8, 8)} if shapes is None else shapes)
    assert e.value.args[1] == code, e.value.args[0]
    assert match in e.value.args[0], e.value.args[0]
    return e.value.args[0]


def test_truncated_and_garbage_files(tmp_path):
    data = conv_model().SerializeToString()
    expect_error(data[: len(data) // 2], "InvalidProgram", "parse failed", tmp_path)
    expect_error(b"\xff" * 64, "InvalidProgram", "parse failed", tmp_path)
    expect_error(b"", "InvalidProgram", "no graph", tmp_path)
    with pytest.raises(kiln.KilnError) as e:
        kiln.onnx.import_onnx(os.path.join(tmp_path, "missing.onnx"))
    assert e.value.args[1] == "NotFound"


def test_wrong_raw_data_size(tmp_path):
    m = conv_model()
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:-4]
    expect_error(save(m, tmp_path), "InvalidProgram", "raw_data has 428 bytes but float32[4, 3, 3, 3] needs 432")
    m = conv_model()
    m.graph.initializer[1].ClearField("raw_data")
    m.graph.initializer[1].float_data.extend([1.0, 2.0])
    expect_error(save(m, tmp_path), "InvalidProgram", "float_data holds 2 values")
    m = conv_model()
    m.graph.initializer[1].dims[0] = -4
    expect_error(save(m, tmp_path), "InvalidProgram", "negative dimension")
    m = conv_model()
    del m.graph.initializer[1].dims[:]
    m.graph.initializer[1].dims.extend([1 << 30, 1 << 30, 1 << 30])
    expect_error(save(m, tmp_path), "InvalidProgram", "too many elements")


def test_unknown_op_and_bad_attributes(tmp_path):
    m = conv_model()
    m.graph.node[1].op_type = "FancyRelu"
    expect_error(save(m, tmp_path), "NotSupported", "node 'relu' (#1, FancyRelu): op type 'FancyRelu' is not supported")
    m = conv_model()
    m.graph.node[0].attribute.append(helper.make_attribute("frobnicate", 3))
    expect_error(save(m, tmp_path), "NotSupported", "node 'conv' (#0, Conv): attribute 'frobnicate' is not supported")
    m = conv_model()
    m.graph.node[0].attribute.append(helper.make_attribute("group", 2))  # 3 channels: groups must divide
    expect_error(save(m, tmp_path), "InvalidProgram", "node 'conv' (#0, Conv)")
    m = conv_model()
    m.graph.node[0].attribute.append(helper.make_attribute("strides", "fast"))
    expect_error(save(m, tmp_path), "InvalidProgram", "attribute 'strides' must be a list of ints")
    m = conv_model()
    m.graph.node[0].attribute.append(helper.make_attribute("auto_pad", "SIDEWAYS"))
    expect_error(save(m, tmp_path), "InvalidProgram", "auto_pad")
    m = conv_model()
    m.graph.node[0].domain = "com.example"
    expect_error(save(m, tmp_path), "NotSupported", "op domain 'com.example'")


def test_dangling_cyclic_and_duplicate_names(tmp_path):
    m = conv_model()
    m.graph.node[1].input[0] = "nowhere"
    expect_error(save(m, tmp_path), "InvalidProgram", "input 0 'nowhere' is not defined before this node")
    m = conv_model()  # a cycle: relu feeds conv, conv feeds relu
    m.graph.node[0].input[0] = "y"
    expect_error(save(m, tmp_path), "InvalidProgram", "'y' is not defined before this node")
    m = conv_model()
    m.graph.node[1].output[0] = "c"  # defined twice
    expect_error(save(m, tmp_path), "InvalidProgram", "output 'c' is defined twice")
    m = conv_model()
    m.graph.output[0].name = "ghost"
    expect_error(save(m, tmp_path), "InvalidProgram", "graph output 'ghost' is not produced")


def test_opset_and_input_shape_errors(tmp_path):
    m = conv_model()
    m.opset_import[0].version = 23
    expect_error(save(m, tmp_path), "NotSupported", "opset 23 is outside the supported range 1..22")
    for first, second in (("", ""), ("", "ai.onnx"), ("ai.onnx", "")):  # the default domain listed twice
        for versions in ((23, 18), (18, 23), (13, 13)):
            m = conv_model()
            del m.opset_import[:]
            m.opset_import.extend([onnx.helper.make_opsetid(first, versions[0]),
                                   onnx.helper.make_opsetid(second, versions[1])])
            expect_error(save(m, tmp_path), "InvalidProgram",
                         f"imports the default domain twice (opset {versions[0]} and opset {versions[1]})")
    p = save(conv_model(), tmp_path)
    expect_error(p, "InvalidArgument", "dynamic shape", shapes={})
    expect_error(p, "InvalidArgument", "not a graph input", shapes={"y": (1, 3, 8, 8)})
    expect_error(p, "InvalidArgument", "static size 3 in dim 1", shapes={"x": (1, 4, 8, 8)})
    expect_error(p, "InvalidArgument", "rank 4", shapes={"x": (1, 3, 8)})


def test_external_data_inside_and_outside_the_model_dir(tmp_path):
    d = os.path.join(tmp_path, "model")
    os.makedirs(d)
    m = conv_model()
    onnx.save_model(m, os.path.join(d, "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    x = np.random.RandomState(2).randn(1, 3, 8, 8).astype(np.float32)
    (got,) = compile_run(os.path.join(d, "ext.onnx"), {"x": x.shape}, x)
    (want,) = ort.InferenceSession(os.path.join(d, "ext.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()

    def with_location(loc, offset=None, length=None):
        mm = onnx.load(os.path.join(d, "ext.onnx"), load_external_data=False)
        t = mm.graph.initializer[0]
        for kv in t.external_data:
            if kv.key == "location":
                kv.value = loc
            if kv.key == "offset" and offset is not None:
                kv.value = str(offset)
            if kv.key == "length" and length is not None:
                kv.value = str(length)
        p = os.path.join(d, "bad.onnx")
        with open(p, "wb") as f:
            f.write(mm.SerializeToString())
        return p

    with open(os.path.join(tmp_path, "secret.bin"), "wb") as f:
        f.write(b"\0" * 4096)
    expect_error(with_location("../secret.bin"), "InvalidProgram", "leaves the model's directory")
    expect_error(with_location(os.path.join(tmp_path, "secret.bin")), "InvalidProgram", "must be relative")
    os.symlink(os.path.join(tmp_path, "secret.bin"), os.path.join(d, "link.bin"))
    expect_error(with_location("link.bin"), "InvalidProgram", "resolves outside the model's directory")
    expect_error(with_location("absent.bin"), "NotFound", "not found")
    expect_error(with_location("weights.bin", offset=10 ** 9), "InvalidProgram", "exceeds the file")
    expect_error(with_location("weights.bin", length=12), "InvalidProgram", "external data length 12")
    expect_error(with_location("weights.bin", offset="-3"), "InvalidProgram", "not a non-negative integer")


def test_mutated_files_never_crash(tmp_path):
    """Random byte flips / truncations of a model: every import returns a model or a KilnError.
    Run in a subprocess so that a crash fails this test instead of killing the test run."""
    p = save(conv_model(), tmp_path)
    code = f"""
import random, sys
sys.path.insert(0, {os.path.join(ROOT, 'python')!r})
import kiln, kiln.onnx
data = open({p!r}, 'rb').read()
rng = random.Random(0)
ok = err = 0
for i in range(400):
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    if i % 4 == 0:
        b = b[:rng.randrange(len(b))]
    q = {os.path.join(tmp_path, 'mut.onnx')!r}
    open(q, 'wb').write(bytes(b))
    try:
        g, info = kiln.onnx.import_onnx(q, {{'x': (1, 3, 8, 8)}})
        pb = kiln.ProgramBuilder(); pb.add_method('forward', g); pb.compile()
        ok += 1
    except kiln.KilnError:
        err += 1
print(ok, err)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"importer crashed (rc {r.returncode}): {r.stderr[-2000:]}"
    ok, err = map(int, r.stdout.split())
    assert ok + err == 400 and err > 0


@pytest.mark.skipif(not os.path.isfile(KILN_CLI), reason="kiln CLI not built in build/")
def test_cli_compile(tmp_path):
    p = save(conv_model(), tmp_path)
    out = os.path.join(tmp_path, "m.kiln")
    rep = os.path.join(tmp_path, "r.json")
    r = subprocess.run([KILN_CLI, "compile", p, "--input-shape", "x=1x3x8x8", "--backends", "cpu,xnnpack",
                        "--report-json", rep, "-o", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "ONNX nodes" in r.stdout and "method 'forward'" in r.stdout
    import json
    report = json.load(open(rep))
    assert report["onnx"]["opset"] == 13 and report["methods"][0]["name"] == "forward"
    x = np.random.RandomState(3).randn(1, 3, 8, 8).astype(np.float32)
    (got,) = kiln.load(out).run(x)
    (want,) = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    r = subprocess.run([KILN_CLI, "compile", p, "-o", out], capture_output=True, text=True)
    assert r.returncode == 1 and "dynamic shape" in r.stderr
    r = subprocess.run([KILN_CLI, "compile", p, "--input-shape", "x=1xAx8", "-o", out], capture_output=True, text=True)
    assert r.returncode == 2 and "expected NAME=SIZES" in r.stderr
    r = subprocess.run([KILN_CLI, "compile", p, "--input-shape", "x=1x3x8x8", "--backends", "cpu",
                        "--require-delegation", "xnnpack", "-o", os.path.join(tmp_path, "never.kiln")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "not among the requested backends (--backends cpu)" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(tmp_path, "never.kiln"))
    r = subprocess.run([KILN_CLI, "compile", p, "--input-shape", "x=1x3x8x8", "--require-delegation", "cpu",
                        "-o", os.path.join(tmp_path, "never.kiln")], capture_output=True, text=True)
    assert r.returncode == 2 and "takes a delegate backend (xnnpack, mlx), not 'cpu'" in r.stderr, r.stderr

    # Recompiling over a program that a process has loaded (memory-mapped) leaves that process's
    # program intact (the new file is renamed over the old one, not written into it); a device
    # is written into, never replaced, and a full one is an error.
    loaded = kiln.load(out)
    r = subprocess.run([KILN_CLI, "compile", p, "--input-shape", "x=2x3x8x8", "-o", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert np.abs(loaded.run(x)[0] - want).max() <= 1e-5 * np.abs(want).max()
    assert kiln.load(out).method().inputs[0]["sizes"] == [2, 3, 8, 8]
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".kiln-")]
    if os.path.exists("/dev/full"):
        r = subprocess.run([KILN_CLI, "compile", p, "--input-shape", "x=1x3x8x8", "-o", "/dev/full"],
                           capture_output=True, text=True)
        assert r.returncode == 1 and "No space left on device" in r.stderr, r.stderr
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_hostile_sizes_are_errors_not_allocations(tmp_path):
    """Sizes from the file are checked before anything is allocated (no multi-GiB constants)."""
    big = numpy_helper.from_array(np.array([1 << 20, 1 << 20], np.int64), "shape")
    m = make_model([helper.make_node("ConstantOfShape", ["shape"], ["y"], name="cos")], [], [f32("y", None)], [big])
    expect_error(save(m, tmp_path), "NotSupported", "node 'cos' (#0, ConstantOfShape)", shapes={})
    m = make_model([helper.make_node("Trilu", ["x"], ["y"], name="tri")], [f32("x", [1 << 20, 1 << 20])], [f32("y", None)])
    expect_error(save(m, tmp_path), "NotSupported", "more than 1 GiB", shapes={})
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [f32("x", [1 << 30, 1 << 30])], [f32("y", None)])
    expect_error(save(m, tmp_path), "InvalidArgument", "too many elements", shapes={})
    t = TensorProto()
    t.name, t.data_type = "w", TensorProto.FLOAT
    t.dims.extend([1 << 38])  # 1 TiB declared, nothing stored
    m = make_model([helper.make_node("Relu", ["w"], ["y"])], [], [f32("y", None)], [t])
    expect_error(save(m, tmp_path), "InvalidProgram", "float_data holds 0 values", shapes={})


def test_python_cli_compile_onnx(tmp_path):
    p = save(conv_model(), tmp_path)
    out = os.path.join(tmp_path, "py.kiln")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-m", "kiln", "compile", p, "--input-shape", "x=1x3x8x8", "-o", out],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "ONNX nodes" in r.stdout + r.stderr
    x = np.random.RandomState(4).randn(1, 3, 8, 8).astype(np.float32)
    (got,) = kiln.load(out).run(x)
    (want,) = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    r = subprocess.run([sys.executable, "-m", "kiln", "compile", p, "--input-shape", "1x3x8x8", "-o", out],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "expected NAME=SIZES" in r.stderr
    r = subprocess.run([sys.executable, "-m", "kiln", "compile", p, "-o", out], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "dynamic shape" in r.stderr


@pytest.mark.parametrize("which", ["mobilenet_v3_small", "transformer_layer"])
def test_torch_onnx_exports_match_onnxruntime(which, tmp_path):
    """Models exported by torch.onnx (TorchScript exporter, opset 17) import and match ONNX Runtime."""
    torch = pytest.importorskip("torch")
    import warnings
    torch.manual_seed(0)
    if which == "mobilenet_v3_small":
        torchvision = pytest.importorskip("torchvision")
        model, x = torchvision.models.mobilenet_v3_small().eval(), torch.randn(1, 3, 96, 96)
    else:  # layer norm, multi-head attention (MatMul, Softmax, Reshape/Transpose), GELU via Erf
        class Block(torch.nn.Module):
            def __init__(self, d=64, heads=4):
                super().__init__()
                self.heads, self.ln1, self.ln2 = heads, torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
                self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
                self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

            def forward(self, x):
                b, n, d = x.shape
                q, k, v = self.qkv(self.ln1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
                a = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
                x = x + self.proj((a @ v).transpose(1, 2).reshape(b, n, d))
                return x + self.mlp(self.ln2(x))

        model, x = Block().eval(), torch.randn(2, 10, 64)
    p = os.path.join(tmp_path, f"{which}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(model, (x,), p, dynamo=False, opset_version=17, input_names=["x"])
        except Exception as e:  # noqa: BLE001 (an exporter that is not available in this torch)
            pytest.skip(f"torch.onnx.export unavailable: {type(e).__name__}: {e}")
    (got,) = compile_run(p, {}, x.numpy(), backends=["xnnpack"] if "xnnpack" in kiln._kiln.backend_names() else [])
    (want,) = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("pads,opad,strides", [([1, 0, 0, 1], [1, 0], [2, 2]), ([2, 0, 0, 0], [0, 0], [2, 1]),
                                               ([0, 1, 2, 0], [1, 1], [3, 2]), ([1, 1, 1, 1], [1, 0], [2, 2])])
def test_conv_transpose_asymmetric_pads_match_onnxruntime(pads, opad, strides, tmp_path):
    # Asymmetric pads whose begin side cannot become output_padding (it would exceed the stride)
    # are a convolution padded by the smaller side plus a slice off each end.
    rs = np.random.RandomState(3)
    w = numpy_helper.from_array(rs.randn(3, 2, 3, 3).astype(np.float32), "w")
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="ct", strides=strides, pads=pads,
                            output_padding=opad)
    p = save(make_model([node], [f32("x", [1, 3, 5, 6])], [f32("y", None)], [w]), tmp_path)
    x = rs.randn(1, 3, 5, 6).astype(np.float32)
    (got,) = compile_run(p, {}, x)
    (want,) = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.skipif(not os.path.isfile(KILN_CLI), reason="kiln CLI not built in build/")
def test_cli_repeated_input_shape_and_directory_are_errors(tmp_path):
    p = save(conv_model(), tmp_path)
    out = os.path.join(tmp_path, "m.kiln")
    r = subprocess.run([KILN_CLI, "compile", p, "--input-shape", "x=1x3x8x8", "--input-shape", "x=1x3x4x4", "-o", out],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "input 'x' twice" in r.stderr, r.stderr
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-m", "kiln", "compile", p, "--input-shape", "x=1x3x8x8", "--input-shape",
                        "x=1x3x4x4", "-o", out], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and "given twice" in r.stderr, r.stderr
    d = os.path.join(tmp_path, "dir.onnx")
    os.mkdir(d)
    r = subprocess.run([KILN_CLI, "compile", d, "--input-shape", "x=1x3x8x8", "-o", out], capture_output=True, text=True)
    assert r.returncode != 0 and "is a directory" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "kiln", "compile", d, "-o", out], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 2 and "is a directory" in r.stderr, r.stderr
    assert not os.path.exists(out)

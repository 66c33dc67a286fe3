"""Output names (Method.output_names, docs/output-names.md): from a PyTorch module's output
structure (kiln.export) and from an ONNX graph's outputs (the C++ importer, through `kiln compile`),
shown by `kiln inspect` (text and --json), used as `kiln run`'s .npy file names and by the Python
API (LoadedProgram.output_names, run(as_dict=True)); files without names still load, unnamed '#i'.

Values are checked against PyTorch eager and ONNX Runtime; the names against the module's own
output keys and the ONNX graph's output names.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess

import numpy as np
import pytest
import torch

import kiln
import kiln.onnx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_CLI = os.environ.get("KILN_CLI", os.path.join(ROOT, "build", "tools", "kiln"))

needs_cli = pytest.mark.skipif(not os.path.isfile(KILN_CLI), reason="kiln CLI not built in build/")

Pair = collections.namedtuple("Pair", ["key", "value"])


class DictOut(torch.nn.Module):
    """A dict output with nested containers (a ModelOutput with a KV cache has this shape)."""

    def forward(self, x):
        return {"logits": x + 1, "past_key_values": [Pair(x * 2, x * 3)], "a/b": (x - 1,)}


class TupleOut(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x), x.sum(dim=1)


class TensorOut(torch.nn.Module):
    def forward(self, x):
        return x * x


DICT_NAMES = ["logits", "past_key_values.0.key", "past_key_values.0.value", "a/b.0"]


def inspect_json(path) -> dict:
    p = subprocess.run([KILN_CLI, "inspect", "--json", str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def inspect_text(path) -> str:
    p = subprocess.run([KILN_CLI, "inspect", str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def outputs_block(text: str) -> list[str]:
    """The names in `kiln inspect`'s 'outputs' block (first column)."""
    lines = text.splitlines()
    i = lines.index("  outputs")
    names = []
    for line in lines[i + 1:]:
        if not line.startswith("    "):
            break
        names.append(line.split()[0])
    return names


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("names")
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    paths = {}
    for name, module in (("dict", DictOut()), ("tuple", TupleOut()), ("tensor", TensorOut())):
        paths[name] = d / f"{name}.kiln"
        kiln.export(module, (x,), out=paths[name], verbose=False)
    return paths, x


def eager(module, x) -> list[np.ndarray]:
    import torch.utils._pytree as pytree
    with torch.no_grad():
        return [t.numpy() for t in pytree.tree_leaves(module(x))]


@pytest.mark.parametrize("name,module,names", [
    ("dict", DictOut(), DICT_NAMES),
    ("tuple", TupleOut(), ["output.0", "output.1"]),
    ("tensor", TensorOut(), ["output"]),
])
def test_export_names_in_python_api(exported, name, module, names):
    paths, x = exported
    p = kiln.load(paths[name])
    assert [o["name"] for o in p.method_meta()["outputs"]] == names
    assert p.output_names() == names
    want = eager(module, x)
    got = p.run(x.numpy())  # the list API is unchanged
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    d = p.run(x.numpy(), as_dict=True)
    assert list(d) == names
    for n, w in zip(names, want):
        np.testing.assert_allclose(d[n], w, rtol=1e-6, atol=1e-6)


@needs_cli
def test_inspect_shows_export_names(exported):
    paths, _ = exported
    for name, names in (("dict", DICT_NAMES), ("tuple", ["output.0", "output.1"])):
        (m,) = inspect_json(paths[name])["methods"]
        assert [o["name"] for o in m["outputs"]] == names
        assert outputs_block(inspect_text(paths[name])) == names


@needs_cli
def test_run_writes_named_npy_files(exported, tmp_path):
    paths, x = exported
    np.save(tmp_path / "x.npy", x.numpy())
    out = tmp_path / "out"
    p = subprocess.run([KILN_CLI, "run", str(paths["dict"]), "-i", str(tmp_path / "x.npy"), "-o", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    files = ["logits.npy", "past_key_values.0.key.npy", "past_key_values.0.value.npy", "a_b.0.npy"]  # '/' -> '_'
    assert sorted(os.listdir(out)) == sorted(files)
    for f, w in zip(files, eager(DictOut(), x)):
        np.testing.assert_allclose(np.load(out / f), w, rtol=1e-6, atol=1e-6)
    assert "output 0 'logits': float32[2, 3]" in p.stdout, p.stdout
    # --numbered: by position, whatever the names.
    q = subprocess.run([KILN_CLI, "run", str(paths["dict"]), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "num"),
                        "--numbered"], capture_output=True, text=True, timeout=60)
    assert q.returncode == 0, q.stderr
    assert sorted(os.listdir(tmp_path / "num")) == [f"output_{i}.npy" for i in range(4)]
    np.testing.assert_array_equal(np.load(tmp_path / "num" / "output_0.npy"), np.load(out / "logits.npy"))


def test_output_names_helper_makes_names_unique():
    from kiln.capture import output_names, unique_names
    assert unique_names(["", "a", "a", "a_2", "a"]) == ["output_0", "a", "a_3", "a_2", "a_4"]
    import torch.utils._pytree as pytree
    # Keys that collide once joined ('a.b' and a['b']) are made distinct.
    _, spec = pytree.tree_flatten({"a.b": 0, "a": {"b": 1}, 3: 2})
    assert output_names(spec, 3) == ["a.b", "a.b_2", "3"]
    assert output_names(None, 2) == ["output.0", "output.1"]
    # A control character would make a file the loader refuses: written as \xNN.
    _, spec = pytree.tree_flatten({"a\nb": 0})
    assert output_names(spec, 1) == ["a\\x0ab"]
    # A name given as it is keeps it exactly; the placeholder (or a later repeat) is the one
    # suffixed, with a suffix that no other output has.
    assert unique_names(["", "output_0"]) == ["output_0_2", "output_0"]
    assert unique_names(["a", "", "output_1_2", "output_1"]) == ["a", "output_1_3", "output_1_2", "output_1"]
    assert unique_names(["a\\x0ab", "a\nb"]) == ["a\\x0ab", "a\\x0ab_2"]


class EmptyKeyOut(torch.nn.Module):
    """A dict with an empty key beside a key equal to the empty key's placeholder name."""

    def forward(self, x):
        return {"": x + 1, "output_0": x + 2}


def test_explicit_key_keeps_its_name(tmp_path):
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "empty_key.kiln"
    kiln.export(EmptyKeyOut(), (x,), out=path, verbose=False)
    p = kiln.load(path)
    assert p.output_names() == ["output_0_2", "output_0"]
    got = p.run(x.numpy(), as_dict=True)
    with torch.no_grad():
        want = EmptyKeyOut()(x)
    np.testing.assert_array_equal(got["output_0"], want["output_0"].numpy())  # the user's key
    np.testing.assert_array_equal(got["output_0_2"], want[""].numpy())


def test_graph_refuses_bad_names():
    g = kiln.Graph()
    x = g.add_input("x", "float32", [2])
    (y,) = g.add_node("aten.relu", [x])
    for bad in (["a", "b"], [""], []):
        if bad == []:
            g.set_outputs([y], bad)  # an empty list: unnamed
            assert g.output_names == []
            continue
        with pytest.raises(kiln.KilnError):
            g.set_outputs([y], bad)
    g.set_outputs([y], ["y"])
    assert g.output_names == ["y"]


@needs_cli
def test_file_without_names_shows_index(tmp_path):
    """A program written without names (as every file before Method.output_names): '#i'."""
    g = kiln.Graph()
    x = g.add_input("x", "float32", [2])
    (y,) = g.add_node("aten.relu", [x])
    (z,) = g.add_node("aten.neg", [x])
    g.set_outputs([y, z])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile()
    path = tmp_path / "old.kiln"
    path.write_bytes(data)
    (m,) = inspect_json(path)["methods"]
    assert [o["name"] for o in m["outputs"]] == ["", ""]
    assert outputs_block(inspect_text(path)) == ["#0", "#1"]
    p = kiln.load(path)
    assert p.output_names() == ["#0", "#1"]
    v = np.array([-1.0, 2.0], dtype=np.float32)
    d = p.run(v, as_dict=True)
    np.testing.assert_array_equal(d["#0"], torch.relu(torch.from_numpy(v)).numpy())
    np.testing.assert_array_equal(d["#1"], (-torch.from_numpy(v)).numpy())
    np.save(tmp_path / "x.npy", v)
    r = subprocess.run([KILN_CLI, "run", str(path), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "o")) == ["output_0.npy", "output_1.npy"]


@needs_cli
def test_onnx_import_names(tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    if not kiln.onnx.available():
        pytest.skip("this build has no ONNX importer")
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Relu", ["x"], ["prob"]), helper.make_node("Neg", ["x"], ["feat:0/y"])]
    f32 = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3])  # noqa: E731
    g = helper.make_graph(nodes, "g", [f32("x")], [f32("prob"), f32("feat:0/y")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    dst = tmp_path / "m.kiln"
    c = subprocess.run([KILN_CLI, "compile", str(src), "-o", str(dst)], capture_output=True, text=True, timeout=120)
    assert c.returncode == 0, c.stderr
    names = ["prob", "feat:0/y"]
    (m,) = inspect_json(dst)["methods"]
    assert [o["name"] for o in m["outputs"]] == names
    assert outputs_block(inspect_text(dst)) == names
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = kiln.load(dst).run(x, as_dict=True)
    assert list(got) == names
    for n, w in zip(names, want):
        np.testing.assert_array_equal(got[n], w)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([KILN_CLI, "run", str(dst), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "o")) == ["feat_0_y.npy", "prob.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "prob.npy"), want[0])
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "feat_0_y.npy"), want[1])


@needs_cli
def test_onnx_escaped_name_does_not_take_a_literal_one(tmp_path):
    """An ONNX output whose name is not UTF-8 (byte 0xff) is escaped to the text \\xffZZZZZ; an
    output literally named \\xffZZZZZ keeps that name, and the escaped one gets the suffix, as for
    PyTorch names (unique_output_names)."""
    onnx = pytest.importorskip("onnx")
    if not kiln.onnx.available():
        pytest.skip("this build has no ONNX importer")
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Relu", ["x"], ["QZZZZZ"]), helper.make_node("Neg", ["x"], ["\\xffZZZZZ"])]
    f32 = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])  # noqa: E731
    g = helper.make_graph(nodes, "g", [f32("x")], [f32("QZZZZZ"), f32("\\xffZZZZZ")])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    assert data.count(b"QZZZZZ") == 2  # the node output and the graph output: same length, so protobuf stays valid
    src = tmp_path / "m.onnx"
    src.write_bytes(data.replace(b"QZZZZZ", b"\xffZZZZZ"))
    dst = tmp_path / "m.kiln"
    c = subprocess.run([KILN_CLI, "compile", str(src), "-o", str(dst)], capture_output=True, text=True, timeout=120)
    assert c.returncode == 0, c.stderr
    (m,) = inspect_json(dst)["methods"]
    assert [o["name"] for o in m["outputs"]] == ["\\xffZZZZZ_2", "\\xffZZZZZ"]
    # -o naming the input model is refused before any work; the model is left as it was
    before = src.read_bytes()
    c = subprocess.run([KILN_CLI, "compile", str(src), "-o", str(src)], capture_output=True, text=True, timeout=120)
    assert c.returncode == 2 and "is the input file" in c.stderr, c.stderr
    assert src.read_bytes() == before


@needs_cli
@pytest.mark.parametrize("names,files", [
    (["a/b", "a_b", "a_b_1"], ["a_b_0.npy", "a_b.npy", "a_b_1.npy"]),
    (["a/b", "a_b", "a_b_0"], ["a_b_0_2.npy", "a_b.npy", "a_b_0.npy"]),
    (["x:y", "x?y"], ["x_y.npy", "x_y_1.npy"]),
])
def test_run_file_named_after_an_output_holds_it(tmp_path, names, files):
    """`kiln run -o`: a file named exactly after an output holds that output; a changed name that
    would give another output's file gets a suffix no output's file has."""
    g = kiln.Graph()
    x = g.add_input("x", "float32", [2])
    ops = ["aten.relu", "aten.neg", "aten.abs"][:len(names)]
    ys = [g.add_node(op, [x])[0] for op in ops]
    g.set_outputs(ys, names)
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile()
    path = tmp_path / "m.kiln"
    path.write_bytes(data)
    v = np.array([-1.5, 2.0], dtype=np.float32)
    np.save(tmp_path / "x.npy", v)
    r = subprocess.run([KILN_CLI, "run", str(path), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "o")) == sorted(files)
    want = [np.maximum(v, 0), -v, np.abs(v)]  # what each output's op computes
    for i, f in enumerate(files):
        np.testing.assert_array_equal(np.load(tmp_path / "o" / f), want[i])

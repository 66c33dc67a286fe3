"""Models exported by PyTorch's dynamo-based ONNX exporter (``torch.onnx.export(..., dynamo=True)``,
which needs the PyPI ``onnxscript``; it writes opset 18+ models, opset 20 with torch 2.15):
mobilenet_v3_small (torchvision, seeded random weights) and a transformer encoder block
(torch.nn.TransformerEncoderLayer, eval) are imported by Kiln's ONNX importer, compiled (Kiln's
CPU kernels) and compared with ONNX Runtime on the same exported file, within 1e-4 relative
(|kiln - ort| <= 1e-4 * max|ort|, per output).

The exports run once per test session (about 45 s on a busy 2-core machine, most of it
torch.export of mobilenet_v3_small); skipped with the reason when onnxscript is missing."""
import os

import numpy as np
import pytest

import kiln
import kiln.onnx

if not kiln.onnx.available():
    pytest.skip("Kiln built without the ONNX importer", allow_module_level=True)
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript (requirements-extra.txt)")

RTOL = 1e-4


def export(module, args, path):
    """Dynamo export of `module` (eval) to `path`; returns the model's default-domain opset."""
    torch.onnx.export(module.eval(), args, path, dynamo=True, verbose=False)
    m = onnx.load(path, load_external_data=False)
    return max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))


def compare(path, inputs):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    want = sess.run(None, dict(zip(names, inputs)))
    graph, info = kiln.onnx.import_onnx(path, {n: a.shape for n, a in zip(names, inputs)})
    assert info["input_names"] == names
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", graph)
    data, _ = pb.compile()
    got = kiln.load_bytes(data).run(*inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        err = float(np.max(np.abs(g.astype(np.float64) - w))) / float(np.max(np.abs(w)))
        assert err <= RTOL, f"{os.path.basename(path)}: max |kiln - ort| / max |ort| = {err:.3g}"
    return info


def test_dynamo_mobilenet_v3_small(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(weights=None)
    x = torch.randn(1, 3, 224, 224)
    path = str(tmp_path / "mobilenet_v3_small.onnx")
    opset = export(model, (x,), path)
    assert opset >= 18, f"the dynamo exporter wrote opset {opset}"
    info = compare(path, [x.numpy()])
    assert info["opset"] == opset


def test_dynamo_transformer_block(tmp_path):
    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0,
                                             batch_first=True, activation="gelu")
    x = torch.randn(2, 10, 64)
    path = str(tmp_path / "transformer_block.onnx")
    opset = export(block, (x,), path)
    assert opset >= 18, f"the dynamo exporter wrote opset {opset}"
    compare(path, [x.numpy()])

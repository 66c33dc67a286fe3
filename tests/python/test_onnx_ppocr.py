"""PP-OCR (PaddleOCR) ONNX models from the rapidocr-onnxruntime wheel, imported by Kiln's ONNX
importer and compared with ONNX Runtime: det (dynamic HxW), rec (dynamic width), cls, each
compiled for Kiln's portable kernels, for cpu kernels + xnnpack and for mlx (on MLX's CPU device).
Tolerance: max abs error <= 1e-4 * max |ONNX Runtime output|."""
import importlib.util
import os

import numpy as np
import pytest

import kiln
import kiln.onnx

ort = pytest.importorskip("onnxruntime")
_spec = importlib.util.find_spec("rapidocr_onnxruntime")  # located, not imported (it needs OpenCV)
if not kiln.onnx.available():
    pytest.skip("Kiln built without the ONNX importer", allow_module_level=True)

MODELS = os.path.join(os.path.dirname(_spec.origin), "models") if _spec and _spec.origin else ""


def text_image(h, w, seed=0):
    """A white image with dark word-like blocks, normalized as PaddleOCR's det preprocessing
    (ImageNet mean/std), NCHW float32: det's output then holds real text probabilities (on noise
    it saturates near 0 and a relative comparison would say nothing)."""
    rs = np.random.RandomState(seed)
    img = np.full((h, w, 3), 255.0, np.float32)
    for _ in range(6):
        y, x = rs.randint(4, h - 14), rs.randint(4, w - 40)
        img[y:y + 10, x:x + 35] = 0
        for j in range(0, 35, 6):
            img[y:y + 10, x + j:x + j + 2] = 255
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    return ((img / 255 - mean) / std).transpose(2, 0, 1)[None].astype(np.float32)


CASES = [
    ("ch_PP-OCRv4_det_infer.onnx", (1, 3, 96, 160), "text"),
    ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 160), "uniform"),
    ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192), "uniform"),
]


@pytest.mark.parametrize("config", ["portable", "xnnpack", "mlx"])
@pytest.mark.parametrize("name,shape,kind", CASES, ids=[c[0].split("_infer")[0] for c in CASES])
def test_ppocr_matches_onnxruntime(name, shape, kind, config):
    path = os.path.join(MODELS, name)
    if not os.path.isfile(path):
        pytest.skip(f"{name} not in the rapidocr_onnxruntime wheel")
    if config != "portable" and config not in kiln._kiln.backend_names():
        pytest.skip(f"{config} delegate not built")
    backends = [] if config == "portable" else [config]
    result = kiln.onnx.compile_onnx(path, input_shapes={"x": shape}, backends=backends)
    if backends:  # the delegate took part of the model (not a silent CPU fallback)
        segs = result.report["methods"][0]["delegation"]["backends"][0]
        assert segs["backend"] == config and segs["nodes"] > 0
    if config == "mlx":  # mlx takes every node of these models
        assert result.report["methods"][0]["delegation"]["cpu_ops"] == []
    settings = {"mlx.device": "cpu"} if config == "mlx" else {}
    prog = kiln.load_bytes(result.data, portable_kernels_only=(config == "portable"), backend_settings=settings)
    x = text_image(shape[2], shape[3]) if kind == "text" else \
        np.random.RandomState(1).uniform(-1, 1, shape).astype(np.float32)
    (got,) = prog.run(x)
    (want,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert got.shape == want.shape
    scale = np.abs(want).max()
    assert scale > 0.1, "reference output is degenerate: the comparison would be meaningless"
    err = np.abs(got - want).max()
    assert err <= 1e-4 * scale, f"{name} [{config}]: max abs error {err:.3g} vs max |ref| {scale:.3g}"


def test_ppocr_det_other_shape_and_missing_shape():
    path = os.path.join(MODELS, "ch_PP-OCRv4_det_infer.onnx")
    if not os.path.isfile(path):
        pytest.skip("det model missing")
    with pytest.raises(kiln.KilnError, match="dynamic shape"):
        kiln.onnx.import_onnx(path)
    with pytest.raises(kiln.KilnError, match="not a graph input"):
        kiln.onnx.import_onnx(path, {"y": (1, 3, 64, 64)})
    g, info = kiln.onnx.import_onnx(path, {"x": (1, 3, 64, 64)})
    assert info["opset"] == 12 and info["input_names"] == ["x"]
    assert g.num_nodes > 0

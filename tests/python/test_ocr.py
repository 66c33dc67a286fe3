"""PP-OCR end to end (examples/ocr): the real pretrained PP-OCRv4 detection / recognition models and
the PP-OCR mobile v2.0 direction classifier (ONNX files of the PyPI package rapidocr-onnxruntime,
installed by scripts/setup.sh from requirements-models.txt), imported from ONNX and compiled by
examples/ocr/export.py.

1. Reading: images rendered here with PIL in DejaVu Sans (Debian fonts-dejavu-core) at three font
   sizes, three English lines each (letters, digits, punctuation), are read back exactly by the C++
   `ocr` program (case-sensitive; spaces ignored, since the recognizer's spacing is not what is
   tested) with portable kernels, with cpu kernels + xnnpack, and with mlx on MLX's CPU device.
2. Numerics: each model's output on a real input (a rendered page / line, preprocessed as the ocr
   program does) matches ONNX Runtime's (PyPI onnxruntime, the reference) within 1e-4 * max|ORT
   output| (fp32), for every backend configuration above.
Time: shapes are kept small (det canvas 224x320; rec methods of widths 320 and 960, the latter
for the one long line). The portable reference kernels take seconds per recognition call (about
100x the optimized kernels), so they read two pages (six lines, font sizes 24 and 18); the other
configurations read all three. cpu + xnnpack runs with 2 threads (its delegate segments share
one XNNPACK thread pool). mlx runs with MLX_DISABLE_COMPILE=1: otherwise MLX
JIT-compiles its fused CPU kernels with the system C++ compiler on first use (minutes on a fresh
machine); the delegate still runs every node on MLX's CPU device. Every run is a subprocess (the
ocr program or `kiln run`), so these settings never reach other tests.
The ocr binary and the kiln CLI are looked up in $KILN_BUILD_DIR (default: build/).
"""
from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess

import numpy as np
import pytest

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("KILN_BUILD_DIR", os.path.join(ROOT, "build"))
OCR = os.path.join(BUILD, "examples", "ocr", "ocr")
KILN_CLI = os.path.join(BUILD, "tools", "kiln")
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"  # Debian fonts-dejavu-core
DET_SHAPE = (224, 320)
REC_WIDTHS = [320, 960]  # methods w320, w960 of the rec programs; short lines run at 320
REC_WIDTH = REC_WIDTHS[0]

# (font size in pixels, lines): letters of both cases, digits, punctuation.
PAGES = [
    (24, ["Hello World 42", "Kiln reads it.", "Box #7, v1.5"]),
    (18, ["ABC def 2024", "Price: $9.99", "Is it 100%?"]),
    (30, ["Deep Learning", "(OCR) test-run", "Mix 3:2 & 8/9", "Invoice #1234, total: $56.78"]),  # last: w960
]

# Backend configurations: file backend, arguments for both `ocr` and `kiln run`, extra ocr
# arguments, environment, pages read (indices into PAGES).
CONFIGS = {
    "portable": ("portable", ["--kernels", "portable", "--threads", "2"], [], {}, [0, 1]),
    "cpu+xnnpack": ("xnnpack", ["--threads", "2"], [], {}, [0, 1, 2]),
    "mlx-cpu": ("mlx", ["--threads", "2"], ["--setting", "mlx.device=cpu"],
                {"KILN_MLX_DEVICE": "cpu", "MLX_DISABLE_COMPILE": "1"}, [0, 1, 2]),
}


def _load_export():
    spec = importlib.util.spec_from_file_location("ocr_export", os.path.join(ROOT, "examples", "ocr", "export.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


export = _load_export()


def needs(backend: str):
    if backend != "portable" and backend not in kiln._kiln.backend_names():
        pytest.skip(f"the {backend} backend is not built")


@pytest.fixture(scope="module")
def onnx_dir() -> str:
    return export.models_dir()  # raises (test error) when rapidocr-onnxruntime is not installed


@pytest.fixture(scope="module")
def programs(tmp_path_factory, onnx_dir):
    """{backend: {model: path}} compiled once, plus "keys": the key file."""
    out = tmp_path_factory.mktemp("ocr")
    shapes = export.input_shapes(DET_SHAPE, REC_WIDTH)
    files = {"det": export.DET, "cls": export.CLS, "rec": export.REC}
    progs = {"keys": export.write_keys(os.path.join(onnx_dir, export.REC), str(out)), "dir": str(out)}
    for backend in ("portable", "xnnpack", "mlx"):
        if backend != "portable" and backend not in kiln._kiln.backend_names():
            continue
        progs[backend] = {}
        for name, f in files.items():
            path = os.path.join(out, f"{name}_{backend}.kiln")
            if name == "rec":
                export.compile_rec_widths(os.path.join(onnx_dir, f), REC_WIDTHS, backend, path)
            else:
                export.compile_onnx(os.path.join(onnx_dir, f), shapes[name], backend, path)
            progs[backend][name] = path
    return progs


def render(path: str, size: int, lines: list[str]) -> np.ndarray:
    """Black text on white, one line every 1.8 font sizes; returns the RGB pixels."""
    from PIL import Image, ImageDraw, ImageFont
    font = ImageFont.truetype(FONT, size)
    w = max(int(font.getlength(line)) for line in lines) + 2 * size
    h = int(len(lines) * size * 1.8 + size)
    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        draw.text((size, size // 2 + int(i * size * 1.8)), line, font=font, fill="black")
    img.save(path)
    return np.asarray(img)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    d = tmp_path_factory.mktemp("pages")
    out = []
    for k, (size, lines) in enumerate(PAGES):
        path = str(d / f"page{k}.png")
        render(path, size, lines)
        out.append((path, lines))
    return out


def run_ocr(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    assert os.path.isfile(OCR), f"{OCR} not built (needs libopencv-dev and libpolyclipping-dev; cmake --build build --target ocr)"
    return subprocess.run([OCR, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def parse_ocr(stdout: str) -> dict[str, list[tuple[list[int], float, str]]]:
    """{image path: [(box corners x0,y0,...,x3,y3, score, text), ...]} from the ocr program's output."""
    out: dict = {}
    current = None
    for line in stdout.splitlines():
        m = re.match(r"image: (.*) \d+x\d+, \d+ text lines", line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"  box=(-?\d+),(-?\d+);(-?\d+),(-?\d+);(-?\d+),(-?\d+);(-?\d+),(-?\d+) score=([0-9.]+) text=(.*)$", line)
        if m:
            assert current is not None, stdout
            current.append(([int(v) for v in m.groups()[:8]], float(m.group(9)), m.group(10)))
    return out


@pytest.mark.parametrize("config", list(CONFIGS))
def test_reads_rendered_text_exactly(config, programs, pages):
    backend, common, extra, env, which = CONFIGS[config]
    needs(backend)
    pages = [pages[i] for i in which]
    r = run_ocr("--models", programs["dir"], "--backend", backend, *common, *extra, *[p for p, _ in pages], env=env)
    assert r.returncode == 0, r.stderr
    got = parse_ocr(r.stdout)
    for path, lines in pages:
        assert path in got, r.stdout
        texts = [t for _, _, t in got[path]]
        assert [t.replace(" ", "") for t in texts] == [s.replace(" ", "") for s in lines], (config, path, r.stdout)
        for box, score, _ in got[path]:
            assert score >= 0.5
            xs, ys = box[0::2], box[1::2]
            assert min(xs) >= 0 and min(ys) >= 0 and xs[1] > xs[0] and ys[3] > ys[0], box
    # The boxes are in reading order and do not overlap vertically (one box per rendered line).
    for path, _ in pages:
        tops = [b[1] for b, _, _ in got[path]]
        bottoms = [b[5] for b, _, _ in got[path]]
        assert all(bottoms[i] <= tops[i + 1] + 2 for i in range(len(tops) - 1)), got[path]


def _line_input(rgb: np.ndarray, width: int) -> np.ndarray:
    """An RGB line image -> float32[1, 3, 48, width] as ocr.cpp feeds cls / rec (BGR, height 48,
    aspect kept, (v/255-0.5)/0.5, zero padded)."""
    from PIL import Image
    h, w, _ = rgb.shape
    rw = min(width, math.ceil(48 * w / h))
    img = np.asarray(Image.fromarray(rgb).resize((rw, 48), Image.BILINEAR))[:, :, ::-1]
    x = np.zeros((1, 3, 48, width), np.float32)
    x[0, :, :, :rw] = ((img.astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1)
    return x


def _det_input(rgb: np.ndarray) -> np.ndarray:
    from PIL import Image
    H, W = DET_SHAPE
    h, w, _ = rgb.shape
    s = min(H / h, W / w)
    nh, nw = min(H, round(h * s)), min(W, round(w * s))
    img = np.asarray(Image.fromarray(rgb).resize((nw, nh), Image.BILINEAR))[:, :, ::-1]
    x = np.zeros((1, 3, H, W), np.float32)
    x[0, :, :nh, :nw] = ((img.astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1)
    return x


@pytest.fixture(scope="module")
def model_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    page = render(str(d / "page.png"), 24, ["Kiln 2026: ONNX", "vs. Runtime (fp32)"])
    line = render(str(d / "line.png"), 32, ["Quick Fox #9!"])
    flipped = np.ascontiguousarray(line[::-1, ::-1])  # upside down: the classifier's other label
    return {"det": [_det_input(page)], "cls": [_line_input(line, 192), _line_input(flipped, 192)],
            "rec": [_line_input(line, REC_WIDTH)]}


@pytest.mark.parametrize("model", ["det", "cls", "rec"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_model_matches_onnxruntime(model, config, programs, model_inputs, onnx_dir, tmp_path):
    import onnxruntime as ort
    backend, common, _, env, _ = CONFIGS[config]
    needs(backend)
    assert os.path.isfile(KILN_CLI), f"{KILN_CLI} not built"
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    files = {"det": export.DET, "cls": export.CLS, "rec": export.REC}
    sess = ort.InferenceSession(os.path.join(onnx_dir, files[model]), so, providers=["CPUExecutionProvider"])
    for k, x in enumerate(model_inputs[model]):
        (want,) = sess.run(None, {"x": x})
        np.save(tmp_path / f"x{k}.npy", x)
        method = f"w{REC_WIDTH}" if model == "rec" else "forward"
        r = subprocess.run([KILN_CLI, "run", programs[backend][model], "-m", method, "-i", str(tmp_path / f"x{k}.npy"),
                            "-o", str(tmp_path / f"out{k}"), "--numbered", *common], capture_output=True, text=True, timeout=300,
                           env={**os.environ, **env})
        assert r.returncode == 0, r.stdout + r.stderr
        got = np.load(tmp_path / f"out{k}" / "output_0.npy")
        assert got.shape == want.shape, (got.shape, want.shape)
        scale = float(np.max(np.abs(want)))
        err = float(np.max(np.abs(got - want)))
        assert err <= 1e-4 * scale, f"{model} {config}: max abs error {err:.3g} > 1e-4 * {scale:.3g}"
    if model == "cls":  # the inputs exercise both labels (upright '0', upside down '180')
        labels = [int(np.argmax(sess.run(None, {"x": x})[0])) for x in model_inputs["cls"]]
        assert labels == [0, 1], labels
    if model == "rec":  # the output is the line's text, decoded here with the key file
        keys = ["<blank>"] + open(programs["keys"], encoding="utf-8").read().split("\n")[:-1] + [" "]
        idx = got[0].argmax(1)
        text = "".join(keys[i] for t, i in enumerate(idx) if i != 0 and (t == 0 or i != idx[t - 1]))
        assert text.replace(" ", "") == "QuickFox#9!", text


def test_ocr_errors_are_clear(programs, pages, tmp_path):
    r = run_ocr("--models", programs["dir"], "--backend", "portable", str(tmp_path / "missing.png"))
    assert r.returncode == 1 and "missing.png" in r.stderr and "no such file" in r.stderr, r.stderr
    # bad images are reported and skipped; the good one after them is still read; exit status 1
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not a png")
    r = run_ocr("--models", programs["dir"], "--backend", "portable", str(tmp_path), str(junk), pages[0][0])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "is a directory" in r.stderr and "junk.png': cannot decode" in r.stderr, r.stderr
    assert f"image: {pages[0][0]}" in r.stdout and "text=" in r.stdout, r.stdout
    r = run_ocr("--models", str(tmp_path), "--backend", "portable", pages[0][0])
    assert r.returncode == 1 and "ppocr_keys.txt" in r.stderr, r.stderr
    # det where rec is expected: the shape check names the file and what it expected
    r = run_ocr("--models", programs["dir"], "--rec", programs["portable"]["det"], pages[0][0])
    assert r.returncode == 1 and "det_portable.kiln" in r.stderr and "rec" in r.stderr, r.stderr
    r = run_ocr("--threads", "0", pages[0][0])
    assert r.returncode == 2 and "--threads" in r.stderr, r.stderr


def test_upside_down_page_is_turned_by_the_classifier(programs, pages, tmp_path):
    """A page rotated by 180 degrees: the direction classifier turns each crop, so the lines are read
    (in reverse order, bottom line first); without it (--no-cls) the recognizer does not read them."""
    from PIL import Image
    backend, common, extra, env, _ = CONFIGS["cpu+xnnpack"]
    needs(backend)
    path, lines = pages[2]
    flipped = str(tmp_path / "flipped.png")
    Image.open(path).rotate(180).save(flipped)
    args = ["--models", programs["dir"], "--backend", backend, *common, *extra]
    r = run_ocr(*args, flipped, env=env)
    assert r.returncode == 0, r.stderr
    texts = [t.replace(" ", "") for _, _, t in parse_ocr(r.stdout)[flipped]]
    assert texts == [s.replace(" ", "") for s in reversed(lines)], r.stdout
    r = run_ocr(*args, "--no-cls", flipped, env=env)
    assert r.returncode == 0, r.stderr
    texts = [t.replace(" ", "") for _, _, t in parse_ocr(r.stdout)[flipped]]
    assert not any(t == s.replace(" ", "") for t in texts for s in lines), r.stdout

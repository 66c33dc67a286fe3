"""Tests of examples/mv3/classify (the C++ classification example).

Preprocessing is checked against torchvision (Resize(256, bilinear, antialias=False) ->
CenterCrop(224) -> Normalize(ImageNet)) and against a NumPy transcription of the formula documented
in classify.cpp; errors are checked for a clear message and a non-zero exit status.

The classify binary is looked up in $KILN_BUILD_DIR (default: build/) at examples/mv3/classify.
"""
from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from PIL import Image

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("KILN_BUILD_DIR", os.path.join(ROOT, "build"))
CLASSIFY = os.path.join(BUILD, "examples", "mv3", "classify")
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def skimage_photo(name: str) -> str:
    import skimage.data

    path = os.path.join(os.path.dirname(skimage.data.__file__), name)
    assert os.path.isfile(path), f"{path} missing from the installed scikit-image"
    return path


@pytest.fixture(scope="module")
def classify_bin() -> str:
    assert os.path.isfile(CLASSIFY), f"{CLASSIFY} not built (cmake --build build --target classify)"
    return CLASSIFY


def run_classify(binary: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=120)


def write_program(path, input_shape, *, dtype="float32", relu=False) -> str:
    """A program `forward(x) = x + 0` (optionally relu'd): its output equals its input exactly."""
    g = kiln.Graph()
    x = g.add_input("x", dtype, list(input_shape))
    zero = np.zeros(1, np.float32)
    c = g.add_constant("zero", "float32", [1], zero.view(np.uint8))
    (y,) = g.add_node("aten.add", [x, c], {"alpha": 1.0})
    if relu:
        (y,) = g.add_node("aten.relu", [y])
    g.set_outputs([y])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile(fold_constants=False)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


@pytest.fixture(scope="module")
def identity_program(tmp_path_factory) -> str:
    return write_program(tmp_path_factory.mktemp("prog") / "identity.kiln", [1, 3, 224, 224])


def torchvision_reference(path: str) -> np.ndarray:
    """torchvision's eval transform on the decoded 8-bit RGB image, in float32 without antialias."""
    rgb = np.asarray(Image.open(path).convert("RGB"))
    t = torch.from_numpy(rgb.copy()).permute(2, 0, 1).float() / 255.0
    t = TF.resize(t, 256, interpolation=TF.InterpolationMode.BILINEAR, antialias=False)
    t = TF.center_crop(t, [224, 224])
    t = TF.normalize(t, MEAN, STD)
    return t.unsqueeze(0).numpy()


def numpy_reference(path: str) -> np.ndarray:
    """The formula in classify.cpp's header, transcribed to NumPy in float64."""
    p = np.asarray(Image.open(path).convert("RGB")).astype(np.float64) / 255.0
    h, w = p.shape[:2]
    if w <= h:
        rw, rh = 256, int(256 * h / w)
    else:
        rh, rw = 256, int(256 * w / h)
    top, left = round((rh - 224) / 2), round((rw - 224) / 2)  # Python round: half to even

    def taps(n, m, offset):
        # the source coordinate in float32 arithmetic, as documented (and as PyTorch computes it)
        d = np.arange(offset, offset + 224).astype(np.float32)
        scale = np.float32(n) / np.float32(m)
        s = np.maximum(scale * (d + np.float32(0.5)) - np.float32(0.5), np.float32(0)).astype(np.float64)
        i0 = np.minimum(np.floor(s).astype(np.int64), n - 1)
        i1 = np.minimum(i0 + 1, n - 1)
        w1 = s - i0
        return i0, i1, 1.0 - w1, w1

    y0, y1, wy0, wy1 = taps(h, rh, top)
    x0, x1, wx0, wx1 = taps(w, rw, left)
    out = (wy0[:, None, None] * (wx0[None, :, None] * p[y0][:, x0] + wx1[None, :, None] * p[y0][:, x1])
           + wy1[:, None, None] * (wx0[None, :, None] * p[y1][:, x0] + wx1[None, :, None] * p[y1][:, x1]))
    out = (out - np.array(MEAN)) / np.array(STD)
    return out.transpose(2, 0, 1)[None]


def max_err(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def synthetic_images(tmp_path):
    """Shapes that exercise both resize branches, half-pixel crop offsets and upscaling."""
    rng = np.random.default_rng(0)
    out = {}
    for name, (h, w, mode) in {
        "portrait_451x300.png": (451, 300, "RGB"),   # w <= h branch
        "tall_257x256.png": (257, 256, "RGB"),       # crop top = round(16.5) = 16 (half to even)
        "tall_259x256.png": (259, 256, "RGB"),       # crop top = round(17.5) = 18
        "wide_256x259.png": (256, 259, "RGB"),       # crop left = round(17.5) = 18
        "tiny_5x3.png": (5, 3, "RGB"),               # upscaling, clamped taps
        "gray_40x90.png": (40, 90, "L"),             # grayscale -> RGB
        "rgba_120x100.png": (120, 100, "RGBA"),      # alpha dropped, not composited
        "la_70x64.png": (70, 64, "LA"),              # gray + alpha
    }.items():
        c = {"RGB": 3, "L": 1, "RGBA": 4, "LA": 2}[mode]
        a = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
        path = tmp_path / name
        Image.fromarray(a[..., 0] if c == 1 else a, mode).save(path)
        out[name] = str(path)
    return out


def test_preprocessing_matches_torchvision_and_formula(classify_bin, identity_program, tmp_path):
    photos = {n: skimage_photo(n) for n in ("chelsea.png", "coffee.png", "astronaut.png", "camera.png", "logo.png")}
    photos.update(synthetic_images(tmp_path))
    for name, path in photos.items():
        x_path, y_path = tmp_path / f"{name}.x.npy", tmp_path / f"{name}.y.npy"
        r = run_classify(classify_bin, identity_program, path, "--runs", "1", "--save-input", x_path,
                         "--save-logits", y_path)
        assert r.returncode == 0, f"{name}: {r.stderr}"
        x = np.load(x_path)
        assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32, name
        tv = torchvision_reference(path)
        ref = numpy_reference(path)
        scale = float(np.max(np.abs(tv)))
        assert max_err(x, tv) <= 1e-5 * scale, f"{name}: vs torchvision {max_err(x, tv):.3e}"
        assert max_err(x, ref) <= 1e-5 * scale, f"{name}: vs formula {max_err(x, ref):.3e}"
        # The identity program returns its input: the saved logits are the input, bit for bit.
        y = np.load(y_path)
        assert y.shape == (1, 3, 224, 224) and np.array_equal(y, x), name


def test_resize_geometry_is_printed(classify_bin, identity_program):
    r = run_classify(classify_bin, identity_program, skimage_photo("chelsea.png"), "--runs", "1")
    assert r.returncode == 0, r.stderr
    # chelsea is 451x300: short side 300 -> 256, long int(256 * 451 / 300) = 384; crop at (80, 16).
    assert "451x300 (3 channels in file) -> resize 384x256 -> crop 224x224 at x=80 y=16" in r.stdout, r.stdout


def test_jpeg_decodes_close_to_pil(classify_bin, identity_program, tmp_path):
    # JPEG decoders differ in IDCT and chroma upsampling by a few 8-bit levels, so only closeness
    # to PIL's (libjpeg) decode is required; a wrong channel order or layout is far outside this.
    path = skimage_photo("rocket.jpg")
    x_path = tmp_path / "x.npy"
    r = run_classify(classify_bin, identity_program, path, "--runs", "1", "--save-input", x_path)
    assert r.returncode == 0, r.stderr
    x, tv = np.load(x_path), torchvision_reference(path)
    mean_err, max_e = float(np.mean(np.abs(x - tv))), max_err(x, tv)
    # measured: mean 1.1e-4, max 3.1e-2 (about 1.6 levels of 255 after normalization)
    assert mean_err < 2e-3 and max_e < 0.1, f"|stb - PIL|: mean {mean_err:.2e}, max {max_e:.2e} (normalized units)"
    # control: the same comparison with R and B swapped is far off
    assert float(np.mean(np.abs(x[:, ::-1] - tv))) > 10 * mean_err


def test_topk_labels_and_latency(classify_bin, identity_program, tmp_path):
    path = skimage_photo("coffee.png")
    y_path = tmp_path / "y.npy"
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"name{i}\n" for i in range(3 * 224 * 224)))
    r = run_classify(classify_bin, identity_program, path, "--labels", labels, "--top", "7", "--runs", "3",
                     "--save-logits", y_path)
    assert r.returncode == 0, r.stderr
    scores = np.load(y_path).reshape(-1)
    want = np.argsort(-scores, kind="stable")[:7]  # highest first, ties: lower index first
    got = [int(m.group(1)) for m in re.finditer(r"^\s+\d+\. \[(\d+)\] name(\d+)\s", r.stdout, re.M)]
    names = [int(m.group(2)) for m in re.finditer(r"^\s+\d+\. \[(\d+)\] name(\d+)\s", r.stdout, re.M)]
    assert got == list(want) and names == got, r.stdout
    m = re.search(r"^latency: ([0-9.]+) ms \(median of 3 runs after 1 warm-up", r.stdout, re.M)
    assert m and float(m.group(1)) > 0, r.stdout
    assert re.search(r"^model: .* \((\d+) bytes", r.stdout, re.M).group(1) == str(os.path.getsize(identity_program))


def test_relu_program_output(classify_bin, tmp_path):
    prog = write_program(tmp_path / "relu.kiln", [1, 3, 224, 224], relu=True)
    x_path, y_path = tmp_path / "x.npy", tmp_path / "y.npy"
    r = run_classify(classify_bin, prog, skimage_photo("astronaut.png"), "--runs", "2", "--save-input", x_path,
                     "--save-logits", y_path)
    assert r.returncode == 0, r.stderr
    expected = torch.relu(torch.from_numpy(np.load(x_path))).numpy()
    assert np.array_equal(np.load(y_path), expected)


def expect_error(r: subprocess.CompletedProcess, *fragments: str, rc: int = 1):
    assert r.returncode == rc, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    for f in fragments:
        assert f in r.stderr, f"{f!r} not in stderr: {r.stderr}"


def test_missing_image(classify_bin, identity_program, tmp_path):
    missing = tmp_path / "nope.png"
    expect_error(run_classify(classify_bin, identity_program, missing), f"image '{missing}': no such file")


def test_undecodable_image(classify_bin, identity_program, tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_text("this is not a picture\n")
    expect_error(run_classify(classify_bin, identity_program, bad), f"image '{bad}': cannot decode as PNG or JPEG")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(open(skimage_photo("chelsea.png"), "rb").read()[:2000])
    expect_error(run_classify(classify_bin, identity_program, truncated), "cannot decode as PNG or JPEG")
    expect_error(run_classify(classify_bin, identity_program, tmp_path), "not a regular file")


def test_wrong_input_shape(classify_bin, tmp_path):
    prog = write_program(tmp_path / "small.kiln", [1, 3, 8, 8])
    expect_error(run_classify(classify_bin, prog, skimage_photo("chelsea.png")),
                 "takes (float32[1, 3, 8, 8])", "needs exactly one input float32[1, 3, 224, 224]")
    prog = write_program(tmp_path / "batch2.kiln", [2, 3, 224, 224])
    expect_error(run_classify(classify_bin, prog, skimage_photo("chelsea.png")), "takes (float32[2, 3, 224, 224])")


def test_bad_program(classify_bin, identity_program, tmp_path):
    garbage = tmp_path / "garbage.kiln"
    garbage.write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    expect_error(run_classify(classify_bin, garbage, skimage_photo("chelsea.png")), f"model '{garbage}'",
                 "InvalidProgram")
    truncated = tmp_path / "truncated.kiln"
    truncated.write_bytes(open(identity_program, "rb").read()[:200])
    expect_error(run_classify(classify_bin, truncated, skimage_photo("chelsea.png")), "InvalidProgram")
    expect_error(run_classify(classify_bin, tmp_path / "missing.kiln", skimage_photo("chelsea.png")), "NotFound")


def test_labels_errors(classify_bin, identity_program, tmp_path):
    missing = tmp_path / "classes.txt"
    expect_error(run_classify(classify_bin, identity_program, skimage_photo("chelsea.png"), "--labels", missing),
                 f"labels file '{missing}': no such file")
    short = tmp_path / "short.txt"
    short.write_text("cat\ndog\n")
    expect_error(run_classify(classify_bin, identity_program, skimage_photo("chelsea.png"), "--labels", short),
                 "has 2 names but the model has 150528 scores")


def test_usage_errors(classify_bin, identity_program):
    photo = skimage_photo("chelsea.png")
    expect_error(run_classify(classify_bin), "expected MODEL.kiln and IMAGE", rc=2)
    expect_error(run_classify(classify_bin, identity_program, photo, "--top", "0"), "--top must be a positive", rc=2)
    expect_error(run_classify(classify_bin, identity_program, photo, "--runs", "x"), "--runs must be a positive", rc=2)
    expect_error(run_classify(classify_bin, identity_program, photo, "--runs"), "--runs needs a value", rc=2)
    expect_error(run_classify(classify_bin, identity_program, photo, "--frobnicate"), "unknown option", rc=2)


def write_logits_program(path, weight: np.ndarray) -> str:
    """forward(x: float32[1, 3, 224, 224]) -> float32[1, K]:
    logits[k] = sum_c (mean_{h,w} x[0, c] + weight[k, c])  (aten.mean, aten.view, aten.add, aten.sum)."""
    k = weight.shape[0]
    g = kiln.Graph()
    x = g.add_input("x", "float32", [1, 3, 224, 224])
    w = g.add_constant("w", "float32", [1, k, 3], np.ascontiguousarray(weight, np.float32).view(np.uint8).reshape(-1))
    (m,) = g.add_node("aten.mean", [x], {"dim": [2, 3], "keepdim": False})
    (m,) = g.add_node("aten.view", [m], {"size": [1, 1, 3]})
    (s,) = g.add_node("aten.add", [m, w], {"alpha": 1.0})
    (y,) = g.add_node("aten.sum", [s], {"dim": [2], "keepdim": False})
    g.set_outputs([y])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile()
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def test_logits_program_topk_against_torch(classify_bin, tmp_path):
    weight = np.random.default_rng(3).standard_normal((10, 3)).astype(np.float32)
    prog = write_logits_program(tmp_path / "ten.kiln", weight)
    labels = tmp_path / "ten.txt"
    names = ["tench", "goldfish", "great white shark", "tiger shark", "hammerhead", "electric ray", "stingray",
             "cock", "hen", "ostrich"]
    labels.write_text("\r\n".join(names) + "\r\n")  # CRLF line ends are accepted
    x_path, y_path = tmp_path / "x.npy", tmp_path / "y.npy"
    r = run_classify(classify_bin, prog, skimage_photo("coffee.png"), "--labels", labels, "--top", "3",
                     "--save-input", x_path, "--save-logits", y_path)
    assert r.returncode == 0, r.stderr
    assert "float32[1, 3, 224, 224] -> float32[1, 10]" in r.stdout, r.stdout
    x = torch.from_numpy(np.load(x_path))
    expected = (x.mean(dim=(2, 3)).view(1, 1, 3) + torch.from_numpy(weight)[None]).sum(dim=2).numpy()
    y = np.load(y_path)
    assert y.shape == (1, 10) and y.dtype == np.float32
    assert max_err(y, expected) <= 1e-5 * float(np.max(np.abs(expected)))
    top = np.argsort(-expected[0], kind="stable")[:3]
    printed = re.findall(r"^\s+(\d)\. \[(\d+)\] (.+?)\s+(-?[0-9.]+)$", r.stdout, re.M)
    assert [(int(i), int(c), n) for i, c, n, _ in printed] == [(j + 1, int(c), names[c]) for j, c in enumerate(top)]
    assert [float(v) for *_, v in printed] == pytest.approx([float(expected[0, c]) for c in top], abs=1e-4)
    # --top larger than the number of classes prints all of them
    r = run_classify(classify_bin, prog, skimage_photo("coffee.png"), "--top", "50", "--runs", "1")
    assert r.returncode == 0 and "top-10:" in r.stdout and len(re.findall(r"^\s+\d+\. \[", r.stdout, re.M)) == 10

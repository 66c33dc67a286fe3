"""Compiles the PP-OCR models shipped in the PyPI package rapidocr-onnxruntime (installed by
scripts/setup.sh from requirements-models.txt; only its model files are used) to .kiln programs for
the `ocr` program, and writes the recognition character list.

    PYTHONPATH=python python examples/ocr/export.py                        # every built backend
    PYTHONPATH=python python examples/ocr/export.py --backends portable xnnpack --out-dir build/ocr
    PYTHONPATH=python python examples/ocr/export.py --det-shape 320x480 --rec-widths 320

Files (in --out-dir, default build/ocr), for each backend B of --backends (default: every backend
this build has: portable and, when built, xnnpack and mlx):
    det_<B>.kiln   ch_PP-OCRv4_det_infer.onnx           float32[1, 3, H, W] -> float32[1, 1, H, W]
    cls_<B>.kiln   ch_ppocr_mobile_v2.0_cls_infer.onnx  float32[1, 3, 48, 192] -> float32[1, 2]
    rec_<B>.kiln   ch_PP-OCRv4_rec_infer.onnx           method w<Wr> for each Wr of --rec-widths:
                                                        float32[1, 3, 48, Wr] -> float32[1, Wr / 8, 6625]
    ppocr_keys.txt the recognition characters, one per line, exactly as stored in the rec model's
                   ONNX metadata_props["character"] (6623 characters); the ocr program adds the
                   CTC blank (class 0) before them and ' ' after them (PaddleOCR CTCLabelDecode).
Kiln programs have static shapes: H x W (--det-shape, default 480x640) is the detection canvas the
ocr program scales each image into. The rec program has one method per width of --rec-widths
(default 320,480,640,960; the constants are stored once): ocr resizes each line to height 48 with
its aspect ratio and runs the narrowest method it fits in (zero padded; lines wider than the widest
method are squeezed), as PaddleOCR sizes the recognizer's input by the lines' aspect ratio (at
least 320, RapidOCR's rec_img_shape). One wide method for all lines would hurt: with 640 a 7:1 line
is half padding and the recognizer drops its spaces and loses confidence.
*_xnnpack.kiln / *_mlx.kiln are compiled with backends=(B,): the nodes the backend takes run in its
delegate segments, the others on Kiln's kernels (the summary line gives the split).
Exit status 1 if any file failed (each failure is reported in one line; the others are written).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

DET = "ch_PP-OCRv4_det_infer.onnx"
CLS = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
REC = "ch_PP-OCRv4_rec_infer.onnx"
KEYS_FILE = "ppocr_keys.txt"


def models_dir() -> str:
    """Folder of the ONNX files inside the installed rapidocr_onnxruntime package (found without
    importing it: its __init__ imports its own dependencies, which are not installed)."""
    import importlib.util
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("rapidocr_onnxruntime is not installed: run scripts/setup.sh "
                                "(requirements-models.txt)")
    d = os.path.join(list(spec.submodule_search_locations)[0], "models")
    for f in (DET, CLS, REC):
        if not os.path.isfile(os.path.join(d, f)):
            raise FileNotFoundError(f"{os.path.join(d, f)} is missing (rapidocr-onnxruntime==1.4.4 ships it)")
    return d


def read_keys(rec_onnx: str) -> list[str]:
    """The recognition characters stored in the rec model's metadata_props["character"] (one per
    line). Raises ValueError when the key is absent or empty."""
    import onnx
    m = onnx.load(rec_onnx, load_external_data=False)
    for p in m.metadata_props:
        if p.key == "character":
            keys = p.value.split("\n")
            if keys and keys[-1] == "":
                keys.pop()
            if not keys:
                break
            return keys
    raise ValueError(f"{rec_onnx}: no 'character' entry in metadata_props")


def write_keys(rec_onnx: str, out_dir: str) -> str:
    keys = read_keys(rec_onnx)
    path = os.path.join(out_dir, KEYS_FILE)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(keys) + "\n")
    return path


def input_shapes(det_shape: tuple[int, int], rec_width: int) -> dict[str, tuple[int, ...]]:
    """Static input shape of each model (ONNX input "x" of all three); rec at one width."""
    return {"det": (1, 3, *det_shape), "cls": (1, 3, 48, 192), "rec": (1, 3, 48, rec_width)}


def compile_rec_widths(onnx_path: str, widths: list[int], backend: str, out: str) -> str:
    """The rec model imported once per width W of `widths`, as methods "w<W>" of one program
    (input float32[1, 3, 48, W]; the weights are stored once), compiled for `backend` as
    compile_onnx does; writes `out`. Returns a one-line summary; raises KilnError on failure."""
    import kiln
    import kiln.onnx
    pb = kiln.ProgramBuilder()
    for w in widths:
        graph, _ = kiln.onnx.import_onnx(onnx_path, {"x": [1, 3, 48, w]})
        pb.add_method(f"w{w}", graph)
    data, rep = pb.compile(backends=[] if backend == "portable" else [backend])
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, out)
    parts = []
    for m in rep["methods"]:
        split = "".join(f", {b['backend']}: {b['segments']} segment(s) of {b['nodes']} nodes"
                        for b in m["delegation"]["backends"])
        parts.append(f"{m['name']}: {m['num_nodes']} nodes{split}")
    return f"{len(data) / 1e6:.1f} MB; " + "; ".join(parts)


def compile_onnx(onnx_path: str, shape: tuple[int, ...], backend: str, out: str) -> str:
    """Imports `onnx_path` with Kiln's ONNX frontend (kiln.onnx), input "x" fixed to `shape`, and
    compiles it for `backend` ("portable": no delegate; "xnnpack" / "mlx": backends=(backend,), the
    nodes the backend declines run on Kiln's kernels); writes `out`. Returns a one-line summary;
    raises KilnError / ExportError on failure."""
    import kiln.onnx
    backends = () if backend == "portable" else (backend,)
    res = kiln.onnx.compile_onnx(onnx_path, out=out, input_shapes={"x": list(shape)}, backends=backends, verbose=False)
    m = res.report["methods"][0]
    split = "".join(f", {b['backend']}: {b['segments']} segment(s) of {b['nodes']} nodes"
                    for b in m["delegation"]["backends"])
    return f"{res.file_size / 1e6:.1f} MB, {m['num_nodes']} nodes{split}, arena {m['arena_bytes'] / 1e6:.1f} MB"


def parse_hw(s: str) -> tuple[int, int]:
    h, w = (int(v) for v in s.lower().split("x"))
    if h < 32 or w < 32 or h % 32 or w % 32:
        raise argparse.ArgumentTypeError(f"--det-shape needs HxW, multiples of 32 (the DB network's stride), got {s}")
    return h, w


def parse_widths(s: str) -> list[int]:
    out = sorted({int(v) for v in s.split(",") if v})
    if not out or any(w < 32 or w % 8 for w in out):
        raise argparse.ArgumentTypeError(f"--rec-widths needs widths that are multiples of 8, at least 32, got {s}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Compile the PP-OCR models to .kiln programs (one per model and backend).")
    p.add_argument("--out-dir", default=os.path.join(ROOT, "build", "ocr"), help="output folder (default build/ocr)")
    p.add_argument("--backends", nargs="+", metavar="NAME",
                   help="portable, xnnpack, mlx (default: every backend this build has)")
    p.add_argument("--models", nargs="+", default=["det", "cls", "rec"], choices=["det", "cls", "rec"])
    p.add_argument("--det-shape", type=parse_hw, default=(480, 640), metavar="HxW",
                   help="detection canvas (default 480x640)")
    p.add_argument("--rec-widths", type=parse_widths, default=[320, 480, 640, 960], metavar="W,W,...",
                   help="recognition input widths, one method w<W> each (default 320,480,640,960)")
    p.add_argument("--onnx-dir", help="folder of the three ONNX files (default: the rapidocr_onnxruntime package's)")
    args = p.parse_args(argv)

    from kiln.capture import BUILT_BACKENDS
    backends = args.backends or list(BUILT_BACKENDS)
    src = args.onnx_dir or models_dir()
    os.makedirs(args.out_dir, exist_ok=True)
    print(f"keys: wrote {write_keys(os.path.join(src, REC), args.out_dir)}")
    files = {"det": DET, "cls": CLS, "rec": REC}
    shapes = input_shapes(args.det_shape, args.rec_widths[0])
    failed = 0
    for name in args.models:
        for backend in backends:
            out = os.path.join(args.out_dir, f"{name}_{backend}.kiln")
            t0 = time.perf_counter()
            try:
                if name == "rec":
                    summary = compile_rec_widths(os.path.join(src, files[name]), args.rec_widths, backend, out)
                    print(f"{name} ({backend}): wrote {out} ({summary}, {time.perf_counter() - t0:.1f} s)")
                    continue
                summary = compile_onnx(os.path.join(src, files[name]), shapes[name], backend, out)
                print(f"{name} ({backend}): wrote {out} (input {'x'.join(map(str, shapes[name]))}, {summary}, "
                      f"{time.perf_counter() - t0:.1f} s)")
            except Exception as e:  # noqa: BLE001 - one line per failed file, the others are still written
                failed += 1
                print(f"{name} ({backend}): FAILED: {type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

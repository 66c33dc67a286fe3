#!/usr/bin/env python3
"""Weight-only quantization of mobilenet_v3_large: program sizes, agreement with float32 and speed.

    PYTHONPATH=python python bench/quant_mv3.py [--weights PATH.pth] [--out-dir out/quant] [--runs 30]

Weights: torchvision's mobilenet_v3_large with PATH.pth, or (default; nothing is downloaded) the
mv3 demo's calibrated random weights (examples/mv3/demo.py random_weights: BatchNorm statistics
measured on chelsea/coffee/astronaut, logits of order 1). Inputs: every photo in scikit-image's data
folder (RGB-converted) and its mirror image, preprocessed as the mv3 demo (resize 256, center crop
224, ImageNet normalization). For each configuration the script exports a program, runs every input
on Kiln's cpu kernels and compares with the float32 program: top-1 agreement, and the relative logit
error max|l - l_fp32| / max|l_fp32| (max and mean over inputs). Latency and peak RSS come from
`build/tools/kiln bench FILE --threads T --runs N --json` (one process per program). Prints a Markdown
table (docs/quantization.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "mv3"))
sys.path.insert(0, os.path.join(ROOT, "python"))

import kiln  # noqa: E402

CONFIGS = [  # (label, export kwargs)
    ("fp32", {}),
    ("fp16 weights", {"weights_dtype": "float16"}),
    ("w8", {"quantize": "w8"}),
    ("w8 + fp16 rest", {"quantize": "w8", "scale_dtype": "float16", "weights_dtype": "float16"}),
    ("w4 g128", {"quantize": "w4", "group_size": 128}),
    ("w4 g32", {"quantize": "w4", "group_size": 32}),
    ("w4 g32 asym", {"quantize": "w4", "group_size": 32, "symmetric": False}),
    ("w4 g32 + fp16 rest", {"quantize": "w4", "group_size": 32, "scale_dtype": "float16", "weights_dtype": "float16"}),
    # 4-bit everywhere but the first convolution and the depthwise ones (kH * kW = 9 or 25 values
    # per channel), which stay float32.
    ("w4 g32, dw + first conv fp32", {"quantize": "w4", "group_size": 32,
                                      "exclude": ["features.0.*", "features.1.block.0.*", "features.*.block.1.*"]}),
    ("w8, dw + first conv fp32", {"quantize": "w8",
                                  "exclude": ["features.0.*", "features.1.block.0.*", "features.*.block.1.*"]}),
]


def photos() -> list[np.ndarray]:
    import skimage.data
    from PIL import Image
    import torchvision.transforms.functional as TF
    folder = os.path.dirname(skimage.data.__file__)
    out = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".png", ".jpg")):
            continue
        t = TF.pil_to_tensor(Image.open(os.path.join(folder, name)).convert("RGB")).float() / 255.0
        t = TF.center_crop(TF.resize(t, 256, antialias=False), [224, 224])
        t = TF.normalize(t, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
        out += [t[None].numpy().copy(), t.flip(-1)[None].numpy().copy()]
    return out


def dequantized(w: np.ndarray, kw: dict) -> np.ndarray:
    """w [rows, k] float32 -> the float32 weight Kiln's packed form encodes (src/ir/ops/quant.h), from the
    bytes kiln._kiln.quantize_matrix (the compiler's quantizer) returns."""
    scheme, gs = kw["quantize"], kw.get("group_size", 128)
    sdt = np.dtype(kw.get("scale_dtype", "float32"))
    packed, scales, zeros = kiln._kiln.quantize_matrix(w, scheme, gs, kw.get("symmetric", True), sdt.name)
    rows, k = w.shape
    gs = k if scheme == "w8" else min(gs, k)
    s = np.repeat(scales.view(sdt).astype(np.float32).reshape(rows, -1), gs, axis=1)[:, :k]
    if scheme == "w8":
        return packed.view(np.int8).reshape(rows, k).astype(np.float32) * s
    b = packed.reshape(rows, -1)
    u = np.stack([b & 0xF, b >> 4], axis=-1).reshape(rows, -1)[:, :k].astype(np.float32)
    out = (u - 8) * s
    if zeros.size:
        out = out + np.repeat(zeros.view(sdt).astype(np.float32).reshape(rows, -1), gs, axis=1)[:, :k]
    return out


def fake_quantized(model: torch.nn.Module, kw: dict) -> torch.nn.Module:
    """PyTorch reference of a quantized program: batch norms folded into their convolutions
    (torch.nn.utils.fusion.fuse_conv_bn_eval, as Kiln's fold_batch_norm pass), then every Conv2d /
    Linear weight replaced by its dequantized Kiln quantization (except modules matching an
    `exclude` pattern, as Kiln's pass); runs in eager float32."""
    import copy
    import fnmatch
    from torch.nn.utils.fusion import fuse_conv_bn_eval
    m = copy.deepcopy(model).eval()
    for mod in m.modules():
        if isinstance(mod, torch.nn.Sequential) and len(mod) >= 2 and isinstance(mod[0], torch.nn.Conv2d) \
                and isinstance(mod[1], torch.nn.BatchNorm2d):
            mod[0] = fuse_conv_bn_eval(mod[0], mod[1])
            mod[1] = torch.nn.Identity()
    with torch.no_grad():
        for name, mod in m.named_modules():
            if any(fnmatch.fnmatchcase(name, p) for p in kw.get("exclude", ())):
                continue
            if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
                w = mod.weight.detach().numpy().reshape(mod.weight.shape[0], -1).astype(np.float32)
                mod.weight.copy_(torch.from_numpy(dequantized(w, kw)).reshape(mod.weight.shape))
    return m


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", help="torchvision state dict of mobilenet_v3_large (default: demo random weights)")
    p.add_argument("--out-dir", default=os.path.join(ROOT, "out", "quant"))
    p.add_argument("--cli", default=os.path.join(ROOT, "build", "tools", "kiln"))
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    weights = args.weights
    if weights is None:
        import demo
        folder = os.path.join(args.out_dir, "random_weights")
        weights = os.path.join(folder, "mobilenet_v3_large.pth")
        if not os.path.isfile(weights):
            demo.random_weights(["mobilenet_v3_large"], folder, list(demo.photo_paths().values()))
    model = torchvision.models.mobilenet_v3_large(weights=None)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    model.eval()
    inputs = photos()
    example = torch.from_numpy(inputs[0])
    rows, ref = [], None
    for label, kw in CONFIGS:
        path = os.path.join(args.out_dir, "mv3l_" + label.replace(" ", "_").replace("+", "") + ".kiln")
        kiln.export(model, (example,), out=path, verbose=False, **kw)
        prog = kiln.load(path)
        logits = np.concatenate([prog.run(x)[0] for x in inputs])
        if ref is None:
            ref = logits
            with torch.no_grad():
                eager = torch.cat([model(torch.from_numpy(x)) for x in inputs]).numpy()
            print(f"fp32 program vs eager: max |logit diff| {np.abs(ref - eager).max():.2e}", file=sys.stderr)
        top1 = float(np.mean(logits.argmax(1) == ref.argmax(1)))
        check = float("nan")
        if kw.get("quantize") and kw.get("weights_dtype", "float32") == "float32":
            fq = fake_quantized(model, kw)
            with torch.no_grad():
                sim = torch.cat([fq(torch.from_numpy(x)) for x in inputs]).numpy()
            check = float(np.abs(logits - sim).max() / np.abs(sim).max())
        rel = np.abs(logits - ref).max(1) / np.abs(ref).max(1)
        b = {"median_ms": float("nan"), "peak_rss_mib": float("nan")}
        if args.runs > 0:  # --runs 0: no timing (bench/quant_latency.py times in interleaved rounds)
            b = json.loads(subprocess.run([args.cli, "bench", path, "--threads", str(args.threads), "--runs",
                                           str(args.runs), "--json"], check=True, capture_output=True, text=True).stdout)
        rows.append((label, os.path.getsize(path), top1, float(rel.max()), float(rel.mean()), b["median_ms"],
                     b["peak_rss_mib"], check))
        print(rows[-1], file=sys.stderr, flush=True)
    base = rows[0][1]
    half = rows[1][1]
    timed = args.runs > 0
    print(f"mobilenet_v3_large, {len(inputs)} inputs ({len(inputs) // 2} scikit-image photos and their mirrors), "
          f"cpu kernels" + (f", {args.threads} threads, median of {args.runs} runs" if timed else "") + "\n")
    print("| program | file size | vs fp32 | vs fp16 | top-1 = fp32 | rel. logit error max / mean | "
          "vs PyTorch fake-quant |" + (" latency | peak RSS |" if timed else ""))
    print("|---|---|---|---|---|---|---|" + ("---|---|" if timed else ""))
    for label, size, top1, rmax, rmean, ms, rss, check in rows:
        chk = "" if check != check else f"{check:.1e}"
        print(f"| {label} | {size / 2**20:.2f} MiB | {size / base:.2f}x | {size / half:.2f}x | {top1 * 100:.1f}% | "
              f"{rmax:.4f} / {rmean:.4f} | {chk} |" + (f" {ms:.2f} ms | {rss:.1f} MiB |" if timed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

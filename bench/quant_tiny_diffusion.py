#!/usr/bin/env python3
"""Weight-only quantization of the tiny diffusion stand-ins (tests/python/tiny_models.py: a CLIP-like
text encoder, an SD-like UNet, a TAESD-like decoder) in one three-method program: file size and, per
method, the relative output error max|y - y_fp32| / max|y_fp32| of each scheme against the float32
program, plus the same against a PyTorch eager run of the same weights (fp32 only).

    PYTHONPATH=python python bench/quant_tiny_diffusion.py

Random weights (torch.manual_seed(0)); not the real diffusion pipeline (examples/diffusion, issue 6,
was not on main when this was written). Prints a Markdown table (docs/quantization.md).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import kiln  # noqa: E402
from tiny_models import TAESDish, TextEnc, TinyUNet  # noqa: E402

CONFIGS = [
    ("fp32", {}),
    ("fp16 weights", {"weights_dtype": "float16"}),
    ("w8", {"quantize": "w8"}),
    ("w4 g128", {"quantize": "w4", "group_size": 128}),
    ("w4 g32", {"quantize": "w4", "group_size": 32}),
    ("w4 g32 asym", {"quantize": "w4", "group_size": 32, "symmetric": False}),
    ("w4 g32 + fp16 rest", {"quantize": "w4", "group_size": 32, "scale_dtype": "float16", "weights_dtype": "float16"}),
    ("w4 g128 + fp16 rest", {"quantize": "w4", "group_size": 128, "scale_dtype": "float16", "weights_dtype": "float16"}),
    ("w8 + fp16 rest", {"quantize": "w8", "scale_dtype": "float16", "weights_dtype": "float16"}),
]


def main() -> int:
    torch.manual_seed(0)
    enc, unet, dec = TextEnc().eval(), TinyUNet().eval(), TAESDish().eval()
    ids = torch.randint(0, 100, (1, 16))
    x = torch.randn(1, 4, 32, 32)
    t = torch.full((1, 1), 0.5)
    methods = {"encode": (enc, (ids,)), "denoise": (unet, (x, t)), "decode": (dec, (x,))}
    feeds = {"encode": [ids.numpy()], "denoise": [x.numpy(), t.numpy()], "decode": [x.numpy()]}
    with torch.no_grad():
        eager = {"encode": enc(ids).numpy(), "denoise": unet(x, t).numpy(), "decode": dec(x).numpy()}
    ref, rows = None, []
    for label, kw in CONFIGS:
        res = kiln.export_program(methods, verbose=False, **kw)
        prog = kiln.load_bytes(res.data)
        outs = {m: prog.run(*feeds[m], method=m)[0] for m in methods}
        nq = sum(m.get("num_quantized", 0) for m in res.report["methods"])
        if ref is None:
            ref = outs
            errs = {m: float(np.abs(outs[m] - eager[m]).max() / np.abs(eager[m]).max()) for m in methods}
            print("fp32 program vs eager (relative): " + ", ".join(f"{m} {e:.1e}" for m, e in errs.items()),
                  file=sys.stderr)
        errs = {m: float(np.abs(outs[m] - ref[m]).max() / np.abs(ref[m]).max()) for m in methods}
        rows.append((label, len(res.data), nq, errs))
    base, half = rows[0][1], rows[1][1]
    print("| program | file size | vs fp32 | vs fp16 | weights quantized | encode | denoise | decode |")
    print("|---|---|---|---|---|---|---|---|")
    for label, size, nq, e in rows:
        print(f"| {label} | {size / 1024:.0f} KiB | {size / base:.2f}x | {size / half:.2f}x | {nq} | "
              f"{e['encode']:.4f} | {e['denoise']:.4f} | {e['decode']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

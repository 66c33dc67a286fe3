#!/usr/bin/env python3
"""Weight-only quantization of the TINY configuration of the diffusion pipeline
(examples/diffusion/models.py: CLIP-style text encoder, SD-1.5-style UNet, TAESD-style decoder) as
one three-method program (encode / denoise / decode, exported like examples/diffusion/export.py, no
delegate, cpu kernels): file size and, per method, the relative output error
max|y - y_fp32| / max|y_fp32| of each scheme against the float32 program, plus the float32 program
against PyTorch eager.

    PYTHONPATH=python python bench/quant_tiny_diffusion.py [--seed 0]

Weights: models.build("tiny", seed) (seeded random, not trained). Inputs: random token ids, an
N(0, 1) latent, timestep 500 and eager's text embedding for denoise, an N(0, 1) latent for decode.
denoise returns the x0 prediction (x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t), so the UNet's error
enters multiplied by sqrt(1 - abar_t) / sqrt(abar_t) (1.62 at t = 500). Prints a Markdown table
(docs/quantization.md).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

import kiln  # noqa: E402


from diffusion import load_models  # noqa: E402  (bench/diffusion.py: examples/diffusion/models.py by path)


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    models = load_models()
    pipe = models.build("tiny", seed=args.seed)
    tc, uc = pipe.text.cfg, pipe.unet.cfg
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, tc.vocab, (1, tc.tokens), generator=g)
    lat = torch.randn(1, uc.latent_channels, uc.latent_size, uc.latent_size, generator=g)
    t = torch.tensor([500], dtype=torch.int64)
    with torch.no_grad():
        emb = pipe.encode(ids)
        eager = {"encode": emb.numpy(), "denoise": pipe.denoise(lat, t, emb).numpy(),
                 "decode": pipe.decode(lat).numpy()}
    ex = pipe.example_inputs()
    methods = {m: (pipe, ex[m], m) for m in ("encode", "denoise", "decode")}
    feeds = {"encode": [ids.numpy()], "denoise": [lat.numpy(), t.numpy(), emb.numpy()], "decode": [lat.numpy()]}
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

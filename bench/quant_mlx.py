#!/usr/bin/env python3
"""Weight-only quantized programs on the mlx backend (MLX's CPU device) against Kiln's cpu kernels.

    PYTHONPATH=python python bench/quant_mlx.py [--photos 8] [--out-dir out/quant]

For mobilenet_v3_large (the mv3 demo's calibrated random weights, as bench/quant_mv3.py; inputs:
the first --photos scikit-image photos) and the TINY diffusion pipeline (three methods, inputs as
bench/quant_tiny_diffusion.py), each scheme is exported twice from the same module with the same
options: once without a delegate (Kiln's cpu kernels) and once with require_delegation="mlx" (the
export fails unless every node, quantized ones included, is in mlx segments). The quantizer is
deterministic, so both programs hold the same packed weights. Reported per output: the relative
difference max|y_mlx - y_cpu| / max|y_cpu| (the backends' disagreement: fp32 rounding only if the
mlx lowering dequantizes exactly as the cpu kernels), and for context the quantization error of the
cpu program against the float32 cpu program. Prints a Markdown table (docs/quantization.md).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "mv3"))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

import kiln  # noqa: E402

SCHEMES = [
    ("fp32", {}),
    ("w8", {"quantize": "w8"}),
    ("w8, fp16 scales", {"quantize": "w8", "scale_dtype": "float16"}),
    ("w4 g128", {"quantize": "w4", "group_size": 128}),
    ("w4 g32", {"quantize": "w4", "group_size": 32}),
    ("w4 g32 asym, fp16 scales", {"quantize": "w4", "group_size": 32, "symmetric": False, "scale_dtype": "float16"}),
]
MLX = {"mlx.device": "cpu"}


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def mv3_cases(out_dir: str, n_photos: int):
    import demo
    from quant_mv3 import photos
    folder = os.path.join(out_dir, "random_weights")
    weights = os.path.join(folder, "mobilenet_v3_large.pth")
    if not os.path.isfile(weights):
        demo.random_weights(["mobilenet_v3_large"], folder, list(demo.photo_paths().values()))
    model = torchvision.models.mobilenet_v3_large(weights=None)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    model.eval()
    inputs = photos()[:n_photos]

    def export(**kw):
        return kiln.export(model, (torch.from_numpy(inputs[0]),), verbose=False, **kw)

    def run(prog):
        return {"logits": np.concatenate([prog.run(x)[0] for x in inputs])}
    return export, run


def diffusion_cases():
    from diffusion import load_models
    pipe = load_models().build("tiny", seed=0)
    tc, uc = pipe.text.cfg, pipe.unet.cfg
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, tc.vocab, (1, tc.tokens), generator=g)
    lat = torch.randn(1, uc.latent_channels, uc.latent_size, uc.latent_size, generator=g)
    t = torch.tensor([500], dtype=torch.int64)
    with torch.no_grad():
        emb = pipe.encode(ids)
    ex = pipe.example_inputs()
    methods = {m: (pipe, ex[m], m) for m in ("encode", "denoise", "decode")}
    feeds = {"encode": [ids.numpy()], "denoise": [lat.numpy(), t.numpy(), emb.numpy()], "decode": [lat.numpy()]}

    def export(**kw):
        return kiln.export_program(methods, verbose=False, **kw)

    def run(prog):
        return {m: prog.run(*feeds[m], method=m)[0] for m in methods}
    return export, run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", type=int, default=8)
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "out", "quant"))
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    print("| model | program | nodes in mlx (quantized) | output | mlx vs cpu kernels | cpu: vs fp32 |")
    print("|---|---|---|---|---|---|")
    for model_name, (export, run) in (("tiny diffusion", diffusion_cases()),
                                      (f"mobilenet_v3_large ({args.photos} photos)", mv3_cases(args.out_dir, args.photos))):
        fp32 = None
        for label, kw in SCHEMES:
            cpu = run(kiln.load_bytes(export(**kw).data))
            res = export(backends=("mlx",), require_delegation="mlx", **kw)
            mlx = run(kiln.load_bytes(res.data, backend_settings=MLX))
            if fp32 is None:
                fp32 = cpu
            nodes = sum(b["nodes"] for m in res.report["methods"] for b in m["delegation"]["backends"]
                        if b["backend"] == "mlx")
            nq = sum(m.get("num_quantized", 0) for m in res.report["methods"])
            for out in cpu:
                print(f"| {model_name} | {label} | {nodes} ({nq}) | {out} | {rel(mlx[out], cpu[out]):.1e} | "
                      f"{rel(cpu[out], fp32[out]):.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

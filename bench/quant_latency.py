#!/usr/bin/env python3
"""Latency and peak RSS of weight-only quantized programs against float32 on Kiln's cpu kernels:
mobilenet_v3_large (1x3x224x224) and the tiny UNet stand-in (tests/python/tiny_models.py, latent
1x4x64x64). Each program is timed with `build/tools/kiln bench FILE --threads T --runs N --json`
(one process each, so peak RSS is the program's own), in interleaved rounds (fp32, w8, w4, fp32, ...)
so that load from other processes on a shared machine hits every program alike; the table gives the
lowest median over the rounds.

    PYTHONPATH=python python bench/quant_latency.py [--rounds 3] [--runs 20] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import kiln  # noqa: E402
from tiny_models import TinyUNet  # noqa: E402

CONFIGS = [("fp32", {}), ("fp16 weights", {"weights_dtype": "float16"}), ("w8", {"quantize": "w8"}),
           ("w4 g128", {"quantize": "w4", "group_size": 128}), ("w4 g32", {"quantize": "w4", "group_size": 32})]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=os.path.join(ROOT, "out", "quant"))
    p.add_argument("--cli", default=os.path.join(ROOT, "build", "tools", "kiln"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    torch.manual_seed(0)
    models = {"mobilenet_v3_large": (torchvision.models.mobilenet_v3_large(weights=None).eval(),
                                     (torch.randn(1, 3, 224, 224),)),
              "tiny UNet 64x64": (TinyUNet().eval(), (torch.randn(1, 4, 64, 64), torch.full((1, 1), 0.5)))}
    files = {}
    for mname, (m, args) in models.items():
        for label, kw in CONFIGS:
            path = os.path.join(a.out_dir, f"lat_{mname.split()[0]}_{label.replace(' ', '_')}.kiln")
            kiln.export(m, args, out=path, verbose=False, **kw)
            files[(mname, label)] = path
    best = {}
    for _ in range(a.rounds):
        for key, path in files.items():
            out = subprocess.run([a.cli, "bench", path, "--threads", str(a.threads), "--runs", str(a.runs), "--json"],
                                 check=True, capture_output=True, text=True).stdout
            b = json.loads(out)
            old = best.get(key)
            best[key] = (min(b["median_ms"], old[0]) if old else b["median_ms"], b["peak_rss_mib"])
    print(f"cpu kernels, {a.threads} thread(s), lowest median of {a.rounds} interleaved rounds of {a.runs} runs\n")
    print("| model | program | file size | latency | vs fp32 | peak RSS |")
    print("|---|---|---|---|---|---|")
    for (mname, label), path in files.items():
        ms, rss = best[(mname, label)]
        base = best[(mname, "fp32")][0]
        print(f"| {mname} | {label} | {os.path.getsize(path) / 2**20:.2f} MiB | {ms:.2f} ms | {ms / base:.2f}x | "
              f"{rss:.1f} MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

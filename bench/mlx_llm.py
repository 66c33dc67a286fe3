#!/usr/bin/env python3
"""The mlx delegate on a generative model (issue 20): the boundary cost of a decode step.

A 2-layer LlamaForCausalLM with Llama-3.2-1B-shaped layers (bench/llm_decode.py's model: hidden 2048,
32 heads, 8 KV heads, head_dim 64, MLP 8192, vocab 2048; seeded random weights) is exported with
``kiln.export_llm(..., require_delegation="mlx")`` (one mlx segment, the KV cache held in MLX's
memory) for each format asked (fp32; fp16 = compute_dtype float16; w4 = int4 groups of 32), and
run with ``build/tools/kiln generate --json`` under KILN_MLX_PROFILE=1 on MLX's CPU device (default)
or its GPU (--device gpu: Metal, or CUDA with the mlx[cuda13] wheel). Per format it prints prefill
and decode tokens/s, the steady decode step (executes of a graph that had run before: no trace, no
first-run kernel compile) in ms and the share of it spent outside MLX's evaluation (wrapping inputs,
replaying the compiled function, copying the logits out: issue 20 asks for < 5% on MLX's CPU
device), the host<->device copies per execute with their bytes (tokens and input_pos in, logits
out; the KV cache is uploaded once per session from its initial value, never per step), and how
many of the greedy tokens agree with the same weights on Kiln's CPU kernels (fp32 and fp16 against
the fp32 program, w4 against the CPU kernels' w4 program; fp32: all of them). "decode tok/s" is
`kiln generate`'s, whose first decode step traces and compiles the seq = 1 graph (on MLX's CPU
device, also the C++ of its fused kernels the first time on a machine): the steady step is the
per-token cost.

    PYTHONPATH=python python bench/mlx_llm.py                     # MLX's CPU device, fp32
    PYTHONPATH=python python bench/mlx_llm.py --formats fp32,fp16,w4 --steps 64
    PYTHONPATH=python python bench/mlx_llm.py --device gpu        # an MLX GPU build
    PYTHONPATH=python python bench/mlx_llm.py --quick             # small layers, < 1 minute

Figures, not assertions; CI does not run it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import llm_decode  # noqa: E402  (bench/llm_decode.py: the model and the machine description)

PROFILE = re.compile(
    r"\[kiln mlx\] (?P<executes>\d+) executes, .*?host<->device copies per execute: (?P<copies_in>[\d.]+) in "
    r"\((?P<bytes_in>\d+) bytes\), (?P<copies_out>[\d.]+) out \((?P<bytes_out>\d+) bytes\); held states uploaded: "
    r"(?P<uploads>\d+) \((?P<upload_bytes>\d+) bytes\); graphs built: (?P<graphs>\d+) \((?P<build_ms>[\d.]+) ms\); "
    r"steady: (?P<steady>\d+) executes, (?P<step_ms>[\d.]+) ms each, outside eval (?P<outside>[\d.]+)%")

FORMATS = {"fp32": {}, "fp16": {"compute_dtype": "float16"}, "w4": {"quantize": "w4", "group_size": 32}}


def export(ckpt: str, fmt: str, max_seq_len: int, work: str) -> str:
    import kiln
    out = os.path.join(work, f"llama2l_{fmt}_mlx.kiln")
    if not os.path.exists(out):
        kiln.export_llm(ckpt, max_seq_len, out=out, require_delegation="mlx", verbose=False, **FORMATS[fmt])
    return out


def generate(cli: str, path: str, prompt: list[int], steps: int, env: dict) -> tuple[dict, dict | None, str]:
    r = subprocess.run([cli, "generate", path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens",
                        str(steps), "--ignore-eos", "--threads", "1", "--json"], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {}, None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
    m = PROFILE.search(r.stderr)
    return json.loads(r.stdout), ({k: float(v) for k, v in m.groupdict().items()} if m else None), ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="MLX device (KILN_MLX_DEVICE)")
    p.add_argument("--formats", default="fp32", help="comma-separated: fp32, fp16, w4 (default fp32)")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens (default 64)")
    p.add_argument("--steps", type=int, default=32, help="tokens generated (default 32)")
    p.add_argument("--max-seq-len", type=int, default=512, help="KV-cache positions (default 512)")
    p.add_argument("--quick", action="store_true", help="small layers (hidden 256), for a smoke run")
    p.add_argument("--cli", default=os.path.join(ROOT, "build", "tools", "kiln"))
    p.add_argument("--work", help="folder for the checkpoint and programs (default: a temporary one; reused when given)")
    a = p.parse_args(argv)
    formats = [f.strip() for f in a.formats.split(",") if f.strip()]
    for f in formats:
        if f not in FORMATS:
            p.error(f"unknown format {f!r} (choose from {', '.join(FORMATS)})")
    if a.prompt + a.steps > a.max_seq_len:
        p.error("--prompt + --steps must fit in --max-seq-len")
    size = dict(llm_decode.QUICK if a.quick else llm_decode.FULL)
    size["caps"] = (a.max_seq_len,)
    work = a.work or tempfile.mkdtemp(prefix="kiln-mlx-llm-")
    os.makedirs(work, exist_ok=True)
    ckpt = os.path.join(work, "ckpt")
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        llm_decode.build_checkpoint(size, ckpt)
    import kiln
    prompt = np.random.default_rng(0).integers(3, size["vocab_size"], a.prompt).tolist()
    env = dict(os.environ, KILN_MLX_PROFILE="1", KILN_MLX_DEVICE=a.device)
    bases = {}  # the same weights on Kiln's CPU kernels: "fp32", and "w4" when asked

    def base_for(fmt: str) -> dict:
        key = "w4" if fmt == "w4" else "fp32"
        if key not in bases:
            path = os.path.join(work, f"llama2l_{key}_cpu.kiln")
            if not os.path.exists(path):
                kiln.export_llm(ckpt, a.max_seq_len, out=path, verbose=False,
                                **({"quantize": "w4", "group_size": 32} if key == "w4" else {}))
            bases[key], _, _ = generate(a.cli, path, prompt, a.steps, dict(os.environ))
        return bases[key]

    base = base_for("fp32")
    model, flags = llm_decode.cpu_info()
    print(f"# mlx delegate, generative model ({'quick' if a.quick else '2 Llama-3.2-1B-shaped layers'}, vocab "
          f"{size['vocab_size']}, max_seq_len {a.max_seq_len}, prompt {a.prompt}, {a.steps} new tokens)")
    print(f"- MLX device: {a.device}; CPU: {model} ({os.cpu_count()} cores; {flags}); kiln {llm_decode.kiln_commit()}")
    print(f"- Kiln CPU kernels, same weights (1 thread): prefill {base['prefill_tokens_per_s']:.1f} tokens/s, "
          f"decode {base['decode_tokens_per_s']:.2f} tokens/s")
    print()
    print("| format | prefill tok/s | decode tok/s | steady step ms | outside eval (steady) | copies in / out per "
          "execute (bytes) | KV uploads (bytes) | graphs built (ms) | leading tokens = CPU kernels |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fmt in formats:
        path = export(ckpt, fmt, a.max_seq_len, work)
        out, prof, err = generate(a.cli, path, prompt, a.steps, env)
        if err:
            print(f"| {fmt} | {err} |||||||")
            continue
        ids = base_for(fmt)["ids"]
        agree = next((i for i, (x, y) in enumerate(zip(out["ids"], ids)) if x != y), len(out["ids"]))
        if prof is None:
            print(f"| {fmt} | {out['prefill_tokens_per_s']:.1f} | {out['decode_tokens_per_s']:.2f} | (no profile) |||||"
                  f" {agree}/{len(out['ids'])} |")
            continue
        print(f"| {fmt} | {out['prefill_tokens_per_s']:.1f} | {out['decode_tokens_per_s']:.2f} | {prof['step_ms']:.2f} | "
              f"{prof['outside']:.2f}% | {prof['copies_in']:.0f} ({prof['bytes_in']:.0f}) / {prof['copies_out']:.0f} "
              f"({prof['bytes_out']:.0f}) | {prof['uploads']:.0f} ({prof['upload_bytes']:.0f}) | {prof['graphs']:.0f} "
              f"({prof['build_ms']:.0f}) | {agree}/{len(out['ids'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

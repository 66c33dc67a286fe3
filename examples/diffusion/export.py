"""Exports the diffusion pipeline (examples/diffusion/models.py) as one program with three methods,
encode / denoise / decode, once per backend set, and writes the delegation table.

    PYTHONPATH=python python examples/diffusion/export.py --size tiny --out-dir build/diffusion
    PYTHONPATH=python python examples/diffusion/export.py --size full --backends mlx --out-dir /work/big \\
        --report docs/diffusion.md

Backend sets (--backends, default all four):
    portable   no delegate (Kiln's kernels; run with portable_kernels_only for the reference kernels)
    xnnpack    XNNPACK takes what it supports, Kiln's optimized cpu kernels the rest
    mlx        require_delegation="mlx": every node of every method in mlx segments, else the export fails
    mlx-fp16   as mlx, computing in float16 inside the segments (compute_dtype="float16")
Files: <out-dir>/diffusion_<size>_<set>.kiln and, beside each, <same>.report.json (the compiler's
report: per method nodes, arena_bytes, constant_bytes and delegation). --report FILE rewrites the
table in FILE between the markers <!-- diffusion-table:<size> --> and <!-- /diffusion-table:<size> -->
(appending the section when absent) from every report JSON of that size found in --out-dir, so sets
exported by separate runs end up in one table. Weights: seeded random (--seed), or --weights
state_dict.pt (keys of models.Pipeline). Exit status 1 if a set failed.

Weight-only quantization (docs/quantization.md): --quantize w8|w4 [--group-size G] [--scale-dtype
float16] and/or --weights-dtype float16 (the float32 constants not quantized, stored as binary16) are
passed to export_program for every set; the file name then gets a suffix naming them, e.g.
diffusion_full_portable_w4g128_s16_fp16.kiln (such files are left out of the --report table).
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

METHODS = ("encode", "denoise", "decode")
SETS = {
    "portable": dict(backends=()),
    "xnnpack": dict(backends=("xnnpack",)),
    "mlx": dict(backends=("mlx",), require_delegation="mlx"),
    "mlx-fp16": dict(backends=("mlx",), require_delegation="mlx", compute_dtype="float16"),
}
SET_LABEL = {"portable": "portable kernels only", "xnnpack": "cpu kernels + xnnpack", "mlx": "mlx (fp32)",
             "mlx-fp16": "mlx (fp16 compute)"}


def load_models():
    """examples/diffusion/models.py, imported by path as module "kiln_diffusion_models" (so that it
    never clashes with another "models" module in the same process)."""
    name = "kiln_diffusion_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "models.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # before exec: dataclasses look their module up
        spec.loader.exec_module(mod)
    return sys.modules[name]


def quant_suffix(quant: dict | None) -> str:
    """File-name suffix for the export_program quantization keywords in `quant` ("" when none):
    _w8 / _w4g<group_size>, _s16 for float16 scales, _fp16 for weights_dtype float16."""
    q = quant or {}
    s = ""
    if q.get("quantize"):
        s += f"_{q['quantize']}" + (f"g{q.get('group_size', 128)}" if q["quantize"] == "w4" else "")
        if q.get("scale_dtype", "float32") == "float16":
            s += "_s16"
    if q.get("weights_dtype", "float32") == "float16":
        s += "_fp16"
    return s


def program_path(out_dir: str, size: str, name: str, quant: dict | None = None) -> str:
    return os.path.join(out_dir, f"diffusion_{size}_{name}{quant_suffix(quant)}.kiln")


def export_set(pipe, size: str, name: str, out_dir: str, verbose: bool = True, quant: dict | None = None):
    """Exports the three methods of `pipe` for backend set `name` to program_path(...) and its report
    JSON. `quant`: export_program's quantization keywords (quantize, group_size, scale_dtype,
    weights_dtype) or None. Returns the ExportResult; raises kiln.ExportError."""
    from kiln.capture import export_program
    ex = pipe.example_inputs()
    path = program_path(out_dir, size, name, quant)
    return export_program({m: (pipe, ex[m], m) for m in METHODS}, out=path, report_json=path + ".report.json",
                          verbose=verbose, **SETS[name], **(quant or {}))


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}" if n >= 1e5 else f"{n / 1e6:.3f}"


def table(out_dir: str, size: str) -> str:
    """Markdown table of every report JSON of `size` in out_dir (sets in SETS order)."""
    rows = ["| method | backends | delegate segments per backend | nodes left to CPU kernels (by op) | "
            "constant MB | arena MB |", "|---|---|---|---|---|---|"]
    for name in SETS:
        p = program_path(out_dir, size, name) + ".report.json"
        if not os.path.exists(p):
            continue
        with open(p) as f:
            rep = json.load(f)
        for m in rep["methods"]:
            d = m.get("delegation") or {}
            segs = ", ".join(f"{b['backend']}: {b['segments']} ({b['nodes']} nodes)" for b in d.get("backends", [])) \
                or "none"
            cpu = d.get("cpu_ops", [])
            if d.get("backends"):
                left = "0" if not cpu else f"{sum(c['count'] for c in cpu)}: " + ", ".join(
                    f"{c['op'].removeprefix('aten.')} x{c['count']}" for c in cpu)
            else:
                left = f"all {m['num_nodes']}"
            rows.append(f"| {m['name']} | {SET_LABEL[name]} | {segs} | {left} | {_mb(m['constant_bytes'])} | "
                        f"{_mb(m['arena_bytes'])} |")
    return "\n".join(rows)


def write_report(path: str, out_dir: str, size: str):
    begin, end = f"<!-- diffusion-table:{size} -->", f"<!-- /diffusion-table:{size} -->"
    body = f"{begin}\n{table(out_dir, size)}\n{end}"
    text = open(path).read() if os.path.exists(path) else "# Diffusion pipeline\n"
    if begin in text and end in text:
        a, b = text.index(begin), text.index(end) + len(end)
        text = text[:a] + body + text[b:]
    else:
        text = text.rstrip("\n") + f"\n\n## Delegation ({size} size)\n\n{body}\n"
    with open(path, "w") as f:
        f.write(text)
    print(f"[diffusion] table for size {size} written to {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Export the diffusion pipeline (encode/denoise/decode) per backend set.")
    p.add_argument("--size", choices=("tiny", "full"), default="tiny")
    p.add_argument("--backends", nargs="+", choices=list(SETS), default=list(SETS), metavar="SET",
                   help=f"backend sets to export (default all: {', '.join(SETS)})")
    p.add_argument("--out-dir", default=os.path.join(HERE, "out"))
    p.add_argument("--report", metavar="FILE.md", help="write the delegation table into this Markdown file")
    p.add_argument("--report-only", action="store_true", help="only rebuild the table from the JSONs in --out-dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights", help="state_dict of models.Pipeline (torch.save); default seeded random")
    p.add_argument("--quantize", choices=("w8", "w4"), help="weight-only quantization (docs/quantization.md)")
    p.add_argument("--group-size", type=int, default=128, help="w4 group size (default 128)")
    p.add_argument("--scale-dtype", choices=("float32", "float16"), default="float32")
    p.add_argument("--weights-dtype", choices=("float32", "float16"), default="float32",
                   help="storage of the float32 constants that are not quantized")
    args = p.parse_args(argv)
    quant = {}
    if args.quantize:
        quant.update(quantize=args.quantize, group_size=args.group_size, scale_dtype=args.scale_dtype)
    if args.weights_dtype != "float32":
        quant["weights_dtype"] = args.weights_dtype

    status = 0
    if not args.report_only:
        import torch
        models = load_models()
        sd = torch.load(args.weights, map_location="cpu") if args.weights else None
        t0 = time.perf_counter()
        pipe = models.build(args.size, seed=args.seed, state_dict=sd)
        print(f"[diffusion] {args.size} pipeline built in {time.perf_counter() - t0:.1f} s: text encoder "
              f"{models.count(pipe.text):,}, unet {models.count(pipe.unet):,}, decoder "
              f"{models.count(pipe.decoder):,} parameters", flush=True)
        os.makedirs(args.out_dir, exist_ok=True)
        for name in args.backends:
            t0 = time.perf_counter()
            try:
                r = export_set(pipe, args.size, name, args.out_dir, quant=quant)
                print(f"[diffusion] {name}: {r.path} ({r.file_size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s, "
                      f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB", flush=True)
                del r
            except Exception as e:  # noqa: BLE001  (kiln.ExportError and friends: report, go on)
                print(f"[diffusion] {name}: FAILED: {type(e).__name__}: {e}", flush=True)
                status = 1
            gc.collect()
    if args.report:
        write_report(args.report, args.out_dir, args.size)
    return status


if __name__ == "__main__":
    sys.exit(main())

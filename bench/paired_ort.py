"""Kiln's cpu kernels against ONNX Runtime as paired ratios, for a shared (noisy) machine.

    python bench/paired_ort.py --work build/bench --models mobilenet_v3_large,ppocr_det --threads 1,2 \
        --rounds 7 [--kiln-cli build/tools/kiln] [--baseline-cli /path/to/older/kiln]

Uses the files bench/run.py prepared under --work (<model>/model.kiln, model.onnx or the PP-OCR
.onnx, x.npy). Each round runs, back to back, every configuration once in its own process (Kiln
through `kiln bench --json`, ONNX Runtime through bench/worker.py, both --runs timed runs after
--warmup): Kiln [baseline Kiln] ONNX Runtime. A round's ratio is Kiln's median / ONNX Runtime's
median of that same round, so a slow-down of the machine between rounds cancels out; the figure
is the median of the round ratios (with their min and max). Figures, not assertions.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def onnx_path(work: Path, model: str) -> str:
    """The ONNX file ORT runs: model.onnx for the torchvision models, the shipped file for PP-OCR."""
    if (work / model / "model.onnx").is_file():
        return str(work / model / "model.onnx")
    import run as bench_run  # bench/run.py: PPOCR table and the examples/ocr loader
    exp = bench_run.ocr_export()
    return os.path.join(exp.models_dir(), getattr(exp, bench_run.PPOCR[model][0]))


def kiln_median(cli: str, d: Path, threads: int, runs: int, warmup: int) -> float:
    cmd = [cli, "bench", str(d / "model.kiln"), "--json", "--threads", str(threads), "--runs", str(runs),
           "--warmup", str(warmup), "--input", str(d / "x.npy")]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(json.loads(r.stdout)["median_ms"])


def ort_median(onnx: str, d: Path, threads: int, runs: int, warmup: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, str(HERE / "worker.py"), "--engine", "ort", "--model", onnx, "--input", str(d / "x.npy"),
           "--threads", str(threads), "--runs", str(runs), "--warmup", str(warmup), "--out", os.devnull]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return float(json.loads(r.stdout.strip().splitlines()[-1])["median_ms"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=str(HERE.parent / "build" / "bench"))
    ap.add_argument("--models", default="mobilenet_v3_large")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--kiln-cli", default=str(HERE.parent / "build" / "tools" / "kiln"))
    ap.add_argument("--baseline-cli", help="an older kiln CLI, timed in the same rounds (ratio before/after)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    work = Path(args.work)
    out = []
    for model in args.models.split(","):
        d = work / model
        onnx = onnx_path(work, model)
        for threads in [int(t) for t in args.threads.split(",")]:
            rows = {"kiln": [], "baseline": [], "ort": []}
            for _ in range(args.rounds):
                rows["kiln"].append(kiln_median(args.kiln_cli, d, threads, args.runs, args.warmup))
                if args.baseline_cli:
                    rows["baseline"].append(kiln_median(args.baseline_cli, d, threads, args.runs, args.warmup))
                rows["ort"].append(ort_median(onnx, d, threads, args.runs, args.warmup))
            res = {"model": model, "threads": threads, "rounds": args.rounds, **{k + "_ms": v for k, v in rows.items() if v}}
            line = f"{model:20s} {threads}T"
            for k in ("baseline", "kiln"):
                if not rows[k]:
                    continue
                ratios = [a / b for a, b in zip(rows[k], rows["ort"])]
                res[k + "_over_ort"] = statistics.median(ratios)
                line += (f"  {k}/ORT {statistics.median(ratios):.3f} [{min(ratios):.2f}-{max(ratios):.2f}]"
                         f" ({statistics.median(rows[k]):.2f} ms)")
            line += f"  ORT {statistics.median(rows['ort']):.2f} ms"
            print(line, flush=True)
            out.append(res)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

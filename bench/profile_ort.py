"""Where the time goes: Kiln's per-op profile next to ONNX Runtime's profiler, by op family.

    python bench/profile_ort.py --work build/bench --models mobilenet_v3_large,resnet18 --threads 1 \
        [--runs 50] [--kiln-cli build/tools/kiln] [--kiln-file model.kiln] [--json out.json]

Uses the files bench/run.py prepared under --work (<model>/model.kiln or the file --kiln-file names,
model.onnx or the PP-OCR .onnx, x.npy). Kiln: `kiln bench --profile` (milliseconds per run of each
op, summed over its instructions; a fused activation counts with its convolution). ONNX Runtime:
SessionOptions.enable_profiling with the settings of bench/worker.py (ORT_ENABLE_ALL, intra_op =
threads, sequential), the "Node" events' durations summed per op_type over the same number of runs
(after the same warm-up). Both are grouped into families (convolution, matmul, pooling,
elementwise, normalization, data movement, other) so that a gap is placed: the table prints each
family's ms per run for both and their ratio. Figures, not assertions; profiling adds a small
per-op overhead on both sides.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from paired_ort import onnx_path  # noqa: E402

# Op family of a Kiln op (ATen name without "aten.") or an ONNX Runtime op_type.
FAMILIES = {
    "convolution": {"convolution", "conv2d", "Conv", "FusedConv", "NhwcFusedConv", "ConvTranspose", "QLinearConv"},
    "matmul": {"linear", "addmm", "mm", "bmm", "matmul", "Gemm", "MatMul", "FusedMatMul", "FusedGemm",
               "MatMulInteger", "QLinearMatMul", "quantized_linear", "scaled_dot_product_attention", "Attention",
               "MultiHeadAttention"},
    "pooling": {"max_pool2d", "max_pool2d_with_indices", "avg_pool2d", "adaptive_avg_pool2d", "mean", "MaxPool",
                "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "ReduceMean"},
    "normalization": {"layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "batch_norm",
                      "_native_batch_norm_legit_no_training", "LayerNormalization", "SkipLayerNormalization",
                      "BatchNormalization", "GroupNorm", "InstanceNormalization", "softmax", "_softmax",
                      "Softmax", "log_softmax", "LogSoftmax"},
    "elementwise": {"relu", "hardswish", "hardsigmoid", "sigmoid", "silu", "gelu", "tanh", "clamp", "hardtanh",
                    "add", "sub", "mul", "div", "neg", "exp", "sqrt", "rsqrt", "pow", "Relu", "HardSwish",
                    "HardSigmoid", "Sigmoid", "Tanh", "Clip", "Add", "Sub", "Mul", "Div", "Exp", "Sqrt", "Pow",
                    "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Erf", "LeakyRelu", "Neg", "Reciprocal"},
    "data movement": {"view", "reshape", "permute", "transpose", "cat", "slice", "select", "expand", "clone",
                      "_to_copy", "squeeze", "unsqueeze", "flatten", "Reshape", "Transpose", "Concat", "Slice",
                      "Gather", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Identity", "Cast", "Pad",
                      "constant_pad_nd", "pad", "upsample_nearest2d", "upsample_bilinear2d", "Resize",
                      "ReorderInput", "ReorderOutput"},
}


def family(op: str) -> str:
    """The family of a Kiln op ("aten.convolution") or an ORT op_type ("FusedConv")."""
    name = op.split(".", 1)[1] if op.startswith(("aten.", "kiln.")) else op
    for fam, names in FAMILIES.items():
        if name in names:
            return fam
    return "other"


def kiln_profile(cli: str, kiln_file: Path, x_path: Path, threads: int, runs: int, env: dict) -> tuple[dict, float, str]:
    """ms per run by op family, the wall ms per run, and the cpu target, from `kiln bench --profile`."""
    cmd = [cli, "bench", str(kiln_file), "--input", str(x_path), "--threads", str(threads), "--runs", str(runs), "--warmup", "5",
           "--profile", "10", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"kiln bench failed: {out.stderr.strip().splitlines()[-1:]}")
    j = json.loads(out.stdout.strip().splitlines()[-1])
    fams: dict = defaultdict(float)
    for row in j["profile"]["by_op"]:
        fams[family(row["op"])] += row["ms_per_run"]
    return dict(fams), j["profile"]["wall_ms_per_run"], j.get("cpu_target", "")


def ort_profile(model: str, x_path: Path, threads: int, runs: int, work: Path) -> tuple[dict, dict]:
    """ms per run by op family and by op_type, from ONNX Runtime's profiler."""
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_profiling = True
    so.profile_file_prefix = str(work / "ort_profile")
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    x = np.load(x_path)
    feed = {sess.get_inputs()[0].name: x}
    warmup = 5
    for _ in range(warmup + runs):
        sess.run(None, feed)
    path = sess.end_profiling()
    events = json.loads(Path(path).read_text())
    # Only the timed runs: node events that start after the warm-up runs' "model_run" events end.
    model_runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    after = model_runs[warmup - 1][1] if len(model_runs) >= warmup else 0
    by_type: dict = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time") and e["ts"] >= after:
            by_type[e["args"]["op_name"]] += e["dur"] / 1000.0
    by_type = {k: v / runs for k, v in by_type.items()}
    fams: dict = defaultdict(float)
    for k, v in by_type.items():
        fams[family(k)] += v
    os.remove(path)
    return dict(fams), by_type


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="build/bench", help="bench/run.py's work directory")
    ap.add_argument("--models", default="mobilenet_v3_small,mobilenet_v3_large,resnet18")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--kiln-cli", default="build/tools/kiln")
    ap.add_argument("--kiln-file", default="model.kiln", help="the .kiln file name inside <work>/<model>/")
    ap.add_argument("--kiln-target", default="", help="KILN_CPU_TARGET for Kiln (default: the best)")
    ap.add_argument("--json", default="", help="also write the figures here")
    args = ap.parse_args()
    work = Path(args.work)
    env = dict(os.environ)
    if args.kiln_target:
        env["KILN_CPU_TARGET"] = args.kiln_target
    results = []
    for model in args.models.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            kf = work / model / args.kiln_file
            kfam, kwall, target = kiln_profile(args.kiln_cli, kf, work / model / "x.npy", threads, args.runs, env)
            ofam, otypes = ort_profile(onnx_path(work, model), work / model / "x.npy", threads, args.runs, work)
            print(f"\n{model}, {threads} thread(s), Kiln cpu kernels at {target or '?'} ({kf.name}); ms per run")
            print(f"  {'family':<15} {'Kiln':>8} {'ORT':>8} {'ratio':>6}")
            for fam in sorted(set(kfam) | set(ofam), key=lambda f: -(kfam.get(f, 0) + ofam.get(f, 0))):
                k, o = kfam.get(fam, 0.0), ofam.get(fam, 0.0)
                ratio = f"{k / o:.2f}" if o > 0 else "-"
                print(f"  {fam:<15} {k:8.3f} {o:8.3f} {ratio:>6}")
            print(f"  {'sum':<15} {sum(kfam.values()):8.3f} {sum(ofam.values()):8.3f} "
                  f"{sum(kfam.values()) / max(sum(ofam.values()), 1e-9):6.2f}   (Kiln wall {kwall:.3f})")
            top = sorted(otypes.items(), key=lambda kv: -kv[1])[:6]
            print("  ORT op types: " + ", ".join(f"{k} {v:.3f}" for k, v in top))
            results.append({"model": model, "threads": threads, "target": target, "kiln": kfam, "ort": ofam,
                            "ort_op_types": otypes, "kiln_wall_ms": kwall})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""Times one engine on one model in this process (bench/run.py starts one worker per measurement,
so that thread settings never leak from one engine to another).

    python bench/worker.py --engine ort   --model m.onnx --input x.npy --threads 1 --runs 50 --warmup 5 --out y.npy
    python bench/worker.py --engine torch --model resnet18 --weights r18.pt --input x.npy ...
    python bench/worker.py --engine et    --model m.pte  --input x.npy ...   (run with the ExecuTorch venv)

Prints one JSON object on stdout: load_ms, min/median/p90/max/mean_ms, times_ms, peak_rss_mib
(VmHWM of this process: includes the Python interpreter and the engine's libraries),
base_rss_mib (resident set size after the imports, before the model is loaded; load_ms does not
include the imports either),
threads (what the engine reports it uses, where it can say) and notes. Writes the first output
(logits) of the last run to --out. Errors: a non-zero exit with the exception on stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def status_mib(field: str) -> float:
    """A size field of /proc/self/status ("VmRSS": resident now, "VmHWM": peak resident), MiB.
    VmHWM rather than getrusage ru_maxrss: Linux carries ru_maxrss over fork and exec, so a
    worker would report the size of the (large) parent that started it."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (NumPy's default), as `kiln bench` does."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


def make_ort(args, np):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    x = np.load(args.input)
    notes = [f"onnxruntime {ort.__version__}, CPUExecutionProvider, ORT_ENABLE_ALL, intra_op={args.threads}, "
             "inter_op=1, sequential"]
    return (lambda: sess.run(None, {name: x})[0]), args.threads, notes


def make_torch(args, np):
    import torch
    import torchvision
    torch.set_num_threads(args.threads)
    model = getattr(torchvision.models, args.model)(weights=None)
    model.load_state_dict(torch.load(args.weights, map_location="cpu", weights_only=True))
    model.eval()
    x = torch.from_numpy(np.load(args.input))

    def run():
        with torch.inference_mode():
            return model(x).numpy()
    return run, torch.get_num_threads(), [f"torch {torch.__version__} eager, inference_mode"]


def make_et(args, np):
    import torch
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime
    notes = []
    # The XNNPACK delegate runs on ExecuTorch's process-wide threadpool; the pybindings expose
    # _unsafe_reset_threadpool(n) to resize it (must happen before any method runs).
    portable_lib._unsafe_reset_threadpool(args.threads)
    threads = portable_lib._threadpool_get_thread_count()
    program = Runtime.get().load_program(args.model)
    method = program.load_method("forward")
    x = torch.from_numpy(np.load(args.input))
    try:
        import executorch.version as ev
        notes.append(f"executorch {ev.__version__} (executorch.runtime), torch {torch.__version__}")
    except Exception:  # noqa: BLE001 - version is informational only
        pass
    return (lambda: method.execute((x,))[0].numpy()), threads, notes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True, choices=["ort", "torch", "et"])
    ap.add_argument("--model", required=True, help="ONNX file, .pte file or torchvision model name")
    ap.add_argument("--weights", help="state_dict file (torch engine)")
    ap.add_argument("--input", required=True, help=".npy input")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", help="write the last output here (.npy)")
    args = ap.parse_args()
    import numpy as np

    make = {"ort": make_ort, "torch": make_torch, "et": make_et}[args.engine]
    # Import the engine's modules first: load_ms and base_rss_mib then cover the model only.
    for mod in {"ort": ["onnxruntime"], "torch": ["torch", "torchvision"],
                "et": ["torch", "executorch.runtime", "executorch.extension.pybindings.portable_lib"]}[args.engine]:
        __import__(mod)
    base_rss = status_mib("VmRSS")
    t0 = time.perf_counter()
    run, threads, notes = make(args, np)
    load_ms = (time.perf_counter() - t0) * 1e3
    y = None
    for _ in range(args.warmup):
        y = run()
    times = []
    for _ in range(args.runs):
        s = time.perf_counter()
        y = run()
        times.append((time.perf_counter() - s) * 1e3)
    if args.out is not None and y is not None:
        np.save(args.out, np.asarray(y, dtype=np.float32))
    st = sorted(times)
    print(json.dumps({
        "engine": args.engine, "threads": threads, "runs": args.runs, "warmup": args.warmup,
        "load_ms": load_ms, "min_ms": st[0], "median_ms": quantile(st, 0.5), "p90_ms": quantile(st, 0.9),
        "max_ms": st[-1], "mean_ms": sum(st) / len(st), "times_ms": times,
        "peak_rss_mib": status_mib("VmHWM"),
        "base_rss_mib": base_rss, "notes": notes, "python": sys.version.split()[0], "pid": os.getpid(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

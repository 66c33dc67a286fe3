"""MLX delegate: latency and boundary cost per execute (issue 5), on MLX's CPU device or a GPU.

    PYTHONPATH=python python bench/mlx_boundary.py                 # MLX's CPU device (KILN_MLX_DEVICE=cpu)
    PYTHONPATH=python python bench/mlx_boundary.py --device gpu    # Metal / CUDA (mlx[cuda13] on NVIDIA)

For mobilenet_v3_small (1x3x224x224) and the tiny SD-like UNet of tests/python/tiny_models.py, each
compiled with backends=("mlx",), require_delegation="mlx" (one segment), it prints the median
execute latency and the share of each execute spent outside MLX's evaluation (wrapping inputs,
dispatching the compiled function, output copies: the delegate's KILN_MLX_PROFILE=1 report) and
the max |output - eager| relative to max |eager|. Figures, not assertions; not run by CI. Each model
runs in its own process so that the profile is printed when its handle is destroyed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.join(ROOT, "python"))

PROFILE = re.compile(r"\[kiln mlx\] (\d+) executes, per execute: wrap ([\d.]+) ms, dispatch ([\d.]+) ms, "
                     r"eval ([\d.]+) ms, copy ([\d.]+) ms; outside eval ([\d.]+)%")


def build(name: str, workdir: str):
    """Exports `name` for mlx; returns (program path, inputs .npz path, eager outputs .npy path)."""
    import numpy as np
    import torch
    import torchvision

    import kiln
    from tiny_models import TinyUNet

    torch.manual_seed(0)
    if name == "mobilenet_v3_small":
        model, args = torchvision.models.mobilenet_v3_small().eval(), (torch.randn(1, 3, 224, 224),)
    else:
        model, args = TinyUNet().eval(), (torch.randn(1, 4, 16, 16), torch.rand(1, 1))
    path = os.path.join(workdir, f"{name}_mlx.kiln")
    kiln.export(model, args, out=path, backends=("mlx",), require_delegation="mlx", verbose=False)
    with torch.no_grad():
        ref = model(*args).numpy()
    np.savez(path + ".in.npz", *[a.numpy() for a in args])
    np.save(path + ".ref.npy", ref)
    return path


WORKER = r"""
import json, sys, time, numpy as np, kiln
path, runs = sys.argv[1], int(sys.argv[2])
xs = list(np.load(path + ".in.npz").values())
ref = np.load(path + ".ref.npy")
p = kiln.load(path)
for _ in range(5):
    out = p.run(*xs)[0]
ts = []
for _ in range(runs):
    t = time.perf_counter(); p.run(*xs); ts.append(time.perf_counter() - t)
err = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
print(json.dumps({"median_ms": 1e3 * float(np.median(ts)), "rel_err": err}))
del p
"""


def measure(path: str, device: str, runs: int) -> dict:
    env = dict(os.environ, KILN_MLX_PROFILE="1", PYTHONPATH=os.path.join(ROOT, "python"))
    if device == "cpu":
        env["KILN_MLX_DEVICE"] = "cpu"
    else:
        env.pop("KILN_MLX_DEVICE", None)
    r = subprocess.run([sys.executable, "-c", WORKER, path, str(runs)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
    res = json.loads(r.stdout.strip().splitlines()[-1])
    m = PROFILE.search(r.stderr)
    if m:
        res.update(wrap_ms=float(m[2]), dispatch_ms=float(m[3]), eval_ms=float(m[4]), copy_ms=float(m[5]),
                   outside_eval_pct=float(m[6]))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="MLX device (default: cpu)")
    ap.add_argument("--runs", type=int, default=50, help="timed executes per model (default 50)")
    ap.add_argument("--models", nargs="+", default=["mobilenet_v3_small", "tiny_unet"],
                    choices=["mobilenet_v3_small", "tiny_unet"])
    args = ap.parse_args(argv)
    print(f"| model | device | median ms | wrap ms | dispatch ms | eval ms | copy ms | outside eval | max rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for name in args.models:
            t0 = time.perf_counter()
            r = measure(build(name, d), args.device, args.runs)
            if "error" in r:
                print(f"| {name} | {args.device} | {r['error']} |  |  |  |  |  |  |")
                continue
            print(f"| {name} | {args.device} | {r['median_ms']:.2f} | {r.get('wrap_ms', float('nan')):.3f} | "
                  f"{r.get('dispatch_ms', float('nan')):.3f} | {r.get('eval_ms', float('nan')):.3f} | "
                  f"{r.get('copy_ms', float('nan')):.3f} | {r.get('outside_eval_pct', float('nan')):.2f}% | "
                  f"{r['rel_err']:.1e} |", flush=True)
            print(f"[bench] {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Smoke test of an installed Kiln wheel, run from a directory outside the source tree.

    <venv>/bin/python tests/package/smoke.py --work DIR [--source-root ROOT]

Checks, in the virtualenv that runs it (scripts/test.sh section `package` makes a fresh one and
installs the wheel built by `pip wheel .` into it):
1. `import kiln` resolves to the installed package (not ROOT/python), and its binding has the
   backends and the ONNX importer the wheel was built with;
2. the `kiln` console script (the C++ executable in kiln/bin/) answers --help and --version (the
   wheel's version, as kiln.__version__ is), and `python -m kiln --help` (the Python commands) works;
3. a small PyTorch model (conv, batch norm, relu, pool, linear; seeded) is exported with
   kiln.export for Kiln's CPU kernels and, when the wheel has it, delegated whole to xnnpack; each
   program is run through the installed package (kiln.load in Python, and `kiln run` writing .npy
   files) and compared with PyTorch eager (max |diff| <= 1e-4 relative to the largest output);
4. `kiln inspect --json` reads the program back.
Exits non-zero with a message on the first failure.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np


def fail(msg: str) -> None:
    raise SystemExit(f"package smoke test FAILED: {msg}")


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="scratch folder outside the source tree")
    ap.add_argument("--source-root", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    help="the Kiln checkout, which the installed package must not come from")
    args = ap.parse_args()
    work, root = os.path.abspath(args.work), os.path.realpath(args.source_root)
    os.makedirs(work, exist_ok=True)
    os.chdir(work)
    if os.path.realpath(work).startswith(root + os.sep):
        fail(f"--work {work} is inside the source tree {root}")

    import kiln
    from kiln import _kiln
    where = os.path.realpath(kiln.__file__)
    if where.startswith(root + os.sep):
        fail(f"import kiln found the source tree ({where}), not the installed package")
    backends = list(_kiln.backend_names())
    print(f"kiln from {where}; backends: {backends}; ONNX importer: {hasattr(_kiln, 'import_onnx')}")

    bindir = os.path.dirname(sys.executable)
    exe = os.path.join(bindir, "kiln")
    if not os.access(exe, os.X_OK):
        fail(f"no kiln console script in {bindir}")
    help_text = run([exe, "--help"]).stdout
    for cmd in ("inspect", "run", "bench", "generate", "compile"):
        if cmd not in help_text:
            fail(f"kiln --help does not list '{cmd}':\n{help_text}")
    version_text = run([exe, "--version"]).stdout.strip()
    print(version_text)
    # One version everywhere: the wheel's metadata, kiln.__version__ and `kiln --version`.
    from importlib.metadata import version as dist_version
    if not (kiln.__version__ == dist_version("kiln") and version_text.startswith(f"kiln {kiln.__version__}\n")):
        fail(f"versions differ: wheel {dist_version('kiln')}, kiln.__version__ {kiln.__version__}, "
             f"kiln --version {version_text.splitlines()[0]!r}")
    run([sys.executable, "-m", "kiln", "--help"])

    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5)).eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        ref = model(x).numpy()
    np.save(os.path.join(work, "x.npy"), x.numpy())

    variants = [("cpu", {})]
    if "xnnpack" in backends:
        variants.append(("xnnpack", {"backends": ("xnnpack",), "require_delegation": "xnnpack"}))
    for name, kw in variants:
        path = os.path.join(work, f"small_{name}.kiln")
        kiln.export(model, (x,), out=path, **kw)
        got = kiln.load(path).run(x.numpy())[0]
        err = float(np.max(np.abs(got - ref))) / max(1.0, float(np.max(np.abs(ref))))
        print(f"{name}: kiln.load(...).run: max |diff| / max|ref| = {err:.2e}")
        if not err <= 1e-4:
            fail(f"{name}: Python run differs from eager by {err:.3e}")
        outdir = os.path.join(work, f"out_{name}")
        run([exe, "run", path, "--input", os.path.join(work, "x.npy"), "--output-dir", outdir])
        files = sorted(f for f in os.listdir(outdir) if f.endswith(".npy"))
        if len(files) != 1:
            fail(f"{name}: kiln run wrote {files}, expected one .npy")
        cli = np.load(os.path.join(outdir, files[0]))
        err = float(np.max(np.abs(cli - ref))) / max(1.0, float(np.max(np.abs(ref))))
        print(f"{name}: kiln run: max |diff| / max|ref| = {err:.2e}")
        if not err <= 1e-4:
            fail(f"{name}: kiln run output differs from eager by {err:.3e}")
        info = json.loads(run([exe, "inspect", path, "--json"]).stdout)
        if "methods" not in info:
            fail(f"{name}: kiln inspect --json has no methods: {info}")
    print("package smoke test: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

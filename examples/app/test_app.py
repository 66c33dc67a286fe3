#!/usr/bin/env python3
"""Builds examples/app against an *installed* Kiln and checks what it prints.

    PYTHONPATH=python python examples/app/test_app.py --prefix build/install [--work build/app-test]

1. writes a program with the Python binding (kiln.ProgramBuilder; the C++ serializer writes it):
   method forward(x: float32[2, 4]) -> (relu(x + 2 * c), x + 2 * c) with a constant c: float32[4];
2. configures examples/app with -DCMAKE_PREFIX_PATH=<prefix> (find_package(kiln) -> kiln::runtime)
   in a fresh build folder, builds it;
3. runs it with fill 0 and fill 1.5 and compares the printed values with NumPy, computed here
   independently of Kiln. Exits non-zero with a message on any failure.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
import kiln  # noqa: E402

C = np.array([1.0, -2.0, 0.25, -0.5], dtype=np.float32)


def write_program(path: str) -> None:
    g = kiln.Graph()
    x = g.add_input("x", "float32", [2, 4])
    c = g.add_constant("c", "float32", [4], C)
    (s,) = g.add_node("aten.add", [x, c], {"alpha": 2.0})
    (r,) = g.add_node("aten.relu", [s])
    g.set_outputs([r, s])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile()
    with open(path, "wb") as f:
        f.write(data)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.stdout.write(p.stdout)
        sys.stderr.write(p.stderr)
        raise SystemExit(f"FAILED ({p.returncode}): {' '.join(cmd)}")
    return p


def parse_outputs(text: str) -> list[tuple[str, np.ndarray]]:
    """Lines 'output N: float32[2, 4] first values: v0 v1 ...' -> [(type, values)]."""
    outs = []
    for m in re.finditer(r"^output (\d+): (\S+\[[^\]]*\]) first values:(.*)$", text, re.M):
        outs.append((m.group(2), np.array([float(v) for v in m.group(3).split()], dtype=np.float64)))
    return outs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", required=True, help="Kiln install prefix (cmake --install build --prefix P)")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "app-test"), help="scratch folder (recreated)")
    args = ap.parse_args()
    prefix = os.path.abspath(args.prefix)
    if not glob.glob(os.path.join(prefix, "lib*", "**", "cmake", "kiln", "kilnConfig.cmake"), recursive=True):
        raise SystemExit(f"no kilnConfig.cmake under {prefix}: run cmake --install build --prefix {prefix} first")
    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    model = os.path.join(work, "model.kiln")
    write_program(model)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    run(["cmake", "-S", HERE, "-B", os.path.join(work, "build"), *gen, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={prefix}"])
    run(["cmake", "--build", os.path.join(work, "build")])
    app = os.path.join(work, "build", "kiln_app")

    for fill in (0.0, 1.5):
        p = run([app, model, "forward", str(fill)])
        print(p.stdout, end="")
        outs = parse_outputs(p.stdout)
        x = np.full((2, 4), fill, dtype=np.float32)
        s = x + np.float32(2.0) * C
        expected = [("float32[2, 4]", np.maximum(s, 0).reshape(-1)), ("float32[2, 4]", s.reshape(-1))]
        if len(outs) != len(expected):
            raise SystemExit(f"expected {len(expected)} outputs, the app printed {len(outs)}:\n{p.stdout}")
        for i, ((typ, vals), (etyp, evals)) in enumerate(zip(outs, expected)):
            if typ != etyp:
                raise SystemExit(f"output {i}: type {typ}, expected {etyp}")
            if not np.allclose(vals, evals[:8], rtol=0, atol=1e-6 * max(1.0, float(np.abs(evals).max()))):
                raise SystemExit(f"output {i} (fill {fill}): printed {vals}, expected {evals[:8]}")

    # A broken file must give an error and a non-zero status, not a crash.
    bad = os.path.join(work, "bad.kiln")
    with open(model, "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(data[: len(data) // 2])
    p = subprocess.run([app, bad], capture_output=True, text=True)
    if p.returncode != 1 or "InvalidProgram" not in p.stderr:
        raise SystemExit(f"truncated file: expected exit 1 and InvalidProgram, got {p.returncode}: {p.stderr}")
    print("examples/app against the installed Kiln: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

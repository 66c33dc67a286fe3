#!/usr/bin/env python3
"""Builds examples/app against an *installed* Kiln and checks what it prints.

    PYTHONPATH=python python examples/app/test_app.py --prefix build/install [--work build/app-test]

1. writes a program with the Python binding (kiln.ProgramBuilder; the C++ serializer writes it):
   method forward(x: float32[2, 4]) -> (relu(x + 2 * c), x + 2 * c) with a constant c: float32[4];
2. configures examples/app with -DCMAKE_PREFIX_PATH=<prefix> (find_package(kiln) -> kiln::runtime)
   in a fresh build folder, builds it;
3. runs it with fill 0 and fill 1.5 and compares the printed values with NumPy, computed here
   independently of Kiln;
4. per backend combination the installed package has (none, each backend alone, all): builds the
   app with -DKILN_APP_BACKENDS=<combination> and runs a program delegated whole to each backend
   Kiln built (the same graph, require_delegation): a linked backend runs it (same NumPy check),
   an unlinked one gives exit 1 and NotFound naming the backend (the self-registration of
   kiln::backend_xnnpack / kiln::backend_mlx, docs/packaging.md). mlx runs on MLX's CPU device.
Exits non-zero with a message on any failure.
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


def write_program(path: str, backend: str | None = None, alpha: float = 2.0) -> None:
    g = kiln.Graph()
    x = g.add_input("x", "float32", [2, 4])
    c = g.add_constant("c", "float32", [4], C)
    (s,) = g.add_node("aten.add", [x, c], {"alpha": alpha})
    (r,) = g.add_node("aten.relu", [s])
    g.set_outputs([r, s])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    if backend is None:
        data, _ = pb.compile()
    else:
        data, _ = pb.compile(backends=[backend], require_delegation=backend)
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

    check_outputs(app, model)

    # A broken file must give an error and a non-zero status, not a crash.
    bad = os.path.join(work, "bad.kiln")
    with open(model, "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(data[: len(data) // 2])
    p = subprocess.run([app, bad], capture_output=True, text=True)
    if p.returncode != 1 or "InvalidProgram" not in p.stderr:
        raise SystemExit(f"truncated file: expected exit 1 and InvalidProgram, got {p.returncode}: {p.stderr}")

    # Backend components: the app linked with each combination of the installed backends.
    have = installed_backends(prefix)
    print(f"backends in the installed package: {have or 'none'}")
    built = [b for b in have if b in kiln._kiln.backend_names()]
    programs = {}
    for b in built:
        programs[b] = os.path.join(work, f"model_{b}.kiln")
        write_program(programs[b], backend=b, alpha=1.0)  # XNNPACK's add has no alpha
    combos = [[]] + [[b] for b in have] + ([have] if len(have) > 1 else [])
    env = dict(os.environ, KILN_MLX_DEVICE="cpu")  # no GPU here: MLX's CPU device
    for combo in combos:
        tag = "+".join(combo) or "runtime-only"
        bdir = os.path.join(work, f"build-{tag}")
        run(["cmake", "-S", HERE, "-B", bdir, *gen, "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix}",
             f"-DKILN_APP_BACKENDS={';'.join(combo)}"])
        run(["cmake", "--build", bdir])
        capp = os.path.join(bdir, "kiln_app")
        check_outputs(capp, model)  # a program without delegate segments runs with any combination
        for b, prog in programs.items():
            if b in combo:
                check_outputs(capp, prog, env=env, alpha=1.0)
                print(f"[{tag}] {b} program: runs")
            else:
                p = subprocess.run([capp, prog], capture_output=True, text=True, env=env)
                if p.returncode != 1 or "NotFound" not in p.stderr or f"'{b}'" not in p.stderr:
                    raise SystemExit(f"[{tag}] {b} program without kiln::backend_{b}: expected exit 1 and "
                                     f"NotFound naming '{b}', got {p.returncode}: {p.stderr}{p.stdout}")
                print(f"[{tag}] {b} program: {p.stderr.strip()}")
    print("examples/app against the installed Kiln: OK")
    return 0


def installed_backends(prefix: str) -> list[str]:
    """Backend components of the installed package: kiln::backend_<name> in its exported targets."""
    found = set()
    for f in glob.glob(os.path.join(prefix, "lib*", "**", "cmake", "kiln", "kilnTargets*.cmake"), recursive=True):
        with open(f) as fh:
            found.update(re.findall(r"add_library\(kiln::backend_(\w+) ", fh.read()))
    return sorted(found)


def check_outputs(app: str, model: str, env: dict | None = None, alpha: float = 2.0) -> None:
    """Runs the app on `model` (the graph of write_program) at two fills and compares with NumPy."""
    for fill in (0.0, 1.5):
        p = run([app, model, "forward", str(fill)], env=env)
        print(p.stdout, end="")
        outs = parse_outputs(p.stdout)
        x = np.full((2, 4), fill, dtype=np.float32)
        s = x + np.float32(alpha) * C
        expected = [("float32[2, 4]", np.maximum(s, 0).reshape(-1)), ("float32[2, 4]", s.reshape(-1))]
        if len(outs) != len(expected):
            raise SystemExit(f"expected {len(expected)} outputs, the app printed {len(outs)}:\n{p.stdout}")
        for i, ((typ, vals), (etyp, evals)) in enumerate(zip(outs, expected)):
            if typ != etyp:
                raise SystemExit(f"output {i}: type {typ}, expected {etyp}")
            if not np.allclose(vals, evals[:8], rtol=0, atol=1e-6 * max(1.0, float(np.abs(evals).max()))):
                raise SystemExit(f"output {i} (fill {fill}): printed {vals}, expected {evals[:8]}")


if __name__ == "__main__":
    sys.exit(main())

"""Exports the classification demo's programs: one .kiln file per model.

    PYTHONPATH=python python examples/mv3/export.py                       # all three, seeded random weights
    PYTHONPATH=python python examples/mv3/export.py --models mobilenet_v3_small --weights mv3=mv3.pt
    PYTHONPATH=python python examples/mv3/export.py --out-dir build/mv3 --weights-dir ~/weights

Files (in --out-dir, default examples/mv3/), one per model and backend (--backends, default: every
backend this build has, i.e. portable and, when built, xnnpack):
    mobilenet_v3_small -> mv3_<backend>.kiln
    mobilenet_v3_large -> mv3_large_<backend>.kiln
    resnet18           -> resnet18_<backend>.kiln
<model>_any.kiln (when mlx and xnnpack are both built) holds two alternatives of the model, an mlx
lowering and an xnnpack lowering: the runtime runs mlx where it is available (a GPU, or
KILN_MLX_DEVICE=cpu) and the xnnpack one elsewhere.
<model>_portable.kiln runs on Kiln's own CPU kernels. <model>_xnnpack.kiln is compiled with
backends=("xnnpack",) and require_delegation="xnnpack": the whole model is one XNNPACK delegate
segment (batch norms are folded into the convolutions first), or the export fails listing every
node XNNPACK declined.
Input: float32[1, 3, 224, 224] (ImageNet-normalized NCHW); output: float32[1, 1000] logits.
Each file is written independently: a failure for one model is reported in one line and the
others are still written. Exit status 1 if any model failed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

FILES = {"mobilenet_v3_small": "mv3", "mobilenet_v3_large": "mv3_large", "resnet18": "resnet18"}


def parse_weights(items: list[str]) -> dict[str, str]:
    """["mv3=a.pt", "resnet18=b.pt"] or ["a.pt"] (for a single model) -> {model: path}."""
    out = {}
    short = {v: k for k, v in FILES.items()}
    for item in items:
        if "=" in item:
            name, path = item.split("=", 1)
            out[short.get(name, name)] = path
        else:
            out[""] = item
    return out


# "any": one file with an mlx lowering and an xnnpack lowering (the runtime takes the first available).
ANY = "any"
ANY_ALTERNATIVES = (("mlx",), ("xnnpack",))


def default_backends(built) -> list:
    """Every built backend, plus "any" when mlx and xnnpack are both built."""
    out = list(built)
    if "mlx" in out and "xnnpack" in out:
        out.append(ANY)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Export the mv3 demo's .kiln programs (one per model and backend).")
    p.add_argument("--models", nargs="+", default=list(FILES), choices=list(FILES), metavar="MODEL",
                   help=f"models to export (default: all of {', '.join(FILES)})")
    p.add_argument("--out-dir", default=HERE, help="directory for the .kiln files (default: examples/mv3)")
    p.add_argument("--weights", nargs="*", default=[], metavar="[MODEL=]PATH",
                   help="state_dict files (torch.save(model.state_dict())); MODEL is a torchvision name "
                        "or file stem (mv3, mv3_large, resnet18); a bare PATH applies when one model is "
                        "exported. Models without weights use seeded random weights (meaningless labels).")
    p.add_argument("--weights-dir", metavar="DIR",
                   help="folder of state dicts named <torchvision name>.pth (e.g. resnet18.pth); models "
                        "without a file there use seeded random weights")
    p.add_argument("--backends", nargs="+", metavar="NAME",
                   help="one program per backend (default: every backend built, kiln.capture.BUILT_BACKENDS: "
                        "portable and, when built, xnnpack and mlx, plus 'any' = mlx else xnnpack in one file); "
                        "a delegate backend is required to take every node")
    p.add_argument("--input-shape", default="1x3x224x224", help="input shape (default 1x3x224x224)")
    args = p.parse_args(argv)

    import torch

    import kiln
    from kiln.__main__ import build_model, parse_shape
    from kiln.capture import ExportError, capture, compile_captures

    from kiln.capture import BUILT_BACKENDS

    backends = args.backends or default_backends(BUILT_BACKENDS)
    weights = parse_weights(args.weights)
    if "" in weights:
        if len(args.models) != 1:
            p.error("a bare --weights PATH needs exactly one model in --models; use MODEL=PATH")
        weights = {args.models[0]: weights[""]}
    if args.weights_dir:
        for name in args.models:
            path = os.path.join(args.weights_dir, f"{name}.pth")
            if name not in weights and os.path.exists(path):
                weights[name] = path
    shape = parse_shape(args.input_shape)
    os.makedirs(args.out_dir, exist_ok=True)
    failed = 0
    for name in args.models:
        cap = None  # one capture per model, compiled once per backend
        for backend in backends:
            out = os.path.join(args.out_dir, f"{FILES[name]}_{backend}.kiln")
            t0 = time.perf_counter()
            try:
                if cap is None:
                    model = build_model(name, weights.get(name), log=lambda s: print(s, file=sys.stderr))
                    torch.manual_seed(1)
                    cap = capture(model, (torch.randn(*shape),))
                if backend == ANY:
                    res = compile_captures({"forward": cap}, out=out, alternatives=ANY_ALTERNATIVES, verbose=False)
                else:
                    require = backend if backend != "portable" else None
                    res = compile_captures({"forward": cap}, out=out, backends=(backend,), require_delegation=require,
                                           verbose=False)
                m = res.report["methods"][0]
                split = ""
                for b in m["delegation"]["backends"]:
                    split += f", {b['backend']}: {b['segments']} segment(s) of {b['nodes']} nodes"
                print(f"{name}: wrote {out} ({res.file_size / 1e6:.1f} MB, {m['num_nodes']} nodes, "
                      f"{m['num_bn_folded']} batch norms folded{split}, arena {m['arena_bytes'] / 1e6:.1f} MB, "
                      f"{time.perf_counter() - t0:.1f} s)")
            except (ExportError, kiln.KilnError, ValueError, OSError, RuntimeError) as e:
                failed += 1
                msg = " ".join(str(e).split())
                print(f"{name} ({backend}): FAILED: {type(e).__name__}: {msg}", file=sys.stderr)
                if cap is None:  # the model itself could not be built or captured: no backend can do better
                    break
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

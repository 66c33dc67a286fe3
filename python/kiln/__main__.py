"""Command line of the Python side of Kiln: ``python -m kiln export ...``.

    python -m kiln export --model mobilenet_v3_small --input-shape 1x3x224x224 -o mv3.kiln
    python -m kiln export --model resnet18 --weights resnet18.pt --backends portable -o r18.kiln
    python -m kiln ops            # list Kiln's op set (this build)

Exit status: 0 on success, 1 when the export failed (the error is printed in one paragraph),
2 for bad command-line arguments.
"""
from __future__ import annotations

import argparse
import os
import sys


def parse_shape(text: str) -> tuple[int, ...]:
    """"1x3x224x224" -> (1, 3, 224, 224); argparse.ArgumentTypeError for anything else."""
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape '{text}': expected sizes separated by 'x', e.g. 1x3x224x224")
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"bad shape '{text}': sizes must be positive")
    return dims


def build_model(name: str, weights: str | None, *, log=print):
    """A torchvision classification model by name (torchvision.models.<name>), eval mode.

    With `weights` (a state_dict saved by torch.save, or a checkpoint dict holding "state_dict"/
    "model"), loads it strictly. Without, seeds torch.manual_seed(0) and keeps the random
    initialization: the program then computes meaningless labels (fine for testing the toolchain).
    ValueError for an unknown name; torch's errors for unreadable or mismatching weights."""
    import torch
    import torchvision

    models = set(torchvision.models.list_models(module=torchvision.models))
    ctor = getattr(torchvision.models, name, None) if name in models else None
    if ctor is None:
        known = ", ".join(sorted(torchvision.models.list_models(module=torchvision.models)))
        raise ValueError(f"unknown torchvision model '{name}'. Known models: {known}")
    if weights is None:
        torch.manual_seed(0)
        model = ctor(weights=None)
        log(f"[kiln] {name}: no --weights given, using seeded random weights (torch.manual_seed(0)); "
            "the program's labels are meaningless")
    else:
        model = ctor(weights=None)
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
        except Exception as ex:
            raise ValueError(f"cannot read --weights {weights} as a state dict saved with torch.save "
                             f"({type(ex).__name__}: {ex})") from None
        if isinstance(state, dict):
            for key in ("state_dict", "model"):
                if key in state and isinstance(state[key], dict):
                    state = state[key]
        model.load_state_dict(state)
        log(f"[kiln] {name}: loaded weights from {weights}")
    return model.eval()


def cmd_export(args) -> int:
    import torch

    from .capture import ExportError, check_backends, export

    try:
        backends = check_backends(tuple(args.backends))
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        model = build_model(args.model, args.weights, log=lambda s: print(s, file=sys.stderr))
    except Exception as ex:  # unknown name; unreadable, non-state-dict or mismatched weights
        print(f"error: cannot build {args.model}: {type(ex).__name__}: {ex}", file=sys.stderr)
        return 2
    if os.path.isdir(args.output):
        print(f"error: -o {args.output} is a directory; give the path of the .kiln file to write", file=sys.stderr)
        return 2
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    if dtype != torch.float32:
        model = model.to(dtype)
    torch.manual_seed(1)
    example = torch.randn(*args.input_shape, dtype=dtype)
    try:
        result = export(model, (example,), out=args.output, backends=backends, verbose=not args.quiet)
    except ExportError as e:
        print(f"error: export of {args.model} failed: {e}", file=sys.stderr)
        return 1
    if args.quiet:
        print(result.path)
    return 0


def cmd_ops(args) -> int:
    from . import op_names
    try:
        for n in sorted(op_names()):
            print(n)
    except BrokenPipeError:  # e.g. `python -m kiln ops | head`
        sys.stderr.close()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kiln",
        description="Kiln: export PyTorch models to .kiln programs (the C++ `kiln` tool runs and inspects "
                    "programs).")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    e = sub.add_parser(
        "export", help="export a torchvision model to a .kiln program",
        description="Captures a torchvision model with torch.export, maps it onto Kiln's op set "
                    "(docs/op-set.md), compiles it and writes one .kiln file.",
        epilog="examples:\n"
               "  python -m kiln export --model mobilenet_v3_small --input-shape 1x3x224x224 -o mv3.kiln\n"
               "  python -m kiln export --model resnet18 --weights r18.pt -o r18.kiln",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--model", required=True,
                   help="torchvision.models name, e.g. mobilenet_v3_small, mobilenet_v3_large, resnet18")
    e.add_argument("--input-shape", type=parse_shape, default=(1, 3, 224, 224), metavar="NxCxHxW",
                   help="shape of the single input tensor the program will take (default 1x3x224x224)")
    e.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="dtype of the input and weights (default float32; Kiln's portable kernels compute "
                        "in float32, so float16/bfloat16 need a backend that supports them)")
    e.add_argument("--weights", metavar="PATH",
                   help="state_dict saved with torch.save(model.state_dict(), PATH); without it the model "
                        "gets seeded random weights (torch.manual_seed(0)) and its labels are meaningless")
    e.add_argument("--backends", nargs="*", default=[], metavar="NAME",
                   help="backends to lower to, in order of preference (built now: portable; the default "
                        "is Kiln's portable kernels)")
    e.add_argument("-o", "--output", required=True, metavar="OUT.kiln", help="program file to write")
    e.add_argument("-q", "--quiet", action="store_true", help="print only the written path")
    e.set_defaults(func=cmd_export)

    o = sub.add_parser("ops", help="list Kiln's op set (ops built into this Kiln)")
    o.set_defaults(func=cmd_ops)

    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""Writes (or checks) the core ATen table of docs/op-set.md from PyTorch's own op tags.

Every op name that PyTorch tags `torch.Tag.core` (the core ATen opset that torch.export's
decompositions target) gets one row: whether Kiln's op set has it (kiln.op_names(), the C++ op
registry), or how capture handles it without a Kiln op of that name (an alias it drops, a view
it maps onto another Kiln op, a value folded at export), or why Kiln lacks it, one of:
backward, RNG, data-dependent shape, symbolic shapes, complex dtype (and resize_, an
in-place op that functional export graphs never contain).

  PYTHONPATH=python python tools/core_aten_table.py           # rewrite the table in docs/op-set.md
  PYTHONPATH=python python tools/core_aten_table.py --check   # exit 1 if the file is out of date,
                                                              # or a core op has neither a Kiln op nor a reason

The table lives between the markers BEGIN/END below; the rest of docs/op-set.md is hand-written.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "op-set.md")
BEGIN = "<!-- BEGIN core-aten table (tools/core_aten_table.py) -->"
END = "<!-- END core-aten table -->"

BACKWARD = "backward"
RNG = "RNG"
DATA_DEPENDENT = "data-dependent shape"
SYMBOLIC = "symbolic shapes"
COMPLEX = "complex dtype"
IN_PLACE = "in place"  # not one of the five: an op that functional export graphs never hold

# Core ops that Kiln does not have, and why (the categories). Anything core that is
# neither a Kiln op, nor in CAPTURED, nor here makes --check fail.
MISSING = {
    "_adaptive_avg_pool2d_backward": BACKWARD, "avg_pool2d_backward": BACKWARD,
    "convolution_backward": BACKWARD, "embedding_dense_backward": BACKWARD,
    "max_pool2d_with_indices_backward": BACKWARD, "native_group_norm_backward": BACKWARD,
    "native_layer_norm_backward": BACKWARD,
    "rand": RNG, "randn": RNG, "randperm": RNG, "native_dropout": RNG,
    "nonzero": DATA_DEPENDENT,
    "sym_numel": SYMBOLIC, "sym_size": SYMBOLIC, "sym_storage_offset": SYMBOLIC, "sym_stride": SYMBOLIC,
    "sym_is_contiguous": SYMBOLIC,
    "_fft_r2c": COMPLEX, "_fft_c2r": COMPLEX,
    "resize_": IN_PLACE,
}
# Core ops that capture handles without a Kiln op of the same name: how.
CAPTURED = {
    "alias": "dropped (an alias of its input)",
    "_local_scalar_dense": "folded at export (Tensor.item() of a constant); of a computed value: data-dependent",
    "empty": "folded at export (an uninitialized constant: zeros)",
    "empty_strided": "folded at export (an uninitialized constant: zeros)",
    "split_with_sizes": "slices (aten.slice per piece)",
    "_adaptive_avg_pool2d": "aten.adaptive_avg_pool2d",
    "avg_pool1d": "aten.avg_pool2d on a height-1 image (the decomposition keeps avg_pool2d whole)",
    "adaptive_avg_pool1d": "aten.adaptive_avg_pool2d on a height-1 image",
    "_native_batch_norm_legit_no_training": "aten.native_batch_norm (training=False)",
    "_native_batch_norm_legit": "aten.native_batch_norm with training=False (training=True: batch statistics, refused)",
}
NOTES = {
    "native_dropout": "in eval mode (train=False) capture drops it (identity); in training it draws random masks",
    "sym_size": "static shapes: capture folds them to integers; symbolic sizes wait for the dynamic-shape issue",
    "sym_numel": "as sym_size", "sym_stride": "as sym_size", "sym_storage_offset": "as sym_size",
    "sym_is_contiguous": "as sym_size (Kiln values are contiguous)",
    "nonzero": "output size depends on the data; waits for the dynamic-shape issue (refused with that reason)",
    "_fft_r2c": "see 'Complex values' in the next section", "_fft_c2r": "as _fft_r2c",
    "resize_": "resizes a tensor's storage in place; torch.export's functionalized graphs do not contain it, "
               "and capture refuses it as an op outside the set",
}


def core_op_names() -> list[str]:
    """Packet names (e.g. "convolution") of every ATen op with an overload tagged torch.Tag.core.
    Enumerates the dispatcher's registered op names (torch.ops.aten is a lazy namespace: its dir()
    lists only the packets used so far in the process, so it would give a count that depends on
    what was imported before)."""
    names = set()
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        packet, _, overload = full[len("aten::"):].partition(".")
        if packet in names:
            continue
        try:
            op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        except (AttributeError, RuntimeError):
            continue
        if torch.Tag.core in op.tags:
            names.add(packet)
    return sorted(names)


def build_table() -> tuple[str, list[str]]:
    """The markdown table and the names of core ops with neither a Kiln op nor a reason."""
    kiln_ops = set(kiln.op_names())
    rows, unexplained = [], []
    have = 0
    for name in core_op_names():
        if f"aten.{name}" in kiln_ops:
            have += 1
            rows.append(f"| aten.{name} | yes | |")
        elif name in CAPTURED:
            have += 1
            rows.append(f"| aten.{name} | captured | {CAPTURED[name]} |")
        elif name in MISSING:
            note = NOTES.get(name)
            rows.append(f"| aten.{name} | no: {MISSING[name]} | {note or ''} |")
        else:
            unexplained.append(name)
            rows.append(f"| aten.{name} | **no (no reason given)** | |")
    total = len(rows)
    head = [
        f"PyTorch {torch.__version__.split('+')[0]} tags {total} op names `core` (`torch.Tag.core`). "
        f"Kiln has {have} of them (as Kiln ops, or as the capture mapping named); "
        f"{total - have - len(unexplained)} are outside its scope for the reason given.",
        "",
        "| core ATen op | in Kiln | note |",
        "|---|---|---|",
    ]
    return "\n".join([BEGIN, "", *head, *rows, "", END]), unexplained


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/op-set.md is out of date")
    args = ap.parse_args()
    table, unexplained = build_table()
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    if BEGIN in text and END in text:
        before, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        new = before + table + after
    else:
        new = text.rstrip("\n") + "\n\n## Core ATen coverage\n\n" + table + "\n"
    if unexplained:
        print("core ATen ops with neither a Kiln op nor a reason: " + ", ".join(unexplained), file=sys.stderr)
    if args.check:
        if new != text:
            print(f"{DOC} is out of date: run PYTHONPATH=python python tools/core_aten_table.py", file=sys.stderr)
            return 1
        return 1 if unexplained else 0
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(new)
    print(f"wrote {DOC}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())

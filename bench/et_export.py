"""Lowers a torchvision model to an ExecuTorch .pte with the XNNPACK delegate (run with the
ExecuTorch virtualenv of bench/setup_executorch.sh, not Kiln's: executorch pins its own torch).

    python bench/et_export.py --model mobilenet_v3_small --weights w.pt --shape 1x3x224x224 --out m.pte

The weights are the state_dict that bench/run.py saved (seeded random init), so every engine runs
the same network. Flow: torch.export.export -> to_edge_transform_and_lower(partitioner=
[XnnpackPartitioner()]) -> to_executorch(); this is the flow of ExecuTorch's XNNPACK docs. Prints
one JSON object: the number of delegate calls in the lowered graph, the non-delegated ops, export
seconds, versions.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--shape", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    import torchvision
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    t0 = time.perf_counter()
    model = getattr(torchvision.models, args.model)(weights=None)
    model.load_state_dict(torch.load(args.weights, map_location="cpu", weights_only=True))
    model.eval()
    shape = tuple(int(d) for d in args.shape.split("x"))
    example = (torch.zeros(shape),)
    ep = torch.export.export(model, example)
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    gm = edge.exported_program().graph_module
    delegates, others = 0, {}
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        name = getattr(n.target, "__name__", None) or str(n.target).split(":")[0]
        if "executorch_call_delegate" in name:
            delegates += 1
        elif "getitem" not in name:
            others[name] = others.get(name, 0) + 1
    prog = edge.to_executorch()
    with open(args.out, "wb") as f:
        f.write(prog.buffer)
    import executorch.version as ev
    print(json.dumps({"delegate_calls": delegates, "non_delegated_ops": others,
                      "export_s": time.perf_counter() - t0, "executorch": ev.__version__,
                      "torch": torch.__version__, "torchvision": torchvision.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Helpers shared by the delegate tests (test_xnnpack.py, test_mlx.py): build a graph, compile it
for a backend, run it, and read the delegation report."""
import numpy as np

import kiln
from oprunner import kiln_dtype


def add_const(g, name, arr, dtype=None):
    """Adds `arr` (cast to `dtype` when given) to graph g as a constant; returns its value id."""
    arr = np.ascontiguousarray(arr, dtype=dtype)
    return g.add_constant(name, kiln_dtype(arr), list(arr.shape), arr.view(np.uint8).reshape(-1))


def compile_graph(build, feeds, backends, **opts):
    """build(g, input_ids) -> output ids; one input per array of `feeds`. Compiles with `backends`
    (and compile options `opts`), runs on `feeds`. Returns (outputs, delegation report of the
    method, program bytes, report text)."""
    g = kiln.Graph()
    ids = [g.add_input(f"x{i}", kiln_dtype(x), list(x.shape)) for i, x in enumerate(feeds)]
    g.set_outputs(list(build(g, ids)))
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, rep = pb.compile(backends=list(backends), **opts)
    outs = kiln.load_bytes(data).run(*feeds)
    return outs, rep["methods"][0]["delegation"], data, rep["text"]


def segment(delegation, backend):
    """The report's summary for `backend` ({backend, segments, nodes, constant_bytes})."""
    (b,) = [b for b in delegation["backends"] if b["backend"] == backend]
    return b


def check_all_delegated(delegation, backend, nodes=None):
    """Asserts one `backend` segment (of `nodes` nodes when given) and nothing left to the CPU."""
    b = segment(delegation, backend)
    assert b["segments"] == 1, delegation
    assert delegation["cpu_ops"] == [], delegation
    if nodes is not None:
        assert b["nodes"] == nodes, delegation


def declined_reasons(delegation, op, backend):
    """`backend`'s reasons for leaving nodes of `op` to the CPU kernels."""
    for c in delegation["cpu_ops"]:
        if c["op"] == op:
            return [r for b, r in c["reasons"] if b == backend]
    return []

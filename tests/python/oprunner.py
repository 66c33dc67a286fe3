"""Run one Kiln op on NumPy inputs through the real compiler and runtime (tests only).

The reference for every comparison is PyTorch eager, never Kiln's own code.
"""
from __future__ import annotations

import numpy as np

import kiln

_NP_TO_KILN = {
    np.dtype("float32"): "float32", np.dtype("float16"): "float16", np.dtype("int64"): "int64", np.dtype("float64"): "float64",
    np.dtype("int32"): "int32", np.dtype("int8"): "int8", np.dtype("uint8"): "uint8", np.dtype("bool"): "bool",
}


def kiln_dtype(a: np.ndarray) -> str:
    return _NP_TO_KILN[a.dtype]


def one_node_graph(op: str, inputs, attrs: dict | None = None, constants=()):
    """A kiln.Graph of one `op` node whose outputs are the graph's; returns (graph, feeds).

    inputs: list of np.ndarray or None (absent optional tensor argument).
    constants: indices of inputs to embed as constants instead of method inputs; feeds: the other
    inputs, in order (the method's inputs).
    """
    g = kiln.Graph()
    ids, feeds = [], []
    for i, x in enumerate(inputs):
        if x is None:
            ids.append(-1)
            continue
        x = np.asarray(x, order="C")  # keeps 0-d arrays 0-d
        if i in constants:
            ids.append(g.add_constant(f"c{i}", kiln_dtype(x), list(x.shape), x.view(np.uint8).reshape(-1) if x.size else np.zeros(0, np.uint8)))
        else:
            ids.append(g.add_input(f"x{i}", kiln_dtype(x), list(x.shape)))
            feeds.append(x)
    g.set_outputs(list(g.add_node(op, ids, attrs or {})))
    return g, feeds


def run_op(op: str, inputs, attrs: dict | None = None, *, constants=(), num_outputs=None):
    """Builds a one-node program for `op`, compiles, loads, executes; returns the outputs.

    inputs: list of np.ndarray or None (absent optional tensor argument).
    constants: indices of inputs to embed as constants instead of method inputs.
    """
    g, feeds = one_node_graph(op, inputs, attrs, constants)
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile(fold_constants=False)
    prog = kiln.load_bytes(data)
    return prog.run(*feeds)


def assert_close(actual: np.ndarray, expected: np.ndarray, rel: float = 1e-5, what: str = ""):
    """max |actual - expected| <= rel * max(|expected|, 1e-6-floor); shapes and dtypes equal."""
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if expected.dtype == np.bool_ or np.issubdtype(expected.dtype, np.integer):
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg=f"{what}: NaN positions differ")
    mask = ~np.isnan(e)
    if not mask.any():
        return
    scale = max(float(np.max(np.abs(e[mask]))), 1e-6) if np.isfinite(e[mask]).all() else 1.0
    err = float(np.max(np.abs(a[mask] - e[mask]))) if np.isfinite(e[mask]).all() else 0.0
    assert err <= rel * scale, f"{what}: max abs error {err:.3e} > {rel:g} * max|expected| {scale:.3e}"


def check_cpu_kernels_match_eager(model, x, what: str = "", rel: float = 1e-5, selected: bool = True,
                                  threads=(1, 2)):
    """Exports `model` (a torch module in eval mode) on input `x` (a torch tensor), runs it with
    the cpu kernels on pools of each of `threads` and compares the first output with eager's (assert_close).
    With `selected`, also checks that the cpu kernel ran: its float32 FMA sums differ in the last
    bits from the portable kernels' double sums, so a bit-identical output means it was not used.
    Returns the output of the last pool."""
    import torch
    data = kiln.export(model, (x,), verbose=False).data
    with torch.no_grad():
        expected = model(x).numpy()
    for n in threads:
        out = kiln.load_bytes(data, num_threads=n).run(x.numpy())[0]
        assert_close(out, expected, rel=rel, what=f"{what} at {n} threads")
    if selected:
        ref = kiln.load_bytes(data, num_threads=1, portable_kernels_only=True).run(x.numpy())[0]
        assert not np.array_equal(out, ref), f"{what}: the cpu kernel was not selected (bit-identical to portable)"
    return out

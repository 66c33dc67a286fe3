"""ONNX models to .kiln programs (the C++ importer, src/frontends/onnx, through kiln._kiln).

    import kiln.onnx
    result = kiln.onnx.compile_onnx("det.onnx", out="det.kiln", backends=["xnnpack"],
                                    input_shapes={"x": (1, 3, 640, 640)})
    prog = kiln.load("det.kiln")

The importer maps ONNX ops (default domain, opsets up to 22: ``opset_range()``) onto Kiln's ATen ops, folds shape-computing subgraphs
for the given static input shapes and refuses what it cannot honour with a KilnError naming the
node, the op type and the attribute. Available when Kiln was built with libonnx-dev and
libprotobuf-dev (``available()``).
"""
from __future__ import annotations

import os
import time
from typing import Mapping, Sequence

from . import _kiln

__all__ = ["available", "supported_ops", "opset_range", "import_onnx", "compile_onnx"]


def available() -> bool:
    """True when this build of Kiln has the ONNX importer."""
    return hasattr(_kiln, "import_onnx")


def supported_ops() -> list[str]:
    """ONNX op types (default domain) the importer maps onto Kiln ops."""
    _require()
    return list(_kiln.onnx_supported_ops())


def opset_range() -> tuple[int, int]:
    """(min, max) default-domain ("" / "ai.onnx") opset versions the importer accepts; models
    outside it are refused with KilnError code NotSupported."""
    _require()
    lo, hi = _kiln.onnx_opset_range()
    return int(lo), int(hi)


def _require():
    if not available():
        raise _kiln.KilnError("Kiln was built without the ONNX importer (install libonnx-dev libprotobuf-dev and "
                              "rebuild)", "NotFound")


def _shapes(input_shapes: Mapping[str, Sequence[int]] | None) -> dict:
    return {str(k): [int(d) for d in v] for k, v in (input_shapes or {}).items()}


def import_onnx(path: str | os.PathLike, input_shapes: Mapping[str, Sequence[int]] | None = None,
                constant_inputs: Mapping[str, "np.ndarray"] | None = None):
    """Imports an ONNX model: returns (kiln.Graph, info) where info = {input_names, output_names,
    opset, onnx_nodes, folded_nodes, notes}. input_shapes: {input name: sizes} for every input with a
    dynamic dimension. constant_inputs: {input name: NumPy array} binds inputs to fixed values (they
    become constants and leave the program's inputs; e.g. a shape or axes fed as a graph input).
    Raises KilnError (code NotFound, InvalidProgram, NotSupported, InvalidArgument)."""
    import numpy as np
    _require()
    consts = {str(k): np.asarray(v, order="C") for k, v in (constant_inputs or {}).items()}  # keeps 0-d arrays 0-d
    return _kiln.import_onnx(os.fspath(path), _shapes(input_shapes), consts)


class _OnnxCapture:
    """What capture.compile_captures reads from a capture (graph, node count, notes)."""

    def __init__(self, graph, info: dict):
        self.graph = graph
        self.aten_nodes = info["onnx_nodes"]  # the source graph's node count in the report
        self.source_label = "ONNX"
        self.notes = list(info["notes"])
        self.input_names = list(info["input_names"])


def compile_onnx(path: str | os.PathLike, *, out: str | os.PathLike | None = None,
                 input_shapes: Mapping[str, Sequence[int]] | None = None, backends: Sequence[str] = (),
                 require_delegation: str | None = None, report_json: str | os.PathLike | None = None,
                 method: str = "forward", verbose: bool = False, alternatives: Sequence[Sequence[str]] = (),
                 constant_inputs: Mapping[str, "np.ndarray"] | None = None, **quantization):
    """Imports an ONNX model and compiles it into one program with the C++ compiler, exactly as
    kiln.export does for PyTorch models (same report, same backends / require_delegation /
    alternatives / report_json options; see kiln.capture.export; `quantization`: quantize, group_size,
    symmetric, scale_dtype, exclude, weights_dtype as for kiln.capture.compile_captures). constant_inputs:
    {input name: NumPy array} binds inputs to fixed values, as for import_onnx (e.g. a Loop's trip count
    fed as a graph input); they leave the program's inputs. Returns kiln.capture.ExportResult
    (path, data, report, text, ...). Raises KilnError for import errors and ExportError for compile
    errors."""
    from .capture import compile_captures  # imports torch (only for the report helpers)

    t0 = time.perf_counter()
    graph, info = import_onnx(path, input_shapes, constant_inputs)
    return compile_captures({method: _OnnxCapture(graph, info)}, out=out, backends=backends,
                            require_delegation=require_delegation, report_json=report_json, verbose=verbose,
                            t0=t0, alternatives=alternatives, **quantization)

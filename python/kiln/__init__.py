"""Kiln: ahead-of-time compiler and runtime for PyTorch models.

The Python side is thin: it captures models with torch.export (kiln.capture) and hands nodes
and constants to the C++ compiler through the binding module ``kiln._kiln``. Everything
else (passes, memory planning, serialization, execution) is C++.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from . import _kiln
from ._kiln import Graph, KilnError, ProgramBuilder

__all__ = ["Graph", "KilnError", "ProgramBuilder", "LoadedProgram", "load", "load_bytes", "op_names"]


def op_names() -> list[str]:
    """Names of every op in Kiln's op set (ATen names such as ``aten.convolution``)."""
    return list(_kiln.op_names())


class LoadedProgram:
    """A verified program loaded by the C++ runtime, runnable from Python (for tests and tools).

    ``run(*inputs, method="forward")`` takes NumPy arrays (or torch tensors) whose dtype and
    shape match the method's inputs exactly and returns a list of NumPy arrays. Errors are
    raised as ``kiln.KilnError(message, code)``.
    """

    def __init__(self, program: "_kiln.Program"):
        self._program = program
        self._methods: dict[str, object] = {}

    @property
    def method_names(self) -> list[str]:
        return list(self._program.method_names)

    @property
    def constant_bytes(self) -> int:
        return int(self._program.constant_bytes)

    @property
    def file_size(self) -> int:
        return int(self._program.file_size)

    def method(self, name: str = "forward"):
        if name not in self._methods:
            self._methods[name] = self._program.load_method(name)
        return self._methods[name]

    def run(self, *inputs, method: str = "forward") -> list[np.ndarray]:
        arrays = []
        for x in inputs:
            if hasattr(x, "detach"):  # torch.Tensor without importing torch here
                x = x.detach().cpu().contiguous().numpy()
            arrays.append(np.asarray(x, order="C"))  # keeps 0-d arrays 0-d (ascontiguousarray gives ndim >= 1)
        return list(self.method(method).execute(arrays))


def load(path: str | os.PathLike) -> LoadedProgram:
    """Loads and verifies a .kiln file (memory-mapped). Raises KilnError on any problem."""
    return LoadedProgram(_kiln.Program.load(os.fspath(path)))


def load_bytes(data: bytes) -> LoadedProgram:
    """Loads and verifies a program held in memory."""
    return LoadedProgram(_kiln.Program.from_bytes(data))


def _lazy_capture():
    from . import capture  # noqa: F401  (imports torch)
    return capture


def __getattr__(name: str):
    # kiln.export / kiln.export_program live in kiln.capture (imports torch lazily).
    if name in ("export", "export_program"):
        return getattr(_lazy_capture(), name)
    raise AttributeError(name)

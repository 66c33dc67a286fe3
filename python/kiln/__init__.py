"""Kiln: ahead-of-time compiler and runtime for PyTorch models.

The Python side is thin: it captures models with torch.export (kiln.capture) and hands nodes
and constants to the C++ compiler through the binding module ``kiln._kiln``. Everything
else (passes, memory planning, serialization, execution) is C++.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np



def _import_binding():
    """Imports the binding module kiln._kiln. It links MLX's shared library (libmlx) when Kiln was
    built with the mlx delegate: the wheel finds it through a relative RPATH (site-packages/mlx/lib);
    when the mlx package lives elsewhere (another site directory), libmlx is loaded from the mlx
    package first and the import retried. Raises the original ImportError otherwise."""
    try:
        from . import _kiln as binding
        return binding
    except ImportError as e:
        if "libmlx" not in str(e):
            raise
        import ctypes
        import importlib.util
        spec = importlib.util.find_spec("mlx")
        lib = os.path.join(list(spec.submodule_search_locations)[0], "lib", "libmlx.so") if spec else None
        if lib is None or not os.path.exists(lib):
            raise ImportError(f"{e} (Kiln was built with the mlx delegate: install the mlx package it was "
                              "built with, pip install 'mlx[cpu]==0.32.4')") from e
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        from . import _kiln as binding
        return binding


_kiln = _import_binding()
from ._kiln import Graph, KilnError, ProgramBuilder  # noqa: E402

#: Kiln's version: CMake's project(kiln VERSION ...), compiled into the binding (the wheel's version
#: is read from the same line of CMakeLists.txt, pyproject.toml [tool.scikit-build.metadata.version]).
__version__: str = _kiln.__version__

__all__ = ["Graph", "KilnError", "ProgramBuilder", "LoadedProgram", "load", "load_bytes", "op_names",
           "cpu_target", "available_cpu_targets", "compiled_cpu_targets"]


def op_names() -> list[str]:
    """Names of every op in Kiln's op set (ATen names such as ``aten.convolution``)."""
    return list(_kiln.op_names())


def cpu_target() -> str:
    """The SIMD instruction set Kiln's optimized cpu kernels run at in this process: one of
    ``"avx3_dl"`` (AVX-512 with VNNI/VBMI2), ``"avx3"`` (AVX-512), ``"avx2"`` (AVX2 + FMA),
    ``"neon"`` (Arm) or ``"scalar"`` (x86-64 only: the same kernel code on one lane).

    It is the best target this build compiled and this CPU supports, unless the environment
    variable ``KILN_CPU_TARGET`` names another one (for tests and per-instruction-set benchmarks).
    The choice is made once per process, at the first program load or the first call of this
    function, so setting ``KILN_CPU_TARGET`` afterwards has no effect: set it before starting
    Python (or in a subprocess's environment).

    Raises ``KilnError`` (code ``"InvalidArgument"``) when ``KILN_CPU_TARGET`` names a target that is
    unknown, not compiled into this build or not supported by this CPU; programs do not load then
    either (no program runs at a target other than the one asked for).
    """
    return str(_kiln.cpu_target())


def available_cpu_targets() -> list[str]:
    """The cpu kernel targets that can run here (compiled into this build and supported by this
    CPU), best first (on x86-64 the last is ``"scalar"``; on aarch64 ``"neon"``, its baseline).
    Any of them is a valid ``KILN_CPU_TARGET``. Does not raise, whatever ``KILN_CPU_TARGET``
    holds."""
    return list(_kiln.available_cpu_targets())


def compiled_cpu_targets() -> list[str]:
    """Every cpu kernel target compiled into this build, best first, whether or not this CPU
    supports it (x86-64: avx3_dl, avx3, avx2, scalar; aarch64: neon)."""
    return list(_kiln.compiled_cpu_targets())


class LoadedProgram:
    """A verified program loaded by the C++ runtime, runnable from Python (for tests and tools).

    ``run(*inputs, method="forward")`` takes NumPy arrays (or torch tensors) whose dtype and
    shape match the method's inputs exactly and returns a list of NumPy arrays (``as_dict=True``:
    a dict keyed by ``output_names(method)``). Errors are raised as ``kiln.KilnError(message, code)``.

    ``num_threads``: 0 = the process-wide pool (KILN_NUM_THREADS or the core count), else each
    method gets a pool of that many threads (kernels and delegates). ``portable_kernels_only``:
    run Kiln's reference kernels instead of the optimized cpu kernels (the numerical oracle).
    """

    def __init__(self, program: "_kiln.Program", *, num_threads: int = 0, portable_kernels_only: bool = False):
        self._program = program
        self._methods: dict[str, object] = {}
        self._num_threads = int(num_threads)
        self._portable = bool(portable_kernels_only)

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
            self._methods[name] = self._program.load_method(name, self._num_threads, self._portable)
        return self._methods[name]

    @property
    def metadata(self) -> dict[str, str]:
        """The program's string key/values (e.g. ``llm.vocab_size``)."""
        return dict(self._program.metadata)

    @property
    def states(self) -> list[dict]:
        """The program's state tensors: [{name, dtype, sizes, zero_initial}] (empty when stateless)."""
        return list(self._program.states)

    def method_meta(self, name: str = "forward") -> dict:
        """{name, inputs: [{name, dtype, sizes (upper bounds), dims}], outputs, symbols: [(name, min,
        max)], states, state_holders (per state the delegate holding it, e.g. "mlx", or ""), arena_bytes, num_kernel_calls, num_delegate_calls, alternative (the index of
        the alternative the loader chose), num_alternatives}; dims holds each dim's symbolic
        expression ('' when fixed)."""
        return dict(self._program.method_meta(name))

    def new_session(self):
        """A new session (``kiln._kiln.Session``): one set of the program's states at their initial
        values, for ``run(..., session=s)``. ``s.reset()`` restores them; ``s.state(name)`` copies one."""
        return self._program.new_session()

    @property
    def session(self):
        """The session ``run`` uses when given none (created on first use; shared by every method of
        this LoadedProgram, e.g. prefill and decode over one KV cache)."""
        if getattr(self, "_session", None) is None:
            self._session = self._program.new_session()
        return self._session

    def output_names(self, method: str = "forward") -> list[str]:
        """The names of `method`'s outputs, in order, as ``kiln inspect`` shows them: the names in
        the file (the PyTorch module's output structure, e.g. ``logits`` or ``output.0``; the ONNX
        graph's output names), ``#<i>`` for an unnamed output (files written before output names)
        and for a repeated one. KilnError (NotFound) for an unknown method."""
        names, seen = [], set()
        for i, o in enumerate(self._program.method_meta(method)["outputs"]):
            n = o["name"]
            names.append(n if n and n not in seen else f"#{i}")
            seen.add(n)
        return names

    def run(self, *inputs, method: str = "forward", session=None, as_dict: bool = False):
        """Runs `method`; a program with state runs on `session` (default: ``self.session``).
        Returns a list of NumPy arrays, one per output; with ``as_dict=True`` a dict from each
        output's name (``output_names(method)``) to its array, in output order."""
        outs = self._run(inputs, method, session)
        return dict(zip(self.output_names(method), outs)) if as_dict else outs

    def _run(self, inputs, method, session) -> list[np.ndarray]:
        if session is None and self._program.states:
            session = self.session
        arrays = []
        for x in inputs:
            if hasattr(x, "detach"):  # torch.Tensor without importing torch here
                x = x.detach().cpu().contiguous().numpy()
            arrays.append(np.asarray(x, order="C"))  # keeps 0-d arrays 0-d (ascontiguousarray gives ndim >= 1)
        return list(self.method(method).execute(arrays, session))


def load(path: str | os.PathLike, *, num_threads: int = 0, portable_kernels_only: bool = False,
         backend_settings: dict | None = None, prefault: bool = False, use_mmap: bool = True) -> LoadedProgram:
    """Loads and verifies a .kiln file (memory-mapped). Raises KilnError on any problem.
    backend_settings: {"<backend>.<key>": value} for delegate backends, e.g. {"mlx.device": "cpu"}
    (run mlx segments on MLX's CPU device). prefault: map every page of the file at load
    (MAP_POPULATE; the first run takes no page faults on the weights, load takes longer; what
    `generate` wants). use_mmap=False: read the file into memory (huge pages where granted) instead
    of mapping it. Other options as for LoadedProgram."""
    return LoadedProgram(_kiln.Program.load(os.fspath(path), dict(backend_settings or {}), prefault, use_mmap),
                         num_threads=num_threads, portable_kernels_only=portable_kernels_only)


def load_bytes(data: bytes, *, num_threads: int = 0, portable_kernels_only: bool = False,
               backend_settings: dict | None = None) -> LoadedProgram:
    """Loads and verifies a program held in memory. Options as for load()."""
    return LoadedProgram(_kiln.Program.from_bytes(data, dict(backend_settings or {})), num_threads=num_threads,
                         portable_kernels_only=portable_kernels_only)


# What to install when an optional dependency of the Python side is missing.
_EXTRA_FOR = {"torch": "export", "torchvision": "export", "transformers": "llm"}


def missing_dependency_message(e: ModuleNotFoundError) -> str | None:
    """One line for a missing optional dependency (torch, torchvision, transformers), naming the pip
    extra that brings it; None for any other missing module."""
    top = (e.name or "").split(".")[0]
    if top not in _EXTRA_FOR:
        return None
    return (f"this needs {top}, which is not installed in this Python environment: pip install "
            f"'kiln[{_EXTRA_FOR[top]}]' (or a supported {top} version); loading and running .kiln files, "
            "and the C++ `kiln compile model.onnx`, need no PyTorch")


def _lazy_capture():
    try:
        from . import capture  # noqa: F401  (imports torch)
    except ModuleNotFoundError as e:
        msg = missing_dependency_message(e)
        if msg is None:
            raise
        raise ModuleNotFoundError(f"kiln.export: {msg}", name=e.name) from e
    return capture


def __getattr__(name: str):
    # kiln.export / kiln.export_program / kiln.ExportError live in kiln.capture (imports torch lazily).
    if name in ("export", "export_program", "ExportError"):
        return getattr(_lazy_capture(), name)
    if name in ("export_llm", "generate"):
        from . import llm_export
        return getattr(llm_export, name)
    raise AttributeError(name)

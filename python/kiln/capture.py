"""Capture of PyTorch modules into Kiln programs.

``kiln.export(module, example_inputs, out="model.kiln")`` captures ``module`` with
``torch.export.export`` (eval mode, ``strict=False``), runs the decompositions that bring the graph
to Kiln's op set (``decomposition_table()``: PyTorch's default table minus the composite ops
Kiln keeps whole), walks the resulting ATen graph and builds a ``kiln.Graph`` through the binding,
node by node. Compilation and serialization happen in C++ (``kiln.ProgramBuilder``).

Mapping rules (docs/op-set.md):
- user inputs -> graph inputs; parameters, buffers and lifted constants -> constants (C-contiguous
  bytes), added lazily when a Kiln node first uses them;
- every ATen call becomes a Kiln node whose tensor arguments are positional (-1 for None) and whose
  other arguments are named attributes with their ATen schema names;
- Python numbers in tensor positions (``add.Scalar``, ``where.ScalarOther``, ...) become 0-d
  constants of the result's dtype;
- a call whose tensor arguments are all known constants (``full``, ``arange``, ``zeros``,
  ``permute`` of a weight, ...) is evaluated by PyTorch at export time and becomes a constant;
  ops that only read their input's shape (``zeros_like``, ``full_like``, ``fill``) likewise;
- ``alias``/``detach``/``clone``/``lift_fresh_copy``/eval-mode dropout are dropped,
  ``_assert_*`` checks are dropped;
- ``aten.index`` whose index tensors are constants forming a range grid (transformers' padding-mask
  lookup ``mask[arange(B)[:, None, None, None], arange(K)[None, None, None, :]]``) becomes slices, a
  permute, a view and an expand (``_index_grid``); a constant ``expand`` of at most 65536 elements is
  evaluated like other constant calls (larger ones stay nodes); docs/transformers.md;
- multi-output ATen ops used for their first output only (``native_batch_norm``, ``native_layer_norm``,
  ``native_group_norm``, ``max_pool2d_with_indices``, inference ``_native_batch_norm_legit*``) map onto
  single-output Kiln ops; using any other output fails the export (an inference batch norm's
  running-stat write-back of unchanged statistics is accepted); ``max_pool3d_with_indices`` and
  ``adaptive_max_pool2d/3d`` keep both outputs (values, indices).

Every failure is an ``ExportError`` naming the ATen op, the module path of the node (from
``node.meta["nn_module_stack"]``) and what to do.
"""
from __future__ import annotations

import math
import operator
import os
import sys
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from . import _kiln
from ._kiln import KilnError

__all__ = ["ExportError", "ExportResult", "decomposition_table", "capture", "capture_exported", "export",
           "export_program", "compile_exported_file", "compile_captures", "format_delegation", "KNOWN_BACKENDS",
           "BUILT_BACKENDS"]

OP_SET_DOC = "docs/op-set.md"

#: Backends a program can target (DESIGN.md); only those in BUILT_BACKENDS exist in this build.
KNOWN_BACKENDS = ("portable", "cpu", "xnnpack", "mlx", "vulkan")
# Quantization schemes (export(quantize=...), src/ir/ops/quant.h): weight-only int8 per output
# channel / int4 group-wise, and the same weights with int8 activation blocks.
QUANT_SCHEMES = ("w8", "w4", "w8a8", "w4a8")
#: "portable" (Kiln's own kernels, always there) plus the delegate backends compiled into this
#: build (``kiln._kiln.backend_names()``, e.g. "xnnpack").
BUILT_BACKENDS = ("portable",) + tuple(n for n in _kiln.backend_names() if n != "portable")


class ExportError(RuntimeError):
    """An export failed. ``op`` is the ATen op (e.g. "aten.fft_fft.default") or None,
    ``module_path`` the dotted path of the submodule that called it ("" for the top level),
    ``code`` the Kiln error code name when the C++ compiler refused the node (e.g. "NotSupported")."""

    def __init__(self, message: str, *, op: str | None = None, module_path: str | None = None,
                 code: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.op = op
        self.module_path = module_path
        self.code = code
        self.reason = reason if reason is not None else message


# --------------------------------------------------------------------------------------------------
# dtypes

_TORCH_TO_KILN = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.int64: "int64",
    torch.int32: "int32", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
    torch.float64: "float64",
}


def kiln_dtype(dtype: torch.dtype, what: str = "tensor") -> str:
    """Kiln's name for a torch dtype ("float32", ...); ExportError for dtypes Kiln lacks (int16,
    complex, ...)."""
    try:
        return _TORCH_TO_KILN[dtype]
    except KeyError:
        raise ExportError(f"{what} has dtype {dtype}, which Kiln does not support "
                          f"(supported: {', '.join(_TORCH_TO_KILN.values())}); cast it (e.g. to float32) "
                          "before exporting") from None


def _tensor_bytes(t: torch.Tensor):
    """C-contiguous bytes of a CPU copy of `t` as a 1-D uint8 NumPy array (zero-copy when possible)."""
    t = t.detach().to("cpu").contiguous().reshape(-1)
    if t.numel() == 0:
        return torch.zeros(0, dtype=torch.uint8).numpy()
    return t.view(torch.uint8).numpy()


# --------------------------------------------------------------------------------------------------
# decompositions

def _keep_whole_ops() -> list:
    A = torch.ops.aten
    names = [
        # composite ops that Kiln keeps whole (DESIGN.md "Op set")
        "group_norm.default", "native_group_norm.default", "layer_norm.default", "native_layer_norm.default",
        "rms_norm.default", "upsample_nearest2d.default", "upsample_nearest2d.vec",
        "upsample_bilinear2d.default", "upsample_bilinear2d.vec", "hardswish.default", "hardsigmoid.default",
        "upsample_nearest1d.default", "upsample_nearest1d.vec", "upsample_linear1d.default", "upsample_linear1d.vec",
        "gelu.default", "silu.default", "scaled_dot_product_attention.default",
        # ops of Kiln's set that the default table would otherwise split
        "linear.default", "adaptive_avg_pool2d.default", "max_pool2d.default",
        # exact as slices + cat (the default decomposition uses index_select, outside Kiln's set)
        "roll.default",
        # core ATen ops of Kiln's set that the default table rewrites into arange/index/index_put
        "reflection_pad1d.default", "reflection_pad2d.default", "reflection_pad3d.default",
        "replication_pad1d.default", "replication_pad2d.default", "replication_pad3d.default",
        "col2im.default", "im2col.default",
    ]
    ops = []
    for n in names:
        packet, overload = n.split(".")
        p = getattr(A, packet, None)
        if p is not None and hasattr(p, overload):
            ops.append(getattr(p, overload))
    return ops


_TABLE: dict | None = None


def decomposition_table() -> dict:
    """torch.export.default_decompositions() without the entries of the ops Kiln keeps whole
    (group/layer/RMS norm, nearest/(bi)linear 1-D/2-D upsampling, hardswish/hardsigmoid, GELU, SiLU,
    scaled dot-product attention, linear, adaptive_avg_pool2d, max_pool2d). Returns a fresh dict
    (built once per process: building PyTorch's table takes ~0.25 s)."""
    global _TABLE
    if _TABLE is None:
        table = torch.export.default_decompositions()
        for op in _keep_whole_ops():
            if op in table:
                del table[op]
        _TABLE = dict(table.items())
    return dict(_TABLE)


# --------------------------------------------------------------------------------------------------
# values during the graph walk

class _V:
    """A value of the Kiln graph under construction."""
    __slots__ = ("id", "dtype", "shape")

    def __init__(self, id: int, dtype: torch.dtype, shape: tuple):
        self.id, self.dtype, self.shape = id, dtype, tuple(shape)

    def __repr__(self):
        return f"_V({self.id}, {self.dtype}, {list(self.shape)})"


class _Sym:
    """A symbolic int during the walk: a size of torch.export's shape environment (a sympy
    expression over the dimension symbols declared with dynamic_shapes), e.g. ``seq`` or
    ``seq * 64``. Attributes holding one become symbolic attributes of the Kiln node."""
    __slots__ = ("expr",)

    def __init__(self, expr):
        self.expr = expr

    def __repr__(self):
        return f"_Sym({self.expr})"


def _eval_code(code: list, symbols: list) -> int:
    """Evaluates SymExpr tokens (include/kiln/symbolic.h) in Python, for the capture's checks."""
    st = []
    i = 0
    while i < len(code):
        op = code[i]
        if op in (0, 1):
            st.append(code[i + 1] if op == 0 else symbols[code[i + 1]])
            i += 2
            continue
        b, a = st.pop(), st.pop()
        st.append({2: a + b, 3: a - b, 4: a * b, 5: a // b if b else 0, 6: a % b if b else 0, 7: min(a, b),
                   8: max(a, b)}[op])
        i += 1
    return st[0]


class _NeedState(Exception):
    """Raised by the walk when buffers turn out to be updated in forward: the capture restarts with
    them as state tensors (their reads cannot have been constants)."""

    def __init__(self, targets):
        super().__init__(", ".join(sorted(targets)))
        self.targets = set(targets)


class _FirstOnly:
    """Result of a multi-output ATen op mapped onto a single-output Kiln op: only item 0 exists."""

    def __init__(self, value, op: str):
        self.value, self.op = value, op


class _LegitOutputs:
    """Outputs of an inference _native_batch_norm_legit(_functional): item 0 is the normalized
    input; the functional form's items 3 and 4 (the "updated" running stats) are the running stats
    unchanged, since training=False does not update them; items 1, 2 (saved batch statistics)
    do not exist in Kiln."""

    def __init__(self, value, stats, op: str):
        self.value, self.stats, self.op = value, stats, op

    def item(self, b, idx):
        if idx == 0:
            return self.value
        if idx in (3, 4) and len(self.stats) == 2:
            return self.stats[idx - 3]
        raise b.error(f"output {idx} of {self.op} is used; Kiln's op has only output 0",
                      f"Use only the first output of {self.op} in inference models")


class _Failed:
    """A value that could not be built (collect_errors mode): every value computed from it fails too."""

    def __init__(self, err: ExportError):
        self.err = err


_KILN_TO_TORCH = {v: k for k, v in _TORCH_TO_KILN.items()}

_IGNORED_ARGS = {"layout", "device", "pin_memory", "memory_format", "non_blocking", "cudnn_enable",
                 "cudnn_enabled"}

_DROPPED = {"aten.alias.default", "aten.detach.default", "aten.clone.default", "aten.lift_fresh_copy.default",
            "aten.alias_copy.default", "aten.detach_copy.default", "aten.contiguous.default",
            "aten.lift_fresh.default"}
_ASSERTS = ("aten._assert", "aten.sym_constrain_range", "aten._functional_assert", "aten._print")
_CHECKS = {"aten._linalg_check_errors"}  # error checks without a value (dropped)
_SHAPE_ONLY = {"aten.zeros_like", "aten.ones_like", "aten.full_like", "aten.new_zeros", "aten.new_ones",
               "aten.new_full", "aten.scalar_tensor"}
# Uninitialized tensors: PyTorch leaves their values unspecified; Kiln makes them zeros (a
# deterministic program file), as constants of the traced shape and dtype (docs/op-set.md).
_EMPTY = {"aten.empty", "aten.empty_strided", "aten.empty_like", "aten.new_empty", "aten.new_empty_strided",
          "aten.empty_permuted"}
_RANDOM = {"aten.rand", "aten.randn", "aten.randint", "aten.rand_like", "aten.randn_like", "aten.randint_like",
           "aten.normal", "aten.bernoulli", "aten.uniform", "aten.randperm", "aten.multinomial", "aten.exponential",
           "aten.poisson"}
# Ops with a cheaper mapping than eager evaluation when all inputs are constant (an expand would
# store its broadcast result), unless the result is small (at most _SMALL_FOLD elements): then it is
# evaluated, so that an op outside Kiln's set that reads it (transformers' BertEmbeddings gathers
# from an expanded buffer) folds at export time too.
_NO_EAGER_FOLD = {"aten.expand"}
_SMALL_FOLD = 1 << 16


def _module_path(node, strip: str) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    if path.startswith("L['self']"):  # strict-mode spelling: L['self'].blocks[1] -> blocks.1
        path = path[len("L['self']"):].replace("[", ".").replace("]", "").replace("'", "").lstrip(".")
    if strip and (path == strip or path.startswith(strip + ".")):
        path = path[len(strip):].lstrip(".")
    return path


def _where(path: str) -> str:
    return f"module '{path}'" if path else "the top-level module"


def _op_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def _packet_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}"
    return _op_name(target)


def _meta_val(node):
    return node.meta.get("val")


def _tree_map(fn, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_tree_map(fn, y) for y in x)
    if isinstance(x, dict):
        return {k: _tree_map(fn, v) for k, v in x.items()}
    return fn(x)


def _tree_any(pred, x) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_tree_any(pred, y) for y in x)
    if isinstance(x, dict):
        return any(_tree_any(pred, v) for v in x.values())
    return pred(x)


def _is_number(x) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, torch.Tensor)


def _same_shape(traced, shape: tuple) -> bool:
    """True when Kiln's concrete `shape` is the shape PyTorch traced. A traced size that is not an
    int is data-dependent (an unbacked symbol, e.g. the length of x[mask]); it matches any size,
    since Kiln only builds such a value when it knows the size (a constant mask folded to indices).
    Comparing it with == would make PyTorch guard on the symbol and raise."""
    if len(traced) != len(shape):
        return False
    return all(t == s for t, s in zip(traced, shape) if isinstance(t, int))


def _same(a, b) -> bool:
    """Equality of argument values, lists and tuples alike."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b or (_is_number(a) and _is_number(b) and a == b)


def _attr(v):
    """An ATen argument value as a binding attribute (None, bool, int, float, str, int list)."""
    if isinstance(v, torch.dtype):
        return kiln_dtype(v, "dtype argument")
    if isinstance(v, (list, tuple)):
        return [_attr(x) for x in v]
    if isinstance(v, (torch.SymFloat, torch.SymBool)):
        raise ExportError("a symbolic float or bool reached an op attribute; Kiln's symbolic sizes are ints")
    if isinstance(v, torch.SymInt):
        raise ExportError("a symbolic size reached an op attribute unconverted (a Kiln capture bug)")
    return v


# --------------------------------------------------------------------------------------------------
# the graph builder

def _printable(name: str) -> str:
    """`name` with control characters (and lone surrogates, as their UTF-8 bytes) written as \\xNN."""
    out = []
    for ch in name:
        o = ord(ch)
        if o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02x}")
        elif 0xD800 <= o <= 0xDFFF:
            out.extend(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogatepass"))
        else:
            out.append(ch)
    return "".join(out)


def unique_names(names) -> list:
    """`names` (strings) made valid output names, as the C++ unique_output_names does: an empty name
    becomes ``output_<i>`` (its position), control characters are written as ``\\xNN``. Names given
    as they are keep them first: the first occurrence of each unchanged name keeps it exactly, then
    altered names (``output_<i>``, escaped) take theirs if no one has it; every other (a repeat, or a
    placeholder an explicit name already has) gets the first suffix ``_2``, ``_3``, ... that no
    output has. Order is kept."""
    names = list(names)
    base = [_printable(n) if n else f"output_{i}" for i, n in enumerate(names)]
    exact = [bool(n) and b == n for n, b in zip(names, base)]
    out = [None] * len(base)
    claimed = set()
    for tier in (True, False):  # unchanged names first, then placeholders and escaped names
        for i, b in enumerate(base):
            if exact[i] == tier and b not in claimed:
                out[i] = b
                claimed.add(b)
    taken = set(base) | claimed
    for i, b in enumerate(base):
        if out[i] is None:
            k = 2
            while f"{b}_{k}" in taken:
                k += 1
            out[i] = f"{b}_{k}"
            taken.add(out[i])
    return out


def output_names(out_spec, count: int) -> list:
    """Names of a module's `count` flattened outputs from torch.export's output TreeSpec
    (``ExportedProgram.call_spec.out_spec``), docs/output-names.md: the pytree key path of
    each leaf joined with '.': a dict / ModelOutput / namedtuple field gives its key (``logits``,
    ``past_key_values.0.key``), a list or tuple its index, with ``output`` in front when the module
    returns a tuple or list (``output.0``, ``output.1``); a single tensor is ``output``. Names are
    made distinct (unique_names). Without a usable spec: ``output.<i>``."""
    import torch.utils._pytree as pytree
    fallback = [f"output.{i}" for i in range(count)]
    try:
        if out_spec is None or out_spec.num_leaves != count:
            return fallback
        paths = [p for p, _ in pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(count)), out_spec))[0]]
    except Exception:  # noqa: BLE001 (a custom output class that cannot be rebuilt from ints)
        return fallback
    if len(paths) != count:
        return fallback

    def part(k) -> str:
        for attr in ("key", "idx", "name"):  # MappingKey, SequenceKey, GetAttrKey
            if hasattr(k, attr):
                return str(getattr(k, attr))
        return str(k)

    names = []
    for p in paths:
        parts = [part(k) for k in p]
        if not p or isinstance(p[0], pytree.SequenceKey):
            parts.insert(0, "output")
        names.append(".".join(parts))
    return unique_names(names)


class _Builder:
    """Walks one ExportedProgram (after decompositions) and builds a kiln.Graph."""

    def __init__(self, ep, *, strip: str = "", progress: Callable[[str], None] | None = None,
                 collect_errors: bool = False, symbol_names: Mapping | None = None,
                 state_buffers: set | None = None):
        self.ep = ep
        self.symbol_names = dict(symbol_names or {})  # sympy symbol name -> the user's Dim name
        self.symbols: dict = {}                       # sympy symbol -> Kiln symbol index
        self.state_buffers = set(state_buffers or ())  # buffers forward updates: state tensors
        self.state_ids: dict[str, _V] = {}             # buffer name -> the state's value
        self.collect_errors = collect_errors
        self.output_errors: dict[int, ExportError] = {}  # user output index -> error (collect_errors)
        self.output_index: list[int] = []                 # user output index of each graph output
        self.input_index: list[int] = []                  # user input index of each graph input
        self.user_inputs = 0
        self.strip = strip
        self.progress = progress
        self.g = _kiln.Graph()
        self.env: dict = {}
        self._const_ids: dict[int, tuple[int, torch.Tensor]] = {}
        self._kiln_ops = set(_kiln.op_names())
        self._schemas: dict[str, dict] = {}
        self.node = None
        self.path = ""
        self.notes: list[str] = []
        self.num_const = 0
        self._names: dict[int, str] = {}  # id(constant tensor) -> its state_dict / constants name
        self._buffer_values: dict[str, object] = {}  # buffer name -> its value (for unchanged write-backs)

    # --- errors ---------------------------------------------------------------------------------
    def error(self, what: str, todo: str | None = None, *, code: str | None = None, reason: str | None = None):
        op = _op_name(self.node.target) if self.node is not None and self.node.op == "call_function" else None
        msg = f"{op}: {what}" if op else what
        fn = self.node.meta.get("torch_fn") if self.node is not None else None
        if op and isinstance(fn, tuple) and len(fn) == 2 and isinstance(fn[1], str):
            src = fn[1].rsplit(".", 1)[-1]  # the PyTorch call that decomposed into this op
            if src and src not in op:
                msg += f" [from a call of {src}]"
                reason = (reason or what) + f" [from a call of {src}]"
        msg += f" (in {_where(self.path)}" + (f", node '{self.node.name}')" if self.node is not None else ")")
        if todo:
            msg += f". {todo}"
        return ExportError(msg, op=op, module_path=self.path, code=code, reason=reason or what)

    def unsupported(self, what: str | None = None):
        return self.error(what or "this op is not in Kiln's op set",
                          "Exclude it from the exported module (compute it outside the model) or open an "
                          f"issue asking for it; Kiln's op set is in {OP_SET_DOC}")

    # --- symbolic sizes -------------------------------------------------------------------------
    def symbol_index(self, sym) -> int:
        """The Kiln symbol of a sympy symbol of the export's shape environment (declared on first use
        with the range torch.export recorded)."""
        if sym in self.symbols:
            return self.symbols[sym]
        name = str(sym)
        vr = self.ep.range_constraints.get(sym)
        if vr is None:
            raise self.error(f"size '{name}' is data-dependent (not an input dimension)",
                             "Kiln's symbolic sizes come from input dims declared with dynamic_shapes; "
                             "data-dependent shapes (nonzero, boolean masks) are not supported")
        user = self.symbol_names.get(name, name)
        try:
            if not (vr.upper.is_finite and vr.lower.is_finite):  # sympy's int_oo for a Dim without max
                raise ValueError
            lo, hi = int(vr.lower), int(vr.upper)
        except (TypeError, ValueError, OverflowError, AttributeError):
            raise self.error(f"dimension '{user}' has the unbounded range {vr}",
                             f"give it an upper bound: torch.export.Dim('{user}', min=1, max=N)") from None
        try:
            idx = self.g.add_symbol(user, lo, hi)
        except KilnError as e:
            raise self.error(f"dimension '{user}': {e.args[0]}") from None
        self.symbols[sym] = idx
        return idx

    def sym_code(self, expr) -> list:
        """SymExpr tokens (include/kiln/symbolic.h) of a sympy size expression."""
        import sympy
        from torch.utils._sympy import functions as F
        if expr.is_Integer or (expr.is_number and int(expr) == expr):
            return [0, int(expr)]
        if expr.is_Symbol:
            return [1, self.symbol_index(expr)]
        binops = [(sympy.Add, 2), (sympy.Mul, 4), (F.FloorDiv, 5), (sympy.Min, 7), (sympy.Max, 8)]
        for mod_cls in ("PythonMod", "Mod"):
            if hasattr(F, mod_cls):
                binops.append((getattr(F, mod_cls), 6))
        binops.append((sympy.Mod, 6))
        for cls, opcode in binops:
            if isinstance(expr, cls):
                args = list(expr.args)
                code = self.sym_code(args[0])
                for a in args[1:]:
                    code += self.sym_code(a) + [opcode]
                return code
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and 1 <= int(expr.exp) <= 8:
            base = self.sym_code(expr.base)
            code = list(base)
            for _ in range(int(expr.exp) - 1):
                code += base + [4]
            return code
        raise self.error(f"the symbolic size {expr} uses {type(expr).__name__}, which Kiln's size expressions "
                         "(+, -, *, //, %, min, max) cannot hold")

    def size_value(self, s):
        """A traced size as an int (fixed) or a _Sym (symbolic)."""
        if isinstance(s, torch.SymInt):
            expr = s.node.expr
            if expr.is_number:
                return int(expr)
            return _Sym(expr)
        return s

    def sym_exprs(self, shape) -> list | None:
        """Per-dim SymExpr tokens of a traced shape, or None when every dim is fixed."""
        if all(isinstance(d, int) for d in shape):
            return None
        out = []
        for d in shape:
            d = self.size_value(d)
            out.append(self.sym_code(d.expr) if isinstance(d, _Sym) else [0, int(d)])
        return out

    # --- values ---------------------------------------------------------------------------------
    def schema(self, op: str) -> dict:
        if op not in self._schemas:
            self._schemas[op] = _kiln.op_schema(op)
        return self._schemas[op]

    def const(self, t: torch.Tensor, name: str | None = None) -> _V:
        """The graph value of a known constant tensor (added on first use, once per tensor object)."""
        key = id(t)
        if key in self._const_ids:
            vid, _ = self._const_ids[key]
        else:
            orig = t
            if t.dtype == torch.float64 and t.dim() == 0 and not self._float64_node():
                # a 0-d float64 (a Python float lifted by torch.export) next to float32 tensors: store
                # it as float32 so the float32 kernels read one dtype (0-d tensors do not promote).
                t = t.to(torch.float32)
            name = name or self._names.get(key)
            dt = kiln_dtype(t.dtype, f"constant '{name or 'tensor'}'")
            self.num_const += 1
            vid = self.g.add_constant(name or f"const{self.num_const}", dt, list(t.shape), _tensor_bytes(t))
            self._const_ids[key] = (vid, orig)  # keeps `orig` alive: its id() stays unique
        return _V(vid, t.dtype, tuple(t.shape))

    def _float64_node(self) -> bool:
        """True when the FX node being converted has a float64 tensor output (float64 computations
        keep their 0-d float64 constants exact)."""
        out = _meta_val(self.node) if self.node is not None else None
        outs = out if isinstance(out, (list, tuple)) else [out]
        return any(isinstance(o, torch.Tensor) and o.dtype == torch.float64 for o in outs)

    def tensor(self, v, scalar_dtype: torch.dtype | None = None) -> _V:
        """A tensor argument as a graph value: a value, a known constant, or a Python number (-> 0-d)."""
        if isinstance(v, _V):
            return v
        if isinstance(v, torch.Tensor):
            if v.dim() == 0 and scalar_dtype is not None and v.dtype != scalar_dtype and \
                    v.dtype.is_floating_point == scalar_dtype.is_floating_point and v.dtype != torch.bool:
                v = v.to(scalar_dtype)  # 0-d tensors do not promote within a category (PyTorch rules)
            return self.const(v)
        if _is_number(v):
            dt = scalar_dtype or (torch.bool if isinstance(v, bool) else torch.int64 if isinstance(v, int)
                                  else torch.float32)
            return self.const(torch.tensor(v, dtype=dt))
        if isinstance(v, _FirstOnly):
            return self.tensor(v.value)
        if isinstance(v, _Sym):  # a symbolic size used as a number: a 0-d tensor computed at run time
            dt = scalar_dtype if scalar_dtype is not None and not scalar_dtype.is_floating_point else torch.int64
            return self.emit("aten.scalar_tensor", [], {"s": v, "dtype": kiln_dtype(dt, "size")})
        raise self.error(f"expected a tensor argument, got {type(v).__name__} {v!r}")

    def scalar_dtype(self, values: Iterable) -> torch.dtype | None:
        """dtype for Python-number operands: the result's dtype, or for bool results (comparisons)
        the dtype of the tensor operands (float32 when an integer tensor meets a float number)."""
        out = _meta_val(self.node)
        if isinstance(out, torch.Tensor) and out.dtype != torch.bool:
            return out.dtype
        refs = [v.dtype for v in values if isinstance(v, (_V, torch.Tensor)) and not (
            isinstance(v, torch.Tensor) and v.dim() == 0)]
        ref = next((d for d in refs if d != torch.bool), refs[0] if refs else None)
        nums = [v for v in values if _is_number(v)]
        if ref is None:
            return None
        if any(isinstance(n, float) for n in nums) and not ref.is_floating_point:
            return torch.float32
        return ref

    def emit(self, op: str, inputs: Sequence, attrs: Mapping | None = None) -> _V:
        """Adds one Kiln node (inputs: values or None); returns its single output value."""
        return self.emit_all(op, inputs, attrs)[0]

    def emit_all(self, op: str, inputs: Sequence, attrs: Mapping | None = None) -> list:
        """Adds one Kiln node (inputs: values or None); returns all its output values (two for
        aten.max / aten.min / aten.sort / aten.topk: values and int64 indices)."""
        if op not in self._kiln_ops:
            raise self.unsupported(f"needs Kiln op {op}, which this build of Kiln does not have")
        ids = [-1 if x is None else self.tensor(x).id for x in inputs]
        # debug_name: the module path; for calls in the top-level forward, the FX node's name
        # (delegation reports and require_delegation list nodes by it).
        dn = self.path or (self.node.name if self.node is not None else "")
        attrs, sym_attrs = self._split_sym_attrs(dict(attrs or {}))
        try:
            if self.symbols:
                try:
                    outs = self.g.add_node_sym(op, ids, attrs, dn, sym_attrs)
                except KilnError as e:
                    # Kiln could not derive an output's size expressions from the inputs: take the
                    # ones torch.export traced for this node (checked by Kiln at every binding).
                    traced = self._traced_exprs()
                    if "cannot derive" not in str(e.args[0]) or traced is None:
                        raise
                    outs = self.g.add_node_sym(op, ids, attrs, dn, sym_attrs, traced)
            else:
                outs = self.g.add_node(op, ids, attrs, dn)
        except KilnError as e:
            code = e.args[1] if len(e.args) > 1 else None
            reason = str(e.args[0]) if e.args else str(e)
            if dn and reason.endswith(f" (at {dn})"):  # the module path is added below
                reason = reason[: -len(f" (at {dn})")]
            todo = ("Kiln does not support this configuration yet; change it, exclude it from the exported "
                    f"module, or open an issue (op set: {OP_SET_DOC})") if code == "NotSupported" else \
                "Check the op's arguments against " + OP_SET_DOC
            raise self.error(f"Kiln refused {op}: {reason}", todo, code=code, reason=reason) from None
        vs = []
        for o in outs:
            vt = self.g.value_type(o)
            vs.append(_V(o, _KILN_TO_TORCH[vt["dtype"]], tuple(vt["sizes"])))
        return vs

    def _split_sym_attrs(self, attrs: dict):
        """Attributes with _Sym values (or list elements) -> (attrs with 0 in their place,
        [(name, index or -1, tokens)])."""
        sym = []
        for k, v in list(attrs.items()):
            if isinstance(v, _Sym):
                sym.append((k, -1, self.sym_code(v.expr)))
                attrs[k] = 0
            elif isinstance(v, (list, tuple)) and any(isinstance(x, _Sym) for x in v):
                lst = []
                for i, x in enumerate(v):
                    if isinstance(x, _Sym):
                        sym.append((k, i, self.sym_code(x.expr)))
                        lst.append(0)
                    else:
                        lst.append(x)
                attrs[k] = lst
        return attrs, sym

    def _traced_exprs(self):
        """The size expressions torch.export traced for the current node's tensor outputs, or None."""
        val = _meta_val(self.node) if self.node is not None else None
        vals = val if isinstance(val, (list, tuple)) else [val]
        if not vals or not all(isinstance(t, torch.Tensor) for t in vals):
            return None
        return [self.sym_exprs(t.shape) or [[0, int(d)] for d in t.shape] for t in vals]

    def check_meta(self, v: _V):
        """The Kiln value must have the dtype and shape PyTorch traced (guards against silent mismatches);
        with symbolic sizes, the same size expressions too (compared at sample values of the symbols)."""
        val = _meta_val(self.node)
        if isinstance(val, torch.Tensor) and isinstance(v, _V):
            if not _same_shape(val.shape, v.shape) or val.dtype != v.dtype:
                raise self.error(f"Kiln inferred {v.dtype} {list(v.shape)} but PyTorch traced {val.dtype} "
                                 f"{list(val.shape)}", "This is a bug in Kiln's capture: please open an issue")
            self.check_symbolic(v, val)
        return v

    def check_symbolic(self, v: _V, traced: torch.Tensor):
        """Kiln's size expressions of `v` must equal the traced ones at sample values of the symbols
        (each at its min, max and midpoint): a handler that computed a size from the upper bound (or
        the example) instead of the symbol would otherwise give a fixed, wrong size at run time."""
        if not self.symbols:
            return
        want = self.sym_exprs(traced.shape)
        pre = getattr(self, "_traced", None)
        if pre is not None:  # read before the mapping ran (see call())
            vals = _meta_val(self.node)
            vals = vals if isinstance(vals, (list, tuple)) else [vals]
            for i, t in enumerate(vals):
                if t is traced and i < len(pre):
                    want = pre[i]
        have = self.g.value_exprs(v.id)
        if want is None and not have:
            return
        ranges = self.g_symbol_ranges()
        samples = [[lo for lo, _ in ranges], [hi for _, hi in ranges], [(lo + hi) // 2 for lo, hi in ranges]]
        for b in samples:
            w = [_eval_code(c, b) for c in want] if want is not None else [int(d) for d in traced.shape]
            h = [_eval_code(c, b) for c in have] if have else list(v.shape)
            if w != h:
                names = ", ".join(f"{n}={x}" for n, x in zip(self.symbol_names_in_order(), b))
                raise self.error(f"Kiln's sizes {h} differ from the traced sizes {w} at {names}: this op's mapping "
                                 "does not carry symbolic sizes",
                                 "Export without dynamic_shapes for this part, or open an issue naming the op")

    def g_symbol_ranges(self) -> list:
        out = [None] * len(self.symbols)
        for sym, idx in self.symbols.items():
            vr = self.ep.range_constraints[sym]
            out[idx] = (int(vr.lower), int(vr.upper))
        return out

    def symbol_names_in_order(self) -> list:
        out = [None] * len(self.symbols)
        for sym, idx in self.symbols.items():
            out[idx] = self.symbol_names.get(str(sym), str(sym))
        return out

    def check_meta_first(self, v: _V):
        """check_meta for ops whose ATen form returns several tensors (Kiln keeps the first)."""
        val = _meta_val(self.node)
        if isinstance(val, (list, tuple)) and val and isinstance(val[0], torch.Tensor):
            if not _same_shape(val[0].shape, v.shape) or val[0].dtype != v.dtype:
                raise self.error(f"Kiln inferred {v.dtype} {list(v.shape)} but PyTorch traced {val[0].dtype} "
                                 f"{list(val[0].shape)}", "This is a bug in Kiln's capture: please open an issue")
            self.check_symbolic(v, val[0])

    # --- generic mapping ------------------------------------------------------------------------
    def bind(self, target, args, kwargs) -> dict:
        """ATen schema argument name -> value (defaults filled)."""
        out = {}
        for i, a in enumerate(target._schema.arguments):
            if i < len(args) and not a.kwarg_only:
                out[a.name] = args[i]
            elif a.name in kwargs:
                out[a.name] = kwargs[a.name]
            elif a.has_default_value():
                out[a.name] = a.default_value
            else:
                out[a.name] = None
        return out

    def generic(self, kiln_op: str, args, kwargs, *, extra: Mapping | None = None, multi: bool = False):
        """Maps an ATen call onto `kiln_op` by argument names: Kiln's tensor inputs positionally,
        Kiln's attributes by name; any other ATen argument must be ignorable or at its default.
        multi: the Kiln op has several outputs; returns their list (each checked against the trace)."""
        target = self.node.target
        bound = self.bind(target, args, kwargs)
        ks = self.schema(kiln_op)
        in_names = [n for n, _ in ks["inputs"]]
        attr_names = set(ks["attrs"])
        defaults = {a.name: (a.default_value if a.has_default_value() else None) for a in target._schema.arguments}
        attrs = dict(extra or {})
        cast_to = None
        for name, v in bound.items():
            if name in in_names or name in attrs:
                continue
            if name in attr_names:
                attrs[name] = _attr(v)
            elif name == "dtype" and v is not None:
                cast_to = v  # reductions' dtype=: the input is cast first (ATen semantics)
            elif isinstance(v, (_V, _FirstOnly, torch.Tensor)):
                raise self.unsupported(f"tensor argument {name} is not supported by Kiln's {kiln_op}")
            elif name in _IGNORED_ARGS or v is None or _same(v, defaults.get(name)):
                continue
            else:
                raise self.unsupported(f"argument {name}={v!r} is not supported by Kiln's {kiln_op}")
        if ks.get("variadic") or (len(in_names) == 1 and isinstance(bound.get(in_names[0]), (list, tuple))):
            seq = list(bound[in_names[0]])
            sd = self.scalar_dtype(seq)
            inputs = [self.tensor(x, sd) for x in seq]
        else:
            vals = [bound.get(n) for n in in_names]
            sd = self.scalar_dtype(vals)
            inputs = [None if x is None else self.tensor(x, sd) for x in vals]
        if cast_to is not None and inputs and inputs[0] is not None and inputs[0].dtype != cast_to:
            inputs[0] = self.emit("aten._to_copy", [inputs[0]], {"dtype": kiln_dtype(cast_to, "the dtype= argument")})
        if multi:
            vs = self.emit_all(kiln_op, inputs, attrs)
            self.check_meta_all(vs)
            return vs
        v = self.emit(kiln_op, inputs, attrs)
        return v

    def check_meta_all(self, vs: list):
        """check_meta for a multi-output Kiln op: output i against the traced output i."""
        val = _meta_val(self.node)
        if not isinstance(val, (list, tuple)) or len(val) != len(vs):
            raise self.error(f"Kiln's op has {len(vs)} outputs but PyTorch traced {type(val).__name__}",
                             "This is a bug in Kiln's capture: please open an issue")
        for t, v in zip(val, vs):
            if isinstance(t, torch.Tensor) and (not _same_shape(t.shape, v.shape) or t.dtype != v.dtype):
                raise self.error(f"Kiln inferred {v.dtype} {list(v.shape)} but PyTorch traced {t.dtype} "
                                 f"{list(t.shape)}", "This is a bug in Kiln's capture: please open an issue")
            if isinstance(t, torch.Tensor):
                self.check_symbolic(v, t)

    # --- the walk -------------------------------------------------------------------------------
    def run(self) -> tuple:
        """Builds the graph; returns (kiln.Graph, user input names). Raises ExportError (unless
        collect_errors: then failing outputs are left out and recorded in output_errors)."""
        sig = self.ep.graph_signature
        kinds = {}
        for spec in sig.input_specs:
            kinds[spec.arg.name if hasattr(spec.arg, "name") else None] = spec
        nodes = list(self.ep.graph.nodes)
        calls = sum(1 for n in nodes if n.op == "call_function")
        step = calls >= 500  # big graphs: a node counter line every 2 s
        self.done, self.last_report = 0, time.perf_counter()
        input_names = []
        for n in nodes:
            self.node = n
            self.path = _module_path(n, self.strip) if n.op == "call_function" else ""
            try:
                self.visit(n, kinds, sig, input_names, calls, step)
            except ExportError as e:
                if not self.collect_errors or n.op == "output":
                    raise
                self.env[n] = _Failed(e)
        return self.g, input_names

    def visit(self, n, kinds, sig, input_names, calls, step):
        """Adds what one FX node means to the graph (placeholder, call or output)."""
        from torch.export.graph_signature import InputKind, OutputKind
        if n.op == "placeholder":
            spec = kinds.get(n.name)
            kind = spec.kind if spec is not None else InputKind.USER_INPUT
            if kind == InputKind.USER_INPUT:
                self.user_inputs += 1
                val = _meta_val(n)
                if isinstance(val, torch.Tensor):
                    exprs = self.sym_exprs(val.shape)
                    dt = kiln_dtype(val.dtype, f"input '{n.name}'")
                    if exprs is None:
                        vid = self.g.add_input(n.name, dt, list(val.shape))
                    else:
                        try:
                            vid = self.g.add_input_sym(n.name, dt, [0] * len(exprs), exprs)
                        except KilnError as e:
                            raise self.error(f"input '{n.name}': {e.args[0]}") from None
                    vt = self.g.value_type(vid)
                    self.env[n] = _V(vid, val.dtype, tuple(vt["sizes"]))
                    input_names.append(n.name)
                    self.input_index.append(self.user_inputs - 1)
                else:
                    self.env[n] = val  # a specialized non-tensor input (int, float, None)
            elif kind == InputKind.BUFFER and spec.target in self.state_buffers:
                sd, consts = self.ep.state_dict, self.ep.constants
                t = (sd[spec.target] if spec.target in sd else consts[spec.target]).detach().contiguous()
                dt = kiln_dtype(t.dtype, f"state '{spec.target}'")
                initial = None if not bool(t.any()) else _tensor_bytes(t)
                state_name = spec.target
                if self.strip and state_name.startswith(self.strip + "."):  # kiln_inner.c -> c (module.<method>)
                    state_name = state_name[len(self.strip) + 1:]
                try:
                    vid = self.g.add_state(state_name, dt, list(t.shape), initial)
                except KilnError as e:
                    raise self.error(f"state '{spec.target}': {e.args[0]}") from None
                self.env[n] = self.state_ids[spec.target] = _V(vid, t.dtype, tuple(t.shape))
            elif kind in (InputKind.PARAMETER, InputKind.BUFFER):
                sd, consts = self.ep.state_dict, self.ep.constants
                t = sd[spec.target] if spec.target in sd else consts[spec.target]
                self.env[n] = t.detach()
                self._names[id(self.env[n])] = spec.target
                self._buffer_values[spec.target] = self.env[n]
            elif kind == InputKind.TOKEN:
                self.env[n] = None  # effect tokens order side effects (checks); Kiln has none
            elif kind == InputKind.CONSTANT_TENSOR:
                self.env[n] = self.ep.constants[spec.target].detach()
                self._names[id(self.env[n])] = spec.target
            else:
                raise self.error(f"input '{n.name}' of kind {kind.name} is not supported",
                                 "Kiln exports tensor inputs, parameters, buffers and constants")
        elif n.op == "call_function":
            self.env[n] = self.call(n)
            self.done += 1
            if step and self.progress and time.perf_counter() - self.last_report >= 2.0:
                self.last_report = time.perf_counter()
                self.progress(f"[kiln]   nodes {self.done}/{calls}")
        elif n.op == "output":
            outs = []
            new_states = set()  # buffers forward updates that were read as constants: restart
            flat = list(n.args[0]) if isinstance(n.args[0], (list, tuple)) else [n.args[0]]
            user_index = -1
            n_user = sum(1 for spec in sig.output_specs if spec.kind == OutputKind.USER_OUTPUT)
            names = output_names(getattr(getattr(self.ep, "call_spec", None), "out_spec", None), n_user)
            for spec, a in zip(sig.output_specs, flat):
                if spec.kind == OutputKind.USER_OUTPUT:
                    user_index += 1
                    v = self.env.get(a) if isinstance(a, torch.fx.Node) else a
                    try:
                        outs.append(self.output_value(v, names[user_index]).id)
                        self.output_index.append(user_index)
                    except ExportError as e:
                        if not self.collect_errors:
                            raise
                        self.output_errors[user_index] = e
                elif spec.kind == OutputKind.BUFFER_MUTATION:
                    v = self.env.get(a) if isinstance(a, torch.fx.Node) else a
                    if v is self._buffer_values.get(spec.target, ()):
                        continue  # written back unchanged (inference batch norm's running stats)
                    if spec.target not in self.state_ids:
                        new_states.add(spec.target)
                        continue
                    state = self.state_ids[spec.target]
                    if v is state:
                        continue
                    try:
                        self.g.set_state_update(state.id, self.output_value(v, spec.target).id)
                    except KilnError as e:
                        raise self.error(f"state '{spec.target}': {e.args[0]}") from None
                elif spec.kind == OutputKind.TOKEN:
                    continue
                elif spec.kind == OutputKind.USER_INPUT_MUTATION:
                    self.notes.append(f"the model mutates input '{spec.target}' in place; the Kiln "
                                      "program does not write its inputs back")
                else:
                    raise self.error(f"output kind {spec.kind.name} is not supported")
            if new_states:
                raise _NeedState(new_states)
            self.node = None
            self.path = ""
            self.g.set_outputs(outs, [names[i] for i in self.output_index])
        else:
            raise self.error(f"graph node kind '{n.op}' is not supported")

    def output_value(self, v, name: str) -> _V:
        if isinstance(v, _Failed):
            raise v.err
        if isinstance(v, _FirstOnly):
            v = v.value
        if isinstance(v, torch.Tensor):
            v = self.const(v)
        if not isinstance(v, _V):
            raise self.error(f"output '{name}' is {type(v).__name__} {v!r}, not a tensor",
                             "Kiln methods return tensors only")
        return v

    def resolve(self, x):
        return _tree_map(lambda a: self.env[a] if isinstance(a, torch.fx.Node) else a, x)

    def call(self, n):
        self._traced = None  # set below, before a mapping runs (check_symbolic)
        target = n.target
        args = self.resolve(n.args)
        kwargs = self.resolve(dict(n.kwargs))
        name = _op_name(target)
        packet = _packet_name(target)
        failed = []
        _tree_any(lambda a: isinstance(a, _Failed) and not failed.append(a), (args, kwargs))
        if failed:
            return failed[0]
        val = _meta_val(n)
        if isinstance(val, torch.SymInt):  # a size (sym_size, size arithmetic): fixed or symbolic
            return self.size_value(val)
        if isinstance(val, torch.SymBool) and (packet.startswith(_ASSERTS) or not isinstance(target, torch._ops.OpOverload)):
            return None  # a guard on sizes (checked by the runtime's symbol ranges)
        if target is operator.getitem:
            src, idx = args
            if isinstance(src, _LegitOutputs):
                return src.item(self, idx)
            if isinstance(src, _FirstOnly):
                if idx != 0:
                    raise self.error(f"output {idx} of {src.op} is used; Kiln's op has only output 0",
                                     f"Use only the first output of {src.op} in inference models")
                return src.value
            return src[idx]
        if target is getattr(torch.ops.higher_order, "with_effects", None):
            # with_effects(token, op, *args): a side-effecting call (error checks, prints)
            inner = args[1]
            inner_name = _packet_name(inner)
            if inner_name.startswith(_ASSERTS) or inner_name in _CHECKS:
                return (None, None)
            raise self.unsupported(f"side-effecting op {_op_name(inner)} is not supported")
        if not isinstance(target, torch._ops.OpOverload):
            # Python-level arithmetic on sizes (operator.mul, math.ceil, sym ops): static values.
            val = _meta_val(n)
            if isinstance(val, (int, float, bool)) or val is None:
                if val is None and not _tree_any(lambda a: isinstance(a, _V), args):
                    try:
                        return target(*args, **kwargs)
                    except Exception:
                        pass
                if val is not None:
                    return val
            elif isinstance(val, (torch.SymInt, torch.SymBool, torch.SymFloat)) and \
                    not _tree_any(lambda a: isinstance(a, (_V, torch.SymInt, torch.SymBool, torch.SymFloat)), args):
                # a data-dependent size whose value Kiln knows (e.g. len(x[const_mask]) checks)
                try:
                    return target(*args, **kwargs)
                except Exception:  # noqa: BLE001 -- reported below as unsupported
                    pass
            raise self.unsupported(f"Python call {name} is not supported")
        if packet.startswith(_ASSERTS):
            return None
        if name in _DROPPED:
            return args[0]
        if packet in _RANDOM or any(a.name == "generator" for a in target._schema.arguments):
            raise self.error("random number generation inside the model is not supported",
                             "Kiln programs are deterministic: pass random tensors as inputs")
        handler = _HANDLERS.get(name) or _HANDLERS.get(packet)
        val = _meta_val(n)
        if (packet in _EMPTY or packet in _SHAPE_ONLY) and isinstance(val, torch.Tensor) and \
                self.sym_exprs(val.shape) is not None:
            return self.check_meta(self._symbolic_fill(packet, target, args, kwargs, val))
        if packet in _EMPTY:
            return torch.zeros(tuple(val.shape), dtype=val.dtype)
        has_value = _tree_any(lambda a: isinstance(a, (_V, _FirstOnly, _Sym)), (args, kwargs))
        if not has_value and (packet not in _NO_EAGER_FOLD or self.small_result(n)):
            return self.eager(target, args, kwargs)
        if packet in _SHAPE_ONLY:
            return self.eager(target, self.placeholders(args), self.placeholders(kwargs))
        # The traced size expressions, read before the mapping runs: a mapping that calls int() on a
        # symbolic size makes torch specialize the symbol (the later meta then looks fixed).
        self._traced = None
        if self.symbols:
            vals = val if isinstance(val, (list, tuple)) else [val]
            self._traced = [self.sym_exprs(t.shape) if isinstance(t, torch.Tensor) else None for t in vals]
        if handler is not None:
            v = handler(self, args, kwargs)
        elif "aten." + packet.split(".", 1)[-1] in self._kiln_ops and packet.startswith("aten."):
            v = self.generic(packet, args, kwargs)
        else:
            raise self.unsupported()
        if isinstance(v, _V):
            self.check_meta(v)
        return v

    def _symbolic_fill(self, packet, target, args, kwargs, val) -> _V:
        """zeros_like / ones_like / full_like / empty* / new_* whose traced shape is symbolic: an
        aten.full of the traced (symbolic) sizes, computed at run time (empty: zeros, as for fixed
        shapes). Evaluating them at export time would fix the upper-bound shape."""
        bound = self.bind(target, args, kwargs)
        if packet in _EMPTY or packet.endswith("zeros") or packet.endswith("zeros_like"):
            value = 0
        elif packet.endswith("ones") or packet.endswith("ones_like"):
            value = 1
        else:
            value = bound.get("fill_value", bound.get("s"))
        if not _is_number(value):
            raise self.unsupported(f"a fill value {value!r} that is not a number, with a symbolic shape")
        size = [self.size_value(d) for d in val.shape]
        v = self.emit("aten.full", [], {"size": size, "fill_value": value, "dtype": kiln_dtype(val.dtype, "fill")})
        return v

    @staticmethod
    def small_result(n) -> bool:
        val = _meta_val(n)
        return isinstance(val, torch.Tensor) and val.numel() <= _SMALL_FOLD

    def placeholders(self, x):
        return _tree_map(lambda a: torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, _V) else a, x)

    def eager(self, target, args, kwargs):
        """Evaluates a call on known constants with PyTorch now (constants created in forward)."""
        # Graph values are contiguous (Kiln's values are); PyTorch's view ops need that too.
        args, kwargs = _tree_map(lambda t: t.contiguous() if isinstance(t, torch.Tensor) else t, (args, kwargs))
        try:
            with torch.no_grad():
                out = target(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 -- report whatever PyTorch said
            raise self.error(f"evaluating it on constants at export time failed: {e}") from None
        return _tree_map(lambda t: t.detach().clone(memory_format=torch.contiguous_format)
                         if isinstance(t, torch.Tensor) else t, out)


# --------------------------------------------------------------------------------------------------
# special mappings (everything else goes through _Builder.generic by name)

def _first_checked(kiln_op, extra=None):
    def h(b: _Builder, args, kwargs):
        v = b.generic(kiln_op, args, kwargs, extra=extra)
        b.check_meta_first(v)
        return _FirstOnly(v, _op_name(b.node.target))
    return h


def _layer_norm(b: _Builder, args, kwargs):
    # layer_norm(input, normalized_shape, weight?, bias?, eps, cudnn_enable) -> native_layer_norm
    return b.generic("aten.native_layer_norm", args, kwargs)


def _group_norm(b: _Builder, args, kwargs):
    # group_norm(input, num_groups, weight?, bias?, eps, cudnn_enabled) -> native_group_norm(N, C, HxW, group)
    bound = b.bind(b.node.target, args, kwargs)
    x = b.tensor(bound["input"])
    if len(x.shape) < 2:
        raise b.error(f"group_norm of a {len(x.shape)}-d input")
    hxw = math.prod(x.shape[2:])
    return b.emit("aten.native_group_norm", [x, bound["weight"], bound["bias"]],
                  {"N": x.shape[0], "C": x.shape[1], "HxW": hxw, "group": bound["num_groups"], "eps": bound["eps"]})


def _upsample_vec(kiln_op):
    def h(b: _Builder, args, kwargs):
        # upsample_*.vec(input, output_size?, [align_corners,] scale_factors?) -> .default overload:
        # output_size from the traced shape; scales_h/w = scale_factors (PyTorch UpSample.h passes
        # them to the kernel, which uses 1/scale for the source index when given).
        bound = b.bind(b.node.target, args, kwargs)
        x = b.tensor(bound["input"])
        out = _meta_val(b.node)
        attrs = {"output_size": [int(s) for s in out.shape[-2:]]}
        sf = bound.get("scale_factors")
        attrs["scales_h"], attrs["scales_w"] = (float(sf[0]), float(sf[1])) if sf else (None, None)
        if "align_corners" in bound:
            attrs["align_corners"] = bool(bound["align_corners"])
        return b.emit(kiln_op, [x], attrs)
    return h


def _upsample_1d(kiln_op):
    def h(b: _Builder, args, kwargs):
        # upsample_{nearest,linear}1d on [N, C, L] = the 2-D op on [N, C, 1, L] (height 1 -> 1 is the
        # identity for both, per-dimension index maps as in PyTorch UpSample.h), then squeeze.
        bound = b.bind(b.node.target, args, kwargs)
        x = b.tensor(bound["input"] if "input" in bound else bound["self"])
        out = _meta_val(b.node)
        sf = bound.get("scale_factors")
        scale = float(sf[0]) if sf else bound.get("scales")
        attrs = {"output_size": [1, int(out.shape[-1])], "scales_h": None, "scales_w": scale}
        if "align_corners" in bound:
            attrs["align_corners"] = bool(bound["align_corners"])
        y = b.emit(kiln_op, [b.emit("aten.unsqueeze", [x], {"dim": 2})], attrs)
        return b.emit("aten.squeeze", [y], {"dim": [2]})
    return h


def _view(b: _Builder, args, kwargs):
    x = b.tensor(args[0])
    size = args[1] if len(args) > 1 else kwargs.get("size", kwargs.get("shape"))
    return b.emit("aten.view", [x], {"size": _attr(list(size))})


def _flatten(b: _Builder, args, kwargs):
    x = b.tensor(args[0])
    out = _meta_val(b.node)
    return b.emit("aten.view", [x], {"size": [b.size_value(s) for s in out.shape]})


def _t(b: _Builder, args, kwargs):
    x = b.tensor(args[0])
    if len(x.shape) < 2:
        return x
    return b.emit("aten.permute", [x], {"dims": [1, 0]})


def _squeeze(b: _Builder, args, kwargs):
    x = b.tensor(args[0])
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if dim is not None and not isinstance(dim, (list, tuple)):
        dim = [dim]
    return b.emit("aten.squeeze", [x], {"dim": None if dim is None else list(dim)})


def _is_scalar_bound(v) -> bool:
    return v is None or _is_number(v) or (isinstance(v, torch.Tensor) and v.numel() == 1 and v.dim() == 0)


def _clamp_any(b: _Builder, x, lo, hi):
    """clamp(x, lo, hi) = min(max(x, lo), hi) (ATen). Number bounds on a floating x -> aten.clamp
    attributes; tensor bounds or an integer x -> aten.minimum(aten.maximum(x, lo), hi) (number bounds
    as 0-d constants, so PyTorch's type promotion applies), which propagate NaN from x or a bound as
    ATen's clamp does."""
    xv = b.tensor(x)
    if _is_scalar_bound(lo) and _is_scalar_bound(hi) and xv.dtype.is_floating_point:
        num = lambda v: None if v is None else (v.item() if isinstance(v, torch.Tensor) else v)
        return b.emit("aten.clamp", [xv], {"min": num(lo), "max": num(hi)})
    # integer tensors (aten.clamp's kernels are floating only) and tensor bounds: maximum/minimum
    sd = b.scalar_dtype([x, lo, hi])
    r = b.tensor(x)
    for bound, op in ((lo, "aten.maximum"), (hi, "aten.minimum")):
        if bound is not None:
            r = b.emit(op, [r, b.tensor(bound, sd)])
    return r


def _mul(b: _Builder, args, kwargs):
    # a * b on two bool operands is their logical and (bool result, as ATen's mul on bools)
    xs = args[:2]
    if all(isinstance(a, bool) or (isinstance(a, (_V, torch.Tensor)) and a.dtype == torch.bool) for a in xs):
        return b.emit("aten.logical_and", [b.tensor(a, torch.bool) for a in xs])
    return b.generic("aten.mul", args, kwargs)


def _as_strided(b: _Builder, args, kwargs):
    # as_strided indexes its input's storage; Kiln's values are contiguous copies, so the op is exact
    # only when the traced input is its storage's whole, contiguous, offset-0 view (a view of a
    # slice, select or transpose would read other elements in PyTorch)
    src = b.node.args[0]
    t = src.meta.get("val") if hasattr(src, "meta") else None
    try:
        whole = isinstance(t, torch.Tensor) and t.is_contiguous() and t.storage_offset() == 0 and \
            t.untyped_storage().nbytes() == t.numel() * t.element_size()
    except Exception:  # noqa: BLE001 -- storage not inspectable: refuse below
        whole = False
    if not whole:
        raise b.unsupported("as_strided of a view (a slice, select, transpose or other tensor that is not its "
                            "storage's whole contiguous buffer) is not supported: PyTorch reads the storage under "
                            "the view. Call .contiguous() (or .clone()) on the input first")
    return b.generic("aten.as_strided", args, kwargs)


def _clamp(b: _Builder, args, kwargs):
    bound = b.bind(b.node.target, args, kwargs)
    return _clamp_any(b, bound["self"], bound["min"], bound["max"])


def _clamp_min(b: _Builder, args, kwargs):
    bound = b.bind(b.node.target, args, kwargs)
    return _clamp_any(b, bound["self"], bound["min"], None)


def _clamp_max(b: _Builder, args, kwargs):
    bound = b.bind(b.node.target, args, kwargs)
    return _clamp_any(b, bound["self"], None, bound["max"])


def _rsub(b: _Builder, args, kwargs):
    # rsub(self, other, alpha) = other - alpha * self
    bound = b.bind(b.node.target, args, kwargs)
    sd = b.scalar_dtype([bound["self"], bound["other"]])
    return b.emit("aten.sub", [b.tensor(bound["other"], sd), b.tensor(bound["self"], sd)], {"alpha": bound["alpha"]})


def _to_copy(b: _Builder, args, kwargs):
    bound = b.bind(b.node.target, args, kwargs)
    x = b.tensor(bound["self"])
    dt = bound.get("dtype")
    if dt is None or dt == x.dtype:
        return x
    return b.emit("aten._to_copy", [x], {"dtype": kiln_dtype(dt, "the conversion's target")})


def _copy(b: _Builder, args, kwargs):
    # copy(self, src, non_blocking): src's values, broadcast to self's shape, in self's dtype. A
    # constant self (a buffer written by copy_) contributes only its type: expand + _to_copy then,
    # so that its bytes are not stored in the program.
    if isinstance(args[0], (_V, _FirstOnly)):
        return b.emit("aten.copy", [b.tensor(args[0]), b.tensor(args[1])])
    out = _meta_val(b.node)
    src = b.tensor(args[1])
    if src.shape != tuple(out.shape):
        src = b.emit("aten.expand", [src], {"size": [int(s) for s in out.shape]})
    if src.dtype != out.dtype:
        src = b.emit("aten._to_copy", [src], {"dtype": kiln_dtype(out.dtype)})
    return src


def _dropout(b: _Builder, args, kwargs):
    bound = b.bind(b.node.target, args, kwargs)
    if bound.get("train") and bound.get("p", 0) != 0:
        raise b.error("dropout in training mode", "Export the module in eval mode (module.eval())")
    x = b.tensor(bound["input"])
    if _op_name(b.node.target).startswith("aten.native_dropout"):
        return _FirstOnly(x, _op_name(b.node.target))
    return x


def _slice_piece(b: _Builder, x: _V, dim: int, start: int, end: int):
    return b.emit("aten.slice", [x], {"dim": dim, "start": start, "end": end, "step": 1})


def _scatter_like(kiln_op: str, src_name: str):
    # select_scatter / slice_scatter: src is copied into self, so PyTorch converts
    # it to self's dtype (Tensor.copy_); the Kiln ops take src in self's dtype.
    def h(b: _Builder, args, kwargs):
        bound = b.bind(b.node.target, args, kwargs)
        x, src = b.tensor(bound["self"]), b.tensor(bound[src_name])
        if src.dtype != x.dtype:
            src = b.emit("aten._to_copy", [src], {"dtype": kiln_dtype(x.dtype)})
        bound[src_name] = src
        return b.generic(kiln_op, [], bound)
    return h


def _split(b: _Builder, args, kwargs):
    # split.Tensor(self, split_size, dim) / split_with_sizes(self, split_sizes, dim) -> slices
    bound = b.bind(b.node.target, args, kwargs)
    x = b.tensor(bound["self"])
    dim = bound["dim"] % len(x.shape)
    outs = _meta_val(b.node)
    res, start = [], 0
    for o in outs:
        n = int(o.shape[dim])
        res.append(_slice_piece(b, x, dim, start, start + n))
        start += n
    return res


def _unbind(b: _Builder, args, kwargs):
    bound = b.bind(b.node.target, args, kwargs)
    x = b.tensor(bound["self"])
    dim = bound["dim"] % len(x.shape)
    return [b.emit("aten.select", [x], {"dim": dim, "index": i}) for i in range(x.shape[dim])]


def _sym_size(b: _Builder, args, kwargs):
    val = _meta_val(b.node)
    if isinstance(val, torch.SymInt):
        return b.size_value(val)
    x = args[0]
    shape = x.shape
    return int(shape[args[1]])


def _arange(b: _Builder, args, kwargs):
    val = _meta_val(b.node)
    return b.generic("aten.arange", args, kwargs, extra={"dtype": kiln_dtype(val.dtype, "arange")})


def _softmax_int(kiln_op):
    def h(b: _Builder, args, kwargs):
        bound = b.bind(b.node.target, args, kwargs)
        x = b.tensor(bound["self"])
        if bound.get("dtype") is not None and bound["dtype"] != x.dtype:
            x = b.emit("aten._to_copy", [x], {"dtype": kiln_dtype(bound["dtype"], "the dtype= argument")})
        return b.emit(kiln_op, [x], {"dim": bound["dim"], "half_to_float": False})
    return h


def _batch_norm_legit(b: _Builder, args, kwargs):
    # _native_batch_norm_legit(input, weight?, bias?, running_mean, running_var, training, momentum, eps):
    # with training=False it normalizes with the running statistics, as native_batch_norm does;
    # training=True (batch statistics, running-stat updates) is refused.
    bound = b.bind(b.node.target, args, kwargs)
    if bound.get("training"):
        return _batch_norm_training(b, args, kwargs)
    v = b.generic("aten.native_batch_norm", args, kwargs)
    b.check_meta_first(v)
    functional = _packet_name(b.node.target).endswith("_functional")
    stats = (bound["running_mean"], bound["running_var"]) if functional else ()
    return _LegitOutputs(v, stats, _op_name(b.node.target))


def _values_and_indices(kiln_op, names):
    # two outputs (values, int64 indices), both Kiln values: getitem picks either
    def h(b: _Builder, args, kwargs):
        bound = b.bind(b.node.target, args, kwargs)
        x = b.tensor(bound["self"])
        attrs = {k: _attr(bound[k]) for k in names if k in bound}
        return tuple(b.emit_all(kiln_op, [x], attrs))
    return h


_max_pool3d_with_indices = _values_and_indices("aten.max_pool3d_with_indices",
                                               ("kernel_size", "stride", "padding", "dilation", "ceil_mode"))


def _batch_norm_training(b: _Builder, args, kwargs):
    raise b.error("batch norm with batch statistics (training mode, or InstanceNorm without running statistics) "
                  "is not supported",
                  "Export the module in eval mode; F.batch_norm needs training=False and running statistics. "
                  "InstanceNorm{1,2,3}d(track_running_stats=False) normalizes with each sample's statistics even "
                  "in eval mode: nn.GroupNorm(C, C) computes the same and is supported")


def _roll(b: _Builder, args, kwargs):
    # roll(self, shifts, dims): per dim, cat(x[size - s:], x[:size - s]) with s = shift mod size;
    # dims=[] rolls the flattened tensor (torch.roll semantics).
    bound = b.bind(b.node.target, args, kwargs)
    x = b.tensor(bound["self"])
    shifts, dims = list(bound["shifts"]), list(bound["dims"] or [])
    shape = list(x.shape)
    if not dims:
        if len(shifts) != 1:
            raise b.error("roll without dims takes one shift")
        r = _roll(b, [b.emit("aten.view", [x], {"size": [-1]}), shifts, [0]], {})
        return b.emit("aten.view", [r], {"size": shape})
    r = x
    for shift, dim in zip(shifts, dims):
        dim %= len(shape)
        size = shape[dim]
        k = shift % size if size else 0
        if k == 0:
            continue
        r = b.emit("aten.cat", [_slice_piece(b, r, dim, size - k, size), _slice_piece(b, r, dim, 0, size - k)],
                   {"dim": dim})
    return r


def _max_min_dim(kiln_op):
    # max.dim/min.dim(self, dim, keepdim) -> Kiln's two-output aten.max / aten.min (values, indices)
    def h(b: _Builder, args, kwargs):
        return b.generic(kiln_op, args, kwargs, multi=True)
    return h


def _max_min_all(kiln_op):
    def h(b: _Builder, args, kwargs):
        return b.emit(kiln_op, [b.tensor(args[0])], {"dim": [], "keepdim": False})
    return h


def _var_dim(b: _Builder, args, kwargs):
    # var.dim(self, dim, unbiased=True, keepdim) = var.correction with correction 1 (unbiased) or 0
    bound = b.bind(b.node.target, args, kwargs)
    return b.emit("aten.var", [b.tensor(bound["self"])],
                  {"dim": bound["dim"], "correction": 1.0 if bound["unbiased"] else 0.0,
                   "keepdim": bool(bound["keepdim"])})


def _var_mean_correction(b: _Builder, args, kwargs):
    # var_mean.correction(self, dim, correction, keepdim) -> (aten.var, aten.mean)
    bound = b.bind(b.node.target, args, kwargs)
    x, dims, keep = b.tensor(bound["self"]), bound["dim"], bool(bound["keepdim"])
    mean_dims = None if dims is None or len(dims) == 0 else list(dims)
    corr = bound["correction"]
    var = b.emit("aten.var", [x], {"dim": mean_dims, "correction": None if corr is None else float(corr),
                                   "keepdim": keep})
    return [var, b.emit("aten.mean", [x], {"dim": mean_dims, "keepdim": keep})]


def _sort(b: _Builder, args, kwargs):
    # sort.default(self, dim, descending) / sort.stable(self, *, stable, dim, descending): Kiln's
    # sort is always stable (one of the orders stable=False allows)
    bound = b.bind(b.node.target, args, kwargs)
    vs = b.emit_all("aten.sort", [b.tensor(bound["self"])],
                    {"dim": bound["dim"], "descending": bool(bound["descending"]),
                     "stable": bool(bound.get("stable") or False)})
    b.check_meta_all(vs)
    return vs


def _fill(b: _Builder, args, kwargs):
    # fill.Scalar / fill.Tensor(self, value): a constant value only needs self's shape (evaluated
    # now); a computed 0-d value becomes Kiln's aten.fill.
    if isinstance(args[1], (_V, _FirstOnly)):
        return b.emit("aten.fill", [b.tensor(args[0]), b.tensor(args[1])])
    return b.eager(b.node.target, b.placeholders(args), b.placeholders(kwargs))


def _index_dims(b: _Builder, x: _V, indices, *, masks_ok: bool):
    """The non-None entries of an ATen index list and the self dim each one starts at (a bool mask
    covers mask.dim() dims, None and integer tensors one each). Constant bool masks become integer
    index tensors (mask.nonzero(), a static shape); run-time masks raise unless `masks_ok`."""
    tensors, dims, d = [], [], 0
    for t in indices:
        if isinstance(t, _FirstOnly):
            t = t.value
        if t is None:
            d += 1
            continue
        if t.dtype in (torch.bool, torch.uint8):
            if isinstance(t, torch.Tensor):  # a constant mask: its true positions are known now
                t = t.bool()
                for k, coord in enumerate(t.nonzero().unbind(1)):
                    tensors.append(coord.contiguous())
                    dims.append(d + k)
                d += t.dim()
                continue
            if not masks_ok:
                raise b.unsupported("boolean-mask indexing (a data-dependent shape) is not supported")
            tensors.append(b.tensor(t))
            dims.append(d)
            d += max(len(t.shape), 1)
            continue
        tensors.append(t)
        dims.append(d)
        d += 1
    if len(x.shape) == 0 and tensors:
        # x[idx] on a 0-d tensor: PyTorch treats it as 1-D of size 1 (and refuses other ranks)
        raise b.unsupported("indexing a 0-d tensor with an index tensor is not supported")
    return tensors, dims


def _index_grid(b: _Builder, x: _V, indices: list):
    """x[indices] for constant integer index tensors that are each a step-1 range along at most one
    axis of their broadcast shape (e.g. ``mask[arange(B)[:, None, None, None], arange(K)[None, None,
    None, :]]``, the padding-mask lookup of transformers' masking_utils, and ``weight[arange(n)]``) as
    slices, a permute, a view and an expand of x: no gather, so every backend keeps it. PyTorch's
    advanced-indexing rule places the broadcast index dims where the index tensors are when they are
    adjacent, first otherwise. Returns None (the caller falls back) when the indices are not such a
    grid, are not all constant, or are out of range (the fallback reports that)."""
    given = [i for i, t in enumerate(indices) if t is not None]
    if not given or not all(isinstance(indices[i], torch.Tensor) and indices[i].dtype in (torch.int64, torch.int32)
                            for i in given):
        return None
    rank = len(x.shape)
    if len(indices) > rank:
        return None
    try:
        S = list(torch.broadcast_shapes(*[indices[i].shape for i in given]))
    except RuntimeError:
        return None
    axis_of, starts = {}, {}
    for i in given:
        n = x.shape[i]
        t = indices[i].to(torch.int64).expand(S)
        t = torch.where(t < 0, t + n, t)
        if t.numel() == 0 or bool(((t < 0) | (t >= n)).any()):
            return None
        first = t.reshape(-1)[0]
        varying = [a for a in range(len(S)) if S[a] > 1 and not bool((t == t.narrow(a, 0, 1)).all())]
        if len(varying) > 1:
            return None
        if not varying:  # one value everywhere: a size-1 slice at it
            if not bool((t == first).all()):
                return None
            axis_of[i], starts[i] = None, int(first)
            continue
        a = varying[0]
        line = t.movedim(a, 0).reshape(S[a], -1)[:, 0]  # t along axis a (constant along the others)
        if not torch.equal(line, torch.arange(int(line[0]), int(line[0]) + S[a])) or a in axis_of.values():
            return None
        axis_of[i], starts[i] = a, int(line[0])
    r = x
    for i in given:
        size = 1 if axis_of[i] is None else S[axis_of[i]]
        if starts[i] != 0 or size != x.shape[i]:
            r = _slice_piece(b, r, i, starts[i], starts[i] + size)
    adjacent = given == list(range(given[0], given[-1] + 1))
    others = [d for d in range(rank) if d not in given]
    pre = [d for d in others if d < given[0]] if adjacent else []
    post = [d for d in others if d not in pre]
    by_axis = sorted((i for i in given if axis_of[i] is not None), key=lambda i: axis_of[i])
    unit = [i for i in given if axis_of[i] is None]
    perm = pre + by_axis + unit + post
    if perm != list(range(rank)):
        r = b.emit("aten.permute", [r], {"dims": perm})
    block = [1] * len(S)
    for i in by_axis:
        block[axis_of[i]] = S[axis_of[i]]
    view = [x.shape[d] for d in pre] + block + [x.shape[d] for d in post]
    if list(r.shape) != view:
        r = b.emit("aten.view", [r], {"size": view})
    full = [x.shape[d] for d in pre] + S + [x.shape[d] for d in post]
    if view != full:
        r = b.emit("aten.expand", [r], {"size": full})
    return r


def _index_tensor(b: _Builder, args, kwargs):
    # x[i0, None, i2, ...]: constant range grids (the transformers mask lookup) as views; otherwise
    # aten.index with the non-None index tensors and the dims they index
    x, indices = b.tensor(args[0]), list(args[1])
    grid = _index_grid(b, x, indices)
    if grid is not None:
        return grid
    tensors, dims = _index_dims(b, x, indices, masks_ok=False)
    if not tensors:
        return x
    return b.emit("aten.index", [x] + tensors, {"dims": dims})


def _index_put(b: _Builder, args, kwargs):
    # index_put(self, indices, values, accumulate): x[indices] = values (bool masks kept whole)
    bound = b.bind(b.node.target, args, kwargs)
    x = b.tensor(bound["self"])
    tensors, dims = _index_dims(b, x, list(bound["indices"]), masks_ok=True)
    values = b.tensor(bound["values"], x.dtype)
    if values.dtype != x.dtype:
        values = b.emit("aten._to_copy", [values], {"dtype": kiln_dtype(x.dtype)})
    if not tensors:  # x[...] = values: the broadcast values
        return _copy(b, [x, values], {})
    return b.emit("aten.index_put", [x, values] + tensors,
                  {"dims": dims, "accumulate": bool(bound.get("accumulate") or False)})


def _scatter_value(b: _Builder, args, kwargs):
    # scatter.value(self, dim, index, value[, reduce]): src = value expanded to index's shape
    bound = b.bind(b.node.target, args, kwargs)
    x, index = b.tensor(bound["self"]), b.tensor(bound["index"])
    src = b.const(torch.tensor(bound["value"], dtype=x.dtype))
    src = b.emit("aten.expand", [src], {"size": list(index.shape)})
    attrs = {"dim": bound["dim"]}
    if bound.get("reduce") is not None:
        attrs["reduce"] = bound["reduce"]
    return b.emit("aten.scatter", [x, index, src], attrs)


def _sum_mean(b: _Builder, args, kwargs):
    # sum/mean over dim=[] reduce every dim in ATen (like None); Kiln spells that None.
    bound = b.bind(b.node.target, args, kwargs)
    extra = {"dim": None} if "dim" in bound and bound["dim"] is not None and len(bound["dim"]) == 0 else None
    return b.generic(_packet_name(b.node.target), args, kwargs, extra=extra)


def _cumsum(b: _Builder, args, kwargs):
    # cumsum(self, dim, *, dtype=None): Kiln's dtype attribute is the Kiln dtype name.
    bound = b.bind(b.node.target, args, kwargs)
    attrs = {"dim": bound["dim"]}
    if bound.get("dtype") is not None:
        attrs["dtype"] = kiln_dtype(bound["dtype"], "the dtype= argument")
    return b.emit("aten.cumsum", [b.tensor(bound["self"])], attrs)


_HANDLERS: dict[str, Callable] = {
    "aten.sum": _sum_mean, "aten.cumsum": _cumsum, "aten.mean": _sum_mean, "aten.roll": _roll,
    "aten.max.dim": _max_min_dim("aten.max"), "aten.min.dim": _max_min_dim("aten.min"),
    "aten.max.default": _max_min_all("aten.amax"), "aten.min.default": _max_min_all("aten.amin"),
    # torch.max(a, b) / torch.min(a, b): the elementwise forms are aten.maximum / aten.minimum
    "aten.max.other": lambda b, a, k: b.generic("aten.maximum", a, k),
    "aten.min.other": lambda b, a, k: b.generic("aten.minimum", a, k),
    "aten.var.dim": _var_dim, "aten.var_mean.correction": _var_mean_correction,
    "aten.sort": _sort, "aten.topk": lambda b, a, k: b.generic("aten.topk", a, k, multi=True),
    "aten.fill": _fill, "aten.diagonal_copy": lambda b, a, k: b.generic("aten.diagonal", a, k),
    "aten.as_strided_copy": _as_strided, "aten.as_strided": _as_strided, "aten.mul": _mul,
    "aten.index.Tensor": _index_tensor,
    "aten.index_put.default": _index_put, "aten.index_put_.default": _index_put,
    "aten.scatter.value": _scatter_value, "aten.scatter.value_reduce": _scatter_value,
    "aten._embedding_bag.default": _first_checked("aten._embedding_bag"),
    "aten._embedding_bag_forward_only.default": _first_checked("aten._embedding_bag"),
    "aten.slice_scatter.default": _scatter_like("aten.slice_scatter", "src"),
    "aten.select_scatter.default": _scatter_like("aten.select_scatter", "src"),
    "aten._native_batch_norm_legit_functional": _batch_norm_legit, "aten._native_batch_norm_legit.no_stats": _batch_norm_training,
    "aten._native_batch_norm_legit.default": _batch_norm_legit,
    "aten.max_pool3d_with_indices.default": _max_pool3d_with_indices,
    "aten.adaptive_max_pool2d.default": _values_and_indices("aten.adaptive_max_pool2d", ("output_size",)),
    "aten.adaptive_max_pool3d.default": _values_and_indices("aten.adaptive_max_pool3d", ("output_size",)),
    "aten._native_batch_norm_legit_no_training.default": _first_checked("aten.native_batch_norm",
                                                                        {"training": False}),
    "aten.native_batch_norm.default": _first_checked("aten.native_batch_norm"),
    "aten.native_layer_norm.default": _first_checked("aten.native_layer_norm"),
    "aten.native_group_norm.default": _first_checked("aten.native_group_norm"),
    "aten.max_pool2d_with_indices.default": _first_checked("aten.max_pool2d"),
    "aten.layer_norm.default": _layer_norm,
    "aten.group_norm.default": _group_norm,
    "aten.upsample_nearest2d.vec": _upsample_vec("aten.upsample_nearest2d"),
    "aten.upsample_bilinear2d.vec": _upsample_vec("aten.upsample_bilinear2d"),
    "aten.upsample_nearest1d": _upsample_1d("aten.upsample_nearest2d"),
    "aten.upsample_linear1d": _upsample_1d("aten.upsample_bilinear2d"),
    "aten._adaptive_avg_pool2d.default": lambda b, a, k: b.generic("aten.adaptive_avg_pool2d", a, k),
    "aten.view.default": _view, "aten.reshape.default": _view, "aten._unsafe_view.default": _view,
    "aten.view_copy.default": _view, "aten._reshape_alias.default": _view,
    "aten.flatten.using_ints": _flatten, "aten.unflatten.int": _flatten,
    "aten.t.default": _t, "aten.t_copy.default": _t, "aten.numpy_T.default": _t,
    "aten.permute_copy.default": lambda b, a, k: b.generic("aten.permute", a, k),
    "aten.transpose_copy.int": lambda b, a, k: b.generic("aten.transpose", a, k),
    "aten.expand_copy.default": lambda b, a, k: b.generic("aten.expand", a, k),
    "aten.slice_copy.Tensor": lambda b, a, k: b.generic("aten.slice", a, k),
    "aten.select_copy.int": lambda b, a, k: b.generic("aten.select", a, k),
    "aten.unsqueeze_copy.default": lambda b, a, k: b.generic("aten.unsqueeze", a, k),
    "aten.squeeze": _squeeze, "aten.squeeze_copy": _squeeze,
    "aten.clamp": _clamp, "aten.clamp_min": _clamp_min, "aten.clamp_max": _clamp_max,
    "aten.rsub": _rsub,
    "aten._to_copy.default": _to_copy,
    "aten.copy.default": _copy,
    "aten.dropout.default": _dropout, "aten.native_dropout.default": _dropout,
    "aten.feature_dropout.default": _dropout,
    "aten.split.Tensor": _split, "aten.split_with_sizes.default": _split,
    "aten.split_copy.Tensor": _split, "aten.split_with_sizes_copy.default": _split,
    "aten.unbind.int": _unbind, "aten.unbind_copy.int": _unbind,
    "aten.sym_size.int": _sym_size,
    # arange with a symbolic end (run-time length): ATen's dtype=None means int64 for integer
    # arguments, which Kiln's op spells out (its default is float32)
    "aten.arange.start_step": _arange, "aten.arange.start": _arange, "aten.arange.default": _arange,
    # Kiln's attention over a KV cache (kiln/llm_ops.py: torch.ops.kiln.sdpa_kv_cache), same argument names
    "kiln.sdpa_kv_cache": lambda b, args, kwargs: b.generic("kiln.sdpa_kv_cache", args, kwargs),
    "kiln.check_range": lambda b, args, kwargs: b.generic("kiln.check_range", args, kwargs),
    "aten.softmax.int": _softmax_int("aten._softmax"), "aten.log_softmax.int": _softmax_int("aten._log_softmax"),
}


# --------------------------------------------------------------------------------------------------
# public API

class _MethodWrapper(torch.nn.Module):
    """Exposes module.<method> as forward for torch.export (module paths are reported without it)."""

    def __init__(self, inner: torch.nn.Module, method: str):
        super().__init__()
        self.kiln_inner = inner
        self._method = method

    def forward(self, *args, **kwargs):
        return getattr(self.kiln_inner, self._method)(*args, **kwargs)


@dataclass
class CaptureResult:
    """A captured method: the kiln.Graph plus what the capture saw (ATen node count, input names, notes)."""
    graph: Any
    input_names: list
    aten_nodes: int
    notes: list = field(default_factory=list)
    seconds: float = 0.0
    output_index: list = field(default_factory=list)
    output_errors: dict = field(default_factory=dict)
    input_index: list = field(default_factory=list)
    state_names: list = field(default_factory=list)   # buffers captured as state tensors
    buffer_names: list = field(default_factory=list)  # every buffer the method reads


def _as_tuple(example_inputs) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, list):
        return tuple(example_inputs)
    if not isinstance(example_inputs, tuple):
        raise ExportError(f"example_inputs must be a tensor or a tuple of inputs, got {type(example_inputs).__name__}")
    return example_inputs


def _symbol_names(ep, dynamic_shapes, args: tuple, target) -> dict:
    """Maps the export's size symbols (e.g. 's27') to the names of the user's torch.export.Dim
    objects ('seq'), by reading each user input's traced shape where dynamic_shapes put a Dim."""
    if not dynamic_shapes:
        return {}
    specs = dynamic_shapes
    if isinstance(specs, Mapping):
        import inspect
        params = list(inspect.signature(target.forward).parameters)
        specs = [specs.get(p) for p in params[: len(args)]]
    specs = list(specs)
    from torch.export.graph_signature import InputKind
    user = [spec.arg.name for spec in ep.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    names = {}
    for i, name in enumerate(user):
        spec = specs[i] if i < len(specs) else None
        val = _meta_val(nodes[name]) if name in nodes else None
        if not isinstance(val, torch.Tensor) or spec is None:
            continue
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec)
        for d, dim in items:
            size = val.shape[d] if d < val.dim() else None
            root = getattr(dim, "root", dim)  # a derived Dim (2 * e) names its root's symbol
            dim_name = getattr(root, "__name__", None)
            if isinstance(size, torch.SymInt) and dim_name and len(size.node.expr.free_symbols) == 1:
                names[str(next(iter(size.node.expr.free_symbols)))] = dim_name
    return names


def _distinct_inputs(args: tuple, kwargs):
    """(args, kwargs) with every repeat of a tensor object replaced by a clone. torch.export gives
    one tensor object passed as several inputs a single placeholder (the other placeholders are
    left unused), so the program would read the first input wherever the model uses the second:
    each input position must be an input of its own, whatever the example values."""
    import torch.utils._pytree as pytree
    seen: set[int] = set()

    def one(x):
        if isinstance(x, torch.Tensor):
            if id(x) in seen:
                return x.clone()
            seen.add(id(x))
        return x

    return pytree.tree_map(one, (args, kwargs))


def capture(module: torch.nn.Module, example_inputs, *, method: str = "forward", example_kwargs=None,
            strict: bool = False, progress: Callable[[str], None] | None = None,
            collect_errors: bool = False, dynamic_shapes=None, state_buffers=()) -> CaptureResult:
    """Captures `module.<method>` called on `example_inputs` (tensors with the exact shapes and
    dtypes the program will take) into a kiln.Graph. The module is put in eval mode for the capture
    (its previous mode is restored). Raises ExportError.

    collect_errors=True (for tests that batch many independent computations into one module):
    an output whose computation fails is left out of the graph and its ExportError recorded in
    CaptureResult.output_errors[user output index]; output_index lists, per graph output, the user
    output it is; input_index lists, per graph input, the (flattened) user input it is (an input
    that fails, e.g. float64, is left out). torch.export failures still raise.

    dynamic_shapes: torch.export's dynamic_shapes for the inputs, e.g. ``{"tokens": {1:
    torch.export.Dim("seq", min=1, max=512)}}``: those dims become symbols with those ranges (every
    Dim needs a max), carried through the graph as size expressions; buffers that forward updates
    (a KV cache written with index_put_ / slice assignment) become state tensors."""
    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"expected a torch.nn.Module, got {type(module).__name__}")
    if not callable(getattr(module, method, None)):
        raise ExportError(f"the module has no method '{method}'")
    args, example_kwargs = _distinct_inputs(_as_tuple(example_inputs), example_kwargs)
    t0 = time.perf_counter()
    log = progress or (lambda s: None)
    # module.train(flag) would set every submodule to `flag`: restore each one's own mode instead
    # (an eval-mode model inside a wrapper left in training mode stays in eval mode).
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        target, strip = (module, "") if method == "forward" else (_MethodWrapper(module, method), "kiln_inner")
        log(f"[kiln] capturing {type(module).__name__}.{method} with torch.export ...")
        try:
            with torch.no_grad():
                ep = torch.export.export(target, args, kwargs=example_kwargs or {}, strict=strict,
                                         dynamic_shapes=dynamic_shapes)
        except Exception as e:  # noqa: BLE001
            raise ExportError(f"torch.export failed for {type(module).__name__}.{method}: {type(e).__name__}: "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}\n"
                              "Kiln captures with torch.export; make the module exportable "
                              "(https://pytorch.org/docs/stable/export.html)") from e
        res = capture_exported(ep, strip=strip, progress=log, collect_errors=collect_errors,
                               symbol_names=_symbol_names(ep, dynamic_shapes, args, target),
                               state_buffers=state_buffers)
    finally:
        for m, training in modes:
            m.training = training
    res.seconds = time.perf_counter() - t0
    return res


def capture_exported(ep, *, strip: str = "", progress: Callable[[str], None] | None = None,
                     collect_errors: bool = False, symbol_names: Mapping | None = None,
                     state_buffers=()) -> CaptureResult:
    """Builds a kiln.Graph from an ``torch.export.ExportedProgram`` (e.g. one read with
    ``torch.export.load`` from a .pt2 file): runs Kiln's decompositions, then maps every node. The
    program's inputs take the shapes and dtypes of its placeholders (the example inputs it was
    exported with). `strip`: a module-path prefix to drop from error locations. Raises ExportError."""
    t0 = time.perf_counter()
    log = progress or (lambda s: None)
    log("[kiln] decomposing to Kiln's op set ...")
    try:
        ep = ep.run_decompositions(decomposition_table())
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"torch's decompositions failed: {type(e).__name__}: {str(e).strip()[:500]}") from e
    n_calls = sum(1 for n in ep.graph.nodes if n.op == "call_function")
    log(f"[kiln] building graph from {n_calls} ATen nodes ...")
    from torch.export.graph_signature import InputKind

    def short(target: str) -> str:  # a buffer's name without the method wrapper's prefix
        return target[len(strip) + 1:] if strip and target.startswith(strip + ".") else target

    buffers = [spec.target for spec in ep.graph_signature.input_specs if spec.kind == InputKind.BUFFER]
    # Buffers another method of the program updates are state here too, even if only read.
    states: set = {t for t in buffers if short(t) in set(state_buffers or ())}
    while True:  # restarts once when buffers turn out to be state (updated in forward)
        b = _Builder(ep, strip=strip, progress=log, collect_errors=collect_errors, symbol_names=symbol_names,
                     state_buffers=states)
        try:
            graph, names = b.run()
            break
        except _NeedState as ns:
            if ns.targets <= states:
                raise ExportError(f"buffers {sorted(ns.targets)} are updated in forward but could not be "
                                  "captured as state") from None
            log(f"[kiln] {len(ns.targets)} buffer(s) updated in forward become state tensors: "
                f"{', '.join(sorted(ns.targets)[:4])}{' ...' if len(ns.targets) > 4 else ''}")
            states |= ns.targets
    return CaptureResult(graph, names, n_calls, b.notes, time.perf_counter() - t0, b.output_index, b.output_errors,
                         b.input_index, sorted(short(t) for t in states), sorted(short(t) for t in buffers))


@dataclass
class ExportResult:
    """What kiln.export wrote: `path` (None when out=None), `data` (the program bytes), `report`
    (the compiler's report dict: per-method num_nodes, arena_bytes, constant_bytes, ...) and `text`
    (the human-readable summary that export printed)."""
    path: str | None
    data: bytes
    report: dict
    text: str
    seconds: float
    methods: list
    notes: list = field(default_factory=list)

    @property
    def file_size(self) -> int:
        return len(self.data)

    def load(self):
        """Loads the written program with the C++ runtime (kiln.LoadedProgram)."""
        from . import load_bytes
        return load_bytes(self.data)

    def __str__(self):
        return self.text


def check_backends(backends: Sequence[str]) -> tuple:
    """Validates backend names (order of preference kept, duplicates refused); returns them as a
    tuple. "portable" is Kiln's own kernels (what no delegate takes runs there anyway); the others
    must be delegate backends compiled into this build (``kiln._kiln.backend_names()``). ExportError
    names an unknown backend, or one this build lacks, and lists the built ones."""
    if isinstance(backends, str):
        backends = (backends,)
    out = []
    built = ", ".join(BUILT_BACKENDS)
    for name in backends:
        if not isinstance(name, str):
            raise ExportError(f"backend names are strings, got {name!r}")
        if name in out:
            raise ExportError(f"backend '{name}' is given twice")
        if name in BUILT_BACKENDS:
            out.append(name)
        elif name == "cpu":
            raise ExportError("'cpu' is not a delegate backend: Kiln's optimized CPU kernels run whatever no "
                              f"delegate takes, with no option needed (built: {built})")
        elif name in KNOWN_BACKENDS:
            raise ExportError(f"backend {name} is not built into this Kiln (built: {built}); rebuild Kiln with "
                              f"its dependencies installed (see README.md)")
        else:
            raise ExportError(f"unknown backend '{name}' (known: {', '.join(KNOWN_BACKENDS)}; built: {built})")
    return tuple(out)


def check_require_delegation(require: str | None, backends: Sequence[str]) -> str:
    """Validates `require_delegation`: "" / None (no requirement) or a built delegate backend that
    is among `backends` (or `backends` is empty: it is then the one backend requested). Returns the
    name ("" for none). ExportError otherwise."""
    if not require:
        return ""
    if require == "portable" or require not in BUILT_BACKENDS:
        check_backends((require,))  # unknown / not built: the same message as for --backends
        raise ExportError(f"require_delegation='{require}': only a delegate backend can be required "
                          f"(built: {', '.join(b for b in BUILT_BACKENDS if b != 'portable') or 'none'})")
    if backends and require not in backends:
        raise ExportError(f"require_delegation='{require}' is not among the requested backends "
                          f"({', '.join(backends)})")
    return require


def format_delegation(report: dict) -> list[str]:
    """Human-readable lines of a compile report's delegation (per method: segments, nodes and
    constant bytes per delegate backend; the nodes left to Kiln's CPU kernels grouped by op, with
    each backend's reason for declining them). Empty when no backend was requested."""
    lines = []
    for m in report.get("methods", []):
        d = m.get("delegation") or {}
        if not d.get("backends"):
            continue
        lines.append(f"[kiln]   {m['name']}: delegation")
        for b in d["backends"]:
            lines.append(f"[kiln]     {b['backend']}: {b['segments']} segment(s), {b['nodes']} node(s), "
                         f"constants {_fmt_bytes(b['constant_bytes'])}")
        for st in d.get("states", []):
            where = (f"held by {st['backend']} (no copy across the boundary per call)" if st["resident"]
                     else f"through the {st['backend']} boundary: {st['reason']}")
            lines.append(f"[kiln]     state {st['state']}: {where}")
        cpu = d.get("cpu_ops", [])
        if not cpu:
            lines.append("[kiln]     CPU kernels: none (every node is delegated)")
            continue
        total = sum(c["count"] for c in cpu)
        lines.append(f"[kiln]     CPU kernels: {total} node(s)")
        for c in cpu:
            lines.append(f"[kiln]       {c['op']} x{c['count']}")
            for backend, reason in c["reasons"]:
                lines.append(f"[kiln]         {backend}: {reason}")
    return lines


def _fmt_bytes(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n} B"


def _default_progress(msg: str):
    print(msg, file=sys.stderr, flush=True)


def _write_atomically(path: str, data: bytes):
    """Writes `data` to `path` as `kiln compile` does (src/common/file_write.cpp, through the
    binding): a temporary file beside the target renamed over it, so that a process that has the
    old program memory-mapped keeps its (unlinked) bytes instead of seeing the file truncated
    under it (SIGBUS); an existing device or FIFO (e.g. /dev/null) is written in place; a symlink
    to a file replaces the file it names. Missing parent folders are created first. Raises OSError
    (strerror: the system's reason, e.g. "No space left on device")."""
    target = os.path.realpath(path) if os.path.exists(path) else path  # a symlink: its target's folder
    d = os.path.dirname(target) or "."
    os.makedirs(d, exist_ok=True)
    try:
        _kiln.write_file_replacing(path, bytes(data))
    except KilnError as e:  # "<what> '<path>': <reason>" (src/common/file_write.cpp)
        raise OSError(0, str(e.args[0]).rsplit("': ", 1)[-1], path) from None


def _write_json(path, report: dict):
    import json
    path = os.fspath(path)
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")


def _check_quantize_options(quantize, group_size, symmetric, scale_dtype, exclude) -> tuple:
    """Refuses quantization options that would be ignored (given without quantize, or group_size
    with w8, which has one scale per output channel) and returns `exclude` as a tuple of patterns
    (a single string is one pattern, not its characters; None is none). Raises ExportError."""
    if exclude is None:
        exclude = ()
    elif isinstance(exclude, (str, bytes, os.PathLike)):
        exclude = (os.fsdecode(exclude),)
    exclude = tuple(exclude)
    if not all(isinstance(p, str) for p in exclude):
        raise ExportError(f"exclude must be fnmatch patterns (strings), got {list(exclude)!r}")
    if quantize in (None, "", "none"):
        given = [name for name, on in (("exclude", bool(exclude)), ("symmetric=False", not symmetric),
                                        (f"scale_dtype={scale_dtype!r}", scale_dtype != "float32"),
                                        (f"group_size={group_size}", group_size != 128)) if on]
        if given:
            raise ExportError(f"{', '.join(given)} only apply with quantize= one of {', '.join(QUANT_SCHEMES)}")
    elif quantize in ("w8", "w8a8") and (group_size != 128 or not symmetric):
        raise ExportError((f"group_size={group_size}" if group_size != 128 else "symmetric=False") +
                          f" applies to quantize='w4' / 'w4a8' only ({quantize} is symmetric, one scale per output "
                          "channel)")
    return exclude


def compile_captures(captures: Mapping[str, CaptureResult], *, out: str | os.PathLike | None = None,
                     backends: Sequence[str] = (), require_delegation: str | None = None,
                     fold_constants: bool = True, fold_batch_norm: bool = True,
                     report_json: str | os.PathLike | None = None, verbose: bool = True,
                     t0: float | None = None, alternatives: Sequence[Sequence[str]] = (),
                     compute_dtype: str = "float32",
                     quantize: str | None = None, group_size: int = 128, symmetric: bool = True,
                     scale_dtype: str = "float32", exclude: Sequence[str] = (), quantize_embeddings: bool = False,
                     weights_dtype: str = "float32", metadata: Mapping[str, str] | None = None) -> ExportResult:
    """Compiles captured methods ({name: CaptureResult}) into one program with the C++ compiler,
    writes `out` (and the report as JSON to `report_json`) when given and prints the report unless
    verbose=False. `backends`/`require_delegation`/`alternatives`: see export(). compute_dtype:
    "float32" (default), "float16" or "bfloat16", the precision delegates that support it (mlx)
    compute in (the program's types stay float32; docs/mlx.md "Precision"). Raises ExportError
    (code = the Kiln error code name when the compiler refused, e.g. "NotSupported" for
    require_delegation). quantize/group_size/symmetric/scale_dtype/exclude/quantize_embeddings: see
    export()."""
    if quantize not in (None, "", "none", *QUANT_SCHEMES):
        raise ExportError(f"quantize must be one of {', '.join(map(repr, QUANT_SCHEMES))} (or None), got {quantize!r}")
    exclude = _check_quantize_options(quantize, group_size, symmetric, scale_dtype, exclude)
    alts = []
    if alternatives:
        if backends or require_delegation:
            raise ExportError("alternatives replace backends and require_delegation: give one or the other")
        alts = [[b for b in check_backends(a) if b != "portable"] for a in alternatives]
    backends = check_backends(backends)
    require = check_require_delegation(require_delegation, backends)
    delegates = [b for b in backends if b != "portable"]
    if require and not delegates:
        delegates = [require]  # require_delegation alone means "this backend"
    log = _default_progress if verbose else (lambda s: None)
    t0 = time.perf_counter() if t0 is None else t0
    pb = _kiln.ProgramBuilder()
    notes = []
    for name, cap in captures.items():
        notes += [f"{name}: {n}" for n in cap.notes]
        try:
            pb.add_method(name, cap.graph)
        except KilnError as e:
            raise ExportError(f"method '{name}': {e.args[0]}") from None
    for key, value in (metadata or {}).items():
        pb.set_metadata(str(key), str(value))
    log("[kiln] compiling" + (f" (delegating to {', '.join(delegates)})" if delegates else "") + " ...")
    try:
        data, report = pb.compile(fold_constants=fold_constants, backends=delegates, require_delegation=require,
                                  fold_batch_norm=fold_batch_norm, alternatives=alts, compute_dtype=compute_dtype,
                                  quantize=quantize or "", group_size=group_size, symmetric=symmetric,
                                  scale_dtype=scale_dtype, quantize_exclude=list(exclude),
                                  quantize_embeddings=bool(quantize_embeddings), weights_dtype=weights_dtype)
    except KilnError as e:
        code = e.args[1] if len(e.args) > 1 else None
        if require and code == "NotSupported" and "not delegated to required backend" in e.args[0]:
            raise ExportError(f"require_delegation='{require}' failed; nothing was written. {e.args[0]}",
                              code=code) from None
        raise ExportError(f"compilation failed: {e.args[0]}", code=code) from None
    report = dict(report)
    report["backends"] = list(delegates)
    report["alternatives"] = alts
    report["require_delegation"] = require
    report["compute_dtype"] = compute_dtype
    path = None if out is None else os.fsdecode(os.fspath(out))
    if path is not None and (path == "" or path.endswith(os.sep)):
        raise ExportError(f"out={path!r} is not a file name" + (" (it ends with a folder separator)" if path else ""))
    report["path"] = path
    try:
        # The report first: a report that cannot be written leaves no program behind.
        if report_json is not None:
            _write_json(report_json, report)
        if path is not None:
            _write_atomically(path, data)
    except OSError as e:
        raise ExportError(f"cannot write {e.filename or path}: {e.strerror or e}") from None
    secs = time.perf_counter() - t0
    # "mlx" alone when the delegates took every node of every method, else "+ portable/cpu kernels"
    cpu_left = not delegates or any((m.get("delegation") or {}).get("cpu_ops") or not (m.get("delegation") or {}).get("backends")
                                    for m in report["methods"])
    lines = [f"[kiln] {'wrote ' + path if path else 'compiled'}: {_fmt_bytes(len(data))} "
             f"(constants {_fmt_bytes(report['constant_bytes'])}), {secs:.1f} s, backends: "
             f"{', '.join(delegates) + (' + portable/cpu kernels' if cpu_left else '') if delegates else 'portable/cpu kernels'}"
             + (", alternatives: " + " | ".join(", ".join(a) or "cpu kernels" for a in alts) if alts else "")]
    for m in report["methods"]:
        cap = captures[m["name"]]
        bn = f", {m['num_bn_folded']} batch norms folded" if m.get("num_bn_folded") else ""
        bn += f", {m['num_affine_folded']} scalar affines folded" if m.get("num_affine_folded") else ""
        bn += f", {m['num_hardswish']} hardswish recognized" if m.get("num_hardswish") else ""
        bn += f", {m['num_quick_gelu']} quick-GELU rewritten" if m.get("num_quick_gelu") else ""
        bn += f", {m['num_rms_norm']} RMS norms recognized" if m.get("num_rms_norm") else ""
        alt = f" [alternative {m['alternative']}: {', '.join(alts[m['alternative']]) or 'cpu kernels'}]" if alts else ""
        qn = f", {m['num_quantized']} weights quantized ({quantize})" if m.get("num_quantized") else ""
        lines.append(f"[kiln]   {m['name']}{alt}: {cap.aten_nodes} {getattr(cap, 'source_label', 'ATen')} nodes -> {m['num_nodes']} Kiln nodes "
                     f"({m['num_folded']} folded{bn}{qn}, {m['num_dead']} dead), arena {_fmt_bytes(m['arena_bytes'])}, "
                     f"constants {_fmt_bytes(m['constant_bytes'])}")
    if quantize in QUANT_SCHEMES and not any(m.get("num_quantized") for m in report["methods"]):
        lines.append(f"[kiln]   warning: quantize={quantize!r} quantized nothing: no linear, matmul or convolution "
                     "with a constant float32 weight" + (f" outside the exclude patterns {list(exclude)}"
                                                           if exclude else ""))
    lines += format_delegation(report)
    if report_json is not None:
        lines.append(f"[kiln]   report: {os.fspath(report_json)}")
    lines += [f"[kiln]   note: {n}" for n in notes]
    text = "\n".join(lines)
    log(text)
    return ExportResult(path, data, report, text, secs, [m["name"] for m in report["methods"]], notes)


def export_program(methods: Mapping[str, tuple], *, out: str | os.PathLike | None = None,
                   backends: Sequence[str] = (), require_delegation: str | None = None,
                   fold_constants: bool = True, fold_batch_norm: bool = True, strict: bool = False,
                   report_json: str | os.PathLike | None = None, verbose: bool = True,
                   alternatives: Sequence[Sequence[str]] = (), compute_dtype: str = "float32",
                   quantize: str | None = None, group_size: int = 128, symmetric: bool = True,
                   scale_dtype: str = "float32", exclude: Sequence[str] = (), quantize_embeddings: bool = False,
                   weights_dtype: str = "float32", dynamic_shapes: Mapping[str, Any] | None = None,
                   metadata: Mapping[str, str] | None = None) -> ExportResult:
    """Exports several methods into one program: ``{"encode": (module, args), "decode": (module2,
    args2, "decode_method"), ...}`` (an optional third item names the module method; default
    "forward"). Constants with identical bytes are stored once across methods. Writes `out` when
    given. compute_dtype: see compile_captures(). dynamic_shapes: {method name: torch.export
    dynamic_shapes}; buffers that several methods update are one state shared by name (e.g. a
    prefill and a decode method over one KV cache). Other options as for export(). Prints progress
    and a report unless verbose=False. Raises ExportError."""
    backends = check_backends(backends)
    check_require_delegation(require_delegation, backends)
    if not methods:
        raise ExportError("export_program needs at least one method")
    log = _default_progress if verbose else (lambda s: None)
    t0 = time.perf_counter()
    captures = {}
    for name, spec in methods.items():
        if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
            raise ExportError(f"method '{name}': expected (module, example_inputs[, module_method])")
        module, args = spec[0], spec[1]
        mname = spec[2] if len(spec) == 3 else "forward"
        if len(methods) > 1:
            log(f"[kiln] method '{name}':")
        captures[name] = capture(module, args, method=mname, strict=strict, progress=log,
                                 dynamic_shapes=(dynamic_shapes or {}).get(name))
    # A state one method updates is state in every method that reads that buffer (by name): a
    # method that only reads it was captured with it as a constant, so capture it again.
    shared = set().union(*(set(c.state_names) for c in captures.values()))
    for name, spec in methods.items():
        cap = captures[name]
        missing = (shared & set(cap.buffer_names)) - set(cap.state_names)
        if missing:
            log(f"[kiln] method '{name}' reads state {', '.join(sorted(missing))} that another method updates: "
                "capturing it again with it as state")
            captures[name] = capture(spec[0], spec[1], method=spec[2] if len(spec) == 3 else "forward", strict=strict,
                                     progress=log, dynamic_shapes=(dynamic_shapes or {}).get(name),
                                     state_buffers=shared)
    return compile_captures(captures, out=out, backends=backends, require_delegation=require_delegation,
                            fold_constants=fold_constants, fold_batch_norm=fold_batch_norm,
                            report_json=report_json, verbose=verbose, t0=t0, alternatives=alternatives,
                            compute_dtype=compute_dtype,
                            quantize=quantize, group_size=group_size, symmetric=symmetric, scale_dtype=scale_dtype,
                            exclude=exclude, quantize_embeddings=quantize_embeddings, weights_dtype=weights_dtype,
                            metadata=metadata)


def export(module: torch.nn.Module, example_inputs, *, method: str = "forward", out: str | os.PathLike | None = None,
           backends: Sequence[str] = (), require_delegation: str | None = None, fold_constants: bool = True,
           fold_batch_norm: bool = True, strict: bool = False, report_json: str | os.PathLike | None = None,
           verbose: bool = True, alternatives: Sequence[Sequence[str]] = (),
           quantize: str | None = None, group_size: int = 128, symmetric: bool = True,
           scale_dtype: str = "float32", exclude: Sequence[str] = (), quantize_embeddings: bool = False,
           weights_dtype: str = "float32", compute_dtype: str = "float32", dynamic_shapes=None,
           metadata: Mapping[str, str] | None = None) -> ExportResult:
    """Exports ``module.<method>`` (default forward) for `example_inputs` (a tensor or tuple; the
    program takes exactly these shapes and dtypes, except the dims `dynamic_shapes` declares) into a
    program with one method named `method`, written to `out` when given.

    dynamic_shapes: as for torch.export, e.g. ``{"tokens": {1: torch.export.Dim("seq", min=1,
    max=512)}}``: the method then takes any size in each declared range (memory planned for the max);
    buffers forward updates become state tensors kept in a session across calls (docs/generative.md).
    metadata: string key/values stored in the program (``kiln inspect`` shows them).

    backends: delegate backends in order of preference, e.g. ("xnnpack",) (valid: "portable" plus
    ``kiln._kiln.backend_names()``); each takes the nodes it supports, the rest runs on Kiln's CPU
    kernels. require_delegation: a backend name; the export then fails (ExportError, code
    "NotSupported", listing every node not delegated with the backend's reason) unless that backend
    takes every node. fold_batch_norm: fold inference batch norms into the preceding convolution /
    linear (on by default). report_json: path to write the compile report (a dict: per method
    nodes, arena, constants and "delegation" = {backends: [{backend, segments, nodes,
    constant_bytes}], cpu_ops: [{op, count, reasons: [[backend, reason]]}]}) as JSON.
    alternatives: instead of backends, several backend lists in order of preference, e.g.
    (("mlx",), ("xnnpack",)): the file holds one lowering per list and the runtime runs the first
    whose backends are available on the device (LoadedProgram.method().alternative says which).
    quantize: weight-only quantization of the constant weights of linear / matmul / convolution
    nodes: "w8" (int8, symmetric, one scale per output channel) or "w4" (int4, groups of
    `group_size` values along the reduction dim, symmetric or (symmetric=False) with zeros);
    scale_dtype "float32" or "float16"; exclude: fnmatch patterns of module paths / weight names to
    keep in float32 (e.g. ["features.0.*"]); quantize_embeddings: also quantize aten.embedding
    tables row by row (a table tied to an output projection is then stored once; export_llm turns
    it on). Activations stay float32 (src/ir/ops/quant.h), except with "w8a8" / "w4a8": the weights
    as w8 / w4, and each quantized linear whose input length and group size are multiples of 32
    quantizes its input at run time to int8 blocks of 32 (d = max|x| / 127 per block, llama.cpp's
    Q8_0 activations) and multiplies in integers (src/ir/ops/quant.h; about 2^-8 relative error
    of each input block, docs/quantization.md).
    weights_dtype: "float16" stores the float32 constants the kernels read (>= 1024 elements) as
    float16 in the file; the loader widens them to float32 once at load.
    compute_dtype: "float32" (default), "float16" or "bfloat16": the precision of delegates that
    support it (mlx computes its segments in that dtype; inputs and outputs stay float32; Kiln's
    CPU kernels and xnnpack always compute float32); see compile_captures().
    Prints progress and a report unless verbose=False. Returns an ExportResult; raises ExportError."""
    return export_program({method: (module, example_inputs, method)}, out=out, backends=backends,
                          require_delegation=require_delegation, fold_constants=fold_constants,
                          fold_batch_norm=fold_batch_norm, strict=strict, report_json=report_json,
                          verbose=verbose, alternatives=alternatives, quantize=quantize, group_size=group_size,
                          symmetric=symmetric, scale_dtype=scale_dtype, exclude=exclude,
                          quantize_embeddings=quantize_embeddings, weights_dtype=weights_dtype,
                          compute_dtype=compute_dtype, dynamic_shapes=None if dynamic_shapes is None else {method: dynamic_shapes},
                          metadata=metadata)


def compile_exported_file(path: str | os.PathLike, *, method: str = "forward", out: str | os.PathLike | None = None,
                          backends: Sequence[str] = (), require_delegation: str | None = None,
                          fold_constants: bool = True, fold_batch_norm: bool = True,
                          report_json: str | os.PathLike | None = None, verbose: bool = True,
                          quantize: str | None = None, group_size: int = 128, symmetric: bool = True,
                          scale_dtype: str = "float32", exclude: Sequence[str] = (),
                          weights_dtype: str = "float32", compute_dtype: str = "float32") -> ExportResult:
    """Compiles an ExportedProgram saved with ``torch.export.save(ep, path)`` (a .pt2 file) into a
    program with one method named `method`. Its inputs take the shapes and dtypes of the saved
    program's placeholders (its example inputs). Options as for export(). Raises ExportError
    (also for a file torch.export.load cannot read)."""
    backends = check_backends(backends)
    check_require_delegation(require_delegation, backends)
    log = _default_progress if verbose else (lambda s: None)
    t0 = time.perf_counter()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ExportError(f"no such file: {path}")
    if not zipfile.is_zipfile(path):  # torch.export.load would log its own traceback before raising
        raise ExportError(f"cannot read {path} as an ExportedProgram saved with torch.export.save: "
                          "not a zip archive (a .pt2 file is one)")
    log(f"[kiln] loading {path} with torch.export.load ...")
    try:
        ep = torch.export.load(path)
    except Exception as e:  # noqa: BLE001
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ExportError(f"cannot read {path} as an ExportedProgram saved with torch.export.save: "
                          f"{type(e).__name__}: {first}") from None
    cap = capture_exported(ep, progress=log)
    return compile_captures({method: cap}, out=out, backends=backends, require_delegation=require_delegation,
                            fold_constants=fold_constants, fold_batch_norm=fold_batch_norm,
                            report_json=report_json, verbose=verbose, t0=t0,
                            quantize=quantize, group_size=group_size, symmetric=symmetric, scale_dtype=scale_dtype,
                            exclude=exclude, weights_dtype=weights_dtype, compute_dtype=compute_dtype)

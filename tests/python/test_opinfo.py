"""OpInfo-driven coverage of Kiln's op set against PyTorch eager.

For every op in Kiln's registry (kiln.op_names()), the float32 samples of the PyTorch OpInfos
that exercise it (torch.testing._internal.common_methods_invocations.op_db, mapping in OPINFOS)
are each wrapped in a tiny computation, exported with kiln.capture, compiled, run by the C++
runtime and compared with eager (max abs error <= 1e-5 * max|expected|; exact for ints/bools).

Outcome of each sample:
- passed:      exported, ran, matched;
- failed:      exported but the result differs, or running it failed (a bug) -> the op's test fails;
- unsupported: the export was refused (ExportError: op outside Kiln's set, a configuration Kiln
  declines with NotSupported, dtype Kiln lacks, torch.export cannot trace it) or the runtime
  declined it with NotSupported. Listed with the reason, never silently dropped.

Speed: all samples go into one module and one export (torch.export and run_decompositions cost
~1 s per call whatever the size); capture(collect_errors=True) leaves out just the outputs that
fail. When compiling or running the whole batch fails, the batch is bisected.

Writing docs/op-coverage.md:  KILN_WRITE_COVERAGE=1 pytest tests/python/test_opinfo.py
Samples per OpInfo are capped at MAX_SAMPLES (a fixed pseudo-random subset) to keep the run short.
"""
from __future__ import annotations

import collections
import os
import random
import re
import time
import traceback

import pytest
import torch
from torch.utils import _pytree as pytree

import kiln
from kiln.capture import ExportError, capture
from oprunner import assert_close

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_SAMPLES = int(os.environ.get("KILN_OPINFO_MAX_SAMPLES", "40"))
REL = 1e-5

# Kiln op -> OpInfos (name, variant_test_name; None = every variant) whose samples exercise it.
OPINFOS: dict[str, list[tuple[str, str | None]]] = {
    "aten.add": [("add", "")], "aten.sub": [("sub", "")], "aten.mul": [("mul", "")], "aten.div": [("div", None)],
    "aten.pow": [("pow", "")], "aten.neg": [("neg", "")], "aten.exp": [("exp", "")], "aten.log": [("log", "")],
    "aten.sqrt": [("sqrt", "")], "aten.rsqrt": [("rsqrt", "")], "aten.abs": [("abs", "")],
    "aten.reciprocal": [("reciprocal", "")], "aten.erf": [("erf", "")], "aten.sin": [("sin", "")],
    "aten.cos": [("cos", "")], "aten.relu": [("nn.functional.relu", "")], "aten.sigmoid": [("sigmoid", "")],
    "aten.tanh": [("tanh", "")], "aten.silu": [("nn.functional.silu", "")],
    "aten.hardswish": [("nn.functional.hardswish", "")], "aten.hardsigmoid": [("nn.functional.hardsigmoid", "")],
    "aten.hardtanh": [("nn.functional.hardtanh", ""), ("nn.functional.relu6", "")],
    "aten.leaky_relu": [("nn.functional.leaky_relu", "")], "aten.gelu": [("nn.functional.gelu", "")],
    "aten.clamp": [("clamp", ""), ("clamp_min", ""), ("clamp_max", "")], "aten.where": [("where", ""), ("masked_fill", "")],
    "aten.eq": [("eq", "")], "aten.ne": [("ne", "")], "aten.lt": [("lt", "")], "aten.le": [("le", "")],
    "aten.gt": [("gt", "")], "aten.ge": [("ge", "")], "aten.logical_not": [("logical_not", "")],
    "aten.logical_and": [("logical_and", "")], "aten.logical_or": [("logical_or", "")],
    "aten._to_copy": [("to", ""), ("float", "")], "aten.clone": [("clone", "")],
    "aten.mean": [("mean", "")], "aten.sum": [("sum", "")],
    # max()/min() without dim are captured as amax/amin over every dim
    "aten.amax": [("amax", ""), ("max", "reduction_no_dim")], "aten.amin": [("amin", ""), ("min", "reduction_no_dim")],
    "aten.argmax": [("argmax", "")], "aten.cumsum": [("cumsum", "")], "aten._softmax": [("softmax", None)],
    "aten._log_softmax": [("log_softmax", None)], "aten.view": [("view", ""), ("reshape", ""), ("flatten", "")],
    "aten.permute": [("permute", "")], "aten.transpose": [("transpose", ""), ("t", "")],
    "aten.expand": [("expand", "")], "aten.slice": [("slice", ""), ("narrow", "")], "aten.select": [("select", "")],
    "aten.squeeze": [("squeeze", None)], "aten.unsqueeze": [("unsqueeze", "")], "aten.cat": [("cat", "")],
    "aten.embedding": [("nn.functional.embedding", "")], "aten.constant_pad_nd": [("constant_pad_nd", ""), ("nn.functional.pad", "constant")],
    "aten.convolution": [("nn.functional.conv1d", ""), ("nn.functional.conv2d", ""),
                         ("nn.functional.conv_transpose1d", ""), ("nn.functional.conv_transpose2d", "")],
    "aten.addmm": [("addmm", "")], "aten.mm": [("mm", "")], "aten.bmm": [("bmm", "")],
    "aten.linear": [("nn.functional.linear", "")], "aten.max_pool2d": [("nn.functional.max_pool2d", ""),
                                                                                ("nn.functional.max_pool1d", "")],
    "aten.avg_pool2d": [("nn.functional.avg_pool2d", ""), ("nn.functional.avg_pool1d", "")],
    "aten.adaptive_avg_pool2d": [("nn.functional.adaptive_avg_pool2d", ""), ("nn.functional.adaptive_avg_pool1d", "")],
    "aten.native_batch_norm": [("nn.functional.batch_norm", ""), ("_native_batch_norm_legit", "")],
    "aten.native_layer_norm": [("nn.functional.layer_norm", "")],
    "aten.native_group_norm": [("nn.functional.group_norm", "")], "aten.rms_norm": [("nn.functional.rms_norm", "")],
    "aten.scaled_dot_product_attention": [("nn.functional.scaled_dot_product_attention", "")],
    "aten.upsample_nearest2d": [("nn.functional.interpolate", "nearest"), ("nn.functional.upsample_nearest", "")],
    # 1-D linear interpolation is captured as upsample_bilinear2d on a height-1 image
    "aten.any": [("any", "")], "aten.argmin": [("argmin", "")], "aten.max": [("max", "reduction_with_dim")],
    "aten.min": [("min", "reduction_with_dim")], "aten.prod": [("prod", "")],
    "aten.var": [("var", ""), ("var", "unbiased"), ("var_mean", ""), ("var_mean", "unbiased")],
    "aten.sort": [("sort", ""), ("msort", ""), ("argsort", "")], "aten.topk": [("topk", "")],
    "aten.flip": [("flip", ""), ("fliplr", ""), ("flipud", "")], "aten.repeat": [("repeat", ""), ("tile", "")],
    "aten.diagonal": [("diagonal", ""), ("diagonal_copy", "")],
    "aten.as_strided": [("as_strided", ""), ("as_strided", "partial_views"), ("as_strided_copy", "")],
    "aten.upsample_bilinear2d": [("nn.functional.interpolate", "bilinear"), ("nn.functional.interpolate", "linear"),
                                 ("nn.functional.upsample_bilinear", "")],
    # math family (src/ir/ops/math.cpp)
    "aten.acos": [("acos", "")], "aten.acosh": [("acosh", "")], "aten.asin": [("asin", "")],
    "aten.asinh": [("asinh", "")], "aten.atan": [("atan", "")], "aten.atanh": [("atanh", "")],
    "aten.cosh": [("cosh", "")], "aten.sinh": [("sinh", "")], "aten.tan": [("tan", "")],
    "aten.expm1": [("expm1", "")], "aten.log1p": [("log1p", "")], "aten.log2": [("log2", "")],
    "aten.log10": [("log10", "")], "aten.ceil": [("ceil", "")], "aten.floor": [("floor", "")],
    "aten.round": [("round", None)], "aten.trunc": [("trunc", "")], "aten.sign": [("sign", ""), ("sgn", "")],
    "aten.isinf": [("isinf", "")], "aten.isnan": [("isnan", "")], "aten.atan2": [("atan2", "")],
    "aten.remainder": [("remainder", "")], "aten.fmod": [("fmod", "")], "aten.maximum": [("maximum", "")],
    "aten.minimum": [("minimum", "")], "aten.logical_xor": [("logical_xor", "")],
    "aten.bitwise_and": [("bitwise_and", "")], "aten.bitwise_or": [("bitwise_or", "")],
    "aten.bitwise_xor": [("bitwise_xor", "")], "aten.bitwise_not": [("bitwise_not", "")],
    "aten.elu": [("nn.functional.elu", ""), ("nn.functional.celu", ""), ("nn.functional.selu", "")],
    "aten.index": [("__getitem__", ""), ("index_put", "")], "aten.index_put": [("index_put", ""), ("index_fill", "")],
    "aten.gather": [("gather", ""), ("take_along_dim", "")], "aten.index_select": [("index_select", "")],
    "aten.scatter": [("scatter", "")], "aten.scatter_add": [("scatter_add", "")],
    "aten.scatter_reduce": [("scatter_reduce", None)], "aten.select_scatter": [("select_scatter", "")],
    "aten.slice_scatter": [("slice_scatter", "")], "aten.masked_scatter": [("masked_scatter", "")],
    "aten._embedding_bag": [("nn.functional.embedding_bag", "")],
    # spatial family (src/ir/ops/spatial_extra.cpp); F.pad's circular mode decomposes into slices
    "aten.reflection_pad1d": [("nn.functional.pad", "reflect")],
    "aten.reflection_pad2d": [("nn.functional.pad", "reflect")],
    "aten.reflection_pad3d": [("nn.functional.pad", "reflect")],
    "aten.replication_pad1d": [("nn.functional.pad", "replicate"), ("nn.functional.pad", "replicate_negative")],
    "aten.replication_pad2d": [("nn.functional.pad", "replicate"), ("nn.functional.pad", "replicate_negative")],
    "aten.replication_pad3d": [("nn.functional.pad", "replicate"), ("nn.functional.pad", "replicate_negative")],
    "aten.avg_pool3d": [("nn.functional.avg_pool3d", "")],
    "aten.max_pool3d_with_indices": [("nn.functional.max_pool3d", "")],
    "aten._adaptive_avg_pool3d": [("nn.functional.adaptive_avg_pool3d", "")],
    "aten.adaptive_max_pool2d": [("nn.functional.adaptive_max_pool2d", ""), ("nn.functional.adaptive_max_pool1d", "")],
    "aten.adaptive_max_pool3d": [("nn.functional.adaptive_max_pool3d", "")],
    "aten.grid_sampler_2d": [("nn.functional.grid_sample", ""), ("grid_sampler_2d", "")],
    "aten.grid_sampler_3d": [("nn.functional.grid_sample", ""), ("grid_sampler_3d", "")],
    "aten.im2col": [("nn.functional.unfold", "")],
    "aten._cdist_forward": [("cdist", "")], "aten._pdist_forward": [("nn.functional.pdist", "")],
}
# OpInfos whose ops PyTorch defines for no floating dtype: their samples are drawn in this dtype
# instead of float32.
SAMPLE_DTYPE: dict[str, torch.dtype] = {
    "bitwise_and": torch.int64, "bitwise_or": torch.int64, "bitwise_xor": torch.int64, "bitwise_not": torch.int64,
}
# Kiln ops that no OpInfo exercises, with the reason (listed in docs/op-coverage.md).
NO_OPINFO: dict[str, str] = {
    "kiln.sdpa_kv_cache": "Kiln's attention over a KV cache (no ATen OpInfo); tests/cpp/sdpa_kv_cache_test.cpp checks "
                          "both kernels against a float64 reference, tests/python/test_llm_export.py whole models "
                          "against transformers",
    "kiln.check_range": "Kiln's range guard (no ATen OpInfo); tests/python/test_llm_export.py checks it through the "
                        "LLM export (positions outside the cache refused, state unchanged)",
    "kiln.weight_quantized_linear": "Kiln's weight-only quantized op (no ATen OpInfo); tests/python/test_quant.py "
                                    "checks it against NumPy/PyTorch dequantization references",
    "kiln.weight_quantized_convolution": "as kiln.weight_quantized_linear (tests/python/test_quant.py)",
    "kiln.weight_quantized_embedding": "as kiln.weight_quantized_linear (tests/python/test_quant.py: every scheme "
                                       "against NumPy's dequantized table, out-of-range indices, tied tables)",
    "aten.arange": "no tensor inputs: the capture evaluates arange at export time (its OpInfo samples never reach "
                   "the Kiln op); tests/python/test_ops_sort.py runs the op itself against torch.arange",
    "aten.full": "as aten.arange (no tensor inputs; tests/python/test_ops_sort.py checks it against torch.full)",
    "aten.scalar_tensor": "as aten.arange (no tensor inputs; tests/python/test_ops_sort.py)",
    "aten.full_like": "reads only its input's shape, so the capture evaluates it at export time (its OpInfo samples "
                      "never reach the Kiln op); tests/python/test_ops_sort.py checks it against torch.full_like",
    "aten.fill": "as aten.full_like for a constant value (fill.Scalar); a computed value (fill.Tensor) is checked in "
                 "tests/python/test_ops_sort.py against torch's fill",
    "aten.copy": "no OpInfo calls aten.copy; tests/python/test_ops_sort.py checks it (broadcast, dtype conversion) "
                 "against torch.ops.aten.copy",
    "aten.col2im": "op_db has no F.fold OpInfo; tests/python/test_ops_spatial.py checks aten.col2im and F.fold "
                   "against eager",
    "aten.max_pool2d_with_indices": "the two-output form the ONNX importer uses for MaxPool's Indices; the capture "
                                    "maps torch's max_pool2d_with_indices onto aten.max_pool2d (values only), so no "
                                    "OpInfo sample reaches it; tests/python/test_onnx_gaps.py checks it against "
                                    "torch.ops.aten.max_pool2d_with_indices",
}


def op_set_from_doc() -> list[str]:
    """Every op named in docs/op-set.md's table (the contract; some may not be built yet)."""
    with open(os.path.join(ROOT, "docs", "op-set.md")) as f:
        text = f.read()
    ops = []
    for line in text.splitlines():
        if line.startswith("|") and "aten." in line:
            cell = line.split("|")[2]
            ops += re.findall(r"aten\.[A-Za-z0-9_]+", cell)
    return list(dict.fromkeys(ops))


# --------------------------------------------------------------------------------------------------
# samples

class Case:
    """One OpInfo sample: the callable, its (input, args, kwargs) tree, eager outputs, outcome."""

    def __init__(self, kiln_op, info, index, sample):
        self.kiln_op, self.info, self.index, self.sample = kiln_op, info, index, sample
        leaves, self.spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
        self.slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        self.leaves = leaves
        self.inputs = [leaves[i].detach().clone().contiguous() for i in self.slots]
        self.status, self.reason = None, ""
        self.expected = None

    @property
    def label(self):
        v = f".{self.info.variant_test_name}" if self.info.variant_test_name else ""
        return f"{self.info.name}{v}#{self.index}"

    def describe(self):
        s = self.sample
        shapes = lambda x: pytree.tree_map(lambda t: f"T{list(t.shape)}{'' if t.dtype == torch.float32 else t.dtype}"
                                           if isinstance(t, torch.Tensor) else t, x)
        return f"{self.label}: input={shapes(s.input)} args={shapes(s.args)} kwargs={shapes(s.kwargs)}"

    def call(self, tensors):
        leaves = list(self.leaves)
        for slot, t in zip(self.slots, tensors):
            leaves[slot] = t
        inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        out = self.info.op(inp, *args, **kwargs)
        return pytree.tree_leaves(out)

    def compute_expected(self):
        try:
            with torch.no_grad():
                outs = self.call([t.clone() for t in self.inputs])
        except Exception as e:  # noqa: BLE001
            self.status, self.reason = "skipped", f"eager raised {type(e).__name__}"
            return
        if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
            self.status, self.reason = "unsupported", "the op returns a non-tensor value"
            return
        self.expected = [o.detach().contiguous().numpy() if o.dtype != torch.bfloat16 else None for o in outs]

    def set(self, status, reason=""):
        if self.status is None:
            self.status, self.reason = status, reason


class Batch(torch.nn.Module):
    """forward(*all inputs) runs every case; returns all their outputs flattened, in order."""

    def __init__(self, cases):
        super().__init__()
        self.cases = cases

    def forward(self, *tensors):
        outs, k = [], 0
        for c in self.cases:
            n = len(c.inputs)
            outs += c.call(tensors[k:k + n])
            k += n
        return tuple(outs)


def _short(e: BaseException) -> str:
    if isinstance(e, ExportError):
        text = e.reason if e.op is None else f"{e.op}: {e.reason}"
    elif isinstance(e, kiln.KilnError):
        text = str(e.args[0])
    else:
        text = f"{type(e).__name__}: {e}"
    text = " ".join(text.split())
    text = re.sub(r" \(at [^)]*\)", "", text)
    text = re.sub(r"(torch\.export failed for [\w.]+: \w+):.*", r"\1", text)  # drop sample-specific detail
    return text[:240]


def _is_capture_bug(e: ExportError) -> bool:
    return "bug in Kiln's capture" in str(e)


def run_cases(cases: list[Case]):
    """Exports, runs and judges `cases` together; bisects when the whole batch cannot run."""
    cases = [c for c in cases if c.status is None]
    if not cases:
        return
    inputs = [t for c in cases for t in c.inputs]
    try:
        cap = capture(Batch(cases), tuple(inputs), collect_errors=True)
    except ExportError as e:
        if len(cases) > 1:
            return _bisect(cases)
        return cases[0].set("failed" if _is_capture_bug(e) else "unsupported", _short(e))
    except Exception as e:  # noqa: BLE001 -- a crash of the capture is a Kiln bug
        if len(cases) > 1:
            return _bisect(cases)
        return cases[0].set("failed", f"capture raised {_short(e)}: {traceback.format_exc(limit=-2)}")
    owner = [i for i, c in enumerate(cases) for _ in c.expected]  # user output -> case
    for idx, err in cap.output_errors.items():
        c = cases[owner[idx]]
        c.set("failed" if _is_capture_bug(err) else "unsupported", _short(err))
    if not cap.output_index:
        return
    try:
        pb = kiln.ProgramBuilder()
        pb.add_method("forward", cap.graph)
        data, _ = pb.compile()
        prog = kiln.load_bytes(data)
        outs = prog.run(*[inputs[i].numpy() for i in cap.input_index])
    except kiln.KilnError as e:
        pending = [c for c in cases if c.status is None]
        if len(pending) > 1:
            return _bisect(pending)
        if pending:
            code = e.args[1] if isinstance(e, kiln.KilnError) and len(e.args) > 1 else None
            pending[0].set("unsupported" if code == "NotSupported" else "failed", _short(e))
        return
    got = collections.defaultdict(dict)
    for k, idx in enumerate(cap.output_index):
        got[owner[idx]][idx] = outs[k]
    start = 0
    for i, c in enumerate(cases):
        n = len(c.expected)
        if c.status is None:
            for j in range(n):
                exp = c.expected[j]
                if exp is None:
                    c.set("unsupported", "bfloat16 output (no NumPy reference)")
                    break
                try:
                    assert_close(got[i][start + j], exp, rel=REL, what=f"output {j}")
                except AssertionError as e:
                    c.set("failed", " ".join(str(e).split())[:300])
                    break
            c.set("passed")
        start += n


def _bisect(cases):
    mid = len(cases) // 2
    run_cases(cases[:mid])
    run_cases(cases[mid:])


def collect_cases(kiln_ops) -> dict[str, list[Case]]:
    from torch.testing._internal.common_methods_invocations import op_db

    by_name = collections.defaultdict(list)
    for info in op_db:
        by_name[info.name].append(info)
    out = {}
    for op in kiln_ops:
        cases = []
        for name, variant in OPINFOS.get(op, []):
            infos = [i for i in by_name.get(name, []) if variant is None or i.variant_test_name == variant]
            assert infos, f"OpInfo {name!r} (variant {variant!r}) not found in op_db"
            for info in infos:
                samples = list(info.sample_inputs("cpu", SAMPLE_DTYPE.get(name, torch.float32), requires_grad=False))
                if len(samples) > MAX_SAMPLES:  # a fixed pseudo-random subset (even steps can alias)
                    keep = sorted(random.Random(0).sample(range(len(samples)), MAX_SAMPLES))
                    samples = [samples[k] for k in keep]
                for k, s in enumerate(samples):
                    c = Case(op, info, k, s)
                    c.compute_expected()
                    cases.append(c)
        out[op] = cases
    return out


# --------------------------------------------------------------------------------------------------
# the test

BUILT = sorted(kiln.op_names())


@pytest.fixture(scope="module")
def results():
    t0 = time.perf_counter()
    cases = collect_cases(BUILT)
    run_cases([c for cs in cases.values() for c in cs])
    secs = time.perf_counter() - t0
    yield cases
    if os.environ.get("KILN_WRITE_COVERAGE"):
        write_coverage(cases, secs)


def test_every_built_op_has_opinfos():
    missing = [op for op in BUILT if op not in OPINFOS and op not in NO_OPINFO]
    assert not missing, f"add these ops to OPINFOS (or NO_OPINFO with a reason): {missing}"


@pytest.mark.parametrize("op", BUILT)
def test_op_matches_eager(op, results):
    cases = results.get(op, [])
    if op in NO_OPINFO:
        pytest.skip(f"no OpInfo: {NO_OPINFO[op]}")
    counts = collections.Counter(c.status for c in cases)
    unsupported = collections.Counter(c.reason for c in cases if c.status == "unsupported")
    for reason, n in unsupported.most_common():
        print(f"{op}: {n} unsupported: {reason}")
    failed = [f"{c.describe()}\n    {c.reason}" for c in cases if c.status == "failed"]
    assert not failed, f"{op}: {len(failed)} of {len(cases)} samples failed:\n" + "\n".join(failed)
    assert counts["passed"] + counts["unsupported"] + counts["skipped"] == len(cases)
    assert counts["passed"] > 0, f"{op}: no sample ran ({dict(unsupported)})"


def write_coverage(cases: dict[str, list[Case]], secs: float):
    doc_ops = op_set_from_doc()
    lines = [
        "# Op coverage (OpInfo samples vs PyTorch eager)",
        "",
        "Generated by `KILN_WRITE_COVERAGE=1 pytest tests/python/test_opinfo.py` (do not edit by hand).",
        f"PyTorch {torch.__version__}; float32 samples of `op_db`, at most {MAX_SAMPLES} per OpInfo (a fixed "
        f"pseudo-random subset); tolerance max abs error <= {REL:g} * max|expected|; {secs:.0f} s.",
        "",
        "- **passed**: exported, ran on the portable kernels, matched eager;",
        "- **failed**: exported but the result differed or running failed (a bug; the test fails);",
        "- **unsupported**: the export or the runtime declined it, with the reason below.",
        "",
        "| op | OpInfos | passed | failed | unsupported |",
        "|---|---|---|---|---|",
    ]
    details = []
    tot = collections.Counter()
    for op in doc_ops + [o for o in sorted(cases) if o not in doc_ops]:
        if op not in cases:
            lines.append(f"| {op} | | | | not built yet |")
            continue
        cs = cases[op]
        cnt = collections.Counter(c.status for c in cs)
        tot.update(cnt)
        infos = ", ".join(f"{n}{'.' + v if v else ''}" for n, v in OPINFOS.get(op, [])) or NO_OPINFO.get(op, "")
        lines.append(f"| {op} | {infos} | {cnt['passed']} | {cnt['failed']} | {cnt['unsupported']} |")
        bad = [c for c in cs if c.status in ("failed", "unsupported", "skipped")]
        if bad:
            details.append(f"### {op}")
            details.append("")
            for status in ("failed", "unsupported", "skipped"):
                by_reason = collections.defaultdict(list)
                for c in bad:
                    if c.status == status:
                        by_reason[c.reason].append(c.label)
                for reason, labels in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
                    shown = ", ".join(labels[:6]) + (f", ... ({len(labels)} samples)" if len(labels) > 6 else "")
                    details.append(f"- {status}: {reason.replace('|', '/')} — {shown}")
            details.append("")
    lines.append(f"| **total** | | {tot['passed']} | {tot['failed']} | {tot['unsupported']} |")
    lines += ["", "## Reasons", ""] + details
    with open(os.path.join(ROOT, "docs", "op-coverage.md"), "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")

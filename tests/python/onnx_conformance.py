#!/usr/bin/env python
"""ONNX backend-test conformance of Kiln's ONNX importer + compiler + runtime.

Every test case of the ONNX backend test data (a model.onnx plus test_data_set_*/input_*.pb and
output_*.pb) is imported with the stored inputs' shapes, compiled, run on the stored inputs and
compared with the stored outputs (numpy.testing.assert_allclose semantics, rtol 1e-3, atol 1e-5;
the ONNX backend test runner's defaults are rtol 1e-3, atol 1e-7: atol is relaxed for float32
results that are exactly 0 in double-precision references). Each case is

    pass         every output matches (shape, dtype and values),
    fail         the importer, compiler or runtime returned an error other than NotSupported, or an
                 output differs,
    unsupported  the importer or compiler refused it with NotSupported (an op type with no Kiln
                 mapping, an attribute value, a dtype Kiln has no kernels for, ...): the reason is kept.

Data: node/ comes from Debian's libonnx-testdata (/usr/share/libonnx-testdata/data, ONNX 1.12,
opsets <= 17) because the onnx 1.23 wheel no longer ships it; pytorch-converted/, pytorch-operator/
and simple/ come from the installed onnx wheel (onnx/backend/test/data); node-opset18+/ holds the
node cases of opset 18 and later generated from the installed wheel's case generators
(generated_node_dir(): ~17 s once, cached under build/onnx-node-data/). Counts are reported
separately for opsets <= 17 and for the generated cases (per opset; later opsets than the
importer's kiln.onnx.opset_range() are refused and counted apart).

    python tests/python/onnx_conformance.py                 # print the summary
    python tests/python/onnx_conformance.py --write-doc     # also write docs/onnx-conformance.md
    python tests/python/onnx_conformance.py -k conv -v      # cases whose name contains "conv"
    python tests/python/onnx_conformance.py --json out.json # machine-readable results

Exit status 0 when it ran (whatever the counts); a crash of the importer or runtime kills the
process (tests/python/test_onnx_conformance.py runs this script in a subprocess for that reason).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

import kiln  # noqa: E402
import kiln.onnx  # noqa: E402

DEBIAN_DATA = "/usr/share/libonnx-testdata/data"
# TensorProto element types that are Kiln dtypes: FLOAT, UINT8, INT8, INT32, INT64, BOOL, FLOAT16, DOUBLE,
# BFLOAT16.
KILN_ONNX_TYPES = {1, 2, 3, 6, 7, 9, 10, 11, 16}
RTOL, ATOL = 1e-3, 1e-5
GEN_SUITE = "node-opset18+"
MAX_OPSET = 22  # replaced by kiln.onnx.opset_range() in main()

# Why op types without a converter are not supported (shown in the report; the default reason
# is "no mapping onto Kiln's op set yet").
UNSUPPORTED_REASONS = {
    "Scan": "control flow that is not folded (Kiln programs are static dataflow graphs; If and Loop are folded "
            "when their condition / trip count is known at import)",
    **{op: "sequence / optional values are not Kiln tensors" for op in
       ("SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength",
        "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalGetElement", "OptionalHasElement",
        "SequenceMap")},
    **{op: "string tensors are not Kiln tensors" for op in ("StringNormalizer", "TfIdfVectorizer", "RegexFullMatch",
                                                           "StringConcat", "StringSplit")},
    **{op: "data-dependent output shape (Kiln plans every size ahead of time)" for op in
       ("NonZero", "Unique", "NonMaxSuppression", "Compress")},
    **{op: "integer-arithmetic quantized ops are not in Kiln's op set yet (QuantizeLinear / DequantizeLinear "
           "are imported as float decompositions)" for op in
       ("DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger")},
    **{op: "recurrent ops are not in Kiln's op set yet" for op in ("LSTM", "GRU", "RNN")},
    **{op: "random number generators (results cannot be compared)" for op in
       ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial")},
    **{op: "no ATen op in Kiln's op set to map it onto yet" for op in
       ("BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "TopK", "Einsum", "MaxRoiPool", "RoiAlign", "MaxUnpool", "ReverseSequence", "Det",
        "DFT", "STFT", "MelWeightMatrix", "DeformConv")},
}


# Why known failures fail (checked by hand; shown next to the case in the report).
FAIL_NOTES = {
    "test_cast_FLOAT_to_BFLOAT16": "ONNX 1.12's test data truncates float32 to bfloat16 (every expected value "
                                   "equals the top 16 bits); Kiln rounds to nearest even as PyTorch does, and as "
                                   "the reference implementation of the installed onnx 1.23 (ml_dtypes) does "
                                   "(5 of 12 values differ by 1 ulp)",
}


# Node cases generated from the installed onnx wheel's case generators (onnx/backend/test/case/node)
# for models of these opsets: the Debian data stops at opset 17 (ONNX 1.12).
GEN_MIN_OPSET = 18


def model_opset(model) -> int:
    """The model's default-domain opset (0 when it imports none)."""
    return max([o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] or [0])


def generated_node_dir() -> str | None:
    """Node test data for opsets >= GEN_MIN_OPSET, generated once from the onnx wheel's case
    generators into build/onnx-node-data/onnx-<version>/node (KILN_ONNX_GEN_DATA overrides the
    folder). `python -m onnx.backend.test.cmd_tools generate-data` writes no node/ folder with
    onnx 1.23: its generate_data() collects only onnx.backend.test.case.model's cases (the 'real'
    models, written as data.json download stubs), never onnx.backend.test.case.node's. So the
    node cases are collected here (node.collect_testcases(), ~17 s) and handed to that same
    generate_data() writer, which writes model.onnx and test_data_set_0/{input,output}_*.pb as
    upstream's data does. None when the generators cannot run."""
    import onnx
    root = os.environ.get("KILN_ONNX_GEN_DATA",
                          os.path.join(ROOT, "build", "onnx-node-data", f"onnx-{onnx.__version__}"))
    node = os.path.join(root, "node")
    if os.path.isdir(node):
        return node
    import shutil
    import tempfile
    import types
    import warnings
    try:
        import onnx.backend.test.case.node as node_cases
        import onnx.backend.test.cmd_tools as cmd_tools
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            selected = [c for c in node_cases.collect_testcases() if model_opset(c.model) >= GEN_MIN_OPSET]
            os.makedirs(os.path.dirname(root), exist_ok=True)
            tmp = tempfile.mkdtemp(dir=os.path.dirname(root), prefix=".gen-")
            real = cmd_tools.model_test
            cmd_tools.model_test = types.SimpleNamespace(collect_testcases=lambda: selected)
            try:
                cmd_tools.generate_data(argparse.Namespace(output=tmp))
            finally:
                cmd_tools.model_test = real
        if os.path.isdir(node):  # generated meanwhile by another process
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.makedirs(root, exist_ok=True)
            os.rename(os.path.join(tmp, "node"), node)
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception as e:  # noqa: BLE001
        print(f"cannot generate ONNX node test data for opsets >= {GEN_MIN_OPSET}: {e}", file=sys.stderr)
        return None
    return node


def suites() -> list[tuple[str, str]]:
    """(suite name, directory) of every test-data directory found."""
    out = []
    node = os.environ.get("KILN_ONNX_NODE_DATA", os.path.join(DEBIAN_DATA, "node"))
    if os.path.isdir(node):
        out.append(("node", node))
    gen = generated_node_dir()
    if gen:
        out.append((GEN_SUITE, gen))
    import onnx
    wheel = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    for name in ("pytorch-converted", "pytorch-operator", "simple"):
        d = os.path.join(wheel, name)
        if os.path.isdir(d):
            out.append((name, d))
    return out


def cases(selected: str | None = None) -> list[tuple[str, str]]:
    out = []
    for suite, d in suites():
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            if os.path.isfile(os.path.join(path, "model.onnx")) and (not selected or selected in name):
                out.append((suite, path))
    return out


class Unsupported(Exception):
    pass


def read_pb(path: str):
    """A stored input/output: a TensorProto as a NumPy array; Unsupported for sequences/optionals."""
    import onnx
    from onnx import numpy_helper
    data = open(path, "rb").read()
    t = onnx.TensorProto()
    try:
        t.ParseFromString(data)
    except Exception:  # noqa: BLE001
        t = None
    if t is None or not t.HasField("data_type") or t.data_type == 0:
        raise Unsupported("non-tensor (sequence / optional) inputs or outputs")
    try:
        return numpy_helper.to_array(t)
    except Exception:  # noqa: BLE001  (a SequenceProto / OptionalProto that parsed as a TensorProto)
        raise Unsupported("non-tensor (sequence / optional) inputs or outputs") from None


def short_reason(msg: str) -> str:
    """The importer's message without the model path and node name/index: '<Op>: <what>'."""
    msg = msg.split("\n")[0]
    msg = re.sub(r"^\w+: ", "", msg)  # error code
    msg = re.sub(r"^\S+\.onnx: ", "", msg)  # path
    msg = re.sub(r"node '[^']*' \(#\d+, (\w+)\): ", r"\1: ", msg)
    msg = re.sub(r"\(at [^)]*\)", "", msg)
    msg = re.sub(r"constant '[^']*'", "constant", msg)
    return msg.strip()


def run_case(suite: str, path: str, supported: set) -> dict:
    import onnx
    name = os.path.basename(path)
    rec = {"suite": suite, "name": name, "status": "fail", "reason": "", "ops": []}
    try:
        model = onnx.load(os.path.join(path, "model.onnx"), load_external_data=False)
    except Exception as e:  # noqa: BLE001
        rec["reason"] = f"onnx.load: {e}"
        return rec
    ops = sorted({(n.domain + ":" if n.domain not in ("", "ai.onnx") else "") + n.op_type for n in model.graph.node})
    rec["ops"] = ops
    rec["opset"] = model_opset(model)
    if rec["opset"] > MAX_OPSET:
        rec["status"] = "unsupported"
        rec["reason"] = f"opset {rec['opset']} is outside the supported range 1..{MAX_OPSET}"
        return rec
    missing = [op for op in ops if op not in supported]
    if missing:
        rec["status"] = "unsupported"
        rec["reason"] = "op type " + ", ".join(missing) + " not supported"
        return rec
    inits = {t.name for t in model.graph.initializer}
    in_names = [i.name for i in model.graph.input if i.name not in inits]
    declared = [(i.name, i.type.tensor_type.elem_type if i.type.HasField("tensor_type") else 0)
                for i in list(model.graph.input) + list(model.graph.output) if i.name not in inits]
    bad = sorted({onnx.TensorProto.DataType.Name(t) if t else "non-tensor" for _, t in declared
                  if t not in KILN_ONNX_TYPES})
    rec["kiln_dtypes"] = not bad
    out_bf16 = [o.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16 for o in model.graph.output]
    sets = sorted(glob.glob(os.path.join(path, "test_data_set_*")))
    if not sets:
        rec["reason"] = "no test data"
        return rec
    try:
        for ds in sets:
            ins = [read_pb(p) for p in sorted(glob.glob(os.path.join(ds, "input_*.pb")),
                                              key=lambda p: int(re.findall(r"(\d+)\.pb$", p)[0]))]
            outs = [read_pb(p) for p in sorted(glob.glob(os.path.join(ds, "output_*.pb")),
                                               key=lambda p: int(re.findall(r"(\d+)\.pb$", p)[0]))]
            if len(ins) != len(in_names):
                rec["reason"] = f"{len(ins)} stored inputs for {len(in_names)} graph inputs"
                return rec
            if bad:
                raise Unsupported("element type " + ", ".join(bad) + " is not a Kiln dtype")
            for (n, t), a in zip(declared, ins):
                dims = model.graph.input[[i.name for i in model.graph.input].index(n)].type.tensor_type.shape.dim
                want = [d.dim_value if d.HasField("dim_value") else None for d in dims]
                if dims and (len(want) != a.ndim or any(w is not None and w != g for w, g in zip(want, a.shape))):
                    rec["status"] = "invalid"
                    rec["reason"] = f"test data: stored input '{n}' of shape {list(a.shape)} contradicts the " \
                                    f"model's declared shape {want}"
                    return rec
            shapes = {n: list(a.shape) for n, a in zip(in_names, ins)}
            frozen = {}
            try:
                try:
                    graph, info = kiln.onnx.import_onnx(os.path.join(path, "model.onnx"), shapes)
                except kiln.KilnError as e:
                    if "must be a constant" not in e.args[0]:
                        raise
                    # The test feeds a shape / axes / scales / indices / bound as a graph input: bind the
                    # small (rank <= 1) and the integer inputs to their stored values and import again.
                    frozen = {n: a for n, a in zip(in_names, ins) if a.ndim <= 1 or a.dtype.kind in "iu"}
                    rec["note"] = "bound as constants: " + ", ".join(frozen)
                    graph, info = kiln.onnx.import_onnx(os.path.join(path, "model.onnx"),
                                                        {n: s for n, s in shapes.items() if n not in frozen},
                                                        constant_inputs=frozen)
                pb = kiln.ProgramBuilder()
                pb.add_method("forward", graph)
                data, _ = pb.compile()
                prog = kiln.load_bytes(data)
            except kiln.KilnError as e:
                code = e.args[1] if len(e.args) > 1 else ""
                if code == "NotSupported" or code == "OperatorMissing":
                    raise Unsupported(short_reason(e.args[0]))
                rec["reason"] = f"{code}: {short_reason(e.args[0])}"
                return rec
            try:
                got = prog.run(*[a for n, a in zip(in_names, ins) if n not in frozen])
            except kiln.KilnError as e:
                code = e.args[1] if len(e.args) > 1 else ""
                if code == "NotSupported" or code == "OperatorMissing":
                    raise Unsupported("run: " + short_reason(e.args[0]))
                rec["reason"] = f"run: {code}: {short_reason(e.args[0])}"
                return rec
            if len(got) != len(outs):
                rec["reason"] = f"{len(got)} outputs, expected {len(outs)}"
                return rec
            for i, (g, w) in enumerate(zip(got, outs)):
                if g.shape != w.shape:
                    rec["reason"] = f"output {i}: shape {g.shape}, expected {w.shape}"
                    return rec
                if i < len(out_bf16) and out_bf16[i]:  # bfloat16: bit patterns as uint16 on both sides
                    w = w.view(np.uint16) if w.dtype.itemsize == 2 else w
                if g.dtype != w.dtype:
                    rec["reason"] = f"output {i}: dtype {g.dtype}, expected {w.dtype}"
                    return rec
                if w.dtype.kind == "f":
                    ok = np.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True)
                else:
                    ok = np.array_equal(g, w)
                if not ok:
                    diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
                    rec["reason"] = f"output {i}: max abs diff {np.nanmax(diff):.3g} (max |expected| " \
                                    f"{np.nanmax(np.abs(w.astype(np.float64))) if w.size else 0:.3g})"
                    return rec
    except Unsupported as e:
        rec["status"] = "unsupported"
        rec["reason"] = str(e)
        return rec
    rec["status"] = "pass"
    return rec


def summarize(results: list[dict], supported: set) -> dict:
    by_status = collections.Counter(r["status"] for r in results)
    op_cases = [r for r in results if r["ops"] and all(op in supported for op in r["ops"]) and r["status"] != "invalid"]
    op_pass = sum(r["status"] == "pass" for r in op_cases)
    dt_cases = [r for r in op_cases if r.get("kiln_dtypes")]
    dt_pass = sum(r["status"] == "pass" for r in dt_cases)
    imported = [r for r in results if r["status"] in ("pass", "fail")]
    return {
        "cases": len(results),
        "pass": by_status["pass"], "fail": by_status["fail"], "unsupported": by_status["unsupported"],
        "invalid": by_status["invalid"],
        "supported_op_cases": len(op_cases), "supported_op_pass": op_pass,
        "supported_op_pass_rate": op_pass / len(op_cases) if op_cases else 0.0,
        "attempted_pass_rate": by_status["pass"] / len(imported) if imported else 0.0,
        "kiln_dtype_cases": len(dt_cases), "kiln_dtype_pass": dt_pass,
        "kiln_dtype_pass_rate": dt_pass / len(dt_cases) if dt_cases else 0.0,
    }


def per_op(results: list[dict]) -> dict:
    table = collections.defaultdict(lambda: {"cases": 0, "pass": 0, "fail": 0, "unsupported": 0, "invalid": 0,
                                             "reasons": collections.Counter()})
    for r in results:
        for op in r["ops"] or ["(none)"]:
            t = table[op]
            t["cases"] += 1
            t[r["status"]] += 1
            if r["status"] != "pass":
                t["reasons"][r["reason"]] += 1
    return table


def split_results(results: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """(Debian node + wheel suites, generated opset-18+ cases within the importer's range, generated
    cases of later opsets, which the importer refuses)."""
    base = [r for r in results if r["suite"] != GEN_SUITE]
    gen = [r for r in results if r["suite"] == GEN_SUITE]
    return base, [r for r in gen if r.get("opset", 0) <= MAX_OPSET], [r for r in gen if r.get("opset", 0) > MAX_OPSET]


def rate_line(label: str, s: dict) -> str:
    return (f"| {label} | {s['cases']} | {s['pass']} | {s['fail']} | {s['unsupported']} | "
            f"{s['supported_op_pass']}/{s['supported_op_cases']} ({100 * s['supported_op_pass_rate']:.1f}%) | "
            f"{s['kiln_dtype_pass']}/{s['kiln_dtype_cases']} ({100 * s['kiln_dtype_pass_rate']:.1f}%) | "
            f"{100 * s['attempted_pass_rate']:.1f}% |")


def write_doc(path: str, results: list[dict], summary: dict, supported: set, seconds: float):
    all_results = results
    results, gen_in, gen_out = split_results(all_results)
    import onnx
    table = per_op(results + gen_in)
    lines = [
        "# ONNX conformance",
        "",
        "Generated by `python tests/python/onnx_conformance.py --write-doc` (run in CI by "
        "`tests/python/test_onnx_conformance.py`, which prints these counts and fails below 95%).",
        "",
        "Every case of the ONNX backend test data is imported by Kiln's ONNX importer "
        "(`src/frontends/onnx`) with the stored inputs' shapes, compiled (default passes, Kiln's CPU "
        "kernels), run on the stored inputs and compared with the stored outputs "
        f"(`numpy.allclose`, rtol {RTOL:g}, atol {ATOL:g}; integer and bool outputs exactly; shapes and "
        "dtypes must match).",
        "",
        "Test data: `node/` from Debian's `libonnx-testdata` (ONNX 1.12, opsets up to 17; "
        "`/usr/share/libonnx-testdata/data/node`) because the onnx 1.23 wheel no longer ships it; "
        "`pytorch-converted/`, `pytorch-operator/` and `simple/` from the installed onnx wheel "
        "(`onnx/backend/test/data`); for opsets 18 and later, `node-opset18+/`: the node cases "
        f"generated from the installed onnx {onnx.__version__} wheel's case generators "
        "(`onnx/backend/test/case/node`, each model at its op's latest opset) into "
        "`build/onnx-node-data/` at the first run (section 'Opsets 18 and later').",
        "",
        f"The importer accepts opsets {kiln.onnx.opset_range()[0]}..{MAX_OPSET} (`kiln.onnx.opset_range()`).",
        "",
        "## Summary (opsets up to 17: Debian's node data and the wheel's model suites)",
        "",
        f"- cases: {summary['cases']} — pass {summary['pass']}, fail {summary['fail']}, "
        f"unsupported {summary['unsupported']}, invalid test data {summary['invalid']} ({seconds:.0f} s)",
        f"- cases whose op types all have a Kiln mapping: {summary['supported_op_cases']}, of which "
        f"{summary['supported_op_pass']} pass (**{100 * summary['supported_op_pass_rate']:.1f}%**); the others are "
        "refused with NotSupported (an element type that is not a Kiln dtype, random training-mode "
        "ops, ...) or fail, as listed below",
        f"- of those, the cases whose inputs and outputs are all Kiln dtypes (float32, float16, bfloat16, float64, "
        f"int64, int32, int8, uint8, bool; not int16, uint16/32/64, string): {summary['kiln_dtype_cases']}, of which "
        f"{summary['kiln_dtype_pass']} pass (**{100 * summary['kiln_dtype_pass_rate']:.1f}%**)",
        f"- pass rate among the cases Kiln accepted (imported and compiled): "
        f"**{100 * summary['attempted_pass_rate']:.1f}%**",
        "- no case crashed the importer, compiler or runtime (the CI test runs the suite in a subprocess); "
        "'invalid test data' are cases whose stored inputs contradict the model's declared shapes",
        "",
        "Per suite:",
        "",
        "| suite | cases | pass | fail | unsupported | invalid test data |",
        "|---|---|---|---|---|---|",
    ]
    for suite in sorted({r["suite"] for r in results}):
        rs = [r for r in results if r["suite"] == suite]
        c = collections.Counter(r["status"] for r in rs)
        lines.append(f"| {suite} | {len(rs)} | {c['pass']} | {c['fail']} | {c['unsupported']} | {c['invalid']} |")
    g = summarize(gen_in, supported)
    by_opset = collections.Counter(r.get("opset", 0) for r in gen_in + gen_out)
    lines += [
        "",
        "## Opsets 18 and later (generated node test data)",
        "",
        f"The onnx {onnx.__version__} wheel's node case generators give {len(gen_in) + len(gen_out)} cases whose model "
        f"imports opset 18 or later (cases per opset: "
        + ", ".join(f"{o}: {n}" for o, n in sorted(by_opset.items())) + "). "
        "`python -m onnx.backend.test.cmd_tools generate-data` writes no `node/` folder with this wheel: its "
        "`generate_data()` collects only `onnx.backend.test.case.model`'s cases (the 'real' models, written as "
        "`data.json` download stubs), never `onnx.backend.test.case.node`'s; `onnx_conformance.py` collects the "
        "node cases itself and hands them to that same writer. The generators' expected outputs come from "
        "onnx's reference implementation (`onnx.reference`).",
        "",
        f"Within the importer's range (opsets 18..{MAX_OPSET}): {len(gen_in)} cases "
        f"({summary_seconds_note(gen_in)}); the {len(gen_out)} cases of opsets {MAX_OPSET + 1} and later are refused "
        f"(NotSupported: 'opset N is outside the supported range 1..{MAX_OPSET}') and not counted below.",
        "",
        "| opsets | cases | pass | fail | unsupported | op types mapped: pass | and Kiln dtypes: pass | accepted: pass |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in range(GEN_MIN_OPSET, MAX_OPSET + 1):
        lines.append(rate_line(str(o), summarize([r for r in gen_in if r.get("opset") == o], supported)))
    lines.append(rate_line(f"**18–21**", summarize([r for r in gen_in if r.get("opset", 0) <= 21], supported)))
    lines.append(rate_line(f"**18–{MAX_OPSET}**", g))
    lines.append(rate_line("(≤17, above)", summary))
    lines += [
        "",
        "Columns: 'op types mapped' counts the cases whose op types all have a Kiln mapping (the others name an op "
        "the importer has no mapping for, listed under 'Unsupported op types'); 'and Kiln dtypes' those of them "
        "whose inputs and outputs are all Kiln dtypes; 'accepted' the cases Kiln imported and compiled.",
    ]
    lines += ["", "## Per op type (supported)", "",
              "A case counts under every op type its model uses (all suites, generated cases up to opset "
              f"{MAX_OPSET}). Reasons are the importer's, compiler's or comparison's messages (most frequent first).", "",
              "| op type | cases | pass | fail | unsupported | reasons (not pass) |", "|---|---|---|---|---|---|"]
    for op in sorted(o for o in table if o in supported):
        t = table[op]
        reasons = "; ".join(f"{k} (x{v})" if v > 1 else k for k, v in t["reasons"].most_common(4))
        reasons = reasons.replace("|", "\\|")
        if len(t["reasons"]) > 4:
            reasons += f"; ... ({len(t['reasons']) - 4} more)"
        lines.append(f"| {op} | {t['cases']} | {t['pass']} | {t['fail']} | {t['unsupported']} | {reasons} |")
    lines += ["", "## Unsupported op types", "",
              "Op types in the test data that the importer does not map onto Kiln's op set, with the reason.", "",
              "| op type | cases | reason |", "|---|---|---|"]
    for op in sorted(o for o in table if o not in supported):
        reason = UNSUPPORTED_REASONS.get(op.split(":")[-1], "no mapping onto Kiln's op set yet")
        if ":" in op:
            reason = "op domain " + op.split(":")[0] + " (only the default ONNX domain)"
        lines.append(f"| {op} | {table[op]['cases']} | {reason} |")
    lines += ["", "## Failing cases and invalid test data", ""]
    fails = [r for r in results + gen_in if r["status"] in ("fail", "invalid")]
    if not fails:
        lines.append("None.")
    for r in fails:
        note = f" — {FAIL_NOTES[r['name']]}" if r["name"] in FAIL_NOTES else ""
        lines.append(f"- {r['status']}: `{r['suite']}/{r['name']}` ({', '.join(r['ops'])}): {r['reason']}{note}")
    lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def summary_seconds_note(rs: list[dict]) -> str:
    c = collections.Counter(r["status"] for r in rs)
    return f"pass {c['pass']}, fail {c['fail']}, unsupported {c['unsupported']}, invalid test data {c['invalid']}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-k", metavar="TEXT", help="only cases whose name contains TEXT")
    p.add_argument("-v", "--verbose", action="store_true", help="print every case that does not pass")
    p.add_argument("--write-doc", action="store_true", help="write docs/onnx-conformance.md")
    p.add_argument("--json", metavar="PATH", help="write the results and summary as JSON")
    args = p.parse_args(argv)
    if not kiln.onnx.available():
        print("Kiln was built without the ONNX importer", file=sys.stderr)
        return 2
    supported = set(kiln.onnx.supported_ops())
    global MAX_OPSET
    MAX_OPSET = kiln.onnx.opset_range()[1]
    t0 = time.perf_counter()
    results = []
    for suite, path in cases(args.k):
        r = run_case(suite, path, supported)
        results.append(r)
        if args.verbose and r["status"] != "pass":
            print(f"{r['status']:11s} {suite}/{r['name']}: {r['reason']}", flush=True)
    secs = time.perf_counter() - t0
    base, gen_in, gen_out = split_results(results)
    s = summarize(base, supported)
    g = summarize(gen_in, supported)
    print(f"ONNX conformance: {s['cases']} cases: pass {s['pass']}, fail {s['fail']}, unsupported {s['unsupported']}, "
          f"invalid test data {s['invalid']}; "
          f"cases with supported op types: {s['supported_op_pass']}/{s['supported_op_cases']} pass "
          f"({100 * s['supported_op_pass_rate']:.1f}%), of those with Kiln dtypes only: {s['kiln_dtype_pass']}/"
          f"{s['kiln_dtype_cases']} ({100 * s['kiln_dtype_pass_rate']:.1f}%); accepted cases: "
          f"{100 * s['attempted_pass_rate']:.1f}% pass "
          f"({secs:.1f} s)")
    if gen_in or gen_out:
        print(f"ONNX conformance, generated node cases of opsets {GEN_MIN_OPSET}..{MAX_OPSET}: {g['cases']} cases: "
              f"pass {g['pass']}, fail {g['fail']}, unsupported {g['unsupported']}; cases with supported op types: "
              f"{g['supported_op_pass']}/{g['supported_op_cases']} pass ({100 * g['supported_op_pass_rate']:.1f}%), "
              f"of those with Kiln dtypes only: {g['kiln_dtype_pass']}/{g['kiln_dtype_cases']} "
              f"({100 * g['kiln_dtype_pass_rate']:.1f}%); accepted cases: {100 * g['attempted_pass_rate']:.1f}% pass; "
              f"{len(gen_out)} cases of later opsets refused")
    if args.write_doc:
        write_doc(os.path.join(ROOT, "docs", "onnx-conformance.md"), results, s, supported, secs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": s, "opset18": g, "max_opset": MAX_OPSET, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

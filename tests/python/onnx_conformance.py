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
and simple/ come from the installed onnx wheel (onnx/backend/test/data).

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

# Why op types without a converter are not supported (shown in the report; the default reason
# is "no mapping onto Kiln's op set yet").
UNSUPPORTED_REASONS = {
    **{op: "control flow with subgraphs (Kiln programs are static dataflow graphs)" for op in
       ("If", "Loop", "Scan")},
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
       ("Acos", "Asin", "Atan", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "TopK", "Einsum", "MaxRoiPool", "RoiAlign", "MaxUnpool", "ReverseSequence", "Det",
        "GridSample", "DFT", "STFT", "MelWeightMatrix", "Col2Im", "CenterCropPad", "GroupNormalization")},
}


# Why known failures fail (checked by hand; shown next to the case in the report).
FAIL_NOTES = {
    "test_cast_FLOAT_to_BFLOAT16": "ONNX 1.12's test data truncates float32 to bfloat16 (every expected value "
                                   "equals the top 16 bits); Kiln rounds to nearest even as PyTorch does, and as "
                                   "the reference implementation of the installed onnx 1.23 (ml_dtypes) does "
                                   "(5 of 12 values differ by 1 ulp)",
}


def suites() -> list[tuple[str, str]]:
    """(suite name, directory) of every test-data directory found."""
    out = []
    node = os.environ.get("KILN_ONNX_NODE_DATA", os.path.join(DEBIAN_DATA, "node"))
    if os.path.isdir(node):
        out.append(("node", node))
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


def write_doc(path: str, results: list[dict], summary: dict, supported: set, seconds: float):
    table = per_op(results)
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
        "(`onnx/backend/test/data`).",
        "",
        "## Summary",
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
    lines += ["", "## Per op type (supported)", "",
              "A case counts under every op type its model uses. Reasons are the importer's, compiler's or "
              "comparison's messages (most frequent first).", "",
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
    fails = [r for r in results if r["status"] in ("fail", "invalid")]
    if not fails:
        lines.append("None.")
    for r in fails:
        note = f" — {FAIL_NOTES[r['name']]}" if r["name"] in FAIL_NOTES else ""
        lines.append(f"- {r['status']}: `{r['suite']}/{r['name']}` ({', '.join(r['ops'])}): {r['reason']}{note}")
    lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


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
    t0 = time.perf_counter()
    results = []
    for suite, path in cases(args.k):
        r = run_case(suite, path, supported)
        results.append(r)
        if args.verbose and r["status"] != "pass":
            print(f"{r['status']:11s} {suite}/{r['name']}: {r['reason']}", flush=True)
    secs = time.perf_counter() - t0
    s = summarize(results, supported)
    print(f"ONNX conformance: {s['cases']} cases: pass {s['pass']}, fail {s['fail']}, unsupported {s['unsupported']}, "
          f"invalid test data {s['invalid']}; "
          f"cases with supported op types: {s['supported_op_pass']}/{s['supported_op_cases']} pass "
          f"({100 * s['supported_op_pass_rate']:.1f}%), of those with Kiln dtypes only: {s['kiln_dtype_pass']}/"
          f"{s['kiln_dtype_cases']} ({100 * s['kiln_dtype_pass_rate']:.1f}%); accepted cases: "
          f"{100 * s['attempted_pass_rate']:.1f}% pass "
          f"({secs:.1f} s)")
    if args.write_doc:
        write_doc(os.path.join(ROOT, "docs", "onnx-conformance.md"), results, s, supported, secs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": s, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ONNX backend-test conformance suite (tests/python/onnx_conformance.py) over every case of the
ONNX test data: run in a subprocess (a crash of the importer or runtime fails this test instead of
the whole run), counts printed, and:
  - every case ends as pass / fail / unsupported (with its reason) / invalid test data;
  - >= 95% of the cases whose op types Kiln maps and whose tensors are Kiln dtypes pass;
  - >= 95% of the cases Kiln accepts (imports and compiles) pass;
  - >= 90% of the cases whose op types Kiln maps pass (a regression floor: the rest are refused
    for dtypes such as double, strings and random training-mode ops; docs/onnx-conformance.md)."""
import json
import os
import subprocess
import sys

import pytest

import kiln.onnx

HERE = os.path.dirname(os.path.abspath(__file__))

if not kiln.onnx.available():
    pytest.skip("Kiln built without the ONNX importer", allow_module_level=True)
pytest.importorskip("onnx")


def test_onnx_conformance(tmp_path, capsys):
    out = os.path.join(tmp_path, "conformance.json")
    r = subprocess.run([sys.executable, os.path.join(HERE, "onnx_conformance.py"), "--json", out],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"the conformance run crashed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    data = json.load(open(out))
    s, results = data["summary"], data["results"]
    with capsys.disabled():
        print("\n" + r.stdout.strip().splitlines()[-1])
    if s["cases"] == 0:
        pytest.skip("no ONNX backend test data found (libonnx-testdata / onnx wheel)")
    assert all(x["status"] in ("pass", "fail", "unsupported", "invalid") for x in results)
    assert all(x["reason"] for x in results if x["status"] != "pass"), "every non-pass case has a reason"
    fails = [f"{x['suite']}/{x['name']}: {x['reason']}" for x in results if x["status"] == "fail"]
    assert s["kiln_dtype_pass_rate"] >= 0.95, f"{s}\nfailing:\n" + "\n".join(fails)
    assert s["attempted_pass_rate"] >= 0.95, f"{s}\nfailing:\n" + "\n".join(fails)
    assert s["supported_op_pass_rate"] >= 0.90, s  # 92.4% at the time of writing

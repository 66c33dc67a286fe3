"""docs/op-set.md's core ATen table is current, and every op PyTorch tags core is either in Kiln
(an op of its set or a capture mapping) or outside its scope with one of the issue's reasons
(tools/core_aten_table.py builds the table from torch.Tag.core and kiln.op_names())."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import core_aten_table  # noqa: E402

import kiln  # noqa: E402


def test_every_core_op_is_covered_or_has_a_reason():
    _, unexplained = core_aten_table.build_table()
    assert not unexplained, f"core ATen ops with neither a Kiln op nor a reason: {unexplained}"


def test_reasons_are_the_issue_categories_and_not_kiln_ops():
    allowed = {core_aten_table.BACKWARD, core_aten_table.RNG, core_aten_table.DATA_DEPENDENT,
               core_aten_table.SYMBOLIC, core_aten_table.COMPLEX, core_aten_table.IN_PLACE}
    assert set(core_aten_table.MISSING.values()) <= allowed
    ops = set(kiln.op_names())
    stale = [n for n in list(core_aten_table.MISSING) + list(core_aten_table.CAPTURED) if f"aten.{n}" in ops]
    assert not stale, f"listed as missing or captured but now Kiln ops: {stale}"


def test_doc_table_is_current():
    table, _ = core_aten_table.build_table()
    with open(core_aten_table.DOC, encoding="utf-8") as f:
        assert table in f.read(), "docs/op-set.md is out of date: run PYTHONPATH=python python tools/core_aten_table.py"

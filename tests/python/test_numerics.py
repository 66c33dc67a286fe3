"""Differential numerics across backends (issue 22): every op of tests/python/numerics_harness.py,
on every available backend, over adversarial input distributions, against the float64 reference
from the op's definition, within numerics_harness.TOLERANCES. A disagreement fails unless it is a
documented difference (numerics_harness.DOCUMENTED) or a PENDING fix of another branch.

CI runs a subset (two shapes per op, one on mlx, edge shapes on one distribution);
KILN_NUMERICS_FULL=1 runs every shape on every distribution and also fails on PENDING entries
that no longer occur. docs/numerics.md (tools/numerics_report.py) is checked for being current.
"""
import math
import os
import sys

import numpy as np
import pytest

import numerics_harness as h

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import numerics_report  # noqa: E402

FULL = os.environ.get("KILN_NUMERICS_FULL", "") == "1"


@pytest.mark.parametrize("name", [c.name for c in h.CASES])
def test_op_agrees_with_the_math_on_every_backend(name):
    case = h.CASE_BY_NAME[name]
    records = h.sweep([case], full=FULL)
    compared = [r for r in records if r.status == "ok"]
    assert any(r.backend == "portable" for r in compared), f"{name}: nothing compared on the portable kernels"
    failed = [str(r) for r in records if r.failed]
    assert not failed, f"{name}: {len(failed)} disagreements with the float64 reference:\n" + "\n".join(failed[:30])
    if FULL:  # a PENDING entry that no longer occurs anywhere has been fixed: remove it
        stale = [p for p in h.PENDING if any(p.matches(name, r.backend, r.dist, r.precision, r.shape) for r in records)
                 and not any(r.pending is p for r in records)]
        assert not stale, f"{name}: fixed, remove from numerics_harness.PENDING: " + \
            "; ".join(f"{p.case} {p.backend} {p.dist}" for p in stale)


# ---------------------------------------------------------------- the tables


def test_tolerance_table_covers_every_op_and_says_why_it_is_looser():
    assert set(h.TOLERANCES) == set(h.CASE_BY_NAME)
    assert (h.DEFAULT_TOL.float32, h.DEFAULT_TOL.float16, h.DEFAULT_TOL.bfloat16) == (1e-5, 1e-3, 1e-2)
    for name, t in h.TOLERANCES.items():
        looser = any(t.of(p) > h.DEFAULT_TOL.of(p) for p in ("float32", "float16", "bfloat16"))
        assert not looser or t.why.strip(), f"{name}: a tolerance looser than {h.DEFAULT_TOL} needs its reason"


@pytest.mark.parametrize("table", ["DOCUMENTED", "PENDING"])
def test_every_listed_difference_names_a_case_a_backend_and_a_distribution(table):
    names = list(h.CASE_BY_NAME)
    bks = ["portable", "cpu", "xnnpack", "mlx"]
    for d in getattr(h, table):
        assert d.why.strip() and d.kind in ("specials", "error", "any"), d
        assert any(h.fnmatch.fnmatchcase(n, d.case) for n in names), f"{d.case}: no such case"
        assert any(h.fnmatch.fnmatchcase(b, d.backend) for b in bks), f"{d.backend}: no such backend"
        assert any(h.fnmatch.fnmatchcase(n, d.dist) for n in h.DISTRIBUTIONS), f"{d.dist}: no such distribution"


def test_every_case_runs_each_family_of_adversarial_inputs():
    for c in h.CASES:
        assert set(c.dists) <= set(h.DISTRIBUTIONS), c.name
        assert "special" in c.dists and "normal" in c.dists, c.name
        assert any(int(np.prod(s)) <= 1 for s in c.shapes), f"{c.name}: no 1-element or empty shape"
        assert any(int(np.prod(s)) > 16 for s in c.shapes), f"{c.name}: no larger shape"
    for c in h.CASES:
        if c.name.endswith("norm") or c.name.startswith(("softmax", "var")):
            assert "offset" in c.dists, f"{c.name}: no large mean against small spread"


def test_distributions_are_seeded_and_what_they_say():
    rng = lambda: np.random.default_rng(h.seed_of("x"))  # noqa: E731
    a = h.DISTRIBUTIONS["offset"].gen(rng(), (4096,))
    assert np.array_equal(a, h.DISTRIBUTIONS["offset"].gen(rng(), (4096,)))
    assert abs(a.mean() - 1000) < 0.01 and 0.005 < a.std() < 0.02
    d = h.round_to(h.DISTRIBUTIONS["denormal"].gen(rng(), (4096,)), "float32")
    assert (np.abs(d[d != 0]) < h.F32_TINY).all() and np.count_nonzero(d) > 4000
    s = h.DISTRIBUTIONS["special"].gen(rng(), (1023,))
    assert np.isnan(s).any() and (s == np.inf).any() and (s == -np.inf).any() and np.isfinite(s).mean() > 0.7
    assert h.round_to(np.array([1 + 2 ** -9]), "bfloat16")[0] == 1.0  # bfloat16 keeps 8 bits
    assert h.round_to(np.array([1 + 2 ** -9]), "float16")[0] == 1 + 2 ** -9


# ---------------------------------------------------------------- the comparison can fail


def test_compare_measures_error_relative_to_the_outputs_magnitude():
    ref = np.array([1000.0, -2.0, 0.5])
    err, special = h.compare(np.array([1000.01, -2.0, 0.5], np.float32), ref, 1e-5)
    assert special == "" and math.isclose(err, 0.01 / 1000, rel_tol=1e-2)


def test_compare_requires_nan_and_inf_at_the_references_positions():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0])
    assert h.compare(np.array([np.nan, np.inf, -np.inf, 1.0], np.float32), ref, 1e-5) == (0.0, "")
    _, special = h.compare(np.array([-np.inf, np.inf, -np.inf, 1.0], np.float32), ref, 1e-5)
    assert "NaN positions" in special and "-inf positions" in special
    _, special = h.compare(np.array([np.nan, 3e38, -np.inf, 1.0], np.float32), ref, 1e-5)
    assert "+inf positions" in special
    _, special = h.compare(np.array([np.nan, np.inf, -np.inf, np.inf], np.float32), ref, 1e-5)
    assert "+inf positions" in special  # inf where the reference is finite


def test_compare_allows_overflow_only_beyond_the_formats_largest_value():
    assert h.compare(np.array([np.inf], np.float32), np.array([3.4028235e38 * (1 + 1e-7)]), 1e-5)[1] == ""
    assert h.compare(np.array([np.inf], np.float32), np.array([3.0e38]), 1e-5)[1] != ""
    assert h.compare(np.array([np.inf], np.float32), np.array([1e5]), 1e-3, "float16")[1] == ""
    assert h.compare(np.array([np.inf], np.float32), np.array([6e4]), 1e-3, "float16")[1] != ""


def test_compare_checks_shapes_and_empty_outputs():
    assert h.compare(np.zeros((2, 0), np.float32), np.zeros((2, 0)), 1e-5) == (0.0, "")
    err, special = h.compare(np.zeros((0, 2), np.float32), np.zeros((2, 0)), 1e-5)
    assert err == math.inf and "shape" in special
    assert "shape" in h.compare(np.zeros((), np.float32), np.zeros((1,)), 1e-5)[1]


def test_a_wrong_kernel_is_a_failed_record():
    # The harness fails a backend that is wrong: a reference off by 1e-4 relative must show as a
    # disagreement on every backend (nothing documents it).
    case = h.CASE_BY_NAME["exp"]
    wrong = h.dataclasses.replace(case, ref=lambda x, s: np.exp(x) * (1 + 1e-4))
    recs = [h.run_one(wrong, b, (17,), "normal") for b in h.backends() if b.precision == "float32"]
    assert recs and all(r.failed for r in recs if r.status == "ok"), [str(r) for r in recs]


# ---------------------------------------------------------------- docs/numerics.md


def test_docs_numerics_is_current():
    """The tables of docs/numerics.md that come from the harness (distributions, shapes, tolerances,
    documented and pending differences) are what numerics_report renders now, and its measured
    table has a row per op and a column per backend with every worst error within tolerance. The
    measured figures themselves are not compared: they change with the CPU (XNNPACK and MLX choose
    their kernels by instruction set)."""
    with open(numerics_report.DOC, encoding="utf-8") as f:
        doc = f.read()
    stale = "docs/numerics.md is out of date: run PYTHONPATH=python python tools/numerics_report.py"
    assert numerics_report.render_static() in doc, stale
    rows = numerics_report.parse_measured(doc)
    assert sorted(rows) == sorted(h.CASE_BY_NAME), stale
    columns = [numerics_report.column(b) for b in numerics_report.all_backends()]
    for name, cells in rows.items():
        assert list(cells) == columns, f"{name}: columns {list(cells)} != {columns}; {stale}"
        for col, err in cells.items():
            if err is not None:
                tol = h.TOLERANCES[name].of(numerics_report.precision_of(col))
                assert err <= tol, f"docs/numerics.md: {name} on {col}: {err:g} > tolerance {tol:g}"

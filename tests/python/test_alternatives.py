"""Alternatives in one file: an mlx lowering and a CPU lowering of the same method; the loader
takes the first whose backends are available (issue 5 item 6). Checked against PyTorch eager."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torchvision

import kiln
from kiln import _kiln
from kiln.capture import capture

BUILT = set(_kiln.backend_names())
needs_both = pytest.mark.skipif(not {"mlx", "xnnpack"} <= BUILT, reason="needs the mlx and xnnpack backends built")


def _model():
    torch.manual_seed(0)
    m = torchvision.models.mobilenet_v3_small(num_classes=10).eval()
    for mod in m.modules():  # non-trivial batch-norm statistics, so folding and numerics matter
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    return m


@pytest.fixture(scope="module")
def any_program(tmp_path_factory):
    m, x = _model(), torch.randn(1, 3, 96, 96)
    cap = capture(m, (x,))
    pb = _kiln.ProgramBuilder()
    pb.add_method("forward", cap.graph)
    data, report = pb.compile(alternatives=[["mlx"], ["xnnpack"]])
    path = tmp_path_factory.mktemp("alt") / "mv3_any.kiln"
    path.write_bytes(data)
    with torch.no_grad():
        ref = m(x).numpy()
    return path, x.numpy(), ref, report


def _run(path, x, env):
    code = textwrap.dedent(f"""
        import json, sys, numpy as np, kiln
        p = kiln.load({str(path)!r})
        meth = p.method("forward")
        out = p.run(np.load({str(path) + '.x.npy'!r}))[0]
        np.save({str(path) + '.out.npy'!r}, out)
        print(json.dumps(meth.alternative))
    """)
    np.save(str(path) + ".x.npy", x)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    import json
    return json.loads(r.stdout.strip().splitlines()[-1]), np.load(str(path) + ".out.npy")


@needs_both
def test_report_has_one_entry_per_alternative(any_program):
    _, _, _, report = any_program
    alts = [(m["name"], m["alternative"], [b["backend"] for b in m["delegation"]["backends"] if b["segments"]])
            for m in report["methods"]]
    assert alts == [("forward", 0, ["mlx"]), ("forward", 1, ["xnnpack"])]


@needs_both
def test_mlx_taken_where_available_else_cpu_lowering_same_top5(any_program):
    path, x, ref, _ = any_program
    alt_mlx, out_mlx = _run(path, x, {"KILN_MLX_DEVICE": "cpu", "KILN_XNNPACK_DISABLE": ""})
    assert alt_mlx["index"] == 0 and alt_mlx["count"] == 2 and alt_mlx["delegate_segments"] == {"mlx": 1}
    alt_cpu, out_cpu = _run(path, x, {"KILN_MLX_DEVICE": "", "KILN_XNNPACK_DISABLE": ""})
    assert alt_cpu["index"] == 1 and alt_cpu["delegate_segments"] == {"xnnpack": 1}
    assert "mlx" in alt_cpu["skipped"][0]
    scale = float(np.abs(ref).max())
    for out in (out_mlx, out_cpu):
        assert float(np.abs(out - ref).max()) <= 1e-4 * max(1.0, scale)
        assert list(np.argsort(-out[0])[:5]) == list(np.argsort(-ref[0])[:5])


@needs_both
def test_no_alternative_available_is_not_found_listing_each(any_program):
    path, x, _, _ = any_program
    code = f"import kiln; kiln.load({str(path)!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "KILN_MLX_DEVICE": "", "KILN_XNNPACK_DISABLE": "1"})
    assert r.returncode != 0
    assert "NotFound" in r.stderr and "mlx" in r.stderr and "xnnpack" in r.stderr
    # The CLI loads with deferred backend errors (so that inspect works): running names each one too.
    cli = os.path.join(os.path.dirname(__file__), "..", "..", "build", "tools", "kiln")
    if os.path.isfile(cli):
        r = subprocess.run([cli, "bench", str(path), "--runs", "1", "--warmup", "0"], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "KILN_MLX_DEVICE": "", "KILN_XNNPACK_DISABLE": "1"})
        assert r.returncode == 1 and "no alternative of method 'forward' can run here: alternative 0: " in r.stderr
        assert "backend 'mlx' is not available" in r.stderr.split("alternative 1: ")[0], r.stderr
        assert "alternative 1: " in r.stderr and "xnnpack" in r.stderr.split("alternative 1: ")[1], r.stderr


def test_alternatives_exclude_backends_and_require():
    g = kiln.Graph()
    x = g.add_input("x", "float32", [3])
    (y,) = g.add_node("aten.neg", [x])
    g.set_outputs([y])
    pb = _kiln.ProgramBuilder()
    pb.add_method("forward", g)
    with pytest.raises(kiln.KilnError, match="alternatives replace backends"):
        pb.compile(alternatives=[[], []], backends=["xnnpack"] if "xnnpack" in BUILT else ["nope"])
    data, report = pb.compile(alternatives=[[], []])  # two CPU-only alternatives: the first is taken
    p = kiln.load_bytes(data)
    assert p.method("forward").alternative["index"] == 0
    np.testing.assert_array_equal(p.run(np.array([1, -2, 3], np.float32))[0], [-1, 2, -3])


def test_export_alternatives_option():
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(2, 4)
    from kiln.capture import ExportError
    with pytest.raises(ExportError, match="alternatives replace backends"):
        kiln.export(m, (x,), backends=("portable",), alternatives=[("portable",)], verbose=False)
    alts = [("xnnpack",), ()] if "xnnpack" in BUILT else [(), ()]
    res = kiln.export(m, (x,), alternatives=alts, verbose=False)
    assert [mm["alternative"] for mm in res.report["methods"]] == [0, 1]
    assert "alternative 1" in res.text
    p = res.load()
    with torch.no_grad():
        ref = m(x).numpy()
    np.testing.assert_allclose(p.run(x)[0], ref, rtol=1e-5, atol=1e-6)
    assert p.method("forward").alternative["index"] == 0

"""Tests of the `kiln` CLI (tools/kiln.cpp): `kiln inspect` (text and --json) and `kiln run`.

Programs are written through the Python binding (the C++ compiler and serializer); inputs and
expected outputs are computed with NumPy here, independently of Kiln. The binary is
build/tools/kiln (override with the KILN_CLI environment variable).
"""
from __future__ import annotations

import json
import os
import stat
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_CLI = os.environ.get("KILN_CLI", os.path.join(ROOT, "build", "tools", "kiln"))

C = np.array([1.0, -2.0, 0.25], dtype=np.float32)


@pytest.fixture(scope="module")
def cli():
    if not os.path.isfile(KILN_CLI):
        pytest.fail(f"{KILN_CLI} not built: build with -DKILN_BUILD_TOOLS=ON (the default) or set KILN_CLI")
    return KILN_CLI


def kiln_cmd(cli, *args) -> subprocess.CompletedProcess:
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=60)


def compile_graph(methods: dict[str, "kiln.Graph"]) -> tuple[bytes, dict]:
    pb = kiln.ProgramBuilder()
    for name, g in methods.items():
        pb.add_method(name, g)
    return pb.compile()


def add_relu_graph() -> "kiln.Graph":
    """forward(x: f32[2, 3], y: f32[3]) -> (relu(x + 2*y + c), x + 2*y), c: f32[3] constant."""
    g = kiln.Graph()
    x = g.add_input("x", "float32", [2, 3])
    y = g.add_input("y", "float32", [3])
    c = g.add_constant("c", "float32", [3], C)
    (s,) = g.add_node("aten.add", [x, y], {"alpha": 2.0})
    (t,) = g.add_node("aten.add", [s, c], {})
    (r,) = g.add_node("aten.relu", [t])
    g.set_outputs([r, s])
    return g


def shift_graph() -> "kiln.Graph":
    """shift(z: f32[4, 3]) -> z - c (broadcast; the same constant bytes as forward: stored once)."""
    g = kiln.Graph()
    z = g.add_input("z", "float32", [4, 3])
    c = g.add_constant("c", "float32", [3], C)
    (s,) = g.add_node("aten.add", [z, c], {"alpha": -1.0})
    g.set_outputs([s])
    return g


DTYPES = ["float32", "float16", "int64", "int32", "int8", "uint8", "bool"]


def identity_graph() -> "kiln.Graph":
    """One input per dtype, each returned unchanged: checks .npy reading and writing per dtype."""
    g = kiln.Graph()
    g.set_outputs([g.add_input(f"in_{d}", d, [2, 3]) for d in DTYPES])
    return g


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    data, report = compile_graph({"forward": add_relu_graph(), "shift": shift_graph()})
    (d / "model.kiln").write_bytes(data)
    ident, _ = compile_graph({"forward": identity_graph()})
    (d / "identity.kiln").write_bytes(ident)
    g = kiln.Graph()
    g.set_outputs([g.add_input("b", "bfloat16", [5])])
    bf16, _ = compile_graph({"forward": g})
    (d / "bf16.kiln").write_bytes(bf16)
    return d, report


# ---- kiln inspect ----

def test_inspect_json(cli, programs):
    d, report = programs
    p = kiln_cmd(cli, "inspect", d / "model.kiln", "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["format_version"] == 2  # format 2 (issue 18: states, symbols, metadata); format-1 files still load
    assert info["file_size"] == os.path.getsize(d / "model.kiln")
    assert info["constant_bytes"] == C.nbytes  # one constant, shared by both methods, stored once
    methods = {m["name"]: m for m in info["methods"]}
    assert sorted(methods) == ["forward", "shift"]
    fwd = methods["forward"]
    assert fwd["inputs"] == [{"name": "x", "dtype": "float32", "sizes": [2, 3]},
                             {"name": "y", "dtype": "float32", "sizes": [3]}]
    assert [(o["dtype"], o["sizes"]) for o in fwd["outputs"]] == [("float32", [2, 3])] * 2
    assert fwd["num_instructions"] == 3
    assert fwd["num_kernel_calls"] == 3
    assert fwd["num_delegate_calls"] == 0
    assert fwd["op_counts"] == {"aten.add": 2, "aten.relu": 1}
    assert list(fwd["op_counts"]) == sorted(fwd["op_counts"])
    planned = {m["name"]: m["arena_bytes"] for m in report["methods"]}
    assert fwd["arena_bytes"] == planned["forward"] > 0
    assert methods["shift"]["op_counts"] == {"aten.add": 1}
    assert methods["shift"]["inputs"] == [{"name": "z", "dtype": "float32", "sizes": [4, 3]}]


def test_inspect_text(cli, programs):
    d, _ = programs
    p = kiln_cmd(cli, "inspect", d / "model.kiln")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert re.search(r"^format version\s+2$", out, re.M)
    assert re.search(rf"^file size\s+{os.path.getsize(d / 'model.kiln')} bytes$", out, re.M)
    assert re.search(rf"^constant bytes\s+{C.nbytes} bytes", out, re.M)
    assert re.search(r"^methods\s+2$", out, re.M)
    fwd = out[out.index("method 'forward'"):out.index("method 'shift'")]
    assert re.search(r"^\s+x\s+float32\[2, 3\]$", fwd, re.M)
    assert re.search(r"^\s+y\s+float32\[3\]$", fwd, re.M)
    assert re.search(r"^\s+instructions\s+3 \(3 kernel calls, 0 delegate calls\)$", fwd, re.M)
    assert re.search(r"^\s+aten\.add\s+2$", fwd, re.M)
    assert re.search(r"^\s+aten\.relu\s+1$", fwd, re.M)
    assert re.search(r"^\s+arena\s+\d+ bytes$", fwd, re.M)


def test_inspect_identity_has_no_ops(cli, programs):
    d, _ = programs
    info = json.loads(kiln_cmd(cli, "inspect", "--json", d / "identity.kiln").stdout)
    (m,) = info["methods"]
    assert m["num_instructions"] == 0 and m["op_counts"] == {}
    assert [i["dtype"] for i in m["inputs"]] == DTYPES


# ---- kiln run ----

def test_run_matches_numpy(cli, programs, tmp_path):
    d, _ = programs
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3), dtype=np.float32)
    y = rng.standard_normal(3, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    out_dir = tmp_path / "out" / "nested"  # created by kiln run
    p = kiln_cmd(cli, "run", d / "model.kiln", "--input", tmp_path / "x.npy", "--input", tmp_path / "y.npy",
                 "--output-dir", out_dir)
    assert p.returncode == 0, p.stderr
    assert re.search(r"^output 0 .*: float32\[2, 3\]", p.stdout, re.M), p.stdout
    assert re.search(r"^output 1 .*: float32\[2, 3\]", p.stdout, re.M), p.stdout
    assert re.search(r"^execute: \d+\.\d+ ms$", p.stdout, re.M), p.stdout
    s = x + np.float32(2) * y
    expected = [np.maximum(s + C, 0), s]
    for i, e in enumerate(expected):
        got = np.load(out_dir / f"output_{i}.npy")
        assert got.dtype == np.float32 and got.shape == e.shape
        assert np.max(np.abs(got - e)) <= 1e-5 * np.max(np.abs(e))
    assert sorted(os.listdir(out_dir)) == ["output_0.npy", "output_1.npy"]


def test_run_other_method_and_v2_header(cli, programs, tmp_path):
    d, _ = programs
    z = np.arange(12, dtype=np.float32).reshape(4, 3)
    # A version 2.0 header, written by NumPy's own format module.
    with open(tmp_path / "z.npy", "wb") as f:
        np.lib.format.write_array(f, z, version=(2, 0))
    p = kiln_cmd(cli, "run", d / "model.kiln", "-m", "shift", "-i", tmp_path / "z.npy", "-o", tmp_path)
    assert p.returncode == 0, p.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "output_0.npy"), z - C)


def test_run_roundtrips_every_dtype(cli, programs, tmp_path):
    d, _ = programs
    rng = np.random.default_rng(2)
    arrays = [
        rng.standard_normal((2, 3)).astype(np.float32),
        rng.standard_normal((2, 3)).astype(np.float16),
        rng.integers(-2**62, 2**62, (2, 3), dtype=np.int64),
        rng.integers(-2**31, 2**31 - 1, (2, 3), dtype=np.int32),
        rng.integers(-128, 127, (2, 3), dtype=np.int8),
        rng.integers(0, 255, (2, 3), dtype=np.uint8),
        rng.integers(0, 2, (2, 3)).astype(np.bool_),
    ]
    args = []
    for a in arrays:
        path = tmp_path / f"in_{a.dtype}.npy"
        np.save(path, a)
        args += ["-i", path]
    p = kiln_cmd(cli, "run", d / "identity.kiln", *args, "-o", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    for i, a in enumerate(arrays):  # the outputs are the inputs: named after them (files before output names)
        got = np.load(tmp_path / "out" / f"in_{DTYPES[i]}.npy")
        assert got.dtype == a.dtype, (i, got.dtype)
        np.testing.assert_array_equal(got, a)


def test_run_bfloat16_through_float32(cli, programs, tmp_path):
    d, _ = programs
    x = np.array([1.0, -2.5, 1.00390625, 3.0e38, 1e-3], dtype=np.float32)  # 1.00390625 rounds in bf16
    np.save(tmp_path / "b.npy", x)
    p = kiln_cmd(cli, "run", d / "bf16.kiln", "-i", tmp_path / "b.npy", "-o", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    assert "written as float32" in p.stdout
    expected = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "b.npy"), expected)  # named after input 'b' (the output)


def test_run_without_output_dir_writes_nothing(cli, programs, tmp_path):
    d, _ = programs
    np.save(tmp_path / "z.npy", np.zeros((4, 3), np.float32))
    p = kiln_cmd(cli, "run", d / "model.kiln", "--method", "shift", "--input", tmp_path / "z.npy")
    assert p.returncode == 0, p.stderr
    assert "float32[4, 3]" in p.stdout
    assert sorted(os.listdir(tmp_path)) == ["z.npy"]


# ---- errors: non-zero exit, "kiln <cmd>: <ErrorCode>: <message>" on stderr ----

def test_missing_program_file(cli, tmp_path):
    for cmd in (["inspect"], ["run"]):
        p = kiln_cmd(cli, *cmd, tmp_path / "nope.kiln")
        assert p.returncode == 1
        assert "NotFound" in p.stderr and "nope.kiln" in p.stderr, p.stderr
        assert p.stdout == ""


def test_malformed_program_files(cli, programs, tmp_path):
    d, _ = programs
    data = (d / "model.kiln").read_bytes()
    cases = {
        "garbage.kiln": bytes(range(256)) * 4,
        "truncated.kiln": data[: len(data) // 2],
        "empty.kiln": b"",
        "flipped.kiln": data[:80] + bytes(b ^ 0xFF for b in data[80:200]) + data[200:],
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        for cmd in ("inspect", "run"):
            p = kiln_cmd(cli, cmd, tmp_path / name)
            assert p.returncode == 1, (name, cmd, p.returncode, p.stderr)
            assert "InvalidProgram" in p.stderr and name in p.stderr, (name, p.stderr)


def run_error(cli, programs, tmp_path, x, y=None):
    d, _ = programs
    np.save(tmp_path / "x.npy", x) if isinstance(x, np.ndarray) else (tmp_path / "x.npy").write_bytes(x)
    np.save(tmp_path / "y.npy", np.zeros(3, np.float32) if y is None else y)
    p = kiln_cmd(cli, "run", d / "model.kiln", "-i", tmp_path / "x.npy", "-i", tmp_path / "y.npy", "-o", tmp_path / "o")
    assert p.returncode == 1, p.stdout
    assert not (tmp_path / "o").exists()
    return p.stderr


def test_wrong_dtype_names_the_input(cli, programs, tmp_path):
    err = run_error(cli, programs, tmp_path, np.zeros((2, 3), np.float64))
    assert "InvalidArgument" in err and "input 'x'" in err and "float64" in err and "float32[2, 3]" in err, err
    err = run_error(cli, programs, tmp_path, np.zeros((2, 3), np.complex64))
    assert "InvalidArgument" in err and "input 'x'" in err and "'<c8' is not supported" in err, err
    err = run_error(cli, programs, tmp_path, np.zeros((2, 3), np.int32))
    assert "input 'x'" in err and "dtype int32" in err and "float32[2, 3]" in err, err
    err = run_error(cli, programs, tmp_path, np.zeros((2, 3), np.float32), np.zeros(3, np.float16))
    assert "input 'y'" in err and "float16" in err, err


def test_wrong_shape_names_the_input(cli, programs, tmp_path):
    err = run_error(cli, programs, tmp_path, np.zeros((3, 2), np.float32))
    assert "InvalidArgument" in err and "input 'x'" in err and "shape [3, 2]" in err and "float32[2, 3]" in err, err
    err = run_error(cli, programs, tmp_path, np.zeros((2, 3), np.float32), np.zeros((1, 3), np.float32))
    assert "input 'y'" in err and "shape [1, 3]" in err, err


def test_unsupported_npy_layouts(cli, programs, tmp_path):
    err = run_error(cli, programs, tmp_path, np.asfortranarray(np.ones((2, 3), np.float32)))
    assert "input 'x'" in err and "Fortran" in err, err
    err = run_error(cli, programs, tmp_path, np.ones((2, 3), dtype=">f4"))
    assert "input 'x'" in err and "big-endian" in err, err
    err = run_error(cli, programs, tmp_path, b"not a numpy file at all")
    assert "input 'x'" in err and "not a .npy file" in err, err
    good = (tmp_path / "y.npy").read_bytes()  # float32[3] written above
    err = run_error(cli, programs, tmp_path, good[:-5])
    assert "input 'x'" in err and "truncated" in err, err


def test_wrong_input_count_and_method(cli, programs, tmp_path):
    d, _ = programs
    np.save(tmp_path / "x.npy", np.zeros((2, 3), np.float32))
    p = kiln_cmd(cli, "run", d / "model.kiln", "-i", tmp_path / "x.npy")
    assert p.returncode == 1
    assert "takes 2 input(s)" in p.stderr and "got 1" in p.stderr, p.stderr
    p = kiln_cmd(cli, "run", d / "model.kiln", "-m", "nope")
    assert p.returncode == 1
    assert "NotFound" in p.stderr and "'nope'" in p.stderr and "forward, shift" in p.stderr, p.stderr
    p = kiln_cmd(cli, "run", d / "model.kiln", "-i", tmp_path / "x.npy", "-i", tmp_path / "missing.npy")
    assert p.returncode == 1
    assert "NotFound" in p.stderr and "input 'y'" in p.stderr and "missing.npy" in p.stderr, p.stderr
    p = kiln_cmd(cli, "run", d / "model.kiln", "-i", tmp_path, "-i", tmp_path / "x.npy")  # a directory
    assert p.returncode == 1
    assert "input 'x'" in p.stderr and "not a regular file" in p.stderr, p.stderr


def test_usage_errors_and_help(cli):
    p = kiln_cmd(cli)
    assert p.returncode == 2 and "inspect" in p.stderr and "run" in p.stderr
    p = kiln_cmd(cli, "frobnicate")
    assert p.returncode == 2
    p = kiln_cmd(cli, "inspect")
    assert p.returncode == 2 and "file" in p.stderr
    p = kiln_cmd(cli, "--help")
    assert p.returncode == 0 and "inspect" in p.stdout and "run" in p.stdout and "Exit status" in p.stdout
    p = kiln_cmd(cli, "run", "--help")
    assert p.returncode == 0 and "--input" in p.stdout and "--output-dir" in p.stdout and "--method" in p.stdout


# ------------------------------------------------------------------------------------------------
# python -m kiln export / compile (python/kiln/__main__.py): delegation options and the report

HAS_XNNPACK = "xnnpack" in kiln._kiln.backend_names()
needs_xnnpack = pytest.mark.skipif(not HAS_XNNPACK, reason="the xnnpack backend is not built")


def py_kiln(*args, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    return subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)


@needs_xnnpack
def test_py_export_xnnpack_required_with_json_report(tmp_path):
    out, rep = tmp_path / "mv3_xnnpack.kiln", tmp_path / "mv3.json"
    r = py_kiln("export", "mobilenet_v3_small", "--input-shape", "1x3x96x96", "--backends", "xnnpack",
                "--require-delegation", "xnnpack", "--report-json", rep, "-o", out)
    assert r.returncode == 0, r.stderr
    assert "xnnpack: 1 segment(s)" in r.stderr and "CPU kernels: none" in r.stderr, r.stderr
    with open(rep) as f:
        report = json.load(f)
    d = report["methods"][0]["delegation"]
    assert report["backends"] == ["xnnpack"] and report["require_delegation"] == "xnnpack"
    assert d["backends"][0]["backend"] == "xnnpack" and d["backends"][0]["segments"] == 1 and d["cpu_ops"] == []
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(weights=None).eval()
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        assert float(np.abs(kiln.load(out).run(x)[0] - model(x).numpy()).max()) <= 1e-4


class _GN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.gn = torch.nn.GroupNorm(4, 8)

    def forward(self, x):
        return torch.relu(self.gn(self.bn(self.conv(x))))


@pytest.fixture()
def saved_pt2(tmp_path):
    torch.manual_seed(0)
    model = _GN().eval()
    with torch.no_grad():
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.running_mean.uniform_(-0.5, 0.5)
    x = torch.randn(2, 3, 7, 9)
    path = tmp_path / "gn.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(path))
    with torch.no_grad():
        return path, x, model(x).numpy()


def test_py_compile_pt2(saved_pt2, tmp_path):
    path, x, ref = saved_pt2
    out = tmp_path / "gn.kiln"
    r = py_kiln("compile", path, "-o", out)
    assert r.returncode == 0, r.stderr
    assert "1 batch norms folded" in r.stderr, r.stderr
    prog = kiln.load(out)
    assert prog.method("forward").inputs[0]["sizes"] == [2, 3, 7, 9]
    assert float(np.abs(prog.run(x)[0] - ref).max()) <= 1e-5 * float(np.abs(ref).max())


@needs_xnnpack
def test_py_compile_pt2_delegation_report_and_requirement(saved_pt2, tmp_path):
    path, x, ref = saved_pt2
    out, rep = tmp_path / "gn_x.kiln", tmp_path / "gn.json"
    r = py_kiln("compile", path, "-o", out, "--backends", "xnnpack", "--report-json", rep)
    assert r.returncode == 0, r.stderr
    assert "aten.native_group_norm x1" in r.stderr and "no xnnpack lowering" in r.stderr, r.stderr
    with open(rep) as f:
        d = json.load(f)["methods"][0]["delegation"]
    (gn,) = [c for c in d["cpu_ops"] if c["op"] == "aten.native_group_norm"]
    assert gn["count"] == 1 and gn["reasons"][0][0] == "xnnpack" and "no xnnpack lowering" in gn["reasons"][0][1]
    assert float(np.abs(kiln.load(out).run(x)[0] - ref).max()) <= 1e-5 * float(np.abs(ref).max())

    out2 = tmp_path / "never.kiln"
    r = py_kiln("compile", path, "-o", out2, "--require-delegation", "xnnpack")
    assert r.returncode == 1, r.stderr
    assert "not delegated to required backend 'xnnpack'" in r.stderr and "aten.native_group_norm (gn)" in r.stderr
    assert not out2.exists()


@pytest.mark.skipif("mlx" not in kiln._kiln.backend_names(), reason="the mlx backend is not built")
def test_py_export_compute_dtype_for_mlx(tmp_path):
    """--compute-dtype bfloat16 (and its old spelling --dtype) exports a float32-input program whose
    mlx segment computes in bfloat16: close to the float32 program, not equal to it."""
    out32, out16 = tmp_path / "m32.kiln", tmp_path / "m16.kiln"
    common = ("export", "mobilenet_v3_small", "--input-shape", "1x3x64x64", "-q")
    r = py_kiln(*common, "-o", out32)
    assert r.returncode == 0, r.stderr
    for flag in ("--compute-dtype", "--dtype"):
        r = py_kiln(*common, "--backends", "mlx", "--require-delegation", "mlx", flag, "bfloat16", "-o", out16)
        assert r.returncode == 0, r.stderr
        prog = kiln.load(out16, backend_settings={"mlx.device": "cpu"})
        assert prog.method().inputs[0]["dtype"] == "float32"
        x = np.random.RandomState(0).randn(1, 3, 64, 64).astype(np.float32)
        want = kiln.load(out32).run(x)[0]
        err = float(np.abs(prog.run(x)[0] - want).max() / np.abs(want).max())
        assert 1e-6 < err < 5e-2, err


def test_export_out_that_is_not_a_file_name(tmp_path):
    """out='' or a path ending in a folder separator is refused before anything is written (no
    folder created); a bytes path is a path."""
    m = torch.nn.Linear(3, 2)
    x = torch.randn(1, 3)
    for out in ("", str(tmp_path / "newdir") + os.sep):
        with pytest.raises(kiln.ExportError, match="is not a file name"):
            kiln.export(m, (x,), out=out, verbose=False)
    assert not (tmp_path / "newdir").exists()
    target = tmp_path / "b.kiln"
    kiln.export(m, (x,), out=os.fsencode(str(target)), verbose=False)
    assert kiln.load(str(target)).run(x.numpy())[0].shape == (1, 2)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_export_to_a_device_writes_into_it(tmp_path):
    """-o /dev/full is an error (the device stays a device, not replaced by a regular file); a
    program written to /dev/null is written into it."""
    lin = torch.nn.Linear(4, 3).eval()
    x = torch.randn(1, 4)
    with pytest.raises(Exception, match="cannot write /dev/full: No space left on device"):
        kiln.export(lin, (x,), out="/dev/full", verbose=False)
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    kiln.export(lin, (x,), out="/dev/null", verbose=False)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    target = tmp_path / "real.kiln"  # a symlink keeps pointing at the (replaced) program
    target.write_bytes(b"old")
    (tmp_path / "link.kiln").symlink_to(target)
    kiln.export(lin, (x,), out=str(tmp_path / "link.kiln"), verbose=False)
    assert (tmp_path / "link.kiln").is_symlink() and kiln.load(str(target)).run(x.numpy())[0].shape == (1, 3)
    dangling = tmp_path / "dangling.kiln"  # a link to nowhere is replaced itself: no folder is created
    dangling.symlink_to(tmp_path / "no" / "such" / "dir" / "x.kiln")
    kiln.export(lin, (x,), out=str(dangling), verbose=False)
    assert not dangling.is_symlink() and not (tmp_path / "no").exists()


def test_py_cli_help_and_errors(tmp_path):
    for cmd in ("export", "compile"):
        r = py_kiln(cmd, "--help", timeout=120)
        assert r.returncode == 0
        for flag in ("--backends", "--require-delegation", "--report-json", "-o"):
            assert flag in r.stdout, (cmd, flag)
    r = py_kiln("compile", tmp_path / "missing.pt2", "-o", tmp_path / "x.kiln", timeout=120)
    assert r.returncode == 2 and "no such file" in r.stderr
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip file")
    r = py_kiln("compile", bad, "-o", tmp_path / "x.kiln", timeout=120)
    assert r.returncode == 1 and "cannot read" in r.stderr and "torch.export.save" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr  # one clear line, not torch's logged traceback
    r = py_kiln("export", "resnet18", "--backends", "cuda", "-o", tmp_path / "x.kiln", timeout=120)
    assert r.returncode == 2 and "unknown backend 'cuda'" in r.stderr
    r = py_kiln("export", "-o", tmp_path / "x.kiln", timeout=120)
    assert r.returncode == 2 and "give the model" in r.stderr

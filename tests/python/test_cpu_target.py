"""The cpu kernel target (include/kiln/cpu_target.h) as users and benchmarks see it (issue 21):
`kiln inspect`, `kiln bench`, `kiln run` and `kiln --version` name it (text and JSON), KILN_CPU_TARGET
forces it or is refused with a one-line error and exit status 1, the Python functions
kiln.cpu_target() / available_cpu_targets() / compiled_cpu_targets(), and the parts of bench/ that
record it (bench/machine.py, bench/run.py's --kiln-target and report).

The target is chosen once per process, so every check of a forced or refused KILN_CPU_TARGET runs in
a subprocess with its own environment. The tests pass whatever KILN_CPU_TARGET this pytest process
itself runs with (CI reruns the suite once per target). The binary is build/tools/kiln (override
with KILN_CLI).
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import subprocess
import sys

import numpy as np
import pytest

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_CLI = os.environ.get("KILN_CLI", os.path.join(ROOT, "build", "tools", "kiln"))
ALL_TARGETS = ["avx3_dl", "avx3", "avx2", "sve2", "sve", "neon", "scalar"]
AVAILABLE = kiln.available_cpu_targets()
COMPILED = kiln.compiled_cpu_targets()


@pytest.fixture(scope="module")
def cli():
    if not os.path.isfile(KILN_CLI):
        pytest.fail(f"{KILN_CLI} not built: build with -DKILN_BUILD_TOOLS=ON (the default) or set KILN_CLI")
    return KILN_CLI


def env_with(target: str | None) -> dict:
    """os.environ with KILN_CPU_TARGET=target (None: unset, the best target)."""
    env = {k: v for k, v in os.environ.items() if k != "KILN_CPU_TARGET"}
    if target is not None:
        env["KILN_CPU_TARGET"] = target
    return env


def kiln_cmd(cli, *args, target: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=120, env=env_with(target))


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """forward(x: f32[1, 8, 6, 6]) -> relu(conv2d(x, W 8x8x3x3, padding 1)): a cpu kernel call."""
    w = np.random.default_rng(5).standard_normal((8, 8, 3, 3)).astype(np.float32)
    g = kiln.Graph()
    x = g.add_input("x", "float32", [1, 8, 6, 6])
    wv = g.add_constant("w", "float32", list(w.shape), w.view(np.uint8).reshape(-1))
    (c,) = g.add_node("aten.convolution", [x, wv, -1], {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1],
                                                          "transposed": False, "output_padding": [0, 0], "groups": 1})
    (r,) = g.add_node("aten.relu", [c])
    g.set_outputs([r])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile()
    path = tmp_path_factory.mktemp("target") / "conv.kiln"
    path.write_bytes(data)
    return path


def summary_re(target: str, forced: bool) -> str:
    """The "cpu target" text: "avx2 (available: avx3_dl, avx3, avx2, scalar[; set by KILN_CPU_TARGET])"."""
    return re.escape(f"{target} (available: {', '.join(AVAILABLE)}" + ("; set by KILN_CPU_TARGET)" if forced else ")"))


def one_line_error(p, *needles):
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)  # Kiln's error, not a crash (< 0) or usage (2)
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], p.stderr
    return lines[0]


# ---- Python ----

def test_python_target_lists():
    assert AVAILABLE and AVAILABLE[-1] == "scalar" and COMPILED[-1] == "scalar"
    assert set(AVAILABLE) <= set(COMPILED) <= set(ALL_TARGETS)
    assert AVAILABLE == [t for t in COMPILED if t in AVAILABLE]  # best first, in the same order
    assert COMPILED == [t for t in ALL_TARGETS if t in COMPILED]
    if platform.machine() in ("x86_64", "AMD64"):
        assert COMPILED == ["avx3_dl", "avx3", "avx2", "scalar"]
    elif platform.machine() in ("aarch64", "arm64"):
        assert {"neon", "scalar"} <= set(COMPILED)
    forced = os.environ.get("KILN_CPU_TARGET")
    assert kiln.cpu_target() == (forced or AVAILABLE[0])
    for f in (kiln.cpu_target, kiln.available_cpu_targets, kiln.compiled_cpu_targets):
        assert f.__doc__ and len(f.__doc__) > 80, f
    assert {"cpu_target", "available_cpu_targets", "compiled_cpu_targets"} <= set(kiln.__all__)


def py_in(target: str | None, code: str) -> subprocess.CompletedProcess:
    env = env_with(target)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("target", AVAILABLE)
def test_python_forced_target(target):
    p = py_in(target, "import kiln; print(kiln.cpu_target(), kiln._kiln.cpu_target())")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [target, target]


def test_python_refused_target(program):
    code = f"""
import kiln
print(kiln.available_cpu_targets())
try:
    kiln.cpu_target()
except kiln.KilnError as e:
    print("cpu_target", e.args[1], e.args[0])
try:
    kiln.load({str(program)!r})
except kiln.KilnError as e:
    print("load", e.args[1], e.args[0])
"""
    p = py_in("bogus", code)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == str(AVAILABLE)  # the lists never raise
    for what, line in zip(("cpu_target", "load"), lines[1:]):
        assert line.startswith(f"{what} InvalidArgument "), p.stdout
        assert "KILN_CPU_TARGET='bogus'" in line and ", ".join(AVAILABLE) in line, line
    assert len(lines) == 3, p.stdout


# ---- kiln inspect / bench / run / --version ----

def test_inspect_names_the_target(cli, program):
    p = kiln_cmd(cli, "inspect", program)
    assert p.returncode == 0, p.stderr
    assert re.search(rf"^cpu target\s+{summary_re(AVAILABLE[0], False)}$", p.stdout, re.M), p.stdout
    info = json.loads(kiln_cmd(cli, "inspect", program, "--json").stdout)
    assert info["cpu_target"] == AVAILABLE[0]
    assert info["cpu_targets_available"] == AVAILABLE
    assert info["cpu_targets_compiled"] == COMPILED
    assert info["cpu_target_env"] is None


def test_bench_names_the_target(cli, program):
    p = kiln_cmd(cli, "bench", program, "--runs", 2, "--threads", 1)
    assert p.returncode == 0, p.stderr
    assert re.search(rf"^cpu target\s+{summary_re(AVAILABLE[0], False)}$", p.stdout, re.M), p.stdout
    p = kiln_cmd(cli, "bench", program, "--runs", 2, "--threads", 1, "--kernels", "portable")
    assert re.search(rf"^cpu target\s+{summary_re(AVAILABLE[0], False)} \(unused: --kernels portable\)$",
                     p.stdout, re.M), p.stdout
    r = json.loads(kiln_cmd(cli, "bench", program, "--runs", 2, "--json").stdout)
    assert (r["cpu_target"], r["cpu_targets_available"], r["cpu_target_env"]) == (AVAILABLE[0], AVAILABLE, None)


# avx2 first: the per-instruction-set row of bench/run.py on an AVX-512 machine.
@pytest.mark.parametrize("target", ["avx2"] + [t for t in AVAILABLE if t != "avx2"])
def test_forced_target_is_reported(cli, program, tmp_path, target):
    if target not in AVAILABLE:
        pytest.skip(f"this CPU / build has no {target} target (available: {', '.join(AVAILABLE)})")
    r = json.loads(kiln_cmd(cli, "bench", program, "--runs", 2, "--json", target=target).stdout)
    assert (r["cpu_target"], r["cpu_target_env"]) == (target, target)
    assert r["cpu_kernel_calls"] >= 1  # the convolution runs on a cpu kernel
    p = kiln_cmd(cli, "bench", program, "--runs", 1, target=target)
    assert re.search(rf"^cpu target\s+{summary_re(target, True)}$", p.stdout, re.M), p.stdout
    info = json.loads(kiln_cmd(cli, "inspect", program, "--json", target=target).stdout)
    assert (info["cpu_target"], info["cpu_target_env"]) == (target, target)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((1, 8, 6, 6)).astype(np.float32))
    p = kiln_cmd(cli, "run", program, "-i", tmp_path / "x.npy", target=target)
    assert p.returncode == 0, p.stderr
    assert re.search(rf"^cpu target: {summary_re(target, True)}$", p.stdout, re.M), p.stdout


def refused(target: str) -> tuple[str, str] | None:
    """(target, the reason's words) for a target KILN_CPU_TARGET cannot take here, or None."""
    if target not in ALL_TARGETS:
        return target, "is not a cpu kernel target"
    if target not in COMPILED:
        return target, "this build of Kiln has no kernels for it"
    if target not in AVAILABLE:
        return target, "this CPU does not support it"
    return None


@pytest.mark.parametrize("target", ["bogus", "AVX2", "avx512"] + [t for t in ALL_TARGETS if refused(t)])
def test_refused_target_is_a_clear_error(cli, program, tmp_path, target):
    _, why = refused(target)
    np.save(tmp_path / "x.npy", np.zeros((1, 8, 6, 6), np.float32))
    for cmd, args in (("inspect", ["--json"]), ("bench", ["--runs", 1]), ("bench", ["--json", "--kernels", "portable"]),
                      ("run", ["-i", tmp_path / "x.npy"])):
        line = one_line_error(kiln_cmd(cli, cmd, program, *args, target=target),
                              f"kiln {cmd}: InvalidArgument: KILN_CPU_TARGET='{target}'", why)
        if why != "this build of Kiln has no kernels for it":
            assert ", ".join(AVAILABLE) in line, line  # says what would work
    # --version still answers (exit 0) and says why the value is refused
    p = kiln_cmd(cli, "--version", target=target)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1].startswith(f"cpu kernels: none: KILN_CPU_TARGET='{target}'"), p.stdout
    assert why in p.stdout and "no program loads" in p.stdout, p.stdout


def test_version_names_the_targets(cli):
    p = kiln_cmd(cli, "--version")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    # One version: CMakeLists.txt's project(kiln VERSION x.y.z) in the executable and the binding.
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        project_version = re.search(r"project\(kiln VERSION ([0-9.]+)", f.read()).group(1)
    assert lines[0] == f"kiln {project_version}" and kiln.__version__ == project_version, (lines[0], kiln.__version__)
    assert re.fullmatch(rf"cpu kernels: {summary_re(AVAILABLE[0], False)}", lines[1]), p.stdout
    assert lines[2] == "compiled targets: " + ", ".join(COMPILED)
    p = kiln_cmd(cli, "--version", target="scalar")
    assert p.stdout.splitlines()[1] == f"cpu kernels: scalar (available: {', '.join(AVAILABLE)}; set by KILN_CPU_TARGET)"


# ---- bench/: machine description, --kiln-target, report ----

def bench_module(name: str):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(ROOT, "bench", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_machine_description_matches_test_sh():
    machine = bench_module("machine")
    # the same flag filter as scripts/test.sh's "cpu: ...; SIMD: ..." line
    with open(os.path.join(ROOT, "scripts", "test.sh")) as f:
        sh = re.search(r"grep -E '\^\((.*?)\)\$'", f.read()).group(1)
    assert machine.SIMD_FLAGS.pattern == f"^({sh})$"
    x86 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n"
           "flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_vnni avx512_bf16 avx512vl avx_vnni amx_tile\n"
           "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n")
    assert machine.read_cpuinfo(x86) == ("AMD EPYC 9R14 96-Core Processor",
                                         ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16",
                                          "avx512vl", "avx_vnni", "amx_tile"])
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd asimdhp asimddp sve sve2 i8mm bf16 atomics\nCPU part\t: 0xd4f\n"
    assert machine.read_cpuinfo(arm) == ("0xd4f", ["asimd", "asimdhp", "asimddp", "sve", "sve2", "i8mm", "bf16"])
    d = machine.cpu_description()
    assert d["kiln_cpu_target"] == kiln.cpu_target() and d["kiln_cpu_targets_available"] == AVAILABLE
    s = machine.cpu_summary(d)
    assert f"Kiln cpu kernels: {kiln.cpu_target()} (available: {', '.join(AVAILABLE)}" in s and "SIMD: " in s


def test_run_py_kiln_target_arguments():
    run = bench_module("run")
    a = run.parse_args(["--kiln-target", "avx2", "--kiln-target", "scalar,avx2", "--models", "resnet18"])
    assert a.kiln_target == ["avx2", "scalar"] and a.models == ["resnet18"]
    assert run.parse_args([]).kiln_target == []
    for bad in ("avx512", "AVX2", "bogus,avx2"):
        with pytest.raises(SystemExit) as e:
            run.parse_args(["--kiln-target", bad])
        assert e.value.code == 2
    assert run.engine_list(["avx2"]) == ["kiln-portable", "kiln-cpu", "kiln-cpu@avx2", "kiln-xnnpack", "ort",
                                         "executorch", "torch"]
    assert run.label("kiln-cpu@avx2") == "Kiln cpu [avx2]" and run.label("kiln-cpu") == "Kiln cpu"
    assert run.is_kiln("kiln-cpu@avx2") and not run.is_kiln("ort")
    env = run.kiln_env("kiln-cpu@scalar", {"KILN_CPU_TARGET": "avx2", "X": "1"})
    assert env == {"KILN_CPU_TARGET": "scalar", "X": "1"}
    assert run.kiln_env("kiln-cpu", {"X": "1"}) == {"X": "1"}


def test_run_py_report_has_machine_and_target_columns(tmp_path):
    """write_markdown on made-up figures: the CPU / SIMD / target lines and the Kiln cpu [T] columns."""
    run = bench_module("run")
    a = run.parse_args(["--kiln-target", "avx2", "--models", "mobilenet_v3_small,ppocr_cls", "--threads", "1",
                        "--rounds", "1"])
    info = {"platform": "Linux", "model": "Some CPU", "cores": 2, "machine": "x86_64", "simd": "avx avx2 fma avx512f",
            "kiln_cpu_target": "avx3_dl", "kiln_cpu_targets_available": ["avx3_dl", "avx3", "avx2", "scalar"],
            "kiln_cpu_target_env": None, "memory_gib": 8}
    ms = {"kiln-portable": 50.0, "kiln-cpu": 2.0, "kiln-cpu@avx2": 2.5, "kiln-xnnpack": 1.8, "ort": 2.2,
          "executorch": 2.0, "torch": 4.0}
    res = {}
    for m in a.models:
        for e, v in ms.items():
            out = {"median_ms": v, "min_ms": v, "p90_ms": v, "peak_rss_mib": 50.0, "base_rss_mib": 10.0,
                   "load_ms": 1.0, "max_abs_diff": 1e-6, "busy": [0.0], "rounds": [{}], "error": None}
            if run.is_kiln(e):
                out["cpu_target"] = run.forced_target(e) or "avx3_dl"
            res[f"{m}|{e}|1"] = out
    preps = {m: {"notes": {}, "errors": {}, "ref_max": 1.0} for m in a.models}
    out = tmp_path / "bench.md"
    run.write_markdown(a, res, preps, info, {"Kiln": "abc"}, 0.0, out, "2026-01-01 00:00")
    text = out.read_text()
    assert "`bash bench/run.sh --kiln-target avx2`" in text
    assert "- CPU: Some CPU, 2 vCPU" in text and "SIMD: avx avx2 fma avx512f" in text
    assert "- Kiln cpu kernels: avx3_dl (available: avx3_dl, avx3, avx2, scalar)" in text
    tv_hdr = next(ln for ln in text.splitlines() if ln.startswith("| model | threads |"))
    assert "| Kiln cpu | Kiln cpu [avx2] | Kiln xnnpack |" in tv_hdr and tv_hdr.endswith(
        "| Kiln cpu / ORT | Kiln cpu [avx2] / ORT |")
    row = next(ln for ln in text.splitlines() if ln.startswith("| mobilenet_v3_small | 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:5] == ["2.00", "2.50"] and cells[-2:] == ["0.91", "1.14"]
    assert "1.80 (xnnpack)" in cells  # Kiln-best leaves the forced target out
    assert "| mobilenet_v3_small | Kiln cpu (ran at avx3_dl) | 1 (?) |" in text
    assert "| mobilenet_v3_small | Kiln cpu [avx2] | 1 (?) |" in text
    pp_hdr = next(ln for ln in text.splitlines() if ln.startswith("| model | input | threads |"))
    assert "| Kiln cpu [avx2] |" in pp_hdr and "| Kiln cpu [avx2] / ORT |" in pp_hdr
    assert "Kiln cpu kernels: avx3_dl (available: avx3_dl, avx3, avx2, scalar); *Kiln cpu [T]*" in text


def test_diffusion_report_records_the_machine(tmp_path):
    """bench/diffusion.py --report-only on made-up results: the report names the CPU and the target
    (bench/machine.py's line, as docs/benchmarks.md), and a Kiln row the target it ran at."""
    machine = bench_module("machine")
    cpu = machine.cpu_description()
    np.save(tmp_path / "y.npy", np.ones((1, 4), np.float32))
    res = [dict(engine=e, method="encode", label=e, median_ms=v, times_ms=[v], peak_rss_mib=50.0,
                output=str(tmp_path / "y.npy"), cpu=cpu) for e, v in (("eager", 10.0), ("ort", 8.0), ("kiln", 6.0))]
    res[2].update(file=str(tmp_path / "none.kiln"), kernels="cpu", cpu_target="avx2")
    (tmp_path / "results.json").write_text(json.dumps(res))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "diffusion.py"), "--report-only", "--work",
                        str(tmp_path), "--report", str(tmp_path / "d.md")], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "d.md").read_text()
    assert f"Machine: {machine.cpu_summary(cpu)}:" in text, text
    assert "Kiln cpu kernels: " + machine.target_summary(cpu) in text
    assert re.search(r"^\| encode \| Kiln cpu kernels .*\[cpu target avx2\] \| 6\.0 \(1\) \| 0\.75x", text, re.M), text

"""Tests of `kiln bench` (tools/kiln.cpp), the --threads/--kernels options of `kiln run`, and the
kernel-set / delegate lines of `kiln inspect`.

Programs are written through the Python binding (the C++ compiler); expected outputs come from
NumPy. Timing figures are checked for consistency only (ordering, positivity), never for speed.
The binary is build/tools/kiln (override with KILN_CLI).
"""
from __future__ import annotations

import json
import os
import re
import subprocess

import numpy as np
import pytest

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_CLI = os.environ.get("KILN_CLI", os.path.join(ROOT, "build", "tools", "kiln"))
HAS_XNNPACK = "xnnpack" in kiln._kiln.backend_names()


@pytest.fixture(scope="module")
def cli():
    if not os.path.isfile(KILN_CLI):
        pytest.fail(f"{KILN_CLI} not built: build with -DKILN_BUILD_TOOLS=ON (the default) or set KILN_CLI")
    return KILN_CLI


def kiln_cmd(cli, *args) -> subprocess.CompletedProcess:
    return subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=120)


W = np.random.default_rng(3).standard_normal((8, 4, 3, 3)).astype(np.float32)


def conv_graph() -> "kiln.Graph":
    """forward(x: f32[1, 4, 10, 10]) -> relu(conv2d(x, W, padding 1)), W: f32[8, 4, 3, 3] constant."""
    g = kiln.Graph()
    x = g.add_input("x", "float32", [1, 4, 10, 10])
    w = g.add_constant("w", "float32", list(W.shape), W.view(np.uint8).reshape(-1))
    (c,) = g.add_node("aten.convolution", [x, w, -1], {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1],
                                                         "transposed": False, "output_padding": [0, 0], "groups": 1})
    (r,) = g.add_node("aten.relu", [c])
    g.set_outputs([r])
    return g


def reference(x: np.ndarray) -> np.ndarray:
    """conv2d(x, W, padding=1) followed by relu, in NumPy (float64 accumulation)."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((1, 8, 10, 10))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 10, j:j + 10], W[:, :, i, j].astype(np.float64))
    return np.maximum(out, 0).astype(np.float32)


def compile_to(path, backends=()):
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", conv_graph())
    data, _ = pb.compile(backends=list(backends))
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return compile_to(tmp_path_factory.mktemp("bench") / "conv.kiln")


def bench_json(cli, path, *extra):
    p = kiln_cmd(cli, "bench", path, "--json", *extra)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    return json.loads(p.stdout)


def _own_peak_rss_mib() -> float:
    """This pytest process's VmHWM in MiB (it holds torch and every model built so far)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("inf")


def check_stats(r, runs):
    assert 0 < r["min_ms"] <= r["median_ms"] <= r["p90_ms"] <= r["max_ms"], r
    assert r["min_ms"] <= r["mean_ms"] <= r["max_ms"], r
    assert len(r["times_ms"]) == r["runs"] == runs
    assert min(r["times_ms"]) == pytest.approx(r["min_ms"], abs=1e-3)
    assert max(r["times_ms"]) == pytest.approx(r["max_ms"], abs=1e-3)
    assert sorted(r["times_ms"])[(runs - 1) // 2] <= r["median_ms"] <= sorted(r["times_ms"])[runs // 2]
    assert r["load_ms"] > 0 and r["init_ms"] >= 0
    # A real RSS figure in MiB (not KiB), and the bench process's own: smaller than this pytest
    # process's, which holds torch (ru_maxrss alone would report the parent's size, carried over fork).
    assert 1 < r["peak_rss_mib"] < min(4096, _own_peak_rss_mib()), (r["peak_rss_mib"], _own_peak_rss_mib())


# ---- kiln bench ----

def test_bench_json_fields(cli, program):
    r = bench_json(cli, program, "--runs", 7, "--warmup", 2, "--threads", 1)
    for key in ("file", "method", "threads", "kernels", "runs", "warmup", "inputs", "load_ms", "init_ms", "min_ms",
                "median_ms", "p90_ms", "max_ms", "mean_ms", "peak_rss_mib", "kernel_calls", "cpu_kernel_calls",
                "portable_kernel_calls", "delegate_segments", "times_ms"):
        assert key in r, key
    assert r["method"] == "forward" and r["threads"] == 1 and r["kernels"] == "cpu" and r["warmup"] == 2
    assert r["inputs"] == "random(seed=0)"
    assert r["kernel_calls"] == 2 and r["delegate_segments"] == {}
    assert r["cpu_kernel_calls"] + r["portable_kernel_calls"] == 2
    check_stats(r, 7)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("kernels", ["cpu", "portable"])
def test_bench_threads_and_kernels(cli, program, threads, kernels):
    r = bench_json(cli, program, "--runs", 5, "--threads", threads, "--kernels", kernels)
    assert r["threads"] == threads and r["kernels"] == kernels
    if kernels == "portable":
        assert r["cpu_kernel_calls"] == 0 and r["portable_kernel_calls"] == 2
    check_stats(r, 5)


def test_bench_text(cli, program):
    p = kiln_cmd(cli, "bench", program, "-r", 4, "-w", 0, "-t", 2)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    m = re.search(r"^latency ms\s+min (\S+)\s+median (\S+)\s+p90 (\S+)\s+max (\S+)\s+mean (\S+)$", out, re.M)
    assert m, out
    mn, med, p90, mx, _ = map(float, m.groups())
    assert 0 < mn <= med <= p90 <= mx
    assert re.search(r"^threads\s+2$", out, re.M), out
    assert re.search(r"^load\s+\d+\.\d+ ms$", out, re.M), out
    assert re.search(r"^method init\s+\d+\.\d+ ms$", out, re.M), out
    assert re.search(r"^peak RSS\s+\d+\.\d+ MiB$", out, re.M), out
    assert re.search(r"^runs\s+4 \(after 0 warm-up\)$", out, re.M), out


@pytest.mark.parametrize("kernels", ["cpu", "portable"])
def test_bench_profile_json(cli, program, kernels):
    r = bench_json(cli, program, "--runs", 6, "--threads", 2, "--kernels", kernels, "--profile", 5)
    prof = r["profile"]
    assert prof["runs"] == 6
    assert 0 < prof["instructions_ms_per_run"] <= prof["wall_ms_per_run"]
    ops = {(row["op"], row["fused"], row["kernel"]) for row in prof["by_op"]}
    if kernels == "cpu":  # the relu runs inside the convolution's store
        assert ops == {("aten.convolution", "aten.relu", "cpu")}, prof
    else:
        assert ops == {("aten.convolution", "", "portable"), ("aten.relu", "", "portable")}, prof
    assert sum(row["instructions"] for row in prof["by_op"]) == len(ops)
    for row in prof["by_op"] + prof["top"]:
        # fastest single execution <= the mean per run (one execution per run here)
        assert 0 < row["min_ms"] <= row["ms_per_run"] + 1e-3, row
    conv = [row for row in prof["top"] if row["op"] == "aten.convolution"]
    assert len(conv) == 1 and conv[0]["shapes"].startswith("float32[1, 4, 10, 10], float32[8, 4, 3, 3]"), prof
    assert conv[0]["shapes"].endswith("-> float32[1, 8, 10, 10]"), prof
    ms = [row["ms_per_run"] for row in prof["top"]]
    assert ms == sorted(ms, reverse=True)
    assert "profile" not in bench_json(cli, program, "--runs", 2)


def test_bench_profile_text(cli, program):
    p = kiln_cmd(cli, "bench", program, "-r", 3, "--profile", 1, "--kernels", "portable")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert re.search(r"^profile\s+3 more runs timed per instruction: \d+\.\d+ ms per run", out, re.M), out
    top = out[out.index("top 1 by op and shapes"):].strip().splitlines()
    assert len(top) == 2 and "portable" in top[1] and "float32[" in top[1], out  # header + 1 row
    assert re.search(r"^  aten\.relu\s+\d+\.\d+", out, re.M), out
    one_line_error(kiln_cmd(cli, "bench", program, "--profile", -1), "--profile")


def test_bench_npy_input_and_seed(cli, program, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((1, 4, 10, 10), np.float32))
    r = bench_json(cli, program, "--runs", 2, "--input-npy", tmp_path / "x.npy")
    assert r["inputs"] == "npy"
    r = bench_json(cli, program, "--runs", 2, "--seed", 42)
    assert r["inputs"] == "random(seed=42)"


def one_line_error(p, *needles, rc=None):
    assert p.returncode != 0 if rc is None else p.returncode == rc, (p.returncode, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], p.stderr
    return lines[0]


def test_bench_errors(cli, program, tmp_path):
    one_line_error(kiln_cmd(cli, "bench", tmp_path / "nope.kiln"), "kiln bench: NotFound", "nope.kiln")
    (tmp_path / "junk.kiln").write_bytes(b"not a kiln program at all" * 10)
    one_line_error(kiln_cmd(cli, "bench", tmp_path / "junk.kiln"), "kiln bench: InvalidProgram")
    one_line_error(kiln_cmd(cli, "bench", program, "--method", "decode"), "NotFound", "'decode'", "forward")
    for bad in ("two", "abc", "2.5"):
        one_line_error(kiln_cmd(cli, "bench", program, "--threads", bad), "--threads")
    for bad in ("-1", "100000"):  # bad option values are usage errors (exit status 2)
        one_line_error(kiln_cmd(cli, "bench", program, "--threads", bad), "InvalidArgument", "--threads", bad, rc=2)
    one_line_error(kiln_cmd(cli, "bench", program, "--runs", 0), "InvalidArgument", "--runs", rc=2)
    one_line_error(kiln_cmd(cli, "bench", program, "--warmup", -2), "InvalidArgument", "--warmup", rc=2)
    one_line_error(kiln_cmd(cli, "bench", program, "--kernels", "fast"), "InvalidArgument", "--kernels", "fast", rc=2)
    one_line_error(kiln_cmd(cli, "bench", program, "--seed", -1), "--seed", "must be >= 0", rc=2)
    np.save(tmp_path / "bad.npy", np.ones((1, 4, 10, 9), np.float32))
    one_line_error(kiln_cmd(cli, "bench", program, "-i", tmp_path / "bad.npy"), "InvalidArgument", "shape")
    one_line_error(kiln_cmd(cli, "bench", program, "-i", tmp_path / "x.npy", "-i", tmp_path / "x.npy"),
                   "takes 1 input(s)")


# ---- kiln run --threads / --kernels ----

@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kernels", ["cpu", "portable"])
def test_run_threads_kernels_match_numpy(cli, program, tmp_path, threads, kernels):
    x = np.random.default_rng(5).standard_normal((1, 4, 10, 10)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    p = kiln_cmd(cli, "run", program, "-i", tmp_path / "x.npy", "-o", tmp_path, "--numbered", "--threads",
                 threads, "--kernels", kernels)
    assert p.returncode == 0, p.stderr
    got, want = np.load(tmp_path / "output_0.npy"), reference(x)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


def test_run_bad_threads_and_kernels(cli, program):
    one_line_error(kiln_cmd(cli, "run", program, "--threads", -3), "kiln run: InvalidArgument", "--threads", rc=2)
    one_line_error(kiln_cmd(cli, "run", program, "--kernels", "gpu"), "kiln run: InvalidArgument", "--kernels", rc=2)


# ---- kiln inspect: kernel sets and delegate segments ----

def test_inspect_kernel_counts(cli, program):
    p = kiln_cmd(cli, "inspect", "--json", program)
    assert p.returncode == 0, p.stderr
    (m,) = json.loads(p.stdout)["methods"]
    assert m["num_cpu_kernel_calls"] + m["num_portable_kernel_calls"] == m["num_kernel_calls"] == 2
    assert sum(m["cpu_op_counts"].values()) == m["num_cpu_kernel_calls"]
    for op, n in m["cpu_op_counts"].items():
        assert 0 < n <= m["op_counts"][op]
    assert m["delegate_segments"] == {}
    # bench reports the same split for the default kernel set
    r = bench_json(cli, program, "--runs", 1)
    assert r["cpu_kernel_calls"] == m["num_cpu_kernel_calls"]
    text = kiln_cmd(cli, "inspect", program).stdout
    assert re.search(rf"^\s+kernel calls\s+2 \({m['num_cpu_kernel_calls']} optimized cpu, "
                     rf"{m['num_portable_kernel_calls']} portable\)$", text, re.M), text
    assert re.search(r"^\s+delegates\s+none$", text, re.M), text


def test_bench_peak_rss_covers_the_weights(cli, tmp_path):
    """peak_rss_mib is in MiB and counts the weights: a linear layer with a 64 MiB weight
    (f32 [4096, 4096], read in full by every run) peaks above 64 MiB and well under 4 x that (a
    figure in KiB would be ~65000; one that missed the weights would be ~10)."""
    n = 4096
    w = np.random.default_rng(8).standard_normal((n, n), dtype=np.float32)
    g = kiln.Graph()
    x = g.add_input("x", "float32", [1, n])
    wc = g.add_constant("w", "float32", [n, n], w.view(np.uint8).reshape(-1))
    (y,) = g.add_node("aten.linear", [x, wc, -1])
    g.set_outputs([y])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile()
    (tmp_path / "big.kiln").write_bytes(data)
    r = bench_json(cli, tmp_path / "big.kiln", "--runs", 2, "--warmup", 1, "--threads", 1)
    weights_mib = w.nbytes / 2**20
    assert weights_mib <= r["peak_rss_mib"] <= 4 * weights_mib, r["peak_rss_mib"]


@pytest.mark.skipif(not HAS_XNNPACK, reason="the xnnpack backend is not built")
def test_inspect_and_bench_xnnpack_program(cli, tmp_path):
    path = compile_to(tmp_path / "conv_xnn.kiln", backends=("xnnpack",))
    (m,) = json.loads(kiln_cmd(cli, "inspect", "--json", path).stdout)["methods"]
    assert m["delegate_segments"] == {"xnnpack": 1} and m["num_delegate_calls"] == 1
    assert m["num_kernel_calls"] == 0
    text = kiln_cmd(cli, "inspect", path).stdout
    assert re.search(r"^\s+delegates\s+xnnpack: 1 segment$", text, re.M), text
    for threads in (1, 2):
        r = bench_json(cli, path, "--runs", 5, "--threads", threads)
        assert r["delegate_segments"] == {"xnnpack": 1} and r["threads"] == threads
        check_stats(r, 5)
    x = np.random.default_rng(6).standard_normal((1, 4, 10, 10)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    p = kiln_cmd(cli, "run", path, "-i", tmp_path / "x.npy", "-o", tmp_path, "--numbered", "--threads", 2)
    assert p.returncode == 0, p.stderr
    want = reference(x)
    assert np.max(np.abs(np.load(tmp_path / "output_0.npy") - want)) <= 1e-5 * np.max(np.abs(want))


def test_bench_random_inputs_of_every_dtype(cli, tmp_path):
    """Seeded random inputs are made for every input dtype (identity method: outputs = inputs)."""
    dtypes = ["float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"]
    g = kiln.Graph()
    g.set_outputs([g.add_input(f"in_{d}", d, [3, 5]) for d in dtypes])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile()
    (tmp_path / "id.kiln").write_bytes(data)
    r = bench_json(cli, tmp_path / "id.kiln", "--runs", 3, "--threads", 1)
    assert r["kernel_calls"] == 0 and r["inputs"] == "random(seed=0)"
    assert 0 <= r["min_ms"] <= r["median_ms"] <= r["p90_ms"] <= r["max_ms"]


@pytest.mark.skipif(not HAS_XNNPACK, reason="the xnnpack backend is not built")
def test_unavailable_backend_is_reported_per_method(cli, tmp_path):
    # Two methods: 'cpu' (aten.neg, which xnnpack does not take) and 'xnn' (one xnnpack segment);
    # then xnnpack is made unavailable.
    g = kiln.Graph()
    x = g.add_input("x", "float32", [3])
    (y,) = g.add_node("aten.neg", [x])
    g.set_outputs([y])
    pb = kiln.ProgramBuilder()
    pb.add_method("cpu", g)
    pb.add_method("xnn", conv_graph())
    path = tmp_path / "mixed.kiln"
    data, rep = pb.compile(backends=["xnnpack"])
    segs = {m["name"]: sum(b["segments"] for b in m["delegation"]["backends"]) for m in rep["methods"]}
    assert segs == {"cpu": 0, "xnn": 1}
    path.write_bytes(data)
    env = dict(os.environ, KILN_XNNPACK_DISABLE="1")
    p = subprocess.run([cli, "inspect", str(path), "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    meta = {m["name"]: m for m in json.loads(p.stdout)["methods"]}
    assert meta["cpu"]["unavailable"] is None
    assert "xnnpack" in meta["xnn"]["unavailable"] and "not available" in meta["xnn"]["unavailable"]
    np.save(tmp_path / "x.npy", np.arange(3, dtype=np.float32))
    p = subprocess.run([cli, "run", str(path), "-m", "cpu", "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([cli, "bench", str(path), "-m", "xnn", "--runs", "1"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 1 and "NotFound" in p.stderr and "xnnpack" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_kiln_num_threads_env(cli, program):
    """KILN_NUM_THREADS sizes the default pool; a value that is not a positive whole number is said on
    stderr (naming the value and the thread count used instead), never ignored silently."""
    def bench_env(value):
        env = dict(os.environ, KILN_NUM_THREADS=value)
        return subprocess.run([cli, "bench", str(program), "-r", "1", "-w", "0"], capture_output=True, text=True,
                              timeout=120, env=env)
    p = bench_env("1")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert re.search(r"^threads\s+1$", p.stdout, re.M), p.stdout
    cores = os.cpu_count()
    for bad in ("abc", "0", "-2", "3x"):
        p = bench_env(bad)
        assert p.returncode == 0, p.stderr
        assert f"ignoring KILN_NUM_THREADS='{bad}'" in p.stderr and f"using {cores} threads" in p.stderr, p.stderr
        assert re.search(rf"^threads\s+{cores}$", p.stdout, re.M), p.stdout

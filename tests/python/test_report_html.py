"""Tests of `kiln report -o report.html` and `kiln bench --trace` (tools/kiln.cpp, tools/report_html.cpp).

The report is checked in a real browser: headless Chromium (Debian `chromium`) driven through the
system chromedriver (`chromium-driver`) with Selenium, which loads each page from a file, and the
test reads the rendered page's text (what a person sees: segment counts per backend, a reason a
backend gave for declining a node) and the browser's console log, which must hold no error. The
expected figures come from the compiler's own report (kiln.export's report dict, written by the C++
partitioner) and from the loader (`kiln inspect --json`), not from the page generator.

Pages: mobilenet_v3_large (torchvision, random weights, 64x64 input) compiled with the "any"
alternatives of examples/mv3/export.py (mlx, else xnnpack), and the tiny diffusion pipeline of
examples/diffusion (three methods) with xnnpack, which leaves GroupNorm, LayerNorm, attention ... on
the CPU with reasons.

The browser tests skip, naming what is missing, only outside CI when chromium, chromedriver or
selenium is absent; with CI=true they fail instead.

KILN_REPORT_SCREENSHOT=1 makes test_mv3_large_any_page_in_chromium write
docs/images/report-mv3-large.png from the mobilenet_v3_large page (docs/report.md).

The trace test: `kiln bench --trace` writes Chrome trace-event JSON with one event per executed
instruction per profiled run; durations are non-negative, lie inside their run, and sum to no
more than the run's wall time.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln.capture import BUILT_BACKENDS, capture, compile_captures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_CLI = os.environ.get("KILN_CLI", os.path.join(ROOT, "build", "tools", "kiln"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SCREENSHOT = os.path.join(ROOT, "docs", "images", "report-mv3-large.png")


@pytest.fixture(scope="module")
def cli():
    if not os.path.isfile(KILN_CLI):
        pytest.fail(f"{KILN_CLI} not built: build with -DKILN_BUILD_TOOLS=ON (the default) or set KILN_CLI")
    return KILN_CLI


def run(cli, *args, ok=True):
    p = subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=300)
    if ok:
        assert p.returncode == 0, (args, p.stdout, p.stderr)
    return p


# ---- the browser ----

def _browser_missing() -> str | None:
    missing = []
    if not os.path.isfile(CHROMIUM):
        missing.append("chromium (apt-get install chromium)")
    if not os.path.isfile(CHROMEDRIVER):
        missing.append("chromedriver (apt-get install chromium-driver)")
    if importlib.util.find_spec("selenium") is None:
        missing.append("selenium (pip install -r requirements-extra.txt)")
    return ", ".join(missing) if missing else None


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module (Selenium with the system chromedriver: nothing downloaded)."""
    missing = _browser_missing()
    if missing:
        if IN_CI:
            pytest.fail(f"CI=true and the report's browser test cannot run: missing {missing} (scripts/setup.sh installs them)")
        pytest.skip(f"missing {missing}")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never reach the network
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1600",
              "--hide-scrollbars", "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def render(browser, path):
    """Loads the page; returns (visible text, console entries of level SEVERE, the whole log)."""
    from selenium.webdriver.common.by import By

    browser.get("file://" + os.path.abspath(path))
    text = browser.find_element(By.TAG_NAME, "body").text
    log = browser.get_log("browser")
    return text, [e for e in log if e.get("level") == "SEVERE"], log


def no_scripts(browser):
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.TAG_NAME, "script") == [] and browser.find_elements(By.TAG_NAME, "iframe") == []


# ---- the programs ----

def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def mv3_any(tmp_path_factory):
    """mobilenet_v3_large with examples/mv3/export.py's "any" alternatives: (path, compile report)."""
    if not ({"mlx", "xnnpack"} <= set(BUILT_BACKENDS)):
        pytest.skip(f"the 'any' program needs mlx and xnnpack built (built: {BUILT_BACKENDS})")
    import torch
    import torchvision

    mv3 = _load("kiln_mv3_export", os.path.join(ROOT, "examples", "mv3", "export.py"))
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_large().eval()
    cap = capture(model, (torch.randn(1, 3, 64, 64),))
    out = tmp_path_factory.mktemp("report") / "mobilenet_v3_large_any.kiln"
    res = compile_captures({"forward": cap}, out=str(out), alternatives=mv3.ANY_ALTERNATIVES, verbose=False)
    return out, res.report


@pytest.fixture(scope="module")
def diffusion_xnnpack(tmp_path_factory):
    """The tiny diffusion pipeline (encode, denoise, decode) with xnnpack: (path, compile report)."""
    if "xnnpack" not in BUILT_BACKENDS:
        pytest.skip("xnnpack not built")
    export = _load("kiln_report_diffusion_export", os.path.join(ROOT, "examples", "diffusion", "export.py"))
    pipe = export.load_models().build("tiny", seed=0)
    ex = pipe.example_inputs()
    caps = {m: capture(pipe, ex[m], method=m) for m in ("encode", "denoise", "decode")}
    out = tmp_path_factory.mktemp("report") / "diffusion_tiny_xnnpack.kiln"
    res = compile_captures(caps, out=str(out), backends=("xnnpack",), verbose=False)
    return out, res.report


def segments_text(backend, n):
    return f"{backend}: {n} segment" + ("" if n == 1 else "s")


def test_mv3_large_any_page_in_chromium(cli, browser, mv3_any, tmp_path):
    path, report = mv3_any
    html = tmp_path / "mv3.html"
    run(cli, "report", path, "-o", html)
    text, severe, _ = render(browser, html)
    assert severe == [], severe
    assert no_scripts(browser)
    meta = json.loads(run(cli, "inspect", path, "--json").stdout)["methods"][0]
    assert meta["num_alternatives"] == 2
    # The alternative that runs here and its segments, as the loader counts them.
    for backend, n in meta["delegate_segments"].items():
        assert segments_text(backend, n) in text, (backend, n)
    assert f"Alternative {meta['alternative'] + 1} of 2 runs here" in text
    # The compiler's record of both alternatives: segments and nodes each backend took.
    entries = [m for m in report["methods"] if m["name"] == "forward"]
    assert len(entries) == 2, entries
    for m in entries:
        for b in m["delegation"]["backends"]:
            assert f"{b['backend']} {segments_text('', b['segments'])[2:]} {b['nodes']}" in text, b
    assert "Instructions of alternative" in text  # the other alternative's instructions too
    assert "float32[1, 3, 64, 64]" in text and "float32[1, 1000]" in text
    if os.environ.get("KILN_REPORT_SCREENSHOT") == "1":
        os.makedirs(os.path.dirname(SCREENSHOT), exist_ok=True)
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1280, min(max(int(height) + 40, 600), 2400))
        assert browser.save_screenshot(SCREENSHOT)
        browser.set_window_size(1280, 1600)


def test_diffusion_page_in_chromium_with_profile(cli, browser, diffusion_xnnpack, tmp_path):
    path, report = diffusion_xnnpack
    html = tmp_path / "diffusion.html"
    # --profile: every method timed (1 warm-up, 2 runs) as `kiln bench --profile` does.
    run(cli, "report", path, "--profile", "--runs", "2", "--warmup", "1", "-o", html)
    text, severe, _ = render(browser, html)
    assert severe == [], severe
    assert no_scripts(browser)
    metas = {m["name"]: m for m in json.loads(run(cli, "inspect", path, "--json").stdout)["methods"]}
    assert set(metas) == {"encode", "denoise", "decode"}
    for name, m in metas.items():
        assert f"Method {name}" in text
        assert f"{m['num_instructions']} instructions:" in text
        for backend, n in m["delegate_segments"].items():
            assert segments_text(backend, n) in text, (name, backend, n)
    # Every op the compiler left on the CPU, with each backend's reason (the partitioner's text).
    reasons = 0
    for m in report["methods"]:
        for op in m["delegation"]["cpu_ops"]:
            assert op["op"] in text
            for backend, reason in op["reasons"]:
                assert reason in text, (m["name"], op["op"], reason)
                reasons += 1
    assert reasons > 0 and "aten.native_group_norm" in text
    assert text.count("executions timed per instruction") == 3  # one profile per method
    assert "not recorded in this file" not in text


def test_hostile_strings_are_text_not_markup(cli, browser, tmp_path):
    """Names and metadata from the file reach the page as text: a value named like a script tag
    shows as those characters, and the page has no script element."""
    g = kiln.Graph()
    x = g.add_input("<script>alert('x')</script>", "float32", [2, 3])
    (r,) = g.add_node("aten.relu", [x])
    g.set_outputs([r])
    pb = kiln.ProgramBuilder()
    pb.add_method("fwd<b>&amp;", g)
    pb.set_metadata("note", "<img src=x onerror=alert(1)>")
    data, _ = pb.compile()
    path = tmp_path / "hostile.kiln"
    path.write_bytes(data)
    html = tmp_path / "hostile.html"
    run(cli, "report", path, "-o", html)
    text, severe, _ = render(browser, html)
    assert severe == [], severe
    assert no_scripts(browser)
    assert "<script>alert('x')</script>" in text
    assert "Method fwd<b>&amp;" in text
    from selenium.webdriver.common.by import By
    assert browser.find_elements(By.TAG_NAME, "img") == []


def _relu_program(method: str = "forward", input_name: str = "x"):
    """A ProgramBuilder holding one method: relu of a float32[4] input."""
    g = kiln.Graph()
    x = g.add_input(input_name, "float32", [4])
    (r,) = g.add_node("aten.relu", [x])
    g.set_outputs([r])
    pb = kiln.ProgramBuilder()
    pb.add_method(method, g)
    return pb


def test_old_file_and_damaged_record_are_said(cli, tmp_path):
    """A file without the compiler's delegation record (written before it existed: here its key
    renamed in place, which leaves a valid file) says "not recorded"; a record that is not Kiln's
    JSON says so. Neither is an error: the rest of the page is there."""
    pb = _relu_program()
    data, _ = pb.compile()
    assert data.count(b"kiln.delegation") == 1
    old = tmp_path / "old.kiln"
    old.write_bytes(data.replace(b"kiln.delegation", b"kiln.delegatioX"))
    html = tmp_path / "old.html"
    run(cli, "report", old, "-o", html)
    page = html.read_text()
    assert "not recorded in this file" in page and "1 instruction:" in page

    # truncated; nested 100000 deep (the reader stops at depth 16: no stack overflow); not Kiln's shape
    for value in ('{"methods": [ {"name": "forward",', "[" * 100000 + "]" * 100000, '{"methods": 5}'):
        pb.set_metadata("kiln.delegation", value)
        bad = tmp_path / "bad.kiln"
        bad.write_bytes(pb.compile()[0])
        run(cli, "report", bad, "-o", html)
        page = html.read_text()
        assert "is not the JSON Kiln writes" in page and "1 instruction:" in page


def test_non_ascii_names_in_the_record_round_trip(cli, tmp_path):
    """The delegation record keeps UTF-8 names as they are (json_quote): a method named "méthode"
    with a CPU node is matched to its method and read back with its reason, not as mojibake
    ("mÃ©thode", from escaping each UTF-8 byte as its own \\u00XX) or as a record that does not
    fit the file."""
    data, _ = _relu_program("méthode", "entrée").compile()
    record = kiln.load_bytes(data).metadata["kiln.delegation"]
    assert json.loads(record)["methods"][0]["name"] == "méthode"
    path = tmp_path / "utf8.kiln"
    path.write_bytes(data)
    html = tmp_path / "utf8.html"
    run(cli, "report", path, "-o", html)
    page = html.read_text(encoding="utf-8")
    assert "méthode" in page and "Ã" not in page
    assert "is not the JSON Kiln writes" not in page and "not recorded in this file" not in page




def test_crafted_record_is_not_shown_in_part(cli, tmp_path):
    """A delegation record that parses but does not have the values Kiln writes (a negative count,
    an alternative the method does not have, a reason that is not a string pair) is refused whole,
    as unparsable JSON is; the same record with valid values is shown, with singular wording for 1."""
    pb = _relu_program()
    html = tmp_path / "r.html"

    def record(alternative=0, nodes=1, count=1, reasons='[["xnnpack","no lowering"]]', segments=1):
        return ('{"version":1,"methods":[{"name":"forward","alternative":%s,"nodes":%s,"requested":["xnnpack"],'
                '"backends":[{"backend":"xnnpack","segments":%s,"nodes":1,"constant_bytes":0}],'
                '"cpu_ops":[{"op":"<x>","count":%s,"reasons":%s}]}]}' % (alternative, nodes, segments, count, reasons))

    def page(value):
        pb.set_metadata("kiln.delegation", value)
        path = tmp_path / "m.kiln"
        path.write_bytes(pb.compile()[0])
        run(cli, "report", path, "-o", html)
        return html.read_text()

    good = page(record())
    assert "is not the JSON Kiln writes" not in good
    assert "1 node after passes" in good and "no lowering" in good and "&lt;x&gt;" in good
    assert "Metadata (1 key)" in good  # the only metadata key is kiln.delegation
    bad = [record(alternative=5), record(alternative=1), record(alternative=-1), record(nodes=-3),
           record(count=-1), record(count=1.5), record(count='"1"'), record(segments=-2),
           record(reasons="[[1,2]]"), record(reasons='[["xnnpack"]]'), record(reasons='"x"'),
           '{"version":1,"methods":[{"name":"forward","alternative":5,"nodes":-3,'
           '"cpu_ops":[{"op":"<x>","count":-1,"reasons":[[1,2]]}]}]}']  # the trial's record
    for value in bad:
        text = page(value)
        assert "is not the JSON Kiln writes" in text, value
        assert "18446744073709551613" not in text and "Alternative 6" not in text, value
        assert "1 instruction:" in text


@pytest.mark.skipif("xnnpack" not in BUILT_BACKENDS, reason="xnnpack not built")
def test_unavailable_method_does_not_claim_an_alternative_runs(cli, tmp_path):
    """A method whose only alternative needs a backend this machine lacks (xnnpack disabled): the page
    says it is not runnable and does not call the alternative "the one this machine runs"."""
    path = trace_program(tmp_path / "t.kiln", ("xnnpack",))
    html = tmp_path / "r.html"
    env = {**os.environ, "KILN_XNNPACK_DISABLE": "1"}
    p = subprocess.run([cli, "report", str(path), "-o", str(html)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    text = html.read_text()
    assert "Not runnable on this machine" in text and "<b>Alternative 1</b>: backends requested: xnnpack" in text
    assert "the one this machine runs" not in text and "runs here" not in text
    p = subprocess.run([cli, "report", str(path), "-o", str(html)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "KILN_XNNPACK_DISABLE": ""})
    assert p.returncode == 0, p.stderr
    text = html.read_text()
    assert "Not runnable on this machine" not in text and "(the one this machine runs)" in text


def test_tally_counts_are_singular_for_one(cli, tmp_path):
    """One optimized kernel call, one portable one: "1 optimized cpu kernel call", not "calls"."""
    path = tmp_path / "m.kiln"
    path.write_bytes(_relu_program().compile()[0])
    html = tmp_path / "r.html"
    run(cli, "report", path, "-o", html)
    text = html.read_text()
    info = json.loads(run(cli, "inspect", path, "--json").stdout)["methods"][0]
    assert info["num_instructions"] == 1
    assert "1 instruction:" in text and ("1 optimized cpu kernel call," in text or "1 portable kernel call," in text)
    assert "1 optimized cpu kernel calls" not in text and "1 portable kernel calls" not in text


def test_report_errors(cli, tmp_path):
    p = run(cli, "report", tmp_path / "missing.kiln", "-o", tmp_path / "x.html", ok=False)
    assert p.returncode == 1 and p.stderr.startswith("kiln report: NotFound"), p.stderr
    (tmp_path / "junk.kiln").write_bytes(b"\0" * 64)
    p = run(cli, "report", tmp_path / "junk.kiln", "-o", tmp_path / "x.html", ok=False)
    assert p.returncode == 1 and "InvalidProgram" in p.stderr, p.stderr
    assert not (tmp_path / "x.html").exists()
    p = run(cli, "report", tmp_path / "junk.kiln", ok=False)
    assert p.returncode == 2 and "--output" in p.stderr, p.stderr


def test_output_that_is_the_input_is_refused(cli, tmp_path):
    """`report -o` or `bench --trace` naming the program itself (or a link to it) is a usage error
    before any work, and the program is left as it was (it used to be overwritten, exit 0)."""
    prog = tmp_path / "p.kiln"
    data = _relu_program().compile()[0]
    prog.write_bytes(data)
    (tmp_path / "link.kiln").symlink_to(prog)
    for args in (("report", prog, "-o", prog), ("report", prog, "--profile", "-o", tmp_path / "link.kiln"),
                 ("bench", prog, "--runs", 1, "--trace", prog)):
        p = run(cli, *args, ok=False)
        assert p.returncode == 2 and "is the input file" in p.stderr and len(p.stderr.splitlines()) == 1, (args, p.stderr)
        assert prog.read_bytes() == data, args


# ---- kiln bench --trace ----

def trace_program(path, backends):
    """forward(x: f32[1, 4, 8, 8]) = cos(relu(conv(x))) + x[0, 0, 0, 0]-free: a convolution (delegated
    to xnnpack when asked) then ops xnnpack has no lowering for (aten.cos), so both kinds of event appear."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    g = kiln.Graph()
    x = g.add_input("x", "float32", [1, 4, 8, 8])
    wc = g.add_constant("w", "float32", [4, 4, 3, 3], w.view(np.uint8).reshape(-1))
    (c,) = g.add_node("aten.convolution", [x, wc, -1], {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1],
                                                          "transposed": False, "output_padding": [0, 0], "groups": 1})
    (r,) = g.add_node("aten.relu", [c])
    (s,) = g.add_node("aten.cos", [r])
    (t,) = g.add_node("aten.add", [s, x], {"alpha": 1.0})
    g.set_outputs([t])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile(backends=list(backends))
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("backends", [(), ("xnnpack",)], ids=["cpu", "xnnpack"])
def test_bench_trace(cli, tmp_path, backends):
    if backends and backends[0] not in BUILT_BACKENDS:
        pytest.skip(f"{backends[0]} not built")
    path = trace_program(tmp_path / "t.kiln", backends)
    trace = tmp_path / "trace.json"
    runs = 4
    p = run(cli, "bench", path, "--runs", runs, "--warmup", 1, "--threads", 1, "--json", "--trace", trace)
    bench = json.loads(p.stdout)
    meta = json.loads(run(cli, "inspect", path, "--json").stdout)["methods"][0]
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    for e in xs:
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e), e
        assert e["dur"] >= 0 and e["ts"] >= 0
    run_events = [e for e in xs if e["cat"] == "run"]
    ins_events = [e for e in xs if e["cat"] in ("kernel", "delegate")]
    assert len(run_events) == runs and len(xs) == len(run_events) + len(ins_events)
    executed = meta["num_instructions"] - bench["fused_instructions"]
    assert len(ins_events) == executed * runs, (len(ins_events), executed, runs)
    assert sum(e["cat"] == "delegate" for e in ins_events) == meta["num_delegate_calls"] * runs
    if backends:
        assert meta["num_delegate_calls"] >= 1
    for r, re_ in enumerate(run_events):
        mine = [e for e in ins_events if e["args"]["run"] == r]
        assert sorted(e["args"]["index"] for e in mine) == sorted({e["args"]["index"] for e in mine})
        assert len(mine) == executed
        slack = 0.002  # the %.3f rounding of microseconds
        for e in mine:
            assert re_["ts"] - slack <= e["ts"] and e["ts"] + e["dur"] <= re_["ts"] + re_["dur"] + slack, (e, re_)
        assert sum(e["dur"] for e in mine) <= re_["dur"] + slack
    # all runs together: no more than the profiled wall time
    assert sum(e["dur"] for e in ins_events) <= sum(e["dur"] for e in run_events) + 0.01


def test_bench_trace_unwritable(cli, tmp_path):
    path = trace_program(tmp_path / "t.kiln", ())
    p = run(cli, "bench", path, "--runs", 1, "--trace", tmp_path / "no" / "such" / "dir" / "t.json", ok=False)
    assert p.returncode == 1 and "cannot write" in p.stderr, p.stderr


def test_empty_output_path_is_a_usage_error(cli, tmp_path):
    """`kiln bench --trace ''` and `kiln report -o ''` exit 2 naming the option, and write nothing
    (an empty --trace used to mean "no trace": exit 0 with no file)."""
    path = trace_program(tmp_path / "t.kiln", ())
    for args in (("bench", path, "--runs", 1, "--trace", ""), ("report", path, "-o", "")):
        p = subprocess.run([cli, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        option = "--trace" if args[0] == "bench" else "--output"
        assert p.returncode == 2 and f"{option}: must not be empty" in p.stderr, (args, p.stderr)
        assert p.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["t.kiln"]

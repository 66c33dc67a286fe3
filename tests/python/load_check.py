"""The load-after-compile property (issue 22): a program that Kiln compiled with a delegate loads,
and every delegate segment of every method initializes, on a machine where its backends are
available. A program that cannot load must have failed at compile instead.

Two users:
- the test suite: tests/python/conftest.py takes this module's pytest hooks (it is also a pytest
  plugin: ``pytest -p load_check``), which install `install()`: every program compiled
  in the test process through ``kiln.ProgramBuilder.compile`` (the choke point under
  ``kiln.export``, ``kiln.export_program``, ``kiln.capture.compile_captures``, ``kiln.onnx`` and
  tests/python/delegate_util.py) that holds at least one delegate segment is loaded at once and
  each of its methods instantiated (``Program.load_method``, which runs every delegate's ``init``);
  nothing is executed. A failure raises LoadCheckError naming the test, and is recorded so that a
  test that swallows the exception still fails at teardown. Programs without a delegate segment
  are not touched. Set KILN_LOAD_CHECK=0 to switch the hook off (e.g. to time its cost).
- tests/python/test_zoo_load.py calls `init_every_method` on the zoo's programs.

Availability is forced for the check: xnnpack is enabled even when KILN_XNNPACK_DISABLE is set in
the test's environment, and mlx runs on the device KILN_LOAD_CHECK_MLX_DEVICE names (default
"cpu": MLX's CPU device, which every machine has). A program with alternatives (compile option
``alternatives``) is loaded once per alternative that the loader can be made to pick, by making
the backends of the alternatives before it unavailable (xnnpack: KILN_XNNPACK_DISABLE=1; mlx:
an mlx.device setting that is neither cpu nor gpu); each load checks that the loader picked the
alternative intended.

Not covered: programs compiled in another process (the `kiln` CLI, ``python -m kiln``, tests
that run Python in a subprocess) and programs compiled by the C++ tests.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

import pytest

import kiln
from kiln import _kiln

#: backends whose availability the check can switch off for a load (to reach a later alternative)
_DISABLE = {"xnnpack", "mlx"}

_lock = threading.RLock()
_state = {"installed": None, "programs": 0, "loads": 0, "seconds": 0.0}
#: messages of the failures seen by the hook, in order (conftest.py fails the test that caused each)
FAILURES: list[str] = []


class LoadCheckError(AssertionError):
    """A program compiled with a delegate did not load or a method did not initialize."""


def delegated_backends(report: dict) -> set[str]:
    """Delegate backends with at least one segment in any method (or alternative) of a compile
    report (the dict ``ProgramBuilder.compile`` returns)."""
    return {b["backend"] for m in report.get("methods", []) for b in (m.get("delegation") or {}).get("backends", [])
            if b.get("segments", 0) > 0}


def _method_backends(report: dict) -> dict[tuple[str, int], set[str]]:
    """{(method name, alternative index): the delegate backends with a segment in that lowering}."""
    out: dict[tuple[str, int], set[str]] = {}
    for m in report.get("methods", []):
        used = {b["backend"] for b in (m.get("delegation") or {}).get("backends", []) if b.get("segments", 0) > 0}
        out.setdefault((m["name"], int(m.get("alternative", 0))), set()).update(used)
    return out


def _xnnpack_off(value) -> bool:
    return value is not None and value != "" and value != "0"  # src/backends/xnnpack: is_available


@contextlib.contextmanager
def _xnnpack_env(disabled: bool):
    """KILN_XNNPACK_DISABLE set to "1" (disabled) or "" (enabled) for the block, then restored;
    the environment is left alone when it already says so (setenv is not thread-safe)."""
    old = os.environ.get("KILN_XNNPACK_DISABLE")
    if _xnnpack_off(old) == disabled:
        yield
        return
    os.environ["KILN_XNNPACK_DISABLE"] = "1" if disabled else ""
    try:
        yield
    finally:
        if old is None:
            del os.environ["KILN_XNNPACK_DISABLE"]
        else:
            os.environ["KILN_XNNPACK_DISABLE"] = old


def _settings(disabled: set[str], mlx_device: str | None) -> dict:
    device = "off (disabled for the load check)" if "mlx" in disabled else (
        mlx_device or os.environ.get("KILN_LOAD_CHECK_MLX_DEVICE") or "cpu")
    return {"mlx.device": device}


def init_every_method(data: bytes, report: dict | None = None, *, mlx_device: str | None = None) -> list[dict]:
    """Loads the program `data` (bytes from ProgramBuilder.compile / ExportResult.data) and
    instantiates every method, which initializes every delegate segment (nothing is executed).
    With the compile `report`, a program with alternatives is loaded once per alternative that can
    be reached by making the earlier alternatives' backends unavailable. mlx_device: "cpu" or
    "gpu" (default: $KILN_LOAD_CHECK_MLX_DEVICE, else "cpu").

    Returns one entry per load: {"alternative": k, "disabled": [backends], "methods": {name:
    alternative index the loader picked}, "program": the kiln.LoadedProgram, methods instantiated}. Raises kiln.KilnError from the loader (the program
    does not load, or a method's kernel prepare or delegate init failed) with the alternative in
    its message, and LoadCheckError when the loader did not pick the alternative expected."""
    per = _method_backends(report) if report is not None else {}
    n_alts = 1 + max((k for _, k in per), default=0)
    alt_used = [set().union(*[u for (_, j), u in per.items() if j == k]) for k in range(n_alts)]
    done, seen = [], set()
    for k in range(n_alts):
        disabled = set().union(*alt_used[:k]) - alt_used[k] if k else set()
        if k and (not disabled or not disabled <= _DISABLE or frozenset(disabled) in seen):
            continue  # unreachable (an earlier alternative needs nothing this one lacks) or loaded already
        seen.add(frozenset(disabled))
        where = f" (alternative {k}, with {', '.join(sorted(disabled))} made unavailable)" if k else ""
        with _xnnpack_env("xnnpack" in disabled):
            try:
                prog = kiln.load_bytes(data, backend_settings=_settings(disabled, mlx_device))
                picked = {name: int(prog.method(name).alternative["index"]) for name in prog.method_names}
            except kiln.KilnError as e:
                code = e.args[1] if len(e.args) > 1 else ""
                raise kiln.KilnError(f"{e.args[0]}{where}", code) from None
        if n_alts > 1:
            for name, p in picked.items():
                # the loader's rule: the first alternative whose backends are all available
                want = next((j for j in range(n_alts) if not per.get((name, j), set()) & disabled), None)
                if p != want:
                    raise LoadCheckError(f"method '{name}': the loader picked alternative {p}, expected {want}{where}")
        done.append({"alternative": k, "disabled": sorted(disabled), "methods": picked, "program": prog})
    return done


def check_compiled(data: bytes, report: dict, *, where: str = "") -> bool:
    """The hook's check of one compiled program: when it holds a delegate segment, loads it and
    initializes every method (init_every_method). Returns True when it was checked, False when it
    has no delegate segment. Raises LoadCheckError (recorded in FAILURES first) naming `where`
    (default: the running test, $PYTEST_CURRENT_TEST), the delegates and the loader's error."""
    backends = delegated_backends(report)
    if not backends:
        return False
    where = where or os.environ.get("PYTEST_CURRENT_TEST", "(no test)")
    t0 = time.perf_counter()
    with _lock:
        try:
            loads = init_every_method(data, report)
        except (kiln.KilnError, LoadCheckError) as e:
            msg = (f"load-after-compile: a program compiled in {where} with delegate(s) {', '.join(sorted(backends))} "
                   f"does not load and initialize: {e.args[0]}")
            FAILURES.append(msg)
            raise LoadCheckError(msg) from None
        finally:
            _state["seconds"] += time.perf_counter() - t0
        _state["programs"] += 1
        _state["loads"] += len(loads)
    return True


def stats() -> dict:
    """{"installed", "programs" (checked), "loads", "seconds" (spent in the checks)}."""
    return {"installed": _state["installed"] is not None, "programs": _state["programs"], "loads": _state["loads"],
            "seconds": _state["seconds"]}


def enabled_by_env() -> bool:
    """False when KILN_LOAD_CHECK is "0" (or empty / "off" / "false")."""
    return os.environ.get("KILN_LOAD_CHECK", "1").strip().lower() not in ("0", "", "off", "false", "no")


def install() -> bool:
    """Wraps ``kiln.ProgramBuilder.compile`` so that every program it returns is checked with
    check_compiled before the caller sees it. Idempotent. Returns True when the hook is active."""
    with _lock:
        if _state["installed"] is not None:
            return True
        original = _kiln.ProgramBuilder.compile

        def compile(self, *args, **kwargs):
            data, report = original(self, *args, **kwargs)
            check_compiled(data, report)
            return data, report

        compile.__doc__ = original.__doc__
        compile.__wrapped__ = original
        _kiln.ProgramBuilder.compile = compile
        _state["installed"] = original
    return True


def uninstall():
    """Restores the unwrapped ``kiln.ProgramBuilder.compile``."""
    with _lock:
        if _state["installed"] is not None:
            _kiln.ProgramBuilder.compile = _state["installed"]
            _state["installed"] = None


@contextlib.contextmanager
def suspended():
    """The hook switched off for the block (for tests that compile programs meant not to load)."""
    with _lock:
        was = _state["installed"] is not None
        uninstall()
    try:
        yield
    finally:
        if was:
            install()


# --------------------------------------------------------------------------------------------------
# pytest plugin (tests/python/conftest.py imports these; elsewhere: pytest -p load_check)

def pytest_configure(config):
    if enabled_by_env():
        install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call":
        item._kiln_call_failed = outcome.get_result().failed


@pytest.fixture(autouse=True)
def _load_after_compile(request):
    """Fails a test whose compiled program did not load even when the test caught the
    LoadCheckError (e.g. with pytest.raises(Exception)); a test that failed anyway is left as is."""
    first = len(FAILURES)
    yield
    new = FAILURES[first:]
    if new and not getattr(request.node, "_kiln_call_failed", False):
        pytest.fail("\n".join(new), pytrace=False)


#: the counts of pytest-xdist workers, added up in the controller (pytest_testnodedown)
_WORKERS = {"programs": 0, "loads": 0, "seconds": 0.0, "failures": 0, "installed": False}


def pytest_sessionfinish(session):
    """An xdist worker hands its counts to the controller (config.workeroutput)."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        s = stats()
        out["kiln_load_check"] = {**s, "failures": len(FAILURES)}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller adds up each xdist worker's counts (hook of pytest-xdist)."""
    w = getattr(node, "workeroutput", {}).get("kiln_load_check")
    if w:
        for k in ("programs", "loads", "seconds", "failures"):
            _WORKERS[k] += w[k]
        _WORKERS["installed"] |= w["installed"]


def pytest_terminal_summary(terminalreporter):
    s = stats()
    total = {"installed": s["installed"] or _WORKERS["installed"], "programs": s["programs"] + _WORKERS["programs"],
             "loads": s["loads"] + _WORKERS["loads"], "seconds": s["seconds"] + _WORKERS["seconds"],
             "failures": len(FAILURES) + _WORKERS["failures"]}
    if total["installed"] and total["programs"]:
        terminalreporter.write_line(f"load-after-compile: {total['programs']} program(s) with delegates loaded and "
                                    f"initialized ({total['loads']} load(s), {total['seconds']:.1f} s), "
                                    f"{total['failures']} failure(s)")

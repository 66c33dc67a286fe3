"""The suite's load-after-compile hook (tests/python/load_check.py, issue 22) catches what it is
for: a compiled program with a delegate whose init fails (its payload corrupted after compile)
raises LoadCheckError naming the test, the backend and the loader's error, and fails the test even
when the test swallows the exception; programs without a delegate segment are not loaded; a
program with alternatives is initialized once per alternative."""
from __future__ import annotations

import contextlib
import os
import struct
import sys

import pytest

import kiln
from kiln import _kiln
import load_check

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILT = set(_kiln.backend_names())
#: the first word of each delegate's payload (src/backends/<name>/*_backend.cpp kMagic, little-endian)
MAGIC = {"xnnpack": b"KXN1", "mlx": b"KMLX"}


def _graph():
    g = kiln.Graph()
    x = g.add_input("x", "float32", [2, 3])
    (r,) = g.add_node("aten.relu", [x], {})
    g.set_outputs([r])
    return g


def _corrupt_boundary_count(data: bytes, backend: str) -> bytes:
    """The program with the payload's input count (the word after the magic) set to 77: the
    loader's verifier cannot see it (the payload is the backend's), the backend's init refuses it."""
    at = data.find(MAGIC[backend])
    assert at >= 0 and data.find(MAGIC[backend], at + 1) < 0, f"one {backend} payload expected"
    b = bytearray(data)
    b[at + 4:at + 8] = struct.pack("<I", 77)
    return bytes(b)


@contextlib.contextmanager
def _hook_over(transform):
    """The hook installed over a ProgramBuilder.compile whose result passes through
    transform(data, report) -> data (a compiler bug stand-in). Failures the block records are
    returned in the yielded list and removed from load_check.FAILURES (the test checks them)."""
    recorded: list[str] = []
    with load_check.suspended():
        real = _kiln.ProgramBuilder.compile

        def buggy_compile(self, *args, **kwargs):
            data, report = real(self, *args, **kwargs)
            return transform(data, report), report

        _kiln.ProgramBuilder.compile = buggy_compile
        first = len(load_check.FAILURES)
        try:
            load_check.install()
            try:
                yield recorded
            finally:
                load_check.uninstall()
        finally:
            _kiln.ProgramBuilder.compile = real
            recorded.extend(load_check.FAILURES[first:])
            del load_check.FAILURES[first:]


@pytest.mark.parametrize("backend", ["xnnpack", "mlx"])
def test_hook_catches_a_delegate_init_failure(backend):
    if backend not in BUILT:
        pytest.skip(f"the {backend} backend is not built into this Kiln")
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", _graph())
    with _hook_over(lambda data, report: _corrupt_boundary_count(data, backend)) as recorded:
        with pytest.raises(load_check.LoadCheckError) as e:
            pb.compile(backends=[backend])
    msg = str(e.value)
    assert "test_hook_catches_a_delegate_init_failure" in msg, msg  # names the test
    assert f"delegate(s) {backend}" in msg and f"backend '{backend}' init failed" in msg, msg
    assert recorded == [msg]
    # without the corruption the same program loads (the failure was the payload's)
    data, _ = pb.compile(backends=[backend])
    assert load_check.init_every_method(data)[0]["methods"] == {"forward": 0}


@pytest.mark.skipif("xnnpack" not in BUILT, reason="needs the xnnpack backend")
def test_hook_checks_xnnpack_even_where_the_environment_disables_it(monkeypatch):
    monkeypatch.setenv("KILN_XNNPACK_DISABLE", "1")
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", _graph())
    with _hook_over(lambda data, report: _corrupt_boundary_count(data, "xnnpack")) as recorded:
        with pytest.raises(load_check.LoadCheckError, match="backend 'xnnpack' init failed"):
            pb.compile(backends=["xnnpack"])
    assert len(recorded) == 1 and os.environ["KILN_XNNPACK_DISABLE"] == "1"
    data, _ = pb.compile(backends=["xnnpack"])
    with pytest.raises(kiln.KilnError, match="KILN_XNNPACK_DISABLE"):  # the test itself still sees it disabled
        kiln.load_bytes(data).method("forward")


def test_hook_loads_only_programs_with_a_delegate_segment():
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", _graph())
    # garbage bytes: any load would fail, so passing through unchecked shows no load happened
    with _hook_over(lambda data, report: b"not a program") as recorded:
        before = load_check.stats()["programs"]
        data, report = pb.compile()
        assert data == b"not a program" and load_check.delegated_backends(report) == set()
        if "xnnpack" in BUILT:  # a delegate requested but no segment: not loaded either
            g = kiln.Graph()
            x = g.add_input("x", "int64", [4])
            (s,) = g.add_node("aten.cumsum", [x], {"dim": 0})
            g.set_outputs([s])
            pb2 = kiln.ProgramBuilder()
            pb2.add_method("forward", g)
            data2, report2 = pb2.compile(backends=["xnnpack"])
            assert data2 == b"not a program" and load_check.delegated_backends(report2) == set(), report2
        assert load_check.stats()["programs"] == before
    assert recorded == []


@pytest.mark.skipif(not {"xnnpack", "mlx"} <= BUILT, reason="needs the xnnpack and mlx backends")
def test_every_alternative_is_initialized():
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", _graph())
    data, report = pb.compile(alternatives=[["mlx"], ["xnnpack"], []])
    env = os.environ.get("KILN_XNNPACK_DISABLE")
    loads = load_check.init_every_method(data, report)
    # alternative 2 (cpu kernels) is reached by making mlx and xnnpack unavailable
    assert [(l["alternative"], l["disabled"], l["methods"]) for l in loads] == [
        (0, [], {"forward": 0}), (1, ["mlx"], {"forward": 1}), (2, ["mlx", "xnnpack"], {"forward": 2})]
    # a corrupted second alternative is caught although the loader prefers the first
    bad = _corrupt_boundary_count(data, "xnnpack")
    with pytest.raises(kiln.KilnError, match=r"backend 'xnnpack' init failed.*\(alternative 1, with mlx made unavailable\)"):
        load_check.init_every_method(bad, report)
    assert os.environ.get("KILN_XNNPACK_DISABLE") == env  # restored after each load


_SWALLOWING_TESTS = '''
import struct
import pytest
import kiln
from kiln import _kiln

REAL = _kiln.ProgramBuilder.compile.__wrapped__  # the hook is installed by -p load_check


def corrupted(self, *args, **kwargs):
    data, report = REAL(self, *args, **kwargs)
    at = data.find(b"KXN1")
    return data[:at + 4] + struct.pack("<I", 77) + data[at + 8:], report


def compile_corrupted():
    import load_check
    load_check.uninstall()
    _kiln.ProgramBuilder.compile = corrupted
    load_check.install()
    g = kiln.Graph()
    x = g.add_input("x", "float32", [2])
    g.set_outputs([g.add_node("aten.relu", [x], {})[0]])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    try:
        pb.compile(backends=["xnnpack"])
    finally:
        load_check.uninstall()
        _kiln.ProgramBuilder.compile = REAL
        load_check.install()


def test_swallows():
    with pytest.raises(Exception):
        compile_corrupted()


def test_propagates():
    compile_corrupted()


def test_clean():
    pass
'''


@pytest.mark.skipif("xnnpack" not in BUILT, reason="needs the xnnpack backend")
def test_a_swallowed_failure_still_fails_the_test(tmp_path):
    """In a pytest run with the plugin (-p load_check): the test that catches the LoadCheckError
    errors at teardown with the message, the test it propagated from fails once, the clean one passes."""
    import subprocess
    (tmp_path / "test_swallow.py").write_text(_SWALLOWING_TESTS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.path.dirname(__file__)]),
               KILN_LOAD_CHECK="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "load_check", "-p", "no:cacheprovider",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_swallow.py")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 failed, 2 passed, 1 error" in out, out
    assert "ERROR at teardown of test_swallows" in out, out
    assert "FAILED test_swallow.py::test_propagates" in out and "ERROR test_swallow.py::test_propagates" not in out, out
    assert "a program compiled in test_swallow.py::test_swallows (call) with delegate(s) xnnpack" in out, out
    assert "load-after-compile:" in out, out


def test_the_suite_runs_with_the_hook():
    """conftest.py installs the hook for the whole suite unless KILN_LOAD_CHECK=0."""
    on = os.environ.get("KILN_LOAD_CHECK", "1") != "0"
    assert load_check.enabled_by_env() == on and load_check.stats()["installed"] == on
    assert hasattr(_kiln.ProgramBuilder.compile, "__wrapped__") == on

"""Runtime behaviour seen from Python: sharing a loaded program between threads, odd paths."""
import os
import threading

import numpy as np
import pytest

import kiln
from oprunner import kiln_dtype


def _program(tmp_path):
    # forward(x: float32[64, 64]) = relu(x + 2 * c) with c = 0.5 .. (a chain long enough that a
    # concurrent execute on the same arena would be visible in the results).
    rng = np.random.default_rng(0)
    c = rng.standard_normal((64, 64)).astype(np.float32)
    g = kiln.Graph()
    x = g.add_input("x", "float32", [64, 64])
    cid = g.add_constant("c", kiln_dtype(c), [64, 64], c.view(np.uint8).reshape(-1))
    v = x
    for _ in range(8):
        (v,) = g.add_node("aten.add", [v, cid], {"alpha": 2.0})
        (v,) = g.add_node("aten.relu", [v])
    g.set_outputs([v])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile()
    path = tmp_path / "chain.kiln"
    path.write_bytes(data)
    return path, c


def _reference(x, c):
    v = x
    for _ in range(8):
        v = np.maximum(v + np.float32(2.0) * c, 0)
    return v


def test_threads_sharing_one_loaded_program_get_their_own_results(tmp_path):
    path, c = _program(tmp_path)
    prog = kiln.load(path)
    inputs = [np.full((64, 64), float(k), np.float32) for k in range(4)]
    expected = [_reference(x, c) for x in inputs]
    failures = []

    def worker(k):
        for _ in range(50):
            (out,) = prog.run(inputs[k])
            if not np.array_equal(out, expected[k]):
                failures.append(k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_loading_a_fifo_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(kiln.KilnError) as e:
        kiln.load(fifo)
    assert "not a regular file" in e.value.args[0]


def test_float64_input_error_names_the_input_and_the_expected_type(tmp_path):
    path, _ = _program(tmp_path)
    with pytest.raises(kiln.KilnError) as e:
        kiln.load(path).run(np.zeros((64, 64)))  # float64
    msg, code = e.value.args
    assert code == "InvalidArgument"
    assert "input 0 'x'" in msg and "float32[64, 64]" in msg and "float64" in msg


def test_export_cli_errors_are_one_line(tmp_path):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "python"))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a state dict")
    cases = [
        (["--model", "get_model"], "unknown torchvision model"),
        (["--model", "resnet18", "--weights", str(bad)], "cannot read --weights"),
    ]
    for extra, want in cases:
        p = subprocess.run([sys.executable, "-m", "kiln", "export", *extra, "-o", str(tmp_path / "x.kiln")],
                           capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 2, p.stderr
        assert want in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "kiln", "export", "--model", "resnet18", "-o", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2 and "is a directory" in p.stderr and "Traceback" not in p.stderr, p.stderr

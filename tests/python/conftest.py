import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

# Under pytest-xdist (scripts/test.sh runs `pytest -n 2`), each worker process gets its own temporary
# folder before MLX is loaded: MLX's CPU device compiles kernels into $TMPDIR/mlx/<version>/cpu and
# checks only that the .so exists before loading it, so two processes compiling the same kernel at
# once could load a half-written library. Set here, it holds for this process and its children.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import tempfile

    _worker_tmp = os.path.join(tempfile.gettempdir(), f"kiln-pytest-{os.environ['PYTEST_XDIST_WORKER']}")
    os.makedirs(_worker_tmp, exist_ok=True)
    os.environ["TMPDIR"] = _worker_tmp
    tempfile.tempdir = None  # re-read TMPDIR
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Eager references independent of the machine's core count: PyTorch splits reductions and
# matmuls by thread, which changes their summation order (and last bits) with the number of cores.
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

# The load-after-compile property (issue 22; tests/python/load_check.py, a pytest plugin): every
# program compiled in this process with a delegate segment is loaded and each method initialized as
# soon as it is compiled; a failure raises LoadCheckError naming the test. KILN_LOAD_CHECK=0 switches
# it off.
from load_check import (_load_after_compile, pytest_configure, pytest_runtest_makereport,  # noqa: E402,F401
                        pytest_sessionfinish, pytest_terminal_summary, pytest_testnodedown)


def _cpu_target_line() -> str:
    """Names the SIMD target of the cpu kernels in this run (include/kiln/cpu_target.h), and stops
    the run when KILN_CPU_TARGET asks for one that is not the one in use: a per-target rerun
    (scripts/test.sh, section targets) must never pass at another target than the one it names."""
    import kiln

    wanted = os.environ.get("KILN_CPU_TARGET", "")
    try:
        actual = kiln.cpu_target()
    except Exception as e:  # a refused KILN_CPU_TARGET: kiln.cpu_target() raises InvalidArgument
        raise pytest.UsageError(f"KILN_CPU_TARGET={wanted!r}: {e}") from e
    if wanted and wanted != actual:
        raise pytest.UsageError(f"KILN_CPU_TARGET={wanted!r} but the cpu kernels run at {actual!r}")
    return f"kiln cpu target: {actual} (available: {', '.join(kiln.available_cpu_targets())})"


def pytest_sessionstart(session):
    """The check of _cpu_target_line, at every verbosity (pytest -q skips report headers)."""
    line = _cpu_target_line()
    if session.config.get_verbosity() < 0:
        print(line)


def pytest_report_header(config):
    return _cpu_target_line()

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Eager references independent of the machine's core count: PyTorch splits reductions and
# matmuls by thread, which changes their summation order (and last bits) with the number of cores.
import torch  # noqa: E402

torch.set_num_threads(1)

# The load-after-compile property (issue 22; tests/python/load_check.py, a pytest plugin): every
# program compiled in this process with a delegate segment is loaded and each method initialized as
# soon as it is compiled; a failure raises LoadCheckError naming the test. KILN_LOAD_CHECK=0 switches
# it off.
from load_check import (_load_after_compile, pytest_configure, pytest_runtest_makereport,  # noqa: E402,F401
                        pytest_terminal_summary)

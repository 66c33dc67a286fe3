import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Eager references independent of the machine's core count: PyTorch splits reductions and
# matmuls by thread, which changes their summation order (and last bits) with the number of cores.
import torch  # noqa: E402

torch.set_num_threads(1)

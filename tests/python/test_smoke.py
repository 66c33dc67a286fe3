import numpy as np
import torch

from oprunner import assert_close, run_op


def test_add_alpha_broadcast_matches_torch():
    rng = np.random.default_rng(0)
    for alpha in (1, 0.5, 10, -2):
        x = rng.standard_normal((2, 3, 4), dtype=np.float32)
        y = rng.standard_normal((3, 1), dtype=np.float32)
        (out,) = run_op("aten.add", [x, y], {"alpha": alpha})
        ref = torch.add(torch.from_numpy(x), torch.from_numpy(y), alpha=alpha).numpy()
        assert_close(out, ref, what=f"alpha={alpha}")

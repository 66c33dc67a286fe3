"""The cpu kernels for aten.permute / aten.transpose / aten.slice (src/kernels/cpu/shape.cpp:
the portable strided copy with its rows split over the pool, for outputs of 128 KiB and more)
against PyTorch eager, at 1, 2 and 3 threads, in several dtypes, including row splits that start
in the middle of an outer dimension."""
import numpy as np
import pytest
import torch

import kiln

torch.set_num_threads(1)


class Moves(torch.nn.Module):
    def forward(self, x):
        a = x.permute(0, 2, 1, 3)            # heads <-> tokens: contiguous inner rows
        b = x.permute(0, 3, 1, 2)            # inner dim strided (a transpose of the last dims)
        c = x.transpose(1, 3)
        d = x[:, :, 5:-3:2, :]               # slice with a step
        e = x.narrow(3, 1, x.shape[3] - 2)   # slice of the inner dim
        return a, b, c, d, e


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8])
@pytest.mark.parametrize("shape", [(1, 333, 8, 40), (2, 37, 13, 129), (1, 3, 7, 5)])
def test_data_movement_matches_eager(dtype, shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(*shape, generator=g) * 50).to(dtype)
    expected = [t.contiguous().numpy() for t in Moves()(x)]
    data = kiln.export(Moves(), (x,), verbose=False).data
    for threads in (1, 2, 3):
        outs = kiln.load_bytes(data, num_threads=threads).run(x.numpy())
        assert len(outs) == len(expected)
        for i, (o, e) in enumerate(zip(outs, expected)):
            assert o.dtype == e.dtype and o.shape == e.shape, (i, o.dtype, o.shape, e.shape)
            assert np.array_equal(o, e), f"output {i}, {dtype}, {shape}, {threads} threads"

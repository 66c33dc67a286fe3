"""Load-time preparation of the cpu convolution kernel (weights packed once per method, the
activation after a convolution fused into its stores) against PyTorch eager, at 1 and 2 threads.

The model has the layer shapes of MobileNetV3 blocks (stem 3x3 stride 2, depthwise 3x3 and 5x5
at stride 1 and 2, squeeze-excite 1x1 on a 1x1 input, 1x1 projections, a residual) followed by
every fusable activation (relu, hardswish, hardsigmoid, relu6 = hardtanh, clamp, sigmoid, silu).
The bit-identity of fused and unfused results is tested in C++ (tests/cpp/cpu_fusion_test.cpp).

fp32 tolerance: max abs error <= 3e-5 * max|expected| (sums over up to 72 * 9 products).
"""
import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close

torch.set_num_threads(1)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        c = torch.nn.Conv2d
        self.stem = c(3, 16, 3, stride=2, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)
        self.expand = c(16, 48, 1)
        self.dw3 = c(48, 48, 3, padding=1, groups=48)
        self.se1 = c(48, 12, 1)
        self.se2 = c(12, 48, 1)
        self.project = c(48, 16, 1)
        self.dw5 = c(16, 16, 5, stride=2, padding=2, groups=16)
        self.c6 = c(16, 24, 1)
        self.cc = c(24, 24, 3, padding=1, groups=24)
        self.csig = c(24, 24, 1)
        self.csilu = c(24, 20, 3, stride=2, padding=1)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.bn(self.stem(x)))
        y = torch.relu(self.expand(y))
        y = torch.nn.functional.hardswish(self.dw3(y))
        s = torch.nn.functional.adaptive_avg_pool2d(y, 1)
        s = torch.nn.functional.hardsigmoid(self.se2(torch.relu(self.se1(s))))
        y = self.project(y * s) + x[:, :1, ::2, ::2]  # residual (broadcast over channels)
        y = torch.nn.functional.hardswish(self.dw5(y))
        y = torch.nn.functional.relu6(self.c6(y))
        y = torch.clamp(self.cc(y), min=-0.5)
        y = torch.sigmoid(self.csig(y))
        return torch.nn.functional.silu(self.csilu(y))


@pytest.fixture(scope="module")
def exported():
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(1, 3, 56, 60)
    with torch.no_grad():
        expected = model(x)
    res = kiln.export(model, (x,), verbose=False)
    return res.data, x.numpy(), expected.numpy()


def _has_avx2_fma():
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_matches_eager_and_portable(exported, threads):
    data, x, expected = exported
    cpu = kiln.load_bytes(data, num_threads=threads)
    out = cpu.run(x)[0]
    assert_close(out, expected, rel=3e-5, what=f"cpu kernels, {threads} threads")
    ref = kiln.load_bytes(data, num_threads=threads, portable_kernels_only=True)
    assert_close(ref.run(x)[0], expected, rel=3e-5, what="portable kernels")
    assert ref.method().num_fused_instructions == 0
    assert ref.method().prepared_bytes == 0
    if _has_avx2_fma():
        # Every activation directly after a convolution: 10 of the 12 convolutions.
        assert cpu.method().num_fused_instructions == 10
        assert cpu.method().prepared_bytes > 0  # the 1x1 and im2col weights, packed once


def test_repeated_runs_reuse_prepared_state(exported):
    """The packed weights are read-only state: running twice, and from a second method instance,
    gives the same bits."""
    data, x, _ = exported
    a = kiln.load_bytes(data, num_threads=2)
    first = a.run(x)[0]
    second = a.run(x)[0]
    other = kiln.load_bytes(data, num_threads=2).run(x)[0]
    assert np.array_equal(first, second)
    assert np.array_equal(first, other)

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


@pytest.mark.parametrize("portable", [False, True])
def test_activation_after_conv_shares_its_buffer(portable):
    """conv -> relu -> conv -> silu: each activation takes its convolution output's arena bytes
    (computed in place, or fused into the convolution's stores), so the arena holds the input and
    two feature maps, not four; results equal eager with the cpu kernels and with portable ones."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.SiLU()).eval()
    x = torch.randn(1, 3, 32, 32)
    res = kiln.export(model, (x,), verbose=False)
    fmap = 8 * 32 * 32 * 4
    assert res.report["methods"][0]["arena_bytes"] <= 3 * 32 * 32 * 4 + 2 * fmap, res.report["methods"][0]
    with torch.no_grad():
        expected = model(x).numpy()
    got = kiln.load_bytes(res.data, portable_kernels_only=portable).run(x.numpy())[0]
    assert_close(got, expected, rel=1e-5, what=f"conv+activation in place (portable={portable})")
    # The activation output that is also read by a later node keeps its own life: relu's output
    # feeds both the next conv and the residual add.
    class Res(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.b = torch.nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.a(x))
            return torch.relu(self.b(y)) + y

    m2 = Res().eval()
    x2 = torch.randn(1, 8, 20, 24)
    with torch.no_grad():
        expected2 = m2(x2).numpy()
    data2 = kiln.export(m2, (x2,), verbose=False).data
    got2 = kiln.load_bytes(data2, portable_kernels_only=portable).run(x2.numpy())[0]
    assert_close(got2, expected2, rel=1e-5, what=f"residual over in-place activations (portable={portable})")


@pytest.mark.parametrize("portable", [False, True])
def test_conv_output_that_is_a_method_output_is_not_overwritten(portable):
    """A convolution output returned by the method keeps its own bytes (the activation after it
    must not run in place over it): both outputs equal eager (relu's differ from the conv's)."""
    class TwoOut(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(4, 6, 3, padding=1)

        def forward(self, x):
            y = self.c(x)
            return y, torch.relu(y)

    torch.manual_seed(2)
    m = TwoOut().eval()
    x = torch.randn(1, 4, 9, 11)
    with torch.no_grad():
        e1, e2 = (t.numpy() for t in m(x))
    assert (e1 < 0).any()
    got = kiln.load_bytes(kiln.export(m, (x,), verbose=False).data, portable_kernels_only=portable).run(x.numpy())
    assert_close(got[0], e1, rel=1e-5, what="conv output")
    assert_close(got[1], e2, rel=1e-5, what="relu output")

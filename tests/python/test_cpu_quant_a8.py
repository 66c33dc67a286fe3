"""Int8 activations (issue 19): kiln.weight_quantized_linear with activation_bits = 8 (w4a8 / w8a8)
on the portable and cpu kernels against a NumPy reference written from the rule in
src/ir/ops/quant.h (not from Kiln's code): each row of x quantized in blocks of 32 columns,
d = max|x| / 127 in float32, q = round-half-even(x / d) clamped to [-127, 127], then the exact
integer block sums, scaled and summed in float64. Also: the error against the float op stays
within the documented bound, non-finite inputs give NaN rows, and the export options.

scripts/test.sh reruns this file at KILN_CPU_TARGET=avx2 and scalar (vpmaddubsw and the scalar
block loop), beside the best target of the machine (vpdpbusd on AVX512-VNNI)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close
from test_quant import needs_mlx, quantize, run_both, run_mlx

BLOCK = 32


def quantize_x(x: np.ndarray):
    """(q int64 [m, k], d float32 [m, k / 32]) by the rule of src/ir/ops/quant.h."""
    m, k = x.shape
    xb = x.astype(np.float32).reshape(m, k // BLOCK, BLOCK)
    finite = np.isfinite(xb).all(axis=-1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(xb), xb, 0)).max(axis=-1), 0).astype(np.float32)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.rint((xb / d[..., None]).astype(np.float32)), -127, 127)
    q = np.where((d > 0)[..., None], q, 0).astype(np.int64)
    d = np.where(finite, d, np.float32(np.nan)).astype(np.float32)
    return q.reshape(m, k), d


def a8_reference(x, packed, scales, zeros, scheme, group_size):
    """float32 [m, n]: sum over blocks of d * (s * sum(wq q) + z * sum(q)) in float64 (bias added by
    the caller), with wq the signed weight codes (u - 8 for 4-bit, the int8 value for 8-bit)."""
    m, k = x.shape
    n = scales.shape[0]
    gs = k if scheme.startswith("w8") else min(group_size, k)
    if scheme.startswith("w8"):
        wq = packed.view(np.int8).reshape(n, k).astype(np.int64)
    else:
        b = packed.view(np.uint8).reshape(n, -1)
        wq = np.stack([b & 0xF, b >> 4], axis=-1).reshape(n, -1)[:, :k].astype(np.int64) - 8
    q, d = quantize_x(x)
    nb = k // BLOCK
    s1 = np.einsum("nbc,mbc->mnb", wq.reshape(n, nb, BLOCK), q.reshape(m, nb, BLOCK))  # exact int64
    s2 = q.reshape(m, nb, BLOCK).sum(-1)  # [m, nb]
    grp = np.arange(nb) * BLOCK // gs
    s = scales.astype(np.float64)[:, grp]  # [n, nb]
    z = zeros.astype(np.float64)[:, grp] if zeros is not None else np.zeros_like(s)
    with np.errstate(invalid="ignore"):
        out = (d.astype(np.float64)[:, None, :] * (s[None] * s1 + z[None] * s2[:, None, :])).sum(-1)
    return out


CASES = [  # (scheme, group_size, symmetric, scale_dtype, K values)
    ("w4a8", 32, True, "float16", (32, 96, 1056)),    # 1 block; an unpaired last block; 33 blocks
    ("w4a8", 32, False, "float32", (64, 160)),        # zero points
    ("w4a8", 64, True, "float32", (64, 320)),
    ("w4a8", 96, False, "float16", (96, 288)),        # 3 blocks per group: pairs straddle groups
    ("w4a8", 128, True, "float16", (128, 384)),
    ("w4a8", 160, False, "float32", (160,)),          # one group per row, zero points
    ("w8a8", 0, True, "float32", (32, 96, 1056)),
    ("w8a8", 0, True, "float16", (224,)),
]


@pytest.mark.parametrize("scheme,group_size,symmetric,scale_dtype,ks", CASES)
def test_a8_linear_matches_numpy(scheme, group_size, symmetric, scale_dtype, ks):
    """Decode (m <= 4: the integer matrix-vector kernels) and prefill (m = 7, 17: the integer GEMM
    on AVX512-VNNI, 4 rows x 32 columns per tile, with row and column tails; elsewhere the input
    quantized, then the float GEMM) on the portable and cpu kernels, N = 1, 3, 17, 45, with and
    without bias, 1 and 2 threads, against the NumPy reference."""
    rng = np.random.default_rng(11)
    bits = 8 if scheme.startswith("w8") else 4
    for n in (1, 3, 17, 45):
        for k in ks:
            w = rng.standard_normal((n, k)).astype(np.float32)
            packed, s, z, _ = quantize(w, scheme[:2], group_size, symmetric, scale_dtype)
            bias = rng.standard_normal(n).astype(np.float32) if n != 3 else None
            for m in (1, 2, 4, 7, 17):
                x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, size=(m, 1))).astype(np.float32)
                x[:, :BLOCK] *= 0.001  # blocks of very different magnitude in one row
                expected = a8_reference(x, packed, s, z, scheme, group_size) + (0 if bias is None else bias)
                attrs = {"bits": bits, "group_size": group_size, "activation_bits": 8}
                for threads in (1, 2):
                    got = run_both("kiln.weight_quantized_linear", x, [packed, s, z, bias], attrs, num_threads=threads)
                    for y, kind in zip(got, ("portable", "cpu")):
                        assert_close(y, expected.astype(np.float32), 2e-6,
                                     f"{kind} {scheme} g{group_size} n={n} k={k} m={m} threads={threads}")


def test_a8_error_against_the_float_op():
    """The documented bound (docs/quantization.md): for Gaussian inputs, int8 activation blocks move
    the output of a random layer by an RMS error of about 0.6% of the output's RMS against the
    weight-only op on the same weights (rounding error d / sqrt(12) per input, d = max|x| / 127 of
    its block; llama.cpp's Q8_0 activations are the same rule with roundf)."""
    rng = np.random.default_rng(3)
    k, n = 2048, 64
    w = rng.standard_normal((n, k)).astype(np.float32)
    packed, s, z, wd = quantize(w, "w4", 32, True, "float16")
    for m in (1, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        plain = (x.astype(np.float64) @ wd.astype(np.float64).T).astype(np.float32)
        _, got = run_both("kiln.weight_quantized_linear", x, [packed, s, z, None],
                          {"bits": 4, "group_size": 32, "activation_bits": 8})
        rel = np.sqrt(np.mean((got - plain) ** 2) / np.mean(plain ** 2))
        assert 1e-3 < rel < 1e-2, rel  # changed (the activations are quantized), within the bound


@pytest.mark.parametrize("m", [1, 5])
def test_a8_non_finite_input_gives_nan_rows(m):
    """A block holding inf or NaN makes its row of the output NaN (not a finite wrong value); the
    other rows are unaffected; an all-zero block contributes 0."""
    rng = np.random.default_rng(4)
    k, n = 128, 5
    w = rng.standard_normal((n, k)).astype(np.float32)
    packed, s, z, _ = quantize(w, "w4", 32, True, "float32")
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, 40] = np.inf
    if m > 1:
        x[1, 3] = np.nan
        x[2, 64:96] = 0.0
    expected = a8_reference(x, packed, s, z, "w4a8", 32)
    for y, kind in zip(run_both("kiln.weight_quantized_linear", x, [packed, s, z, None],
                                {"bits": 4, "group_size": 32, "activation_bits": 8}), ("portable", "cpu")):
        assert np.isnan(y[0]).all(), kind
        if m > 1:
            assert np.isnan(y[1]).all(), kind
        assert np.isfinite(y[2:]).all(), kind
        assert_close(y[2:], expected[2:].astype(np.float32), 2e-6, kind)


def test_a8_rounding_ties_to_even():
    """Inputs whose x / d is exactly k + 0.5 (d = 1: the block's max |x| is 127) round half to even
    (2.5 -> 2, 3.5 -> 4, -2.5 -> -2) on both kernel sets, as numpy.rint does."""
    k, n = 64, 4
    rng = np.random.default_rng(8)
    w = rng.standard_normal((n, k)).astype(np.float32)
    packed, s, z, _ = quantize(w, "w4", 32, True, "float32")
    ties = np.array([127, 2.5, 3.5, -2.5, -3.5, 0.5, 1.5, -0.5, 126.5, -126.5] + [0.25] * 22, np.float32)
    x = np.stack([np.concatenate([ties, ties[::-1]]), np.concatenate([ties * 2, -ties])]).astype(np.float32)
    expected = a8_reference(x, packed, s, z, "w4a8", 32).astype(np.float32)
    for m in (1, 2):
        for y, kind in zip(run_both("kiln.weight_quantized_linear", x[:m], [packed, s, z, None],
                                    {"bits": 4, "group_size": 32, "activation_bits": 8}), ("portable", "cpu")):
            assert_close(y, expected[:m], 2e-6, f"{kind} m={m}")


def test_a8_layouts_refused():
    """activation_bits other than 0 / 8, or 8 with K or the group size not a multiple of 32, is
    InvalidArgument at compile (the loader runs the same check)."""
    rng = np.random.default_rng(5)
    for k, gs, abits in ((48, 48, 8), (64, 16, 8), (64, 32, 4)):
        w = rng.standard_normal((3, k)).astype(np.float32)
        packed, s, z, _ = quantize(w, "w4", gs, True, "float32")
        x = np.zeros((1, k), np.float32)
        with pytest.raises(kiln.KilnError, match="activation_bits"):
            run_both("kiln.weight_quantized_linear", x, [packed, s, z, None],
                     {"bits": 4, "group_size": gs, "activation_bits": abits})


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 96)
        self.odd = torch.nn.Linear(96, 40)   # K = 96: with groups of 64 a short last group (32 columns)
        self.down = torch.nn.Linear(40, 8)   # K = 40: stays at float32 activations

    def forward(self, x):
        return self.down(torch.relu(self.odd(torch.relu(self.up(x)))))


@pytest.mark.parametrize("scheme,group_size", [("w4a8", 32), ("w4a8", 64), ("w8a8", 128)])
def test_export_a8_sets_activation_bits_where_the_layout_allows(scheme, group_size):
    """kiln.export(quantize="w4a8" / "w8a8"): every linear is quantized; those whose K and group size
    are multiples of 32 carry activation_bits = 8 (shown in the report's quantized count and in the
    program's output, which equals the NumPy reference layer by layer), the others keep float32
    activations."""
    torch.manual_seed(0)
    mod = MLP().eval()
    x = torch.randn(3, 64)
    r = kiln.export(mod, (x,), quantize=scheme, group_size=group_size, verbose=False)
    assert r.report["methods"][0]["num_quantized"] == 3
    got = kiln.load_bytes(r.data).run(x.numpy())[0]
    # The reference, layer by layer, on the same quantized weights.
    h = x.numpy()
    for lin in (mod.up, mod.odd, mod.down):
        w = lin.weight.detach().numpy()
        k = w.shape[1]
        packed, s, z, wd = quantize(w, scheme[:2], group_size, True, "float32")
        gs = k if scheme == "w8a8" else min(group_size, k)
        if k % BLOCK == 0 and gs % BLOCK == 0:
            h = a8_reference(h, packed, s, z, scheme, group_size) + lin.bias.detach().numpy()
        else:
            h = h.astype(np.float64) @ wd.astype(np.float64).T + lin.bias.detach().numpy()
        h = h.astype(np.float32)
        if lin is not mod.down:
            h = np.maximum(h, 0)
    assert_close(got, h, 1e-5, scheme)


@needs_mlx
def test_mlx_a8_fake_quantizes_the_input():
    """mlx (MLX's CPU device) lowers activation_bits = 8 as the input quantized and dequantized in the
    graph, then the existing quantized lowering: every node delegated, equal to the NumPy reference."""
    rng = np.random.default_rng(6)
    cases, expected = [], []
    for scheme, gs, symmetric, k in (("w4a8", 32, True, 96), ("w4a8", 64, False, 320), ("w8a8", 0, True, 160)):
        w = rng.standard_normal((17, k)).astype(np.float32)
        packed, s, z, _ = quantize(w, scheme[:2], gs, symmetric, "float32")
        x = rng.standard_normal((3, k)).astype(np.float32)
        cases.append(("kiln.weight_quantized_linear", x, [packed, s, z, None],
                      {"bits": 8 if scheme == "w8a8" else 4, "group_size": gs, "activation_bits": 8}))
        expected.append(a8_reference(x, packed, s, z, scheme, gs).astype(np.float32))
    got, mlx_nodes, cpu_ops = run_mlx(cases)
    assert mlx_nodes == len(cases), cpu_ops
    for (_, x, _, attrs), y, e in zip(cases, got, expected):
        assert_close(y, e, 1e-5, f"mlx {attrs} k={x.shape[1]}")

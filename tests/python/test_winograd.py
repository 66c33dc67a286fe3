"""The cpu kernels' Winograd F(4x4, 3x3) and F(2x2, 3x3) convolution (src/kernels/cpu/winograd.cpp) against PyTorch
eager: sizes that are not multiples of the 4x4 tile or of the 8-tile groups, channel counts that are
not multiples of the SIMD width or of the GEMM's blocks (C_in > 256: two K blocks), padding 0 / 1 /
2, with and without bias, with a fused relu / silu, at 1 and 2 threads.

KILN_CPU_WINOGRAD=1 (read when a method is loaded) sends every 3x3 stride-1 convolution to the
Winograd path whatever its size (=2: the F(2x2, 3x3) variant); =0 never (then the im2col GEMM runs). Tolerance (issue 6): max abs
error <= 1e-4 * max|expected| (F(4x4, 3x3) in float32 measures ~1e-6..1e-5 here).
"""
import os

import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close

torch.set_num_threads(1)



# (input shape, C_out, padding, bias, activation)
CASES = [
    ((1, 16, 1, 1), 16, 1, True, None),         # one output pixel: one tile, one lane
    ((1, 5, 3, 5), 7, 1, False, "relu"),        # partial tile in both directions
    ((2, 19, 7, 9), 21, 1, True, "silu"),       # batch 2: tiles of both images in one block
    ((1, 33, 33, 31), 17, 1, True, None),       # 9 tiles per row: a group of 8 and a group of 1
    ((1, 16, 33, 31), 24, 0, True, "relu"),     # no padding
    ((1, 9, 34, 35), 18, (2, 1), False, None),  # padding 2 rows / 1 column
    ((1, 300, 12, 40), 20, 1, True, None),      # C_in > 256: two K blocks in the GEMMs
    ((1, 24, 70, 140), 40, 1, True, "relu"),    # 35 tiles per row, several tile blocks per thread
    ((1, 128, 28, 28), 128, 1, True, None),     # resnet's 28x28 stage: blocks of 2 groups (one 16-column panel)
    # F(2x2, 3x3) with <= 4 tiles per row packs two tile rows per 8-lane group ("pair" groups):
    ((1, 40, 7, 7), 36, 1, True, "relu"),       # 4x4 tiles (resnet's 7x7 stage), last column partial
    ((2, 17, 9, 6), 10, 1, False, None),        # 5 tile rows (odd: the last group's row B is empty), batch 2
    ((1, 12, 10, 8), 20, 0, True, "silu"),      # no padding: 4x3 tiles, every row read directly
    ((1, 8, 6, 6), 9, (2, 1), True, None),      # padding 2 rows / 1 column: 4x3 tiles, masked loads
]


def _model(cin, cout, padding, bias, act):
    layers = [torch.nn.Conv2d(cin, cout, 3, padding=padding, bias=bias)]
    if act == "relu":
        layers.append(torch.nn.ReLU())
    elif act == "silu":
        layers.append(torch.nn.SiLU())
    return torch.nn.Sequential(*layers).eval()


def _run(data, x, threads, monkeypatch, winograd):
    monkeypatch.setenv("KILN_CPU_WINOGRAD", winograd)
    prog = kiln.load_bytes(data, num_threads=threads)
    return prog.run(x)[0], prog.method().num_fused_instructions


@pytest.mark.parametrize("case", CASES, ids=[f"w{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("variant", ["1", "2"], ids=["f4x4", "f2x2"])
def test_winograd_matches_eager(case, threads, variant, monkeypatch):
    shape, cout, padding, bias, act = case
    torch.manual_seed(3)
    model = _model(shape[1], cout, padding, bias, act)
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = model(x).numpy()
    data = kiln.export(model, (x,), verbose=False).data
    wino, fused = _run(data, x.numpy(), threads, monkeypatch, variant)
    gemm, _ = _run(data, x.numpy(), threads, monkeypatch, "0")
    assert_close(wino, expected, rel=1e-4, what=f"winograd conv {case}")
    # The Winograd path really ran: its float32 rounding differs from the im2col GEMM's.
    assert not np.array_equal(wino, gemm), "KILN_CPU_WINOGRAD=1 did not select the Winograd path"
    assert fused == (1 if act else 0)


@pytest.mark.parametrize("cout", [64, 3])
def test_default_rule_takes_winograd_for_decoder_sized_convs(cout, monkeypatch):
    """Without the override, a 64-channel 3x3 conv on 256x256 (the full-size decoder's shape; also
    its 64 -> 3 output conv) takes the Winograd path, and F(4x4, 3x3)'s float32 error there stays
    far below the 1e-4 bound."""
    torch.manual_seed(5)
    model = _model(64, cout, 1, True, "relu")
    x = torch.randn(1, 64, 256, 256)
    with torch.no_grad():
        expected = model(x).numpy()
    data = kiln.export(model, (x,), verbose=False).data
    monkeypatch.delenv("KILN_CPU_WINOGRAD", raising=False)
    auto = kiln.load_bytes(data, num_threads=2).run(x.numpy())[0]
    gemm, _ = _run(data, x.numpy(), 2, monkeypatch, "0")
    assert not np.array_equal(auto, gemm), "the default rule did not select the Winograd path"
    err = float(np.abs(auto - expected).max() / np.abs(expected).max())
    assert err <= 2e-5, f"Winograd F(4x4, 3x3) error {err:.2e} of max|expected|"


def test_default_rule_keeps_small_convs_on_gemm(monkeypatch):
    """14x14 outputs (16 tiles, half of each 8-tile group empty), convs of 4 input channels and
    convs whose transformed filters exceed 4 MiB with fewer than 16 output tiles of 2x2 (256 -> 256
    on 6x6: 9; 2048 -> 1040 on 8x8: 16, but F(2x2, 3x3) filters over 32 MiB) stay on the im2col GEMM
    (bit-identical to KILN_CPU_WINOGRAD=0)."""
    monkeypatch.delenv("KILN_CPU_WINOGRAD", raising=False)
    for shape, cout in (((1, 64, 14, 14), 64), ((1, 4, 64, 64), 64), ((1, 256, 6, 6), 256), ((1, 2048, 8, 8), 1040)):
        torch.manual_seed(6)
        model = _model(shape[1], cout, 1, True, None)
        x = torch.randn(*shape)
        data = kiln.export(model, (x,), verbose=False).data
        monkeypatch.delenv("KILN_CPU_WINOGRAD", raising=False)
        auto = kiln.load_bytes(data, num_threads=1).run(x.numpy())[0]
        gemm, _ = _run(data, x.numpy(), 1, monkeypatch, "0")
        np.testing.assert_array_equal(auto, gemm)


# Large filters (36 C_in C_out floats > 4 MiB: winograd.cpp's conv_large, blocks of tiles shared by
# all threads, filters packed in output-channel chunks of <= 384 rows): F(4x4, 3x3) with >= 64 tiles
# of 4x4 in the batch (>= 16 for filters of <= 32 MiB transformed), else F(2x2, 3x3) with >= 64 tiles of
# 2x2 (>= 16 for filters of <= 32 MiB transformed) (variant: KILN_CPU_WINOGRAD value
# that gives the same result).
LARGE_CASES = [
    ((1, 1280, 32, 32), 96, "relu", "1"),  # 1280 input channels: 5 K blocks; 64 tiles, one block
    ((2, 300, 36, 44), 400, None, "1"),    # 2 output-channel chunks, 3 blocks of tile groups, partial groups
    ((1, 1280, 16, 16), 208, "silu", "2"),  # the SD UNet's 16x16 level: 64 tiles of 2x2 (F(4x4, 3x3) filters over 32 MiB)
    ((2, 300, 13, 15), 800, None, "2"),    # F(2x2, 3x3): partial 2x2 tiles, 2 images, 3 chunks (F(4x4): > 32 MiB)
    ((1, 512, 7, 7), 512, None, "2"),      # resnet's 7x7 stage: 16 tiles of 2x2, two tile rows per group
    ((1, 256, 14, 14), 256, "relu", "1"),  # resnet's 14x14 stage: 16 tiles of 4x4, two tile rows per group
    ((1, 640, 14, 14), 96, None, "1"),     # F(4x4, 3x3) pairs with 3 K blocks
    ((1, 256, 8, 8), 320, None, "2"),      # an 8x8 plane: 16 tiles, pairs, 1 chunk
]


@pytest.mark.parametrize("case", LARGE_CASES, ids=["cin1280", "cout400", "f2x2_cin1280", "f2x2_cout400", "f2x2_7x7",
                                                  "f4x4_14x14", "f4x4_14x14_cin640", "f2x2_8x8"])
@pytest.mark.parametrize("threads", [1, 2])
def test_default_rule_takes_winograd_for_large_filters(case, threads, monkeypatch):
    """The SD UNet's sizes: filters over 4 MiB take the Winograd variant the rule names without
    the override (bit-identical to that variant forced, different from the other and from the
    im2col GEMM), within 1e-4 of eager."""
    shape, cout, act, variant = case
    torch.manual_seed(7)
    model = _model(shape[1], cout, 1, True, act)
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = model(x).numpy()
    data = kiln.export(model, (x,), verbose=False).data
    monkeypatch.delenv("KILN_CPU_WINOGRAD", raising=False)
    prog = kiln.load_bytes(data, num_threads=threads)
    auto = prog.run(x.numpy())[0]
    assert prog.method().num_fused_instructions == (1 if act else 0)
    assert_close(auto, expected, rel=1e-4, what=f"winograd conv {case}")
    forced, _ = _run(data, x.numpy(), threads, monkeypatch, variant)
    other, _ = _run(data, x.numpy(), threads, monkeypatch, "2" if variant == "1" else "1")
    gemm, _ = _run(data, x.numpy(), threads, monkeypatch, "0")
    np.testing.assert_array_equal(auto, forced)
    assert not np.array_equal(auto, other), "the default rule took the other Winograd variant"
    assert not np.array_equal(auto, gemm), "the default rule did not select the Winograd path"


def test_unknown_winograd_setting_is_reported():
    """KILN_CPU_WINOGRAD other than 0/1/2 is said once on stderr (then the default policy)."""
    import subprocess
    import sys
    code = ("import torch, kiln\n"
            "m = torch.nn.Conv2d(16, 16, 3, padding=1); x = torch.randn(1, 16, 32, 32)\n"
            "for _ in range(2): kiln.load_bytes(kiln.export(m, (x,), verbose=False).data).run(x.numpy())\n")
    env = dict(os.environ, KILN_CPU_WINOGRAD="yes")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("ignoring KILN_CPU_WINOGRAD='yes'") == 1, r.stderr

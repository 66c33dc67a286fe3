"""Upsampling ops (src/ir/ops/upsample.cpp, src/kernels/portable/upsample.cpp) against PyTorch eager.

Kiln gets the arguments PyTorch's own kernel gets: F.interpolate(scale_factor=s) reaches
aten.upsample_*2d.vec, which calls the kernel with output_size = floor(in * s) and scales = s
(checked below against torch.ops.aten directly). Tolerance: max abs err <= 1e-5 * max|expected|;
nearest upsampling must match exactly.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from oprunner import assert_close, kiln_dtype, run_op

A = torch.ops.aten

SHAPES = [(1, 1, 23, 23), (2, 3, 7, 5), (1, 2, 1, 1), (1, 1, 5, 8), (2, 1, 10, 10)]


def rand(rng, shape):
    return rng.uniform(-3, 3, size=shape).astype(np.float32)


def expect_rejected(op, x, attrs, code, *words):
    g = kiln.Graph()
    xid = g.add_input("x", kiln_dtype(x), list(x.shape))
    with pytest.raises(kiln.KilnError) as ei:
        g.add_node(op, [xid], attrs)
    message, got_code = ei.value.args
    assert got_code == code, message
    for w in words:
        assert w in message, f"{w!r} not in {message!r}"


def scaled_size(shape, s):
    """What aten.upsample_*2d.vec computes from scale_factors (int64 cast of in * s)."""
    return [int(math.floor(shape[2] * s)), int(math.floor(shape[3] * s))]


# ---------------------------------------------------------------- nearest

def nonempty(scales):
    """(shape, scale) pairs whose scaled output is not empty."""
    return [(sh, s) for sh in SHAPES for s in scales if min(scaled_size(sh, s)) > 0]


@pytest.mark.parametrize("shape,s", nonempty([2.0, 1.6, 3.0, 0.5, 1.0, 2.5, 0.7]))
def test_nearest_scale_factor(shape, s):
    out_size = scaled_size(shape, s)
    x = rand(np.random.default_rng(sum(shape)), shape)
    ref = F.interpolate(torch.from_numpy(x), scale_factor=s, mode="nearest").numpy()
    # The capture passes what eager's .vec overload passes to the kernel:
    np.testing.assert_array_equal(A.upsample_nearest2d(torch.from_numpy(x), out_size, s, s).numpy(), ref)
    (out,) = run_op("aten.upsample_nearest2d", [x], {"output_size": out_size, "scales_h": s, "scales_w": s})
    np.testing.assert_array_equal(out, ref, err_msg=f"{shape} scale {s}")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("size", [(46, 46), (11, 8), (3, 17), (1, 1), (7, 5), (14, 10)])
def test_nearest_explicit_size(shape, size):
    x = rand(np.random.default_rng(sum(shape) + sum(size)), shape)
    ref = F.interpolate(torch.from_numpy(x), size=size, mode="nearest").numpy()
    (out,) = run_op("aten.upsample_nearest2d", [x], {"output_size": list(size)})
    np.testing.assert_array_equal(out, ref, err_msg=f"{shape} -> {size}")


def test_nearest_different_scales_per_axis_and_scale_not_matching_size():
    """scales win over in/out when given (compute_scales_value), even if they disagree with output_size;
    an unchanged axis is copied and an exactly doubled axis uses dst >> 1 whatever the scale (nearest_idx)."""
    x = rand(np.random.default_rng(5), (1, 2, 7, 9))
    cases = [((11, 14), 1.6, 1.6), ((12, 13), 1.75, 1.5), ((10, 10), 1.3, None), ((9, 9), None, 0.9),
             ((14, 18), 1.6, 1.7), ((7, 18), 1.3, 2.5)]
    for size, sh, sw in cases:
        ref = A.upsample_nearest2d(torch.from_numpy(x), list(size), sh, sw).numpy()
        (out,) = run_op("aten.upsample_nearest2d", [x], {"output_size": list(size), "scales_h": sh, "scales_w": sw})
        np.testing.assert_array_equal(out, ref, err_msg=f"{size} {sh} {sw}")


def test_nearest_uint8():
    x = np.random.default_rng(2).integers(0, 255, size=(1, 3, 7, 5), dtype=np.uint8)
    ref = F.interpolate(torch.from_numpy(x), scale_factor=1.6, mode="nearest").numpy()
    (out,) = run_op("aten.upsample_nearest2d", [x], {"output_size": [11, 8], "scales_h": 1.6, "scales_w": 1.6})
    np.testing.assert_array_equal(out, ref)


# ---------------------------------------------------------------- bilinear

@pytest.mark.parametrize("shape,s", nonempty([2.0, 1.6, 0.5, 3.0, 0.7, 1.0]))
@pytest.mark.parametrize("align_corners", [False, True])
def test_bilinear_scale_factor(shape, s, align_corners):
    out_size = scaled_size(shape, s)
    x = rand(np.random.default_rng(sum(shape) + int(10 * s)), shape)
    ref = F.interpolate(torch.from_numpy(x), scale_factor=s, mode="bilinear", align_corners=align_corners).numpy()
    direct = A.upsample_bilinear2d(torch.from_numpy(x), out_size, align_corners, s, s).numpy()
    np.testing.assert_array_equal(direct, ref)  # the arguments below are what eager passes
    (out,) = run_op("aten.upsample_bilinear2d", [x],
                    {"output_size": out_size, "align_corners": align_corners, "scales_h": s, "scales_w": s})
    assert_close(out, ref, what=f"{shape} scale {s} align_corners={align_corners}")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("size", [(46, 46), (11, 8), (3, 17), (1, 1), (7, 5), (4, 2), (1, 6)])
@pytest.mark.parametrize("align_corners", [False, True])
def test_bilinear_explicit_size(shape, size, align_corners):
    x = rand(np.random.default_rng(sum(shape) + sum(size)), shape)
    ref = F.interpolate(torch.from_numpy(x), size=size, mode="bilinear", align_corners=align_corners).numpy()
    (out,) = run_op("aten.upsample_bilinear2d", [x], {"output_size": list(size), "align_corners": align_corners})
    assert_close(out, ref, what=f"{shape} -> {size} align_corners={align_corners}")


def test_bilinear_scales_not_matching_size():
    x = rand(np.random.default_rng(9), (1, 2, 7, 9))
    for size, sh, sw in [((11, 14), 1.6, 1.6), ((12, 13), 1.75, 1.5), ((10, 10), 1.3, None), ((9, 9), None, 0.9)]:
        for align in (False, True):
            ref = A.upsample_bilinear2d(torch.from_numpy(x), list(size), align, sh, sw).numpy()
            (out,) = run_op("aten.upsample_bilinear2d", [x],
                            {"output_size": list(size), "align_corners": align, "scales_h": sh, "scales_w": sw})
            assert_close(out, ref, what=f"{size} {sh} {sw} align={align}")


# ---------------------------------------------------------------- extreme scales stay in bounds

def test_extreme_scales_stay_in_bounds():
    """Huge/tiny/non-positive scales must never index outside the input (PyTorch's cast is undefined
    for non-finite indices; Kiln clamps to the last pixel). Non-positive scales mean in/out."""
    x = rand(np.random.default_rng(4), (1, 1, 5, 6))
    for s in (1e-30, 1e30, 0.0, -2.0, float("inf")):
        (out,) = run_op("aten.upsample_nearest2d", [x], {"output_size": [9, 7], "scales_h": s, "scales_w": s})
        assert out.shape == (1, 1, 9, 7) and np.isin(out, x).all()
        (out,) = run_op("aten.upsample_bilinear2d", [x],
                        {"output_size": [9, 7], "align_corners": False, "scales_h": s, "scales_w": s})
        assert out.shape == (1, 1, 9, 7) and np.isfinite(out).all() and np.abs(out).max() <= np.abs(x).max() + 1e-6
    for s in (0.0, -2.0):  # treated as None, like PyTorch
        ref = A.upsample_bilinear2d(torch.from_numpy(x), [9, 7], False, s, s).numpy()
        (out,) = run_op("aten.upsample_bilinear2d", [x], {"output_size": [9, 7], "align_corners": False,
                                                         "scales_h": s, "scales_w": s})
        assert_close(out, ref)


# ---------------------------------------------------------------- rejections

def test_upsample_rejections():
    x = np.zeros((1, 2, 4, 4), np.float32)
    for op, extra in (("aten.upsample_nearest2d", {}), ("aten.upsample_bilinear2d", {"align_corners": False})):
        expect_rejected(op, x, {"output_size": [8], **extra}, "InvalidArgument", "output_size")
        expect_rejected(op, x, {"output_size": [8, 8, 8], **extra}, "InvalidArgument", "output_size")
        expect_rejected(op, x, {"output_size": [0, 8], **extra}, "InvalidArgument", "output_size")
        expect_rejected(op, x, {"output_size": [8, -1], **extra}, "InvalidArgument", "output_size")
        expect_rejected(op, x, {"output_size": [1 << 40, 1 << 20], **extra}, "InvalidArgument", "too large")
        expect_rejected(op, x, extra, "InvalidArgument", "output_size")
        expect_rejected(op, np.zeros((2, 4, 4), np.float32), {"output_size": [8, 8], **extra}, "InvalidArgument", "rank 4")
        expect_rejected(op, np.zeros((1, 2, 0, 4), np.float32), {"output_size": [8, 8], **extra}, "InvalidArgument",
                        "greater than 0")
        expect_rejected(op, x, {"output_size": [8, 8], "scales_h": "2", **extra}, "InvalidArgument", "scales_h")
        expect_rejected(op, x, {"output_size": [8, 8], "mode": "nearest", **extra}, "InvalidArgument", "mode")
    expect_rejected("aten.upsample_bilinear2d", x, {"output_size": [8, 8]}, "InvalidArgument", "align_corners")
    expect_rejected("aten.upsample_bilinear2d", x.astype(np.int64), {"output_size": [8, 8], "align_corners": True},
                    "NotSupported", "int64")


def test_larger_inputs_split_across_threads():
    x = rand(np.random.default_rng(8), (2, 16, 32, 32))
    for align in (False, True):
        ref = F.interpolate(torch.from_numpy(x), scale_factor=1.6, mode="bilinear", align_corners=align).numpy()
        (out,) = run_op("aten.upsample_bilinear2d", [x],
                        {"output_size": [51, 51], "align_corners": align, "scales_h": 1.6, "scales_w": 1.6})
        assert_close(out, ref)

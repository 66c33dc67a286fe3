"""Spatial ops (src/ir/ops/spatial_extra.cpp) against PyTorch eager: reflection/replication
padding, 3-D pooling, grid_sampler_2d, col2im, _cdist_forward, _pdist_forward, and their capture
(F.pad modes, F.fold, batch norm overloads).

Each case runs the same torch.ops.aten op with the same arguments; where eager rejects a
configuration, Kiln must reject it too (kiln.KilnError at graph building). Non-finite grid
coordinates are compared with the documented rule (GridSampler.h formulas with IEEE fmax/fmin
clipping), checked against float64 math, not with eager float32.
"""
import itertools
import math
import zlib

import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close, run_op

A = torch.ops.aten
F = torch.nn.functional
torch.set_num_threads(1)


def _rand(shape, key, scale=1.0):
    rng = np.random.default_rng(zlib.crc32(str(key).encode()))
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _check(op, inputs, attrs, ref_fn, what, num_outputs=1):
    """run_op(op) must equal ref_fn(*torch inputs), or both must reject the call."""
    try:
        ref = ref_fn(*[torch.from_numpy(x) for x in inputs])
    except (RuntimeError, IndexError, ValueError):
        with pytest.raises(kiln.KilnError):
            run_op(op, inputs, attrs)
        return False
    refs = ref if isinstance(ref, tuple) else (ref,)
    outs = run_op(op, inputs, attrs)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert_close(o, r.numpy(), what=what)
    return True


# ---------------------------------------------------------------- padding

PAD_CASES = []
for n, shape in [(1, (2, 3, 5)), (1, (3, 4)), (2, (2, 2, 4, 5)), (2, (3, 3, 4)), (3, (2, 1, 3, 4, 5)), (3, (2, 3, 3, 2))]:
    for pads in [(1, 2), (0, 0), (-1, 2), (3, -2), (4, 0), (-3, -2), (5, 5)]:
        full = list(pads) + [1, 0, 2, -1][: 2 * (n - 1)] if n > 1 else list(pads)
        PAD_CASES.append((n, shape, full))
    if n > 1:
        PAD_CASES.append((n, shape, [0, 0] * (n - 1) + [-1, 3]))


@pytest.mark.parametrize("kind", ["reflection", "replication"])
@pytest.mark.parametrize("case", PAD_CASES, ids=lambda c: f"{c[0]}d-{c[1]}-{c[2]}")
def test_pad_matches_torch(kind, case):
    n, shape, pads = case
    op = f"{kind}_pad{n}d"
    x = _rand(shape, (kind, case))
    _check(f"aten.{op}", [x], {"padding": pads}, lambda t: getattr(A, op)(t, pads), f"{op} {shape} {pads}")


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_, np.float16])
def test_pad_copies_every_dtype(dtype):
    x = (np.arange(2 * 3 * 4) % 5).astype(dtype).reshape(2, 3, 4)
    for op in ("reflection_pad2d", "replication_pad2d"):
        (out,) = run_op(f"aten.{op}", [x], {"padding": [2, 1, -1, 2]})
        ref = getattr(A, op)(torch.from_numpy(x.astype(np.float32)), [2, 1, -1, 2]).numpy().astype(dtype)
        np.testing.assert_array_equal(out, ref)


def test_pad_rejects_bad_arguments():
    x = _rand((1, 2, 3, 3), "bad")
    with pytest.raises(kiln.KilnError, match="less than the corresponding input dimension"):
        run_op("aten.reflection_pad2d", [x], {"padding": [3, 0, 0, 0]})
    with pytest.raises(kiln.KilnError, match="too small"):
        run_op("aten.replication_pad2d", [x], {"padding": [-2, -1, 0, 0]})
    with pytest.raises(kiln.KilnError, match="padding must have 4 values"):
        run_op("aten.replication_pad2d", [x], {"padding": [1, 1]})
    with pytest.raises(kiln.KilnError, match="non-zero"):
        run_op("aten.replication_pad2d", [np.zeros((1, 0, 3, 3), np.float32)], {"padding": [1, 1, 1, 1]})
    with pytest.raises(kiln.KilnError, match="3-D or 4-D"):
        run_op("aten.reflection_pad2d", [np.zeros((3, 3), np.float32)], {"padding": [1, 1, 1, 1]})


def test_pad_empty_batch():
    x = np.zeros((0, 2, 3, 4), np.float32)
    for op in ("reflection_pad2d", "replication_pad2d"):
        (out,) = run_op(f"aten.{op}", [x], {"padding": [1, 2, 2, 1]})
        assert out.shape == tuple(getattr(A, op)(torch.from_numpy(x), [1, 2, 2, 1]).shape)


# ---------------------------------------------------------------- 3-D pooling

POOL3D_SHAPES = [(2, 2, 5, 6, 7), (3, 4, 4, 5), (1, 1, 1, 1, 1)]
POOL3D_GEOMS = [([2], [], [0]), ([3], [2], [1]), ([3, 2, 1], [1, 2, 1], [1, 1, 0]), ([2, 3, 3], [2], [0, 1, 1])]


@pytest.mark.parametrize("shape", POOL3D_SHAPES, ids=str)
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_avg_pool3d_matches_torch(shape, ceil_mode):
    x = _rand(shape, ("avg3", shape))
    valid = 0
    for (k, s, p), (cip, dv) in itertools.product(POOL3D_GEOMS, [(True, None), (False, None), (True, 5), (False, -3)]):
        attrs = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil_mode, count_include_pad=cip, divisor_override=dv)
        valid += _check("aten.avg_pool3d", [x], attrs, lambda t: A.avg_pool3d(t, k, s, p, ceil_mode, cip, dv),
                        f"avg_pool3d {shape} {attrs}")
    assert shape == (1, 1, 1, 1, 1) or valid > 0


@pytest.mark.parametrize("shape", POOL3D_SHAPES, ids=str)
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool3d_with_indices_matches_torch(shape, ceil_mode):
    x = _rand(shape, ("max3", shape))
    x.flat[::7] = x.flat[0]  # ties: the first maximum's index wins
    for (k, s, p), d in itertools.product(POOL3D_GEOMS, [[1], [2, 1, 1]]):
        attrs = dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil_mode)
        _check("aten.max_pool3d_with_indices", [x], attrs,
               lambda t: A.max_pool3d_with_indices(t, k, s, p, d, ceil_mode), f"max_pool3d {shape} {attrs}")


def test_max_pool3d_propagates_nan_and_infinities():
    # the definition: any NaN in the window -> NaN (index of the last NaN); an all -inf window -> -inf
    x = np.full((1, 1, 2, 2, 4), -np.inf, np.float32)
    x[0, 0, 0, 0, 0] = np.nan
    x[0, 0, 1, 1, 0] = np.nan
    x[0, 0, 1, 0, 3] = 7.0
    vals, idx = run_op("aten.max_pool3d_with_indices", [x], {"kernel_size": [2, 2, 2]})
    assert np.isnan(vals[0, 0, 0, 0, 0]) and idx[0, 0, 0, 0, 0] == 1 * 8 + 1 * 4 + 0
    assert vals[0, 0, 0, 0, 1] == 7.0 and idx[0, 0, 0, 0, 1] == 1 * 8 + 0 * 4 + 3


def test_pool3d_rejects_bad_arguments():
    x = _rand((1, 2, 3, 3, 3), "bad3")
    with pytest.raises(kiln.KilnError, match="padding should be at most half"):
        run_op("aten.avg_pool3d", [x], {"kernel_size": [2], "padding": [2]})
    with pytest.raises(kiln.KilnError, match="divisor_override"):
        run_op("aten.avg_pool3d", [x], {"kernel_size": [2], "divisor_override": 0})
    with pytest.raises(kiln.KilnError, match="too small"):
        run_op("aten.max_pool3d_with_indices", [x], {"kernel_size": [4]})
    with pytest.raises(kiln.KilnError, match="kernel_size"):
        run_op("aten.max_pool3d_with_indices", [x], {"kernel_size": [2, 2]})


@pytest.mark.parametrize("shape,out", [((2, 3, 5, 6, 7), [2, 3, 4]), ((3, 4, 5, 6), [4, 5, 6]), ((1, 2, 3, 3, 3), [1, 1, 1]),
                                       ((1, 1, 2, 3, 5), [7, 1, 3]), ((0, 2, 3, 3, 3), [2, 2, 2])], ids=str)
def test_adaptive_avg_pool3d_matches_torch(shape, out):
    x = _rand(shape, ("aap3", shape))
    _check("aten._adaptive_avg_pool3d", [x], {"output_size": out}, lambda t: A._adaptive_avg_pool3d(t, out),
           f"adaptive_avg_pool3d {shape} {out}")


@pytest.mark.parametrize("shape,out", [((2, 3, 5, 7), [2, 3]), ((3, 4, 5), [4, 5]), ((1, 2, 3, 3), [1, 1]),
                                       ((1, 1, 2, 5), [7, 3]), ((0, 2, 3, 3), [2, 2]), ((2, 2, 5, 6, 7), [2, 3, 4]),
                                       ((3, 4, 5, 6), [4, 1, 6]), ((1, 1, 2, 3, 5), [7, 1, 3])], ids=str)
def test_adaptive_max_pool_matches_torch(shape, out):
    x = _rand(shape, ("amp", shape))
    x.flat[::5] = x.flat[1] if x.size > 1 else 0  # ties: the first maximum's index wins
    op = f"adaptive_max_pool{len(out)}d"
    _check(f"aten.{op}", [x], {"output_size": out}, lambda t: getattr(A, op)(t, out), f"{op} {shape} {out}")


def test_adaptive_max_pool_nan_and_bad_arguments():
    # the definition: a NaN in the window wins (the last NaN's index); an all -inf window keeps index 0
    x = np.full((1, 1, 2, 4), -np.inf, np.float32)
    x[0, 0, 0, 1] = np.nan
    x[0, 0, 1, 0] = np.nan
    vals, idx = run_op("aten.adaptive_max_pool2d", [x], {"output_size": [1, 2]})
    assert np.isnan(vals[0, 0, 0, 0]) and idx[0, 0, 0, 0] == 4
    assert vals[0, 0, 0, 1] == -np.inf and idx[0, 0, 0, 1] == 2
    with pytest.raises(kiln.KilnError, match="output_size must have 3 values"):
        run_op("aten.adaptive_max_pool3d", [_rand((1, 2, 3, 3, 3), "ampb")], {"output_size": [1, 1]})
    with pytest.raises(kiln.KilnError, match="non-zero"):
        run_op("aten.adaptive_max_pool2d", [np.zeros((1, 2, 0, 3), np.float32)], {"output_size": [1, 1]})


# ---------------------------------------------------------------- grid_sampler_2d

GRID_SHAPES = [((2, 3, 5, 7), (2, 4, 6)), ((1, 2, 1, 1), (1, 3, 2)), ((1, 1, 4, 3), (1, 1, 5))]


@pytest.mark.parametrize("interp", [0, 1, 2], ids=["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", [0, 1, 2], ids=["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sampler_2d_matches_torch(interp, padding, align):
    for k, (xs, gs) in enumerate(GRID_SHAPES):
        x = _rand(xs, ("gx", k))
        g = _rand(gs + (2,), ("gg", k, interp, padding), scale=0.9)  # mostly inside, some out of range
        g.flat[::5] *= 3.5  # well outside [-1, 1]: padding decides
        attrs = {"interpolation_mode": interp, "padding_mode": padding, "align_corners": align}
        _check("aten.grid_sampler_2d", [x, g], attrs, lambda t, u: A.grid_sampler_2d(t, u, interp, padding, align),
               f"grid_sampler_2d {xs} {attrs}")


@pytest.mark.parametrize("interp", [0, 1], ids=["trilinear", "nearest"])
@pytest.mark.parametrize("padding", [0, 1, 2], ids=["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sampler_3d_matches_torch(interp, padding, align):
    for k, (xs, gs) in enumerate([((2, 3, 4, 5, 3), (2, 3, 2, 4)), ((1, 2, 1, 1, 2), (1, 2, 1, 3))]):
        x = _rand(xs, ("g3x", k))
        g = _rand(gs + (3,), ("g3g", k, interp, padding), scale=0.9)
        g.flat[::5] *= 3.5
        attrs = {"interpolation_mode": interp, "padding_mode": padding, "align_corners": align}
        _check("aten.grid_sampler_3d", [x, g], attrs, lambda t, u: A.grid_sampler_3d(t, u, interp, padding, align),
               f"grid_sampler_3d {xs} {attrs}")


def test_grid_sampler_3d_declines_bicubic():
    with pytest.raises(kiln.KilnError, match="bicubic"):
        run_op("aten.grid_sampler_3d", [_rand((1, 1, 2, 2, 2), "b3"), _rand((1, 1, 1, 2, 3), "b3g")],
               {"interpolation_mode": 2, "padding_mode": 0, "align_corners": False})


def _unnormalize(c, size, align):
    return (c + 1) * (size - 1) / 2 if align else (c + 1) * size / 2 - 0.5


def _pad(v, size, padding, align):
    # GridSampler.h compute_coordinates, clip with IEEE fmax/fmin (NaN -> 0), in float64
    if padding == 0:
        return v
    if padding == 2:
        lo, span = (0.0, size - 1.0) if align else (-0.5, float(size))
        if span <= 0:
            v = 0.0
        else:
            e = math.fmod(abs(v - lo), 2 * span) if math.isfinite(v) else math.nan
            v = min(e, 2 * span - e) + lo if not math.isnan(e) else math.nan
    return float(np.fmin(size - 1.0, np.fmax(v, 0.0)))


def _bilinear_ref(img, gx, gy, padding, align):
    """float64 bilinear sample of one (H, W) plane by the formula: taps outside read 0 and keep their weight."""
    H, W = img.shape
    fx, fy = _pad(_unnormalize(gx, W, align), W, padding, align), _pad(_unnormalize(gy, H, align), H, padding, align)
    x0, y0 = math.floor(fx) if math.isfinite(fx) else math.nan, math.floor(fy) if math.isfinite(fy) else math.nan
    tx, ty = fx - x0, fy - y0
    total = 0.0
    for dy, wy in ((0, 1 - ty), (1, ty)):
        for dx, wx in ((0, 1 - tx), (1, tx)):
            xi, yi = x0 + dx, y0 + dy
            inside = math.isfinite(xi) and math.isfinite(yi) and 0 <= xi < W and 0 <= yi < H
            total += wy * wx * (float(img[int(yi), int(xi)]) if inside else 0.0)
    return total


def test_grid_sampler_2d_non_finite_coordinates():
    img = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4) + 1
    coords = [(math.nan, 0.0), (math.inf, 0.0), (-math.inf, 0.0), (0.2, math.nan), (5.0, 0.3), (-5.0, 0.1)]
    g = np.array([[coords]], np.float32)
    for padding, align in itertools.product([0, 1, 2], [False, True]):
        attrs = {"interpolation_mode": 0, "padding_mode": padding, "align_corners": align}
        (out,) = run_op("aten.grid_sampler_2d", [img, g], attrs)
        want = np.array([[[[_bilinear_ref(img[0, 0].astype(np.float64), cx, cy, padding, align) for cx, cy in coords]]]])
        assert_close(out, want.astype(np.float32), what=f"bilinear padding={padding} align={align}")
    # nearest, zeros: a NaN coordinate is outside the image -> 0; border: NaN clips to 0
    (out,) = run_op("aten.grid_sampler_2d", [img, g], {"interpolation_mode": 1, "padding_mode": 0, "align_corners": False})
    assert out[0, 0, 0, 0] == 0 and out[0, 0, 0, 3] == 0
    (out,) = run_op("aten.grid_sampler_2d", [img, g], {"interpolation_mode": 1, "padding_mode": 1, "align_corners": False})
    assert out[0, 0, 0, 0] == img[0, 0, 1, 0] and out[0, 0, 0, 1] == img[0, 0, 1, 3]
    # bicubic weights come from the unpadded coordinate: non-finite -> NaN in every padding mode
    for padding in (0, 1, 2):
        (out,) = run_op("aten.grid_sampler_2d", [img, g], {"interpolation_mode": 2, "padding_mode": padding,
                                                           "align_corners": True})
        assert np.isnan(out[0, 0, 0, :4]).all() and np.isfinite(out[0, 0, 0, 4:]).all()


def test_grid_sampler_2d_rejects_bad_arguments():
    x, g = _rand((1, 2, 3, 3), "gb"), _rand((1, 2, 2, 2), "gb2")
    with pytest.raises(kiln.KilnError, match="interpolation_mode"):
        run_op("aten.grid_sampler_2d", [x, g], {"interpolation_mode": 3, "padding_mode": 0, "align_corners": False})
    with pytest.raises(kiln.KilnError, match="padding_mode"):
        run_op("aten.grid_sampler_2d", [x, g], {"interpolation_mode": 0, "padding_mode": 5, "align_corners": False})
    with pytest.raises(kiln.KilnError, match="batch size"):
        run_op("aten.grid_sampler_2d", [x, _rand((2, 2, 2, 2), "gb3")],
               {"interpolation_mode": 0, "padding_mode": 0, "align_corners": False})
    with pytest.raises(kiln.KilnError, match="grid must be 4-D"):
        run_op("aten.grid_sampler_2d", [x, _rand((1, 2, 2, 3), "gb4")],
               {"interpolation_mode": 0, "padding_mode": 0, "align_corners": False})


def test_grid_sampler_2d_empty_batch():
    attrs = {"interpolation_mode": 0, "padding_mode": 0, "align_corners": False}
    (out,) = run_op("aten.grid_sampler_2d", [np.zeros((0, 2, 3, 3), np.float32), np.zeros((0, 2, 4, 2), np.float32)], attrs)
    assert out.shape == (0, 2, 2, 4)


# ---------------------------------------------------------------- col2im

COL2IM_CASES = [((2, 3, 5), [2, 2], [1, 1], [0, 0], [1, 1]), ((5, 7), [3, 1], [1, 2], [1, 0], [2, 1]),
                ((6, 6), [2, 3], [2, 1], [1, 1], [1, 2]), ((4, 4), [1, 1], [1, 1], [0, 0], [1, 1]),
                ((0, 4, 4), [2, 2], [1, 1], [0, 0], [1, 1])]


@pytest.mark.parametrize("case", COL2IM_CASES, ids=str)
def test_col2im_matches_torch(case):
    out_size, k, d, p, s = case
    bh = (out_size[-2] + 2 * p[0] - (d[0] * (k[0] - 1) + 1)) // s[0] + 1
    bw = (out_size[-1] + 2 * p[1] - (d[1] * (k[1] - 1) + 1)) // s[1] + 1
    batch = (out_size[0],) if len(out_size) == 3 else ()
    x = _rand(batch + (2 * k[0] * k[1], bh * bw), ("c2i", case))
    os_ = list(out_size[-2:])
    attrs = dict(output_size=os_, kernel_size=k, dilation=d, padding=p, stride=s)
    assert _check("aten.col2im", [x], attrs, lambda t: A.col2im(t, os_, k, d, p, s), f"col2im {case}")


def test_col2im_rejects_bad_arguments():
    x = _rand((1, 8, 9), "c2ib")
    good = dict(output_size=[4, 4], kernel_size=[2, 2], dilation=[1, 1], padding=[0, 0], stride=[1, 1])
    with pytest.raises(kiln.KilnError, match="last dim"):
        run_op("aten.col2im", [x], {**good, "output_size": [5, 4]})
    with pytest.raises(kiln.KilnError, match="divisible"):
        run_op("aten.col2im", [x], {**good, "kernel_size": [3, 1]})
    with pytest.raises(kiln.KilnError, match="stride"):
        run_op("aten.col2im", [x], {**good, "stride": [0, 1]})


IM2COL_CASES = [((2, 3, 5, 6), [2, 2], [1, 1], [0, 0], [1, 1]), ((3, 7, 5), [3, 1], [1, 2], [1, 0], [2, 1]),
                ((1, 2, 6, 6), [2, 3], [2, 1], [1, 1], [1, 2]), ((0, 2, 4, 4), [2, 2], [1, 1], [0, 0], [1, 1]),
                ((1, 1, 2, 2), [3, 3], [1, 1], [0, 0], [1, 1])]


@pytest.mark.parametrize("case", IM2COL_CASES, ids=str)
def test_im2col_matches_torch(case):
    shape, k, d, p, s = case
    x = _rand(shape, ("i2c", case))
    attrs = dict(kernel_size=k, dilation=d, padding=p, stride=s)
    _check("aten.im2col", [x], attrs, lambda t: A.im2col(t, k, d, p, s), f"im2col {case}")
    xi = (np.arange(np.prod(shape)) % 7).astype(np.int64).reshape(shape)  # data movement: any dtype
    try:
        ref = A.im2col(torch.from_numpy(xi.astype(np.float32)), k, d, p, s).numpy().astype(np.int64)
    except RuntimeError:
        return
    np.testing.assert_array_equal(run_op("aten.im2col", [xi], attrs)[0], ref)


# ---------------------------------------------------------------- distances

@pytest.mark.parametrize("p", [2.0, 0.0, 1.0, math.inf, 3.0, 0.5])
def test_cdist_matches_torch(p):
    for k, (s1, s2) in enumerate([((5, 3), (4, 3)), ((2, 1, 5, 4), (3, 6, 4)), ((1, 7), (2, 7)), ((0, 3), (2, 3)),
                                  ((3, 0), (2, 0))]):
        a, b = _rand(s1, ("cd1", k)), _rand(s2, ("cd2", k))
        if p == 0.0 and a.size and b.size:
            b.flat[::3] = a.flat[0]  # some exact zeros among the differences
            a.flat[::3] = a.flat[0]
        for mode in (None, 2):
            _check("aten._cdist_forward", [a, b], {"p": p, "compute_mode": mode},
                   lambda t, u: A._cdist_forward(t, u, p, mode), f"cdist p={p} {s1} {s2}")


def test_cdist_and_pdist_reject_bad_arguments():
    a = _rand((3, 2), "cdb")
    with pytest.raises(kiln.KilnError, match="non-negative"):
        run_op("aten._cdist_forward", [a, a], {"p": -1.0})
    with pytest.raises(kiln.KilnError, match="same number of columns"):
        run_op("aten._cdist_forward", [a, _rand((3, 3), "cdb2")], {"p": 2.0})
    with pytest.raises(kiln.KilnError, match="batch dims"):
        run_op("aten._cdist_forward", [_rand((2, 3, 2), "b1"), _rand((3, 3, 2), "b2")], {"p": 2.0})
    with pytest.raises(kiln.KilnError, match="2-D"):
        run_op("aten._pdist_forward", [_rand((2, 3, 2), "b3")], {"p": 2.0})


@pytest.mark.parametrize("p", [2.0, 0.0, 1.0, math.inf, 1.5])
def test_pdist_matches_torch(p):
    for k, shape in enumerate([(5, 3), (1, 4), (2, 1), (6, 8)]):
        x = _rand(shape, ("pd", k))
        _check("aten._pdist_forward", [x], {"p": p}, lambda t: A._pdist_forward(t, p), f"pdist p={p} {shape}")


# ---------------------------------------------------------------- capture

class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _export_matches(fn, *xs, what="", expect_ops=()):
    m = _Fn(fn).eval()
    with torch.no_grad():
        want = m(*xs)
    want = want if isinstance(want, tuple) else (want,)
    res = kiln.export(m, xs, verbose=False)
    got = kiln.load_bytes(res.data).run(*[x.numpy() for x in xs])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w.numpy(), what=what)
    return res


def test_capture_pads_and_pools():
    x1, x2, x3 = torch.randn(2, 3, 7), torch.randn(2, 3, 5, 6), torch.randn(1, 2, 4, 5, 6)

    def fn(a, b, c):
        outs = []
        for mode in ("reflect", "replicate", "circular"):
            outs += [F.pad(a, (2, 1), mode=mode), F.pad(b, (1, 2, 2, 0), mode=mode), F.pad(c, (1, 0, 2, 1, 1, 1), mode=mode)]
        outs += [F.pad(b, (-1, 2, 1, -2), mode="replicate")]
        v, i = F.max_pool3d(c, 2, stride=1, padding=1, dilation=1, return_indices=True)
        outs += [v, i, F.max_pool3d(c, (2, 3, 2), ceil_mode=True), F.avg_pool3d(c, 3, stride=2, padding=1, ceil_mode=True,
                                                                            count_include_pad=False),
                 F.adaptive_avg_pool3d(c, (3, 2, 4)), *F.adaptive_max_pool2d(b, (2, 4), return_indices=True),
                 F.adaptive_max_pool3d(c, (3, 2, 4)), F.avg_pool1d(a, 3, 2), F.max_pool1d(a, 2)]
        return tuple(outs)

    _export_matches(fn, x1, x2, x3, what="pads/pools")


def test_capture_grid_sample_fold_cdist():
    x, g = torch.randn(2, 3, 5, 6), torch.rand(2, 4, 3, 2) * 2.4 - 1.2
    cols = torch.randn(2, 3 * 4, 12)
    a, b = torch.randn(2, 5, 3), torch.randn(2, 4, 3)

    def fn(x, g, cols, a, b):
        return (F.grid_sample(x, g, mode="bilinear", padding_mode="zeros", align_corners=False),
                F.grid_sample(x, g, mode="nearest", padding_mode="border", align_corners=True),
                F.grid_sample(x, g, mode="bicubic", padding_mode="reflection", align_corners=False),
                F.fold(cols, (4, 5), (2, 2)), F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)),
                torch.cdist(a, b), torch.cdist(a, b, p=1.0), F.pdist(a[0], p=3.0))

    _export_matches(fn, x, g, cols, a, b, what="grid/fold/cdist")


class _LegitBatchNorm(torch.nn.Module):
    """eval BatchNorm2d (-> _native_batch_norm_legit_no_training) plus the functional
    _native_batch_norm_legit.default with training=False and running-stat buffers."""

    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(3)
        self.register_buffer("rm", torch.randn(3))
        self.register_buffer("rv", torch.rand(3) + 0.5)
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.randn(3))
            self.bn.running_var.copy_(torch.rand(3) + 0.5)
            self.bn.weight.copy_(torch.randn(3))

    def forward(self, t):
        return self.bn(t) + A._native_batch_norm_legit(t, None, None, self.rm, self.rv, False, 0.1, 1e-5)[0]


def test_capture_batch_norm_overloads():
    x = torch.randn(2, 3, 4, 5)
    m = _LegitBatchNorm().eval()
    with torch.no_grad():
        want = m(x).numpy()
    res = kiln.export(m, (x,), verbose=False, fold_batch_norm=False)
    (got,) = kiln.load_bytes(res.data).run(x.numpy())
    assert_close(got, want, what="batch norm")
    with pytest.raises(kiln.ExportError, match="training mode"):
        kiln.export(_Fn(lambda t: F.batch_norm(t, None, None, training=True)), (x,), verbose=False)


@pytest.mark.skipif("xnnpack" not in kiln._kiln.backend_names(), reason="the xnnpack backend is not built")
def test_xnnpack_declines_spatial_ops_with_a_reason():
    from delegate_util import compile_graph, declined_reasons
    x, g = _rand((1, 2, 4, 5), "xx"), _rand((1, 3, 2, 2), "xg")
    x5 = _rand((1, 2, 3, 4, 5), "x5")

    def build(gr, ids):
        a, b, c = ids
        outs = [gr.add_node("aten.reflection_pad2d", [a], {"padding": [1, 1, 1, 1]})[0],
                gr.add_node("aten.replication_pad2d", [a], {"padding": [1, 1, 1, 1]})[0],
                gr.add_node("aten.grid_sampler_2d", [a, b], {"interpolation_mode": 0, "padding_mode": 0,
                                                            "align_corners": False})[0],
                gr.add_node("aten.avg_pool3d", [c], {"kernel_size": [2]})[0],
                gr.add_node("aten._cdist_forward", [a, a], {"p": 2.0})[0]]
        return outs

    outs, dl, _, _ = compile_graph(build, [x, g, x5], ["xnnpack"])
    for op in ("aten.reflection_pad2d", "aten.replication_pad2d", "aten.grid_sampler_2d", "aten.avg_pool3d",
               "aten._cdist_forward"):
        rs = declined_reasons(dl, op, "xnnpack")
        assert rs and all(r for r in rs), (op, dl)
    np.testing.assert_array_equal(outs[0], A.reflection_pad2d(torch.from_numpy(x), [1, 1, 1, 1]).numpy())


def test_inference_rejects_outputs_too_large_to_plan():
    # sizes only (nothing is allocated): outputs combining several inputs' sizes must not overflow
    g = kiln.Graph()
    a = g.add_input("a", "float32", [1 << 30, 1])
    b = g.add_input("b", "float32", [1 << 30, 1])
    with pytest.raises(kiln.KilnError, match="too large"):
        g.add_node("aten._cdist_forward", [a, b], {"p": 2.0})
    with pytest.raises(kiln.KilnError, match="too large"):
        g.add_node("aten._pdist_forward", [a], {"p": 2.0})
    x = g.add_input("x", "float32", [1, 1, 1, 1, 1])
    with pytest.raises(kiln.KilnError, match="too large"):
        g.add_node("aten.adaptive_max_pool3d", [x], {"output_size": [1 << 30, 1 << 30, 1 << 30]})
    with pytest.raises(kiln.KilnError, match="too large"):
        g.add_node("aten._adaptive_avg_pool3d", [x], {"output_size": [1 << 30, 1 << 30, 1 << 30]})

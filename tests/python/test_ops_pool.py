"""aten.max_pool2d / aten.avg_pool2d / aten.adaptive_avg_pool2d against PyTorch eager.

Each generated case runs the same torch.ops.aten op with the same arguments. Where PyTorch rejects a
configuration (output too small, padding above half the kernel, ...), Kiln must reject it too, at
graph building, with kiln.KilnError.
"""
import itertools
import zlib

import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close, run_op

A = torch.ops.aten
torch.set_num_threads(1)  # eager on a shared 2-core machine: threads only add overhead here

SHAPES = [(2, 3, 23, 23), (3, 7, 5), (1, 2, 6, 8), (1, 1, 1, 1)]
KERNELS = [[1], [2], [3], [3, 2]]
STRIDES = [[], [1], [2], [2, 1]]
PADDINGS = [[0], [1], [1, 0]]


def _max_cases():
    return [dict(x=x, kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=c)
            for x, k, s, p, d, c in itertools.product(SHAPES, KERNELS, STRIDES, PADDINGS, [[1], [2], [1, 2]],
                                                      [False, True])]


def _avg_cases():
    return [dict(x=x, kernel_size=k, stride=s, padding=p, ceil_mode=c, count_include_pad=cip, divisor_override=dv)
            for x, k, s, p, c, (cip, dv) in itertools.product(
                SHAPES, KERNELS, STRIDES, PADDINGS, [False, True],
                [(True, None), (False, None), (True, 3), (False, -2)])]


def _cid(c):
    return "-".join(f"{k}{v}" for k, v in c.items()).replace(" ", "")


def _input(c):
    rng = np.random.default_rng(zlib.crc32(_cid(c).encode()))
    return rng.standard_normal(c["x"], dtype=np.float32)


def _check(op, c, torch_fn):
    x = _input(c)
    attrs = {k: v for k, v in c.items() if k != "x"}
    try:
        ref = torch_fn(torch.from_numpy(x), **attrs).numpy()
    except RuntimeError:
        with pytest.raises(kiln.KilnError):
            run_op(op, [x], attrs)
        return False
    (out,) = run_op(op, [x], attrs)
    assert_close(out, ref, what=_cid(c))
    return True


MAX_CASES = _max_cases()
AVG_CASES = _avg_cases()


@pytest.mark.parametrize("case", MAX_CASES, ids=_cid)
def test_max_pool2d_matches_torch(case):
    _check("aten.max_pool2d", case, lambda x, **a: A.max_pool2d(x, a["kernel_size"], a["stride"], a["padding"],
                                                               a["dilation"], a["ceil_mode"]))


@pytest.mark.parametrize("case", AVG_CASES, ids=_cid)
def test_avg_pool2d_matches_torch(case):
    _check("aten.avg_pool2d", case, lambda x, **a: A.avg_pool2d(x, a["kernel_size"], a["stride"], a["padding"],
                                                               a["ceil_mode"], a["count_include_pad"],
                                                               a["divisor_override"]))


def test_sweeps_are_mostly_valid_and_exercise_the_ceil_rule():
    # Guards the generators: most cases must be valid, and some valid ceil_mode cases must hit the
    # rule that drops a last window starting beyond the input and left padding (Pool.h).
    names = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
    valid = [c for c in MAX_CASES if _check_quiet(A.max_pool2d, c, names)]
    assert len(MAX_CASES) > 500 and len(valid) > 300, (len(MAX_CASES), len(valid))
    drops = 0
    for c in valid:
        if not c["ceil_mode"]:
            continue
        for i in range(2):
            n = c["x"][-2 + i]
            k, s, p, d = (v[i] if len(v) == 2 else v[0] for v in
                          (c["kernel_size"], c["stride"] or c["kernel_size"], c["padding"], c["dilation"]))
            raw = (n + 2 * p - d * (k - 1) - 1 + s - 1) // s + 1
            drops += (raw - 1) * s >= n + p
    assert drops > 10, drops
    names = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
    valid = sum(_check_quiet(A.avg_pool2d, c, names) for c in AVG_CASES)
    assert len(AVG_CASES) > 500 and valid > 300, (len(AVG_CASES), valid)


def _check_quiet(fn, c, names):
    try:
        fn(torch.zeros(c["x"]), *[c[n] for n in names])
        return True
    except RuntimeError:
        return False


def test_ceil_mode_last_window_and_divisor_clipping_explicit():
    # 6 wide, kernel 3, stride 2, padding 1, ceil: 4 windows; the last one starts at 5 and would end
    # at 8, past the padded input's end 7, so count_include_pad divides by 2 (not 3) along each dim
    # (ATen AvgPoolKernel.cpp); without count_include_pad by the 1 input element.
    x = np.arange(1 * 1 * 6 * 6, dtype=np.float32).reshape(1, 1, 6, 6)
    for cip in (True, False):
        (out,) = run_op("aten.avg_pool2d", [x], dict(kernel_size=[3], stride=[2], padding=[1], ceil_mode=True,
                                                     count_include_pad=cip))
        ref = torch.nn.functional.avg_pool2d(torch.from_numpy(x), 3, 2, 1, ceil_mode=True, count_include_pad=cip)
        assert out.shape == (1, 1, 4, 4)
        assert_close(out, ref.numpy())
    # The ceil rule: 5 wide, kernel 2, stride 2, padding 1: ceil rounding gives 4 windows, but the
    # 4th would start at input position 3*2 - 1 = 5, past the input, and is dropped: 3.
    x = np.ones((1, 1, 5, 5), np.float32)
    (out,) = run_op("aten.max_pool2d", [x], dict(kernel_size=[2], stride=[2], padding=[1], ceil_mode=True))
    assert out.shape == tuple(torch.nn.functional.max_pool2d(torch.from_numpy(x), 2, 2, 1, ceil_mode=True).shape)
    assert out.shape == (1, 1, 3, 3)


def test_max_pool2d_propagates_nan_and_handles_inf():
    x = np.random.default_rng(3).standard_normal((1, 2, 7, 5), dtype=np.float32)
    x[0, 0, 2, 3] = np.nan
    x[0, 1, 0, 0] = -np.inf
    x[0, 1, 4, 4] = np.inf
    for ceil in (False, True):
        (out,) = run_op("aten.max_pool2d", [x], dict(kernel_size=[3], stride=[2], padding=[1], ceil_mode=ceil))
        ref = A.max_pool2d(torch.from_numpy(x), [3], [2], [1], [1], ceil).numpy()
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        assert np.isnan(out).any()
        np.testing.assert_array_equal(out[~np.isnan(out)], ref[~np.isnan(ref)])


@pytest.mark.parametrize("shape,output_size", [
    ((1, 2, 7, 5), [3, 2]), ((2, 3, 23, 23), [5, 7]), ((2, 3, 23, 23), [1, 1]), ((2, 3, 23, 23), [23, 23]),
    ((1, 2, 7, 5), [10, 9]), ((3, 7, 5), [4, 3]), ((1, 1, 1, 1), [2, 3]), ((1, 2, 7, 5), [0, 2]),
    ((0, 2, 7, 5), [3, 2]), ((1, 3, 13, 11), [6, 4]),
])
def test_adaptive_avg_pool2d_matches_torch(shape, output_size):
    x = np.random.default_rng(sum(shape) + sum(output_size)).standard_normal(shape, dtype=np.float32)
    (out,) = run_op("aten.adaptive_avg_pool2d", [x], dict(output_size=output_size))
    ref = A.adaptive_avg_pool2d(torch.from_numpy(x), output_size).numpy()
    assert_close(out, ref, what=f"{shape}->{output_size}")


def _build_error(op, shape, attrs, dtype="float32"):
    g = kiln.Graph()
    x = g.add_input("x", dtype, list(shape))
    with pytest.raises(kiln.KilnError) as ei:
        g.add_node(op, [x], attrs)
    return ei.value.args


@pytest.mark.parametrize("op,shape,attrs,words", [
    ("aten.max_pool2d", (1, 2, 8, 8), dict(kernel_size=[3], stride=[0]), ["stride"]),
    ("aten.max_pool2d", (1, 2, 8, 8), dict(kernel_size=[0]), ["kernel_size"]),
    ("aten.max_pool2d", (1, 2, 8, 8), dict(kernel_size=[3, 3, 3]), ["kernel_size", "1 or 2"]),
    ("aten.max_pool2d", (1, 2, 8, 8), dict(kernel_size=[]), ["kernel_size"]),
    ("aten.max_pool2d", (1, 2, 8, 8), dict(kernel_size=[3], stride=[1, 1, 1]), ["stride"]),
    ("aten.max_pool2d", (1, 2, 8, 8), dict(kernel_size=[3], padding=[2]), ["padding", "half"]),
    ("aten.max_pool2d", (1, 2, 8, 8), dict(kernel_size=[3], padding=[-1]), ["padding"]),
    ("aten.max_pool2d", (1, 2, 8, 8), dict(kernel_size=[3], dilation=[0]), ["dilation"]),
    ("aten.max_pool2d", (1, 2, 8, 8), dict(kernel_size=[9]), ["too small"]),
    ("aten.max_pool2d", (8, 8), dict(kernel_size=[2]), ["3-D", "4-D"]),
    ("aten.max_pool2d", (1, 0, 8, 8), dict(kernel_size=[2]), ["non-zero"]),
    ("aten.avg_pool2d", (1, 2, 8, 8), dict(kernel_size=[3], stride=[0]), ["stride"]),
    ("aten.avg_pool2d", (1, 2, 8, 8), dict(kernel_size=[3], padding=[2]), ["padding"]),
    ("aten.avg_pool2d", (1, 2, 8, 8), dict(kernel_size=[3], divisor_override=0), ["divisor_override"]),
    ("aten.adaptive_avg_pool2d", (1, 2, 8, 8), dict(output_size=[3]), ["output_size"]),
    ("aten.adaptive_avg_pool2d", (1, 2, 8, 8), dict(output_size=[-1, 2]), ["output_size"]),
    ("aten.adaptive_avg_pool2d", (1, 2, 0, 8), dict(output_size=[2, 2]), ["non-zero"]),
    ("aten.adaptive_avg_pool2d", (2, 8), dict(output_size=[2, 2]), ["3-D", "4-D"]),
])
def test_pool_rejects_invalid_attributes(op, shape, attrs, words):
    msg, code = _build_error(op, shape, attrs)
    assert code == "InvalidArgument", msg
    for w in words:
        assert w in msg, (w, msg)
    # PyTorch rejects the same configuration.
    fn = getattr(torch.ops.aten, op.split(".")[1])
    with pytest.raises(RuntimeError):
        fn(torch.zeros(shape), **attrs)


def test_pool_declines_other_dtypes():
    msg, code = _build_error("aten.max_pool2d", (1, 2, 8, 8), dict(kernel_size=[2]), dtype="int32")
    assert code == "NotSupported" and "float32" in msg


@pytest.mark.parametrize("attrs", [dict(kernel_size=[2**40]), dict(kernel_size=[2], stride=[2**62]),
                                   dict(kernel_size=[2], dilation=[2**62])])
def test_max_pool2d_rejects_out_of_range_values(attrs):
    msg, code = _build_error("aten.max_pool2d", (1, 2, 8, 8), attrs)
    assert code == "InvalidArgument" and "out of range" in msg, msg

"""aten.convolution (1-D / 2-D, grouped, depthwise, dilated, transposed) against PyTorch eager.

Each generated case runs torch.ops.aten.convolution with the same arguments. Where PyTorch rejects
a configuration, Kiln must reject it too, at graph building, with kiln.KilnError.
"""
import itertools
import random
import zlib

import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close, run_op

A = torch.ops.aten
torch.set_num_threads(1)  # eager on a shared 2-core machine: threads only add overhead here


def _conv_cases():
    cases = []
    pick = random.Random(0)
    # 2-D regular: (input shape, out channels, kernel, stride, padding, dilation, groups)
    shapes = [(2, 4, 23, 23), (1, 4, 1, 1), (1, 4, 7, 5)]
    for shape, k, s, p, d, (cout, groups) in itertools.product(
            shapes, [[1], [3], [3, 2]], [[1], [2], [2, 1]], [[0], [1], [1, 0]], [[1], [2]],
            [(6, 1), (6, 2), (4, 4), (8, 4)]):
        bias = pick.random() < 0.5  # bias / no bias, chosen pseudo-randomly (deterministic)
        cases.append(dict(x=shape, cout=cout, k=k, stride=s, padding=p, dilation=d, groups=groups,
                          transposed=False, output_padding=[0], bias=bias))
    # depthwise, dilation 2 with "same" padding
    for shape, s, bias in itertools.product([(2, 4, 23, 23), (1, 4, 7, 5), (1, 4, 1, 1)], [[1], [2]], [True, False]):
        cases.append(dict(x=shape, cout=4, k=[3], stride=s, padding=[2], dilation=[2], groups=4,
                          transposed=False, output_padding=[0], bias=bias))
    # 2-D transposed, with output_padding (must be < stride or < dilation)
    for shape, k, s, p, op, d, (cout, groups) in itertools.product(
            [(1, 4, 7, 5), (2, 4, 23, 23), (1, 4, 1, 1)], [[3], [2, 3], [4]], [[1], [2], [2, 1]], [[0], [1]],
            [[0], [1], [1, 0]], [[1], [2]], [(6, 1), (6, 2), (4, 4)]):
        bias = pick.random() < 0.5  # bias / no bias, chosen pseudo-randomly (deterministic)
        cases.append(dict(x=shape, cout=cout, k=k, stride=s, padding=p, dilation=d, groups=groups,
                          transposed=True, output_padding=op, bias=bias))
    # 1-D, regular and transposed
    for shape, k, s, p, d, (cout, groups), tr in itertools.product(
            [(2, 4, 23), (1, 4, 1), (1, 4, 7)], [[1], [3]], [[1], [2]], [[0], [1]], [[1], [2]],
            [(6, 1), (6, 2), (4, 4)], [False, True]):
        bias = pick.random() < 0.5  # bias / no bias, chosen pseudo-randomly (deterministic)
        cases.append(dict(x=shape, cout=cout, k=k, stride=s, padding=p, dilation=d, groups=groups,
                          transposed=tr, output_padding=[1] if tr and s == [2] else [0], bias=bias))
    return cases


CASES = _conv_cases()


def _case_id(c):
    return (f"{'T' if c['transposed'] else ''}x{'x'.join(map(str, c['x']))}-co{c['cout']}-k{c['k']}-s{c['stride']}"
            f"-p{c['padding']}-d{c['dilation']}-g{c['groups']}-op{c['output_padding']}-{'b' if c['bias'] else 'nob'}")


def _make(c, rng):
    x = rng.standard_normal(c["x"], dtype=np.float32)
    nsp = len(c["x"]) - 2
    ks = c["k"] * nsp if len(c["k"]) == 1 else c["k"]
    cin = c["x"][1]
    if c["transposed"]:
        wshape = (cin, c["cout"] // c["groups"], *ks)
    else:
        wshape = (c["cout"], cin // c["groups"], *ks)
    w = rng.standard_normal(wshape, dtype=np.float32)
    b = rng.standard_normal((c["cout"],), dtype=np.float32) if c["bias"] else None
    attrs = {k: c[k] for k in ("stride", "padding", "dilation", "transposed", "output_padding", "groups")}
    return x, w, b, attrs


def _torch_conv(x, w, b, attrs):
    return A.convolution(torch.from_numpy(x), torch.from_numpy(w), None if b is None else torch.from_numpy(b),
                         attrs["stride"], attrs["padding"], attrs["dilation"], attrs["transposed"],
                         attrs["output_padding"], attrs["groups"]).numpy()


def test_sweep_is_large_and_mostly_valid():
    # Guards against a generator change that silently makes most cases invalid (skipped paths).
    rng = np.random.default_rng(0)
    valid = 0
    for c in CASES:
        x, w, b, attrs = _make(c, rng)
        try:
            _torch_conv(x, w, b, attrs)
            valid += 1
        except RuntimeError:
            pass
    assert len(CASES) > 1500 and valid > 1000, (len(CASES), valid)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_convolution_matches_torch(case):
    rng = np.random.default_rng(zlib.crc32(_case_id(case).encode()))
    x, w, b, attrs = _make(case, rng)
    try:
        ref = _torch_conv(x, w, b, attrs)
    except RuntimeError:
        # PyTorch rejects this configuration: Kiln must reject it at graph building.
        with pytest.raises(kiln.KilnError):
            run_op("aten.convolution", [x, w, b], attrs)
        return
    if 0 in ref.shape[2:]:
        # Only PyTorch's grouped transposed path returns an empty tensor here; its other paths
        # (groups=1) fail with "Output size is too small", and so does Kiln, consistently.
        assert case["transposed"] and case["groups"] > 1
        with pytest.raises(kiln.KilnError, match="too small"):
            run_op("aten.convolution", [x, w, b], attrs)
        return
    (out,) = run_op("aten.convolution", [x, w, b], attrs)
    assert_close(out, ref, what=_case_id(case))


def test_convolution_with_constant_weights_and_functional_reference():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 11, 9), dtype=np.float32)
    w = rng.standard_normal((9, 2, 3, 3), dtype=np.float32)
    b = rng.standard_normal((9,), dtype=np.float32)
    (out,) = run_op("aten.convolution", [x, w, b],
                    dict(stride=[2, 1], padding=[1, 2], dilation=[1, 2], transposed=False, output_padding=[0], groups=3),
                    constants=(1, 2))
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b),
                                     stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=3).numpy()
    assert_close(out, ref)
    wt = rng.standard_normal((6, 2, 4, 3), dtype=np.float32)
    (out,) = run_op("aten.convolution", [x, wt, None],
                    dict(stride=[2, 3], padding=[1, 0], dilation=[1, 1], transposed=True, output_padding=[1, 2], groups=3),
                    constants=(1,))
    ref = torch.nn.functional.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(wt), None, stride=(2, 3),
                                               padding=(1, 0), output_padding=(1, 2), groups=3).numpy()
    assert_close(out, ref)


def _build_error(op, inputs, attrs):
    """Adds one node with inputs of the given shapes (None = absent) and returns the KilnError."""
    g = kiln.Graph()
    ids = [-1 if s is None else g.add_input(f"x{i}", "float32", list(s)) for i, s in enumerate(inputs)]
    with pytest.raises(kiln.KilnError) as ei:
        g.add_node(op, ids, attrs)
    return ei.value


BASE = dict(stride=[1], padding=[0], dilation=[1], transposed=False, output_padding=[0], groups=1)


@pytest.mark.parametrize("inputs,changes,words", [
    ([(1, 4, 8, 8), (6, 4, 3, 3), None], dict(stride=[0]), ["stride"]),
    ([(1, 4, 8, 8), (6, 4, 3, 3), None], dict(stride=[1, 0]), ["stride"]),
    ([(1, 4, 8, 8), (6, 4, 3, 3), None], dict(stride=[1, 1, 1]), ["stride", "1 or 2"]),
    ([(1, 4, 8, 8), (6, 4, 3, 3), None], dict(stride=[]), ["stride"]),
    ([(1, 4, 8, 8), (6, 4, 3, 3), None], dict(padding=[-1]), ["padding"]),
    ([(1, 4, 8, 8), (6, 4, 3, 3), None], dict(dilation=[0]), ["dilation"]),
    ([(1, 4, 8, 8), (6, 2, 3, 3), None], dict(groups=0), ["groups"]),
    ([(1, 4, 8, 8), (6, 1, 3, 3), None], dict(groups=4), ["groups", "6"]),          # 4 does not divide C_out 6
    ([(1, 6, 8, 8), (8, 2, 3, 3), None], dict(groups=4), ["groups", "input channels"]),
    ([(1, 4, 8, 8), (6, 3, 3, 3), None], {}, ["weight", "input channels"]),          # wrong weight C_in
    ([(1, 4, 8, 8), (6, 4, 3), None], {}, ["input", "weight"]),                     # rank mismatch
    ([(1, 4, 8, 8), (6,), None], {}, ["weight"]),
    ([(1, 4, 8, 8), (6, 4, 3, 3), (5,)], {}, ["bias"]),
    ([(1, 4, 2, 2), (6, 4, 3, 3), None], {}, ["kernel size"]),
    ([(1, 4, 8, 8), (4, 6, 3, 3), None], dict(transposed=True, stride=[2], output_padding=[2]), ["output_padding"]),
    ([(1, 4, 8, 8), (4, 6, 3, 3), None], dict(transposed=True, output_padding=[-1]), ["output_padding"]),
    ([(1, 5, 8, 8), (4, 6, 3, 3), None], dict(transposed=True), ["input channels"]),
    ([(1, 4, 8, 8), (4, 6, 3, 3), None], dict(transposed=True, groups=3), ["groups"]),
])
def test_convolution_rejects_invalid_attributes(inputs, changes, words):
    e = _build_error("aten.convolution", inputs, {**BASE, **changes})
    msg, code = e.args
    assert code == "InvalidArgument", msg
    for w in words:
        assert w in msg, (w, msg)
    # PyTorch rejects the same configuration.
    t = [None if s is None else torch.zeros(s) for s in inputs]
    a = {**BASE, **changes}
    with pytest.raises(RuntimeError):
        A.convolution(*t, a["stride"], a["padding"], a["dilation"], a["transposed"], a["output_padding"], a["groups"])


def test_convolution_missing_attribute_and_dtype():
    e = _build_error("aten.convolution", [(1, 4, 8, 8), (6, 4, 3, 3), None],
                     {k: v for k, v in BASE.items() if k != "groups"})
    assert "groups" in e.args[0]
    g = kiln.Graph()
    x = g.add_input("x", "int32", [1, 4, 8, 8])
    w = g.add_input("w", "int32", [6, 4, 3, 3])
    with pytest.raises(kiln.KilnError) as ei:
        g.add_node("aten.convolution", [x, w, -1], BASE)
    assert ei.value.args[1] == "NotSupported" and "float32" in ei.value.args[0]
    e = _build_error("aten.convolution", [(1, 4, 8, 8, 8), (6, 4, 3, 3, 3), None], BASE)
    assert e.args[1] == "NotSupported"


@pytest.mark.parametrize("changes", [dict(stride=[2**40]), dict(padding=[2**62]), dict(dilation=[2**62, 1]),
                                     dict(transposed=True, output_padding=[2**62], stride=[2**62])])
def test_convolution_rejects_out_of_range_values(changes):
    # Huge values (as a hostile program file could carry) are rejected, not overflowed.
    w = (6, 4, 3, 3) if not changes.get("transposed") else (4, 6, 3, 3)
    e = _build_error("aten.convolution", [(1, 4, 8, 8), w, None], {**BASE, **changes})
    assert e.args[1] == "InvalidArgument" and "out of range" in e.args[0], e.args

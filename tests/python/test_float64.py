"""float64 end to end: ops run by the portable kernels in double against PyTorch eager in float64
(rel 1e-12), npy/binding round trips, a captured float64 module, and delegates declining float64."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import kiln
from oprunner import assert_close, run_op

REL = 1e-12


def rnd(*shape, seed=0, lo=-3.0, hi=3.0):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float64)


T = torch.from_numpy


UNARY = [
    ("aten.exp", {}, torch.exp),
    ("aten.log", {}, lambda x: torch.log(x.abs() + 0.5)),
    ("aten.sqrt", {}, lambda x: torch.sqrt(x.abs())),
    ("aten.sigmoid", {}, torch.sigmoid),
    ("aten.tanh", {}, torch.tanh),
    ("aten.erf", {}, torch.erf),
    ("aten.sin", {}, torch.sin),
    ("aten.neg", {}, torch.neg),
    ("aten.abs", {}, torch.abs),
    ("aten.relu", {}, torch.relu),
    ("aten.silu", {}, nn.functional.silu),
    ("aten.hardswish", {}, nn.functional.hardswish),
    ("aten.leaky_relu", {"negative_slope": 0.1}, lambda x: nn.functional.leaky_relu(x, 0.1)),
    ("aten.gelu", {"approximate": "none"}, nn.functional.gelu),
    ("aten.gelu", {"approximate": "tanh"}, lambda x: nn.functional.gelu(x, approximate="tanh")),
    ("aten.clamp", {"min": -0.3, "max": 1.7}, lambda x: torch.clamp(x, -0.3, 1.7)),
]


@pytest.mark.parametrize("op,attrs,ref", UNARY, ids=[f"{u[0]}-{i}" for i, u in enumerate(UNARY)])
def test_unary_float64_matches_eager(op, attrs, ref):
    x = rnd(4, 7, seed=1)
    if op in ("aten.log", "aten.sqrt"):
        x = np.abs(x) + (0.5 if op == "aten.log" else 0.0)
        ref = {"aten.log": torch.log, "aten.sqrt": torch.sqrt}[op]
    (out,) = run_op(op, [x], attrs)
    assert out.dtype == np.float64
    assert_close(out, ref(T(x)).numpy(), rel=REL, what=op)


BINARY = [
    ("aten.add", {"alpha": 0.3}, lambda a, b: torch.add(a, b, alpha=0.3)),
    ("aten.sub", {}, torch.sub),
    ("aten.mul", {}, torch.mul),
    ("aten.div", {}, torch.div),
    ("aten.div", {"rounding_mode": "floor"}, lambda a, b: torch.div(a, b, rounding_mode="floor")),
    ("aten.div", {"rounding_mode": "trunc"}, lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ("aten.pow", {}, lambda a, b: torch.pow(a.abs(), b)),
]


@pytest.mark.parametrize("op,attrs,ref", BINARY, ids=[f"{b[0]}-{i}" for i, b in enumerate(BINARY)])
def test_binary_float64_broadcasting_matches_eager(op, attrs, ref):
    a, b = rnd(3, 1, 5, seed=2), rnd(4, 1, seed=3)
    if op == "aten.pow":
        a = np.abs(a)
    (out,) = run_op(op, [a, b], attrs)
    assert out.dtype == np.float64
    assert_close(out, ref(T(a), T(b)).numpy(), rel=REL, what=op)


def test_float64_values_that_float32_would_round_are_kept():
    # 1 + 2^-40 is not representable in float32: a float32 path would return exactly 2.0.
    a = np.array([1.0 + 2.0 ** -40, 1e300, -1e-300])
    b = np.array([1.0, 1e8, 3.0])
    (out,) = run_op("aten.add", [a, b])
    np.testing.assert_array_equal(out, (T(a) + T(b)).numpy())
    assert out[0] != 2.0
    (prod,) = run_op("aten.mul", [a, b])
    np.testing.assert_array_equal(prod, (T(a) * T(b)).numpy())  # 1e308: beyond float32's range


def test_mixed_float32_float64_promotes_to_float64():
    a = rnd(2, 3, seed=4).astype(np.float32)
    b = rnd(2, 3, seed=5)
    (out,) = run_op("aten.mul", [a, b])
    assert out.dtype == np.float64
    assert_close(out, (T(a) * T(b)).numpy(), rel=REL)
    (cmp,) = run_op("aten.lt", [a, b])
    np.testing.assert_array_equal(cmp, (T(a) < T(b)).numpy())


@pytest.mark.parametrize("to", ["float32", "float16", "int64", "int32", "int8", "uint8", "bool"])
def test_to_copy_from_and_to_float64(to):
    x = np.array([0.0, -2.5, 2.5, 1e10, -7.9, 3.0000001, 65519.0, 1e-8])
    tdt = getattr(torch, to)
    if to in ("int32", "int8", "uint8"):
        x = x[np.abs(x) < 100]  # out-of-range float->int is undefined behaviour in C++ and PyTorch
    (out,) = run_op("aten._to_copy", [x], {"dtype": to})
    np.testing.assert_array_equal(out, T(x).to(tdt).numpy())
    back = T(x).to(tdt).numpy()
    (rt,) = run_op("aten._to_copy", [back], {"dtype": "float64"})
    np.testing.assert_array_equal(rt, T(back).to(torch.float64).numpy())


def test_int64_to_float64_is_exact_beyond_2_to_24():
    x = np.array([2 ** 53 - 1, -(2 ** 40) - 3, 16777217], np.int64)
    (out,) = run_op("aten._to_copy", [x], {"dtype": "float64"})
    np.testing.assert_array_equal(out, T(x).double().numpy())


@pytest.mark.parametrize("op,attrs,ref", [
    ("aten.sum", {"dim": [1], "keepdim": False}, lambda x: x.sum(1)),
    ("aten.sum", {"dim": None, "keepdim": False}, lambda x: x.sum()),
    ("aten.mean", {"dim": [0, 2], "keepdim": True}, lambda x: x.mean((0, 2), keepdim=True)),
    ("aten.amax", {"dim": [2], "keepdim": False}, lambda x: x.amax(2)),
    ("aten.amin", {"dim": [], "keepdim": False}, lambda x: x.amin()),
    ("aten.argmax", {"dim": 1, "keepdim": False}, lambda x: x.argmax(1)),
    ("aten._softmax", {"dim": -1}, lambda x: torch.softmax(x, -1)),
    ("aten._log_softmax", {"dim": 1}, lambda x: torch.log_softmax(x, 1)),
    ("aten.cumsum", {"dim": 1}, lambda x: torch.cumsum(x, 1)),
    ("aten.cumsum", {"dim": -1}, lambda x: torch.cumsum(x, -1)),
])
def test_reductions_float64_match_eager(op, attrs, ref):
    x = rnd(3, 5, 6, seed=6)
    (out,) = run_op(op, [x], attrs)
    expected = ref(T(x)).numpy()
    assert out.dtype == expected.dtype
    assert_close(out, expected, rel=REL, what=op)


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "bool"])
def test_cumsum_other_dtypes_match_eager(dtype):
    x = T(rnd(4, 9, seed=7) * 10).to(getattr(torch, dtype))
    (out,) = run_op("aten.cumsum", [x.numpy()], {"dim": 1})
    expected = torch.cumsum(x, 1).numpy()
    assert out.dtype == expected.dtype
    assert_close(out, expected, rel=1e-6, what=dtype)
    (o64,) = run_op("aten.cumsum", [x.numpy()], {"dim": 0, "dtype": "float64"})
    assert_close(o64, torch.cumsum(x, 0, dtype=torch.float64).numpy(), rel=REL)


def test_cumsum_rejects_bad_dim():
    with pytest.raises(kiln.KilnError, match="dim"):
        run_op("aten.cumsum", [rnd(2, 3)], {"dim": 2})


def test_where_and_pad_float64():
    c = np.array([True, False, True])
    a, b = rnd(3, seed=8), rnd(3, seed=9)
    (out,) = run_op("aten.where", [c, a, b])
    np.testing.assert_array_equal(out, torch.where(T(c), T(a), T(b)).numpy())
    (p,) = run_op("aten.constant_pad_nd", [a], {"pad": [1, 2], "value": 0.1})
    np.testing.assert_array_equal(p, nn.functional.pad(T(a), (1, 2), value=0.1).numpy())
    assert p[0] == 0.1  # not float32's 0.10000000149


def test_float64_inputs_cross_the_binding_exactly():
    g = kiln.Graph()
    x = g.add_input("x", "float64", [3])
    g.set_outputs([g.add_node("aten.clone", [x])[0]])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    data, _ = pb.compile()
    v = np.array([np.pi, 1.0 + 2.0 ** -50, -1e-310])
    (out,) = kiln.load_bytes(data).run(v)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, v)


class Double(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, dtype=torch.float64))
        self.register_buffer("b", torch.randn(4, 6, dtype=torch.float64))

    def forward(self, x):
        y = torch.sigmoid(x * self.w + self.b) * 1.25 - 0.1
        return torch.softmax(y, -1), y.sum(0), torch.cumsum(y, 1), y.float()


def test_export_float64_module_matches_eager():
    torch.manual_seed(0)
    m = Double().eval()
    x = torch.randn(4, 6, dtype=torch.float64)
    with torch.no_grad():
        expected = m(x)
    res = kiln.export(m, (x,), verbose=False)
    got = kiln.load_bytes(res.data).run(x.numpy())
    for g, e in zip(got, expected):
        assert g.dtype == e.numpy().dtype
        assert_close(g, e.numpy(), rel=REL if e.dtype == torch.float64 else 1e-6)


def test_delegates_leave_float64_to_the_portable_kernels():
    backends = [b for b in kiln._kiln.backend_names() if b in ("xnnpack", "mlx")]
    if not backends:
        pytest.skip("no delegate backend in this build")
    m = Double().eval()
    x = torch.randn(4, 6, dtype=torch.float64)
    with torch.no_grad():
        expected = m(x)
    for b in backends:
        res = kiln.export(m, (x,), backends=(b,), verbose=False)
        deleg = res.report["methods"][0]["delegation"]
        assert deleg["backends"][0]["nodes"] == 0, deleg
        reasons = [r for op in deleg["cpu_ops"] for _, r in op["reasons"] if op["op"] != "aten.cumsum"]
        assert reasons and all("float64" in r for r in reasons), reasons
        got = kiln.load_bytes(res.data).run(x.numpy())
        for g, e in zip(got, expected):
            assert_close(g, e.numpy(), rel=REL if e.dtype == torch.float64 else 1e-6, what=b)


def test_compute_dtype_float64_is_refused():
    g = kiln.Graph()
    i = g.add_input("x", "float32", [2])
    g.set_outputs([g.add_node("aten.relu", [i])[0]])
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    with pytest.raises(kiln.KilnError, match="compute_dtype"):
        pb.compile(compute_dtype="float64")


@pytest.mark.parametrize("op,types", [
    ("aten.convolution", None),
    ("aten.linear", None),
])
def test_float64_is_declined_where_no_kernel_computes_it(op, types):
    g = kiln.Graph()
    x = g.add_input("x", "float64", [1, 2, 4, 4] if op == "aten.convolution" else [2, 4])
    w = g.add_input("w", "float64", [3, 2, 1, 1] if op == "aten.convolution" else [3, 4])
    attrs = ({"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "transposed": False,
              "output_padding": [0, 0], "groups": 1} if op == "aten.convolution" else {})
    with pytest.raises(kiln.KilnError) as e:
        g.add_node(op, [x, w, -1], attrs)
    assert "NotSupported" in str(e.value.args) or "float" in str(e.value.args[0])

"""XNNPACK's limits are decided at compile time (issue 22; docs/delegation.md "Support decided by
building"): a program compiled for xnnpack always loads, and a node XNNPACK cannot build is declined
at compile with a reason that names the limit while the rest still delegates.

Each graph is compiled three ways: as shipped (the lowering's static checks, then a build of each
node and each segment with XNNPACK), with XNNPACK unavailable at compile time
(KILN_XNNPACK_DISABLE=1: the static checks decide alone) and with the static checks off
(KILN_XNNPACK_STATIC_CHECKS=0: building decides alone). All three must delegate the same nodes, which
shows that the static checks are exactly XNNPACK's limits. Every program that compiles loads (the one
compiled without XNNPACK too, once XNNPACK is back) and matches PyTorch eager (fp32: max abs error
<= 1e-5 * max|expected|).
"""
import numpy as np
import pytest
import torch

import kiln
from delegate_util import add_const, declined_reasons, segment
from oprunner import assert_close, kiln_dtype

A = torch.ops.aten
torch.set_num_threads(1)

pytestmark = pytest.mark.skipif("xnnpack" not in kiln._kiln.backend_names(),
                                reason="the xnnpack backend is not built (libxnnpack-dev/libpthreadpool-dev missing)")

RANK_LIMIT = "exceeds XNNPACK's limit of 6 dims (XNN_MAX_TENSOR_DIMS"
MODES = {"shipped": {}, "no_xnnpack_at_compile": {"KILN_XNNPACK_DISABLE": "1"},
         "build_only": {"KILN_XNNPACK_STATIC_CHECKS": "0"}}


def _rand(*shape, seed=0):
    return np.array(np.random.default_rng(seed).standard_normal(shape), dtype=np.float32)


def _const(g, name, arr):
    return add_const(g, name, arr, np.float32)


def _compile(build, feeds, env, monkeypatch):
    """Compiles build(g, input ids) -> output ids for xnnpack with the environment `env` set during
    the compile only. Returns (program bytes, delegation report of the method)."""
    g = kiln.Graph()
    ids = [g.add_input(f"x{i}", kiln_dtype(x), list(x.shape)) for i, x in enumerate(feeds)]
    with monkeypatch.context() as m:
        for k, v in env.items():
            m.setenv(k, v)
        g.set_outputs(list(build(g, ids)))
        pb = kiln.ProgramBuilder()
        pb.add_method("forward", g)
        data, rep = pb.compile(backends=["xnnpack"])
    return data, rep["methods"][0]["delegation"]


def _decisions(delegation):
    """What was delegated: (xnnpack segments, xnnpack nodes, CPU ops with counts)."""
    s = segment(delegation, "xnnpack")
    return s["segments"], s["nodes"], sorted((c["op"], c["count"]) for c in delegation["cpu_ops"])


def check_three_ways(build, feeds, ref, monkeypatch, what):
    """Compiles in every MODES; asserts equal decisions, that every program loads and matches `ref`
    (the eager outputs), and that no reason is a build failure the static checks missed. Returns the
    delegation reports by mode."""
    reports = {}
    for mode, env in MODES.items():
        data, dl = _compile(build, feeds, env, monkeypatch)
        reports[mode] = dl
        outs = kiln.load_bytes(data).run(*feeds)  # compiled without XNNPACK or not, it loads with it
        for o, r in zip(outs, ref):
            assert_close(o, r, 1e-5, f"{what} ({mode})")
    shipped = _decisions(reports["shipped"])
    for mode, dl in reports.items():
        assert _decisions(dl) == shipped, (what, mode, dl, reports["shipped"])
    for c in reports["shipped"]["cpu_ops"]:
        for backend, r in c["reasons"]:
            assert "does not build" not in r, (what, c)  # the static checks caught it first
    return reports


# ------------------------------------------------------------------------------------------------
# the rank family: every lowered op at ranks 0..8 (XNNPACK defines values of at most 6 dims)

def _shape(r):
    return [(2, 3, 1, 2, 2, 1, 3, 2)[i] for i in range(r)]


def _linear(g, x, s):
    w, b = _rand(4, s[-1], seed=1), _rand(4, seed=2)
    (y,) = g.add_node("aten.linear", [x, _const(g, "w", w), _const(g, "b", b)], {})
    return y, lambda t: A.linear(t, torch.from_numpy(w), torch.from_numpy(b))


def _binary(op, f):
    def build(g, x, s):
        c = _rand(*s[-1:], seed=3) + (3.0 if op == "aten.div" else 0.0)  # broadcasts along the last dim
        (y,) = g.add_node(op, [x, _const(g, "c", c)], {})
        return y, lambda t: f(t, torch.from_numpy(c))
    return build


def _self_binary(g, x, s):
    (y,) = g.add_node("aten.mul", [x, x], {})
    return y, lambda t: t * t


def _unary(op, attrs, f):
    def build(g, x, s):
        (y,) = g.add_node(op, [x], attrs)
        return y, f
    return build


def _pad(g, x, s):
    (y,) = g.add_node("aten.constant_pad_nd", [x], {"pad": [1, 2], "value": 0.5})
    return y, lambda t: A.constant_pad_nd(t, [1, 2], 0.5)


def _softmax(g, x, s):
    (y,) = g.add_node("aten._softmax", [x], {"dim": -1})
    return y, lambda t: A._softmax(t, -1, False)


def _flatten(g, x, s):
    n = int(np.prod(s, dtype=np.int64))
    (y,) = g.add_node("aten.view", [x], {"size": [n]})
    return y, lambda t: t.reshape(n)


def _unflatten(g, x, s):
    # The input is the flat tensor; the output has rank r.
    (y,) = g.add_node("aten.view", [x], {"size": list(s)})
    return y, lambda t: t.reshape(s)


RANK_FAMILY = {
    "linear": (_linear, 1),
    "add": (_binary("aten.add", lambda t, c: t + c), 1),
    "sub": (_binary("aten.sub", lambda t, c: t - c), 1),
    "div": (_binary("aten.div", lambda t, c: t / c), 1),
    "mul_self": (_self_binary, 0),
    "relu": (_unary("aten.relu", {}, A.relu), 0),
    "clamp": (_unary("aten.clamp", {"min": -0.5, "max": 0.5}, lambda t: A.clamp(t, -0.5, 0.5)), 0),
    "hardtanh": (_unary("aten.hardtanh", {}, A.hardtanh), 0),
    "sigmoid": (_unary("aten.sigmoid", {}, A.sigmoid), 0),
    "silu": (_unary("aten.silu", {}, A.silu), 0),
    "hardswish": (_unary("aten.hardswish", {}, A.hardswish), 0),
    "hardsigmoid": (_unary("aten.hardsigmoid", {}, A.hardsigmoid), 0),
    "leaky_relu": (_unary("aten.leaky_relu", {"negative_slope": 0.2}, lambda t: A.leaky_relu(t, 0.2)), 0),
    "constant_pad_nd": (_pad, 1),
    "softmax": (_softmax, 1),
    "view_flatten": (_flatten, 0),
    "view_unflatten": (_unflatten, 0),
}


@pytest.mark.parametrize("op", list(RANK_FAMILY))
def test_rank_family(op, monkeypatch):
    make, min_rank = RANK_FAMILY[op]
    delegated_ranks = []
    for r in range(min_rank, 9):
        s = _shape(r)
        x = np.asarray(_rand(*s, seed=r) * 2, dtype=np.float32)
        if op == "view_unflatten":
            x = x.reshape(-1)
        scratch = kiln.Graph()  # the eager function (its constants come from fixed seeds)
        _, f = make(scratch, scratch.add_input("x", kiln_dtype(x), list(x.shape)), s)
        ref = [f(torch.from_numpy(x)).numpy()]

        def build(g, ids):
            return [make(g, ids[0], s)[0]]

        reports = check_three_ways(build, [x], ref, monkeypatch, f"{op} rank {r}")
        dl = reports["shipped"]
        if segment(dl, "xnnpack")["nodes"] > 0:
            delegated_ranks.append(r)
        if r > 6:
            # Declined at compile with the limit named, whichever check decided.
            assert segment(dl, "xnnpack")["nodes"] == 0, (op, r, dl)
            for mode, d in reports.items():
                (rs,) = [[why for b, why in cc["reasons"] if b == "xnnpack"] for cc in d["cpu_ops"]]
                assert any(RANK_LIMIT in why for why in rs), (op, r, mode, rs)
            (built,) = [why for b, why in reports["build_only"]["cpu_ops"][0]["reasons"] if b == "xnnpack"]
            assert "xnn_status 4" in built, built  # XNNPACK's own status when building decides
    # Every op delegates at rank 6 (the limit itself) and never above it.
    assert 6 in delegated_ranks and max(delegated_ranks) == 6, (op, delegated_ranks)


# ------------------------------------------------------------------------------------------------
# attribute limits of XNNPACK's nodes (docs/delegation.md's table)

ATTRIBUTE_CASES = [
    # (name, op, attrs, input shape, eager, delegated?)
    ("clamp_min_eq_max", "aten.clamp", {"min": 1.0, "max": 1.0}, (2, 5), lambda t: A.clamp(t, 1.0, 1.0), False),
    ("clamp_min_gt_max", "aten.clamp", {"min": 2.0, "max": 1.0}, (2, 5), lambda t: A.clamp(t, 2.0, 1.0), False),
    ("clamp_equal_in_float32", "aten.clamp", {"min": 1e-50, "max": 2e-50}, (2, 5),
     lambda t: A.clamp(t, 1e-50, 2e-50), False),
    ("clamp_min_inf", "aten.clamp", {"min": float("inf")}, (2, 5), lambda t: A.clamp(t, min=float("inf")), False),
    ("clamp_open", "aten.clamp", {"min": -float("inf"), "max": float("inf")}, (2, 5),
     lambda t: A.clamp(t, -float("inf"), float("inf")), True),
    ("hardtanh_equal", "aten.hardtanh", {"min_val": 0.5, "max_val": 0.5}, (2, 5), lambda t: A.hardtanh(t, 0.5, 0.5),
     False),
    ("leaky_relu_big_slope", "aten.leaky_relu", {"negative_slope": 1e30}, (2, 5),
     lambda t: A.leaky_relu(t, 1e30), True),
    # 1x1 pooling windows (XNNPACK's pooling nodes reject them): a copy or an exact subsample.
    ("avg_pool_1x1_s2", "aten.avg_pool2d", {"kernel_size": [1, 1], "stride": [2, 2]}, (1, 3, 7, 6),
     lambda t: A.avg_pool2d(t, [1, 1], [2, 2]), True),
    ("avg_pool_1x1_s1", "aten.avg_pool2d", {"kernel_size": [1, 1], "stride": [1, 1]}, (1, 3, 5, 4),
     lambda t: A.avg_pool2d(t, [1, 1], [1, 1]), True),
    ("avg_pool_1x1_s1x3", "aten.avg_pool2d", {"kernel_size": [1], "stride": [1, 3]}, (2, 4, 5, 7),
     lambda t: A.avg_pool2d(t, [1], [1, 3]), True),
    ("max_pool_1x1_s2", "aten.max_pool2d", {"kernel_size": [1, 1], "stride": [2, 2]}, (1, 3, 7, 6),
     lambda t: A.max_pool2d(t, [1, 1], [2, 2]), True),
    ("max_pool_1x1_s2_ceil", "aten.max_pool2d",
     {"kernel_size": [1, 1], "stride": [2, 2], "padding": [0, 0], "dilation": [1, 1], "ceil_mode": True},
     (1, 3, 8, 5), lambda t: A.max_pool2d(t, [1, 1], [2, 2], [0, 0], [1, 1], True), True),
    ("adaptive_avg_pool_same_size", "aten.adaptive_avg_pool2d", {"output_size": [5, 4]}, (1, 3, 5, 4),
     lambda t: A.adaptive_avg_pool2d(t, [5, 4]), True),
    # stride larger than the window: XNNPACK accepts it
    ("max_pool_2x2_s3", "aten.max_pool2d", {"kernel_size": [2, 2], "stride": [3, 3]}, (1, 2, 8, 8),
     lambda t: A.max_pool2d(t, [2, 2], [3, 3]), True),
    ("avg_pool_2x2_s3", "aten.avg_pool2d", {"kernel_size": [2, 2], "stride": [3, 3]}, (1, 2, 8, 8),
     lambda t: A.avg_pool2d(t, [2, 2], [3, 3]), True),
]


@pytest.mark.parametrize("case", ATTRIBUTE_CASES, ids=[c[0] for c in ATTRIBUTE_CASES])
def test_attribute_limits(case, monkeypatch):
    name, op, attrs, shape, f, delegated = case
    x = _rand(*shape, seed=7) * 2
    ref = [f(torch.from_numpy(x)).numpy()]
    reports = check_three_ways(lambda g, ids: g.add_node(op, ids, attrs), [x], ref, monkeypatch, name)
    dl = reports["shipped"]
    assert (segment(dl, "xnnpack")["nodes"] == 1) == delegated, dl
    if not delegated:
        for mode, d in reports.items():
            (why,) = declined_reasons(d, op, "xnnpack")
            # XNNPACK's clamp requires min < max; building alone reports its status.
            assert ("xnn_status 2" if mode == "build_only" else "min < max") in why, (mode, why)


# ------------------------------------------------------------------------------------------------
# the two programs, through kiln.export

class Rank7Linear(torch.nn.Module):
    """nn.Linear(6, 1) on a rank-7 input (issue 22, case 1), then a rank-2 head that can delegate."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 1)
        self.head = torch.nn.Linear(1, 3)

    def forward(self, x):
        return torch.sigmoid(self.head(self.fc(x).reshape(1, 1)))


def test_rank7_linear_is_declined_naming_the_limit_and_the_rest_delegates():
    torch.manual_seed(0)
    model = Rank7Linear().eval()
    x = torch.randn(1, 1, 1, 1, 1, 1, 6)
    with torch.no_grad():
        ref = model(x).numpy()
    res = kiln.export(model, (x,), backends=("xnnpack",), verbose=False)
    (m,) = res.report["methods"]
    dl = m["delegation"]
    lin = declined_reasons(dl, "aten.linear", "xnnpack")
    assert len(lin) == 1 and "rank 7 " + RANK_LIMIT in lin[0], dl
    assert segment(dl, "xnnpack")["nodes"] >= 2, dl  # the head linear and the sigmoid
    assert_close(res.load().run(x)[0], ref, 1e-5, "rank-7 linear")


def test_efficientformerv2_s0_loads_and_matches_eager():
    """timm's efficientformerv2_s0 (random weights, 1x3x224x224; issue 22, case 2): its
    AvgPool2d(1, 2) made a segment XNNPACK refused at load; now every node that xnnpack takes
    builds, the pooling is delegated, and the program matches eager."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("efficientformerv2_s0", pretrained=False).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        ref = model(x).numpy()
    res = kiln.export(model, (x,), backends=("xnnpack",), verbose=False)
    (m,) = res.report["methods"]
    dl = m["delegation"]
    for c in dl["cpu_ops"]:
        assert not any("does not build" in r for _, r in c["reasons"]), c
    assert declined_reasons(dl, "aten.avg_pool2d", "xnnpack") == [], dl
    assert segment(dl, "xnnpack")["nodes"] > 100, dl
    out = res.load().run(x)[0]
    scale = float(np.abs(ref).max())
    assert scale > 1e-3, scale  # the check below means something
    assert float(np.abs(out - ref).max()) <= 1e-4 * scale

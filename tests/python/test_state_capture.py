"""Symbolic sizes and state captured from PyTorch (issue 18, items 1-2): buffers a module updates in
forward become state tensors kept in a session, through every update form torch.export reports
(index_put_, index_copy_, slice assignment, in-place arithmetic); dims declared with
torch.export.Dim become symbols; methods of one program share state by name. The reference is the
same module run eagerly call after call (its buffers carry the state)."""
import copy

import numpy as np
import pytest
import torch

import kiln

SEQ = torch.export.Dim("seq", min=1, max=8)


class IndexPut(torch.nn.Module):
    """A KV-cache-like write at positions pos + arange(seq) (aten.index_put, written in place)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(1, 8, 4), persistent=False)

    def forward(self, x, pos):
        y = self.lin(x)
        self.cache[:, pos + torch.arange(x.shape[1])] = y
        return self.cache.sum(1) + y.mean(1)


class IndexCopy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.zeros(8, 4), persistent=False)

    def forward(self, x, pos):
        self.c.index_copy_(0, pos + torch.arange(x.shape[0]), x)
        return self.c * 2


class SliceAssign(torch.nn.Module):
    """copy_ into a slice (functionalized to slice_scatter) of a symbolic length."""

    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.zeros(8, 4), persistent=False)

    def forward(self, x):
        self.c[: x.shape[0]] = x
        return self.c.sum(0, keepdim=True)


class Counter(torch.nn.Module):
    """A state with a non-zero initial value (stored as a constant), updated by arithmetic (copied)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("n", torch.full((1,), 3.0), persistent=False)

    def forward(self, x):
        self.n.add_(1)
        return x * self.n


CASES = {
    "index_put": (IndexPut, lambda T, k: (torch.randn(1, T, 4), torch.tensor([k])), {"x": {1: SEQ}, "pos": None},
                  [(3, 0), (1, 3), (2, 4)]),
    "index_copy": (IndexCopy, lambda T, k: (torch.randn(T, 4), torch.tensor([k])), {"x": {0: SEQ}, "pos": None},
                   [(2, 0), (3, 2), (1, 7)]),
    "slice_assign": (SliceAssign, lambda T, k: (torch.randn(T, 4),), {"x": {0: SEQ}}, [(3, 0), (5, 0), (1, 0)]),
    "counter": (Counter, lambda T, k: (torch.randn(3),), None, [(3, 0), (3, 0), (3, 0)]),
}


def _export(tmp_path, name):
    cls, make, dyn, _ = CASES[name]
    torch.manual_seed(0)
    m = cls().eval()
    ref = copy.deepcopy(m)
    path = tmp_path / f"{name}.kiln"
    kiln.export(m, make(2, 0), out=path, dynamic_shapes=dyn, verbose=False)
    return path, ref


@pytest.mark.parametrize("portable", [False, True], ids=["cpu", "portable"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_state_follows_eager_across_calls(tmp_path, name, portable):
    path, ref = _export(tmp_path, name)
    p = kiln.load(path, portable_kernels_only=portable)
    assert [s["name"] for s in p.states] and p.method_meta()["states"]
    torch.manual_seed(1)
    for T, k in CASES[name][3]:
        args = CASES[name][1](T, k)
        out = p.run(*[a.numpy() for a in args])
        with torch.no_grad():
            want = ref(*args)
        assert out[0].shape == tuple(want.shape)
        np.testing.assert_allclose(out[0], want.numpy(), rtol=1e-5, atol=1e-5)


def test_symbols_reported_and_range_checked(tmp_path):
    path, _ = _export(tmp_path, "index_put")
    p = kiln.load(path)
    meta = p.method_meta()
    assert meta["symbols"] == [("seq", 1, 8)]
    assert meta["inputs"][0]["dims"] == ["", "seq", ""] and meta["inputs"][0]["sizes"] == [1, 8, 4]
    s = p.new_session()
    p.run(np.ones((1, 2, 4), np.float32), np.array([0]), session=s)
    before = s.state("cache")
    with pytest.raises(kiln.KilnError, match=r"dim 1 is 9, outside symbol 'seq' in \[1, 8\]"):
        p.run(np.ones((1, 9, 4), np.float32), np.array([0]), session=s)
    with pytest.raises(kiln.KilnError, match="dtype|expected"):
        p.run(np.ones((1, 2, 4), np.float64), np.array([0]), session=s)
    # An index past the cache: index_put checks every index before writing, so nothing changes.
    with pytest.raises(kiln.KilnError, match="index_put"):
        p.run(np.ones((1, 3, 4), np.float32), np.array([7]), session=s)
    np.testing.assert_array_equal(s.state("cache"), before)
    assert not s.failed


def test_sessions_are_independent_and_reset(tmp_path):
    path, _ = _export(tmp_path, "counter")
    p = kiln.load(path)
    a, b = p.new_session(), p.new_session()
    x = np.ones(3, np.float32)
    assert p.run(x, session=a)[0][0] == 4.0
    assert p.run(x, session=a)[0][0] == 5.0
    assert p.run(x, session=b)[0][0] == 4.0  # b starts from the initial value
    a.reset()
    assert p.run(x, session=a)[0][0] == 4.0
    np.testing.assert_array_equal(b.state("n"), [4.0])


def test_methods_share_state_by_name(tmp_path):
    """A prefill method writes a cache that a decode method of the same program reads (one session)."""

    class Prefill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(8, 2), persistent=False)

        def forward(self, x):
            self.cache[: x.shape[0]] = x
            return self.cache.sum(0)

    class Decode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(8, 2), persistent=False)

        def forward(self, x, pos):
            self.cache[pos] = x
            return self.cache.sum(0)

    path = tmp_path / "two.kiln"
    kiln.export_program({"prefill": (Prefill(), (torch.ones(3, 2),)),
                         "decode": (Decode(), (torch.ones(1, 2), torch.tensor([3])))},
                        out=path, dynamic_shapes={"prefill": {"x": {0: SEQ}}}, verbose=False)
    p = kiln.load(path)
    assert [s["name"] for s in p.states] == ["cache"]
    s = p.new_session()
    np.testing.assert_allclose(p.run(np.full((3, 2), 2, np.float32), method="prefill", session=s)[0], [6, 6])
    np.testing.assert_allclose(p.run(np.full((1, 2), 5, np.float32), np.array([3]), method="decode", session=s)[0],
                               [11, 11])


def test_unbounded_dim_is_refused(tmp_path):
    class M(torch.nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(kiln.ExportError, match="upper bound|unbounded"):
        kiln.export(M(), (torch.ones(4, 2),), out=tmp_path / "u.kiln",
                    dynamic_shapes={"x": {0: torch.export.Dim("n", min=1)}}, verbose=False)


# --------------------------------------------------------------------------------------------------
# found by a tester: each was a silent wrong answer or a file that did not load

class _KV(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.zeros(1, 8, 4), persistent=False)
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, pos):
        self.c[:, pos + torch.arange(x.shape[1])] = self.lin(x)
        return self.c.sum(1)

    def decode(self, x, pos):
        self.c[:, pos] = self.lin(x)[:, 0] * 2
        return self.c.mean(1)


def test_named_method_shares_state_with_forward(tmp_path):
    """export_program's (module, args, "decode") form: the state keeps its buffer's name (not the
    method wrapper's kiln_inner.c), so prefill and decode share one cache."""
    torch.manual_seed(0)
    m = _KV().eval()
    ref = copy.deepcopy(m)
    path = tmp_path / "kv.kiln"
    kiln.export_program({"prefill": (m, (torch.randn(1, 3, 4), torch.tensor([0]))),
                         "decode": (m, (torch.randn(1, 1, 4), torch.tensor([3])), "decode")},
                        out=path, dynamic_shapes={"prefill": {"x": {1: SEQ}, "pos": None}}, verbose=False)
    p = kiln.load(path)
    assert [s["name"] for s in p.states] == ["c"]
    x1, x2 = torch.randn(1, 3, 4), torch.randn(1, 1, 4)
    got1 = p.run(x1.numpy(), np.array([0]), method="prefill")[0]
    got2 = p.run(x2.numpy(), np.array([3]), method="decode")[0]
    with torch.no_grad():
        want1, want2 = ref(x1, torch.tensor([0])), ref.decode(x2, torch.tensor([3]))
    np.testing.assert_allclose(got1, want1.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got2, want2.numpy(), rtol=1e-5, atol=1e-5)


def test_method_reading_a_state_another_updates_sees_it(tmp_path):
    class A(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", torch.zeros(4, 2))

        def forward(self, x):
            self.c.add_(x)
            return self.c * 1

    class R(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", torch.zeros(4, 2))

        def forward(self, x):
            return self.c + x

    path = tmp_path / "shared.kiln"
    kiln.export_program({"a": (A(), (torch.ones(4, 2),)), "b": (R(), (torch.ones(4, 2),))}, out=path, verbose=False)
    p = kiln.load(path)
    assert p.method_meta("b")["states"] == ["c"]
    one = np.ones((4, 2), np.float32)
    p.run(one, method="a")
    p.run(one, method="a")
    np.testing.assert_array_equal(p.run(one, method="b")[0], np.full((4, 2), 3.0, np.float32))


@pytest.mark.parametrize("fn", [lambda x: torch.full_like(x, 2.0), lambda x: torch.zeros_like(x) * 3 + x,
                                lambda x: torch.ones_like(x) + x, lambda x: x * x.shape[0],
                                lambda x: x / x.shape[0]],
                         ids=["full_like", "zeros_like", "ones_like", "mul_size", "div_size"])
def test_symbolic_fills_and_sizes_as_numbers(tmp_path, fn):
    class M(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    s = torch.export.Dim("s", min=2, max=16)
    path = tmp_path / "f.kiln"
    kiln.export(M(), (torch.randn(6, 4),), out=path, dynamic_shapes={"x": {0: s}}, verbose=False)
    p = kiln.load(path)
    for n in (2, 5, 16):
        x = torch.randn(n, 4)
        got = p.run(x.numpy())[0]
        np.testing.assert_allclose(got, fn(x).numpy(), rtol=1e-6, atol=1e-6)


def test_mapping_without_symbolic_sizes_is_refused_not_wrong(tmp_path):
    """An op whose mapping fixes a size that torch traced as symbolic (upsampling by a scale along a
    symbolic dim) is refused at export, never compiled to a fixed wrong size."""

    class Up(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.interpolate(x.t().unsqueeze(0), scale_factor=2, mode="nearest")

    s = torch.export.Dim("s", min=2, max=16)
    with pytest.raises(kiln.ExportError, match="differ from the traced sizes|symbolic"):
        kiln.export(Up(), (torch.randn(6, 4),), out=tmp_path / "u.kiln", dynamic_shapes={"x": {0: s}}, verbose=False)


def test_symbol_bound_only_by_a_derived_dim_is_refused_at_export(tmp_path):
    class V(torch.nn.Module):
        def forward(self, x):
            return x.view(2, x.shape[0] // 2, 3).sum(0)

    e = torch.export.Dim("e", min=1, max=8)
    with pytest.raises(kiln.ExportError, match="symbol 'e' is bound by no input dimension"):
        kiln.export(V(), (torch.randn(8, 3),), out=tmp_path / "v.kiln", dynamic_shapes={"x": {0: 2 * e}}, verbose=False)

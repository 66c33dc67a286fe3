"""Hugging Face transformers models export unchanged and match eager (issue 17, item 4).

Every model of tests/python/hf_models.py (tiny configs, seeded random weights, eval, static shapes,
use_cache=False, nothing downloaded) is captured ONCE with kiln's capture per attn_implementation
(a module-scoped cache) and compiled from that capture for each way a program runs: Kiln's portable
kernels, the optimized cpu kernels, backends=("xnnpack",) and backends=("mlx",) on MLX's CPU device.
Each run is compared with eager PyTorch: max abs error <= 1e-4 * max|eager output|, per output.
The mlx delegate must take every node of these models in one segment (no fragmentation); xnnpack
takes what it supports, and the rest runs on Kiln's CPU kernels (docs/transformers.md lists both).

Default (CI) set: every model with attn_implementation="sdpa" on all four backends, and "eager" on
the portable kernels for a few models. KILN_HF_FULL=1 runs both attn_implementation values on every
backend (by hand; tools/hf_report.py writes docs/transformers.md from the same sweep).
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("transformers")

import kiln  # noqa: E402
import hf_models as H  # noqa: E402
from kiln.capture import ExportError  # noqa: E402

torch.set_num_threads(1)
FULL = os.environ.get("KILN_HF_FULL") == "1"

#: what blocks a model today: model name -> (reason, exception it raises); each such case is a
#: strict xfail, so the test fails once the model works and the entry must go
BLOCKED: dict = {}

EAGER_CI = ("bert", "llama", "t5", "whisper")  # attn_implementation="eager" on portable kernels in CI


def _cases():
    out = []
    for name in H.MODELS:
        for attn in H.ATTN:
            for backend in H.BACKENDS:
                ci = attn == "sdpa" or (backend == "portable" and name in EAGER_CI)
                marks = [] if ci or FULL else [pytest.mark.skip(reason="full sweep only (KILN_HF_FULL=1)")]
                if name in BLOCKED:
                    reason, exc = BLOCKED[name]
                    marks.append(pytest.mark.xfail(strict=True, raises=exc, reason=reason))
                if backend in ("xnnpack", "mlx") and backend not in kiln._kiln.backend_names():
                    marks.append(pytest.mark.skip(reason=f"the {backend} backend is not built into this Kiln"))
                out.append(pytest.param(name, attn, backend, marks=marks, id=f"{name}-{attn}-{backend}"))
    return out


_CACHE: dict = {}


@pytest.fixture(scope="module")
def captured():
    """(name, attn) -> (module, inputs, eager outputs, capture or the ExportError it raised):
    each model is built, run eagerly and captured once for every backend's test."""
    def get(name, attn):
        key = (name, attn)
        if key not in _CACHE:
            module, inputs = H.build(name, attn)
            ref = H.eager(module, inputs)
            try:
                cap = H.capture(module, inputs)
            except ExportError as e:
                cap = e
            _CACHE[key] = (module, inputs, ref, cap)
        return _CACHE[key]
    yield get
    _CACHE.clear()


@pytest.mark.parametrize("name,attn,backend", _cases())
def test_hf_model_matches_eager(captured, name, attn, backend):
    module, inputs, ref, cap = captured(name, attn)
    if isinstance(cap, Exception):
        raise cap
    got, delegation = H.run_backend(cap, backend, inputs)
    errs = H.rel_errors(got, ref)
    assert max(errs) <= H.REL, f"{name} ({attn}) on {backend}: relative errors {errs}"
    if backend == "mlx":
        # the mlx delegate lowers every op these models use: one segment, nothing left on the CPU
        (mlx,) = [b for b in delegation["backends"] if b["backend"] == "mlx"]
        assert mlx["segments"] == 1 and not delegation.get("cpu_ops"), H.delegation_summary(delegation)
    if backend == "xnnpack":
        (x,) = [b for b in delegation["backends"] if b["backend"] == "xnnpack"]
        assert x["nodes"] > 0, H.delegation_summary(delegation)  # the linear layers at least
        for op, _, reasons in H.delegation_summary(delegation)[1]:
            assert all(r for _, r in reasons), f"{op} left on the CPU without a reason"


def test_hf_capture_is_reused_across_backends(captured):
    """One capture compiles for several backends and gives the same program for the same options
    (the graph handed to the compiler is not consumed or changed by a compile)."""
    from kiln import capture as C
    _, inputs, _, cap = captured("llama", "sdpa")
    a = C.compile_captures({"forward": cap}, verbose=False).data
    C.compile_captures({"forward": cap}, backends=("xnnpack",) if "xnnpack" in kiln._kiln.backend_names() else (),
                       verbose=False)
    b = C.compile_captures({"forward": cap}, verbose=False).data
    assert a == b


# --------------------------------------------------------------------------------------------------
# the capture-side rewrites these models need, on their own

class _Index(torch.nn.Module):
    def __init__(self, indices):
        super().__init__()
        self.indices = indices

    def forward(self, x):
        return torch.ops.aten.index.Tensor(x, [None if i is None else i.clone() for i in self.indices]) + 0


_AR = torch.arange
GRID_CASES = {
    # transformers' masking_utils: padding_mask[batch_idx, kv_idx] with broadcast aranges
    "mask_lookup": ((2, 12), [_AR(2).view(2, 1, 1, 1), _AR(12).view(1, 1, 1, 12)]),
    "query_axis": ((1, 8), [_AR(1).view(1, 1, 1, 1), _AR(8).view(1, 1, 8, 1)]),
    "none_gap": ((3, 5, 4), [None, _AR(5).view(5, 1), _AR(4).view(1, 4)]),
    "non_adjacent_goes_first": ((3, 5, 4), [_AR(3).view(1, 3), None, _AR(4).view(4, 1)]),
    "offset_range": ((6, 5), [_AR(2, 5)]),
    "negative_scalar": ((6, 5), [torch.tensor(-1)]),
    "repeated_value_broadcast": ((4, 5, 6), [_AR(4).view(4, 1), torch.tensor([2, 2, 2]).view(1, 3)]),
    "transposed_grid": ((4, 5), [_AR(4).view(1, 4), _AR(5).view(5, 1)]),
    "int32_indices": ((4, 5), [_AR(4, dtype=torch.int32).view(4, 1), _AR(-5, 0, dtype=torch.int32).view(1, 5)]),
}


@pytest.mark.parametrize("case", list(GRID_CASES))
def test_index_range_grid_is_views(case, monkeypatch):
    """aten.index with constant range-grid indices (the HF padding-mask lookup) exports as slices,
    permutes, views and expands: exact values on both kernel sets, and no gather-like node."""
    from kiln import capture as C
    emitted = []
    emit = C._Builder.emit
    monkeypatch.setattr(C._Builder, "emit", lambda self, op, *a, **k: emitted.append(op) or emit(self, op, *a, **k))
    shape, indices = GRID_CASES[case]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    m = _Index(indices)
    ref = m(x)
    res = kiln.export(m, (x,), fold_constants=False, verbose=False)
    for portable in (True, False):
        got = torch.from_numpy(kiln.load_bytes(res.data, portable_kernels_only=portable).run(x)[0])
        assert got.shape == ref.shape and torch.equal(got, ref)
    assert set(emitted) <= {"aten.slice", "aten.permute", "aten.view", "aten.expand", "aten.add"}, emitted


def test_index_not_a_grid_falls_back():
    """A constant index tensor that is not a range along one axis still goes through the gather
    path (and out-of-range constants keep its error)."""
    x = torch.randn(6, 5)
    m = _Index([torch.tensor([[0, 2], [1, 5]])])
    got = kiln.load_bytes(kiln.export(m, (x,), verbose=False).data).run(x)[0]
    assert torch.equal(torch.from_numpy(got), m(x))
    with pytest.raises((ExportError, kiln.KilnError), match="index|range"):
        bad = _Index([torch.tensor([0, 6])])
        kiln.load_bytes(kiln.export(bad, (x,), verbose=False).data).run(x)


def test_gather_from_expanded_buffer_folds():
    """BertEmbeddings without token_type_ids: gather(buffer.expand(1, -1), 1, position_ids), all
    constants, folds at export time (a small constant expand is evaluated, not kept as a node)."""
    class Emb(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("tt", torch.tensor([[0, 1, 1, 0, 1, 0, 0, 1]]), persistent=False)
            self.register_buffer("pos", torch.arange(8).view(1, 8), persistent=False)
            self.emb = torch.nn.Embedding(2, 4)

        def forward(self, x):
            t = torch.gather(self.tt.expand(1, -1), 1, self.pos[:, :6])
            return self.emb(t.expand(x.shape[0], 6)) + x

    m = Emb().eval()
    x = torch.randn(3, 6, 4)
    got = kiln.load_bytes(kiln.export(m, (x,), verbose=False).data, portable_kernels_only=True).run(x)[0]
    assert torch.equal(torch.from_numpy(got), m(x).detach())


ARGMAX_CASES = [
    # (dtype, shape, attrs): CLIP's text pooling is int32 input_ids.argmax(-1)
    (torch.int32, (2, 12), {"dim": -1}),
    (torch.int64, (3, 4, 5), {"dim": 1, "keepdim": True}),
    (torch.int8, (4, 6), {"dim": 0}),
    (torch.uint8, (2, 3, 4), {"dim": None}),
    (torch.int64, (2, 3, 4), {"dim": None, "keepdim": True}),
]


@pytest.mark.skipif("mlx" not in kiln._kiln.backend_names(), reason="the mlx backend is not built into this Kiln")
@pytest.mark.parametrize("case", range(len(ARGMAX_CASES)))
def test_mlx_integer_argmax_first_of_ties(case, monkeypatch):
    """The mlx delegate lowers argmax of integer tensors (first maximal index, as PyTorch), with
    many ties (values in 0..3); float argmax stays declined (tests/python/test_mlx.py)."""
    from delegate_util import compile_graph, segment
    monkeypatch.setenv("KILN_MLX_DEVICE", "cpu")
    dtype, shape, attrs = ARGMAX_CASES[case]
    x = torch.randint(0, 4, shape, generator=torch.Generator().manual_seed(case), dtype=torch.int64).to(dtype)
    (out,), dl, _, _ = compile_graph(lambda g, ids: g.add_node("aten.argmax", ids, attrs), [x.numpy()], ("mlx",))
    assert segment(dl, "mlx")["segments"] == 1 and dl["cpu_ops"] == [], dl
    ref = torch.argmax(x.long(), **attrs)  # PyTorch: the first index of the maximum
    assert out.dtype == np.int64 and out.shape == tuple(ref.shape) and np.array_equal(out, ref.numpy())


@pytest.mark.parametrize("name", ["t5", "whisper"])
def test_seq2seq_encoder_and_decoder_as_two_methods(name):
    """T5 / Whisper exported as one program with two methods (kiln.export_program): `encode` and a
    fixed-length `decode` pass (no cache) that takes the encoder's output; the weights both use are
    stored once; each method matches eager on the cpu kernels and, where built, on mlx (CPU device)."""
    module, (enc_in, dec_ids) = H.build(name, "sdpa")
    parts = H.Seq2SeqParts(module.model, module.enc_key).eval()
    with torch.no_grad():
        enc = parts.encode(enc_in)
        logits = parts.decode(enc, dec_ids)
        full = module(enc_in, dec_ids)
    assert torch.equal(logits, full)  # the split computes what the one-call model does
    methods = {"encode": (parts, (enc_in,), "encode"), "decode": (parts, (enc, dec_ids), "decode")}
    backends = [()] + ([("mlx",)] if "mlx" in kiln._kiln.backend_names() else [])
    for be in backends:
        res = kiln.export_program(methods, backends=be, verbose=False)
        prog = kiln.load_bytes(res.data, backend_settings={"mlx.device": "cpu"} if be else None)
        got_enc = torch.from_numpy(prog.run(enc_in, method="encode")[0])
        got_logits = torch.from_numpy(prog.run(got_enc, dec_ids, method="decode")[0])
        assert max(H.rel_errors([got_enc, got_logits], [enc, logits])) <= H.REL, be
    # T5's encoder and decoder share the token embedding (also the tied lm_head): stored once across
    # the methods; Whisper's encoder and decoder share no weight
    one = [kiln.export_program({k: v}, verbose=False).report["constant_bytes"] for k, v in methods.items()]
    if name == "t5":
        assert res.report["constant_bytes"] < sum(one)
    else:
        assert res.report["constant_bytes"] == sum(one)

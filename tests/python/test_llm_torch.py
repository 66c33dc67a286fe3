"""LLM export, PyTorch side (issue 18), pure torch: kiln.llm.KilnCausalLM (a transformers causal
LM with a static KV cache and kiln::sdpa_kv_cache attention) against transformers itself.

- greedy generation with the wrapper (prefill the prompt at input_pos 0, then one token per call)
  gives the token ids of ``model.generate(do_sample=False, min_new_tokens=16, max_new_tokens=16)``
  for prompts of 1, 7 and max_seq_len - 16 tokens, and every step's logits match eager transformers
  (a forward over the whole sequence so far) within 1e-4 relative; Llama, Qwen 3, Gemma 3 (one
  sliding-window layer with a window shorter than the prompts, one full layer);
- torch.export with the ``seq`` Dim: one program, the same logits as the eager wrapper for several
  sequence lengths, the caches reported as mutated buffers;
- positions past max_seq_len raise; unsupported configs raise naming the part.
"""
from __future__ import annotations

import os
import sys
import types

import pytest
import torch

try:
    from kiln import llm, llm_ops
except ImportError:  # the C++ binding (kiln._kiln) is not built: these modules are pure Python
    _pkg = types.ModuleType("kiln")
    _pkg.__path__ = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "kiln")]
    sys.modules["kiln"] = _pkg
    from kiln import llm, llm_ops

import llm_models

MAX_SEQ = 48
NEW = 16
PROMPT_LENS = (1, 7, MAX_SEQ - NEW)
RTOL = 1e-4


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


@pytest.fixture(scope="module", params=sorted(llm_models.BUILDERS))
def arch(request, tmp_path_factory):
    d = llm_models.BUILDERS[request.param](tmp_path_factory.mktemp(request.param))
    hf, config = llm.load_llm(d)           # the reference (transformers' own attention)
    mine, _ = llm.load_llm(d)
    return types.SimpleNamespace(name=request.param, dir=d, hf=hf, config=config,
                                 kiln=llm.KilnCausalLM(mine, MAX_SEQ))


def _prompt(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, llm_models.VOCAB, (1, n), generator=g, dtype=torch.int64)


@torch.no_grad()
def test_greedy_matches_transformers_generate(arch):
    eos = [int(i) for i in llm.llm_metadata(arch.config, MAX_SEQ, arch.dir)["llm.eos_ids"].split(",") if i]
    assert eos, "the test configs have an eos id (min_new_tokens suppresses it)"
    near_ties = []
    for n in PROMPT_LENS:
        prompt = _prompt(n, seed=100 + n)
        want = arch.hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                min_new_tokens=NEW, max_new_tokens=NEW)[0, n:].tolist()
        assert len(want) == NEW
        arch.kiln.reset()
        seq = prompt
        logits = arch.kiln(prompt, torch.tensor([0]))
        got = []
        for step in range(NEW):
            ref = arch.hf(seq, use_cache=False).logits[0, -1]
            assert logits.shape == (1, llm_models.VOCAB)
            err = _rel_err(logits[0], ref)
            assert err <= RTOL, f"{arch.name} prompt {n} step {step}: logits rel err {err:.2e}"
            masked = logits[0].clone()
            masked[eos] = float("-inf")         # what min_new_tokens does
            tok = int(masked.argmax())
            if tok != want[step]:
                top2 = ref.clone()
                top2[eos] = float("-inf")
                a, b = top2.topk(2).values.tolist()
                assert a - b < RTOL * float(ref.abs().max()), (
                    f"{arch.name} prompt {n} step {step}: token {tok}, generate gave {want[step]}")
                near_ties.append((n, step))
                tok = want[step]                 # continue from eager's token
            got.append(tok)
            nxt = torch.tensor([[tok]])
            if step + 1 < NEW:
                logits = arch.kiln(nxt, torch.tensor([n + step]))
            seq = torch.cat([seq, nxt], dim=1)
        assert got == want
    assert len(near_ties) <= 1, f"{arch.name}: eager near-ties at {near_ties}"


@torch.no_grad()
def test_export_dynamic_seq(arch):
    module, args, dyn, meta = llm.prepare_llm_export(arch.dir, MAX_SEQ)
    assert meta["llm.arch"] == arch.config.model_type
    assert meta["llm.max_seq_len"] == str(MAX_SEQ) and meta["llm.num_layers"] == "2"
    assert meta["llm.cache"] == ("kv:layers=2,kv_heads=2,head_dim=16,dtype=float32,"
                                 "layout=[1,kv_heads,max_seq_len,head_dim]")
    ep = torch.export.export(module, args, dynamic_shapes=dyn)
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "kiln.sdpa_kv_cache.default" in targets
    fn = ep.run_decompositions()
    caches = {f"{kv}_cache_{i}" for kv in "kv" for i in range(2)}
    assert set(fn.graph_signature.buffers_to_mutate.values()) == caches
    assert "aten.index_put.default" in {str(n.target) for n in fn.graph.nodes if n.op == "call_function"}

    exported = ep.module()
    eager = arch.kiln
    eager.reset()
    toks = _prompt(12, seed=7)
    # prefill 5, then 6 more, then 1: three different sequence lengths through one program
    for lo, hi in ((0, 5), (5, 11), (11, 12)):
        a = eager(toks[:, lo:hi], torch.tensor([lo]))
        b = exported(toks[:, lo:hi], torch.tensor([lo]))
        assert b.shape == (1, llm_models.VOCAB)
        assert _rel_err(b, a) <= 1e-5, f"{arch.name}: exported vs eager at [{lo}, {hi})"

    # positions past the cache: the eager wrapper refuses before touching the cache; the exported
    # program raises too
    snapshot = [t.clone() for kv in eager.caches() for t in kv]
    with pytest.raises(ValueError, match="max_seq_len 48"):
        eager(_prompt(10, seed=8), torch.tensor([MAX_SEQ - 9]))
    assert all(torch.equal(s, t) for s, t in zip(snapshot, (t for kv in eager.caches() for t in kv)))
    with pytest.raises(Exception):
        exported(_prompt(10, seed=8), torch.tensor([MAX_SEQ - 9]))


def _reference_attention(q, k, v, p, scale, window):
    """F.scaled_dot_product_attention over the whole cache with an explicit position mask."""
    t, s = q.shape[2], k.shape[2]
    qpos = torch.arange(p, p + t)[:, None]
    kpos = torch.arange(s)[None]
    mask = kpos <= qpos
    if window > 0:
        mask &= qpos - kpos < window
    g = q.shape[1] // k.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask, scale=scale)


@pytest.mark.parametrize("hq,hkv,p,t,window,scale", [(4, 2, 0, 5, 0, None), (4, 1, 3, 1, 0, 0.3),
                                                     (2, 2, 6, 4, 3, None), (6, 3, 9, 7, 5, 0.1)])
def test_sdpa_kv_cache_op(hq, hkv, p, t, window, scale):
    g = torch.Generator().manual_seed(hq * 100 + p)
    s, d, dv = 16, 8, 6
    q = torch.randn(1, hq, t, d, generator=g)
    k = torch.randn(1, hkv, s, d, generator=g)
    v = torch.randn(1, hkv, s, dv, generator=g)
    out = llm_ops.sdpa_kv_cache(q, k, v, torch.tensor([p]), scale, window)
    assert out.shape == (1, hq, t, dv)
    torch.testing.assert_close(out, _reference_attention(q, k, v, p, scale, window), rtol=1e-5, atol=1e-6)
    # only keys [0, p + t) are read: garbage past them changes nothing
    k2, v2 = k.clone(), v.clone()
    k2[:, :, p + t:] = float("nan")
    v2[:, :, p + t:] = float("nan")
    torch.testing.assert_close(torch.ops.kiln.sdpa_kv_cache(q, k2, v2, torch.tensor([p]), scale, window), out)
    with pytest.raises(ValueError, match="do not fit the cache of 16 positions"):
        torch.ops.kiln.sdpa_kv_cache(q, k, v, torch.tensor([s - t + 1]), scale, window)


def test_unsupported_configs_name_the_part():
    from transformers import Gemma2Config, MistralConfig, T5Config
    with pytest.raises(llm.LLMExportError, match="attn_logit_softcapping=50.0 is not supported"):
        llm.check_llm_config(Gemma2Config())
    with pytest.raises(llm.LLMExportError, match="encoder-decoder"):
        llm.check_llm_config(T5Config())
    cfg = MistralConfig()
    cfg.architectures = ["MistralForCausalLM"]
    with pytest.raises(llm.LLMExportError, match="MistralForCausalLM: architecture not supported"):
        llm.check_llm_config(cfg)

"""LLM export, PyTorch side (issue 18), pure torch: kiln.llm.KilnCausalLM (a transformers causal
LM with a static KV cache and kiln::sdpa_kv_cache attention) against transformers itself.

- greedy generation with the wrapper (prefill the prompt at input_pos 0, then one token per call)
  gives the token ids of ``model.generate(do_sample=False, min_new_tokens=16, max_new_tokens=16)``
  for prompts of 1, 7 and max_seq_len - 16 tokens, and every step's logits match eager transformers
  (a forward over the whole sequence so far) within 1e-4 relative; Llama, Qwen 2, Qwen 3, Mistral
  (sliding window shorter than the prompts) and Gemma 3 (one sliding-window layer with a window
  shorter than the prompts, one full layer);
- torch.export with the ``seq`` Dim: one program, the same logits as the eager wrapper for several
  sequence lengths, the caches reported as mutated buffers;
- positions past max_seq_len raise; unsupported configs raise naming the part: support follows the
  class transformers builds (model_type), not config.architectures; rope types whose frequencies
  change in forward (dynamic, longrope) are refused up front.
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
    from transformers import Gemma2Config, Phi3Config, T5Config
    with pytest.raises(llm.LLMExportError, match="attn_logit_softcapping=50.0 is not supported"):
        llm.check_llm_config(Gemma2Config())
    with pytest.raises(llm.LLMExportError, match="encoder-decoder"):
        llm.check_llm_config(T5Config())
    cfg = Phi3Config()
    cfg.architectures = ["Phi3ForCausalLM"]
    with pytest.raises(llm.LLMExportError, match="Phi3ForCausalLM: architecture not supported"):
        llm.check_llm_config(cfg)


@pytest.mark.parametrize("config_name, built", [("Phi3Config", "Phi3ForCausalLM"), ("OlmoConfig", "OlmoForCausalLM"),
                                                ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
                                                ("Qwen2Config", "Qwen2ForCausalLM"),
                                                ("MistralConfig", "MistralForCausalLM")])
def test_support_follows_the_class_built_not_architectures(config_name, built):
    """transformers builds the class of config.model_type whatever config.architectures says: a
    config that claims LlamaForCausalLM is judged by the class it builds (refused naming it, or
    exported as it)."""
    import transformers
    cfg = getattr(transformers, config_name)()
    cfg.architectures = ["LlamaForCausalLM"]
    if built in llm.SUPPORTED_ARCHS:
        assert llm.check_llm_config(cfg) == built
    else:
        want = rf"{built}: architecture not supported .*model_type '{cfg.model_type}'; config.architectures says Llama"
        with pytest.raises(llm.LLMExportError, match=want):
            llm.check_llm_config(cfg)
    # without an architectures entry: the same decision
    cfg.architectures = None
    if built in llm.SUPPORTED_ARCHS:
        assert llm.check_llm_config(cfg) == built
    else:
        with pytest.raises(llm.LLMExportError, match=rf"{built}: architecture not supported"):
            llm.check_llm_config(cfg)


@pytest.mark.parametrize("rope", [{"rope_type": "dynamic", "factor": 2.0}, {"type": "dynamic", "factor": 2.0},
                                  {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                                   "original_max_position_embeddings": 64}])
def test_unsupported_rope_types_refused_up_front(rope, tmp_path):
    """A rope type the export cannot capture (dynamic NTK, LongRoPE: data-dependent frequencies)
    is LLMExportError naming the type and the supported ones, from the config check, before
    torch.export could fail with a GuardOnDataDependentSymNode trace."""
    from transformers import LlamaConfig
    cfg = LlamaConfig(**{k: v for k, v in llm_models._COMMON.items() if k != "head_dim"}, rope_scaling=rope)
    rt = rope.get("rope_type", rope.get("type"))
    want = rf"LlamaForCausalLM: rope type '{rt}' is not supported .*supported rope types: default, linear, llama3, yarn"
    with pytest.raises(llm.LLMExportError, match=want):
        llm.check_llm_config(cfg)
    # the same from the folder (llm.load_llm, the first step of export_llm)
    torch.manual_seed(0)
    from transformers import LlamaForCausalLM
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "ckpt")
    with pytest.raises(llm.LLMExportError, match=want):
        llm.load_llm(tmp_path / "ckpt")

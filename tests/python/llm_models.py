"""Tiny causal LM checkpoints for the LLM export tests (issue 18): built from configs with seeded
random weights, written with ``save_pretrained`` into a folder (config.json + safetensors +
generation_config.json), nothing downloaded. Each builder returns the folder.

Sizes: hidden 64, 2 layers, 4 heads, 2 KV heads (grouped-query attention), head_dim 16, vocab 256;
Qwen 2 and Qwen 3 tie their embeddings (lm_head = embed_tokens), Llama, Mistral and Gemma 3 do not.
Qwen 2 has biases on q/k/v. Mistral's sliding window (6, on every layer) and Gemma 3's (one
sliding-window layer with window 6 and one full layer) are shorter than the prompts of the tests;
Gemma 3 has query_pre_attn_scalar 24 (scale != 1/sqrt(head_dim)).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

VOCAB = 256
GEMMA3_SLIDING_WINDOW = 6
MISTRAL_SLIDING_WINDOW = 6
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
               bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _init(model: torch.nn.Module, seed: int, embed_std: float = 1.0) -> torch.nn.Module:
    """Seeded weights: normal std 0.2 (embeddings `embed_std`), norm weights near 1 (Gemma's (1 + w)
    norms near 0). Large enough that the logits are spread out (greedy near-ties are rare); chosen so
    that greedy generation does not settle on repeating one token (tied embeddings with large
    embeddings do: the logit of the input token dominates)."""
    g = torch.Generator().manual_seed(seed)
    gemma = "gemma" in model.config.model_type
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if "norm" in name.lower():
                p.copy_(0.1 * r if gemma else 1.0 + 0.1 * r)
            elif "embed" in name:
                p.copy_(embed_std * r)
            else:
                p.copy_(0.2 * r)
    return model.eval()


def _save(model, d: str) -> str:
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d)
    return d


def tiny_llama(tmpdir, seed: int = 0) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(**_COMMON, rope_theta=10000.0, tie_word_embeddings=False)
    return _save(_init(LlamaForCausalLM(cfg), seed), os.path.join(os.fspath(tmpdir), "tiny_llama"))


def tiny_qwen3(tmpdir, seed: int = 1) -> str:
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(**_COMMON, tie_word_embeddings=True)
    return _save(_init(Qwen3ForCausalLM(cfg), seed, embed_std=0.1), os.path.join(os.fspath(tmpdir), "tiny_qwen3"))


def tiny_qwen2(tmpdir, seed: int = 3) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(**_COMMON, tie_word_embeddings=True)
    return _save(_init(Qwen2ForCausalLM(cfg), seed, embed_std=0.1), os.path.join(os.fspath(tmpdir), "tiny_qwen2"))


def tiny_mistral(tmpdir, seed: int = 4) -> str:
    from transformers import MistralConfig, MistralForCausalLM
    torch.manual_seed(seed)
    cfg = MistralConfig(**_COMMON, sliding_window=MISTRAL_SLIDING_WINDOW, tie_word_embeddings=False)
    return _save(_init(MistralForCausalLM(cfg), seed), os.path.join(os.fspath(tmpdir), "tiny_mistral"))


def tiny_gemma3(tmpdir, seed: int = 2) -> str:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(**_COMMON, sliding_window=GEMMA3_SLIDING_WINDOW,
                           layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=24,
                           tie_word_embeddings=False)
    cfg.architectures = ["Gemma3ForCausalLM"]
    return _save(_init(Gemma3ForCausalLM(cfg), seed), os.path.join(os.fspath(tmpdir), "tiny_gemma3"))


BUILDERS = {"llama": tiny_llama, "qwen2": tiny_qwen2, "qwen3": tiny_qwen3, "mistral": tiny_mistral,
            "gemma3": tiny_gemma3}

"""Seeded random causal-LM checkpoints for the LLM benchmarks (bench/llm.py, bench/llm_decode.py)
and a numpy-only reader of their safetensors files (for worker scripts that run under another
virtualenv without torch, e.g. bench/llm_gguf.py).

    import llm_models                                     # from a script in bench/
    shape = llm_models.shape_for("llama1b", layers=2, vocab=4096)
    llm_models.build_checkpoint(shape, "/tmp/ckpt", seed=0)   # save_pretrained; needs torch + transformers
    tensors = llm_models.read_safetensors("/tmp/ckpt")        # {name: np.ndarray (memory-mapped)}

Only this module's build_checkpoint imports torch / transformers (inside the function).
"""
from __future__ import annotations

import json
import os

import numpy as np

# Model shapes. "arch" picks the transformers class (LlamaForCausalLM / Qwen3ForCausalLM).
CONFIGS = {
    # Llama-3.2-1B: 1.24e9 parameters with the tied 128256 x 2048 embedding
    "llama1b": dict(arch="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
                    tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-5,
                    rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=8192),
                    bos_token_id=128000, eos_token_id=128001, max_position_embeddings=131072),
    # Qwen3-0.6B: 0.6e9 parameters with the tied 151936 x 1024 embedding
    "qwen3-0.6b": dict(arch="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
                       tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       bos_token_id=151643, eos_token_id=151645, max_position_embeddings=40960),
    # smoke-test shape (--quick): a small Llama, same code paths (llama3 rope scaling, tied embedding)
    "quick": dict(arch="llama", hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, intermediate_size=768, vocab_size=1024,
                  tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-5,
                  rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=8192),
                  bos_token_id=1, eos_token_id=2, max_position_embeddings=131072,
                  initializer_range=0.1),  # 0.02 makes so small a model repeat its last prompt token
}


def shape_for(config: str, layers: int | None = None, vocab: int | None = None) -> dict:
    """CONFIGS[config] with num_hidden_layers / vocab_size replaced when given (eos / bos ids are
    moved inside a smaller vocabulary)."""
    s = json.loads(json.dumps(CONFIGS[config]))
    if layers:
        s["num_hidden_layers"] = int(layers)
    if vocab:
        s["vocab_size"] = int(vocab)
        if s["eos_token_id"] >= vocab or s["bos_token_id"] >= vocab:
            s["bos_token_id"], s["eos_token_id"] = 1, 2
    return s


def param_counts(s: dict) -> dict:
    """Parameter counts (numbers of weights, not bytes) of shape `s`: {"total", "embedding" (the
    vocab x hidden table, counted once when tied), "linear" (the projection matrices of the layers),
    "read_per_token": what one decode step reads: every layer weight, the final norm, the output
    projection (vocab x hidden: the embedding table itself when tied) and one embedding row}."""
    h, L, v = s["hidden_size"], s["num_hidden_layers"], s["vocab_size"]
    q = s["num_attention_heads"] * s["head_dim"]
    kv = s["num_key_value_heads"] * s["head_dim"]
    linear = L * (h * q + 2 * h * kv + q * h + 3 * h * s["intermediate_size"])
    norms = L * 2 * h + h + (L * 2 * s["head_dim"] if s["arch"] == "qwen3" else 0)
    emb = v * h
    lm_head = 0 if s["tie_word_embeddings"] else v * h
    return {"total": linear + norms + emb + lm_head, "embedding": emb, "linear": linear,
            "read_per_token": linear + norms + v * h + h}


def build_checkpoint(s: dict, d: str, seed: int = 0, max_position_embeddings: int | None = None) -> str:
    """Writes a float32 checkpoint of shape `s` with seeded random weights (transformers' init,
    normal(0, 0.02), after torch.manual_seed(seed)) into folder `d` with save_pretrained; returns d.
    max_position_embeddings: default s["max_position_embeddings"] (else 4096). Peak memory: about
    twice the float32 weights (4 bytes x parameters)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    kw = {k: v for k, v in s.items() if k != "arch"}
    kw["max_position_embeddings"] = max_position_embeddings or s.get("max_position_embeddings", 4096)
    if s["arch"] == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM
        cfg, cls = Qwen3Config(**kw), Qwen3ForCausalLM
    else:
        cfg, cls = LlamaConfig(**kw), LlamaForCausalLM
    with torch.no_grad():
        model = cls(cfg).eval()
    model.save_pretrained(d)
    return d


_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def read_safetensors(d: str) -> dict:
    """{tensor name: np.ndarray} of every *.safetensors file in folder `d` (memory-mapped, read-only;
    bf16 is not supported). The safetensors layout: an 8-byte little-endian header length, a JSON
    header {name: {dtype, shape, data_offsets}}, then the data."""
    out = {}
    for name in sorted(os.listdir(d)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(d, name)
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        for k, v in header.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            out[k] = mm[8 + n + a: 8 + n + b].view(_ST_DTYPES[v["dtype"]]).reshape(v["shape"])
    return out

"""Checks bench/llm_et.py against transformers eager (run with Kiln's virtualenv, which has torch +
transformers; the ExecuTorch venv has neither transformers nor Kiln's torch).

    python bench/llm_et_check.py --checkpoint HF_DIR --prompt-ids ids.json \\
        --et-json run.json [--et-logits run_logits.npy]

run.json is the object `llm_et.py run` printed (its "ids"), run_logits.npy what its --logits-out
saved (one row of logits per generated token). Prints one JSON object: transformers' greedy ids
for as many tokens, the index of the first token where the two differ (null: all equal), and, with
--et-logits, the max abs difference between ExecuTorch's logits and transformers' logits computed
on the same token sequence (the prompt + ExecuTorch's tokens, one forward, no cache), overall and
up to the first divergence, with the largest logit magnitude for scale.

    python bench/llm_et_check.py --make-checkpoint DIR --hidden 256 --layers 2 --heads 4 \\
        --kv-heads 2 --head-dim 64 --mlp 512 --vocab 512 [--init-std 0.02] [--qwen3]

writes a seeded random checkpoint (save_pretrained, tied embeddings, rope theta 500000 and
Llama-3.2's llama3 rope scaling for Llama; Qwen3 rope theta 1e6, no scaling).
"""
from __future__ import annotations

import argparse
import json
import sys


def make_checkpoint(a) -> None:
    import torch
    import transformers as tf
    torch.manual_seed(a.seed)
    common = dict(hidden_size=a.hidden, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                  head_dim=a.head_dim, intermediate_size=a.mlp, num_hidden_layers=a.layers,
                  vocab_size=a.vocab, max_position_embeddings=131072, tie_word_embeddings=True,
                  bos_token_id=1, eos_token_id=2, initializer_range=a.init_std)
    if a.qwen3:
        cfg = tf.Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                             rms_norm_eps=1e-6, **common)
        model = tf.Qwen3ForCausalLM(cfg)
    else:
        cfg = tf.LlamaConfig(rms_norm_eps=1e-5, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "high_freq_factor": 4.0,
            "low_freq_factor": 1.0, "original_max_position_embeddings": 8192}, **common)
        model = tf.LlamaForCausalLM(cfg)
    model.eval().save_pretrained(a.make_checkpoint)
    print(json.dumps({"checkpoint": a.make_checkpoint, "params": sum(p.numel() for p in model.parameters())}))


def check(a) -> None:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
    with open(a.prompt_ids) as f:
        prompt = json.load(f)
    prompt = prompt["ids"] if isinstance(prompt, dict) else prompt
    with open(a.et_json) as f:
        et = json.load(f)
    et_ids = et["ids"]
    model = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=len(et_ids), do_sample=False,
                             min_new_tokens=len(et_ids), pad_token_id=0)
    hf_ids = out[0, len(prompt):].tolist()
    div = next((i for i, (x, y) in enumerate(zip(hf_ids, et_ids)) if x != y), None)
    res = {"checkpoint": a.checkpoint, "et_ids": et_ids, "hf_ids": hf_ids, "first_divergence": div,
           "equal_tokens": len(et_ids) if div is None else div, "compared": len(et_ids)}
    if a.et_logits:
        el = np.load(a.et_logits)
        seq = torch.tensor([prompt + et_ids[:-1]])
        with torch.no_grad():
            hl = model(seq).logits[0, len(prompt) - 1:].numpy()
        d = np.abs(el - hl).max(axis=1)
        upto = len(d) if div is None else div + 1
        res.update(max_abs_logit_diff=float(d.max()), max_abs_logit_diff_until_divergence=float(d[:upto].max()),
                   max_abs_logit=float(np.abs(hl).max()),
                   first_step_max_abs_logit_diff=float(d[0]))
    print(json.dumps(res))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint")
    ap.add_argument("--prompt-ids")
    ap.add_argument("--et-json")
    ap.add_argument("--et-logits")
    ap.add_argument("--make-checkpoint")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--mlp", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--init-std", type=float, default=0.02, help="transformers' initializer_range")
    ap.add_argument("--qwen3", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.make_checkpoint:
        make_checkpoint(a)
    else:
        check(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())

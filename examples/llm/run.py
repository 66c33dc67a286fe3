#!/usr/bin/env python3
"""Export a causal LM checkpoint folder to one .kiln program and generate token ids with it, twice:
with the C++ runner (`build/tools/kiln generate --json`) and with Python's `kiln.generate`.

Without --model-dir it first builds a tiny LlamaForCausalLM from a config with seeded random weights
and writes it with `save_pretrained` into a temporary folder (the generated tokens are meaningless);
with --model-dir it exports that folder instead (LlamaForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM, MistralForCausalLM, Gemma3ForCausalLM; config.json + safetensors as `save_pretrained` writes them).

    PYTHONPATH=python $VENV/bin/python examples/llm/run.py
    PYTHONPATH=python $VENV/bin/python examples/llm/run.py --model-dir /path/to/Llama-3.2-1B \\
        --max-seq-len 1024 --prompt-ids 128000,791,6864,315,9822,374 --max-new-tokens 16 --out llama.kiln
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import kiln  # noqa: E402


def tiny_random_llama(folder: str, seed: int = 0) -> str:
    """A 2-layer Llama (hidden 256, 4 heads, 2 KV heads, vocab 1024) with seeded random weights,
    written with save_pretrained: the same files a real checkpoint folder has."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                      rope_theta=500000.0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger than transformers' init (std 0.02), so that the logits are spread out
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    return folder


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", help="checkpoint folder (config.json + safetensors); default: a tiny random Llama")
    p.add_argument("--max-seq-len", type=int, default=128, help="KV cache capacity: prompt + new tokens at most")
    p.add_argument("--prompt-ids", default="1,15,27,300,42,7,99", help="comma-separated prompt token ids")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="where to write the .kiln program (default: a temporary folder)")
    p.add_argument("--cli", default=os.path.join(ROOT, "build", "tools", "kiln"))
    a = p.parse_args(argv)
    prompt = [int(x) for x in a.prompt_ids.split(",") if x.strip()]

    with tempfile.TemporaryDirectory(prefix="kiln-llm-example-") as tmp:
        model_dir = a.model_dir or tiny_random_llama(os.path.join(tmp, "tiny_llama"))
        if not a.model_dir:
            print(f"tiny random Llama (seeded; tokens are meaningless) written to {model_dir}")
        out = a.out or os.path.join(tmp, "model.kiln")

        t0 = time.monotonic()
        kiln.export_llm(model_dir, a.max_seq_len, out=out, verbose=False)
        print(f"exported {out} ({os.path.getsize(out) / 2**20:.1f} MiB, max_seq_len {a.max_seq_len}) "
              f"in {time.monotonic() - t0:.1f} s")

        # 1. the C++ runner
        if os.access(a.cli, os.X_OK):
            cmd = [a.cli, "generate", out, "--prompt-ids", ",".join(map(str, prompt)),
                   "--max-new-tokens", str(a.max_new_tokens), "--threads", str(a.threads), "--json"]
            print("$ " + " ".join([os.path.relpath(a.cli)] + cmd[1:]))
            r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            print(f"  ids:     {r['ids']}")
            print(f"  prefill: {r['prefill_tokens_per_s']:.0f} tokens/s, decode: {r['decode_tokens_per_s']:.0f} "
                  f"tokens/s, time to first token {r['time_to_first_token_ms']:.1f} ms")
            cli_ids = r["ids"]
        else:
            print(f"{a.cli} is not built (cmake --build build); skipping the C++ runner")
            cli_ids = None

        # 2. the same from Python (the same C++ generation loop and sampler, on a session of the program)
        program = kiln.load(out, num_threads=a.threads)
        ids, stats = kiln.generate(program, prompt, a.max_new_tokens)
        print("kiln.generate(program, prompt, max_new_tokens)")
        print(f"  ids:     {ids}")
        print(f"  prefill: {stats['prefill_tokens_per_s']:.0f} tokens/s, decode: {stats['decode_tokens_per_s']:.0f} "
              f"tokens/s, time to first token {stats['time_to_first_token_ms']:.1f} ms")
        if cli_ids is not None:
            print("same ids from both: " + ("yes" if list(ids) == list(cli_ids) else "NO"))
            if list(ids) != list(cli_ids):
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PyTorch eager worker of bench/llm.py (Kiln's own virtualenv: PyPI torch + transformers). One
subcommand, printing one JSON object on stdout:

  run --model CHECKPOINT_DIR --prompt-ids 1,2,... --max-new-tokens N --threads T [--ban-ids 2,...]
      torch.set_num_threads(T); AutoModelForCausalLM.from_pretrained(DIR) in float32 (load_s, s);
      then one model.generate(greedy: do_sample=False, cache_implementation="static",
      max_new_tokens = min_new_tokens = N, so the eos ids are never chosen, as `kiln generate
      --ignore-eos`), under torch.inference_mode. A logits processor stamps the time of every step
      (called after each forward, before the argmax): time to first token = first stamp - start
      (prefill, static cache set-up included); decode tokens/s = (N - 1) / (last stamp - first stamp).
      -> {"ids", "prefill_tokens_per_s", "decode_tokens_per_s", "time_to_first_token_ms" (ms),
          "load_s" (s), "file_bytes" (the safetensors files), "version"}
No warm-up (as for the other engines: every engine runs cold, once, in a fresh process).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--prompt-ids", required=True)
    r.add_argument("--max-new-tokens", type=int, required=True)
    r.add_argument("--threads", type=int, required=True)
    r.add_argument("--ban-ids", default="")
    a = p.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

    torch.set_num_threads(a.threads)
    prompt = [int(x) for x in a.prompt_ids.split(",")]
    n = a.max_new_tokens
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    stamps = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    eos = [int(x) for x in a.ban_ids.split(",") if x.strip()] or None
    ids = torch.tensor([prompt], dtype=torch.long)
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, cache_implementation="static", eos_token_id=eos,
                             pad_token_id=eos[0] if eos else 0, logits_processor=LogitsProcessorList([Stamp()]),
                             num_beams=1, temperature=None, top_p=None, top_k=None)
    new = [int(x) for x in out[0, len(prompt):]]
    ttft = stamps[0] - start
    dec = stamps[-1] - stamps[0]
    fb = sum(os.path.getsize(os.path.join(a.model, f)) for f in os.listdir(a.model) if f.endswith(".safetensors"))
    print(json.dumps({"ids": new, "prefill_tokens_per_s": len(prompt) / ttft,
                      "decode_tokens_per_s": (len(stamps) - 1) / dec if dec > 0 else None,
                      "time_to_first_token_ms": ttft * 1e3, "load_s": load_s, "file_bytes": fb,
                      "version": f"torch {torch.__version__}, transformers {transformers.__version__}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

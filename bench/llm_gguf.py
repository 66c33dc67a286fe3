#!/usr/bin/env python3
"""llama.cpp worker of bench/llm.py, run with the python of bench/setup_llamacpp.sh's virtualenv
(llama-cpp-python built from source, gguf, numpy; no torch). Two subcommands, each printing one
JSON object on stdout (progress on stderr):

  export --checkpoint DIR --format fp32|w8|w4 --out FILE.gguf [--group-size 32]
      Writes the float32 safetensors checkpoint in DIR (LlamaForCausalLM or Qwen3ForCausalLM, as
      bench/llm_models.py builds it) as GGUF with gguf.GGUFWriter: fp32 -> F32, w8 -> Q8_0, w4 -> Q4_0
      (every 2-D weight, the embedding included; Q8_0 / Q4_0 use llama.cpp's fixed group of 32 with a
      float16 scale, packed by gguf.quants.quantize; 1-D norm weights stay F32). Llama's Q and K
      projection rows are permuted into the pairing llama.cpp's rope expects for arch "llama" (each
      head's [first half | second half] rotation pairs become interleaved pairs); Qwen3 ("qwen3" arch,
      NEOX rope) needs no permutation. The vocabulary is synthetic: tokenizer model "none" with
      <arch>.vocab_size dummy tokens (token ids are fed directly).
      -> {"file_bytes", "export_s", "gguf_version"}

  run --model FILE.gguf --prompt-ids 1,2,... --max-new-tokens N --threads T [--ban-ids 2,...]
      llama_cpp.Llama(n_ctx = prompt + N, n_batch = n_ubatch = prompt length, n_threads =
      n_threads_batch = T), then greedy generation driven here: Llama.eval(prompt) (the prefill), the
      argmax of its last logits (llama_get_logits_ith; ids in --ban-ids, the eos ids, are never chosen: as `kiln generate
      --ignore-eos`), then one Llama.eval([token]) per new token. Timed as kiln generate does: time
      to first token = prefill + first argmax; decode tokens/s = (N - 1) / the time of the N - 1
      later steps. load_s: the Llama constructor (mmap, graph and context set-up).
      -> {"ids", "prefill_tokens_per_s", "decode_tokens_per_s", "time_to_first_token_ms" (ms),
          "load_s" (s), "file_bytes", "version", "system_info"}
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llm_models  # noqa: E402


def log(msg: str) -> None:
    print(f"[llm_gguf {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rope_pairs_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of a Q or K projection (n_heads * head_dim rows) reordered per head from HF's
    rotate-half layout (row i pairs with row i + head_dim/2) to the adjacent-pair layout llama.cpp's
    "llama" arch rotates (rows 2j, 2j+1): new row 2j = old row j, new row 2j+1 = old row j + half."""
    rows = w.shape[0]
    hd = rows // n_heads
    idx = np.arange(rows).reshape(n_heads, 2, hd // 2).transpose(0, 2, 1).reshape(-1)
    return np.ascontiguousarray(w[idx])


def llama3_rope_factors(cfg: dict) -> np.ndarray | None:
    """Llama 3 rope scaling as per-frequency divisors of the rotation frequency (llama.cpp's
    rope_freqs tensor, head_dim / 2 float32 values), from the config's rope_scaling; None without it."""
    rs = cfg.get("rope_scaling") or {}
    if (rs.get("rope_type") or rs.get("type")) != "llama3":
        return None
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    base = cfg.get("rope_theta", 10000.0)
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    factor, lo, hi = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    wavelen = 2 * np.pi / inv_freq
    smooth = (old / wavelen - lo) / (hi - lo)
    f = np.where(wavelen < old / hi, 1.0, np.where(wavelen > old / lo, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return f.astype(np.float32)


def cmd_export(a) -> dict:
    import gguf
    from gguf import GGMLQuantizationType as Q

    t0 = time.monotonic()
    with open(os.path.join(a.checkpoint, "config.json")) as f:
        cfg = json.load(f)
    # transformers 5 keeps rope settings in rope_parameters; 4.x in rope_theta / rope_scaling
    rp = cfg.get("rope_parameters") or {}
    if rp:
        cfg.setdefault("rope_theta", rp.get("rope_theta"))
        if rp.get("rope_type") not in (None, "default"):
            cfg.setdefault("rope_scaling", rp)
    archs = cfg.get("architectures") or []
    arch = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}.get(archs[0] if archs else "")
    if arch is None:
        raise SystemExit(f"unsupported architecture {archs}")
    if a.format != "fp32" and a.group_size != 32:
        raise SystemExit("llama.cpp's Q8_0 / Q4_0 have a fixed group of 32 weights")
    qtype = {"fp32": Q.F32, "w8": Q.Q8_0, "w4": Q.Q4_0}[a.format]
    ftype = {"fp32": gguf.LlamaFileType.ALL_F32, "w8": gguf.LlamaFileType.MOSTLY_Q8_0,
             "w4": gguf.LlamaFileType.MOSTLY_Q4_0}[a.format]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    L = cfg["num_hidden_layers"]
    w = gguf.GGUFWriter(a.out + ".tmp", arch)
    w.add_name(f"kiln-bench-{arch}-random")
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("none")

    t = llm_models.read_safetensors(a.checkpoint)

    def put(name: str, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim == 1 or qtype == Q.F32:
            w.add_tensor(name, np.ascontiguousarray(x))
        else:
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(x), qtype), raw_dtype=qtype)

    put("token_embd.weight", t["model.embed_tokens.weight"])
    put("output_norm.weight", t["model.norm.weight"])
    if not cfg.get("tie_word_embeddings", False):
        put("output.weight", t["lm_head.weight"])
    factors = llama3_rope_factors(cfg)
    if factors is not None:
        w.add_tensor("rope_freqs.weight", factors)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    for i in range(L):
        for hf, gg in names.items():
            key = f"model.layers.{i}.{hf}.weight"
            if key not in t:
                continue
            x = t[key]
            if arch == "llama" and hf == "self_attn.q_proj":
                x = rope_pairs_interleaved(x, nh)
            elif arch == "llama" and hf == "self_attn.k_proj":
                x = rope_pairs_interleaved(x, nkv)
            put(f"blk.{i}.{gg}.weight", x)
        log(f"layer {i + 1}/{L} packed ({a.format})")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(a.out + ".tmp", a.out)
    return {"file_bytes": os.path.getsize(a.out), "export_s": time.monotonic() - t0,
            "gguf_version": getattr(gguf, "__version__", None) or _dist_version("gguf")}


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001
        return None


def cmd_run(a) -> dict:
    import llama_cpp

    prompt = [int(x) for x in a.prompt_ids.split(",")]
    banned = [int(x) for x in a.ban_ids.split(",") if x.strip()] if a.ban_ids else []
    n = a.max_new_tokens
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=len(prompt) + n, n_batch=len(prompt), n_ubatch=len(prompt),
                          n_threads=a.threads, n_threads_batch=a.threads, verbose=a.verbose, seed=0)
    load_s = time.perf_counter() - t0

    n_vocab = llm.n_vocab()

    def pick() -> int:
        # the last evaluated position's logits (llama_get_logits_ith(ctx, -1)), copied
        logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,)).copy()
        logits[banned] = -np.inf
        return int(np.argmax(logits))

    ids = []
    t = time.perf_counter()
    llm.eval(prompt)
    ids.append(pick())
    prefill_s = time.perf_counter() - t
    decode_s = 0.0
    while len(ids) < n:
        t = time.perf_counter()
        llm.eval([ids[-1]])
        ids.append(pick())
        decode_s += time.perf_counter() - t
    return {"ids": ids, "prefill_tokens_per_s": len(prompt) / prefill_s,
            "decode_tokens_per_s": (len(ids) - 1) / decode_s if decode_s > 0 else None,
            "time_to_first_token_ms": prefill_s * 1e3, "load_s": load_s, "file_bytes": os.path.getsize(a.model),
            "version": f"llama-cpp-python {llama_cpp.__version__}",
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--format", required=True, choices=["fp32", "w8", "w4"])
    e.add_argument("--out", required=True)
    e.add_argument("--group-size", type=int, default=32)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--prompt-ids", required=True)
    r.add_argument("--max-new-tokens", type=int, required=True)
    r.add_argument("--threads", type=int, required=True)
    r.add_argument("--ban-ids", default="")
    r.add_argument("--verbose", action="store_true", help="llama.cpp's own log on stderr")
    a = p.parse_args(argv)
    out = cmd_export(a) if a.cmd == "export" else cmd_run(a)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""ExecuTorch + XNNPACK engine of the LLM speed benchmark (bench/llm.py). Run it with the ExecuTorch
virtualenv's python (`bash bench/setup_executorch.sh` prints the venv; executorch 1.5.1, torch 2.14,
torchao 0.18 as executorch's own dependency), not Kiln's. Each subcommand prints ONE JSON object on
stdout; progress goes to stderr.

    python bench/llm_et.py export --checkpoint HF_DIR --quant 8da4w --group-size 32 \\
        --max-seq-len 512 --out model.pte
    python bench/llm_et.py run --pte model.pte --prompt-ids ids.json --new-tokens 128 --threads 2

export: ExecuTorch's own LLM export flow, `executorch.examples.models.llama.export_llama_lib.
_export_llama(LlmConfig)` (what `python -m executorch.extension.llm.export.export_llm` and the legacy
`export_llama -kv --use_sdpa_with_kv_cache -X --xnnpack-extended-ops -qmode 8da4w -G 32` run), on the
Hugging Face checkpoint folder (config.json + safetensors of LlamaForCausalLM / Qwen3ForCausalLM)
converted here to ExecuTorch's Meta-format state dict + params.json:
  * Llama: keys renamed, q/k projection rows permuted back from Hugging Face's half-split rotary
    layout to Meta's interleaved one, Meta RoPE with llama3 frequency scaling (`use_scaled_rope`;
    ET fixes low_freq_factor 1 and original context 8192, and takes the factor from the model
    class: llama3_1 -> 8, llama3_2 -> 32; other values are refused).
  * Qwen3: ExecuTorch's own `examples.models.qwen3.convert_weights.qwen_3_tune_to_meta`, with
    Hugging Face RoPE (`use_hf_rope`) and q/k RMSNorm before RoPE, as ET's qwen3 configs.
  * tied embeddings: output.weight is a copy of the embedding (ET's model has no tying).
The exported `forward(tokens[1, S], input_pos[1])` has a KV cache (mutable buffers), ET's custom SDPA
(llama::custom_sdpa + llama::update_cache) and a dynamic S in 1..max_seq_len-1, and returns the
logits of the last position only, [1, vocab] fp32.
Quantization schemes (`--quant`), all through torchao `quantize_` as ET's source transform does:
  fp32   no quantization.
  8da8w  Int8DynamicActivationIntxWeightConfig(weight_dtype=int8, PerAxis(0)): int8 weights, one
         fp32 scale per output channel (8 + 32/K bits per weight), activations quantized to int8
         per token at run time; XNNPACK qd8-f32-qc8w GEMM. ET's qmode list omits it but its
         quantize() implements it; --group-size is ignored (XNNPACK has no blockwise int8 GEMM).
  8da4w  the same with weight_dtype=int4, PerGroup(G), symmetric, scales by HQQ (ET's default
         `use_hqq`): 4 + 32/G bits per weight (5 at G=32); XNNPACK qd8-f32-qb4w GEMM.
  int8   ET's WeightOnlyInt8QuantHandler (int8 per channel, fp32 activations): not an XNNPACK
         kernel (runs on ET's CPU kernels), kept for reference; not validated (nor timed) yet.
  The embedding table stays fp32 unless --embedding-quantize "BITS,GROUP" (ET's option, e.g.
  "8,0" or "4,32"; 0 = per row) is given. The tied output projection is a Linear and is quantized
  with the rest.

run: a greedy loop in Python over the .pte's forward via `executorch.runtime.Runtime` (the pybinding
portable_lib, with ET's llm custom ops and quantized kernels registered by importing
`executorch.extension.llm.custom_ops` and `executorch.kernels.quantized`). Threads: ET's global
threadpool (the pthreadpool that the XNNPACK delegate and ET's optimized kernels share) is resized
with `portable_lib._unsafe_reset_threadpool(T)` BEFORE the program is loaded (XNNPACK runtimes keep
the pool they were created with, so resizing after load is unsafe); its size is read back with
`_threadpool_get_thread_count()` and reported. The prompt is prefilled in one call at input_pos 0;
each generated token is fed back at the next position. ET's TextLLMRunner pybinding exists but
takes text through a tokenizer file, not token ids, so it is not used.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time

QUANTS = ("fp32", "8da8w", "8da4w", "int8")


def log(*a) -> None:
    print("[llm_et]", *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- checkpoint conversion


def _hf_rope(cfg: dict) -> tuple[float, dict | None]:
    """(rope theta, rope scaling dict or None) from a config.json of transformers 4.x
    (rope_theta + rope_scaling) or 5.x (rope_parameters)."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        rtype = rp.get("rope_type", rp.get("type", "default"))
        return theta, (None if rtype in (None, "default") else rp)
    rs = cfg.get("rope_scaling")
    return float(cfg.get("rope_theta", 10000.0)), rs


def _load_safetensors(d: str) -> dict:
    from safetensors.torch import load_file
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        sd = {}
        for s in shards:
            sd.update(load_file(os.path.join(d, s)))
        return sd
    return load_file(os.path.join(d, "model.safetensors"))


def _unpermute_rotary(w, n_heads: int):
    """Hugging Face stores q/k projection rows of each head as [even dims..., odd dims...] (the
    permutation of its Llama conversion script); Meta's RoPE rotates interleaved pairs. Inverse
    permutation: rows (head, half, i) -> (head, i, half). w: [n_heads * head_dim, in]."""
    out_f, in_f = w.shape
    hd = out_f // n_heads
    return w.reshape(n_heads, 2, hd // 2, in_f).transpose(1, 2).reshape(out_f, in_f)


_LLAMA_KEYS = [  # Hugging Face name -> ExecuTorch (Meta) name
    (r"model\.embed_tokens\.weight", "tok_embeddings.weight"),
    (r"model\.norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", r"layers.\1.attention.wq.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", r"layers.\1.attention.wk.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", r"layers.\1.attention.wv.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"layers.\1.attention.wo.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"layers.\1.attention_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"layers.\1.ffn_norm.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"layers.\1.feed_forward.w1.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"layers.\1.feed_forward.w2.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", r"layers.\1.feed_forward.w3.weight"),
]


def convert_checkpoint(ckpt: str) -> tuple[dict, dict, str, dict]:
    """HF folder -> (Meta-format state dict (fp32), ET params.json dict, ET model class name,
    description). Raises ValueError for what ET's Llama model cannot express."""
    import torch
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    arch = (cfg.get("architectures") or [cfg.get("model_type", "")])[0]
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("attention_bias / mlp_bias are not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg.get('hidden_act')} is not supported")
    theta, scaling = _hf_rope(cfg)
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_heads)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
    params = {"dim": cfg["hidden_size"], "n_layers": cfg["num_hidden_layers"], "n_heads": n_heads,
              "n_kv_heads": n_kv, "head_dim": head_dim, "hidden_dim": cfg["intermediate_size"],
              "vocab_size": cfg["vocab_size"], "norm_eps": cfg.get("rms_norm_eps", 1e-6),
              "rope_theta": theta}
    sd = {k: v.to(torch.float32) for k, v in _load_safetensors(ckpt).items()}
    tied = "lm_head.weight" not in sd
    if arch == "Qwen3ForCausalLM":
        if scaling:
            raise ValueError(f"Qwen3 rope scaling {scaling} is not supported")
        from executorch.examples.models.qwen3.convert_weights import qwen_3_tune_to_meta
        out = qwen_3_tune_to_meta(sd)
        if tied:
            out["output.weight"] = out["output.weight"].clone()
        params.update(use_hf_rope=True, use_qk_norm=True, qk_norm_before_rope=True,
                      attention_qkv_bias=False, use_scaled_rope=False)
        return out, params, "qwen3_0_6b", {"family": "qwen3", "tied_embeddings": tied,
                                           "rope": "hf (half-split), no scaling"}
    if arch != "LlamaForCausalLM":
        raise ValueError(f"architecture {arch} is not supported (LlamaForCausalLM, Qwen3ForCausalLM)")
    model_class = "llama3"
    rope_desc = "meta (interleaved), no scaling"
    if scaling:
        rtype = scaling.get("rope_type", scaling.get("type"))
        factor = float(scaling.get("factor", 0))
        if rtype != "llama3":
            raise ValueError(f"rope scaling {rtype} is not supported (only llama3)")
        if float(scaling.get("low_freq_factor", 1)) != 1.0 or \
                int(scaling.get("original_max_position_embeddings", 8192)) != 8192:
            raise ValueError("ET's llama3 rope scaling fixes low_freq_factor 1 and original context 8192")
        hff = float(scaling.get("high_freq_factor", 4))
        if hff != int(hff):
            raise ValueError("ET's high_freq_factor is an integer")
        if factor == 8.0:
            model_class = "llama3_1"
        elif factor == 32.0:
            model_class = "llama3_2"
        else:
            raise ValueError(f"llama3 rope factor {factor}: ET takes 8 (llama3_1) or 32 (llama3_2)")
        params.update(use_scaled_rope=True, high_freq_factor=int(hff))
        rope_desc = f"meta (interleaved), llama3 scaling factor {factor:g} high_freq_factor {hff:g}"
    out = {}
    for k, v in sd.items():
        for pat, rep in _LLAMA_KEYS:
            if re.fullmatch(pat, k):
                nk = re.sub(pat, rep, k)
                break
        else:
            if k.endswith("rotary_emb.inv_freq"):
                continue
            raise ValueError(f"unexpected checkpoint key {k}")
        if nk.endswith("attention.wq.weight"):
            v = _unpermute_rotary(v, n_heads)
        elif nk.endswith("attention.wk.weight"):
            v = _unpermute_rotary(v, n_kv)
        out[nk] = v.contiguous()
    if tied:
        out["output.weight"] = out["tok_embeddings.weight"].clone()
    return out, params, model_class, {"family": "llama", "tied_embeddings": tied, "rope": rope_desc}


# ---------------------------------------------------------------- export


def _count_ops(gm) -> tuple[int, dict, dict]:
    """(delegate calls, {non-delegated op: count}, {delegated op: count}) of a lowered graph; the
    delegated ops are read from each lowered module's original graph where ET keeps it."""
    delegates, others, inside = 0, {}, {}
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        name = getattr(n.target, "__name__", None) or str(n.target).split(":")[0]
        if "executorch_call_delegate" in name:
            delegates += 1
            lm = getattr(gm, n.args[0].target, None)
            og = getattr(lm, "original_module", None)
            if og is not None:
                for m in og.graph_module.graph.nodes:
                    if m.op == "call_function":
                        mn = getattr(m.target, "__name__", None) or str(m.target)
                        if "getitem" not in mn:
                            inside[mn] = inside.get(mn, 0) + 1
        elif "getitem" not in name:
            others[name] = others.get(name, 0) + 1
    return delegates, others, inside


def _scheme(quant: str, group: int, emb: str | None) -> dict:
    if quant == "fp32":
        d = {"linear": "fp32 weights, fp32 activations", "weight_bits_per_weight": 32.0}
    elif quant == "8da8w":
        d = {"linear": "int8 symmetric weights, per output channel fp32 scale (torchao "
                       "Int8DynamicActivationIntxWeightConfig int8 PerAxis(0)); activations "
                       "dynamically quantized to int8 per token; XNNPACK qd8-f32-qc8w",
             "weight_bits_per_weight": "8 + 32/in_features"}
    elif quant == "8da4w":
        d = {"linear": f"int4 symmetric weights in groups of {group} along the input, fp32 scale per "
                       "group chosen by HQQ (torchao Int8DynamicActivationIntxWeightConfig int4 "
                       f"PerGroup({group}), hqq_scale_only); activations dynamically quantized to int8 "
                       "per token; XNNPACK qd8-f32-qb4w",
             "weight_bits_per_weight": 4 + 32 / group}
    else:
        d = {"linear": "int8 weight-only per output channel (ET WeightOnlyInt8QuantHandler), fp32 "
                       "activations; not delegated to XNNPACK", "weight_bits_per_weight": "8 + 32/in_features"}
    d["embedding"] = f"ET embedding_quantize {emb}" if emb else "fp32"
    d["qmode"] = quant
    return d


def cmd_export(a) -> int:
    import torch
    t0 = time.perf_counter()
    from executorch.examples.models.llama import export_llama_lib as lib
    from executorch.extension.llm.export.config.llm_config import LlmConfig, ModelType

    sd, params, model_class, desc = convert_checkpoint(a.checkpoint)
    with open(os.path.join(a.checkpoint, "config.json")) as f:
        hf = json.load(f)
    log(f"converted {len(sd)} tensors ({desc['family']}, {model_class}); {time.perf_counter() - t0:.1f} s")
    out = os.path.abspath(a.out)
    work = tempfile.mkdtemp(prefix="llm_et_", dir=a.tmp_dir)
    # The file name must not contain "int8" or "8da4w": ET's model loader takes such a checkpoint
    # path for a pre-quantized checkpoint.
    ck, pj = os.path.join(work, "weights.pth"), os.path.join(work, "params.json")
    torch.save(sd, ck)
    del sd
    with open(pj, "w") as f:
        json.dump(params, f)

    cfg = LlmConfig()
    cfg.base.model_class = ModelType(model_class)
    cfg.base.checkpoint = ck
    cfg.base.params = pj
    eos = hf.get("eos_token_id", 2)
    eos = eos if isinstance(eos, list) else [eos]
    cfg.base.metadata = json.dumps({"get_bos_id": hf.get("bos_token_id", 1) or 0, "get_eos_ids": eos})
    cfg.model.use_kv_cache = True
    cfg.model.use_sdpa_with_kv_cache = True
    cfg.model.enable_dynamic_shape = True
    cfg.export.max_seq_length = a.max_seq_len
    cfg.export.max_context_length = a.max_seq_len
    cfg.export.output_dir = os.path.dirname(out)
    cfg.export.output_name = os.path.basename(out)
    cfg.backend.xnnpack.enabled = True
    cfg.backend.xnnpack.extended_ops = True
    if a.quant != "fp32":
        # Set after construction: LlmConfig's qmode check lists int8/8da4w/4w but ET's quantize()
        # also implements 8da8w.
        cfg.quantization.qmode = a.quant
        cfg.quantization.group_size = 0 if a.quant == "8da8w" else a.group_size
    cfg.quantization.use_hqq = not a.no_hqq
    if a.embedding_quantize:
        cfg.quantization.embedding_quantize = a.embedding_quantize
    log(f"exporting {a.quant} max_seq_len {a.max_seq_len} -> {out}")
    builder = lib._export_llama(cfg)
    saved = builder.get_saved_pte_filename()
    if saved and os.path.abspath(saved) != out:
        os.replace(saved, out)
    gm = builder.export_program.exported_program().graph_module
    delegates, others, inside = _count_ops(gm)
    for p in (ck, pj):
        os.remove(p)
    os.rmdir(work)
    import executorch.version as ev
    import torchao
    sch = _scheme(a.quant, a.group_size, a.embedding_quantize)
    if a.no_hqq and a.quant == "8da4w":
        sch["linear"] = sch["linear"].replace("chosen by HQQ", "absmax").replace(", hqq_scale_only", "")
    print(json.dumps({
        "file": out, "file_bytes": os.path.getsize(out), "export_s": time.perf_counter() - t0,
        "quant": a.quant, "group_size": (0 if a.quant == "8da8w" else a.group_size) if a.quant != "fp32" else None,
        "max_seq_len": a.max_seq_len, "scheme": sch, "model": {**desc, "et_model_class": model_class, "params": params},
        "delegate_calls": delegates, "delegated_ops": inside, "non_delegated_ops": others,
        "flow": "executorch.examples.models.llama.export_llama_lib._export_llama (LlmConfig: "
                "use_kv_cache, use_sdpa_with_kv_cache, enable_dynamic_shape, xnnpack + extended_ops)",
        "versions": {"executorch": ev.__version__, "torch": torch.__version__, "torchao": torchao.__version__},
    }))
    return 0


# ---------------------------------------------------------------- run


def cmd_run(a) -> int:
    """Greedy generation; times in seconds unless the key says _ms; rates in tokens per second."""
    import torch
    from executorch.extension.pybindings import portable_lib
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  llama::custom_sdpa, update_cache
    try:
        import executorch.kernels.quantized  # noqa: F401  quantized_decomposed::embedding_* etc.
    except Exception as e:  # only needed by quantized embeddings / int8 weight-only
        log(f"executorch.kernels.quantized not loaded: {e}")
    from executorch.runtime import Runtime

    with open(a.prompt_ids) as f:
        prompt = json.load(f)
    if isinstance(prompt, dict):
        prompt = prompt["ids"]
    prompt = [int(t) for t in prompt]
    portable_lib._unsafe_reset_threadpool(a.threads)
    threads = portable_lib._threadpool_get_thread_count()
    torch.set_num_threads(1)

    t0 = time.perf_counter()
    program = Runtime.get().load_program(a.pte)
    method = program.load_method("forward")
    t_loaded = time.perf_counter()
    load_s = t_loaded - t0

    def generate(n_new: int, logits_rows: list | None):
        """Returns (ids, prefill_s, t_first (perf_counter), decode execute seconds list, decode loop s)."""
        tp = time.perf_counter()
        out = method.execute([torch.tensor([prompt], dtype=torch.long), torch.tensor([0], dtype=torch.long)])
        logits = out[0]
        tok = int(torch.argmax(logits[0, -1] if logits.dim() == 3 else logits[-1]))
        t_first = time.perf_counter()
        if logits_rows is not None:
            logits_rows.append(logits.reshape(-1, logits.shape[-1])[-1].clone())
        ids = [tok]
        exec_s = []
        td = time.perf_counter()
        pos = len(prompt)
        for _ in range(n_new - 1):
            x = torch.tensor([[tok]], dtype=torch.long)
            p = torch.tensor([pos], dtype=torch.long)
            te = time.perf_counter()
            out = method.execute([x, p])
            exec_s.append(time.perf_counter() - te)
            logits = out[0].reshape(-1, out[0].shape[-1])[-1]
            tok = int(torch.argmax(logits))
            if logits_rows is not None:
                logits_rows.append(logits.clone())
            ids.append(tok)
            pos += 1
        return ids, t_first - tp, t_first, exec_s, time.perf_counter() - td

    for w in range(a.warmup):
        generate(a.new_tokens, None)
    rows = [] if a.logits_out else None
    t_start = time.perf_counter()
    ids, prefill_s, t_first, exec_s, loop_s = generate(a.new_tokens, rows)
    n_dec = len(exec_s)
    res = {
        "ids": ids, "prompt_tokens": len(prompt), "new_tokens": a.new_tokens,
        "prefill_tokens_per_s": len(prompt) / prefill_s,
        "decode_tokens_per_s": (n_dec / loop_s) if n_dec else None,
        "time_to_first_token_ms": (t_first - (t_loaded if a.warmup == 0 else t_start)) * 1e3,
        "prefill_ms": prefill_s * 1e3,
        "decode_step_ms_mean": (loop_s / n_dec * 1e3) if n_dec else None,
        "decode_execute_ms_mean": (sum(exec_s) / n_dec * 1e3) if n_dec else None,
        "python_overhead_ms_per_step": ((loop_s - sum(exec_s)) / n_dec * 1e3) if n_dec else None,
        "load_s": load_s, "threads": threads, "warmup": a.warmup,
        "loop": "python greedy loop over executorch.runtime Method.execute(tokens[1,S], input_pos[1])",
    }
    if a.logits_out:
        import numpy as np
        np.save(a.logits_out, torch.stack(rows).numpy().astype(np.float32))
        res["logits_out"] = a.logits_out
    print(json.dumps(res))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="HF checkpoint folder -> .pte (ExecuTorch LLM export, XNNPACK)")
    e.add_argument("--checkpoint", required=True, help="folder with config.json + *.safetensors")
    e.add_argument("--quant", choices=QUANTS, default="fp32")
    e.add_argument("--group-size", type=int, default=32, help="8da4w weight group (input elements)")
    e.add_argument("--embedding-quantize", default=None,
                   help='ET embedding quantization "BITS,GROUP" (e.g. "8,0", "4,32"); default fp32')
    e.add_argument("--no-hqq", action="store_true", help="absmax scales instead of ET's default HQQ")
    e.add_argument("--max-seq-len", type=int, required=True,
                   help="KV cache length (tokens); a prefill takes at most max-seq-len - 1 tokens")
    e.add_argument("--out", required=True)
    e.add_argument("--tmp-dir", default=None, help="where the converted checkpoint is written (default $TMPDIR)")
    r = sub.add_parser("run", help="greedy generation timed on a .pte")
    r.add_argument("--pte", required=True)
    r.add_argument("--prompt-ids", required=True, help="JSON file: a list of token ids (or {\"ids\": [...]})")
    r.add_argument("--new-tokens", type=int, default=128, help="generated tokens, the first from the prefill")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--warmup", type=int, default=0,
                   help="untimed generations before the timed one (0: the timed one starts right after load)")
    r.add_argument("--logits-out", default=None, help="save the logits of every generated token (.npy)")
    a = ap.parse_args()
    return cmd_export(a) if a.cmd == "export" else cmd_run(a)


if __name__ == "__main__":
    sys.exit(main())

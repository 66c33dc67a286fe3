"""LLM export and generation (issue 18): ``kiln.export_llm`` and ``kiln.generate``.

``export_llm(dir, max_seq_len, out=...)`` reads a Hugging Face checkpoint folder (config.json plus
safetensors, as ``save_pretrained`` writes it), wraps the model with a static KV cache of
``max_seq_len`` positions (kiln/llm.py) and exports one program with one method
``forward(tokens: int64[1, seq], input_pos: int64[1]) -> logits: float32[1, vocab_size]`` with
seq in 1..max_seq_len; the cache is the program's state (one session = one conversation), and the
``llm.*`` metadata (arch, vocab_size, bos_id, eos_ids, max_seq_len, cache) is stored in the file.

``generate(program, prompt_ids, max_new_tokens, ...)`` runs prefill then decode on a session with
the C++ generation loop and sampler (include/kiln/llm.h), the same code as ``kiln generate``.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Callable, Sequence

import numpy as np

from . import _kiln

__all__ = ["export_llm", "generate", "llm_limits"]


def export_llm(dir: str | os.PathLike, max_seq_len: int, *, out: str | os.PathLike | None = None,
               quantize: str | None = None, group_size: int = 128, scale_dtype: str = "float32",
               backends: Sequence[str] = (), weights_dtype: str = "float32", verbose: bool = True,
               report_json: str | os.PathLike | None = None, require_delegation: str | None = None,
               compute_dtype: str = "float32", alternatives: Sequence[Sequence[str]] = ()):
    """Exports the causal LM in checkpoint folder `dir` (LlamaForCausalLM, Qwen2ForCausalLM,
    Qwen3ForCausalLM, MistralForCausalLM, Gemma3ForCausalLM: the class transformers builds from
    config.model_type; RoPE types kiln.llm.SUPPORTED_ROPE_TYPES) with a KV cache of `max_seq_len`
    positions (>= 2). quantize: None, "w8" or "w4" (weight-only: every linear weight and the token
    embedding table, row by row; a table tied to the output projection is stored once;
    docs/quantization.md), "w8a8" or "w4a8" (the same weights; the linear layers' inputs quantized
    to int8 blocks of 32 at run time and multiplied in integers, src/ir/ops/quant.h), with `group_size` columns per 4-bit group and scales stored as
    `scale_dtype` ("float32" or "float16": w4 with groups of 32 and float16 scales is 4.5 bits per
    weight, llama.cpp's Q4_0 size). backends: delegates to try (mlx takes the whole method, symbolic
    sizes and the KV cache included, docs/mlx.md; xnnpack declines nodes with symbolic sizes; each
    backend says why); require_delegation: fail unless that backend takes every node;
    compute_dtype: precision of the delegates that support it (mlx); alternatives: e.g. [("mlx",),
    ()] stores an mlx lowering and a CPU-kernel one, the loader runs the first whose backends are
    available (replaces backends / require_delegation). Returns kiln.capture.ExportResult; raises
    kiln.llm.LLMExportError for a config this path cannot export (naming the part) and
    kiln.ExportError for a capture or compile failure."""
    from .capture import export
    from .llm import prepare_llm_export

    wants_mlx = "mlx" in tuple(backends) or require_delegation == "mlx" or any("mlx" in tuple(a) for a in alternatives)
    if compute_dtype != "float32" and not wants_mlx:
        msg = (f"compute_dtype {compute_dtype} applies to the mlx delegate only; without it every node runs "
               "on Kiln's CPU kernels in float32")
        if verbose:
            print(f"[kiln] warning: {msg}", file=sys.stderr, flush=True)
        else:
            warnings.warn(msg, stacklevel=2)
    module, args, dynamic_shapes, metadata = prepare_llm_export(dir, max_seq_len)
    trained = getattr(module.model.config, "max_position_embeddings", None)
    if isinstance(trained, int) and int(max_seq_len) > trained:
        msg = (f"max_seq_len {int(max_seq_len)} is past the model's max_position_embeddings {trained}: "
               f"positions from {trained} on were not trained, and its outputs there are unreliable")
        if verbose:
            print(f"[kiln] warning: {msg}", file=sys.stderr, flush=True)
        else:
            warnings.warn(msg, stacklevel=2)
    return export(module, args, out=out, dynamic_shapes=dynamic_shapes, metadata=metadata, quantize=quantize,
                  group_size=group_size, scale_dtype=scale_dtype, quantize_embeddings=True, backends=backends,
                  weights_dtype=weights_dtype, verbose=verbose, report_json=report_json,
                  require_delegation=require_delegation, compute_dtype=compute_dtype, alternatives=alternatives)


def llm_limits(program) -> dict:
    """The ``llm.*`` metadata a generation needs, parsed: {max_seq_len, vocab_size, eos_ids, bos_id}.
    Raises ValueError when the program was not exported by export_llm or a value is not a decimal
    integer in range (a damaged file)."""
    meta = program.metadata
    if "llm.max_seq_len" not in meta:
        raise ValueError("the program has no llm.* metadata (export it with kiln.export_llm / "
                         "python -m kiln export-llm)")

    def number(key: str, text: str, least: int) -> int:  # decimal digits only, as the C++ runner reads them
        if not (text.isascii() and text.isdigit()) or int(text) < least:
            raise ValueError(f"metadata {key!r} is {text!r}, not {'a positive' if least else 'a non-negative'} integer")
        return int(text)

    eos = [number("llm.eos_ids", x.strip(), 0) for x in meta.get("llm.eos_ids", "").split(",") if x.strip()]
    bos = meta.get("llm.bos_id", "")
    return {"max_seq_len": number("llm.max_seq_len", meta["llm.max_seq_len"], 1),
            "vocab_size": number("llm.vocab_size", meta.get("llm.vocab_size", ""), 1),
            "eos_ids": eos, "bos_id": number("llm.bos_id", bos, 0) if bos else None}


def generate(program, prompt_ids: Sequence[int], max_new_tokens: int, *, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, ignore_eos: bool = False, session=None,
             on_token: Callable[[int], None] | None = None, method: str = "forward"):
    """Generates up to `max_new_tokens` ids after `prompt_ids` with `program` (a kiln.LoadedProgram
    from export_llm): prefill of the whole prompt at position 0, then one decode call per token,
    until max_new_tokens or an eos id (included; with ignore_eos eos is never chosen). Greedy when
    temperature is 0, else sampling after temperature / top-k / top-p as transformers' warpers do,
    seeded by `seed`. Runs on `session` (default: a new one, so every call starts from an empty
    cache). Returns (ids, stats) with stats = {prefill_tokens_per_s, decode_tokens_per_s,
    time_to_first_token_ms, peak_rss_mib, prefill_tokens, decode_tokens}. Raises ValueError for a
    prompt id that is not an integer in the vocabulary or a seed outside [0, 2^64), kiln.KilnError
    (InvalidArgument naming the limit when prompt + max_new_tokens exceeds llm.max_seq_len; the
    session is unchanged then)."""
    limits = llm_limits(program)
    ids = []
    for t in prompt_ids:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise ValueError(f"prompt_ids must be integer token ids, got {t!r}")
        if not 0 <= int(t) < limits["vocab_size"]:
            raise ValueError(f"token id {int(t)} is outside the vocabulary of {limits['vocab_size']}")
        ids.append(int(t))
    if not 0 <= int(seed) < 2 ** 64:
        raise ValueError(f"seed must be in [0, 2^64), got {seed}")
    m = program.method(method)  # before the session: a program that cannot load allocates nothing
    if session is None:
        session = program.new_session()

    def step(tokens, pos):
        out = m.execute([np.asarray(tokens, dtype=np.int64).reshape(1, -1), np.array([pos], dtype=np.int64)], session)
        return np.ascontiguousarray(out[0].reshape(-1), dtype=np.float32)

    return _kiln.generate(step, ids, int(max_new_tokens), limits["max_seq_len"],
                          limits["eos_ids"], bool(ignore_eos), float(temperature), int(top_k), float(top_p), int(seed),
                          on_token)

"""LLM export, PyTorch side: a Hugging Face causal LM wrapped with a static KV cache (issue 18).

``load_llm(dir)`` reads a ``save_pretrained`` folder (config.json + safetensors; local files only).
``KilnCausalLM(model, max_seq_len)`` is the module that is exported: ``forward(tokens int64[1, seq],
input_pos int64[1]) -> logits float32[1, vocab]`` (logits of the last token), seq in 1..max_seq_len.
The cache is one pair of buffers per layer, ``k_cache_{i}`` / ``v_cache_{i}`` of shape
[1, kv_heads, max_seq_len, head_dim], which ``forward`` updates in place (torch.export reports them
as mutated buffers: the session state of the Kiln program).

transformers' own modeling code runs unchanged (RoPE, norms, Gemma 3's embedding scale and
query_pre_attn_scalar, ...); only its attention function is replaced, through transformers'
``AttentionInterface`` (name ``kiln_kv_cache``): it writes the new keys/values into the layer's cache
at ``input_pos + arange(seq)`` (an ``index_put_`` on the buffer) and calls
``torch.ops.kiln.sdpa_kv_cache``, which masks by position (causal + the layer's sliding window). No
mask is built by transformers: ``kiln_kv_cache`` is not in ``ALL_MASK_ATTENTION_FUNCTIONS``, so
``create_causal_mask`` / ``create_sliding_window_causal_mask`` return None early, and no HF cache is
passed (``use_cache=False``).

``prepare_llm_export(dir, max_seq_len)`` returns the module, example inputs, the dynamic shapes
(``torch.export.Dim("seq", min=1, max=max_seq_len)`` on tokens dim 1) and the ``llm.*`` metadata.
"""
from __future__ import annotations

import json
import os

import torch

from . import llm_ops  # noqa: F401  (registers torch.ops.kiln.sdpa_kv_cache)

__all__ = ["SUPPORTED_ARCHS", "SUPPORTED_ROPE_TYPES", "ATTN_NAME", "LLMExportError", "load_llm", "check_llm_config",
           "KilnCausalLM", "llm_metadata", "prepare_llm_export"]

# transformers architecture class name -> config.model_type. Support is decided by the class that
# AutoModelForCausalLM builds (from model_type), never by config.architectures.
SUPPORTED_ARCHS = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
    "Gemma3ForCausalLM": "gemma3_text",
}
ATTN_NAME = "kiln_kv_cache"
# RoPE types (config.rope_parameters["rope_type"]) whose frequencies are fixed at init: captured as
# constants and checked against transformers (tests/python/test_llm_export.py). The others change
# the frequencies in forward from the positions seen (a data-dependent branch or buffer update).
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
SUPPORTED_ROPE_TYPES_WHY = {
    "dynamic": "dynamic NTK scaling recomputes the frequencies in forward when the sequence grows past "
               "the cached length, a data-dependent branch torch.export cannot capture",
    "longrope": "LongRoPE switches between its short and long factors in forward by the largest position "
                "seen, updating a buffer",
}


class LLMExportError(ValueError):
    """A checkpoint or config that the LLM export path cannot handle; the message names the part."""


# --------------------------------------------------------------------------------------------------
# loading and config checks

def load_llm(dir: str | os.PathLike):
    """Loads a causal LM from a ``save_pretrained`` folder (local files only), float32, eval mode.
    Returns (hf_model, config). Raises LLMExportError for a config this path cannot export, for a
    config or weights file that transformers refuses (its message quoted), and for a checkpoint
    that lacks weights of the model its config describes (transformers would initialize those at
    random and load the rest: a silently wrong model) or whose tensors have other shapes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    dir = os.fspath(dir)
    if not os.path.isfile(os.path.join(dir, "config.json")):
        raise LLMExportError(f"{dir}: no config.json (expected a folder written by save_pretrained)")
    try:
        config = AutoConfig.from_pretrained(dir, local_files_only=True)
    except Exception as e:  # transformers' / huggingface_hub's own config validation
        raise LLMExportError(f"{dir}: transformers cannot read config.json ({type(e).__name__}: {_one_line(e)})") from e
    check_llm_config(config)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32, local_files_only=True,
                                                           output_loading_info=True)
    except (OSError, MemoryError):  # a missing file: the caller's message names it
        raise
    except Exception as e:  # a config the model class refuses, a damaged safetensors file, mismatched shapes
        raise LLMExportError(f"{dir}: transformers cannot build the model ({type(e).__name__}: {_one_line(e)})") from e
    missing = sorted(info.get("missing_keys") or [])
    mismatched = [k if isinstance(k, str) else k[0] for k in (info.get("mismatched_keys") or [])]
    if missing or mismatched:
        what = [f"missing {_name_list(missing)}"] if missing else []
        what += [f"of another shape {_name_list(mismatched)}"] if mismatched else []
        raise LLMExportError(f"{dir}: the checkpoint does not hold the weights its config.json describes: "
                             f"{'; '.join(what)} (transformers would initialize them at random)")
    model.eval()
    return model, model.config


def _one_line(e: BaseException, limit: int = 400) -> str:
    """An exception's message on one line (its lines joined), at most `limit` characters."""
    text = " ".join(ln.strip() for ln in str(e).splitlines() if ln.strip()) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _name_list(names: list[str], shown: int = 5) -> str:
    """'a, b, c and N more' for a list of tensor names."""
    head = ", ".join(names[:shown])
    return head + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _built_class_name(config) -> str | None:
    """The class AutoModelForCausalLM builds for `config`: transformers picks it by the config's
    class (model_type), never by config.architectures. None when model_type has no causal LM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", None))
    return name if isinstance(name, str) else None


def _arch_name(config) -> str:
    """The supported architecture class that the export builds for `config`, decided by model_type
    (the class actually built), not by config.architectures: a config whose architectures entry says
    LlamaForCausalLM but whose model_type is phi3 builds Phi3ForCausalLM, and is judged as that."""
    built = _built_class_name(config)
    if built in SUPPORTED_ARCHS:
        return built
    archs = list(getattr(config, "architectures", None) or [])
    name = built or (archs[0] if archs else None) or "a model without a causal LM class"
    said = f"; config.architectures says {', '.join(archs)}" if archs and archs != [built] else ""
    raise LLMExportError(f"{name}: architecture not supported by kiln export-llm (model_type "
                         f"{config.model_type!r}{said}; supported: {', '.join(SUPPORTED_ARCHS)})")


def _rope_types(config) -> list[str]:
    """The RoPE types of `config` (rope_parameters, per layer type for Gemma 3, or the older
    rope_scaling), 'default' when it has none."""
    found: list[str] = []

    def add(p):
        if not isinstance(p, dict):
            return
        if "rope_type" in p or "type" in p:
            t = str(p.get("rope_type", p.get("type")))
            if t not in found:
                found.append(t)
        else:  # {layer_type: parameters}
            for v in p.values():
                add(v)

    add(getattr(config, "rope_parameters", None))
    add(getattr(config, "rope_scaling", None))
    return found or ["default"]


def check_llm_config(config) -> str:
    """Raises LLMExportError naming the part of `config` that kiln.llm cannot export; returns the
    architecture class name."""
    label = (list(getattr(config, "architectures", None) or []) or [config.model_type])[0]
    if getattr(config, "is_encoder_decoder", False):
        raise LLMExportError(f"{label}: encoder-decoder models are not supported (decoder-only causal LMs only)")
    if getattr(config, "add_cross_attention", False):
        raise LLMExportError(f"{label}: cross attention (add_cross_attention=True) is not supported")
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap is not None:
        raise LLMExportError(f"{label}: attn_logit_softcapping={softcap} is not supported by kiln.sdpa_kv_cache")
    arch = _arch_name(config)
    for rt in _rope_types(config):
        if rt not in SUPPORTED_ROPE_TYPES:
            why = SUPPORTED_ROPE_TYPES_WHY.get(rt, "not one the export has been checked with")
            raise LLMExportError(f"{arch}: rope type {rt!r} is not supported by kiln export-llm ({why}; "
                                 f"supported rope types: {', '.join(SUPPORTED_ROPE_TYPES)})")
    if getattr(config, "use_bidirectional_attention", False):
        raise LLMExportError(f"{label}: use_bidirectional_attention=True is not supported (causal attention only)")
    for lt in getattr(config, "layer_types", None) or []:
        if lt not in ("full_attention", "sliding_attention"):
            raise LLMExportError(f"{label}: layer type {lt!r} is not supported "
                                 "(full_attention and sliding_attention only)")
    if "sliding_attention" in (getattr(config, "layer_types", None) or []) and not getattr(config, "sliding_window",
                                                                                          None):
        raise LLMExportError(f"{label}: sliding_attention layers without a sliding_window")
    if getattr(config, "attention_chunk_size", None):
        raise LLMExportError(f"{label}: chunked attention (attention_chunk_size) is not supported")
    return arch


def _head_dim(config) -> int:
    hd = getattr(config, "head_dim", None)
    return int(hd) if hd else config.hidden_size // config.num_attention_heads


def _num_kv_heads(config) -> int:
    n = getattr(config, "num_key_value_heads", None)
    return int(n) if n else int(config.num_attention_heads)


# --------------------------------------------------------------------------------------------------
# the attention function

def _kiln_kv_cache_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, sliding_window: int | None = None, **kwargs):
    """transformers attention interface: query [B, Hq, T, D], key/value [B, Hkv, T, D] (after RoPE)
    -> (out [B, T, Hq, Dv], None). Writes key/value into the layer's cache, then attends over it."""
    caches = kwargs.get("kiln_caches")
    input_pos = kwargs.get("kiln_input_pos")
    if caches is None or input_pos is None:
        raise RuntimeError(f"attention '{ATTN_NAME}' runs only inside kiln.llm.KilnCausalLM")
    if kwargs.get("softcap") is not None:
        raise LLMExportError(f"attn_logit_softcapping={kwargs['softcap']} is not supported by kiln.sdpa_kv_cache")
    if attention_mask is not None:
        raise RuntimeError(f"attention '{ATTN_NAME}' expects no attention mask (it masks by position)")
    k_cache, v_cache = caches[module.layer_idx]
    t = query.shape[2]
    idx = input_pos + torch.arange(t, dtype=torch.int64, device=query.device)
    # in-place index_put_ on the buffers (cache[:, :, idx] = key without the view that __setitem__
    # adds): after functionalization the graph has aten.index_put and k_cache/v_cache are mutated buffers
    torch.ops.aten.index_put_(k_cache, [None, None, idx], key)
    torch.ops.aten.index_put_(v_cache, [None, None, idx], value)
    if sliding_window is None:
        sliding_window = getattr(module, "sliding_window", None)
    out = torch.ops.kiln.sdpa_kv_cache(query, k_cache, v_cache, input_pos, scaling, int(sliding_window or 0))
    return out.transpose(1, 2).contiguous(), None


def _register_attention():
    from transformers import AttentionInterface
    AttentionInterface.register(ATTN_NAME, _kiln_kv_cache_attention)


# --------------------------------------------------------------------------------------------------
# the wrapper

class KilnCausalLM(torch.nn.Module):
    """A transformers causal LM with a static KV cache of `max_seq_len` positions. Switches `model`
    to the ``kiln_kv_cache`` attention (set_attn_implementation): use another instance as reference.

    ``forward(tokens int64[1, seq], input_pos int64[1]) -> logits float32[1, vocab]``: runs tokens at
    positions input_pos .. input_pos + seq - 1, writes their keys/values into the cache and returns the
    logits of the last token. input_pos + seq > max_seq_len is an error."""

    def __init__(self, model, max_seq_len: int):
        super().__init__()
        config = model.config
        check_llm_config(config)
        if type(model).__name__ not in SUPPORTED_ARCHS:
            raise LLMExportError(f"{type(model).__name__}: architecture not supported by kiln export-llm "
                                 f"(supported: {', '.join(SUPPORTED_ARCHS)})")
        if int(max_seq_len) < 1:
            raise LLMExportError(f"max_seq_len must be >= 1, got {max_seq_len}")
        _register_attention()
        model.set_attn_implementation(ATTN_NAME)
        self.model = model.eval()
        self.max_seq_len = int(max_seq_len)
        self.num_layers = int(config.num_hidden_layers)
        self.num_kv_heads = _num_kv_heads(config)
        self.head_dim = _head_dim(config)
        for i in range(self.num_layers):
            shape = (1, self.num_kv_heads, self.max_seq_len, self.head_dim)
            self.register_buffer(f"k_cache_{i}", torch.zeros(shape, dtype=torch.float32), persistent=False)
            self.register_buffer(f"v_cache_{i}", torch.zeros(shape, dtype=torch.float32), persistent=False)

    def caches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")) for i in range(self.num_layers)]

    @torch.no_grad()
    def reset(self) -> None:
        """Zeros the cache (a new conversation)."""
        for k, v in self.caches():
            k.zero_()
            v.zero_()

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        if not torch.compiler.is_compiling():  # eager: refuse before the cache is touched
            p = int(input_pos.reshape(-1)[0])
            if p < 0 or p + seq > self.max_seq_len:
                raise ValueError(f"KilnCausalLM: input_pos {p} + {seq} tokens exceeds max_seq_len "
                                 f"{self.max_seq_len}")
        # In the exported program this check is the first instruction that reads input_pos, so a
        # position outside the cache fails before any cache write (the session's state unchanged).
        input_pos = torch.ops.kiln.check_range(input_pos, 0, self.max_seq_len - seq,
                                               "input_pos (the cache position of the first token; "
                                               f"input_pos + seq must be <= max_seq_len {self.max_seq_len})")
        position_ids = (input_pos + torch.arange(seq, dtype=torch.int64, device=tokens.device)).unsqueeze(0)
        out = self.model(input_ids=tokens, position_ids=position_ids, use_cache=False, logits_to_keep=1,
                         return_dict=True, kiln_caches=self.caches(), kiln_input_pos=input_pos)
        return out.logits[:, -1, :]


# --------------------------------------------------------------------------------------------------
# metadata and export preparation

def _eos_ids(config, dir: str | None) -> list[int]:
    ids: list[int] = []

    def add(v):
        if v is None:
            return
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            if x is not None and int(x) not in ids:
                ids.append(int(x))

    add(getattr(config, "eos_token_id", None))
    if dir is not None:
        gc = os.path.join(os.fspath(dir), "generation_config.json")
        if os.path.isfile(gc):
            with open(gc) as f:
                add(json.load(f).get("eos_token_id"))
    return ids


def llm_metadata(config, max_seq_len: int, dir: str | os.PathLike | None = None) -> dict[str, str]:
    """The ``llm.*`` string metadata of an exported program. `dir`: the checkpoint folder (its
    generation_config.json adds eos ids and a bos id; defaults to config.name_or_path if that is a
    folder)."""
    if dir is None:
        cand = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
        dir = cand if cand and os.path.isdir(cand) else None
    bos = getattr(config, "bos_token_id", None)
    if bos is None and dir is not None:
        gc = os.path.join(os.fspath(dir), "generation_config.json")
        if os.path.isfile(gc):
            with open(gc) as f:
                bos = json.load(f).get("bos_token_id")
    if isinstance(bos, (list, tuple)):
        bos = bos[0] if bos else None
    layers, kvh, hd = int(config.num_hidden_layers), _num_kv_heads(config), _head_dim(config)
    return {
        "llm.arch": str(config.model_type),
        "llm.vocab_size": str(int(config.vocab_size)),
        "llm.bos_id": "" if bos is None else str(int(bos)),
        # ids outside the vocabulary are left out: the model cannot emit them
        "llm.eos_ids": ",".join(str(i) for i in _eos_ids(config, dir) if 0 <= i < int(config.vocab_size)),
        "llm.max_seq_len": str(int(max_seq_len)),
        "llm.cache": (f"kv:layers={layers},kv_heads={kvh},head_dim={hd},dtype=float32,"
                      "layout=[1,kv_heads,max_seq_len,head_dim]"),
        "llm.num_layers": str(layers),
    }


def prepare_llm_export(dir: str | os.PathLike, max_seq_len: int):
    """Returns (module, example_args, dynamic_shapes, metadata) for
    ``torch.export.export(module, example_args, dynamic_shapes=dynamic_shapes)``."""
    max_seq_len = int(max_seq_len)
    if max_seq_len < 2:
        raise LLMExportError(f"max_seq_len must be >= 2 (a dynamic seq dimension of 1..1 is a constant), "
                             f"got {max_seq_len}")
    model, config = load_llm(dir)
    module = KilnCausalLM(model, max_seq_len)
    n = min(8, max_seq_len)          # >= 2: torch.export specializes example dims of size 0 and 1
    tokens = torch.zeros((1, n), dtype=torch.int64)
    input_pos = torch.zeros((1,), dtype=torch.int64)
    seq = torch.export.Dim("seq", min=1, max=max_seq_len)
    dynamic_shapes = {"tokens": {1: seq}, "input_pos": None}
    return module, (tokens, input_pos), dynamic_shapes, llm_metadata(config, max_seq_len, dir)

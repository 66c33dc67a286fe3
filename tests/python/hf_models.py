"""Tiny Hugging Face transformers models built from configs (issue 17, item 4), shared by
tests/python/test_hf_models.py and tools/hf_report.py.

Every model is built in code from a small config (hidden 32-64, 2 layers, 2-4 heads, GQA where the
family has it, vocabulary ~100-300, sequence 8-16) with seeded random weights, in eval mode, at
``use_cache=False``; nothing is downloaded (HF_HUB_OFFLINE=1). A model is exported through a thin
wrapper module that fixes the call (which inputs, ``use_cache=False``, ``return_dict=False``) and
returns plain tensors: the wrapper only picks arguments and outputs, it changes nothing inside the
model (no patching, no source edits).

``MODELS`` maps a model name to a builder ``build(attn) -> (module, example_inputs)`` with
``attn`` one of ``ATTN`` ("eager", "sdpa"). Example inputs are deterministic (seeded).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

ATTN = ("eager", "sdpa")
SEQ = 12       # token sequence length
DEC_SEQ = 8    # decoder sequence length (T5, Whisper)
VOCAB = 128


def _ids(seed: int, shape, high: int = VOCAB) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g, dtype=torch.long)


def _rand(seed: int, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g)


def _init(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Seeded random weights (normal, std 0.2; norm weights near 1) so that no output is trivially
    zero or dominated by the initializer's tiny values; eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


class _CausalLM(torch.nn.Module):
    """logits = model(input_ids, attention_mask, use_cache=False).logits"""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=False)
        return out[0]


class _Encoder(torch.nn.Module):
    """BertModel / ViT style: the first output (last hidden state) and the second (pooler/logits) if any."""

    def __init__(self, model, keys):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *args):
        out = self.model(**dict(zip(self.keys, args)), return_dict=False)
        return tuple(out[:2]) if len(out) > 1 else out[0]


class _Seq2Seq(torch.nn.Module):
    """T5 / Whisper, encoder and a fixed-length decoder pass in one call (no cache): logits."""

    def __init__(self, model, enc_key):
        super().__init__()
        self.model, self.enc_key = model, enc_key

    def forward(self, enc_input, decoder_input_ids):
        out = self.model(**{self.enc_key: enc_input}, decoder_input_ids=decoder_input_ids, use_cache=False,
                         return_dict=False)
        return out[0]


class Seq2SeqParts(torch.nn.Module):
    """T5 / Whisper as two methods for kiln.export_program: ``encode(enc_input)`` -> the encoder's
    last hidden state, ``decode(encoder_hidden_states, decoder_input_ids)`` -> logits (the model's
    own forward with ``encoder_outputs`` given, no cache)."""

    def __init__(self, model, enc_key):
        super().__init__()
        self.model, self.enc_key = model, enc_key

    def encode(self, enc_input):
        return self.model.get_encoder()(**{self.enc_key: enc_input}, return_dict=False)[0]

    def decode(self, encoder_hidden_states, decoder_input_ids):
        out = self.model(encoder_outputs=(encoder_hidden_states,), decoder_input_ids=decoder_input_ids,
                         use_cache=False, return_dict=False)
        return out[0]


class _Clip(torch.nn.Module):
    """CLIPModel, text and vision towers: (logits_per_image, text_embeds, image_embeds)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, pixel_values, attention_mask):
        out = self.model(input_ids=input_ids, pixel_values=pixel_values, attention_mask=attention_mask,
                         return_dict=True)
        return out.logits_per_image, out.text_embeds, out.image_embeds


def _mask(batch: int, seq: int, pad: int = 3) -> torch.Tensor:
    """attention mask of ones with the last `pad` positions of row 1 padded (0)."""
    m = torch.ones(batch, seq, dtype=torch.long)
    if batch > 1 and pad:
        m[1, -pad:] = 0
    return m


def _common(attn):
    return dict(attn_implementation=attn)


def bert(attn):
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, type_vocab_size=2, **_common(attn))
    m = _init(BertModel(cfg), 1)
    # no token_type_ids: BertEmbeddings then gathers them from its buffer (the call most users make)
    return _Encoder(m, ("input_ids", "attention_mask")), (_ids(11, (2, SEQ)), _mask(2, SEQ))


def gpt2(attn):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, **_common(attn))
    return _CausalLM(_init(GPT2LMHeadModel(cfg), 2)), (_ids(12, (2, SEQ)), _mask(2, SEQ))


def _decoder_lm(config_cls, model_cls, seed, **kw):
    def build(attn):
        cfg = config_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         **kw, **_common(attn))
        return _CausalLM(_init(model_cls(cfg), seed)), (_ids(seed + 10, (2, SEQ)), _mask(2, SEQ))
    return build


def qwen2(attn):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    return _decoder_lm(Qwen2Config, Qwen2ForCausalLM, 12)(attn)


def llama(attn):
    from transformers import LlamaConfig, LlamaForCausalLM
    return _decoder_lm(LlamaConfig, LlamaForCausalLM, 3)(attn)


def qwen3(attn):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return _decoder_lm(Qwen3Config, Qwen3ForCausalLM, 4, head_dim=8)(attn)


def gemma3(attn):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    # sliding_window < SEQ so that the sliding-window mask of the local layers is exercised
    return _decoder_lm(Gemma3TextConfig, Gemma3ForCausalLM, 5, head_dim=8, query_pre_attn_scalar=8,
                       sliding_window=4, layer_types=["sliding_attention", "full_attention"])(attn)


def mistral(attn):
    from transformers import MistralConfig, MistralForCausalLM
    return _decoder_lm(MistralConfig, MistralForCausalLM, 6, sliding_window=None)(attn)


def phi(attn):
    from transformers import PhiConfig, PhiForCausalLM
    return _decoder_lm(PhiConfig, PhiForCausalLM, 7)(attn)


def t5(attn):
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0,
                   **_common(attn))
    m = _init(T5ForConditionalGeneration(cfg), 8)
    return _Seq2Seq(m, "input_ids"), (_ids(18, (2, SEQ)), _ids(28, (2, DEC_SEQ)))


def whisper(attn):
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    cfg = WhisperConfig(vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, max_source_positions=8, max_target_positions=32,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                        **_common(attn))
    m = _init(WhisperForConditionalGeneration(cfg), 9)
    # input_features: [batch, mel bins, 2 * max_source_positions] (two stride-1/2 convolutions)
    return _Seq2Seq(m, "input_features"), (_rand(19, (1, 8, 16)), _ids(29, (1, DEC_SEQ)))


def vit(attn):
    from transformers import ViTConfig, ViTForImageClassification
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    image_size=16, patch_size=4, num_channels=3, num_labels=10, **_common(attn))
    m = _init(ViTForImageClassification(cfg), 10)
    return _Encoder(m, ("pixel_values",)), (_rand(20, (2, 3, 16, 16)),)


def clip(attn):
    from transformers import CLIPConfig, CLIPModel
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=SEQ, projection_dim=16)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  image_size=16, patch_size=4, projection_dim=16)
    cfg = CLIPConfig(text_config=text, vision_config=vision, projection_dim=16, **_common(attn))
    m = _init(CLIPModel(cfg), 11)
    return _Clip(m), (_ids(21, (2, SEQ)), _rand(31, (2, 3, 16, 16)), _mask(2, SEQ))


MODELS = {
    "bert": bert, "gpt2": gpt2, "llama": llama, "qwen2": qwen2, "qwen3": qwen3, "gemma3": gemma3, "mistral": mistral,
    "phi": phi, "t5": t5, "whisper": whisper, "vit": vit, "clip": clip,
}

#: the transformers class each entry exercises (for reports)
CLASSES = {
    "bert": "BertModel", "gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM (Gemma3TextConfig)", "mistral": "MistralForCausalLM", "phi": "PhiForCausalLM",
    "t5": "T5ForConditionalGeneration (encoder + decoder)",
    "whisper": "WhisperForConditionalGeneration (encoder + fixed-length decoder)",
    "vit": "ViTForImageClassification", "clip": "CLIPModel (text + vision towers)",
}


def build(name: str, attn: str):
    """(module, example_inputs) of model `name` with attn_implementation `attn` (deterministic)."""
    torch.manual_seed(0)
    return MODELS[name](attn)


def eager(module, inputs) -> list:
    """The module's outputs in eager PyTorch as a list of float tensors."""
    with torch.no_grad():
        out = module(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


# --------------------------------------------------------------------------------------------------
# export once, compile per backend

#: the four ways a program runs: (name, delegate backends, load options)
BACKENDS = {
    "portable": ((), dict(portable_kernels_only=True)),
    "cpu": ((), {}),
    "xnnpack": (("xnnpack",), {}),
    "mlx": (("mlx",), dict(backend_settings={"mlx.device": "cpu"})),  # MLX's CPU device
}
REL = 1e-4  # max abs error <= REL * max|eager output| (issue 17)


def capture(module, inputs):
    """kiln.capture.capture of the module (once; every backend compiles from it)."""
    from kiln import capture as C
    return C.capture(module, inputs)


def run_backend(cap, backend: str, inputs) -> tuple:
    """Compiles the capture for `backend` (a key of BACKENDS), loads and runs it on `inputs`.
    Returns (outputs as torch tensors, the compile report's delegation dict of the method)."""
    import kiln
    from kiln import capture as C
    delegates, load_opts = BACKENDS[backend]
    res = C.compile_captures({"forward": cap}, backends=delegates, verbose=False)
    prog = kiln.load_bytes(res.data, **load_opts)
    outs = [torch.from_numpy(o) for o in prog.run(*inputs)]
    return outs, res.report["methods"][0].get("delegation") or {}


def rel_errors(got, ref) -> list:
    """Per output: max |got - ref| / max |ref| (shape and dtype must match)."""
    errs = []
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, g.dtype, r.shape, r.dtype)
        errs.append(float((g - r).abs().max()) / max(float(r.abs().max()), 1e-30))
    assert len(got) == len(ref), (len(got), len(ref))
    return errs


def delegation_summary(delegation: dict) -> tuple:
    """(segments and nodes per backend as "xnnpack: 12 segments, 43 nodes", CPU ops as
    [(op, count, [(backend, reason), ...])])."""
    seg = [f"{b['backend']}: {b['segments']} segment(s), {b['nodes']} node(s)" for b in delegation.get("backends", [])]
    cpu = [(c["op"], c["count"], [tuple(r) for r in c["reasons"]]) for c in delegation.get("cpu_ops", [])]
    return seg, cpu

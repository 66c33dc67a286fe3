"""Kiln's own PyTorch definitions of an SD-1.5-style one-step text-to-image pipeline (like SDXS-512):
a CLIP ViT-L/14-style text encoder, an SD-1.5-style UNet and a TAESD-style decoder, written from the
published architectures (no code copied):

- text encoder: CLIP ViT-L/14's text tower as used by Stable Diffusion 1.5 (Radford et al. 2021,
  "Learning Transferable Visual Models From Natural Language Supervision"; configuration of
  openai/clip-vit-large-patch14: vocab 49408, 77 positions, width 768, 12 layers, 12 heads, MLP 3072,
  quick-GELU x * sigmoid(1.702 x), causal mask, final LayerNorm). 123,060,480 parameters.
- UNet: Stable Diffusion 1.5's UNet (Rombach et al. 2022, "High-Resolution Image Synthesis with
  Latent Diffusion Models"; configuration of runwayml/stable-diffusion-v1-5 unet/config.json: 4 latent
  channels, block_out_channels 320/640/1280/1280, layers_per_block 2, cross_attention_dim 768,
  8 attention heads, norm_num_groups 32, GroupNorm eps 1e-5 in ResBlocks and 1e-6 in spatial
  transformers, flip_sin_to_cos, freq_shift 0). 859,520,964 parameters.
- decoder: TAESD's decoder (madebyollin/taesd, "Tiny AutoEncoder for Stable Diffusion": tanh clamp
  of the latent to +-3, conv 4->64, three stages of 3 residual blocks + nearest 2x upsampling + conv,
  one more block, conv 64->3). 1,222,531 parameters. 4x64x64 latent -> 3x512x512 image.

Every model has a full configuration (the published sizes) and a tiny one for tests; weights are
seeded random (torch.manual_seed) unless a state dict is given (``build(..., state_dict=...)``).

``Pipeline`` holds the three models and has the three methods that become the program's methods:
    encode(token_ids int64[1, T]) -> text_embedding float32[1, T, D]
    denoise(latent float32[1, 4, H, W], timestep int64[1], text_embedding) -> latent float32[1, 4, H, W]
        one denoising step: eps = unet(latent, t, text); x0 = (latent - sqrt(1 - abar_t) eps) / sqrt(abar_t)
    decode(latent float32[1, 4, H, W]) -> image float32[1, 3, 8H, 8W] in [0, 1]

Run ``python examples/diffusion/models.py`` to print the parameter counts of both configurations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

nn = torch.nn


# --------------------------------------------------------------------------------------------------
# configurations

@dataclass(frozen=True)
class TextConfig:
    vocab: int = 49408
    tokens: int = 77
    width: int = 768
    layers: int = 12
    heads: int = 12
    mlp: int = 3072


@dataclass(frozen=True)
class UNetConfig:
    latent_channels: int = 4
    latent_size: int = 64
    base: int = 320
    mults: tuple = (1, 2, 4, 4)
    # which levels (down, and the mirrored up levels) have spatial transformers: SD-1.5 has them on
    # every level but the deepest ("CrossAttnDownBlock2D" x3 + "DownBlock2D")
    attn: tuple = (True, True, True, False)
    layers_per_block: int = 2
    groups: int = 32
    heads: int = 8
    context_dim: int = 768


@dataclass(frozen=True)
class DecoderConfig:
    latent_channels: int = 4
    channels: int = 64
    blocks: int = 3      # residual blocks per stage
    stages: int = 3      # nearest 2x upsamplings: image = latent * 2**stages


FULL = {"text": TextConfig(), "unet": UNetConfig(), "decoder": DecoderConfig()}
TINY = {
    "text": TextConfig(vocab=1000, tokens=77, width=64, layers=2, heads=4, mlp=128),
    "unet": UNetConfig(latent_size=16, base=32, mults=(1, 2), attn=(True, False), layers_per_block=1,
                       groups=8, heads=2, context_dim=64),
    "decoder": DecoderConfig(channels=16, blocks=1, stages=3),
}
CONFIGS = {"full": FULL, "tiny": TINY}

# Published parameter counts of the full models (see the module docstring).
PUBLISHED = {"text": 123_060_480, "unet": 859_520_964, "decoder": 1_222_531}


# --------------------------------------------------------------------------------------------------
# CLIP text encoder

class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the GELU approximation CLIP was trained with (OpenAI CLIP, model.py)."""

    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class SelfAttention(nn.Module):
    """Multi-head attention with separate q/k/v/out projections (all with bias). x: [B, L, D]."""

    def __init__(self, width: int, heads: int, bias_qkv: bool = True, context_dim: int | None = None):
        super().__init__()
        kv = context_dim or width
        self.heads = heads
        self.q = nn.Linear(width, width, bias=bias_qkv)
        self.k = nn.Linear(kv, width, bias=bias_qkv)
        self.v = nn.Linear(kv, width, bias=bias_qkv)
        self.out = nn.Linear(width, width)

    def forward(self, x, context=None, causal: bool = False):
        b, n, d = x.shape
        c = x if context is None else context
        h = self.heads
        q = self.q(x).view(b, n, h, d // h).transpose(1, 2)
        k = self.k(c).view(b, c.shape[1], h, d // h).transpose(1, 2)
        v = self.v(c).view(b, c.shape[1], h, d // h).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self.out(a.transpose(1, 2).reshape(b, n, d))


class TextLayer(nn.Module):
    """Pre-norm transformer layer: x + attn(ln1(x)) (causal), then x + mlp(ln2(x)) with quick-GELU."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = SelfAttention(cfg.width, cfg.heads)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.fc1 = nn.Linear(cfg.width, cfg.mlp)
        self.act = QuickGELU()
        self.fc2 = nn.Linear(cfg.mlp, cfg.width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x), causal=True)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class TextEncoder(nn.Module):
    """CLIP text tower. token_ids int64[B, tokens] -> last hidden state float32[B, tokens, width]
    (after the final LayerNorm: what SD-1.5 cross-attends to)."""

    def __init__(self, cfg: TextConfig = TextConfig()):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab, cfg.width)
        self.position_embedding = nn.Parameter(torch.randn(cfg.tokens, cfg.width) * 0.01)
        self.layers = nn.ModuleList([TextLayer(cfg) for _ in range(cfg.layers)])
        self.final_ln = nn.LayerNorm(cfg.width)

    def forward(self, token_ids):
        x = self.token_embedding(token_ids) + self.position_embedding
        for layer in self.layers:
            x = layer(x)
        return self.final_ln(x)


# --------------------------------------------------------------------------------------------------
# UNet

def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of float timesteps t [B] -> [B, dim], SD-1.5's variant (flip_sin_to_cos,
    shift 0): freqs_i = exp(-ln(10000) i / (dim/2)), emb = [cos(t f), sin(t f)] (Ho et al. 2020 /
    Vaswani et al. 2017; diffusers get_timestep_embedding with flip_sin_to_cos=True, downscale_freq_shift=0)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    a = t[:, None] * freqs[None, :]
    return torch.cat([torch.cos(a), torch.sin(a)], dim=1)


class ResBlock(nn.Module):
    """GroupNorm+SiLU+conv3x3, + projection of the time embedding, GroupNorm+SiLU+conv3x3, + skip
    (1x1 conv when the channel count changes)."""

    def __init__(self, cin: int, cout: int, temb: int, groups: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=1e-5)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(groups, cout, eps=1e-5)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class GEGLU(nn.Module):
    """Linear to 2*inner, split in (a, gate), a * gelu(gate) (Shazeer 2020, "GLU Variants Improve Transformer")."""

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.proj = nn.Linear(dim, 2 * inner)

    def forward(self, x):
        a, gate = self.proj(x).chunk(2, dim=-1)
        return a * F.gelu(gate)


class TransformerBlock(nn.Module):
    """x + self-attn(LN x); x + cross-attn(LN x, context); x + GEGLU feed-forward(LN x). q/k/v without bias."""

    def __init__(self, dim: int, heads: int, context_dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = SelfAttention(dim, heads, bias_qkv=False)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = SelfAttention(dim, heads, bias_qkv=False, context_dim=context_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = GEGLU(dim, 4 * dim)
        self.ff_out = nn.Linear(4 * dim, dim)

    def forward(self, x, context):
        x = x + self.attn1(self.norm1(x))
        x = x + self.attn2(self.norm2(x), context)
        return x + self.ff_out(self.ff(self.norm3(x)))


class SpatialTransformer(nn.Module):
    """GroupNorm (eps 1e-6), 1x1 conv in, one TransformerBlock over the H*W tokens, 1x1 conv out, + x."""

    def __init__(self, dim: int, heads: int, context_dim: int, groups: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, dim, eps=1e-6)
        self.proj_in = nn.Conv2d(dim, dim, 1)
        self.block = TransformerBlock(dim, heads, context_dim)
        self.proj_out = nn.Conv2d(dim, dim, 1)

    def forward(self, x, context):
        b, c, h, w = x.shape
        t = self.proj_in(self.norm(x)).flatten(2).transpose(1, 2)
        t = self.block(t, context)
        return x + self.proj_out(t.transpose(1, 2).reshape(b, c, h, w))


class Downsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Level(nn.Module):
    """One resolution level: ResBlocks, each followed by a SpatialTransformer when the level has
    attention, and an optional resampler (Downsample / Upsample) at the end."""

    def __init__(self):
        super().__init__()
        self.res = nn.ModuleList()
        self.attn = nn.ModuleList()
        self.resample = None


class UNet(nn.Module):
    """SD-1.5-style UNet: eps = unet(latent float32[B, 4, H, W], t float32[B], context float32[B, T, D]).
    Skips: the output of conv_in and of every ResBlock(+transformer) and Downsample of the encoder
    are concatenated (channel dim) onto the decoder ResBlocks' inputs in reverse order."""

    def __init__(self, cfg: UNetConfig = UNetConfig()):
        super().__init__()
        self.cfg = cfg
        ch = [cfg.base * m for m in cfg.mults]
        temb = 4 * cfg.base
        g, hd, cd, n = cfg.groups, cfg.heads, cfg.context_dim, len(ch)
        self.time1 = nn.Linear(cfg.base, temb)
        self.time2 = nn.Linear(temb, temb)
        self.conv_in = nn.Conv2d(cfg.latent_channels, ch[0], 3, padding=1)

        skips = [ch[0]]
        self.down = nn.ModuleList()
        cur = ch[0]
        for i, c in enumerate(ch):
            lv = Level()
            for _ in range(cfg.layers_per_block):
                lv.res.append(ResBlock(cur, c, temb, g))
                if cfg.attn[i]:
                    lv.attn.append(SpatialTransformer(c, hd, cd, g))
                cur = c
                skips.append(c)
            if i < n - 1:
                lv.resample = Downsample(c)
                skips.append(c)
            self.down.append(lv)

        self.mid_res1 = ResBlock(cur, cur, temb, g)
        self.mid_attn = SpatialTransformer(cur, hd, cd, g)
        self.mid_res2 = ResBlock(cur, cur, temb, g)

        self.up = nn.ModuleList()
        for i, c in reversed(list(enumerate(ch))):
            lv = Level()
            for _ in range(cfg.layers_per_block + 1):
                lv.res.append(ResBlock(cur + skips.pop(), c, temb, g))
                if cfg.attn[i]:
                    lv.attn.append(SpatialTransformer(c, hd, cd, g))
                cur = c
            if i > 0:
                lv.resample = Upsample(c)
            self.up.append(lv)

        self.norm_out = nn.GroupNorm(g, cur, eps=1e-5)
        self.conv_out = nn.Conv2d(cur, cfg.latent_channels, 3, padding=1)

    def forward(self, x, t, context):
        temb = self.time2(F.silu(self.time1(timestep_embedding(t, self.cfg.base))))
        h = self.conv_in(x)
        skips = [h]
        for lv in self.down:
            for j, r in enumerate(lv.res):
                h = r(h, temb)
                if len(lv.attn):
                    h = lv.attn[j](h, context)
                skips.append(h)
            if lv.resample is not None:
                h = lv.resample(h)
                skips.append(h)
        h = self.mid_res2(self.mid_attn(self.mid_res1(h, temb), context), temb)
        for lv in self.up:
            for j, r in enumerate(lv.res):
                h = r(torch.cat([h, skips.pop()], dim=1), temb)
                if len(lv.attn):
                    h = lv.attn[j](h, context)
            if lv.resample is not None:
                h = lv.resample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


# --------------------------------------------------------------------------------------------------
# TAESD decoder

class TAEBlock(nn.Module):
    """relu(conv(relu(conv(relu(conv(x))))) + x): TAESD's residual block (equal in/out channels)."""

    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1),
                                  nn.ReLU(), nn.Conv2d(c, c, 3, padding=1))

    def forward(self, x):
        return F.relu(self.conv(x) + x)


class Decoder(nn.Module):
    """TAESD-style decoder: latent float32[B, 4, H, W] -> float32[B, 3, H * 2**stages, W * 2**stages]
    (unclamped; Pipeline.decode clamps to [0, 1])."""

    def __init__(self, cfg: DecoderConfig = DecoderConfig()):
        super().__init__()
        c = cfg.channels
        layers = [nn.Conv2d(cfg.latent_channels, c, 3, padding=1), nn.ReLU()]
        for _ in range(cfg.stages):
            layers += [TAEBlock(c) for _ in range(cfg.blocks)]
            layers += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(c, c, 3, padding=1, bias=False)]
        layers += [TAEBlock(c), nn.Conv2d(c, 3, 3, padding=1)]
        self.net = nn.Sequential(*layers)

    def forward(self, latent):
        return self.net(torch.tanh(latent / 3) * 3)


# --------------------------------------------------------------------------------------------------
# the pipeline (the program's three methods)

def sd15_alphas_cumprod(steps: int = 1000) -> torch.Tensor:
    """SD-1.5's "scaled_linear" schedule: betas = linspace(sqrt(0.00085), sqrt(0.012), 1000)^2,
    alphas_cumprod = cumprod(1 - betas) (runwayml/stable-diffusion-v1-5 scheduler/scheduler_config.json:
    beta_start 0.00085, beta_end 0.012, beta_schedule "scaled_linear"; computed in float64)."""
    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, steps, dtype=torch.float64) ** 2
    return torch.cumprod(1.0 - betas, dim=0)


class Pipeline(nn.Module):
    """The three methods of the diffusion program. See the module docstring for shapes.

    denoise does one step with an epsilon-predicting UNet and returns the x0 prediction
    (DDPM, Ho et al. 2020, eq. 15: x0 = (x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t)), what a
    one-step model (SDXS-512) or the last step of a DDIM sampler uses. abar_t is read from a
    [1000, 2] table (sqrt(abar), sqrt(1 - abar)) with an embedding lookup on the int64 timestep
    (0 <= t < 1000; out of range is an InvalidArgument error from the runtime)."""

    def __init__(self, size: str = "tiny"):
        super().__init__()
        cfg = CONFIGS[size]
        self.size = size
        self.text = TextEncoder(cfg["text"])
        self.unet = UNet(cfg["unet"])
        self.decoder = Decoder(cfg["decoder"])
        ac = sd15_alphas_cumprod()
        self.register_buffer("schedule", torch.stack([ac.sqrt(), (1 - ac).sqrt()], 1).float())

    def encode(self, token_ids):
        return self.text(token_ids)

    def denoise(self, latent, timestep, text_embedding):
        s = F.embedding(timestep, self.schedule)  # [1, 2]
        eps = self.unet(latent, timestep.to(torch.float32), text_embedding)
        a, b = s[:, 0, None, None, None], s[:, 1, None, None, None]
        return (latent - b * eps) / a

    def decode(self, latent):
        return self.decoder(latent).clamp(0.0, 1.0)

    def example_inputs(self) -> dict:
        """Example inputs per method (the program's exact input shapes and dtypes)."""
        t, u = self.text.cfg, self.unet.cfg
        lat = torch.zeros(1, u.latent_channels, u.latent_size, u.latent_size)
        return {
            "encode": (torch.zeros(1, t.tokens, dtype=torch.int64),),
            "denoise": (lat, torch.tensor([999], dtype=torch.int64), torch.zeros(1, t.tokens, t.width)),
            "decode": (lat,),
        }


def build(size: str = "tiny", seed: int = 0, state_dict: dict | None = None) -> Pipeline:
    """A Pipeline of the given size ("tiny" | "full") in eval mode: weights from `state_dict` (keys of
    Pipeline.state_dict(), strict) or seeded random (torch.manual_seed(seed))."""
    torch.manual_seed(seed)
    p = Pipeline(size)
    if state_dict is not None:
        p.load_state_dict(state_dict, strict=True)
    return p.eval()


def count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def main():
    for size in ("tiny", "full"):
        with torch.device("meta"):
            p = Pipeline(size)
        for name, m in (("text encoder", p.text), ("unet", p.unet), ("decoder", p.decoder)):
            n = count(m)
            key = {"text encoder": "text", "unet": "unet", "decoder": "decoder"}[name]
            pub = f" (published {PUBLISHED[key]:,}: {'match' if n == PUBLISHED[key] else 'MISMATCH'})" \
                if size == "full" else ""
            print(f"{size:5s} {name:13s} {n:>13,} parameters = {n / 1e6:8.2f} M{pub}")


if __name__ == "__main__":
    main()

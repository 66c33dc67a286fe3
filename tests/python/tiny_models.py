"""Small stand-ins for the diffusion and CLIP blocks Kiln's delegates must take whole: an SD-1.5-like
UNet (group norm, SiLU, attention, nearest upsampling, skip concatenation), a CLIP-like text encoder
(embedding, causal float mask, pre-norm transformer layers, GELU) and a TAESD-like decoder (tanh
scaling, residual convs, nearest and bilinear upsampling, clamp). Used by tests/python/test_mlx.py and
bench/mlx_boundary.py; random weights (seed them before constructing)."""
import torch
import torch.nn.functional as F

nn = torch.nn


class ResBlock(nn.Module):
    def __init__(s, c, co):
        super().__init__()
        s.n1 = nn.GroupNorm(8, c); s.c1 = nn.Conv2d(c, co, 3, padding=1)
        s.n2 = nn.GroupNorm(8, co); s.c2 = nn.Conv2d(co, co, 3, padding=1)
        s.skip = nn.Conv2d(c, co, 1) if c != co else nn.Identity()
        s.t = nn.Linear(32, co)
    def forward(s, x, temb):
        h = s.c1(F.silu(s.n1(x))) + s.t(F.silu(temb))[:, :, None, None]
        h = s.c2(F.silu(s.n2(h)))
        return s.skip(x) + h

class AttnBlock(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.n = nn.GroupNorm(8, c); s.qkv = nn.Linear(c, 3 * c); s.o = nn.Linear(c, c); s.heads = 2
    def forward(s, x):
        b, c, h, w = x.shape
        t = s.n(x).flatten(2).transpose(1, 2)
        q, k, v = s.qkv(t).chunk(3, dim=-1)
        sh = lambda z: z.view(b, h * w, s.heads, c // s.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(sh(q), sh(k), sh(v))
        a = a.transpose(1, 2).reshape(b, h * w, c)
        return x + s.o(a).transpose(1, 2).view(b, c, h, w)

class TinyUNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.cin = nn.Conv2d(4, 32, 3, padding=1)
        s.r1 = ResBlock(32, 64); s.down = nn.Conv2d(64, 64, 3, stride=2, padding=1)
        s.a = AttnBlock(64); s.r2 = ResBlock(64, 64)
        s.r3 = ResBlock(128, 32); s.cout = nn.Conv2d(32, 4, 3, padding=1)
        s.temb = nn.Sequential(nn.Linear(1, 32), nn.SiLU(), nn.Linear(32, 32))
    def forward(s, x, t):
        te = s.temb(t)
        h1 = s.r1(s.cin(x), te)
        h = s.r2(s.a(s.down(h1)), te)
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        h = s.r3(torch.cat([h, h1], 1), te)
        return s.cout(F.silu(h))

class TextEnc(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(100, 64); s.pos = nn.Parameter(torch.randn(1, 16, 64) * 0.1)
        s.layers = nn.ModuleList([nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, activation="gelu",
                                                             batch_first=True, norm_first=True) for _ in range(2)])
        s.ln = nn.LayerNorm(64)
        mask = torch.full((16, 16), float("-inf")).triu(1)
        s.register_buffer("mask", mask)
    def forward(s, ids):
        h = s.emb(ids) + s.pos
        for l in s.layers:
            h = l(h, src_mask=s.mask)
        return s.ln(h)

class TAESDish(nn.Module):
    def __init__(s):
        super().__init__()
        s.c = nn.Conv2d(4, 32, 3, padding=1)
        s.b = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1))
        s.up = nn.Upsample(scale_factor=2); s.o = nn.Conv2d(32, 3, 3, padding=1)
    def forward(s, x):
        h = F.relu(s.c(torch.tanh(x / 3) * 3))
        h = F.relu(h + s.b(h))
        h = s.up(h)
        h = F.interpolate(h, scale_factor=1.5, mode="bilinear", align_corners=False)
        return s.o(h).clamp(0, 1)



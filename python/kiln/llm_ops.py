"""PyTorch custom ops that Kiln's LLM export (kiln.llm) puts into the captured graph.

``kiln::sdpa_kv_cache``: attention of a query block over a static key/value cache. The C++
runtime implements the same op as ``kiln.sdpa_kv_cache``; the eager implementation here is the
reference it is checked against (and what kiln.llm's tests compare with transformers).

    sdpa_kv_cache(query, key_cache, value_cache, input_pos, scale=None, sliding_window=0) -> out

- query float32 [B, Hq, T, D]; key_cache [B, Hkv, S, D]; value_cache [B, Hkv, S, Dv]; input_pos
  int64 [1] holding p, the cache position of query row 0. Hq % Hkv == 0: query head h reads kv
  head h // (Hq // Hkv) (grouped-query attention).
- out [B, Hq, T, Dv]. Row t (position p + t) attends keys j in [lo, p + t] with
  lo = max(0, p + t - sliding_window + 1) if sliding_window > 0 else 0 (transformers' sliding
  window: q_idx - kv_idx < window): softmax(scale * q.k) @ v; scale None means 1/sqrt(D).
- p < 0 or p + T > S is an error. The work is over keys [0, p + T) only, never over S.
"""
from __future__ import annotations

import math

import torch

__all__ = ["sdpa_kv_cache", "sdpa_kv_cache_reference"]


def _check(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, input_pos: torch.Tensor):
    if query.dim() != 4 or key_cache.dim() != 4 or value_cache.dim() != 4:
        raise ValueError(f"kiln.sdpa_kv_cache: query, key_cache and value_cache must be 4-D [B, H, T|S, D], got "
                         f"{tuple(query.shape)}, {tuple(key_cache.shape)}, {tuple(value_cache.shape)}")
    b, hq, _, d = query.shape
    bk, hkv, s, dk = key_cache.shape
    if tuple(value_cache.shape[:3]) != (bk, hkv, s) or bk != b or dk != d:
        raise ValueError(f"kiln.sdpa_kv_cache: shapes disagree: query {tuple(query.shape)}, key_cache "
                         f"{tuple(key_cache.shape)}, value_cache {tuple(value_cache.shape)}")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"kiln.sdpa_kv_cache: query heads ({hq}) must be a multiple of kv heads ({hkv})")
    if input_pos.dtype != torch.int64 or input_pos.numel() != 1:
        raise ValueError(f"kiln.sdpa_kv_cache: input_pos must be int64 with one element, got {input_pos.dtype} "
                         f"{tuple(input_pos.shape)}")


@torch.library.custom_op("kiln::sdpa_kv_cache", mutates_args=())
def sdpa_kv_cache(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, input_pos: torch.Tensor,
                  scale: float | None = None, sliding_window: int = 0) -> torch.Tensor:
    _check(query, key_cache, value_cache, input_pos)
    t = query.shape[2]
    s = key_cache.shape[2]
    p = int(input_pos.reshape(-1)[0].item())
    if p < 0 or p + t > s:
        raise ValueError(f"kiln.sdpa_kv_cache: positions [{p}, {p + t}) do not fit the cache of {s} positions "
                         f"(input_pos {p} + {t} query tokens > max_seq_len {s})")
    return sdpa_kv_cache_reference(query, key_cache, value_cache, p, scale, sliding_window)


def sdpa_kv_cache_reference(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, p: int,
                            scale: float | None = None, sliding_window: int = 0) -> torch.Tensor:
    """The eager computation of kiln::sdpa_kv_cache with p a Python int (no checks)."""
    b, hq, t, d = query.shape
    hkv = key_cache.shape[1]
    n = p + t                                   # filled length: keys [0, p + t)
    k = key_cache[:, :, :n]
    v = value_cache[:, :, :n]
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    sc = (1.0 / math.sqrt(d)) if scale is None else float(scale)
    scores = torch.matmul(query, k.transpose(2, 3)) * sc            # [B, Hq, T, n]
    qpos = torch.arange(p, n, device=query.device).unsqueeze(1)     # [T, 1]
    kpos = torch.arange(n, device=query.device).unsqueeze(0)        # [1, n]
    allowed = kpos <= qpos
    if sliding_window > 0:
        allowed = allowed & (qpos - kpos < sliding_window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(probs, v)


@sdpa_kv_cache.register_fake
def _(query, key_cache, value_cache, input_pos, scale=None, sliding_window=0):
    b, hq, t, _ = query.shape
    return query.new_empty((b, hq, t, value_cache.shape[-1]))


@torch.library.custom_op("kiln::check_range", mutates_args=())
def check_range(x: torch.Tensor, lo: int, hi: int, what: str = "") -> torch.Tensor:
    """Returns a copy of `x` (int64) after checking lo <= x <= hi elementwise; raises ValueError
    naming `what` otherwise. The export wrapper routes input_pos through it first, so that a
    position outside the cache fails before any cache write (Kiln's op kiln.check_range; a failed
    call then leaves the session's state unchanged). lo / hi may be symbolic (max_seq_len - seq)."""
    bad = (x < lo) | (x > hi)
    if bool(bad.any()):
        v = int(x.reshape(-1)[bad.reshape(-1).nonzero()[0, 0]].item())
        raise ValueError(f"{what or 'value'} is {v}, outside [{lo}, {hi}]")
    return x.clone()


@check_range.register_fake
def _(x, lo, hi, what=""):
    return torch.empty_like(x)

// fp32 GEMM: cache blocking + packing + a 6x16 AVX2/FMA microkernel (see gemm.h).
//
// Loop nest (Goto & van de Geijn 2008; BLIS's five loops), for one rectangle of C:
//   for jc in N step NC:           B block  [KC x NC] packed into NR-column panels (L2)
//     for pc in K step KC:
//       for ic in M step MC:       A block  [MC x KC] packed into MR-row panels (L2), alpha folded in
//         for jr in NC step NR:    one B micro-panel [KC x NR] (L1)
//           for ir in MC step MR:  microkernel: MR x NR tile of C in registers over KC
// The first K block applies beta (C = acc + beta*C, C unread when beta == 0), later ones add,
// the last one adds the bias and clamps.
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/vec_math.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

namespace kiln::cpu {
namespace {

constexpr int MR = 6;
constexpr int NR = 16;
constexpr int64_t KC = 256;
constexpr int64_t MC = 144;   // multiple of MR; A block 144 x 256 x 4 B = 144 KiB (L2 is 1 MiB)
constexpr int64_t NC = 1024;  // multiple of NR; B block 256 x 1024 x 4 B = 1 MiB: written by packing, read from L2/L3
                              // (4096, as BLIS uses on Zen, made resnet18 ~10% slower here: packing writes missed L2)
/// Floats from one packed B panel to the next: kc rows of NR plus one cache line, so that the
/// same row of consecutive panels does not fall into one L1 set (kc * 64 B is a multiple of 4 KiB).
constexpr int64_t panel_stride(int64_t kc) { return kc * NR + NR; }
static_assert(NR == kGemmPanelCols && NC == kGemmMaxPackCols, "gemm.h documents the packer's panel layout");

struct GemmArgs {
  bool trans_a, trans_b;
  int64_t M, N, K;
  float alpha;
  const float* A;
  int64_t lda;
  const float* B;
  int64_t ldb;
  float beta;
  float* C;
  int64_t ldc;
  const GemmEpilogue* ep;
  const GemmBPacker* packer = nullptr;  // when set, B is produced by the packer (B, ldb unused)
  const float* packed_a = nullptr;      // when set, A packed by pack_a_for_gemm (alpha 1, no transpose)
  const float* packed_b = nullptr;      // when set, op(B) packed by pack_b_for_gemm (prepacked_b_floats layout)
};

/// Rows of A rounded up to whole MR-row panels: K block pc of a pack_a_for_gemm buffer starts at
/// pc * padded_m(M), and its panel ir at + ir * kc.
constexpr int64_t padded_m(int64_t M) { return (M + MR - 1) / MR * MR; }

/// What the microkernel does when it stores a tile: which K block this is and where the tile
/// sits in C (for the bias index).
struct TileStore {
  float beta;
  bool first;  // first K block: C = acc + beta * C
  bool last;   // last K block: + bias, clamp
  int64_t row0, col0;
  const GemmEpilogue* ep;
  const float* prefetch = nullptr;  ///< the slice of the next B panel to prefetch during this tile
  int64_t prefetch_lines = 0;       ///< its 64-byte lines (at most kc / 8: one per 8 k-steps); 0: none
};

/// Sets the slice of the next B panel that tile `tile` of the current panel prefetches, one
/// 64-byte line per 8 k-steps of its kc: tiles 0, 1, ... take consecutive slices of kc / 8 lines,
/// so at kc = 256 the first 8 tiles cover a whole 256-row panel (16 KiB; a 77-row product has 13).
/// A panel of next_kc rows is next_kc lines (a row is NR floats = 64 bytes). No prefetch when
/// `next_panel` is null or the earlier tiles cover it; never an address past the panel.
/// For B prepacked before the product (a linear layer's weights, packed at load time: hundreds of
/// MiB for a text encoder, read from DRAM on every call; or the B that all parts of a product
/// split along M share). Without it the first tile of every panel waits for the panel: 77-row
/// linear layers went from 84 to 92 GFLOP/s on one core here. B packed per block (im2col,
/// Winograd) is in cache already and gets none.
inline void set_prefetch(TileStore& s, const float* next_panel, int64_t next_kc, int64_t kc, int64_t tile) {
  const int64_t per_tile = kc / 8, first = tile * per_tile;
  s.prefetch_lines = next_panel != nullptr ? std::clamp<int64_t>(next_kc - first, 0, per_tile) : 0;
  s.prefetch = s.prefetch_lines > 0 ? next_panel + first * NR : nullptr;
}

/// Scalar store of an mr x nr tile `t` (row stride NR) into C with the epilogue.
inline void store_tile_scalar(const float* t, float* c, int64_t ldc, int mr, int nr, const TileStore& s) {
  const GemmEpilogue& ep = *s.ep;
  for (int i = 0; i < mr; ++i) {
    float* row = c + i * ldc;
    for (int j = 0; j < nr; ++j) {
      float v = t[i * NR + j];
      if (!s.first) {
        v = row[j] + v;
      } else if (s.beta != 0.0f) {
        v = v + s.beta * row[j];
      }
      if (s.last) {
        if (ep.bias_kind == GemmBias::PerRow) v += ep.bias[s.row0 + i];
        if (ep.bias_kind == GemmBias::PerCol) v += ep.bias[s.col0 + j];
        if (ep.clamp) {
          v = v < ep.clamp_min ? ep.clamp_min : v;  // NaN compares false: passes through
          v = v > ep.clamp_max ? ep.clamp_max : v;
        }
      }
      row[j] = v;
    }
    if (s.last && ep.post.kind != PostOp::Kind::None) apply_inplace(ep.post, row, nr);
  }
}

/// Portable microkernel: same packed layout, plain loops (the compiler vectorizes with SSE2).
void kernel_generic(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, int mr, int nr,
                    const TileStore& s) {
  float acc[MR * NR] = {};
  for (int64_t p = 0; p < kc; ++p) {
    for (int i = 0; i < MR; ++i) {
      const float a = ap[i];
      for (int j = 0; j < NR; ++j) acc[i * NR + j] += a * bp[j];
    }
    ap += MR;
    bp += NR;
  }
  store_tile_scalar(acc, c, ldc, mr, nr, s);
}

/// Lane mask with the first n (0..8) lanes set.
__attribute__((target("avx2,fma"))) inline __m256i lanes_below(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// Vector store of an mr x nr tile (acc[i][h]: row i, columns 8h .. 8h+7; nr <= 8 * halves)
/// into C with the epilogue; partial rows and columns through lane masks (C outside the tile,
/// and bias past column N, are never touched).
__attribute__((target("avx2,fma"))) inline void store_tile_avx2(const __m256 (*acc)[2], int halves, float* c,
                                                                int64_t ldc, int mr, int nr, const TileStore& s) {
  const GemmEpilogue& ep = *s.ep;
  const bool full = nr == 8 * halves;
  const __m256i m0 = lanes_below(std::min(nr, 8)), m1 = lanes_below(std::max(nr - 8, 0));
  const __m256i mask[2] = {m0, m1};
  const __m256 vbeta = _mm256_set1_ps(s.beta);
  const __m256 vlo = _mm256_set1_ps(ep.clamp_min), vhi = _mm256_set1_ps(ep.clamp_max);
  __m256 cb[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  if (s.last && ep.bias_kind == GemmBias::PerCol) {
    for (int h = 0; h < halves; ++h) {
      cb[h] = full ? _mm256_loadu_ps(ep.bias + s.col0 + 8 * h) : _mm256_maskload_ps(ep.bias + s.col0 + 8 * h, mask[h]);
    }
  }
  for (int i = 0; i < mr; ++i) {
    float* row = c + i * ldc;
    for (int h = 0; h < halves; ++h) {
      float* p = row + 8 * h;
      __m256 v = acc[i][h];
      if (!s.first || s.beta != 0.0f) {
        const __m256 old = full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask[h]);
        v = !s.first ? _mm256_add_ps(old, v) : _mm256_fmadd_ps(vbeta, old, v);
      }
      if (s.last) {
        if (ep.bias_kind == GemmBias::PerRow) {
          v = _mm256_add_ps(v, _mm256_set1_ps(ep.bias[s.row0 + i]));
        } else if (ep.bias_kind == GemmBias::PerCol) {
          v = _mm256_add_ps(v, cb[h]);
        }
        // max/min return the second operand when either is NaN: NaN in v passes through.
        if (ep.clamp) v = _mm256_min_ps(vhi, _mm256_max_ps(vlo, v));
        if (ep.post.kind != PostOp::Kind::None) v = apply8(ep.post, v);
      }
      if (full) {
        _mm256_storeu_ps(p, v);
      } else {
        _mm256_maskstore_ps(p, mask[h], v);
      }
    }
  }
}

/// Prefetches the mr rows of a C tile of NR columns (the microkernels call it before their K
/// loop: a large C, e.g. 4096 x 1280, is not in cache, and otherwise every row of the store misses).
__attribute__((target("avx2,fma"))) inline void prefetch_c_tile(const float* c, int64_t ldc, int mr) {
  for (int i = 0; i < mr; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + NR - 1), _MM_HINT_T0);
  }
}

/// AVX2+FMA microkernel for a tile at most 8 columns wide (the last panel when N % 16 is in
/// [1, 8], e.g. N = 49 at 7x7): half the FMAs of the 6 x 16 kernel; same packed layout.
__attribute__((target("avx2,fma"))) void kernel_avx2_n8(int64_t kc, const float* ap, const float* bp, float* c,
                                                        int64_t ldc, int mr, int nr, const TileStore& s) {
  prefetch_c_tile(c, ldc, mr);
  __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps();
  __m256 c3 = _mm256_setzero_ps(), c4 = _mm256_setzero_ps(), c5 = _mm256_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_loadu_ps(bp);
    c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + 0), b0, c0);
    c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + 1), b0, c1);
    c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + 2), b0, c2);
    c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + 3), b0, c3);
    c4 = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + 4), b0, c4);
    c5 = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + 5), b0, c5);
    ap += MR;
    bp += NR;
  }
  const __m256 z = _mm256_setzero_ps();
  const __m256 acc[MR][2] = {{c0, z}, {c1, z}, {c2, z}, {c3, z}, {c4, z}, {c5, z}};
  store_tile_avx2(acc, 1, c, ldc, mr, nr, s);
}

/// AVX2+FMA microkernel: a 6 x 16 tile in 12 ymm accumulators; per k: 2 loads of B,
/// 6 broadcasts of A, 12 FMAs; every 8 k, s.prefetch_lines times: a prefetch of the next line of s.prefetch.
__attribute__((target("avx2,fma"))) void kernel_avx2(int64_t kc, const float* ap, const float* bp, float* c,
                                                     int64_t ldc, int mr, int nr, const TileStore& s) {
  if (nr <= 8) {
    kernel_avx2_n8(kc, ap, bp, c, ldc, mr, nr, s);
    return;
  }
  prefetch_c_tile(c, ldc, mr);
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
  __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
  __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
  __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  // One k-step (a macro: a lambda would not inherit this function's target attribute).
#define KILN_GEMM_K_STEP \
  do { \
    const __m256 b0 = _mm256_loadu_ps(bp); \
    const __m256 b1 = _mm256_loadu_ps(bp + 8); \
    __m256 a = _mm256_broadcast_ss(ap + 0); \
    c00 = _mm256_fmadd_ps(a, b0, c00); \
    c01 = _mm256_fmadd_ps(a, b1, c01); \
    a = _mm256_broadcast_ss(ap + 1); \
    c10 = _mm256_fmadd_ps(a, b0, c10); \
    c11 = _mm256_fmadd_ps(a, b1, c11); \
    a = _mm256_broadcast_ss(ap + 2); \
    c20 = _mm256_fmadd_ps(a, b0, c20); \
    c21 = _mm256_fmadd_ps(a, b1, c21); \
    a = _mm256_broadcast_ss(ap + 3); \
    c30 = _mm256_fmadd_ps(a, b0, c30); \
    c31 = _mm256_fmadd_ps(a, b1, c31); \
    a = _mm256_broadcast_ss(ap + 4); \
    c40 = _mm256_fmadd_ps(a, b0, c40); \
    c41 = _mm256_fmadd_ps(a, b1, c41); \
    a = _mm256_broadcast_ss(ap + 5); \
    c50 = _mm256_fmadd_ps(a, b0, c50); \
    c51 = _mm256_fmadd_ps(a, b1, c51); \
    ap += MR; \
    bp += NR; \
  } while (0)

  int64_t p = 0;
  // One 64-byte line into L2 per 8 k-steps (T1 was ~3% faster than T0 here: this panel and A stay
  // in L1). set_prefetch gives at most kc / 8 lines.
  const char* pf = reinterpret_cast<const char*>(s.prefetch);
  for (int64_t line = 0; line < s.prefetch_lines; ++line, p += 8) {
    _mm_prefetch(pf + line * 64, _MM_HINT_T1);
    for (int u = 0; u < 8; ++u) KILN_GEMM_K_STEP;
  }
  for (; p < kc; ++p) KILN_GEMM_K_STEP;
#undef KILN_GEMM_K_STEP
  const __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  if (mr != MR || nr != NR) {  // partial tile: masked vector stores
    store_tile_avx2(acc, 2, c, ldc, mr, nr, s);
    return;
  }
  const GemmEpilogue& ep = *s.ep;
  const __m256 vbeta = _mm256_set1_ps(s.beta);
  const __m256 vlo = _mm256_set1_ps(ep.clamp_min), vhi = _mm256_set1_ps(ep.clamp_max);
  __m256 cb0 = _mm256_setzero_ps(), cb1 = _mm256_setzero_ps();
  if (s.last && ep.bias_kind == GemmBias::PerCol) {
    cb0 = _mm256_loadu_ps(ep.bias + s.col0);
    cb1 = _mm256_loadu_ps(ep.bias + s.col0 + 8);
  }
  for (int i = 0; i < MR; ++i) {
    float* row = c + i * ldc;
    __m256 v0 = acc[i][0], v1 = acc[i][1];
    if (!s.first) {
      v0 = _mm256_add_ps(_mm256_loadu_ps(row), v0);
      v1 = _mm256_add_ps(_mm256_loadu_ps(row + 8), v1);
    } else if (s.beta != 0.0f) {
      v0 = _mm256_fmadd_ps(vbeta, _mm256_loadu_ps(row), v0);
      v1 = _mm256_fmadd_ps(vbeta, _mm256_loadu_ps(row + 8), v1);
    }
    if (s.last) {
      if (ep.bias_kind == GemmBias::PerRow) {
        const __m256 rb = _mm256_set1_ps(ep.bias[s.row0 + i]);
        v0 = _mm256_add_ps(v0, rb);
        v1 = _mm256_add_ps(v1, rb);
      } else if (ep.bias_kind == GemmBias::PerCol) {
        v0 = _mm256_add_ps(v0, cb0);
        v1 = _mm256_add_ps(v1, cb1);
      }
      if (ep.clamp) {
        // max/min return the second operand when either is NaN: NaN in v passes through.
        v0 = _mm256_min_ps(vhi, _mm256_max_ps(vlo, v0));
        v1 = _mm256_min_ps(vhi, _mm256_max_ps(vlo, v1));
      }
      if (ep.post.kind != PostOp::Kind::None) {
        v0 = apply8(ep.post, v0);
        v1 = apply8(ep.post, v1);
      }
    }
    _mm256_storeu_ps(row, v0);
    _mm256_storeu_ps(row + 8, v1);
  }
}

using MicroKernel = void (*)(int64_t, const float*, const float*, float*, int64_t, int, int, const TileStore&);

/// Packs op(A)[i0 : i0+mc, p0 : p0+kc] * alpha into MR-row panels: panel r holds, for each p,
/// MR consecutive values (rows past mc are zero).
void pack_a(const GemmArgs& g, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* out) {
  for (int64_t ir = 0; ir < mc; ir += MR) {
    const int m = static_cast<int>(std::min<int64_t>(MR, mc - ir));
    float* dst = out + ir * kc;
    if (!g.trans_a) {
      for (int i = 0; i < m; ++i) {
        const float* src = g.A + (i0 + ir + i) * g.lda + p0;
        for (int64_t p = 0; p < kc; ++p) dst[p * MR + i] = g.alpha * src[p];
      }
      for (int i = m; i < MR; ++i) {
        for (int64_t p = 0; p < kc; ++p) dst[p * MR + i] = 0.0f;
      }
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        const float* src = g.A + (p0 + p) * g.lda + i0 + ir;
        float* d = dst + p * MR;
        int i = 0;
        for (; i < m; ++i) d[i] = g.alpha * src[i];
        for (; i < MR; ++i) d[i] = 0.0f;
      }
    }
  }
}

/// Packs op(B)[p0 : p0+kc, j0 : j0+nc] into NR-column panels: panel q holds, for each p, NR
/// consecutive values (columns past nc are zero).
void pack_b(const GemmArgs& g, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float* out) {
  if (!g.trans_b) {
    // Row by row (sequential reads of B); full panels get one 64-byte copy per row.
    const int64_t full = nc / NR * NR;
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = g.B + (p0 + p) * g.ldb + j0;
      for (int64_t jr = 0; jr < full; jr += NR) std::memcpy(out + jr / NR * panel_stride(kc) + p * NR, src + jr, sizeof(float) * NR);
      if (full < nc) {
        float* d = out + full / NR * panel_stride(kc) + p * NR;
        const int n = static_cast<int>(nc - full);
        int j = 0;
        for (; j < n; ++j) d[j] = src[full + j];
        for (; j < NR; ++j) d[j] = 0.0f;
      }
    }
    return;
  }
  for (int64_t jr = 0; jr < nc; jr += NR) {
    const int n = static_cast<int>(std::min<int64_t>(NR, nc - jr));
    float* dst = out + jr / NR * panel_stride(kc);
    for (int j = 0; j < n; ++j) {
      const float* src = g.B + (j0 + jr + j) * g.ldb + p0;
      for (int64_t p = 0; p < kc; ++p) dst[p * NR + j] = src[p];
    }
    for (int j = n; j < NR; ++j) {
      for (int64_t p = 0; p < kc; ++p) dst[p * NR + j] = 0.0f;
    }
  }
}

/// pack_a for row-major A (no transpose) with AVX2: 8 k-steps of a 6-row panel per 8x8
/// transpose (rows 6, 7 are dummies). Each 8-float store overlaps the next one's first 2 floats
/// (overwritten by it); nothing is written past the panel. Same result as pack_a.
__attribute__((target("avx2,fma"))) void pack_a_avx2(const GemmArgs& g, int64_t i0, int64_t mc, int64_t p0,
                                                     int64_t kc, float* out) {
  const __m256 valpha = _mm256_set1_ps(g.alpha);
  const bool scale = g.alpha != 1.0f;
  for (int64_t ir = 0; ir < mc; ir += MR) {
    const int m = static_cast<int>(std::min<int64_t>(MR, mc - ir));
    float* dst = out + ir * kc;
    const float* src[MR];
    for (int i = 0; i < MR; ++i) src[i] = g.A + (i0 + ir + std::min(i, m - 1)) * g.lda + p0;
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8) {
      __m256 r[8];
      for (int i = 0; i < MR; ++i) {
        r[i] = i < m ? _mm256_loadu_ps(src[i] + p) : _mm256_setzero_ps();
        if (scale) r[i] = _mm256_mul_ps(r[i], valpha);
      }
      r[6] = _mm256_setzero_ps();
      r[7] = _mm256_setzero_ps();
      cpu::transpose8x8(r);
      for (int k = 0; k < 7; ++k) _mm256_storeu_ps(dst + (p + k) * MR, r[k]);
      // The 8th store covers the next k's first 2 floats, or the 2 floats after the panel: the
      // panel's last k stores its 6 floats alone, so that panels may be packed in any order.
      if (p + 8 < kc) {
        _mm256_storeu_ps(dst + (p + 7) * MR, r[7]);
      } else {
        _mm256_maskstore_ps(dst + (p + 7) * MR, lanes_below(MR), r[7]);
      }
    }
    for (; p < kc; ++p) {
      for (int i = 0; i < MR; ++i) dst[p * MR + i] = i < m ? g.alpha * src[i][p] : 0.0f;
    }
  }
}

/// pack_b for transposed B (rows of B are columns of op(B)) with AVX2: 8 x 8 transposes.
__attribute__((target("avx2,fma"))) void pack_b_trans_avx2(const GemmArgs& g, int64_t j0, int64_t nc, int64_t p0,
                                                           int64_t kc, float* out) {
  for (int64_t jr = 0; jr < nc; jr += NR) {
    const int n = static_cast<int>(std::min<int64_t>(NR, nc - jr));
    float* dst = out + jr / NR * panel_stride(kc);
    for (int half = 0; half < 2; ++half) {
      const float* src[8];
      int valid = 0;
      for (int j = 0; j < 8; ++j) {
        const int col = half * 8 + j;
        if (col < n) ++valid;
        src[j] = g.B + (j0 + jr + std::min(col, n - 1)) * g.ldb + p0;
      }
      int64_t p = 0;
      for (; p + 8 <= kc; p += 8) {
        __m256 r[8];
        for (int j = 0; j < 8; ++j) r[j] = j < valid ? _mm256_loadu_ps(src[j] + p) : _mm256_setzero_ps();
        cpu::transpose8x8(r);
        for (int k = 0; k < 8; ++k) _mm256_storeu_ps(dst + (p + k) * NR + half * 8, r[k]);
      }
      for (; p < kc; ++p) {
        for (int j = 0; j < 8; ++j) dst[p * NR + half * 8 + j] = j < valid ? src[j][p] : 0.0f;
      }
    }
  }
}

/// Per-thread packing buffers, bounded by the block sizes (MC*KC + KC*NC floats + padding, ~1.2 MiB),
/// 64-byte aligned.
struct PackBuffers {
  std::vector<float> storage;
  float* a = nullptr;
  float* b = nullptr;
  void ensure() {
    if (a != nullptr) return;
    const size_t na = static_cast<size_t>(MC * KC), nb = static_cast<size_t>(NC / NR * panel_stride(KC));
    storage.resize(na + 16 + nb + 16 + 16);
    auto addr = reinterpret_cast<uintptr_t>(storage.data());
    a = reinterpret_cast<float*>((addr + 63) & ~uintptr_t{63});
    b = a + na + 16;  // 16 floats of slack after each block (pack_a_avx2 overshoots by 2); 64-byte aligned
  }
};

PackBuffers& pack_buffers() {
  thread_local PackBuffers buf;
  buf.ensure();
  return buf;
}

/// C[m0:m1, n0:n1] on the calling thread.
void gemm_rect(const GemmArgs& g, MicroKernel kernel, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  PackBuffers& buf = pack_buffers();
  const bool avx2 = kernel == kernel_avx2;
  for (int64_t jc = n0; jc < n1; jc += NC) {
    const int64_t nc = std::min(NC, n1 - jc);
    for (int64_t pc = 0; pc < g.K; pc += KC) {
      const int64_t kc = std::min(KC, g.K - pc);
      const float* b_block = buf.b;
      if (g.packed_b != nullptr) {  // jc is a whole number of panels (gemm_blocked splits N in panels)
        b_block = g.packed_b + pc / KC * ((g.N + NR - 1) / NR) * panel_stride(KC) + jc / NR * panel_stride(kc);
      } else if (g.packer != nullptr) {
        g.packer->fn(g.packer->ctx, jc, nc, pc, kc, buf.b);
      } else if (avx2 && g.trans_b) {
        pack_b_trans_avx2(g, jc, nc, pc, kc, buf.b);
      } else {
        pack_b(g, jc, nc, pc, kc, buf.b);
      }
      TileStore s{g.beta, pc == 0, pc + kc >= g.K, 0, 0, g.ep};
      // The panel after this block's last one, for prefetching prepacked B: the next K block's
      // panel at jc (of next_kc rows).
      const float* after_block = nullptr;
      const int64_t next_kc = std::min(KC, g.K - pc - KC);
      if (g.packed_b != nullptr && pc + KC < g.K) {
        after_block = g.packed_b + (pc / KC + 1) * ((g.N + NR - 1) / NR) * panel_stride(KC) + jc / NR * panel_stride(next_kc);
      }
      for (int64_t ic = m0; ic < m1; ic += MC) {
        const int64_t mc = std::min(MC, m1 - ic);
        const float* a_block = buf.a;
        if (g.packed_a != nullptr) {
          a_block = g.packed_a + pc * padded_m(g.M) + ic * kc;
        } else if (avx2 && !g.trans_a) {
          pack_a_avx2(g, ic, mc, pc, kc, buf.a);
        } else {
          pack_a(g, ic, mc, pc, kc, buf.a);
        }
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const int nr = static_cast<int>(std::min<int64_t>(NR, nc - jr));
          const float* bp = b_block + jr / NR * panel_stride(kc);
          const bool in_block = jr + NR < nc;
          const float* next = g.packed_b == nullptr ? nullptr : in_block ? bp + panel_stride(kc) : after_block;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const int mr = static_cast<int>(std::min<int64_t>(MR, mc - ir));
            s.row0 = ic + ir;
            s.col0 = jc + jr;
            set_prefetch(s, next, in_block ? kc : next_kc, kc, ir / MR);
            kernel(kc, a_block + ir * kc, bp, g.C + (ic + ir) * g.ldc + jc + jr, g.ldc, mr, nr, s);
          }
        }
      }
    }
  }
}

/// Epilogue on one value of C given the product value `acc` (K == 0 and the M == 1 path).
inline float finish(const GemmArgs& g, float acc, float cold, int64_t i, int64_t j) {
  float v = acc;
  if (g.beta != 0.0f) v += g.beta * cold;
  const GemmEpilogue& ep = *g.ep;
  if (ep.bias_kind == GemmBias::PerRow) v += ep.bias[i];
  if (ep.bias_kind == GemmBias::PerCol) v += ep.bias[j];
  if (ep.clamp) {
    v = v < ep.clamp_min ? ep.clamp_min : v;
    v = v > ep.clamp_max ? ep.clamp_max : v;
  }
  if (ep.post.kind != PostOp::Kind::None) v = apply1(ep.post, v);
  return v;
}

/// A matrix-vector product (M == 1 or N == 1; memory-bound, no packing). The result vector r
/// (r[t] for t in [0, len)) is C's row 0 (M == 1) or column 0 (N == 1):
///   rows:   r[t] = sum_p mat[t * ld + p] * v[p]   (dot with a contiguous row of mat)
///   !rows:  r[t] = sum_p v[p] * mat[p * ld + t]   (columns of mat, accumulated over its rows)
struct Gemv {
  const float* mat;
  int64_t ld;
  bool rows;
  const float* v;  // [K], contiguous
  bool m_is_one;   // r is row 0 of C (else column 0)
};

inline void gemv_store(const GemmArgs& g, const Gemv& j, int64_t t, float acc) {
  float* c = j.m_is_one ? g.C + t : g.C + t * g.ldc;
  *c = finish(g, g.alpha * acc, g.beta != 0.0f ? *c : 0.0f, j.m_is_one ? 0 : t, j.m_is_one ? t : 0);
}

void gemv_generic(const GemmArgs& g, const Gemv& j, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    float acc = 0.0f;
    for (int64_t p = 0; p < g.K; ++p) acc += j.v[p] * (j.rows ? j.mat[t * j.ld + p] : j.mat[p * j.ld + t]);
    gemv_store(g, j, t, acc);
  }
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) void gemv_avx2(const GemmArgs& g, const Gemv& j, int64_t t0, int64_t t1) {
  const int64_t K = g.K;
  const float* v = j.v;
  if (j.rows) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* b = j.mat + t * j.ld;
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
      int64_t p = 0;
      for (; p + 16 <= K; p += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(v + p), _mm256_loadu_ps(b + p), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(v + p + 8), _mm256_loadu_ps(b + p + 8), s1);
      }
      float acc = hsum(_mm256_add_ps(s0, s1));
      for (; p < K; ++p) acc += v[p] * b[p];
      gemv_store(g, j, t, acc);
    }
    return;
  }
  int64_t t = t0;
  for (; t + 32 <= t1; t += 32) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    for (int64_t p = 0; p < K; ++p) {
      const __m256 av = _mm256_broadcast_ss(v + p);
      const float* b = j.mat + p * j.ld + t;
      s0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b), s0);
      s1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b + 8), s1);
      s2 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b + 16), s2);
      s3 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b + 24), s3);
    }
    alignas(32) float r[32];
    _mm256_store_ps(r, s0);
    _mm256_store_ps(r + 8, s1);
    _mm256_store_ps(r + 16, s2);
    _mm256_store_ps(r + 24, s3);
    for (int q = 0; q < 32; ++q) gemv_store(g, j, t + q, r[q]);
  }
  for (; t < t1; ++t) {
    float acc = 0.0f;
    for (int64_t p = 0; p < K; ++p) acc += v[p] * j.mat[p * j.ld + t];
    gemv_store(g, j, t, acc);
  }
}

/// M == 1 or N == 1: C's row (column) as a matrix-vector product; parallel over its length.
void gemv(const GemmArgs& g, bool avx2, bool parallel, ThreadPool* pool) {
  const bool m_is_one = g.M == 1;
  std::vector<float> gathered;
  auto contiguous = [&](const float* base, int64_t stride) {
    if (stride == 1 || g.K == 1) return base;
    gathered.resize(static_cast<size_t>(g.K));
    for (int64_t p = 0; p < g.K; ++p) gathered[static_cast<size_t>(p)] = base[p * stride];
    return static_cast<const float*>(gathered.data());
  };
  Gemv j;
  j.m_is_one = m_is_one;
  int64_t len;
  if (m_is_one) {  // v = op(A) row 0; r[t] = op(B) column t . v
    j.v = g.trans_a ? contiguous(g.A, g.lda) : g.A;
    j.mat = g.B;
    j.ld = g.ldb;
    j.rows = g.trans_b;
    len = g.N;
  } else {  // v = op(B) column 0; r[t] = op(A) row t . v
    j.v = g.trans_b ? g.B : contiguous(g.B, g.ldb);
    j.mat = g.A;
    j.ld = g.lda;
    j.rows = !g.trans_a;
    len = g.M;
  }
  auto run = [&](int64_t t0, int64_t t1) { avx2 ? gemv_avx2(g, j, t0, t1) : gemv_generic(g, j, t0, t1); };
  if (!parallel) {
    run(0, len);
    return;
  }
  const int64_t threads = pool->num_threads();
  int64_t parts = std::min<int64_t>(4 * threads, (len + 63) / 64);
  if (parts > threads) parts = parts / threads * threads;  // a whole number of parts per thread
  const int64_t per = (len + parts - 1) / parts;
  parallel_tasks(pool, parts, [&](int64_t t) { run(std::min(len, t * per), std::min(len, (t + 1) * per)); });
}

bool detect_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

std::atomic<bool> g_force_portable{false};

}  // namespace

bool has_avx2_fma() {
  static const bool yes = detect_avx2_fma();
  return yes;
}

void force_portable_sgemm_for_testing(bool on) { g_force_portable.store(on); }

namespace {

/// The AVX2 code paths of sgemm are used (CPU support, not disabled for a test).
bool use_avx2() { return has_avx2_fma() && !g_force_portable.load(std::memory_order_relaxed); }

/// Packs all of op(A) [M, K] * alpha in the pack_a_for_gemm layout (K block pc at
/// pc * padded_m(M), its MR-row panels kc * MR floats apart); `out` holds padded_m(M) * K + 16
/// floats. The K blocks are spread over `pool` (may be null).
void pack_a_whole(const GemmArgs& g, float* out, ThreadPool* pool) {
  parallel_tasks(pool, (g.K + KC - 1) / KC, [&](int64_t q) {
    const int64_t pc = q * KC, kc = std::min(KC, g.K - pc);
    if (has_avx2_fma() && !g.trans_a) {
      pack_a_avx2(g, 0, g.M, pc, kc, out + pc * padded_m(g.M));
    } else {
      pack_a(g, 0, g.M, pc, kc, out + pc * padded_m(g.M));
    }
  });
}

/// Packs all of op(B) [K, N] of `g` (its packer, or B transposed or not) in the
/// prepacked_b_floats layout, the (K block, NC-column block) pieces spread over `pool` (may be null).
void pack_b_whole(const GemmArgs& g, float* out, ThreadPool* pool) {
  const int64_t npanels = (g.N + NR - 1) / NR, kblocks = (g.K + KC - 1) / KC, nblocks = (g.N + NC - 1) / NC;
  parallel_tasks(pool, kblocks * nblocks, [&](int64_t t) {
    const int64_t pc = t / nblocks * KC, jc = t % nblocks * NC;
    const int64_t kc = std::min(KC, g.K - pc), nc = std::min(NC, g.N - jc);
    float* d = out + pc / KC * npanels * panel_stride(KC) + jc / NR * panel_stride(kc);
    if (g.packer != nullptr) {
      g.packer->fn(g.packer->ctx, jc, nc, pc, kc, d);
    } else if (g.trans_b && has_avx2_fma()) {
      pack_b_trans_avx2(g, jc, nc, pc, kc, d);
    } else {
      pack_b(g, jc, nc, pc, kc, d);
    }
  });
}

/// Largest operand (floats) that a parallel product packs once for all its parts (the calling
/// thread's buffers, kept for its next products) instead of once per part: op(A) when split along
/// N (1 Mi floats = 4 MiB), op(B) when split along M (4 Mi floats = 16 MiB).
constexpr int64_t kSharedPackAMaxFloats = int64_t{1} << 20;
constexpr int64_t kSharedPackBMaxFloats = int64_t{1} << 22;

/// The blocked product over all of C, split over the pool (shared by sgemm and sgemm_packed_b).
void gemm_blocked(const GemmArgs& g, bool parallel, ThreadPool* pool) {
  const MicroKernel kernel = use_avx2() ? kernel_avx2 : kernel_generic;
  const int64_t M = g.M, N = g.N;
  if (!parallel) {
    gemm_rect(g, kernel, 0, M, 0, N);
    return;
  }
  // Rectangles along the larger dimension, in whole micro-tiles, claimed dynamically, up to 4 per
  // thread. The operand every part would otherwise pack in full (A when split along N, B when
  // split along M) is packed once here, with all threads, when it is not already packed and
  // fits the shared buffer (for a 77-row text-encoder layer on 2 threads: 8 packs of A per call
  // down to 1; for a 3x3 convolution on a 14x14 plane: the im2col gather once instead of per
  // thread). When it does not fit, a split along M keeps one part per thread.
  const bool split_n = N >= M;
  GemmArgs gs = g;
  bool shared = false;
  if (split_n) {
    shared = g.packed_a == nullptr && packed_a_floats(M, g.K) <= kSharedPackAMaxFloats;
    if (shared) {
      thread_local std::vector<float> buf_a;
      buf_a.resize(static_cast<size_t>(packed_a_floats(M, g.K)));
      pack_a_whole(g, buf_a.data(), pool);
      gs.packed_a = buf_a.data();
    }
  } else {
    shared = g.packed_b == nullptr && prepacked_b_floats(N, g.K) <= kSharedPackBMaxFloats;
    if (shared) {
      thread_local std::vector<float> buf_b;
      buf_b.resize(static_cast<size_t>(prepacked_b_floats(N, g.K)));
      pack_b_whole(g, buf_b.data(), pool);
      gs.packed_b = buf_b.data();
    }
  }
  const bool cheap_parts = split_n || shared || g.packed_b != nullptr;
  const int64_t unit = split_n ? NR : MR;
  const int64_t dim = split_n ? N : M;
  const int64_t units = (dim + unit - 1) / unit;
  const int64_t threads = pool->num_threads();
  // A whole number of parts per thread: 3 parts of 13 panels on 2 threads would leave one thread
  // 2 parts (10 panels) and the other 1.
  const int64_t want = cheap_parts ? std::clamp<int64_t>(units / 4, threads, 4 * threads) / threads * threads : threads;
  const int64_t parts = std::min(want, units);
  if (parts <= 1) {
    gemm_rect(gs, kernel, 0, M, 0, N);
    return;
  }
  const int64_t per = (units + parts - 1) / parts;  // units per part
  parallel_tasks(pool, parts, [&](int64_t t) {
    const int64_t lo = std::min(dim, t * per * unit);
    const int64_t hi = std::min(dim, (t + 1) * per * unit);
    if (lo >= hi) return;
    if (split_n) {
      gemm_rect(gs, kernel, 0, M, lo, hi);
    } else {
      gemm_rect(gs, kernel, lo, hi, 0, N);
    }
  });
}

/// C = beta * C + bias, clamped (K == 0).
void gemm_k0(const GemmArgs& g) {
  for (int64_t i = 0; i < g.M; ++i) {
    for (int64_t j = 0; j < g.N; ++j) {
      float* c = g.C + i * g.ldc + j;
      *c = finish(g, 0.0f, g.beta != 0.0f ? *c : 0.0f, i, j);
    }
  }
}

/// Whether to use the pool: waking a sleeping pool thread costs tens of microseconds here, so
/// products below ~4 MFLOP (~50 us on one core) run on the caller; matrix-vector products
/// (memory-bound, ~4x slower per FLOP: a squeeze-excite 1x1 convolution of 240 x 960 weights
/// takes ~0.1 ms on one core) from 0.25 MFLOP.
bool use_pool(ThreadPool* pool, int64_t M, int64_t N, int64_t K) {
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const double min_flops = (M == 1 || N == 1) ? 2.5e5 : 4e6;
  return pool != nullptr && pool->num_threads() > 1 && flops >= min_flops;
}

}  // namespace

int64_t packed_a_floats(int64_t M, int64_t K) { return padded_m(M) * K + 16; }

void pack_a_for_gemm(int64_t M, int64_t K, const float* A, int64_t lda, float* out) {
  const GemmArgs g{false, false, M, 0, K, 1.0f, A, lda, nullptr, 0, 0.0f, nullptr, 0, nullptr};
  pack_a_whole(g, out, nullptr);
}

static_assert(KC == kGemmKBlock, "gemm.h documents the K block of packed operands");

void pack_b_for_gemm(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb, float* out) {
  const GemmArgs g{false, trans_b, 0, N, K, 1.0f, nullptr, 0, B, ldb, 0.0f, nullptr, 0, nullptr};
  pack_b_whole(g, out, nullptr);
}

void sgemm_prepacked(int64_t M, int64_t N, int64_t K, const float* packed_a, const float* packed_b, float* C,
                     int64_t ldc, const GemmEpilogue& ep) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  const MicroKernel kernel = use_avx2() ? kernel_avx2 : kernel_generic;
  const int64_t npanels = (N + NR - 1) / NR;
  for (int64_t pc = 0; pc < K; pc += KC) {
    const int64_t kc = std::min(KC, K - pc);
    const float* b_block = packed_b + pc / KC * npanels * panel_stride(KC);
    const float* a_block = packed_a + pc * padded_m(M);
    TileStore s{0.0f, pc == 0, pc + kc >= K, 0, 0, &ep};
    for (int64_t jr = 0; jr < N; jr += NR) {
      const int nr = static_cast<int>(std::min<int64_t>(NR, N - jr));
      const float* bp = b_block + jr / NR * panel_stride(kc);
      for (int64_t ir = 0; ir < M; ir += MR) {
        const int mr = static_cast<int>(std::min<int64_t>(MR, M - ir));
        s.row0 = ir;
        s.col0 = jr;
        kernel(kc, a_block + ir * kc, bp, C + ir * ldc + jr, ldc, mr, nr, s);
      }
    }
  }
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const GemmEpilogue& ep, ThreadPool* pool,
           const float* packed_a, const float* packed_b) {
  if (M <= 0 || N <= 0) return;
  GemmArgs g{trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, &ep};
  g.packed_a = packed_a;
  g.packed_b = packed_b;
  if (K <= 0) {
    gemm_k0(g);
    return;
  }
  const bool parallel = use_pool(pool, M, N, K);
  if (M == 1 || N == 1) {
    gemv(g, use_avx2(), parallel, pool);
    return;
  }
  gemm_blocked(g, parallel, pool);
}

void sgemm_packed_b(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const GemmBPacker& b,
                    float beta, float* C, int64_t ldc, const GemmEpilogue& ep, ThreadPool* pool,
                    const float* packed_a) {
  if (M <= 0 || N <= 0) return;
  GemmArgs g{false, false, M, N, K, alpha, A, lda, nullptr, 0, beta, C, ldc, &ep};
  g.packer = &b;
  g.packed_a = packed_a;
  if (K <= 0) {
    gemm_k0(g);
    return;
  }
  gemm_blocked(g, use_pool(pool, M, N, K), pool);
}

}  // namespace kiln::cpu

// Optimized cpu kernels for aten.scaled_dot_product_attention and kiln.sdpa_kv_cache (float32,
// the latter below): fused and tiled with an online softmax (the FlashAttention scheme: Dao et al.
// 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness",
// Algorithm 1), so the L x S score matrix is never materialized: each task takes kBlockQ query
// rows of one batch/head and streams the keys and values in blocks of kBlockK, keeping per row the
// running max m, the running denominator l and an unnormalized output row O:
//   s_j = scale * q.k_j + mask_j (-inf where a bool mask is False or j > i under is_causal)
//   m' = max(m, max_j s_j);  p_j = e^(s_j - m');  l = l e^(m - m') + sum_j p_j;
//   O = O e^(m - m') + sum_j p_j v_j;  out = O / l.
// A row whose scores are all -inf (fully masked) gives 0, as PyTorch eager does (_safe_softmax),
// and as the portable kernel (src/kernels/portable/norm.cpp) does.
//
// q.k^T and p.V run as register-tiled AVX2/FMA micro-kernels (6 rows x 16 columns) on a packed
// K^T block (and a packed, zero-padded V block when Ev is not a multiple of 8); scores and sums
// are float32 (the portable kernel uses double), e^x is cpu::exp8. Scratch is thread_local,
// (E + Ev') * kBlockK + kBlockQ * (kBlockK + Ev') floats (Ev' = Ev rounded up to 8), so bounded by
// the block sizes and head dims (never by L or S), and reused across calls.
// Tasks (batch*heads x query blocks) are handed out dynamically to the pool's threads, so causal
// attention (later query blocks see more keys) stays balanced.
//
// Broadcasting follows the op definition (src/ir/ops/norm.cpp): batch dims of q/k/v broadcast as
// in torch.matmul; enable_gqa repeats key/value heads (repeat_interleave); attn_mask (bool or
// float32) broadcasts to [..., L, S].
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernel.h"
#include "kernels/portable/llm.h"

namespace kiln {

#if KILN_CPU_AVX2_KERNELS
namespace {

using cpu::exp8;
using cpu::load_tail;
using cpu::store_tail;

constexpr int64_t kBlockQ = 128;   ///< query rows per task
constexpr int64_t kBlockK = 128;  ///< keys per streamed block
constexpr int kMR = 6;            ///< micro-kernel rows
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/// Element offset of operand `sizes` ([batch..., rows, cols]) for every flat index over the
/// output batch dims `out_batch`: broadcast dims (size 1) repeat; with gqa the head dim (last
/// batch dim) is indexed by out_head / (out_heads / heads) (repeat_interleave).
std::vector<int64_t> batch_offsets(const std::vector<int64_t>& sizes, const std::vector<int64_t>& out_batch, bool gqa) {
  const size_t ob = out_batch.size();
  const size_t rank = sizes.size() - 2;
  std::vector<int64_t> stride(ob, 0), div(ob, 1);
  int64_t s = sizes.end()[-2] * sizes.back();
  for (size_t k = 0; k < rank; ++k) {
    const size_t i = rank - 1 - k, o = ob - 1 - k;
    if (sizes[i] != 1) {
      stride[o] = s;
      if (gqa && k == 0 && sizes[i] != out_batch[o]) div[o] = out_batch[o] / sizes[i];
    }
    s *= sizes[i];
  }
  const int64_t nb = numel_of(out_batch);
  std::vector<int64_t> off(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) {
    int64_t flat = b, o = 0;
    for (size_t d = ob; d-- > 0;) {
      o += (flat % out_batch[d]) / div[d] * stride[d];
      flat /= out_batch[d];
    }
    off[static_cast<size_t>(b)] = o;
  }
  return off;
}

/// Where the mask element of (batch b, query i, key j) lives: base[b] + i * si + j * sj.
struct MaskLayout {
  std::vector<int64_t> base;
  int64_t si = 0, sj = 0;
};

MaskLayout mask_layout(const std::vector<int64_t>& msizes, const std::vector<int64_t>& out_batch) {
  const size_t R = out_batch.size() + 2, mr = msizes.size();
  std::vector<int64_t> stride(R, 0);
  int64_t s = 1;
  for (size_t k = 0; k < mr; ++k) {
    const size_t md = mr - 1 - k, d = R - 1 - k;
    if (msizes[md] != 1) stride[d] = s;
    s *= msizes[md];
  }
  MaskLayout m;
  m.si = stride[R - 2];
  m.sj = stride[R - 1];
  const int64_t nb = numel_of(out_batch);
  m.base.resize(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) {
    int64_t flat = b, o = 0;
    for (size_t d = out_batch.size(); d-- > 0;) {
      o += (flat % out_batch[d]) * stride[d];
      flat /= out_batch[d];
    }
    m.base[static_cast<size_t>(b)] = o;
  }
  return m;
}

/// s[r][c] = sum_e q[r][e] * kt[e][c] for r < MR, c < 16 (kt: packed K^T block, row stride ldk).
template <int MR>
KILN_AVX2 void qk_tile(const float* q, int64_t ldq, const float* kt, int64_t ldk, int64_t E, float* s, int64_t lds) {
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t e = 0; e < E; ++e) {
    const __m256 k0 = _mm256_loadu_ps(kt + e * ldk);
    const __m256 k1 = _mm256_loadu_ps(kt + e * ldk + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 qb = _mm256_broadcast_ss(q + r * ldq + e);
      acc[r][0] = _mm256_fmadd_ps(qb, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(qb, k1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(s + r * lds, acc[r][0]);
    _mm256_storeu_ps(s + r * lds + 8, acc[r][1]);
  }
}

/// o[r][c] += sum_j p[r][j] * v[j][c] for r < MR, c < 8 * NV, j < n.
template <int MR, int NV>
KILN_AVX2 void pv_tile(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t n, float* o, int64_t ldo) {
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_loadu_ps(o + r * ldo + 8 * c);
  }
#pragma GCC unroll 4
  for (int64_t j = 0; j < n; ++j) {
    __m256 vv[NV];
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) vv[c] = _mm256_loadu_ps(v + j * ldv + 8 * c);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 pb = _mm256_broadcast_ss(p + r * ldp + j);
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_fmadd_ps(pb, vv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) _mm256_storeu_ps(o + r * ldo + 8 * c, acc[r][c]);
  }
}

template <int MR>
KILN_AVX2 void pv_rows(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t n, int64_t evp, float* o,
                       int64_t ldo) {
  int64_t c = 0;
  for (; c + 16 <= evp; c += 16) pv_tile<MR, 2>(p, ldp, v + c, ldv, n, o + c, ldo);
  if (c < evp) pv_tile<MR, 1>(p, ldp, v + c, ldv, n, o + c, ldo);
}

/// Dispatches a tile of `rows` (1..kMR) rows to the micro-kernel instantiated for it.
template <template <int> class F, class... Args>
KILN_AVX2 void by_rows(int64_t rows, Args... args) {
  switch (rows) {
    case 6: F<6>::run(args...); break;
    case 5: F<5>::run(args...); break;
    case 4: F<4>::run(args...); break;
    case 3: F<3>::run(args...); break;
    case 2: F<2>::run(args...); break;
    default: F<1>::run(args...); break;
  }
}
template <int MR>
struct QK {
  KILN_AVX2 static void run(const float* q, int64_t ldq, const float* kt, int64_t ldk, int64_t E, float* s, int64_t lds) {
    qk_tile<MR>(q, ldq, kt, ldk, E, s, lds);
  }
};
template <int MR>
struct PV {
  KILN_AVX2 static void run(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t n, int64_t evp, float* o,
                            int64_t ldo) {
    pv_rows<MR>(p, ldp, v, ldv, n, evp, o, ldo);
  }
};

/// kt[e][c] = k[c][e] for c < n, e < E (k: n rows of E floats), zero for n <= c < npad.
/// Full 8 x 8 tiles are transposed in registers (unpack / shuffle / permute2f128).
KILN_AVX2 void pack_kt(const float* k, int64_t E, int64_t n, int64_t npad, float* kt, int64_t ldk) {
  const int64_t n8 = n / 8 * 8, e8 = E / 8 * 8;
  for (int64_t c = 0; c < n8; c += 8) {
    for (int64_t e = 0; e < e8; e += 8) {
      const float* src = k + c * E + e;
      const __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + E), r2 = _mm256_loadu_ps(src + 2 * E),
                   r3 = _mm256_loadu_ps(src + 3 * E), r4 = _mm256_loadu_ps(src + 4 * E), r5 = _mm256_loadu_ps(src + 5 * E),
                   r6 = _mm256_loadu_ps(src + 6 * E), r7 = _mm256_loadu_ps(src + 7 * E);
      const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
      const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
      const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
      const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
      const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* dst = kt + e * ldk + c;
      _mm256_storeu_ps(dst, _mm256_permute2f128_ps(s0, s4, 0x20));
      _mm256_storeu_ps(dst + ldk, _mm256_permute2f128_ps(s1, s5, 0x20));
      _mm256_storeu_ps(dst + 2 * ldk, _mm256_permute2f128_ps(s2, s6, 0x20));
      _mm256_storeu_ps(dst + 3 * ldk, _mm256_permute2f128_ps(s3, s7, 0x20));
      _mm256_storeu_ps(dst + 4 * ldk, _mm256_permute2f128_ps(s0, s4, 0x31));
      _mm256_storeu_ps(dst + 5 * ldk, _mm256_permute2f128_ps(s1, s5, 0x31));
      _mm256_storeu_ps(dst + 6 * ldk, _mm256_permute2f128_ps(s2, s6, 0x31));
      _mm256_storeu_ps(dst + 7 * ldk, _mm256_permute2f128_ps(s3, s7, 0x31));
    }
    for (int64_t e = e8; e < E; ++e) {
      for (int64_t r = 0; r < 8; ++r) kt[e * ldk + c + r] = k[(c + r) * E + e];
    }
  }
  for (int64_t c = n8; c < n; ++c) {
    for (int64_t e = 0; e < E; ++e) kt[e * ldk + c] = k[c * E + e];
  }
  for (int64_t e = 0; e < E; ++e) std::fill(kt + e * ldk + n, kt + e * ldk + npad, 0.0f);
}

/// Everything one call needs, shared read-only by the tasks.
struct Problem {
  const float *q, *k, *v;
  float* out;
  const bool* mask_b = nullptr;
  const float* mask_f = nullptr;
  MaskLayout mask;
  std::vector<int64_t> qo, ko, vo;
  int64_t L, S, E, Ev, nb, nqb;
  float scale;
  bool causal;
};

/// Per-thread scratch: packed K^T block, packed V block, scores, output accumulators, m, l.
struct Scratch {
  std::vector<float> buf;
  float *kt, *vp, *s, *o, *m, *l;
  int64_t ldk, ldv_pad, lds, ldo;
  bool prepare(const Problem& P) { return prepare(P.E, P.Ev); }
  bool prepare(int64_t E, int64_t Ev) {
    ldk = kBlockK;              // K^T row stride (columns padded with zeros)
    ldv_pad = round_up(Ev, 8);  // packed V / O row stride
    lds = kBlockK;
    ldo = ldv_pad;
    const size_t need = static_cast<size_t>(E * ldk + kBlockK * ldv_pad + kBlockQ * lds + kBlockQ * ldo + 2 * kBlockQ);
    try {
      if (buf.size() < need) buf.resize(need);
    } catch (const std::bad_alloc&) {
      return false;
    }
    kt = buf.data();
    vp = kt + E * ldk;
    s = vp + kBlockK * ldv_pad;
    o = s + kBlockQ * lds;
    m = o + kBlockQ * ldo;
    l = m + kBlockQ;
    return true;
  }
};

/// Scales row `i`'s raw scores s[0..n) (keys j0..j0+n) and applies the mask / causal limit.
KILN_AVX2 void mask_scores(const Problem& P, int64_t b, int64_t i, int64_t j0, float* s, int64_t n) {
  const float scale = P.scale;
  if (P.mask_f != nullptr) {
    const float* mrow = P.mask_f + P.mask.base[static_cast<size_t>(b)] + i * P.mask.si + j0 * P.mask.sj;
    if (P.mask.sj == 1) {
      for (int64_t j = 0; j < n; ++j) s[j] = s[j] * scale + mrow[j];
    } else {
      const float mv = mrow[0];
      for (int64_t j = 0; j < n; ++j) s[j] = s[j] * scale + mv;
    }
  } else if (P.mask_b != nullptr) {
    const bool* mrow = P.mask_b + P.mask.base[static_cast<size_t>(b)] + i * P.mask.si + j0 * P.mask.sj;
    const int64_t sj = P.mask.sj;
    for (int64_t j = 0; j < n; ++j) s[j] = mrow[j * sj] ? s[j] * scale : kNegInf;
  } else {
    for (int64_t j = 0; j < n; ++j) s[j] *= scale;
  }
  if (P.causal) {
    for (int64_t j = std::max<int64_t>(0, i + 1 - j0); j < n; ++j) s[j] = kNegInf;
  }
}

/// Online-softmax update of one row: turns scores s[0..n) times `scale` into p = e^(scale s - m'),
/// updates m and l, and returns the factor e^(m - m') the row's accumulator must be scaled by.
/// scale > 0 (scores not yet scaled: scaling is monotonic, so the maximum of the scaled scores
/// is the scaled maximum, and the scaling rides in the exponent's FMA) or exactly 1 (mask_scores
/// already scaled them).
KILN_AVX2 float softmax_update(float* s, int64_t n, float scale, float& m, float& l) {
  // The maximum, NaN-aware: a NaN score makes the row's maximum NaN, so that the row's output is
  // NaN as in eager (max_ps alone drops NaN, and an all-NaN row would look fully masked).
  __m256 mx = _mm256_set1_ps(kNegInf), nan = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(s + j);
    mx = _mm256_max_ps(mx, v);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  float bm = cpu::hmax(mx);
  bool has_nan = _mm256_movemask_ps(nan) != 0;
  for (; j < n; ++j) {
    bm = std::max(bm, s[j]);
    has_nan = has_nan || std::isnan(s[j]);
  }
  // Once NaN, the row's maximum stays NaN over later blocks (std::max would drop it).
  const float m_new = has_nan || std::isnan(m) ? std::numeric_limits<float>::quiet_NaN() : std::max(m, bm * scale);
  if (m_new == kNegInf) {  // every score so far is -inf: nothing to add
    std::fill(s, s + n, 0.0f);
    return 1.0f;
  }
  // Scaled scores minus their maximum, for exp8_nonpos: the scaled score is rounded on its own
  // (as m' = scale * max s was, and as eager scales before its softmax), then m' subtracted, so the
  // row's maximum gives exactly 0 and no difference is positive (rounding is monotonic). One FMA
  // would be off by up to half an ulp of m' (128 at 2.7e9): enough to push a whole row below
  // exp's range. scaled() keeps the compiler from contracting the two into an FMA.
  const __m256 vm = _mm256_set1_ps(m_new), vs = _mm256_set1_ps(scale);
  auto scaled = [&](__m256 v) KILN_AVX2 {
    __m256 t = _mm256_mul_ps(v, vs);
    asm("" : "+x"(t));  // opaque: no mul + sub -> fmsub contraction (-ffp-contract=fast)
    return _mm256_sub_ps(t, vm);
  };
  __m256 sum = _mm256_setzero_ps();
  j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 p = cpu::exp8_nonpos(scaled(_mm256_loadu_ps(s + j)));
    _mm256_storeu_ps(s + j, p);
    sum = _mm256_add_ps(sum, p);
  }
  if (j < n) {
    const __m256 p = _mm256_and_ps(cpu::exp8_nonpos(scaled(load_tail(s + j, n - j))),
                                   _mm256_castsi256_ps(cpu::tail_mask(n - j)));
    store_tail(s + j, n - j, p);
    sum = _mm256_add_ps(sum, p);
  }
  const float alpha = m == kNegInf ? 0.0f : std::exp(m - m_new);
  l = l * alpha + cpu::hsum(sum);
  m = m_new;
  return alpha;
}

/// Starts a task's online softmax: accumulators O = 0, running max -inf, running sum 0.
KILN_AVX2 void start_rows(Scratch& W, int64_t rows) {
  std::fill(W.o, W.o + rows * W.ldo, 0.0f);
  std::fill(W.m, W.m + rows, kNegInf);
  std::fill(W.l, W.l + rows, 0.0f);
}

/// Packs keys [j0, j0 + n) (rows of E floats at kb) transposed into W.kt, and values (rows of Ev
/// floats at vb) into W.vp when their rows are not whole vectors; computes the raw scores
/// W.s[r][c] = q_r . k_{j0 + c} of `rows` query rows. Returns the values to multiply (*ldv: their
/// row stride).
KILN_AVX2 const float* block_scores(const float* q, int64_t rows, const float* kb, const float* vb, int64_t E,
                                    int64_t Ev, int64_t j0, int64_t n, Scratch& W, int64_t* ldv) {
  const int64_t evp = W.ldv_pad;
  const int64_t npad = round_up(n, 16);
  pack_kt(kb + j0 * E, E, n, npad, W.kt, W.ldk);
  // V: used in place when its rows are whole vectors, else packed with zero padding.
  const float* v = vb + j0 * Ev;
  *ldv = Ev;
  if (Ev != evp) {
    for (int64_t c = 0; c < n; ++c) {
      std::copy(vb + (j0 + c) * Ev, vb + (j0 + c + 1) * Ev, W.vp + c * evp);
      std::fill(W.vp + c * evp + Ev, W.vp + (c + 1) * evp, 0.0f);
    }
    v = W.vp;
    *ldv = evp;
  }
  for (int64_t c = 0; c < npad; c += 16) {
    for (int64_t r = 0; r < rows; r += kMR) {
      by_rows<QK>(std::min<int64_t>(kMR, rows - r), q + r * E, E, W.kt + c, W.ldk, E, W.s + r * W.lds + c, W.lds);
    }
  }
  return v;
}

/// Multiplies row r's accumulator by alpha (the online softmax's rescale after a new maximum).
KILN_AVX2 void rescale_row(Scratch& W, int64_t r, float alpha) {
  if (alpha == 1.0f) return;
  float* o = W.o + r * W.ldo;
  const __m256 va = _mm256_set1_ps(alpha);
  for (int64_t e = 0; e < W.ldv_pad; e += 8) _mm256_storeu_ps(o + e, _mm256_mul_ps(_mm256_loadu_ps(o + e), va));
}

/// O += P V for the block's n keys.
KILN_AVX2 void accumulate_pv(Scratch& W, int64_t rows, const float* v, int64_t ldv, int64_t n) {
  for (int64_t r = 0; r < rows; r += kMR) {
    by_rows<PV>(std::min<int64_t>(kMR, rows - r), W.s + r * W.lds, W.lds, v, ldv, n, W.ldv_pad, W.o + r * W.ldo, W.ldo);
  }
}

/// One task: query rows [q0, q0 + rows) of batch b.
KILN_AVX2 void attention_block(const Problem& P, Scratch& W, int64_t b, int64_t q0, int64_t rows) {
  const int64_t E = P.E, Ev = P.Ev;
  const float* q = P.q + P.qo[static_cast<size_t>(b)] + q0 * E;
  const float* kb = P.k + P.ko[static_cast<size_t>(b)];
  const float* vb = P.v + P.vo[static_cast<size_t>(b)];
  start_rows(W, rows);
  // Under is_causal, keys beyond the block's last query row are masked for every row.
  const int64_t s_end = P.causal ? std::min(P.S, q0 + rows) : P.S;
  for (int64_t j0 = 0; j0 < s_end; j0 += kBlockK) {
    const int64_t n = std::min(kBlockK, s_end - j0);
    int64_t ldv = 0;
    const float* v = block_scores(q, rows, kb, vb, E, Ev, j0, n, W, &ldv);
    // Softmax update and accumulator rescale, row by row. Without a mask and with a positive
    // scale, the scaling happens inside the update (one pass over the scores fewer).
    const bool plain = P.mask_f == nullptr && P.mask_b == nullptr && !P.causal && P.scale > 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      float* s = W.s + r * W.lds;
      float scale = 1.0f;
      if (plain) {
        scale = P.scale;  // applied inside softmax_update
      } else {
        mask_scores(P, b, q0 + r, j0, s, n);
      }
      rescale_row(W, r, softmax_update(s, n, scale, W.m[r], W.l[r]));
    }
    accumulate_pv(W, rows, v, ldv, n);  // O += P V
  }
  float* out = P.out + (b * P.L + q0) * Ev;
  for (int64_t r = 0; r < rows; ++r) {
    const float l = W.l[r];
    float* dst = out + r * Ev;
    if (l == 0.0f) {  // fully masked row -> 0
      std::fill(dst, dst + Ev, 0.0f);
      continue;
    }
    const float inv = 1.0f / l;
    const float* o = W.o + r * W.ldo;
    const __m256 vi = _mm256_set1_ps(inv);
    int64_t e = 0;
    for (; e + 8 <= Ev; e += 8) _mm256_storeu_ps(dst + e, _mm256_mul_ps(_mm256_loadu_ps(o + e), vi));
    if (e < Ev) store_tail(dst + e, Ev - e, _mm256_mul_ps(_mm256_loadu_ps(o + e), vi));
  }
}

bool sdpa_accepts(const KernelSignature& s) {
  if (!cpu::cpu_has_avx2_fma() || s.inputs.size() != 4 || s.outputs.size() != 1) return false;
  for (int i = 0; i < 3; ++i) {
    if (s.inputs[i] == nullptr || s.inputs[i]->dtype != DType::Float32 || s.inputs[i]->dim() < 3) return false;
  }
  if (const TensorType* m = s.inputs[3]) {
    if (m->dtype != DType::Float32 && m->dtype != DType::Bool) return false;
    if (s.attrs.get_bool("is_causal")) return false;
  }
  return s.outputs[0]->dtype == DType::Float32 && s.attrs.get_float("dropout_p") == 0.0;
}

thread_local Scratch tls_scratch;

Error sdpa(const KernelArgs& a) {
  const Tensor& q = *a.inputs[0];
  const Tensor& k = *a.inputs[1];
  const Tensor& v = *a.inputs[2];
  const Tensor* mask = a.inputs[3];
  Tensor& out = *a.outputs[0];
  if (q.dtype != DType::Float32 || k.dtype != DType::Float32 || v.dtype != DType::Float32 ||
      out.dtype != DType::Float32 || (mask && mask->dtype != DType::Float32 && mask->dtype != DType::Bool)) {
    return Error(ErrorCode::NotSupported, "aten.scaled_dot_product_attention: cpu kernel takes float32 (bool/float32 mask)");
  }
  Problem P;
  P.L = q.sizes.end()[-2];
  P.E = q.sizes.back();
  P.S = k.sizes.end()[-2];
  P.Ev = v.sizes.back();
  P.causal = a.attrs.get_bool("is_causal");
  P.scale = static_cast<float>(a.attrs.is_none("scale") ? 1.0 / std::sqrt(static_cast<double>(P.E))
                                                         : a.attrs.get_float("scale"));
  const bool gqa = a.attrs.get_bool("enable_gqa");
  const std::vector<int64_t> out_batch(out.sizes.begin(), out.sizes.end() - 2);
  P.nb = numel_of(out_batch);
  if (P.nb == 0 || P.L == 0 || P.Ev == 0) return {};
  try {
    P.qo = batch_offsets(q.sizes, out_batch, false);
    P.ko = batch_offsets(k.sizes, out_batch, gqa);
    P.vo = batch_offsets(v.sizes, out_batch, gqa);
    if (mask) P.mask = mask_layout(mask->sizes, out_batch);
  } catch (const std::bad_alloc&) {
    return Error(ErrorCode::MemoryAllocationFailed, "aten.scaled_dot_product_attention: offsets");
  }
  P.q = q.data_as<const float>();
  P.k = k.data_as<const float>();
  P.v = v.data_as<const float>();
  P.out = out.data_as<float>();
  if (mask) {
    if (mask->dtype == DType::Bool) P.mask_b = mask->data_as<const bool>();
    else P.mask_f = mask->data_as<const float>();
  }
  P.nqb = (P.L + kBlockQ - 1) / kBlockQ;
  const int64_t tasks = P.nb * P.nqb;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&](int64_t, int64_t) {
    Scratch& W = tls_scratch;
    if (!W.prepare(P)) {
      failed = true;
      return;
    }
    for (int64_t t = next.fetch_add(1); t < tasks; t = next.fetch_add(1)) {
      const int64_t b = t / P.nqb, qb = t % P.nqb;
      const int64_t q0 = qb * kBlockQ;
      attention_block(P, W, b, q0, std::min(kBlockQ, P.L - q0));
    }
  };
  const double flops = 2.0 * static_cast<double>(P.nb) * P.L * P.S * static_cast<double>(P.E + P.Ev);
  if (a.pool == nullptr || a.pool->num_threads() <= 1 || tasks < 2 || flops < 2e5) {
    worker(0, 1);
  } else {
    a.pool->parallel_for(a.pool->num_threads(), 1, worker);
  }
  if (failed) return Error(ErrorCode::MemoryAllocationFailed, "aten.scaled_dot_product_attention: scratch");
  return {};
}

// ---------------------------------------------------------------------------------------------
// kiln.sdpa_kv_cache (src/ir/ops/llm.cpp): query rows at cache positions [p, p + T) over the cache
// keys [lo(t), p + t], grouped-query. The same online-softmax scheme and micro-kernels as above.
// Query and output rows are flat [B * Hq * T] rows of D / Dv floats; a task takes consecutive rows
// of one batch and one kv head:
//  - when the Hq / Hkv query heads of a kv head have (Hq / Hkv) * T <= kBlockQ rows together (decode:
//    T = 1, the G heads sharing a kv head), all of them: each key block is packed once and its dot
//    products run for every head of the group in the same micro-kernel pass;
//  - else kBlockQ rows of one head (prefill), so that a task's rows are consecutive positions; also
//    when the groups are fewer than half the pool's threads (B * Hkv small: parallel over heads).
// A task streams only the keys its rows can see, [min lo, max p + t], in blocks of kBlockK: the
// work is proportional to the filled length p + T (and to the window), never to S. Every size is
// read from the call's tensors (T is a dynamic dim: it may be smaller than at load), and p is
// checked (sdpa_kv_cache_position) before anything is written.
// ---------------------------------------------------------------------------------------------

/// One call of kiln.sdpa_kv_cache, shared read-only by the tasks.
struct KvProblem {
  const float *q, *k, *v;
  float* out;
  int64_t Hq, T, D, Hkv, S, Dv, group, p, window;
  float scale;
  /// The keys query row t sees: [lo, hi).
  int64_t lo(int64_t t) const { return window > 0 ? std::max<int64_t>(0, p + t - window + 1) : 0; }
  int64_t hi(int64_t t) const { return p + t + 1; }
};

/// One task: flat query rows [row0, row0 + rows), all of one batch and one kv head.
KILN_AVX2 void kv_cache_block(const KvProblem& P, Scratch& W, int64_t row0, int64_t rows) {
  const int64_t D = P.D, Dv = P.Dv;
  const int64_t b = row0 / (P.T * P.Hq), h0 = (row0 / P.T) % P.Hq;
  const int64_t kvh = b * P.Hkv + h0 / P.group;
  const float* q = P.q + row0 * D;
  const float* kb = P.k + kvh * P.S * D;
  const float* vb = P.v + kvh * P.S * Dv;
  int64_t jbeg = P.S, jend = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = (row0 + r) % P.T;
    jbeg = std::min(jbeg, P.lo(t));
    jend = std::max(jend, P.hi(t));
  }
  start_rows(W, rows);
  for (int64_t j0 = jbeg; j0 < jend; j0 += kBlockK) {
    const int64_t n = std::min(kBlockK, jend - j0);
    int64_t ldv = 0;
    const float* v = block_scores(q, rows, kb, vb, D, Dv, j0, n, W, &ldv);
    for (int64_t r = 0; r < rows; ++r) {
      // Scale the scores of keys [lo, hi) of this row, -inf for the others, then the online update.
      const int64_t t = (row0 + r) % P.T;
      const int64_t a = std::clamp<int64_t>(P.lo(t) - j0, 0, n), e = std::clamp<int64_t>(P.hi(t) - j0, 0, n);
      float* s = W.s + r * W.lds;
      std::fill(s, s + a, kNegInf);
      for (int64_t j = a; j < e; ++j) s[j] *= P.scale;
      std::fill(s + e, s + n, kNegInf);
      rescale_row(W, r, softmax_update(s, n, 1.0f, W.m[r], W.l[r]));
    }
    accumulate_pv(W, rows, v, ldv, n);
  }
  float* out = P.out + row0 * Dv;
  for (int64_t r = 0; r < rows; ++r) {
    const float l = W.l[r];
    float* dst = out + r * Dv;
    if (l == 0.0f) {  // no key (cannot happen: a row always sees its own position)
      std::fill(dst, dst + Dv, 0.0f);
      continue;
    }
    const __m256 vi = _mm256_set1_ps(1.0f / l);
    const float* o = W.o + r * W.ldo;
    int64_t e = 0;
    for (; e + 8 <= Dv; e += 8) _mm256_storeu_ps(dst + e, _mm256_mul_ps(_mm256_loadu_ps(o + e), vi));
    if (e < Dv) store_tail(dst + e, Dv - e, _mm256_mul_ps(_mm256_loadu_ps(o + e), vi));
  }
}

/// float32 query / caches / output of rank 4 and an int64 input_pos (Kiln tensors are contiguous).
bool sdpa_kv_cache_accepts(const KernelSignature& s) {
  if (!cpu::cpu_has_avx2_fma() || s.inputs.size() != 4 || s.outputs.size() != 1) return false;
  for (int i = 0; i < 3; ++i) {
    if (s.inputs[i] == nullptr || s.inputs[i]->dtype != DType::Float32 || s.inputs[i]->dim() != 4) return false;
  }
  return s.inputs[3] != nullptr && s.inputs[3]->dtype == DType::Int64 && s.outputs[0]->dtype == DType::Float32;
}

Error sdpa_kv_cache(const KernelArgs& a) {
  const Tensor& q = *a.inputs[0];
  const Tensor& k = *a.inputs[1];
  const Tensor& v = *a.inputs[2];
  Tensor& out = *a.outputs[0];
  if (q.dtype != DType::Float32 || k.dtype != DType::Float32 || v.dtype != DType::Float32 ||
      out.dtype != DType::Float32) {
    return Error(ErrorCode::NotSupported, "kiln.sdpa_kv_cache: cpu kernel takes float32");
  }
  KvProblem P;
  const int64_t B = q.sizes[0];
  P.Hq = q.sizes[1];
  P.T = q.sizes[2];
  P.D = q.sizes[3];
  P.Hkv = k.sizes[1];
  P.S = k.sizes[2];
  P.Dv = v.sizes[3];
  auto pos = sdpa_kv_cache_position(*a.inputs[3], P.T, P.S);
  if (!pos.ok()) return pos.error();
  P.p = *pos;
  P.group = P.Hq / P.Hkv;
  P.window = a.attrs.get_int("sliding_window");
  P.scale = static_cast<float>(a.attrs.is_none("scale") ? 1.0 / std::sqrt(static_cast<double>(P.D))
                                                         : a.attrs.get_float("scale"));
  P.q = q.data_as<const float>();
  P.k = k.data_as<const float>();
  P.v = v.data_as<const float>();
  P.out = out.data_as<float>();
  const int64_t rows_total = B * P.Hq * P.T;
  if (rows_total == 0 || P.Dv == 0) return {};
  // Tasks: a whole GQA group of rows, or kBlockQ-row blocks of one head. Groups are split into
  // their heads when there are too few of them to occupy the pool (e.g. decode with one kv head):
  // each head then packs the group's keys again, but the heads run in parallel.
  const int64_t threads = a.pool != nullptr ? a.pool->num_threads() : 1;
  const bool whole_group = P.group * P.T <= kBlockQ && (P.group == 1 || 2 * B * P.Hkv > threads);
  const int64_t nqb = whole_group ? 1 : (P.T + kBlockQ - 1) / kBlockQ;
  const int64_t tasks = whole_group ? B * P.Hkv : B * P.Hq * nqb;
  std::atomic<bool> failed{false};
  auto task = [&](int64_t t) {
    Scratch& W = tls_scratch;
    if (!W.prepare(P.D, P.Dv)) {
      failed = true;
      return;
    }
    if (whole_group) {
      kv_cache_block(P, W, t * P.group * P.T, P.group * P.T);
    } else {
      const int64_t bh = t / nqb, t0 = t % nqb * kBlockQ;
      kv_cache_block(P, W, bh * P.T + t0, std::min(kBlockQ, P.T - t0));
    }
  };
  const int64_t keys = P.window > 0 ? std::min<int64_t>(P.window + P.T, P.p + P.T) : P.p + P.T;
  const double flops = 2.0 * static_cast<double>(rows_total) * static_cast<double>(keys) * static_cast<double>(P.D + P.Dv);
  cpu::parallel_tasks(flops < 2e5 ? nullptr : a.pool, tasks, task);
  if (failed) return Error(ErrorCode::MemoryAllocationFailed, "kiln.sdpa_kv_cache: scratch");
  return {};
}

}  // namespace

void register_cpu_attention(KernelRegistry& r) {
  r.add_optimized("aten.scaled_dot_product_attention", sdpa, sdpa_accepts);
  r.add_optimized("kiln.sdpa_kv_cache", sdpa_kv_cache, sdpa_kv_cache_accepts);
}

#else

void register_cpu_attention(KernelRegistry&) {}  // no AVX2 kernels on this target

#endif  // KILN_CPU_AVX2_KERNELS

}  // namespace kiln

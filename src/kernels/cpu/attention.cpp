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
// Written once over Highway for every SIMD target (kernels/cpu/vec-inl.h). q.k^T and p.V run as
// register-tiled micro-kernels (kMR rows x 2 vectors of columns: 6 x 16 on AVX2, 8 x 32 on
// AVX-512, 6 x 2 on the scalar target) on a packed K^T block (transposed in kTB x kTB register
// blocks) and a packed, zero-padded V block when Ev is not a multiple of the lane count; scores
// and sums are float32 (the portable kernel uses double), e^(s - m) is ExpNonpos. Scratch is
// thread_local, (E + Ev') * K' + kBlockQ * (K' + Ev') floats (Ev' = Ev rounded up to the lane
// count, K' = kBlockK rounded up to two vectors), so bounded by the block sizes and head dims
// (never by L or S), and reused across calls.
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
#include "kernels/kernel.h"
#include "kernels/portable/llm.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/vec-inl.h"

#ifndef KILN_CPU_ATTENTION_SHARED_
#define KILN_CPU_ATTENTION_SHARED_
namespace kiln::cpu::attention {

constexpr int64_t kBlockQ = 128;  ///< query rows per task
constexpr int64_t kBlockK = 128;  ///< keys per streamed block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/// Element offset of operand `sizes` ([batch..., rows, cols]) for every flat index over the
/// output batch dims `out_batch`: broadcast dims (size 1) repeat; with gqa the head dim (last
/// batch dim) is indexed by out_head / (out_heads / heads) (repeat_interleave).
inline std::vector<int64_t> batch_offsets(const std::vector<int64_t>& sizes, const std::vector<int64_t>& out_batch, bool gqa) {
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

inline MaskLayout mask_layout(const std::vector<int64_t>& msizes, const std::vector<int64_t>& out_batch) {
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
  /// Points the buffers at storage for head dims E (q, k) and Ev (v) with `lanes` floats per
  /// vector; false when the allocation fails.
  bool prepare(int64_t E, int64_t Ev, int64_t lanes) {
    ldk = round_up(kBlockK, 2 * lanes);  // K^T row stride (columns padded with zeros)
    ldv_pad = round_up(Ev, lanes);       // packed V / O row stride
    lds = ldk;
    ldo = ldv_pad;
    const size_t need = static_cast<size_t>(E * ldk + ldk * ldv_pad + kBlockQ * lds + kBlockQ * ldo + 2 * kBlockQ);
    try {
      if (buf.size() < need) buf.resize(need);
    } catch (const std::bad_alloc&) {
      return false;
    }
    kt = buf.data();
    vp = kt + E * ldk;
    s = vp + ldk * ldv_pad;
    o = s + kBlockQ * lds;
    m = o + kBlockQ * ldo;
    l = m + kBlockQ;
    return true;
  }
};

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

/// The calling thread's scratch (one per thread, reused across calls and targets).
inline thread_local Scratch tls_scratch;

}  // namespace kiln::cpu::attention
#endif  // KILN_CPU_ATTENTION_SHARED_

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace attention_detail {

using namespace ::kiln::cpu::attention;  // NOLINT: the shared types and constants above

/// Micro-kernel rows: 8 where the target has 32 vector registers (AVX-512, AArch64 NEON / SVE:
/// 16 accumulators, 2 key vectors and a broadcast), else 6 (AVX2 and the scalar target: 16
/// registers, 12 accumulators).
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3) || (HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_SCALAR)
constexpr int kMR = 8;
#else
constexpr int kMR = 6;
#endif

/// Side of the square blocks that pack_kt transposes in registers: 8 (256-bit vectors) on x86,
/// 4 (128-bit) on the other SIMD targets, 1 (a copy) on the scalar target.
#if HWY_TARGET == HWY_SCALAR
constexpr size_t kTB = 1;
#elif HWY_ARCH_X86
constexpr size_t kTB = 8;
#else
constexpr size_t kTB = 4;
#endif

/// dst[j * ldd + i] = src[i * lds + j] for i, j < B (B = 1, 4 or 8): a B x B transpose through
/// two rounds of interleaves within 128-bit blocks (32-bit, then 64-bit lanes) and, for B = 8,
/// one exchange of 128-bit halves (the classic unpack / shuffle / permute2f128 sequence).
/// (The scalar target, which lacks the interleave ops, only copies: B = 1.)
#if HWY_TARGET == HWY_SCALAR
template <size_t B>
HWY_INLINE void TransposeBlock(const float* HWY_RESTRICT src, int64_t, float* HWY_RESTRICT dst, int64_t) {
  static_assert(B == 1, "the scalar target transposes 1 x 1 blocks");
  dst[0] = src[0];
}
#else
template <size_t B>
HWY_INLINE void TransposeBlock(const float* HWY_RESTRICT src, int64_t lds, float* HWY_RESTRICT dst, int64_t ldd) {
  {
    const hn::CappedTag<float, B> d;
    const hn::Repartition<uint64_t, decltype(d)> d64;
    using V = hn::Vec<decltype(d)>;
    auto il = [&](V a, V b) { return hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, a), hn::BitCast(d64, b))); };
    auto iu = [&](V a, V b) { return hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, a), hn::BitCast(d64, b))); };
    const V r0 = hn::LoadU(d, src), r1 = hn::LoadU(d, src + lds), r2 = hn::LoadU(d, src + 2 * lds),
            r3 = hn::LoadU(d, src + 3 * lds);
    const V t0 = hn::InterleaveLower(d, r0, r1), t1 = hn::InterleaveUpper(d, r0, r1);
    const V t2 = hn::InterleaveLower(d, r2, r3), t3 = hn::InterleaveUpper(d, r2, r3);
    const V s0 = il(t0, t2), s1 = iu(t0, t2), s2 = il(t1, t3), s3 = iu(t1, t3);
    if constexpr (B == 4) {
      hn::StoreU(s0, d, dst);
      hn::StoreU(s1, d, dst + ldd);
      hn::StoreU(s2, d, dst + 2 * ldd);
      hn::StoreU(s3, d, dst + 3 * ldd);
    } else {
      static_assert(B == 8, "transpose blocks of 1, 4 or 8");
      const V r4 = hn::LoadU(d, src + 4 * lds), r5 = hn::LoadU(d, src + 5 * lds), r6 = hn::LoadU(d, src + 6 * lds),
              r7 = hn::LoadU(d, src + 7 * lds);
      const V t4 = hn::InterleaveLower(d, r4, r5), t5 = hn::InterleaveUpper(d, r4, r5);
      const V t6 = hn::InterleaveLower(d, r6, r7), t7 = hn::InterleaveUpper(d, r6, r7);
      const V s4 = il(t4, t6), s5 = iu(t4, t6), s6 = il(t5, t7), s7 = iu(t5, t7);
      hn::StoreU(hn::ConcatLowerLower(d, s4, s0), d, dst);
      hn::StoreU(hn::ConcatLowerLower(d, s5, s1), d, dst + ldd);
      hn::StoreU(hn::ConcatLowerLower(d, s6, s2), d, dst + 2 * ldd);
      hn::StoreU(hn::ConcatLowerLower(d, s7, s3), d, dst + 3 * ldd);
      hn::StoreU(hn::ConcatUpperUpper(d, s4, s0), d, dst + 4 * ldd);
      hn::StoreU(hn::ConcatUpperUpper(d, s5, s1), d, dst + 5 * ldd);
      hn::StoreU(hn::ConcatUpperUpper(d, s6, s2), d, dst + 6 * ldd);
      hn::StoreU(hn::ConcatUpperUpper(d, s7, s3), d, dst + 7 * ldd);
    }
  }
}
#endif  // HWY_TARGET == HWY_SCALAR

/// kt[e][c] = k[c][e] for c < n, e < E (k: n rows of E floats), zero for n <= c < npad.
/// Whole kTB x kTB tiles are transposed in registers.
HWY_INLINE void PackKt(const float* k, int64_t E, int64_t n, int64_t npad, float* kt, int64_t ldk) {
  constexpr int64_t B = static_cast<int64_t>(kTB);
  const int64_t nb = n / B * B, eb = E / B * B;
  for (int64_t c = 0; c < nb; c += B) {
    for (int64_t e = 0; e < eb; e += B) TransposeBlock<kTB>(k + c * E + e, E, kt + e * ldk + c, ldk);
    for (int64_t e = eb; e < E; ++e) {
      for (int64_t r = 0; r < B; ++r) kt[e * ldk + c + r] = k[(c + r) * E + e];
    }
  }
  for (int64_t c = nb; c < n; ++c) {
    for (int64_t e = 0; e < E; ++e) kt[e * ldk + c] = k[c * E + e];
  }
  for (int64_t e = 0; e < E; ++e) std::fill(kt + e * ldk + n, kt + e * ldk + npad, 0.0f);
}

// The micro-kernels keep their accumulators in named variables (c<row><vector>), not arrays:
// SVE vectors are sizeless and cannot be array elements. Rows >= MR are never touched.
#define KILN_ATT_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
static_assert(kMR <= 8, "KILN_ATT_ROWS lists 8 rows");

/// s[r][c] = sum_e q[r][e] * kt[e][c] for r < MR, c < 2 * Lanes (kt: packed K^T block, row stride
/// ldk).
template <int MR>
HWY_INLINE void QkTile(const float* HWY_RESTRICT q, int64_t ldq, const float* HWY_RESTRICT kt, int64_t ldk, int64_t E,
                       float* HWY_RESTRICT s, int64_t lds) {
  const DF d;
  const size_t N = hn::Lanes(d);
#define KILN_ATT_DECL(r) VF c##r##0 = hn::Zero(d), c##r##1 = hn::Zero(d);
  KILN_ATT_ROWS(KILN_ATT_DECL)
#undef KILN_ATT_DECL
  HWY_UNROLL(4)
  for (int64_t e = 0; e < E; ++e) {
    const VF k0 = hn::LoadU(d, kt + e * ldk);
    const VF k1 = hn::LoadU(d, kt + e * ldk + N);
#define KILN_ATT_FMA(r)                                  \
  if constexpr (MR > r) {                                \
    const VF qb = hn::Set(d, q[r * ldq + e]);            \
    c##r##0 = hn::MulAdd(qb, k0, c##r##0);               \
    c##r##1 = hn::MulAdd(qb, k1, c##r##1);               \
  }
    KILN_ATT_ROWS(KILN_ATT_FMA)
#undef KILN_ATT_FMA
  }
#define KILN_ATT_STORE(r)                        \
  if constexpr (MR > r) {                        \
    hn::StoreU(c##r##0, d, s + r * lds);         \
    hn::StoreU(c##r##1, d, s + r * lds + N);     \
  }
  KILN_ATT_ROWS(KILN_ATT_STORE)
#undef KILN_ATT_STORE
}

/// o[r][c] += sum_j p[r][j] * v[j][c] for r < MR, c < NV * Lanes (NV = 1 or 2), j < n.
template <int MR, int NV>
HWY_INLINE void PvTile(const float* HWY_RESTRICT p, int64_t ldp, const float* HWY_RESTRICT v, int64_t ldv, int64_t n,
                       float* HWY_RESTRICT o, int64_t ldo) {
  const DF d;
  const size_t N = hn::Lanes(d);
#define KILN_ATT_DECL(r)                                                                 \
  VF c##r##0 = hn::Zero(d), c##r##1 = hn::Zero(d);                                       \
  if constexpr (MR > r) {                                                                \
    c##r##0 = hn::LoadU(d, o + r * ldo);                                                 \
    if constexpr (NV > 1) c##r##1 = hn::LoadU(d, o + r * ldo + N);                       \
  }
  KILN_ATT_ROWS(KILN_ATT_DECL)
#undef KILN_ATT_DECL
  HWY_UNROLL(4)
  for (int64_t j = 0; j < n; ++j) {
    const VF v0 = hn::LoadU(d, v + j * ldv);
    const VF v1 = NV > 1 ? hn::LoadU(d, v + j * ldv + N) : v0;
#define KILN_ATT_FMA(r)                                          \
  if constexpr (MR > r) {                                        \
    const VF pb = hn::Set(d, p[r * ldp + j]);                    \
    c##r##0 = hn::MulAdd(pb, v0, c##r##0);                       \
    if constexpr (NV > 1) c##r##1 = hn::MulAdd(pb, v1, c##r##1); \
  }
    KILN_ATT_ROWS(KILN_ATT_FMA)
#undef KILN_ATT_FMA
  }
#define KILN_ATT_STORE(r)                                              \
  if constexpr (MR > r) {                                              \
    hn::StoreU(c##r##0, d, o + r * ldo);                               \
    if constexpr (NV > 1) hn::StoreU(c##r##1, d, o + r * ldo + N);     \
  }
  KILN_ATT_ROWS(KILN_ATT_STORE)
#undef KILN_ATT_STORE
}
#undef KILN_ATT_ROWS

/// PvTile over the evp (a multiple of Lanes) output columns.
template <int MR>
HWY_INLINE void PvRows(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t n, int64_t evp, float* o,
                       int64_t ldo) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t c = 0;
  for (; c + 2 * N <= evp; c += 2 * N) PvTile<MR, 2>(p, ldp, v + c, ldv, n, o + c, ldo);
  if (c < evp) PvTile<MR, 1>(p, ldp, v + c, ldv, n, o + c, ldo);
}

/// QkTile for a tile of `rows` (1..kMR) rows.
HWY_INLINE void QkRows(int64_t rows, const float* q, int64_t ldq, const float* kt, int64_t ldk, int64_t E, float* s,
                       int64_t lds) {
  switch (rows) {
    case 8: return QkTile<8>(q, ldq, kt, ldk, E, s, lds);
    case 7: return QkTile<7>(q, ldq, kt, ldk, E, s, lds);
    case 6: return QkTile<6>(q, ldq, kt, ldk, E, s, lds);
    case 5: return QkTile<5>(q, ldq, kt, ldk, E, s, lds);
    case 4: return QkTile<4>(q, ldq, kt, ldk, E, s, lds);
    case 3: return QkTile<3>(q, ldq, kt, ldk, E, s, lds);
    case 2: return QkTile<2>(q, ldq, kt, ldk, E, s, lds);
    default: return QkTile<1>(q, ldq, kt, ldk, E, s, lds);
  }
}

/// PvRows for a tile of `rows` (1..kMR) rows.
HWY_INLINE void PvRowsN(int64_t rows, const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t n, int64_t evp,
                        float* o, int64_t ldo) {
  switch (rows) {
    case 8: return PvRows<8>(p, ldp, v, ldv, n, evp, o, ldo);
    case 7: return PvRows<7>(p, ldp, v, ldv, n, evp, o, ldo);
    case 6: return PvRows<6>(p, ldp, v, ldv, n, evp, o, ldo);
    case 5: return PvRows<5>(p, ldp, v, ldv, n, evp, o, ldo);
    case 4: return PvRows<4>(p, ldp, v, ldv, n, evp, o, ldo);
    case 3: return PvRows<3>(p, ldp, v, ldv, n, evp, o, ldo);
    case 2: return PvRows<2>(p, ldp, v, ldv, n, evp, o, ldo);
    default: return PvRows<1>(p, ldp, v, ldv, n, evp, o, ldo);
  }
}

/// Scales row `i`'s raw scores s[0..n) (keys j0..j0+n) and applies the mask / causal limit.
HWY_INLINE void MaskScores(const Problem& P, int64_t b, int64_t i, int64_t j0, float* s, int64_t n) {
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

/// Online-softmax update of one row: scales the scores s[0..n) by `scale` (kScale; else they are
/// already scaled), turns them into p = e^(s - m') and updates m and l; returns the factor
/// e^(m - m') the row's accumulator must be scaled by. The scaled scores are stored before m' is
/// subtracted (so each is rounded on its own, as m' = max of them is, and as eager scales before
/// its softmax): the row's maximum gives exactly e^0 = 1 and no difference is positive, which
/// ExpNonpos needs. (One fused multiply-subtract would be off by up to half an ulp of m', 128 at
/// 2.7e9: enough to push a whole row below exp's range.)
template <bool kScale>
HWY_INLINE float SoftmaxUpdate(float* HWY_RESTRICT s, int64_t n, float scale, float& m, float& l) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  // The maximum, NaN-aware: a NaN score makes the row's maximum NaN, so that the row's output is
  // NaN as in eager (Max alone may drop NaN, and an all-NaN row would look fully masked).
  const VF vs = hn::Set(d, scale);
  VF mx = hn::Set(d, kNegInf);
  auto nan = hn::Lt(mx, mx);  // all false
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    VF v = hn::LoadU(d, s + j);
    if constexpr (kScale) {
      v = hn::Mul(v, vs);
      hn::StoreU(v, d, s + j);
    }
    mx = hn::Max(mx, v);
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  float bm = ReduceMax(d, mx);
  bool has_nan = !hn::AllFalse(d, nan);
  for (; j < n; ++j) {
    if constexpr (kScale) s[j] *= scale;
    bm = std::max(bm, s[j]);
    has_nan = has_nan || std::isnan(s[j]);
  }
  // Once NaN, the row's maximum stays NaN over later blocks (std::max would drop it).
  const float m_new = has_nan || std::isnan(m) ? std::numeric_limits<float>::quiet_NaN() : std::max(m, bm);
  if (m_new == kNegInf) {  // every score so far is -inf: nothing to add
    std::fill(s, s + n, 0.0f);
    return 1.0f;
  }
  const VF vm = hn::Set(d, m_new);
  VF sum = hn::Zero(d);
  j = 0;
  for (; j + N <= n; j += N) {
    const VF p = ExpNonpos(d, hn::Sub(hn::LoadU(d, s + j), vm));
    hn::StoreU(p, d, s + j);
    sum = hn::Add(sum, p);
  }
  if (j < n) {
    const size_t r = static_cast<size_t>(n - j);
    const VF p = hn::IfThenElseZero(hn::FirstN(d, r), ExpNonpos(d, hn::Sub(LoadTail(d, s + j, r), vm)));
    StoreTail(d, p, s + j, r);
    sum = hn::Add(sum, p);
  }
  const float alpha = m == kNegInf ? 0.0f : std::exp(m - m_new);
  l = l * alpha + ReduceSum(d, sum);
  m = m_new;
  return alpha;
}

/// Starts a task's online softmax: accumulators O = 0, running max -inf, running sum 0.
HWY_INLINE void StartRows(Scratch& W, int64_t rows) {
  std::fill(W.o, W.o + rows * W.ldo, 0.0f);
  std::fill(W.m, W.m + rows, kNegInf);
  std::fill(W.l, W.l + rows, 0.0f);
}

/// Packs keys [j0, j0 + n) (rows of E floats at kb) transposed into W.kt, and values (rows of Ev
/// floats at vb) into W.vp when their rows are not whole vectors; computes the raw scores
/// W.s[r][c] = q_r . k_{j0 + c} of `rows` query rows. Returns the values to multiply (*ldv: their
/// row stride).
HWY_INLINE const float* BlockScores(const float* q, int64_t rows, const float* kb, const float* vb, int64_t E,
                                    int64_t Ev, int64_t j0, int64_t n, Scratch& W, int64_t* ldv) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t evp = W.ldv_pad;
  const int64_t npad = round_up(n, 2 * N);
  PackKt(kb + j0 * E, E, n, npad, W.kt, W.ldk);
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
  for (int64_t c = 0; c < npad; c += 2 * N) {
    for (int64_t r = 0; r < rows; r += kMR) {
      QkRows(std::min<int64_t>(kMR, rows - r), q + r * E, E, W.kt + c, W.ldk, E, W.s + r * W.lds + c, W.lds);
    }
  }
  return v;
}

/// Multiplies row r's accumulator by alpha (the online softmax's rescale after a new maximum).
HWY_INLINE void RescaleRow(Scratch& W, int64_t r, float alpha) {
  if (alpha == 1.0f) return;
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  float* o = W.o + r * W.ldo;
  const VF va = hn::Set(d, alpha);
  for (int64_t e = 0; e < W.ldv_pad; e += N) hn::StoreU(hn::Mul(hn::LoadU(d, o + e), va), d, o + e);
}

/// O += P V for the block's n keys.
HWY_INLINE void AccumulatePv(Scratch& W, int64_t rows, const float* v, int64_t ldv, int64_t n) {
  for (int64_t r = 0; r < rows; r += kMR) {
    PvRowsN(std::min<int64_t>(kMR, rows - r), W.s + r * W.lds, W.lds, v, ldv, n, W.ldv_pad, W.o + r * W.ldo, W.ldo);
  }
}

/// out rows [0, rows) (row stride Ev) = O / l, 0 for a row without keys (l == 0).
HWY_INLINE void FinishRows(const Scratch& W, int64_t rows, int64_t Ev, float* out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < rows; ++r) {
    const float l = W.l[r];
    float* dst = out + r * Ev;
    if (l == 0.0f) {
      std::fill(dst, dst + Ev, 0.0f);
      continue;
    }
    const VF vi = hn::Set(d, 1.0f / l);
    const float* o = W.o + r * W.ldo;  // ldo = Ev rounded up to Lanes: whole vectors readable
    int64_t e = 0;
    for (; e + N <= Ev; e += N) hn::StoreU(hn::Mul(hn::LoadU(d, o + e), vi), d, dst + e);
    if (e < Ev) StoreTail(d, hn::Mul(hn::LoadU(d, o + e), vi), dst + e, static_cast<size_t>(Ev - e));
  }
}

}  // namespace attention_detail

/// One aten.scaled_dot_product_attention task: query rows [q0, q0 + rows) of batch b, on the
/// calling thread's scratch. False when the scratch cannot be allocated.
bool AttentionTask(const attention::Problem& P, int64_t b, int64_t q0, int64_t rows) {
  using namespace attention_detail;  // NOLINT
  Scratch& W = tls_scratch;
  if (!W.prepare(P.E, P.Ev, static_cast<int64_t>(hn::Lanes(DF())))) return false;
  const int64_t E = P.E, Ev = P.Ev;
  const float* q = P.q + P.qo[static_cast<size_t>(b)] + q0 * E;
  const float* kb = P.k + P.ko[static_cast<size_t>(b)];
  const float* vb = P.v + P.vo[static_cast<size_t>(b)];
  StartRows(W, rows);
  // Under is_causal, keys beyond the block's last query row are masked for every row.
  const int64_t s_end = P.causal ? std::min(P.S, q0 + rows) : P.S;
  // Without a mask the scaling happens inside the softmax update (one pass over the scores fewer).
  const bool plain = P.mask_f == nullptr && P.mask_b == nullptr && !P.causal;
  for (int64_t j0 = 0; j0 < s_end; j0 += kBlockK) {
    const int64_t n = std::min(kBlockK, s_end - j0);
    int64_t ldv = 0;
    const float* v = BlockScores(q, rows, kb, vb, E, Ev, j0, n, W, &ldv);
    for (int64_t r = 0; r < rows; ++r) {
      float* s = W.s + r * W.lds;
      float alpha;
      if (plain) {
        alpha = SoftmaxUpdate<true>(s, n, P.scale, W.m[r], W.l[r]);
      } else {
        MaskScores(P, b, q0 + r, j0, s, n);
        alpha = SoftmaxUpdate<false>(s, n, 1.0f, W.m[r], W.l[r]);
      }
      RescaleRow(W, r, alpha);
    }
    AccumulatePv(W, rows, v, ldv, n);  // O += P V
  }
  FinishRows(W, rows, Ev, P.out + (b * P.L + q0) * Ev);  // a fully masked row gives 0
  return true;
}

/// One kiln.sdpa_kv_cache task: flat query rows [row0, row0 + rows), all of one batch and one kv
/// head, on the calling thread's scratch. False when the scratch cannot be allocated.
bool KvCacheTask(const attention::KvProblem& P, int64_t row0, int64_t rows) {
  using namespace attention_detail;  // NOLINT
  Scratch& W = tls_scratch;
  if (!W.prepare(P.D, P.Dv, static_cast<int64_t>(hn::Lanes(DF())))) return false;
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
  StartRows(W, rows);
  for (int64_t j0 = jbeg; j0 < jend; j0 += kBlockK) {
    const int64_t n = std::min(kBlockK, jend - j0);
    int64_t ldv = 0;
    const float* v = BlockScores(q, rows, kb, vb, D, Dv, j0, n, W, &ldv);
    for (int64_t r = 0; r < rows; ++r) {
      // Scale the scores of keys [lo, hi) of this row, -inf for the others, then the online update.
      const int64_t t = (row0 + r) % P.T;
      const int64_t a = std::clamp<int64_t>(P.lo(t) - j0, 0, n), e = std::clamp<int64_t>(P.hi(t) - j0, 0, n);
      float* s = W.s + r * W.lds;
      std::fill(s, s + a, kNegInf);
      for (int64_t j = a; j < e; ++j) s[j] *= P.scale;
      std::fill(s + e, s + n, kNegInf);
      RescaleRow(W, r, SoftmaxUpdate<false>(s, n, 1.0f, W.m[r], W.l[r]));
    }
    AccumulatePv(W, rows, v, ldv, n);
  }
  FinishRows(W, rows, Dv, P.out + row0 * Dv);  // l == 0 cannot happen: a row sees its own position
  return true;
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
namespace cpu {
HWY_EXPORT(AttentionTask);
HWY_EXPORT(KvCacheTask);
}  // namespace cpu

namespace {

using namespace cpu::attention;  // NOLINT

bool sdpa_accepts(const KernelSignature& s) {
  if (s.inputs.size() != 4 || s.outputs.size() != 1) return false;
  for (int i = 0; i < 3; ++i) {
    if (s.inputs[i] == nullptr || s.inputs[i]->dtype != DType::Float32 || s.inputs[i]->dim() < 3) return false;
  }
  if (const TensorType* m = s.inputs[3]) {
    if (m->dtype != DType::Float32 && m->dtype != DType::Bool) return false;
    if (s.attrs.get_bool("is_causal")) return false;
  }
  return s.outputs[0]->dtype == DType::Float32 && s.attrs.get_float("dropout_p") == 0.0;
}

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
    for (int64_t t = next.fetch_add(1); t < tasks; t = next.fetch_add(1)) {
      const int64_t b = t / P.nqb, qb = t % P.nqb;
      const int64_t q0 = qb * kBlockQ;
      if (!KILN_CPU_DISPATCH(AttentionTask)(P, b, q0, std::min(kBlockQ, P.L - q0))) {
        failed = true;
        return;
      }
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

/// float32 query / caches / output of rank 4 and an int64 input_pos (Kiln tensors are contiguous).
bool sdpa_kv_cache_accepts(const KernelSignature& s) {
  if (s.inputs.size() != 4 || s.outputs.size() != 1) return false;
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
    bool ok;
    if (whole_group) {
      ok = KILN_CPU_DISPATCH(KvCacheTask)(P, t * P.group * P.T, P.group * P.T);
    } else {
      const int64_t bh = t / nqb, t0 = t % nqb * kBlockQ;
      ok = KILN_CPU_DISPATCH(KvCacheTask)(P, bh * P.T + t0, std::min(kBlockQ, P.T - t0));
    }
    if (!ok) failed = true;
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

}  // namespace kiln
#endif  // HWY_ONCE

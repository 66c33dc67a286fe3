// Optimized cpu kernels of the weight-only quantized ops (layout and formula: src/ir/ops/quant.h;
// reference: src/kernels/portable/quant.cpp). The packed weight is read in place and dequantized
// tile by tile inside the GEMM / convolution loop (never a full float copy of the weight):
// - linear, few rows (m <= 4, decoding / classifier heads), and the 1x1 convolution of a 1x1
//   image: a matrix-vector product that dequantizes the weights in registers (QuantGemvPacked);
// - linear, more rows: cpu::sgemm_packed_b with a B packer that dequantizes each 16-column panel
//   as the GEMM asks for it (QuantPanelColumn);
// - convolution: depthwise (one input and output channel per group; C * kH * kW weights) dequantized
//   per call into scratch and run by the selected aten.convolution kernel; otherwise blocks of output channels are dequantized (at most
//   ~1M floats per block, parallel over rows) and multiplied with the input by cpu::sgemm
//   (1x1, stride 1, no padding) or cpu::sgemm_packed_b with an implicit im2col packer.
// The per-call loops (matrix-vector product, dequantizing packers) are compiled once per SIMD
// target over Google Highway (hwy/foreach_target.h; QuantView::dequantize is inlined into them
// and vectorized for the target), and selected with the process's target.

#include <algorithm>
#include <cstring>
#include <vector>

#include "ir/ops/conv.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/portable/util.h"
#include "kernels/quantized.h"

// Per-target part: compiled once per SIMD target (hwy/foreach_target.h re-includes this file).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/quantized.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/vec-inl.h"

#ifndef KILN_CPU_QUANTIZED_SHARED_
#define KILN_CPU_QUANTIZED_SHARED_
namespace kiln::cpu {
/// The activations of a quantized matrix-vector product (QuantGemvPacked), prepared once per call:
/// m <= 4 rows of x [m, k]. For 8-bit weights x itself. For 4-bit weights x split into its even
/// and odd columns, even[i, h] = x[i, 2h] and odd[i, h] = x[i, 2h + 1] for h < half = ceil(k / 2)
/// (odd's last is 0 when k is odd), so that the low nibbles of a vector of packed bytes (even
/// columns, src/ir/ops/quant.h) multiply one vector of `even` and the high nibbles one of `odd`.
struct QuantGemvInput {
  int64_t m = 0;
  const float* x = nullptr;           ///< [m, k] (8-bit weights)
  const float* even = nullptr;        ///< [m, half] (4-bit weights)
  const float* odd = nullptr;         ///< [m, half]
  int64_t half = 0;                   ///< ceil(k / 2)
};

/// The int8 activations of a quantized matrix-vector product with activation_bits = 8
/// (src/ir/ops/quant.h), prepared once per call for m <= 4 rows of x [m, k] by
/// quantize_activation_row: B = k / 32 blocks per row. q holds each row's k values in the order the
/// weights' bytes meet them: 8-bit weights, column order; 4-bit weights, per pair of blocks (2p,
/// 2p + 1) the 16 even columns of 2p, the 16 even of 2p + 1, the 16 odd of 2p, the 16 odd of 2p + 1
/// (the low and high nibbles of the pair's 32 packed bytes), and an unpaired last block its 16 even
/// then 16 odd columns (A8EvenOdd gives the offsets).
struct QuantGemvA8Input {
  int64_t m = 0;
  int64_t blocks = 0;         ///< B = k / 32
  const int8_t* q = nullptr;  ///< [m, k]
  const float* d = nullptr;   ///< [m, B] block scales
  const float* e = nullptr;   ///< [m, G]: per weight group g, the sum over its blocks of d * (sum of q)
  /// [m, B, 8]: the int32 lanes that remove the unsigned codes' offset from a block's vpdpbusd /
  /// vpmaddwd lanes exactly, lane l = -offset * (sum of the 4 q that lane l multiplies): 4-bit
  /// (offset 8), at block 2p for the pair (2p, 2p + 1) (q[64p + 4l ..] and q[64p + 32 + 4l ..]) and
  /// at an unpaired last block for its 16 + 16 (lanes 0-3 only); 8-bit (offset 128), per block.
  const int32_t* corr = nullptr;
};

/// Offsets in a 4-bit row of QuantGemvA8Input::q of block b's 16 even and 16 odd columns (B blocks).
inline void A8EvenOdd(int64_t b, int64_t B, int64_t& even, int64_t& odd) {
  const int64_t p = b / 2;
  if (2 * p + 1 < B) {
    even = 64 * p + 16 * (b & 1);
    odd = even + 32;
  } else {
    even = 32 * b;
    odd = even + 16;
  }
}

/// sum over blocks b in [b0, b1) of s[g(b)] * d[b] * (sum_c wq q) for one row, wq the signed
/// codes (u - 8 for 4-bit, the int8 value for 8-bit): scalar code, exact integer block sums.
/// Compiled once with the baseline flags and never inlined into the per-target code: the avx3_dl
/// target's flags include the VEX-encoded AVX-VNNI, and GCC vectorizes this loop into VEX vpdpbusd,
/// which AVX-512 CPUs without AVX-VNNI (AMD Zen 4, Intel Ice Lake) do not have (SIGILL).
__attribute__((noinline)) inline float A8RowScalar(const uint8_t* __restrict row, const float* __restrict s,
                                                  const int8_t* __restrict q, const float* __restrict dd, int bits, int64_t bpg, int64_t B, int64_t b0, int64_t b1) {
  float acc = 0.0f;
  for (int64_t b = b0; b < b1; ++b) {
    int32_t dot = 0;
    if (bits == 4) {
      int64_t ev, od;
      A8EvenOdd(b, B, ev, od);
      const uint8_t* wb = row + b * 16;
      for (int64_t t = 0; t < 16; ++t) dot += ((wb[t] & 0xF) - 8) * q[ev + t] + ((wb[t] >> 4) - 8) * q[od + t];
    } else {
      const uint8_t* wb = row + b * 32;
      const int8_t* qb = q + b * 32;
      for (int64_t t = 0; t < 32; ++t) dot += static_cast<int8_t>(wb[t]) * qb[t];
    }
    acc += s[b / bpg] * dd[b] * static_cast<float>(dot);
  }
  return acc;
}

/// The int8 activations of the integer GEMM of prefill (QuantGemmA8; activation_bits = 8, m > 4),
/// prepared once per call: the m rows of x [m, k] quantized by quantize_activation_row, B = k / 32
/// blocks per row. For 4-bit weights each run of 8 columns is stored as its 4 even then its 4 odd
/// columns (q[8j .. 8j + 3] = x[8j], x[8j + 2], x[8j + 4], x[8j + 6] quantized, q[8j + 4 ..] the
/// odd ones), the order in which the weight panel holds the low and high nibbles of 4 packed bytes
/// (QuantGemmA8PackPanels); 8-bit weights: column order.
struct QuantGemmA8Input {
  int64_t m = 0;
  int64_t blocks = 0;           ///< B = k / 32
  const int8_t* q = nullptr;    ///< [m, k]
  const float* d = nullptr;     ///< [m, B] block scales
  /// [m, B]: -offset * (sum of the block's q), offset 8 (4-bit codes u = wq + 8) or 128 (8-bit
  /// weights + 128): the start of a block's unsigned-times-signed sum, which then equals the block's
  /// exact sum of wq * q.
  const int32_t* corr = nullptr;
  const float* e = nullptr;     ///< [m, G] with zero points (else null): per group, sum of d * (sum of q)
};

/// Output columns of one QuantGemmA8 task: two 16-lane panels.
inline constexpr int64_t kA8GemmCols = 32;

/// Implicit im2col of one image and group: op(B)[r, j] = input[c, oy*s - p + ky*d, ox*s - p + kx*d]
/// (0 outside), r = (c * kH + ky) * kW + kx, j = oy * OW + ox.
struct QuantIm2col {
  const float* in;  // [cin_g, H, W] of this image and group
  const ConvGeometry* g;
};
}  // namespace kiln::cpu
#endif  // KILN_CPU_QUANTIZED_SHARED_

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// 8-bit weights p[0, Lanes) as float32.
HWY_INLINE VF LoadI8(DF d, const uint8_t* HWY_RESTRICT p) {
  const hn::Rebind<int8_t, DF> d8;
  const hn::Rebind<int32_t, DF> di;
  return hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p))));
}

/// The 4-bit values of the packed bytes p[0, Lanes) minus 8, as float32: the low nibbles (Lanes
/// even columns) into lo, the high ones (the odd columns) into hi.
HWY_INLINE void UnpackU4(DF d, const uint8_t* HWY_RESTRICT p, VF& lo, VF& hi) {
  const hn::Rebind<uint8_t, DF> d8;
  const hn::Rebind<int32_t, DF> di;
  const auto u = hn::PromoteTo(di, hn::LoadU(d8, p));
  const auto eight = hn::Set(di, 8);
  lo = hn::ConvertTo(d, hn::Sub(hn::And(u, hn::Set(di, 0xF)), eight));
  hi = hn::ConvertTo(d, hn::Sub(hn::ShiftRight<4>(u), eight));
}

/// acc += w_even * even + w_odd * odd for the packed bytes p[0, Lanes) of a 4-bit row (UnpackU4).
/// kAffine (zero points): the weights dequantized in registers, (u - 8) * s + z, before they
/// multiply x, since the algebraically equal s * sum((u - 8) x) + z * sum(x) turns an infinite x
/// into inf - inf = NaN. Symmetric: the unscaled u - 8 (the caller scales the group's sum once, as
/// aten._weight_int8pack_mm scales x @ q^T: float32 overflows there only for |x| above about
/// 3.4e38 / (8 * group_size / Lanes), e.g. 1e35 at groups of 128, where the portable kernel
/// still gives the finite product).
template <bool kAffine>
HWY_INLINE VF DotU4(DF d, const uint8_t* HWY_RESTRICT p, VF vs, VF vz, VF even, VF odd, VF acc) {
  VF lo, hi;
  UnpackU4(d, p, lo, hi);
  if constexpr (kAffine) {
    lo = hn::MulAdd(lo, vs, vz);
    hi = hn::MulAdd(hi, vs, vz);
  }
  return hn::MulAdd(hi, odd, hn::MulAdd(lo, even, acc));
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
/// With 16 float lanes a 4-bit value can index a vector: DotU4 with the weights looked up in
/// `table` (table[u] = u - 8, or (u - 8) * s + z with zero points; one vpermps per nibble vector
/// instead of a subtraction and a conversion).
/// acc_even += w_even * even, acc_odd += w_odd * odd (two accumulators: half the dependency chain).
HWY_INLINE void DotU4Table(DF d, const uint8_t* HWY_RESTRICT p, VF table, VF even, VF odd, VF& acc_even,
                           VF& acc_odd) {
  const hn::Rebind<uint8_t, DF> d8;
  const hn::Rebind<int32_t, DF> di;
  const auto u = hn::PromoteTo(di, hn::LoadU(d8, p));
  const VF lo = hn::TableLookupLanes(table, hn::IndicesFromVec(d, hn::And(u, hn::Set(di, 0xF))));
  const VF hi = hn::TableLookupLanes(table, hn::IndicesFromVec(d, hn::ShiftRight<4>(u)));
  acc_even = hn::MulAdd(lo, even, acc_even);
  acc_odd = hn::MulAdd(hi, odd, acc_odd);
}
#endif

/// One 4-bit value u as DotU4 weighs it: u - 8, or (u - 8) * s + z with kAffine.
template <bool kAffine>
HWY_INLINE float NibbleWeight(unsigned u, float s, float z) {
  const float v = static_cast<float>(static_cast<int>(u) - 8);
  if constexpr (kAffine) return v * s + z;
  return v;
}

/// DotU4 of one packed byte and its even and odd activation.
template <bool kAffine>
HWY_INLINE float DotU4Byte(uint8_t b, float s, float z, float even, float odd) {
  return NibbleWeight<kAffine>(b & 0xFu, s, z) * even + NibbleWeight<kAffine>(b >> 4u, s, z) * odd;
}

/// out[i, j] = x[i, :] . w[j, :] (+ bias[j]) for i < in.m, rows j in [j0, j1) (row stride of
/// out: w's rows), for decoding: the packed weight is streamed once per row of x and
/// dequantized in registers (8-bit: int8 -> int32 -> float; 4-bit: the nibbles of Lanes bytes
/// against Lanes even and Lanes odd columns of x, see QuantGemvInput and DotU4), four rows of w
/// at a time sharing the loads of x. Symmetric weights: per group, the unscaled vector sum times
/// the group's scale; with zero points (kAffine) each weight is dequantized before it multiplies
/// x. Columns past the last whole vector of a group, and a 4-bit group's columns that share a
/// byte with the next or previous group, are summed in scalar code. Float32 arithmetic
/// throughout; NaN and infinities in x propagate as in the portable kernel.
template <bool kAffine>
void QuantGemvBlocks(const QuantView& w, const QuantGemvInput& in, const float* bias, float* out, int64_t j0,
                     int64_t j1) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const QuantLayout& L = w.layout;
  const int64_t k = L.k, n = L.rows, gs = L.group_size, G = L.num_groups, rb = L.row_bytes;
  for (int64_t j = j0; j < j1; j += 4) {
    const int64_t R = std::min<int64_t>(4, j1 - j);
    // Rows past R repeat row j (computed, never stored).
    const int64_t ja = j, jb = R > 1 ? j + 1 : j, jc = R > 2 ? j + 2 : j, jd = R > 3 ? j + 3 : j;
    const uint8_t* w0 = w.data + ja * rb;
    const uint8_t* w1 = w.data + jb * rb;
    const uint8_t* w2 = w.data + jc * rb;
    const uint8_t* w3 = w.data + jd * rb;
    for (int64_t i = 0; i < in.m; ++i) {
      VF t0 = hn::Zero(d), t1 = hn::Zero(d), t2 = hn::Zero(d), t3 = hn::Zero(d);
      float e0 = 0, e1 = 0, e2 = 0, e3 = 0;  // the scaled scalar tails
      for (int64_t g = 0; g < G; ++g) {
        const int64_t c0 = g * gs, c1 = std::min(c0 + gs, k);
        const float s0 = w.scale(ja, g), s1 = w.scale(jb, g), s2 = w.scale(jc, g), s3 = w.scale(jd, g);
        VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
        float r0 = 0, r1 = 0, r2 = 0, r3 = 0;
        if (L.bits == 8) {
          const float* xi = in.x + i * k;
          int64_t c = c0;
          for (; c + N <= c1; c += N) {
            const VF xv = hn::LoadU(d, xi + c);
            a0 = hn::MulAdd(LoadI8(d, w0 + c), xv, a0);
            a1 = hn::MulAdd(LoadI8(d, w1 + c), xv, a1);
            a2 = hn::MulAdd(LoadI8(d, w2 + c), xv, a2);
            a3 = hn::MulAdd(LoadI8(d, w3 + c), xv, a3);
          }
          for (; c < c1; ++c) {
            r0 += static_cast<float>(static_cast<int8_t>(w0[c])) * xi[c];
            r1 += static_cast<float>(static_cast<int8_t>(w1[c])) * xi[c];
            r2 += static_cast<float>(static_cast<int8_t>(w2[c])) * xi[c];
            r3 += static_cast<float>(static_cast<int8_t>(w3[c])) * xi[c];
          }
        } else {
          const float z0 = w.zero(ja, g), z1 = w.zero(jb, g), z2 = w.zero(jc, g), z3 = w.zero(jd, g);
          const VF vs0 = hn::Set(d, s0), vs1 = hn::Set(d, s1), vs2 = hn::Set(d, s2), vs3 = hn::Set(d, s3);
          const VF vz0 = hn::Set(d, z0), vz1 = hn::Set(d, z1), vz2 = hn::Set(d, z2), vz3 = hn::Set(d, z3);
          const float* xe = in.even + i * in.half;
          const float* xo = in.odd + i * in.half;
          // A group may start on an odd column (the high nibble of a byte shared with the group
          // before) and end on an even one before k (the low nibble of a byte shared with the
          // next): those columns alone, the whole bytes between them in vectors. At k itself an
          // odd k's last byte is whole: its padding nibble meets odd's trailing 0.
          if (c0 & 1) {
            const int64_t h = c0 / 2;
            r0 += NibbleWeight<kAffine>(w0[h] >> 4u, s0, z0) * xo[h];
            r1 += NibbleWeight<kAffine>(w1[h] >> 4u, s1, z1) * xo[h];
            r2 += NibbleWeight<kAffine>(w2[h] >> 4u, s2, z2) * xo[h];
            r3 += NibbleWeight<kAffine>(w3[h] >> 4u, s3, z3) * xo[h];
          }
          const bool split_end = (c1 & 1) != 0 && c1 < k;
          int64_t b = (c0 + 1) / 2;
          const int64_t b1 = split_end ? c1 / 2 : (c1 + 1) / 2;
          if (split_end) {
            const int64_t h = c1 / 2;
            r0 += NibbleWeight<kAffine>(w0[h] & 0xFu, s0, z0) * xe[h];
            r1 += NibbleWeight<kAffine>(w1[h] & 0xFu, s1, z1) * xe[h];
            r2 += NibbleWeight<kAffine>(w2[h] & 0xFu, s2, z2) * xe[h];
            r3 += NibbleWeight<kAffine>(w3[h] & 0xFu, s3, z3) * xe[h];
          }
          for (; b + N <= b1; b += N) {
            const VF ve = hn::LoadU(d, xe + b), vo = hn::LoadU(d, xo + b);
            a0 = DotU4<kAffine>(d, w0 + b, vs0, vz0, ve, vo, a0);
            a1 = DotU4<kAffine>(d, w1 + b, vs1, vz1, ve, vo, a1);
            a2 = DotU4<kAffine>(d, w2 + b, vs2, vz2, ve, vo, a2);
            a3 = DotU4<kAffine>(d, w3 + b, vs3, vz3, ve, vo, a3);
          }
          for (; b < b1; ++b) {
            r0 += DotU4Byte<kAffine>(w0[b], s0, z0, xe[b], xo[b]);
            r1 += DotU4Byte<kAffine>(w1[b], s1, z1, xe[b], xo[b]);
            r2 += DotU4Byte<kAffine>(w2[b], s2, z2, xe[b], xo[b]);
            r3 += DotU4Byte<kAffine>(w3[b], s3, z3, xe[b], xo[b]);
          }
        }
        if constexpr (kAffine) {  // a and r hold dequantized products already
          t0 = hn::Add(t0, a0);
          t1 = hn::Add(t1, a1);
          t2 = hn::Add(t2, a2);
          t3 = hn::Add(t3, a3);
          e0 += r0;
          e1 += r1;
          e2 += r2;
          e3 += r3;
        } else {
          t0 = hn::MulAdd(a0, hn::Set(d, s0), t0);
          t1 = hn::MulAdd(a1, hn::Set(d, s1), t1);
          t2 = hn::MulAdd(a2, hn::Set(d, s2), t2);
          t3 = hn::MulAdd(a3, hn::Set(d, s3), t3);
          e0 += s0 * r0;
          e1 += s1 * r1;
          e2 += s2 * r2;
          e3 += s3 * r3;
        }
      }
      float* o = out + i * n;
      o[ja] = ReduceSum(d, t0) + e0 + (bias ? bias[ja] : 0.0f);
      if (R > 1) o[jb] = ReduceSum(d, t1) + e1 + (bias ? bias[jb] : 0.0f);
      if (R > 2) o[jc] = ReduceSum(d, t2) + e2 + (bias ? bias[jc] : 0.0f);
      if (R > 3) o[jd] = ReduceSum(d, t3) + e3 + (bias ? bias[jd] : 0.0f);
    }
  }
}

/// QuantGemvBlocks for 4-bit weights whose groups are whole vectors of bytes (group_size a
/// positive multiple of 2 Lanes, k a multiple of group_size: every LLM layout with groups of 32 or more), the
/// decode path of language models: the same arithmetic in the same order, without the per-group
/// tests for groups that share bytes and for scalar tails. `scales` / `zeros` (zeros only with
/// kAffine): the float32 scales of rows [j0, j1), row r's group g at (r - j0) * G + g.
template <bool kAffine>
void QuantGemvU4Whole(const QuantView& w, const float* HWY_RESTRICT scales, const float* HWY_RESTRICT zeros,
                      const QuantGemvInput& in, const float* bias, float* out, int64_t j0, int64_t j1) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const QuantLayout& L = w.layout;
  const int64_t n = L.rows, hg = L.group_size / 2, G = L.num_groups, rb = L.row_bytes;
  for (int64_t j = j0; j < j1; j += 4) {
    const int64_t R = std::min<int64_t>(4, j1 - j);
    const int64_t ja = j, jb = R > 1 ? j + 1 : j, jc = R > 2 ? j + 2 : j, jd = R > 3 ? j + 3 : j;
    const uint8_t* w0 = w.data + ja * rb;
    const uint8_t* w1 = w.data + jb * rb;
    const uint8_t* w2 = w.data + jc * rb;
    const uint8_t* w3 = w.data + jd * rb;
    const int64_t oa = (ja - j0) * G, ob = (jb - j0) * G, oc = (jc - j0) * G, od = (jd - j0) * G;
    for (int64_t i = 0; i < in.m; ++i) {
      const float* xe = in.even + i * in.half;
      const float* xo = in.odd + i * in.half;
      VF t0 = hn::Zero(d), t1 = hn::Zero(d), t2 = hn::Zero(d), t3 = hn::Zero(d);
      VF h0 = hn::Zero(d), h1 = hn::Zero(d), h2 = hn::Zero(d), h3 = hn::Zero(d);  // odd columns (table path)
      for (int64_t g = 0; g < G; ++g) {
        if (i == 0 && (g * hg) % 64 == 0) {
          // The rows two blocks ahead at this offset (a 64-byte line per row): with rows of a few
          // KiB a block of 4 rows spans 4 KiB pages that the hardware prefetchers, which stop at a
          // page boundary, would each start cold. One decode step of a 1.24 B-parameter w4 g32
          // model on 1 thread (AMD Zen 4, `kiln bench --profile`): 125 ms without, 98 ms one
          // block ahead, 83-91 ms (median) two blocks ahead. Into L2 (prefetcht2), not L1: a
          // [128256, 2048] product took 14-17 ms that way against 17-18 ms (session 14).
          const int64_t ahead = 8 * rb + g * hg;
          __builtin_prefetch(w0 + ahead, 0, 1);
          __builtin_prefetch(w1 + ahead, 0, 1);
          __builtin_prefetch(w2 + ahead, 0, 1);
          __builtin_prefetch(w3 + ahead, 0, 1);
        }
        const VF vs0 = hn::Set(d, scales[oa + g]), vs1 = hn::Set(d, scales[ob + g]);
        const VF vs2 = hn::Set(d, scales[oc + g]), vs3 = hn::Set(d, scales[od + g]);
        VF vz0 = vs0, vz1 = vs1, vz2 = vs2, vz3 = vs3;  // read only with zero points
        if constexpr (kAffine) {
          vz0 = hn::Set(d, zeros[oa + g]);
          vz1 = hn::Set(d, zeros[ob + g]);
          vz2 = hn::Set(d, zeros[oc + g]);
          vz3 = hn::Set(d, zeros[od + g]);
        }
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        // Lane u of each row's table is its dequantized weight (u - 8) * s (+ z) for this group
        // (QuantView::dequantize's arithmetic), looked up per nibble and accumulated directly: the
        // weights are dequantized before they multiply x, as in the portable kernel.
        const VF iota8 = hn::Sub(hn::Iota(d, 0.0f), hn::Set(d, 8.0f));
        const VF tb0 = kAffine ? hn::MulAdd(iota8, vs0, vz0) : hn::Mul(iota8, vs0);
        const VF tb1 = kAffine ? hn::MulAdd(iota8, vs1, vz1) : hn::Mul(iota8, vs1);
        const VF tb2 = kAffine ? hn::MulAdd(iota8, vs2, vz2) : hn::Mul(iota8, vs2);
        const VF tb3 = kAffine ? hn::MulAdd(iota8, vs3, vz3) : hn::Mul(iota8, vs3);
        for (int64_t b = g * hg, b1 = b + hg; b < b1; b += N) {
          const VF ve = hn::LoadU(d, xe + b), vo = hn::LoadU(d, xo + b);
          DotU4Table(d, w0 + b, tb0, ve, vo, t0, h0);
          DotU4Table(d, w1 + b, tb1, ve, vo, t1, h1);
          DotU4Table(d, w2 + b, tb2, ve, vo, t2, h2);
          DotU4Table(d, w3 + b, tb3, ve, vo, t3, h3);
        }
#else
        VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
        for (int64_t b = g * hg, b1 = b + hg; b < b1; b += N) {
          const VF ve = hn::LoadU(d, xe + b), vo = hn::LoadU(d, xo + b);
          a0 = DotU4<kAffine>(d, w0 + b, vs0, vz0, ve, vo, a0);
          a1 = DotU4<kAffine>(d, w1 + b, vs1, vz1, ve, vo, a1);
          a2 = DotU4<kAffine>(d, w2 + b, vs2, vz2, ve, vo, a2);
          a3 = DotU4<kAffine>(d, w3 + b, vs3, vz3, ve, vo, a3);
        }
        if constexpr (kAffine) {
          t0 = hn::Add(t0, a0);
          t1 = hn::Add(t1, a1);
          t2 = hn::Add(t2, a2);
          t3 = hn::Add(t3, a3);
        } else {
          t0 = hn::MulAdd(a0, vs0, t0);
          t1 = hn::MulAdd(a1, vs1, t1);
          t2 = hn::MulAdd(a2, vs2, t2);
          t3 = hn::MulAdd(a3, vs3, t3);
        }
#endif
      }
      t0 = hn::Add(t0, h0);
      t1 = hn::Add(t1, h1);
      t2 = hn::Add(t2, h2);
      t3 = hn::Add(t3, h3);
      float* o = out + i * n;
      o[ja] = ReduceSum(d, t0) + (bias ? bias[ja] : 0.0f);
      if (R > 1) o[jb] = ReduceSum(d, t1) + (bias ? bias[jb] : 0.0f);
      if (R > 2) o[jc] = ReduceSum(d, t2) + (bias ? bias[jc] : 0.0f);
      if (R > 3) o[jd] = ReduceSum(d, t3) + (bias ? bias[jd] : 0.0f);
    }
  }
}

/// The float32 values of `count` float16 values (F16C / NEON conversions where the target has them).
void WidenHalf(const uint16_t* HWY_RESTRICT src, int64_t count, float* HWY_RESTRICT dst) {
  const DF d;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto* h = reinterpret_cast<const hwy::float16_t*>(src);
  int64_t i = 0;
  for (; i + N <= count; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, h + i)), d, dst + i);
  for (; i < count; ++i) dst[i] = half_to_float(src[i]);
}

/// The float32 scales (and zeros) of rows [j0, j1) of w, row r's group g at (r - j0) * G + g:
/// w's own when they are float32, else widened into a buffer of the calling thread (once per task:
/// 1/16 of the packed bytes at groups of 32).
HWY_INLINE void TaskScales(const QuantView& w, int64_t j0, int64_t j1, const float*& scales, const float*& zeros) {
  const int64_t G = w.layout.num_groups, count = (j1 - j0) * G;
  scales = static_cast<const float*>(w.scales) + j0 * G;
  zeros = w.zeros ? static_cast<const float*>(w.zeros) + j0 * G : nullptr;
  if (w.layout.scale_dtype == DType::Float16) {
    thread_local std::vector<float> widened;
    widened.resize(static_cast<size_t>(2 * count));
    WidenHalf(static_cast<const uint16_t*>(w.scales) + j0 * G, count, widened.data());
    scales = widened.data();
    if (w.zeros) {
      WidenHalf(static_cast<const uint16_t*>(w.zeros) + j0 * G, count, widened.data() + count);
      zeros = widened.data() + count;
    }
  }
}

#undef KILN_A8_X86
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define KILN_A8_X86 1
#if HWY_TARGET == HWY_AVX3_DL
/// acc + vpdpbusd(u, s), EVEX-encoded (AVX512-VNNI + VL, which Highway's AVX3_DL target requires at
/// run time). Inline assembly with an explicit {evex}: the target's compile flags also name the
/// VEX-encoded AVX-VNNI, which AMD Zen 4 lacks (SIGILL there), and the compiler would pick that
/// encoding for the intrinsic.
HWY_INLINE __m256i DpBusd(__m256i acc, __m256i u, __m256i s) {
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}

/// acc + vpdpbusd(u, s) on 512-bit vectors (inline assembly: Highway 1.0.3's avx3_dl flags do not
/// name avx512vnni, so the intrinsic does not compile here; a zmm operand is EVEX-only).
HWY_INLINE __m512i DpBusd512(__m512i acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}
#endif

/// init + int32 lanes of sum over 4-byte groups of u * a (u unsigned 0..15, a signed -127..127) for
/// the low nibbles `lo` against `ae` plus the high ones `hi` against `ao`: vpdpbusd (avx3_dl), else
/// vpmaddubsw (each 16-bit sum at most 4 * 15 * 127, no saturation) and vpmaddwd.
HWY_INLINE __m256i DotNibbles(__m256i init, __m256i lo, __m256i ae, __m256i hi, __m256i ao) {
#if HWY_TARGET == HWY_AVX3_DL
  return DpBusd(DpBusd(init, lo, ae), hi, ao);
#else
  const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ae), _mm256_maddubs_epi16(hi, ao));
  return _mm256_add_epi32(init, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

/// [v[0] x4 | v[1] x4] of two floats.
HWY_INLINE __m256 PairPattern(const float* v) {
  const __m256 two = _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(v))));
  return _mm256_permutevar8x32_ps(two, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

HWY_INLINE float HSum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#else
#define KILN_A8_X86 0
#endif

/// sum over groups g < G of z[g] * e[g]: the zero points' part of a row (src/ir/ops/quant.h).
HWY_INLINE float A8Correction(const float* HWY_RESTRICT z, const float* HWY_RESTRICT e, int64_t G) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF acc = hn::Zero(d);
  int64_t g = 0;
  for (; g + N <= G; g += N) acc = hn::MulAdd(hn::LoadU(d, z + g), hn::LoadU(d, e + g), acc);
  float r = ReduceSum(d, acc);
  for (; g < G; ++g) r += z[g] * e[g];
  return r;
}

/// Rows ahead that QuantGemvA8 prefetches (one 64-byte line per row per line consumed), into L2
/// (prefetcht2, locality 1): prefetcht0 into L1 at any distance read 7.4 GB/s from DRAM against
/// 13-18 GB/s this way (w4 g32 [128256, 2048] matrix-vector product, 1 thread, AMD Zen 4; distance
/// 12-24 rows within noise of each other).
constexpr int64_t kA8PrefetchRows = 16;

#if KILN_A8_X86
/// For the pair of blocks (2p, 2p + 1) of one row of x and four 4-bit weight rows wr[r] (row bytes
/// rb): f[r] = the pair's exact integer dot products (DotNibbles, the codes' offset removed by
/// corr) as float32 lanes times [d[2p] x4 | d[2p + 1] x4]. prefetch: also fetch the rows
/// kA8PrefetchRows ahead into L2 (one line per row every other pair).
HWY_INLINE void A8PairProducts(const uint8_t* const* wr, int64_t rb, int64_t p, const int8_t* q, const int32_t* corr,
                               const float* dd, bool prefetch, __m256 f[4]) {
  if (prefetch && (p & 1) == 0) {
    for (int r = 0; r < 4; ++r) __builtin_prefetch(wr[r] + kA8PrefetchRows * rb + 32 * p, 0, 1);
  }
  const __m256i m0f = _mm256_set1_epi8(0x0F);
  const __m256i ae = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * p));
  const __m256i ao = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * p + 32));
  const __m256i c8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr + 16 * p));
  const __m256 dp = PairPattern(dd + 2 * p);
  for (int r = 0; r < 4; ++r) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[r] + 32 * p));
    const __m256i lo = _mm256_and_si256(wv, m0f);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), m0f);
    f[r] = _mm256_mul_ps(_mm256_cvtepi32_ps(DotNibbles(c8, lo, ae, hi, ao)), dp);
  }
}
#endif

#if HWY_TARGET == HWY_AVX3_DL
/// A8PairProducts on 512-bit vectors for the pairs p and p + 1 (blocks 4h .. 4h + 3, p = 2h): one
/// 64-byte load per weight row, the two pairs' activations (and offset lanes) joined into one
/// vector per call and shared by the 4 rows; f[r] = the 4 blocks' exact integer dot products as
/// float32 lanes (4 per block) times [d[4h] x4 | .. | d[4h + 3] x4]. Prefetches as A8PairProducts.
HWY_INLINE void A8QuadProducts(const uint8_t* const* wr, int64_t rb, int64_t p, const int8_t* q, const int32_t* corr,
                               const float* dd, bool prefetch, __m512 f[4]) {
  if (prefetch) {
    for (int r = 0; r < 4; ++r) __builtin_prefetch(wr[r] + kA8PrefetchRows * rb + 32 * p, 0, 1);
  }
  const auto join = [](const void* a, const void* b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(a))),
                              _mm256_loadu_si256(static_cast<const __m256i*>(b)), 1);
  };
  const __m512i m0f = _mm512_set1_epi8(0x0F);
  const __m512i ae = join(q + 64 * p, q + 64 * p + 64);
  const __m512i ao = join(q + 64 * p + 32, q + 64 * p + 96);
  const __m512i c16 = join(corr + 16 * p, corr + 16 * p + 16);
  const __m512 dp = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                          _mm512_castps128_ps512(_mm_loadu_ps(dd + 2 * p)));
  for (int r = 0; r < 4; ++r) {
    const __m512i wv = _mm512_loadu_si512(wr[r] + 32 * p);
    const __m512i lo = _mm512_and_si512(wv, m0f);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m0f);
    f[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(DpBusd512(DpBusd512(c16, lo, ae), hi, ao)), dp);
  }
}
#endif

/// out[i, j] for rows j in [j0, j1) and the in.m rows of x, activation_bits = 8 (src/ir/ops/quant.h):
/// per block the integer dot product of the weights' codes with x's int8 values, exact in int32
/// (x86: 4-bit weights as unsigned nibbles, vpdpbusd on avx3_dl, vpmaddubsw + vpmaddwd on avx2 /
/// avx3; 8-bit weights + 128 as unsigned bytes with vpdpbusd, sign-extended to 16 bits with
/// vpmaddwd otherwise; the unsigned codes' offset removed in int32 by starting from in.corr),
/// times s * d, summed in float32 per row; zero points added once per row from the per-group sums
/// in.e (A8Correction). Four weight rows at a time share the loads of x. Other targets and the
/// blocks the vector code leaves: A8RowScalar.
void QuantGemvA8(const QuantView& w, const QuantGemvA8Input& in, const float* bias, float* out, int64_t j0, int64_t j1) {
  const QuantLayout& L = w.layout;
  const int64_t n = L.rows, G = L.num_groups, rb = L.row_bytes, B = in.blocks, k = L.k;
  const int64_t bpg = L.group_size / kActivationBlock;
  const float* scales = nullptr;
  const float* zeros = nullptr;
  TaskScales(w, j0, j1, scales, zeros);
  const bool four = L.bits == 4;
  for (int64_t i = 0; i < in.m; ++i) {
    const int8_t* q = in.q + i * k;
    const float* dd = in.d + i * B;
    const float* e = in.e + i * G;
    const int32_t* corr = in.corr + i * B * 8;
#if !KILN_A8_X86
    (void)corr, (void)four;  // the vector paths' inputs
#endif
    for (int64_t j = j0; j < j1; j += 4) {
      const int64_t R = std::min<int64_t>(4, j1 - j);
      int64_t jr[4];
      for (int64_t r = 0; r < 4; ++r) jr[r] = j + std::min(r, R - 1);  // rows past R repeat (never stored)
      const uint8_t* wr[4];
      const float* sr[4];
      for (int r = 0; r < 4; ++r) {
        wr[r] = w.data + jr[r] * rb;
        sr[r] = scales + (jr[r] - j0) * G;
      }
      float res[4] = {0, 0, 0, 0};
      int64_t done = 0;  // blocks handled by the vector code
#if KILN_A8_X86
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      if (four && L.group_size == 32) {
        int64_t p = 0;
#if HWY_TARGET == HWY_AVX3_DL
        __m512 acc16[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        for (; 2 * p + 3 < B; p += 2) {
          __m512 f[4];
          A8QuadProducts(wr, rb, p, q, corr, dd, i == 0, f);
          for (int r = 0; r < 4; ++r) {
            const __m512 sp = _mm512_permutexvar_ps(quad, _mm512_castps128_ps512(_mm_loadu_ps(sr[r] + 2 * p)));
            acc16[r] = _mm512_fmadd_ps(f[r], sp, acc16[r]);
          }
        }
        for (int r = 0; r < 4; ++r) {
          acc[r] = _mm256_add_ps(_mm512_castps512_ps256(acc16[r]), _mm512_extractf32x8_ps(acc16[r], 1));
        }
#endif
        for (; 2 * p + 1 < B; ++p) {
          __m256 f[4];
          A8PairProducts(wr, rb, p, q, corr, dd, i == 0, f);
          for (int r = 0; r < 4; ++r) acc[r] = _mm256_fmadd_ps(f[r], PairPattern(sr[r] + 2 * p), acc[r]);
        }
        done = B / 2 * 2;
      } else if (four && L.group_size % 64 == 0 && k % L.group_size == 0) {
        const int64_t ppg = bpg / 2;  // pairs per group
        for (int64_t g = 0; g < G; ++g) {
          __m256 ga[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
          for (int64_t p = g * ppg; p < (g + 1) * ppg; ++p) {
            __m256 f[4];
            A8PairProducts(wr, rb, p, q, corr, dd, i == 0, f);
            for (int r = 0; r < 4; ++r) ga[r] = _mm256_add_ps(ga[r], f[r]);
          }
          for (int r = 0; r < 4; ++r) acc[r] = _mm256_fmadd_ps(ga[r], _mm256_set1_ps(sr[r][g]), acc[r]);
        }
        done = B;
      } else if (!four) {
        for (int64_t g = 0; g < G; ++g) {
          __m256 ga[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
          for (int64_t b = g * bpg, b1 = std::min(B, (g + 1) * bpg); b < b1; ++b) {
            if (i == 0 && (b & 1) == 0) {
              for (int r = 0; r < 4; ++r) __builtin_prefetch(wr[r] + kA8PrefetchRows * rb + 32 * b, 0, 1);
            }
            const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * b));
            const __m256 db = _mm256_set1_ps(dd[b]);
#if HWY_TARGET == HWY_AVX3_DL
            const __m256i x80 = _mm256_set1_epi8(static_cast<char>(0x80));
            const __m256i c8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr + 8 * b));
            for (int r = 0; r < 4; ++r) {
              const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[r] + 32 * b)), x80);
              ga[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DpBusd(c8, u, qb)), db, ga[r]);
            }
#else
            const __m256i q0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(qb));
            const __m256i q1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(qb, 1));
            for (int r = 0; r < 4; ++r) {
              const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[r] + 32 * b));
              const __m256i w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(wv));
              const __m256i w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(wv, 1));
              const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(w0, q0), _mm256_madd_epi16(w1, q1));
              ga[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), db, ga[r]);
            }
#endif
          }
          for (int r = 0; r < 4; ++r) acc[r] = _mm256_fmadd_ps(ga[r], _mm256_set1_ps(sr[r][g]), acc[r]);
        }
        done = B;
      }
      for (int r = 0; r < 4; ++r) res[r] = HSum256(acc[r]);
#endif
      for (int r = 0; r < R; ++r) {
        const float* zr = zeros ? zeros + (jr[r] - j0) * G : nullptr;
        float v = res[r];
        if (done < B) v += A8RowScalar(wr[r], sr[r], q, dd, L.bits, bpg, B, done, B);
        if (zr) v += A8Correction(zr, e, G);
        if (bias) v += bias[jr[r]];
        out[i * n + jr[r]] = v;
      }
    }
  }
}

#if HWY_TARGET == HWY_AVX3_DL
/// acc + vpdpbusd(u, the 4 int8 at p broadcast to every lane): the broadcast is the instruction's
/// memory operand ({1to16}), no separate broadcast instruction.
HWY_INLINE __m512i DpBusd512Bcast(__m512i acc, __m512i u, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

/// Transposes 16 vectors of 16 int32 (v[i] lane j becomes v[j] lane i): 32-bit then 64-bit
/// interleaves within 128-bit lanes, then two rounds of 128-bit lane shuffles.
HWY_INLINE void Transpose16x16(__m512i v[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + c] lane L = rows 4i .. 4i + 3 at column 4L + c
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // v[4L + c] lane block i = u[4i + c] lane block L
    const __m512i a = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), b = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i e = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), f = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    v[c] = _mm512_shuffle_i32x4(a, e, 0x88);
    v[4 + c] = _mm512_shuffle_i32x4(a, e, 0xDD);
    v[8 + c] = _mm512_shuffle_i32x4(b, f, 0x88);
    v[12 + c] = _mm512_shuffle_i32x4(b, f, 0xDD);
  }
}

/// Bytes ahead in each weight row that QuantGemmA8PackPanels prefetches.
constexpr int64_t kA8PackAhead = 256;

/// Packs output columns [n0, n0 + 32) of the integer GEMM (rows of w; rows past the last repeat it,
/// their results never stored) into `panel` as unsigned bytes for vpdpbusd: for each step s of 4
/// reduction columns, 128 bytes, two 64-byte vectors (columns n0 .. n0 + 15, then n0 + 16 ..), lane t
/// holding the 4 bytes of row n0 + t (+ 16) that the step's 4 int8 activations multiply:
/// 4-bit, the steps 2j and 2j + 1 of the 8 columns 8j .. 8j + 7 (the row's packed dword j) are the
/// low nibbles (the even columns) and the high nibbles (the odd ones), u = wq + 8; 8-bit, the bytes
/// of columns 4s .. 4s + 3 plus 128 (xor 0x80). 64 bytes of 16 rows are loaded, then transposed
/// (Transpose16x16) so that each vector holds one dword of every row. `scales` [G, 32] (and `zeros`
/// with zero points) receive the rows' float32 scales per group from TaskScales.
void QuantGemmA8PackPanels(const QuantView& w, int64_t n0, uint8_t* HWY_RESTRICT panel, float* HWY_RESTRICT scales,
                           float* HWY_RESTRICT zeros) {
  const QuantLayout& L = w.layout;
  const int64_t cols = std::min<int64_t>(kA8GemmCols, L.rows - n0), G = L.num_groups, rb = L.row_bytes;
  const float* rs = nullptr;
  const float* rz = nullptr;
  TaskScales(w, n0, n0 + cols, rs, rz);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < kA8GemmCols; ++t) {
      const int64_t r = std::min(t, cols - 1);
      scales[g * kA8GemmCols + t] = rs[r * G + g];
      if (rz != nullptr) zeros[g * kA8GemmCols + t] = rz[r * G + g];
    }
  }
  const __m512i m0f = _mm512_set1_epi8(0x0F), x80 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t p = 0; p < 2; ++p) {
    const uint8_t* row[16];
    for (int t = 0; t < 16; ++t) row[t] = w.data + (n0 + std::min<int64_t>(16 * p + t, cols - 1)) * rb;
    uint8_t* dst = panel + 64 * p;
    for (int64_t c0 = 0; c0 < rb; c0 += 64) {  // 64 bytes of each row: 16 dwords
      const int64_t nb = std::min<int64_t>(64, rb - c0);
      const __mmask64 keep = nb == 64 ? ~__mmask64{0} : (__mmask64{1} << nb) - 1;
      __m512i v[16];
      for (int t = 0; t < 16; ++t) {
        if (c0 + kA8PackAhead < rb) __builtin_prefetch(row[t] + c0 + kA8PackAhead, 0, 3);
        v[t] = _mm512_maskz_loadu_epi8(keep, row[t] + c0);
      }
      Transpose16x16(v);  // v[j] lane t = dword j of row t
      const int64_t words = nb / 4;
      for (int64_t j = 0; j < words; ++j) {
        const int64_t word = c0 / 4 + j;
        if (L.bits == 4) {  // 8 columns 8 word .. 8 word + 7: even ones (low nibbles), then odd ones
          _mm512_store_si512(dst + 2 * word * 128, _mm512_and_si512(v[j], m0f));
          _mm512_store_si512(dst + (2 * word + 1) * 128, _mm512_and_si512(_mm512_srli_epi32(v[j], 4), m0f));
        } else {  // 4 columns 4 word .. 4 word + 3
          _mm512_store_si512(dst + word * 128, _mm512_xor_si512(v[j], x80));
        }
      }
    }
  }
}

/// out[i, n0 + c] for the MR rows i0 .. i0 + MR - 1 of x and the `cols` (<= 32) columns of one
/// packed panel pair (QuantGemmA8PackPanels), src/ir/ops/quant.h's formula: per block, the exact
/// int32 sum of wq * q (vpdpbusd of the panel's unsigned bytes with 4 broadcast int8 activations,
/// started from in.corr), then out += float(sum) * s * d in float32; zero points add z * e per
/// group; bias last. MR x 2 int32 and MR x 2 float32 accumulators stay in registers. kOneGroup
/// (one group per row: w8 per channel): the blocks' sums are weighted by d only and the scale is
/// applied once at the end, s * sum_b d * sum (one multiplication per block fewer).
template <int MR, bool kOneGroup>
HWY_INLINE void QuantGemmA8Tile(const QuantGemmA8Input& in, int64_t k, int64_t G, int64_t bpg, const uint8_t* HWY_RESTRICT panel,
                                const float* HWY_RESTRICT scales, const float* zeros, const float* bias, int64_t i0,
                                int64_t cols, float* out, int64_t ldo) {
  const int64_t B = in.blocks;
  __m512 accf[MR][2];
  for (int r = 0; r < MR; ++r) accf[r][0] = accf[r][1] = _mm512_setzero_ps();
  const int8_t* xq = in.q + i0 * k;
  for (int64_t b = 0; b < B; ++b) {
    __m512i acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_set1_epi32(in.corr[(i0 + r) * B + b]);
    const uint8_t* pb = panel + b * 8 * 128;
    const int8_t* xb = xq + b * kActivationBlock;
    for (int64_t s = 0; s < 8; ++s) {
      const __m512i w0 = _mm512_load_si512(pb + s * 128);
      const __m512i w1 = _mm512_load_si512(pb + s * 128 + 64);
      for (int r = 0; r < MR; ++r) {
        acc[r][0] = DpBusd512Bcast(acc[r][0], w0, xb + r * k + 4 * s);
        acc[r][1] = DpBusd512Bcast(acc[r][1], w1, xb + r * k + 4 * s);
      }
    }
    if (kOneGroup) {  // the scale is applied once, below
      for (int r = 0; r < MR; ++r) {
        const __m512 dv = _mm512_set1_ps(in.d[(i0 + r) * B + b]);
        accf[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][0]), dv, accf[r][0]);
        accf[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][1]), dv, accf[r][1]);
      }
      continue;
    }
    const float* sg = scales + (b / bpg) * kA8GemmCols;
    const __m512 s0 = _mm512_loadu_ps(sg), s1 = _mm512_loadu_ps(sg + 16);
    for (int r = 0; r < MR; ++r) {
      const __m512 dv = _mm512_set1_ps(in.d[(i0 + r) * B + b]);
      accf[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][0]), _mm512_mul_ps(s0, dv), accf[r][0]);
      accf[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][1]), _mm512_mul_ps(s1, dv), accf[r][1]);
    }
  }
  if (kOneGroup) {
    const __m512 s0 = _mm512_loadu_ps(scales), s1 = _mm512_loadu_ps(scales + 16);
    for (int r = 0; r < MR; ++r) {
      accf[r][0] = _mm512_mul_ps(accf[r][0], s0);
      accf[r][1] = _mm512_mul_ps(accf[r][1], s1);
    }
  }
  if (zeros != nullptr) {
    for (int64_t g = 0; g < G; ++g) {
      const __m512 z0 = _mm512_loadu_ps(zeros + g * kA8GemmCols), z1 = _mm512_loadu_ps(zeros + g * kA8GemmCols + 16);
      for (int r = 0; r < MR; ++r) {
        const __m512 ev = _mm512_set1_ps(in.e[(i0 + r) * G + g]);
        accf[r][0] = _mm512_fmadd_ps(z0, ev, accf[r][0]);
        accf[r][1] = _mm512_fmadd_ps(z1, ev, accf[r][1]);
      }
    }
  }
  const __mmask16 k0 = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
  const __mmask16 k1 = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
  const __m512 b0 = bias ? _mm512_maskz_loadu_ps(k0, bias) : _mm512_setzero_ps();
  const __m512 b1 = bias ? _mm512_maskz_loadu_ps(k1, bias + 16) : _mm512_setzero_ps();
  for (int r = 0; r < MR; ++r) {
    float* o = out + (i0 + r) * ldo;
    _mm512_mask_storeu_ps(o, k0, _mm512_add_ps(accf[r][0], b0));
    _mm512_mask_storeu_ps(o + 16, k1, _mm512_add_ps(accf[r][1], b1));
  }
}

/// QuantGemmA8Tile over all rows of x: 6 at a time, then the rest. Before each tile of 6 rows, a
/// share of the bytes [next, next + next_bytes) (the packed weight rows of the task's next columns,
/// which QuantGemmA8PackPanels reads next) is prefetched into L2, so that the next packing reads
/// them from L2 and not from DRAM (prefill 1-5% faster, Zen 4).
template <bool kOneGroup>
HWY_INLINE void QuantGemmA8Rows(const QuantGemmA8Input& in, int64_t k, int64_t G, int64_t bpg, const uint8_t* HWY_RESTRICT panel,
                                const float* HWY_RESTRICT sc, const float* zeros, const float* b, int64_t cols, float* o, int64_t n,
                                const uint8_t* next, int64_t next_bytes) {
  const int64_t tiles = std::max<int64_t>(1, in.m / 6);
  int64_t i = 0;
  for (int64_t t = 0; i + 6 <= in.m; i += 6, ++t) {
    for (int64_t c = next_bytes * t / tiles / 64 * 64; c < next_bytes * (t + 1) / tiles; c += 64) __builtin_prefetch(next + c, 0, 1);
    QuantGemmA8Tile<6, kOneGroup>(in, k, G, bpg, panel, sc, zeros, b, i, cols, o, n);
  }
  if (in.m < 6) {
    for (int64_t c = 0; c < next_bytes; c += 64) __builtin_prefetch(next + c, 0, 1);
  }
  switch (in.m - i) {
    case 5: QuantGemmA8Tile<5, kOneGroup>(in, k, G, bpg, panel, sc, zeros, b, i, cols, o, n); break;
    case 4: QuantGemmA8Tile<4, kOneGroup>(in, k, G, bpg, panel, sc, zeros, b, i, cols, o, n); break;
    case 3: QuantGemmA8Tile<3, kOneGroup>(in, k, G, bpg, panel, sc, zeros, b, i, cols, o, n); break;
    case 2: QuantGemmA8Tile<2, kOneGroup>(in, k, G, bpg, panel, sc, zeros, b, i, cols, o, n); break;
    case 1: QuantGemmA8Tile<1, kOneGroup>(in, k, G, bpg, panel, sc, zeros, b, i, cols, o, n); break;
    default: break;
  }
}
#endif

/// Whether QuantGemmA8 runs on this target (AVX512-VNNI: Highway's avx3_dl); elsewhere prefill with
/// int8 activations dequantizes them and runs the float GEMM.
bool QuantGemmA8Available() { return HWY_TARGET == HWY_AVX3_DL; }

/// The integer GEMM of prefill (activation_bits = 8): out[i, n] for every row i < in.m and the
/// columns [32 t, 32 t + 32) for t in [t0, t1), in order: the weights of those columns unpacked
/// into a panel of the calling thread (QuantGemmA8PackPanels, 32 * k bytes), then QuantGemmA8Rows
/// (which prefetches the next 32 columns' weight rows). Only on avx3_dl (QuantGemmA8Available);
/// does nothing elsewhere.
void QuantGemmA8(const QuantView& w, const QuantGemmA8Input& in, const float* bias, float* out, int64_t t0, int64_t t1) {
#if HWY_TARGET == HWY_AVX3_DL
  const QuantLayout& L = w.layout;
  const int64_t k = L.k, G = L.num_groups, n = L.rows, rb = L.row_bytes;
  const int64_t bpg = L.group_size / kActivationBlock;
  thread_local std::vector<uint8_t> panel_buf;
  thread_local std::vector<float> scale_buf;
  panel_buf.resize(static_cast<size_t>(k / 4 * 128 + 64));
  scale_buf.resize(static_cast<size_t>(2 * G * kA8GemmCols));
  auto* panel = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(panel_buf.data()) + 63) & ~uintptr_t{63});
  const float* sc = scale_buf.data();
  float* zeros = w.zeros != nullptr ? scale_buf.data() + G * kA8GemmCols : nullptr;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n0 = t * kA8GemmCols, cols = std::min(kA8GemmCols, n - n0);
    QuantGemmA8PackPanels(w, n0, panel, scale_buf.data(), zeros);
    const int64_t next_rows = t + 1 < t1 ? std::min(kA8GemmCols, n - n0 - kA8GemmCols) : 0;
    const uint8_t* next = next_rows > 0 ? w.data + (n0 + kA8GemmCols) * rb : nullptr;
    const float* b = bias ? bias + n0 : nullptr;
    float* o = out + n0;
    if (G == 1) {
      QuantGemmA8Rows<true>(in, k, G, bpg, panel, sc, zeros, b, cols, o, n, next, next_rows * rb);
    } else {
      QuantGemmA8Rows<false>(in, k, G, bpg, panel, sc, zeros, b, cols, o, n, next, next_rows * rb);
    }
  }
#else
  (void)w, (void)in, (void)bias, (void)out, (void)t0, (void)t1;
#endif
}

/// quantize_activation_row (src/kernels/quantized.h) over vectors of this target: the same q, d and
/// qsum bit for bit (|x| and max are exact, d = amax / 127 is the same scalar division, q the
/// IEEE quotient rounded half to even by Round, clamped, converted exactly).
void QuantizeActivationRow(const float* HWY_RESTRICT x, int64_t k, int8_t* HWY_RESTRICT q, float* HWY_RESTRICT d,
                           int32_t* HWY_RESTRICT qsum) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, DF> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  if (kActivationBlock % N != 0) {
    quantize_activation_row(x, k, q, d, qsum);
    return;
  }
  const VF fmax = hn::Set(df, FLT_MAX), lo = hn::Set(df, -127.0f), hi = hn::Set(df, 127.0f);
  for (int64_t b = 0; b * kActivationBlock < k; ++b) {
    const float* xb = x + b * kActivationBlock;
    int8_t* qb = q + b * kActivationBlock;
    VF vmax = hn::Zero(df);
    bool finite = true;
    for (int64_t c = 0; c < kActivationBlock; c += N) {
      const VF a = hn::Abs(hn::LoadU(df, xb + c));
      finite = finite && hn::AllTrue(df, hn::Le(a, fmax));  // false for inf and NaN
      vmax = hn::Max(vmax, a);
    }
    const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
    const float db = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    d[b] = db;
    if (!(db > 0.0f)) {  // all zero, or not finite: q = 0
      for (int64_t c = 0; c < kActivationBlock; ++c) qb[c] = 0;
      qsum[b] = 0;
      continue;
    }
    const VF vd = hn::Set(df, db);
    auto isum = hn::Zero(di);
    for (int64_t c = 0; c < kActivationBlock; c += N) {
      const VF r = hn::Min(hn::Max(hn::Round(hn::Div(hn::LoadU(df, xb + c), vd)), lo), hi);
      const auto iv = hn::ConvertTo(di, r);
      isum = hn::Add(isum, iv);
      hn::StoreU(hn::DemoteTo(d8, iv), d8, qb + c);
    }
    qsum[b] = hn::GetLane(hn::SumOfLanes(di, isum));
  }
}

/// QuantGemvBlocks for this weight: with zero points (asymmetric 4-bit) or without; 4-bit weights
/// in whole-vector groups through QuantGemvU4Whole.
void QuantGemvPacked(const QuantView& w, const QuantGemvInput& in, const float* bias, float* out, int64_t j0,
                     int64_t j1) {
  const DF d;
  const QuantLayout& L = w.layout;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  if (L.bits == 4 && L.group_size % (2 * N) == 0 && L.k % L.group_size == 0) {
    const float* scales = nullptr;
    const float* zeros = nullptr;
    TaskScales(w, j0, j1, scales, zeros);  // widened once per task (1/16 of the packed bytes)
    if (zeros != nullptr) {
      QuantGemvU4Whole<true>(w, scales, zeros, in, bias, out, j0, j1);
    } else {
      QuantGemvU4Whole<false>(w, scales, nullptr, in, bias, out, j0, j1);
    }
    return;
  }
  if (w.zeros != nullptr) {
    QuantGemvBlocks<true>(w, in, bias, out, j0, j1);
  } else {
    QuantGemvBlocks<false>(w, in, bias, out, j0, j1);
  }
}

/// Writes the dequantized columns [c0, c1) of weight row j into column t of a 16-column GEMM panel
/// whose first row is column p0 (panel[(c - p0) * 16 + t] = w[j, c]): whole vectors of the row
/// dequantized in registers ((q * s) for 8-bit; for 4-bit, Lanes bytes give Lanes even and Lanes
/// odd columns, (u - 8) * s + z), their lanes then stored 16 floats apart; the rest (a group's
/// columns past its last whole vector, an odd first column of 4-bit) one at a time with
/// QuantView::dequantize's arithmetic.
void QuantPanelColumn(const QuantView& w, int64_t j, int64_t c0, int64_t c1, int64_t p0, float* panel, int64_t t) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t P = kGemmPanelCols;
  const QuantLayout& L = w.layout;
  const uint8_t* row = w.data + j * L.row_bytes;
  HWY_ALIGN float lo[HWY_MAX_BYTES / sizeof(float)];
  HWY_ALIGN float hi[HWY_MAX_BYTES / sizeof(float)];
  int64_t c = c0;
  while (c < c1) {
    const int64_t g = c / L.group_size;
    const int64_t gend = std::min((g + 1) * L.group_size, c1);
    const float s = w.scale(j, g);
    const VF vs = hn::Set(d, s);
    if (L.bits == 8) {
      for (; c + N <= gend; c += N) {
        hn::Store(hn::Mul(LoadI8(d, row + c), vs), d, lo);
        float* dst = panel + (c - p0) * P + t;
        for (int64_t i = 0; i < N; ++i) dst[i * P] = lo[i];
      }
    } else if ((c & 1) == 0) {
      const float z = w.zero(j, g);
      const VF vz = hn::Set(d, z);
      for (; c + 2 * N <= gend; c += 2 * N) {
        VF vlo, vhi;
        UnpackU4(d, row + c / 2, vlo, vhi);
        hn::Store(hn::MulAdd(vlo, vs, vz), d, lo);
        hn::Store(hn::MulAdd(vhi, vs, vz), d, hi);
        float* dst = panel + (c - p0) * P + t;
        for (int64_t i = 0; i < N; ++i) {
          dst[2 * i * P] = lo[i];
          dst[(2 * i + 1) * P] = hi[i];
        }
      }
    }
    // The group's remaining columns (and an odd first column of 4-bit) one at a time.
    const int64_t rest_end = (L.bits == 4 && (c & 1) != 0) ? c + 1 : gend;
    for (; c < rest_end; ++c) {
      float v;
      w.dequantize(j, c, 1, &v);
      panel[(c - p0) * P + t] = v;
    }
  }
}

/// Writes columns [c0, c1) of the 16-column GEMM panel of weight rows [j0, j0 + cols) (cols <= 16;
/// the panel's other columns zero), panel[(c - p0) * 16 + t] = w[j0 + t, c], a panel row at a time:
/// one 32-bit gather per Lanes rows fetches 4 packed bytes of each row (8 columns of 4-bit, 4 of
/// 8-bit), which are dequantized lane-wise against the rows' scales (and zeros) of the group and
/// stored as whole panel rows. Requires c0 and c1 - c0 to be multiples of those 8 (4) columns and
/// the group size to be a multiple of them, so that a gather stays inside a row and a group.
/// The arithmetic of QuantView::dequantize: (u - 8) * s + z (z = 0 when symmetric), q * s.
void QuantPanelRows(const QuantView& w, int64_t j0, int64_t cols, int64_t c0, int64_t c1, int64_t p0, float* panel) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t P = kGemmPanelCols;
  const QuantLayout& L = w.layout;
  const bool four = L.bits == 4;
  const int64_t step = four ? 8 : 4;  // columns per 4 gathered bytes
  HWY_ALIGN float sc[P];
  HWY_ALIGN float zc[P];
  int64_t group = -1;
  const auto* base = reinterpret_cast<const int32_t*>(w.data);
  for (int64_t c = c0; c < c1; c += step) {
    const int64_t g = c / L.group_size;
    if (g != group) {  // the rows' scales (zeros) of this group; rows past `cols` repeat the last
      group = g;
      for (int64_t t = 0; t < P; ++t) {
        const int64_t j = j0 + std::min(t, cols - 1);
        sc[t] = w.scale(j, g);
        zc[t] = w.zero(j, g);
      }
    }
    const int64_t byte = four ? c / 2 : c;
    for (int64_t t0 = 0; t0 < P; t0 += N) {
      // Byte offsets of the 4 bytes of rows j0 + t0 + lane (rows past `cols` read the last row).
      const auto row = hn::Min(hn::Iota(di, static_cast<int32_t>(t0)), hn::Set(di, static_cast<int32_t>(cols - 1)));
      const auto off = hn::Add(hn::Mul(hn::Add(row, hn::Set(di, static_cast<int32_t>(j0))),
                                       hn::Set(di, static_cast<int32_t>(L.row_bytes))),
                               hn::Set(di, static_cast<int32_t>(byte)));
      const auto v = hn::GatherOffset(di, base, off);
      const VF vs = hn::Load(d, sc + t0), vz = hn::Load(d, zc + t0);
      const auto keep = hn::FirstN(d, static_cast<size_t>(std::max<int64_t>(0, cols - t0)));
      float* dst = panel + (c - p0) * P + t0;
      for (int64_t i = 0; i < step; ++i) {
        VF val;
        if (four) {
          const auto u = hn::And(hn::Shr(v, hn::Set(di, static_cast<int32_t>(4 * i))), hn::Set(di, 0xF));
          val = hn::MulAdd(hn::ConvertTo(d, hn::Sub(u, hn::Set(di, 8))), vs, vz);
        } else {  // int8 byte i of the lane, sign-extended
          const auto q = hn::ShiftRight<24>(hn::Shl(v, hn::Set(di, static_cast<int32_t>(24 - 8 * i))));
          val = hn::Mul(hn::ConvertTo(d, q), vs);
        }
        hn::Store(hn::IfThenElseZero(keep, val), d, dst + i * P);
      }
    }
  }
}

/// B packer for linear: op(B)[p, j] = w[j, p] (x @ w^T), dequantized per 16-column panel: whole
/// 8-column (4-bit) or 4-column (8-bit) runs of the 16 rows by QuantPanelRows where the group size
/// allows, the rest a row at a time by QuantPanelColumn.
void QuantPackWeightPanel(const void* ctx, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float* out) {
  const auto& w = *static_cast<const QuantView*>(ctx);
  const int64_t stride = gemm_panel_stride(kc);
  const int64_t step = w.layout.bits == 4 ? 8 : 4;
  const bool rows = w.layout.group_size % step == 0 && p0 % step == 0 && w.layout.rows * w.layout.row_bytes < (int64_t{1} << 31);
  const int64_t whole_end = rows ? p0 + kc / step * step : p0;
  for (int64_t jp = 0; jp * kGemmPanelCols < nc; ++jp) {
    const int64_t cols = std::min<int64_t>(kGemmPanelCols, nc - jp * kGemmPanelCols);
    float* panel = out + jp * stride;
    if (whole_end > p0) QuantPanelRows(w, j0 + jp * kGemmPanelCols, cols, p0, whole_end, p0, panel);
    if (whole_end < p0 + kc) {
      for (int64_t t = 0; t < cols; ++t) QuantPanelColumn(w, j0 + jp * kGemmPanelCols + t, whole_end, p0 + kc, p0, panel, t);
    }
  }
  if (whole_end >= p0 + kc) return;  // QuantPanelRows zeroed the columns past nc
  // Columns past nc in the last panel are zero.
  const int64_t rem = nc % kGemmPanelCols;
  if (rem != 0) {
    float* panel = out + (nc / kGemmPanelCols) * stride;
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t t = rem; t < kGemmPanelCols; ++t) panel[p * kGemmPanelCols + t] = 0.0f;
    }
  }
}

/// B packer for the convolution: implicit im2col (QuantIm2col) in 16-column panels.
void QuantPackIm2col(const void* ctx, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float* out) {
  const auto& im = *static_cast<const QuantIm2col*>(ctx);
  const ConvGeometry& g = *im.g;
  const int64_t H = g.in_size[0], W = g.in_size[1], OW = g.out_size[1], KH = g.kernel[0], KW = g.kernel[1];
  const int64_t stride = gemm_panel_stride(kc);
  constexpr int P = kGemmPanelCols;
  for (int64_t jp = 0; jp * P < nc; ++jp) {
    int64_t iy0[P], ix0[P];
    bool valid[P];
    for (int t = 0; t < P; ++t) {
      const int64_t j = j0 + jp * P + t;
      valid[t] = jp * P + t < nc;
      iy0[t] = valid[t] ? (j / OW) * g.stride[0] - g.padding[0] : 0;
      ix0[t] = valid[t] ? (j % OW) * g.stride[1] - g.padding[1] : 0;
    }
    float* panel = out + jp * stride;
    for (int64_t p = 0; p < kc; ++p) {
      const int64_t r = p0 + p;
      const int64_t c = r / (KH * KW), ky = (r / KW) % KH, kx = r % KW;
      const float* plane = im.in + c * H * W;
      const int64_t dy = ky * g.dilation[0], dx = kx * g.dilation[1];
      float* dst = panel + p * P;
      for (int t = 0; t < P; ++t) {
        const int64_t iy = iy0[t] + dy, ix = ix0[t] + dx;
        dst[t] = (valid[t] && iy >= 0 && iy < H && ix >= 0 && ix < W) ? plane[iy * W + ix] : 0.0f;
      }
    }
  }
}

/// Dequantizes row r0 + r into buf [r, :] (rows of k floats).
void QuantDequantizeRow(const QuantView& w, int64_t r0, int64_t r, float* buf) {
  w.dequantize(r0 + r, 0, w.layout.k, buf + r * w.layout.k);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
namespace cpu {
HWY_EXPORT(QuantGemvPacked);
HWY_EXPORT(QuantGemvA8);
HWY_EXPORT(QuantGemmA8Available);
HWY_EXPORT(QuantGemmA8);
HWY_EXPORT(QuantizeActivationRow);
HWY_EXPORT(QuantPackWeightPanel);
HWY_EXPORT(QuantPackIm2col);
HWY_EXPORT(QuantDequantizeRow);
}  // namespace cpu

namespace {

/// Calls fn(j0, j1) for the weight rows [0, n) of a matrix-vector product in calls of 16 rows (one
/// widening of their scales each), on the pool's threads in contiguous chunks of n / (8 threads)
/// rows (a multiple of 16) taken in turn: a thread streams a long run of consecutive rows, so the
/// rows that the kernels prefetch ahead (8 or 16) are mostly its own next ones. With tasks of 16
/// rows handed out alternately, each thread's prefetches fetched the other's rows into the wrong
/// core's L2: one w4a8 decode step of a 1.24 B-parameter model took longer on 2 threads (72 ms
/// median) than on 1 (50 ms), AMD Zen 4 (session 14).
template <class Fn>
void gemv_row_chunks(ThreadPool* pool, int64_t n, const Fn& fn) {
  constexpr int64_t kRows = 16;
  const int64_t threads = pool ? std::max<int64_t>(1, pool->num_threads()) : 1;
  const int64_t blocks = (n + kRows - 1) / kRows;
  const int64_t per_chunk = std::max<int64_t>(1, blocks / (8 * threads)) * kRows;
  cpu::parallel_tasks(pool, (n + per_chunk - 1) / per_chunk, [&](int64_t t) {
    const int64_t c1 = std::min(n, (t + 1) * per_chunk);
    for (int64_t j = t * per_chunk; j < c1; j += kRows) fn(j, std::min(c1, j + kRows));
  });
}

/// out[i, :] = x[i, :] @ dequantize(w)^T (+ bias) for the m rows of x [m, k] (row stride of out:
/// w's rows), by QuantGemvPacked over tasks of 16 weight rows: the matrix-vector product of
/// decoding, each row of w streamed once per row of x. For 4-bit weights x is split into its even
/// and odd columns (QuantGemvInput) once per call, in a buffer of the calling thread that grows
/// to the largest call and is then reused.
void quant_gemv(const QuantView& w, const float* x, int64_t m, const float* bias, float* out, ThreadPool* pool) {
  const int64_t k = w.layout.k, n = w.layout.rows;
  cpu::QuantGemvInput in;
  in.m = m;
  in.x = x;
  if (w.layout.bits == 4) {
    thread_local std::vector<float> prep;
    const int64_t half = (k + 1) / 2;
    const size_t need = static_cast<size_t>(m * 2 * half);
    if (prep.size() < need) prep.resize(need);
    float* even = prep.data();
    float* odd = even + m * half;
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * k;
      for (int64_t h = 0; h < half; ++h) {
        even[i * half + h] = xi[2 * h];
        odd[i * half + h] = 2 * h + 1 < k ? xi[2 * h + 1] : 0.0f;
      }
    }
    in.even = even;
    in.odd = odd;
    in.half = half;
  }
  gemv_row_chunks(pool, n, [&](int64_t j0, int64_t j1) { KILN_CPU_DISPATCH(QuantGemvPacked)(w, in, bias, out, j0, j1); });
}

/// e[g] = sum over the blocks b of group g of d[b] * sums[b], for g < G (bpg blocks per group, the
/// last group possibly shorter): the per-group sums of one quantized activation row (d: its B block
/// scales, sums: its B blocks' integer sums) that the zero points multiply (src/ir/ops/quant.h).
void group_sums(const float* d, const int32_t* sums, int64_t B, int64_t G, int64_t bpg, float* e) {
  for (int64_t g = 0; g < G; ++g) {
    float sum = 0.0f;
    for (int64_t b = g * bpg, b1 = std::min(B, (g + 1) * bpg); b < b1; ++b) sum += d[b] * static_cast<float>(sums[b]);
    e[g] = sum;
  }
}

/// quant_gemv for activation_bits = 8: the m <= 4 rows of x quantized once per call
/// (quantize_activation_row; for 4-bit weights reordered into the nibble order of
/// QuantGemvA8Input), then QuantGemvA8 over tasks of 16 weight rows.
void quant_gemv_a8(const QuantView& w, const float* x, int64_t m, const float* bias, float* out, ThreadPool* pool) {
  const QuantLayout& L = w.layout;
  const int64_t k = L.k, n = L.rows, B = k / kActivationBlock, G = L.num_groups, bpg = L.group_size / kActivationBlock;
  thread_local std::vector<int8_t> qbuf;
  thread_local std::vector<float> fbuf;
  thread_local std::vector<int32_t> sbuf;
  thread_local std::vector<int32_t> cbuf;
  qbuf.resize(static_cast<size_t>((m + 1) * k));
  fbuf.resize(static_cast<size_t>(m * (B + G)));
  sbuf.resize(static_cast<size_t>(B));
  cbuf.assign(static_cast<size_t>(m * B * 8), 0);
  int8_t* nat = qbuf.data() + m * k;  // one row in column order (4-bit: reordered below)
  float* d = fbuf.data();
  float* e = d + m * B;
  for (int64_t i = 0; i < m; ++i) {
    int8_t* qi = qbuf.data() + i * k;
    KILN_CPU_DISPATCH(QuantizeActivationRow)(x + i * k, k, L.bits == 4 ? nat : qi, d + i * B, sbuf.data());
    if (L.bits == 4) {
      for (int64_t b = 0; b < B; ++b) {
        int64_t ev, od;
        cpu::A8EvenOdd(b, B, ev, od);
        for (int64_t t = 0; t < 16; ++t) {
          qi[ev + t] = nat[b * 32 + 2 * t];
          qi[od + t] = nat[b * 32 + 2 * t + 1];
        }
      }
    }
    int32_t* ci = cbuf.data() + i * B * 8;
    if (L.bits == 4) {  // per pair (or unpaired last block): lane l = -8 * (q[4l..4l+3] + q[32 + 4l..])
      for (int64_t b = 0; b < B; b += 2) {
        const int8_t* qp = qi + b * 32;
        const int64_t half = b + 1 < B ? 32 : 16;  // bytes of even (and of odd) columns
        for (int64_t l = 0; l < half / 4; ++l) {
          int32_t sum = 0;
          for (int64_t t = 0; t < 4; ++t) sum += qp[4 * l + t] + qp[half + 4 * l + t];
          ci[b * 8 + l] = -8 * sum;
        }
      }
    } else {  // per block: lane l = -128 * q[4l..4l+3]
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t l = 0; l < 8; ++l) {
          int32_t sum = 0;
          for (int64_t t = 0; t < 4; ++t) sum += qi[b * 32 + 4 * l + t];
          ci[b * 8 + l] = -128 * sum;
        }
      }
    }
    group_sums(d + i * B, sbuf.data(), B, G, bpg, e + i * G);
  }
  cpu::QuantGemvA8Input in;
  in.m = m;
  in.blocks = B;
  in.q = qbuf.data();
  in.d = d;
  in.e = e;
  in.corr = cbuf.data();
  gemv_row_chunks(pool, n, [&](int64_t j0, int64_t j1) { KILN_CPU_DISPATCH(QuantGemvA8)(w, in, bias, out, j0, j1); });
}

/// The prefill product with activation_bits = 8 (m > 4 rows of x [m, k]) as an integer GEMM
/// (QuantGemmA8, avx3_dl): the rows quantized in parallel (QuantizeActivationRow; 4-bit weights:
/// each run of 8 columns reordered to its even then odd columns, QuantGemmA8Input), with the
/// blocks' offset corrections and, with zero points, the per-group sums e; then tasks of
/// consecutive 32-column panels.
void quant_gemm_a8(const QuantView& w, const float* x, int64_t m, const float* bias, float* out, ThreadPool* pool) {
  const QuantLayout& L = w.layout;
  const int64_t k = L.k, B = k / kActivationBlock, G = L.num_groups, bpg = L.group_size / kActivationBlock;
  const int32_t offset = L.bits == 4 ? 8 : 128;
  thread_local std::vector<int8_t> qbuf;
  thread_local std::vector<float> fbuf;
  thread_local std::vector<int32_t> cbuf;
  qbuf.resize(static_cast<size_t>(m * k));
  fbuf.resize(static_cast<size_t>(m * (B + G)));
  cbuf.resize(static_cast<size_t>(m * B));
  int8_t* q = qbuf.data();  // the calling thread's buffers (a thread_local named in the tasks is theirs)
  float* d = fbuf.data();
  float* e = d + m * B;
  int32_t* corr = cbuf.data();
  const bool four = L.bits == 4;
  cpu::parallel_tasks(pool, m, [&](int64_t i) {
    int8_t* qi = q + i * k;
    int32_t* ci = corr + i * B;
    KILN_CPU_DISPATCH(QuantizeActivationRow)(x + i * k, k, qi, d + i * B, ci);  // ci = block sums of q
    if (four) {
      for (int64_t c = 0; c < k; c += 8) {
        int8_t t[8];
        for (int64_t h = 0; h < 4; ++h) {
          t[h] = qi[c + 2 * h];
          t[4 + h] = qi[c + 2 * h + 1];
        }
        std::memcpy(qi + c, t, 8);
      }
    }
    if (w.zeros != nullptr) group_sums(d + i * B, ci, B, G, bpg, e + i * G);
    for (int64_t b = 0; b < B; ++b) ci[b] *= -offset;
  });
  cpu::QuantGemmA8Input in;
  in.m = m;
  in.blocks = B;
  in.q = q;
  in.d = d;
  in.corr = corr;
  in.e = w.zeros != nullptr ? e : nullptr;
  // Tasks of consecutive 32-column panels (about 4 per thread), so that each panel's packing can
  // find its weight rows prefetched while the previous panel was multiplied.
  const int64_t panels = (L.rows + cpu::kA8GemmCols - 1) / cpu::kA8GemmCols;
  const int64_t threads = pool ? std::max<int64_t>(1, pool->num_threads()) : 1;
  const int64_t per_task = std::max<int64_t>(1, panels / (4 * threads));
  cpu::parallel_tasks(pool, (panels + per_task - 1) / per_task, [&](int64_t t) {
    KILN_CPU_DISPATCH(QuantGemmA8)(w, in, bias, out, t * per_task, std::min(panels, (t + 1) * per_task));
  });
}

/// Dequantizes rows [r0, r0 + rows) into buf [rows, k] (one row per call).
void dequantize_rows(const QuantView& w, int64_t r0, int64_t r, float* buf) {
  KILN_CPU_DISPATCH(QuantDequantizeRow)(w, r0, r, buf);
}

Error linear(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const int64_t k = x.sizes.back();
  auto wv = quant_view(a, k);
  if (!wv.ok()) return wv.error();
  const QuantView& w = wv.value();
  const int64_t m = x.numel() / k, n = w.layout.rows;
  const float* px = x.data_as<const float>();
  const float* bias = data_or_null(a.inputs[4]);
  float* out = a.outputs[0]->data_as<float>();
  if (m == 0) return {};
  if (m <= 4) {  // decoding
    if (w.layout.activation_bits == 8) {
      quant_gemv_a8(w, px, m, bias, out, a.pool);
    } else {
      quant_gemv(w, px, m, bias, out, a.pool);
    }
    return {};
  }
  if (w.layout.activation_bits == 8 && KILN_CPU_DISPATCH(QuantGemmA8Available)()) {
    quant_gemm_a8(w, px, m, bias, out, a.pool);
    return {};
  }
  if (w.layout.activation_bits == 8) {
    // Prefill without AVX512-VNNI: the input quantized by the same rule and dequantized (q * d, exact in float32), then
    // the float GEMM below: the integer formula of src/ir/ops/quant.h up to float32 rounding.
    thread_local std::vector<float> xq;
    xq.resize(static_cast<size_t>(m * k));
    const int64_t B = k / kActivationBlock;
    float* xqd = xq.data();  // the calling thread's buffer (a thread_local named in the tasks is theirs)
    cpu::parallel_tasks(a.pool, m, [&](int64_t i) {
      std::vector<int8_t> q(static_cast<size_t>(k));
      std::vector<float> d(static_cast<size_t>(B));
      std::vector<int32_t> qs(static_cast<size_t>(B));
      KILN_CPU_DISPATCH(QuantizeActivationRow)(px + i * k, k, q.data(), d.data(), qs.data());
      float* row = xqd + i * k;
      for (int64_t c = 0; c < k; ++c) row[c] = static_cast<float>(q[static_cast<size_t>(c)]) * d[static_cast<size_t>(c / kActivationBlock)];
    });
    px = xqd;
  }
  cpu::GemmEpilogue ep;
  if (bias) {
    ep.bias_kind = cpu::GemmBias::PerCol;
    ep.bias = bias;
  }
  cpu::sgemm_packed_b(m, n, k, 1.0f, px, k, cpu::GemmBPacker{&KILN_CPU_DISPATCH(QuantPackWeightPanel), &w}, 0.0f,
                      out, n, ep, a.pool);
  return {};
}

/// Runs aten.convolution(x, w, b) (float32, attributes `ca`) into `out` with the kernel the registry
/// selects for these types (the optimized one where it accepts the call).
Error run_float_conv(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& out, const Attributes& ca, ThreadPool* pool) {
  const TensorType xt = x.type(), wtt = w.type(), ot = out.type();
  const TensorType bt = b ? b->type() : TensorType{};
  const TensorType* in_types[3] = {&xt, &wtt, b ? &bt : nullptr};
  const TensorType* out_types[1] = {&ot};
  const KernelSignature sig{in_types, out_types, ca};
  KernelFn fn = KernelRegistry::get().select("aten.convolution", sig, KernelSet::Optimized);
  if (fn == nullptr) return Error(ErrorCode::Internal, "no aten.convolution kernel");
  const Tensor* ins[3] = {&x, &w, b};
  Tensor* outs[1] = {&out};
  return fn(KernelArgs{ins, outs, ca, pool});
}

Error convolution(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const std::vector<int64_t> ks = a.attrs.get_ints("kernel_size");
  const int64_t groups = a.attrs.get_int("groups", 1);
  const int64_t cin_g = x.sizes[1] / groups;
  auto wv = quant_view(a, cin_g * ks[0] * ks[1]);
  if (!wv.ok()) return wv.error();
  const QuantView& w = wv.value();
  const Tensor* b = a.inputs[4];
  const TensorType bt = b ? b->type() : TensorType{};
  const TensorType dense{DType::Float32, {w.layout.rows, cin_g, ks[0], ks[1]}};
  Attributes ca{{"stride", a.attrs.get_ints("stride")}, {"padding", a.attrs.get_ints("padding")},
                {"dilation", a.attrs.get_ints("dilation")}, {"transposed", false},
                {"output_padding", std::vector<int64_t>{0}}, {"groups", groups}};
  auto geo = conv_geometry(x.type(), dense, b ? &bt : nullptr, ca);
  if (!geo.ok()) return geo.error();
  const ConvGeometry& g = geo.value();
  const int64_t K = w.layout.k, cout_g = g.out_channels / groups;
  const int64_t H = g.in_size[0], W = g.in_size[1], OH = g.out_size[0], OW = g.out_size[1], HW = OH * OW;
  const float* in = x.data_as<const float>();
  const float* bias = data_or_null(b);
  float* out = a.outputs[0]->data_as<float>();

  if (cin_g == 1 && cout_g == 1) {
    // Depthwise: the weight is only C * kH * kW values (no GEMM reads it repeatedly), so it is
    // dequantized per call into a scratch buffer and run by the aten.convolution kernel that the
    // registry selects for these types (the optimized depthwise one where it accepts the call).
    std::vector<float> wf(static_cast<size_t>(w.layout.rows * K));
    for (int64_t r = 0; r < w.layout.rows; ++r) w.dequantize(r, 0, K, wf.data() + r * K);
    Tensor wt{DType::Float32, dense.sizes, wf.data()};
    return run_float_conv(x, wt, b, *a.outputs[0], ca, a.pool);
  }

  if (groups == 1 && H == 1 && W == 1 && HW == 1 && g.kernel[0] == 1 && g.kernel[1] == 1 && g.padding[0] == 0 && g.padding[1] == 0) {
    // 1x1 convolution of a 1x1 image (squeeze-excite): a matrix-vector product per image.
    for (int64_t nb = 0; nb < g.batch; ++nb) {
      // [C_in] (H = W = 1) -> [C_out]
      quant_gemv(w, in + nb * g.in_channels, 1, bias, out + nb * g.out_channels, a.pool);
    }
    return {};
  }

  const bool pointwise = g.kernel[0] == 1 && g.kernel[1] == 1 && g.stride[0] == 1 && g.stride[1] == 1 &&
                         g.padding[0] == 0 && g.padding[1] == 0;
  const int64_t block = std::clamp<int64_t>((int64_t{1} << 20) / K, 16, std::max<int64_t>(cout_g, 1));
  std::vector<float> wbuf(static_cast<size_t>(std::min(block, cout_g) * K));
  for (int64_t grp = 0; grp < groups; ++grp) {
    for (int64_t r0 = 0; r0 < cout_g; r0 += block) {
      const int64_t rows = std::min(block, cout_g - r0);
      const int64_t oc0 = grp * cout_g + r0;
      cpu::parallel_tasks(a.pool, rows, [&](int64_t r) { dequantize_rows(w, oc0, r, wbuf.data()); });
      cpu::GemmEpilogue ep;
      if (bias) {
        ep.bias_kind = cpu::GemmBias::PerRow;
        ep.bias = bias + oc0;
      }
      if (!pointwise && groups == 1 && g.batch == 1) {
        // One image: this block of output channels is one contiguous [1, rows, OH, OW] slice of
        // the output, computed by the aten.convolution kernel with the dequantized block as weight.
        Tensor wt{DType::Float32, {rows, cin_g, g.kernel[0], g.kernel[1]}, wbuf.data()};
        Tensor bt_blk{DType::Float32, {rows}, const_cast<float*>(bias ? bias + oc0 : nullptr)};
        Tensor ot{DType::Float32, {1, rows, OH, OW}, out + oc0 * HW};
        KILN_RETURN_IF_ERROR(run_float_conv(x, wt, bias ? &bt_blk : nullptr, ot, ca, a.pool));
        continue;
      }
      for (int64_t nb = 0; nb < g.batch; ++nb) {
        const float* xin = in + (nb * g.in_channels + grp * cin_g) * H * W;
        float* o = out + (nb * g.out_channels + oc0) * HW;
        if (pointwise) {
          cpu::sgemm(false, false, rows, HW, K, 1.0f, wbuf.data(), K, xin, HW, 0.0f, o, HW, ep, a.pool);
        } else {
          const cpu::QuantIm2col im{xin, &g};
          cpu::sgemm_packed_b(rows, HW, K, 1.0f, wbuf.data(), K, cpu::GemmBPacker{&KILN_CPU_DISPATCH(QuantPackIm2col), &im}, 0.0f, o, HW, ep,
                              a.pool);
        }
      }
    }
  }
  return {};
}

/// Float32 activations and output, on every SIMD target (the per-call loops are compiled for each).
bool accepts(const KernelSignature& sig) {
  return sig.inputs[0] != nullptr && sig.inputs[0]->dtype == DType::Float32 && sig.outputs[0] != nullptr &&
         sig.outputs[0]->dtype == DType::Float32;
}

}  // namespace

void register_cpu_quantized(KernelRegistry& r) {
  r.add_optimized("kiln.weight_quantized_linear", linear, accepts);
  // As aten.convolution: the convolution path depends on the spatial sizes.
  r.add_optimized("kiln.weight_quantized_convolution", convolution, accepts, nullptr, /*sizes_at_call=*/false);
}

}  // namespace kiln
#endif  // HWY_ONCE

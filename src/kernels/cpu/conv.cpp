// Optimized cpu kernel for aten.convolution (float32, 1-D and 2-D; NCHW).
//
// Eight paths, chosen per call (semantics: src/kernels/portable/conv.cpp):
//   depthwise (C_in/groups == 1, any multiplier): direct AVX2 kernels: output rows of at most 32
//     columns and multiplier 1 take 8 channels at a time, interleaved (depthwise_c8); the others
//     work on the padded, stride-split input plane (see DwLayout): 3x3 and 5x5 taps row by row
//     with the taps unrolled (dw_plane_rows), other kernels as a flat 1-D correlation;
//   1x1, one group, a 1x1 input plane (squeeze-excite), constant weights: a matrix-vector product
//     on weights packed in blocks of 32 output channels (pointwise_gemv);
//   1x1, stride 1, no padding, one group, C_in <= 256 (<= 1024 on planes of at most 64 pixels),
//     constant weights: a direct kernel on the NCHW planes (pointwise_direct: no packing of the
//     input, bias, activation and a residual add in registers);
//   other 1x1, stride 1, no padding: out[n, group] = W[C_out_g x C_in_g] * X[n, group][C_in_g x H*W], one GEMM;
//   3x3, stride 1, dilation 1, one group, constant weights, large enough (cpu::winograd_applies):
//     Winograd F(4x4, 3x3) or, for large filters on small planes, F(2x2, 3x3) (winograd.cpp,
//     cpu::winograd_tile), filters transformed once in conv_prepare (instead of the packed weights);
//   few input channels (C_in <= 4, C_in * kH * kW <= 64, e.g. an RGB 3x3 stem), stride 1 or 2: direct
//     (conv_direct.cpp), on the raw weights;
//   everything else: GEMM per group on the im2col matrix, packed on the fly (no im2col buffer).
//   transposed: GEMM into a column buffer, then col2im (conv_transposed).
//
// Prepared state (conv_prepare, once per Method instance): constant weights of the GEMM paths
// packed into the GEMM's A panels once (cpu::pack_a_for_gemm) instead of on every call, and an
// activation that directly follows the convolution (relu, hardswish, hardsigmoid, hardtanh,
// clamp, sigmoid, silu: cpu::post_op_of) applied in the store of each output value; the result is
// bit-identical to the convolution followed by the cpu activation kernel.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ir/ops/conv.h"
#include "kernels/cpu/conv_direct.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/winograd.h"
#include "kernels/kernel.h"

namespace kiln {
namespace {

Result<ConvGeometry> geometry_of(const TensorType& x, const TensorType& w, const TensorType* b, const Attributes& attrs) {
  return conv_geometry(x, w, b, attrs);
}

/// Depthwise (one input channel per group) and the padded, stride-split plane of DwLayout stays
/// within a small multiple of the input and output planes (huge strides or paddings would make it
/// much larger: those go through the GEMM path, whose memory is bounded).
bool use_depthwise_kernel(const ConvGeometry& g) {
  if (g.groups <= 1 || g.in_channels != g.groups) return false;
  const double s0 = static_cast<double>(g.stride[0]), s1 = static_cast<double>(g.stride[1]);
  const double lh = std::ceil((static_cast<double>(g.in_size[0]) + 2.0 * static_cast<double>(g.padding[0])) / s0);
  const double lw = std::ceil((static_cast<double>(g.in_size[1]) + 2.0 * static_cast<double>(g.padding[1])) / s1);
  const double total = s0 * s1 * (lh * lw + lw + 16.0);
  const double planes = static_cast<double>(g.in_size[0]) * static_cast<double>(g.in_size[1]) +
                        static_cast<double>(g.out_size[0]) * static_cast<double>(g.out_size[1]);
  return total <= 4.0 * planes + 65536.0;
}

/// Floats of the column buffer of a transposed convolution (per image and group:
/// C_out_g * KH * KW rows of IH * IW columns).
double transposed_col_floats(const ConvGeometry& g) {
  return static_cast<double>(g.out_channels / g.groups) * static_cast<double>(g.kernel[0] * g.kernel[1]) *
         static_cast<double>(g.in_size[0] * g.in_size[1]);
}

bool conv_accepts(const KernelSignature& sig) {
  if (!cpu::has_avx2_fma()) return false;
  if (sig.inputs.size() != 3 || sig.inputs[0] == nullptr || sig.inputs[1] == nullptr) return false;
  auto g = geometry_of(*sig.inputs[0], *sig.inputs[1], sig.inputs[2], sig.attrs);
  if (!g.ok()) return false;
  // Transposed: GEMM + col2im with a column buffer of at most 64 Mi floats (256 MiB); larger
  // ones stay on the portable kernel rather than allocate without bound.
  return !g->transposed || transposed_col_floats(*g) <= 64.0 * 1024 * 1024;
}

/// Layout of one depthwise input plane after padding and splitting by stride: the padded plane
/// (Hp = IH + 2 PH rows, Wp = IW + 2 PW columns) becomes SH * SW phase planes; phase (r, c) holds
/// padded rows r, r + SH, ... and columns c, c + SW, ..., as Lh x Lw rows with pitch Lw, plus
/// `tail` zeros so that vector reads past the last row stay inside the buffer.
/// Then for every tap (kh, kw) the input of output (oh, ow) sits at phase (a % SH, b % SW),
/// index (oh + a / SH) * Lw + ow + b / SW with a = kh*DH, b = kw*DW: the output plane, laid out
/// with pitch Lw, is a 1-D correlation over a flat array, which vectorizes for any size, stride
/// and dilation (columns ow >= OW of that layout are computed and dropped).
struct DwLayout {
  int64_t Lh, Lw, plane, tail, total;
  explicit DwLayout(const ConvGeometry& g) {
    const int64_t Hp = g.in_size[0] + 2 * g.padding[0], Wp = g.in_size[1] + 2 * g.padding[1];
    Lh = (Hp + g.stride[0] - 1) / g.stride[0];
    Lw = (Wp + g.stride[1] - 1) / g.stride[1];
    tail = Lw + 16;
    plane = Lh * Lw + tail;
    total = g.stride[0] * g.stride[1] * plane;
  }
};

/// What conv_prepare built for one instruction.
struct ConvState : KernelState {
  cpu::PostOp post;             ///< fused activation (None when nothing was fused)
  std::vector<float> packed;    ///< per group, packed_a_floats(C_out_g, K) floats; empty: pack per call
  int64_t group_stride = 0;     ///< floats between consecutive groups' packed weights
  std::vector<float> winograd;  ///< transformed filters (cpu::winograd_pack_weights); empty: no Winograd
  int winograd_tile = 0;        ///< their output tile (cpu::winograd_tile: 4 or 2)
  std::vector<float> pw_w, pw_b;  ///< direct pointwise path (pack_pointwise); empty: not used
  std::vector<float> gv_w, gv_b;  ///< one-pixel pointwise path (pack_pointwise_gemv); empty: not used
  bool residual = false;          ///< a following aten.add (alpha 1) fused: + KernelArgs::inputs[3]
  /// Winograd and GEMM paths: a following residual aten.add (alpha 1) fused, + KernelArgs::inputs[3]
  /// after the convolution (no activation before it), then `after` (FusionCandidate::then, e.g.
  /// resnet's relu; None when not fused).
  bool residual_gw = false;
  cpu::PostOp after;
};

/// out[i] = after(out[i] + res[i]) over [N, C, plane] (the GEMM paths' fused residual add and
/// activation, run after the product while the output is still in the caches), split over the
/// planes on `pool`.
void residual_planes(float* out, const float* res, int64_t planes, int64_t plane, ThreadPool* pool,
                     const cpu::PostOp& after) {
  cpu::parallel_range(pool, planes, std::max<int64_t>(1, 8192 / std::max<int64_t>(plane, 1)), [&](int64_t b, int64_t e) {
    cpu::residual_inplace(out + b * plane, res + b * plane, (e - b) * plane, after);
  });
}

/// 1x1 kernel, stride 1, no padding (dilation is then irrelevant): the plain GEMM path.
bool is_plain_1x1(const ConvGeometry& g) {
  return g.kernel[0] == 1 && g.kernel[1] == 1 && g.stride[0] == 1 && g.stride[1] == 1 && g.padding[0] == 0 &&
         g.padding[1] == 0;
}

/// The post-op applied to one vector, with the kind fixed at compile time where it is one of the
/// common ones (Generic: cpu::apply8's switch); the same float operations as cpu::apply8.
enum class PwPost { None, Relu, Hardswish, Generic };
template <PwPost P>
KILN_AVX2 inline __m256 pw_post(const cpu::PostOp& post, __m256 v) {
  if constexpr (P == PwPost::None) return v;
  if constexpr (P == PwPost::Relu) return cpu::relu8(v);
  if constexpr (P == PwPost::Hardswish) return cpu::hardswish8(v);
  if constexpr (P == PwPost::Generic) return cpu::apply8(post, v);
  return v;
}

/// Calls f(std::integral_constant<PwPost, P>{}) with the P that computes `post`.
template <class F>
void with_post_kind(const cpu::PostOp& post, F&& f) {
  switch (post.kind) {
    case cpu::PostOp::Kind::None: f(std::integral_constant<PwPost, PwPost::None>{}); return;
    case cpu::PostOp::Kind::Relu: f(std::integral_constant<PwPost, PwPost::Relu>{}); return;
    case cpu::PostOp::Kind::Hardswish: f(std::integral_constant<PwPost, PwPost::Hardswish>{}); return;
    default: f(std::integral_constant<PwPost, PwPost::Generic>{}); return;
  }
}

/// Copies input row `src` [IW] into padded row r of `buf` (phase planes as DwLayout).
__attribute__((target("avx2,fma"))) void dw_scatter_row(const ConvGeometry& g, const DwLayout& L, const float* src,
                                                        int64_t r, float* buf) {
  const int64_t IW = g.in_size[1], SH = g.stride[0], SW = g.stride[1], PW = g.padding[1];
  float* rowbase = buf + (r % SH) * SW * L.plane + (r / SH) * L.Lw;  // phase (r % SH, 0)
  if (SW == 1) {
    std::memcpy(rowbase + PW, src, sizeof(float) * static_cast<size_t>(IW));
    return;
  }
  if (SW == 2) {
    // x[2t] -> padded column 2t + PW, x[2t + 1] -> 2t + 1 + PW
    cpu::split_even_odd(src, IW, rowbase + (PW % 2) * L.plane + PW / 2, rowbase + ((PW + 1) % 2) * L.plane + (PW + 1) / 2);
    return;
  }
  for (int64_t iw = 0; iw < IW; ++iw) {
    const int64_t c = iw + PW;
    rowbase[(c % SW) * L.plane + c / SW] = src[iw];
  }
}

/// NV vectors (8 output columns each) of one output row of a depthwise plane with KK taps:
/// o[8 v + i] = post(bias + sum_t wk[t] * src[t][ow + 8 v + i]), taps in order with fused
/// multiply-add from the bias (the same operations as depthwise_plane's flat loop); `n` columns
/// are stored (8 (NV - 1) < n <= 8 NV). The NV accumulators stay in registers (every loop over v
/// unrolled); with NV = 8 there are enough independent FMA chains to cover the FMA latency.
template <int KK, int NV, PwPost P>
KILN_AVX2 inline void dw_row_vectors(const float* const* src, int64_t ow, const float* wk, __m256 b0, float* o,
                                     int64_t n, const cpu::PostOp& post) {
  __m256 acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = b0;
#pragma GCC unroll 25
  for (int t = 0; t < KK; ++t) {
    const __m256 wv = _mm256_broadcast_ss(wk + t);
    const float* p = src[t] + ow;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p + 8 * v), acc[v]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV - 1; ++v) _mm256_storeu_ps(o + 8 * v, pw_post<P>(post, acc[v]));
  const int64_t last = n - 8 * (NV - 1);
  if (last == 8) {
    _mm256_storeu_ps(o + 8 * (NV - 1), pw_post<P>(post, acc[NV - 1]));
  } else {
    cpu::store_tail(o + 8 * (NV - 1), last, pw_post<P>(post, acc[NV - 1]));
  }
}

/// One depthwise output plane out [OH, OW] (weights wk [KK], KK = 9 or 25) from the DwLayout
/// buffer `base` (tap t at offset tap[t]; see depthwise_plane), output row by output row: each
/// row in blocks of 64 columns, then one block of the remaining 1..63 (1..8 vectors, the last
/// one stored masked), straight into the output (no pitch-Lw temporary, no padding columns
/// computed). Reads stay inside the buffer: row oh reads at most (oh + (KH-1)*DH / SH) * Lw +
/// (KW-1)*DW / SW + round_up(OW, 8) <= (Lh - 1) * Lw + Lw + 7 floats into a phase plane, since
/// (OH - 1) * SH + (KH - 1) * DH < Hp and likewise along W; the phase plane has Lw + 16 floats of
/// tail.
template <int KK, PwPost P>
KILN_AVX2 void dw_plane_rows(const float* base, const int64_t* tap, int64_t Lw, const float* wk, float bias,
                             float* out, int64_t OH, int64_t OW, const cpu::PostOp& post) {
  const __m256 b0 = _mm256_set1_ps(bias);
  const float* src[KK];
  for (int64_t oh = 0; oh < OH; ++oh) {
    for (int t = 0; t < KK; ++t) src[t] = base + oh * Lw + tap[t];
    float* o = out + oh * OW;
    int64_t ow = 0;
    for (; ow + 64 <= OW; ow += 64) dw_row_vectors<KK, 8, P>(src, ow, wk, b0, o + ow, 64, post);
    const int64_t r = OW - ow;
    switch ((r + 7) / 8) {
      case 1: dw_row_vectors<KK, 1, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 2: dw_row_vectors<KK, 2, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 3: dw_row_vectors<KK, 3, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 4: dw_row_vectors<KK, 4, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 5: dw_row_vectors<KK, 5, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 6: dw_row_vectors<KK, 6, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 7: dw_row_vectors<KK, 7, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 8: dw_row_vectors<KK, 8, P>(src, ow, wk, b0, o + ow, r, post); break;
      default: break;  // r == 0
    }
  }
}

/// Depthwise convolution of one input plane x [IH, IW] into `mult` output planes out [mult, OH, OW]
/// with weights w [mult, KH, KW] and bias [mult] (or null):
///   out[m, oh, ow] = bias[m] + sum_{kh, kw} w[m, kh, kw] * x[oh*SH - PH + kh*DH, ow*SW - PW + kw*DW]
/// (zero outside x), computed on the DwLayout of the plane (`buf`, `tmp`: per-thread scratch).
__attribute__((target("avx2,fma"))) void depthwise_plane(const ConvGeometry& g, const DwLayout& L, const float* x,
                                                         const float* w, const float* bias, float* out, int64_t mult,
                                                         std::vector<float>& buf, std::vector<float>& tmp,
                                                         std::vector<int64_t>& tap, const cpu::PostOp& post) {
  const int64_t IH = g.in_size[0], IW = g.in_size[1], OH = g.out_size[0], OW = g.out_size[1];
  const int64_t KH = g.kernel[0], KW = g.kernel[1], SH = g.stride[0], SW = g.stride[1];
  const int64_t PH = g.padding[0], DH = g.dilation[0], DW = g.dilation[1];
  // `buf` was zeroed when laid out for this geometry's (IH, IW, PH, PW, SH, SW) (see depthwise):
  // the scatter writes the same positions for every plane of it, so the padding stays zero from
  // one plane (and one call) to the next.
  for (int64_t ih = 0; ih < IH; ++ih) dw_scatter_row(g, L, x + ih * IW, ih + PH, buf.data());
  for (int64_t kh = 0; kh < KH; ++kh) {
    for (int64_t kw = 0; kw < KW; ++kw) {
      const int64_t a = kh * DH, b = kw * DW;
      tap[static_cast<size_t>(kh * KW + kw)] = ((a % SH) * SW + b % SW) * L.plane + (a / SH) * L.Lw + b / SW;
    }
  }
  const int64_t KK = KH * KW;
  if (KK == 9 || KK == 25) {  // 3x3, 5x5: taps unrolled, output rows written in place
    with_post_kind(post, [&](auto kind) {
      constexpr PwPost P = decltype(kind)::value;
      for (int64_t m = 0; m < mult; ++m) {
        const float bm = bias != nullptr ? bias[m] : 0.0f;
        if (KK == 9) {
          dw_plane_rows<9, P>(buf.data(), tap.data(), L.Lw, w + m * KK, bm, out + m * OH * OW, OH, OW, post);
        } else {
          dw_plane_rows<25, P>(buf.data(), tap.data(), L.Lw, w + m * KK, bm, out + m * OH * OW, OH, OW, post);
        }
      }
    });
    return;
  }
  const int64_t count = OH * L.Lw;  // flat outputs with pitch Lw
  const bool direct = L.Lw == OW;   // the flat layout is the output layout
  const float* base = buf.data();
  for (int64_t m = 0; m < mult; ++m) {
    const float* wk = w + m * KK;
    float* dst = direct ? out + m * OH * OW : tmp.data();
    const __m256 b0 = _mm256_set1_ps(bias != nullptr ? bias[m] : 0.0f);
    int64_t q = 0;
    for (; q + 32 <= count; q += 32) {
      __m256 a0 = b0, a1 = b0, a2 = b0, a3 = b0;
      for (int64_t t = 0; t < KK; ++t) {
        const __m256 wv = _mm256_broadcast_ss(wk + t);
        const float* p = base + tap[static_cast<size_t>(t)] + q;
        a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p), a0);
        a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p + 8), a1);
        a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p + 16), a2);
        a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p + 24), a3);
      }
      if (post.kind != cpu::PostOp::Kind::None) {
        a0 = cpu::apply8(post, a0);
        a1 = cpu::apply8(post, a1);
        a2 = cpu::apply8(post, a2);
        a3 = cpu::apply8(post, a3);
      }
      _mm256_storeu_ps(dst + q, a0);
      _mm256_storeu_ps(dst + q + 8, a1);
      _mm256_storeu_ps(dst + q + 16, a2);
      _mm256_storeu_ps(dst + q + 24, a3);
    }
    for (; q < count; q += 8) {  // reads stay inside the tail; stores go through a temporary
      __m256 a0 = b0;
      for (int64_t t = 0; t < KK; ++t) {
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(wk + t), _mm256_loadu_ps(base + tap[static_cast<size_t>(t)] + q), a0);
      }
      if (post.kind != cpu::PostOp::Kind::None) a0 = cpu::apply8(post, a0);
      alignas(32) float v[8];
      _mm256_store_ps(v, a0);
      const int64_t n = std::min<int64_t>(8, count - q);
      std::memcpy(dst + q, v, sizeof(float) * static_cast<size_t>(n));
    }
    if (!direct) {
      float* o = out + m * OH * OW;
      for (int64_t oh = 0; oh < OH; ++oh) {
        std::memcpy(o + oh * OW, dst + oh * L.Lw, sizeof(float) * static_cast<size_t>(OW));
      }
    }
  }
}

/// Channel-blocked depthwise convolution (one output channel per input channel): 8 channels at a
/// time, interleaved so that one AVX2 vector holds one pixel of 8 channels (the NCHW8c blocking
/// that oneDNN and ONNX Runtime's MLAS use for depthwise convolution, done locally here):
///   1. the block's input planes are transposed into a zero-padded buffer in[Hp][Wp][8]
///      (Hp = IH + 2 PH, Wp = IW + 2 PW);
///   2. 8 output pixels at a time: out[oh, ow, :] = bias + sum_{kh, kw} w[:, kh, kw] *
///      in[oh*SH + kh*DH, ow*SW + kw*DW, :], taps in (kh, kw) order with fused multiply-add, the
///      same order and operations as depthwise_plane (the two give bit-identical results);
///   3. the [OH*OW][8] result is transposed back into the 8 output planes, post-op applied.
/// Every output lane does useful work at any plane size and stride (the flat-plane kernel wastes
/// the (Lw - OW) / Lw padding columns of each row and pays a per-plane set-up, which dominates at
/// 7x7 and 14x14).
struct DwC8 {
  int64_t Hp, Wp;
  explicit DwC8(const ConvGeometry& g)
      : Hp(g.in_size[0] + 2 * g.padding[0]), Wp(g.in_size[1] + 2 * g.padding[1]) {}
  /// Floats of the padded input buffer, plus 8 pixels of slack for the tail transposes.
  int64_t in_floats() const { return (Hp * Wp + 8) * 8; }
};

/// Whether depthwise_c8 takes this geometry: multiplier 1 and output rows of at most 32 columns
/// (mobilenet_v3's 28x28, 14x14 and 7x7 layers). On wider planes the flat-plane kernel wastes
/// little and skips the two transposes. Measured here, one thread, flat vs c8: 16 ch 112x112 3x3
/// s1 0.12 vs 0.16 ms; 72 ch 56x56 3x3 0.15 vs 0.17 ms; 672 ch 14x14 3x3 0.14 vs 0.10 ms;
/// 672 ch 14x14 5x5 s2 0.26 vs 0.065 ms; 960 ch 7x7 5x5 0.21 vs 0.073 ms. The padded block
/// buffer stays within 4 Mi floats (16 MiB) per thread.
bool use_depthwise_c8(const ConvGeometry& g) {
  if (g.out_channels != g.groups || g.out_size[1] > 32) return false;
  const DwC8 L(g);
  return static_cast<double>(L.Hp) * static_cast<double>(L.Wp) * 8.0 <= 4.0 * 1024 * 1024;
}

/// Channels [c0, c0 + nc) (nc <= 8) of one image: x [C, IH, IW] planes -> out [C, OH, OW] planes.
/// `in` (DwC8::in_floats) has zero borders; `acc` holds round_up(OH * OW, 8) pixels of 8 floats.
/// The output pixels are taken 8 at a time in flat order (oh * OW + ow, across rows), each with
/// its own input position, so only the plane's last block is partial.
template <PwPost P>
__attribute__((target("avx2,fma"))) void depthwise_c8_block(const ConvGeometry& g, const DwC8& L, const float* x,
                                                            const float* w, const float* bias, float* out, int64_t c0,
                                                            int64_t nc, float* in, float* acc,
                                                            const cpu::PostOp& post) {
  const int64_t IH = g.in_size[0], IW = g.in_size[1], OH = g.out_size[0], OW = g.out_size[1];
  const int64_t KH = g.kernel[0], KW = g.kernel[1], SH = g.stride[0], SW = g.stride[1];
  const int64_t PH = g.padding[0], PW = g.padding[1], DH = g.dilation[0], DW = g.dilation[1];
  const int64_t KK = KH * KW, IHW = IH * IW, OHW = OH * OW, Wp = L.Wp;
  // Weights [KK][8] and bias [8] of the block (zero for lanes past nc), and each tap's offset in `in`.
  thread_local std::vector<float> w8v;
  thread_local std::vector<int64_t> tapv;
  w8v.resize(static_cast<size_t>(8 * (KK + 1)));
  tapv.resize(static_cast<size_t>(KK));
  float* w8 = w8v.data();
  int64_t* tap = tapv.data();
  for (int64_t kh = 0; kh < KH; ++kh) {
    for (int64_t kw = 0; kw < KW; ++kw) tap[kh * KW + kw] = (kh * DH * Wp + kw * DW) * 8;
  }
  for (int64_t t = 0; t < KK; ++t) {
    for (int64_t c = 0; c < 8; ++c) w8[t * 8 + c] = c < nc ? w[(c0 + c) * KK + t] : 0.0f;
  }
  float* b8 = w8 + KK * 8;
  for (int64_t c = 0; c < 8; ++c) b8[c] = c < nc && bias != nullptr ? bias[c0 + c] : 0.0f;
  // 1. transpose the input planes into the interior of `in`.
  const float* xc[8];
  for (int64_t c = 0; c < 8; ++c) xc[c] = x + (c0 + std::min(c, nc - 1)) * IHW;
  for (int64_t ih = 0; ih < IH; ++ih) {
    float* dst = in + ((ih + PH) * Wp + PW) * 8;
    for (int64_t iw = 0; iw < IW; iw += 8) {
      const int64_t n = std::min<int64_t>(8, IW - iw);
      __m256 r[8];
      for (int64_t c = 0; c < 8; ++c) {
        const float* src = xc[c] + ih * IW + iw;
        r[c] = c >= nc ? _mm256_setzero_ps() : n == 8 ? _mm256_loadu_ps(src) : cpu::load_tail(src, n);
      }
      cpu::transpose8x8(r);
      // Pixels past IW are zeros (masked loads) written into this row's right padding or the
      // next row's left padding (zero anyway; the next row's interior is written after this).
      for (int64_t k = 0; k < 8; ++k) _mm256_storeu_ps(dst + (iw + k) * 8, r[k]);
    }
  }
  // 2. 8 output pixels at a time (a partial last block repeats its last pixel).
  const __m256 vb = _mm256_loadu_ps(b8);
  const int64_t row_step = SH * Wp * 8, col_step = SW * 8;
  int64_t poh = 0, pow_ = 0;  // (oh, ow) of pixel p
  for (int64_t p = 0; p < OHW; p += 8) {
    const float* base[8];
    int64_t oh = poh, ow = pow_;
    for (int64_t j = 0; j < 8; ++j) {
      base[j] = in + oh * row_step + ow * col_step;
      if (p + j + 1 < OHW && ++ow == OW) {  // the last pixel repeats past the end of the plane
        ow = 0;
        ++oh;
      }
    }
    pow_ += 8;
    while (pow_ >= OW) {
      pow_ -= OW;
      ++poh;
    }
    __m256 a0 = vb, a1 = vb, a2 = vb, a3 = vb, a4 = vb, a5 = vb, a6 = vb, a7 = vb;
    for (int64_t t = 0; t < KK; ++t) {
      const __m256 wv = _mm256_loadu_ps(w8 + t * 8);
      const int64_t o = tap[t];
      a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(base[0] + o), a0);
      a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(base[1] + o), a1);
      a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(base[2] + o), a2);
      a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(base[3] + o), a3);
      a4 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(base[4] + o), a4);
      a5 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(base[5] + o), a5);
      a6 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(base[6] + o), a6);
      a7 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(base[7] + o), a7);
    }
    float* d = acc + p * 8;
    _mm256_storeu_ps(d, a0);
    _mm256_storeu_ps(d + 8, a1);
    _mm256_storeu_ps(d + 16, a2);
    _mm256_storeu_ps(d + 24, a3);
    _mm256_storeu_ps(d + 32, a4);
    _mm256_storeu_ps(d + 40, a5);
    _mm256_storeu_ps(d + 48, a6);
    _mm256_storeu_ps(d + 56, a7);
  }
  // 3. transpose back into the output planes, post-op applied.
  constexpr bool has_post = P != PwPost::None;
  for (int64_t p = 0; p < OHW; p += 8) {
    const int64_t n = std::min<int64_t>(8, OHW - p);
    __m256 r[8];
    for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(acc + (p + k) * 8);
    cpu::transpose8x8(r);
    for (int64_t c = 0; c < nc; ++c) {
      float* d = out + (c0 + c) * OHW + p;
      const __m256 v = has_post ? pw_post<P>(post, r[c]) : r[c];
      if (n == 8) {
        _mm256_storeu_ps(d, v);
      } else {
        cpu::store_tail(d, n, v);
      }
    }
  }
}

void depthwise_c8(const ConvGeometry& g, const float* px, const float* pw, const float* pb, float* po, ThreadPool* pool,
                  const cpu::PostOp& post) {
  const int64_t C = g.in_channels;
  const int64_t blocks = (C + 7) / 8;
  const int64_t in_plane = g.in_size[0] * g.in_size[1];
  const int64_t out_plane = g.out_size[0] * g.out_size[1];
  const int64_t IH = g.in_size[0], IW = g.in_size[1], PH = g.padding[0], PW = g.padding[1];
  const DwC8 L(g);
  const int64_t OHW8 = (out_plane + 7) / 8 * 8;
  auto run = [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> in, acc;
    if (in.size() < static_cast<size_t>(L.in_floats())) in.resize(static_cast<size_t>(L.in_floats()));
    if (acc.size() < static_cast<size_t>(OHW8 * 8)) acc.resize(static_cast<size_t>(OHW8 * 8));
    // Zero the borders (the interior is overwritten by every block).
    float* b = in.data();
    const int64_t Wp = L.Wp;
    std::fill(b, b + PH * Wp * 8, 0.0f);
    std::fill(b + (PH + IH) * Wp * 8, b + L.in_floats(), 0.0f);
    for (int64_t r = PH; r < PH + IH; ++r) {
      std::fill(b + r * Wp * 8, b + (r * Wp + PW) * 8, 0.0f);
      std::fill(b + (r * Wp + PW + IW) * 8, b + (r + 1) * Wp * 8, 0.0f);
    }
    with_post_kind(post, [&](auto kind) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t n = t / blocks, c0 = (t % blocks) * 8;
        depthwise_c8_block<decltype(kind)::value>(g, L, px + n * C * in_plane, pw, pb, po + n * C * out_plane, c0,
                                                  std::min<int64_t>(8, C - c0), b, acc.data(), post);
      }
    });
  };
  const int64_t tasks = g.batch * blocks;
  const double work = static_cast<double>(g.batch * C) * static_cast<double>(out_plane * g.kernel[0] * g.kernel[1]);
  if (pool == nullptr || pool->num_threads() <= 1 || work < 2.5e5 || tasks < 2) {  // below ~25 us: one thread
    run(0, tasks);
    return;
  }
  const int64_t parts = std::min<int64_t>(tasks, 4 * pool->num_threads());
  const int64_t per = (tasks + parts - 1) / parts;
  cpu::parallel_tasks(pool, parts, [&](int64_t t) { run(std::min(tasks, t * per), std::min(tasks, (t + 1) * per)); });
}

void depthwise(const ConvGeometry& g, const float* px, const float* pw, const float* pb, float* po, ThreadPool* pool,
               const cpu::PostOp& post) {
  if (use_depthwise_c8(g)) {
    depthwise_c8(g, px, pw, pb, po, pool, post);
    return;
  }
  const int64_t C = g.in_channels;
  const int64_t mult = g.out_channels / g.groups;
  const int64_t in_plane = g.in_size[0] * g.in_size[1];
  const int64_t out_plane = g.out_size[0] * g.out_size[1];
  const int64_t kk = g.kernel[0] * g.kernel[1];
  const DwLayout L(g);
  auto run = [&](int64_t begin, int64_t end) {
    // Per-thread scratch kept between calls: the padded buffer is zeroed only when the layout
    // changes (every plane of one layout writes the same interior positions, so its padding stays
    // zero), not allocated and zeroed again for every chunk of planes (at 2 threads, 16 planes of
    // 112x112: 4 x 52 KiB per thread).
    thread_local std::vector<float> buf, tmp;
    thread_local std::array<int64_t, 6> layout{};  // IH, IW, PH, PW, SH, SW that `buf` is laid out for
    const std::array<int64_t, 6> key{g.in_size[0], g.in_size[1], g.padding[0], g.padding[1], g.stride[0], g.stride[1]};
    if (layout != key || buf.size() != static_cast<size_t>(L.total)) {
      buf.assign(static_cast<size_t>(L.total), 0.0f);
      layout = key;
    }
    tmp.resize(static_cast<size_t>(g.out_size[0] * L.Lw));
    std::vector<int64_t> tap(static_cast<size_t>(kk));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t / C, c = t % C;
      depthwise_plane(g, L, px + (n * C + c) * in_plane, pw + c * mult * kk, pb != nullptr ? pb + c * mult : nullptr,
                      po + (n * g.out_channels + c * mult) * out_plane, mult, buf, tmp, tap, post);
    }
  };
  const int64_t tasks = g.batch * C;
  const double work = static_cast<double>(tasks) * static_cast<double>(mult * out_plane * kk);
  if (pool == nullptr || pool->num_threads() <= 1 || work < 2.5e5) {  // below ~25 us: one thread
    run(0, tasks);
    return;
  }
  // Chunks of planes claimed dynamically (up to 4 per thread).
  const int64_t parts = std::min<int64_t>(tasks, 4 * pool->num_threads());
  const int64_t per = (tasks + parts - 1) / parts;
  cpu::parallel_tasks(pool, parts, [&](int64_t t) { run(std::min(tasks, t * per), std::min(tasks, (t + 1) * per)); });
}

/// A run of consecutive output columns j = oh*OW + ow in one output row: ow in [ow0, ow0 + len),
/// written at dst offset `at`.
struct Segment {
  int64_t oh, ow0, len, at;
};

/// Splits output columns [j0, j1) into per-row segments.
void segments_of(const ConvGeometry& g, int64_t j0, int64_t j1, std::vector<Segment>& segs) {
  const int64_t OW = g.out_size[1];
  segs.clear();
  for (int64_t j = j0; j < j1;) {
    const int64_t oh = j / OW, ow0 = j % OW;
    const int64_t len = std::min(OW - ow0, j1 - j);
    segs.push_back({oh, ow0, len, j - j0});
    j += len;
  }
}

/// Row (c, kh, kw) of the im2col matrix of one group over the columns of `segs`:
///   dst[j - j0] = x[c, oh*SH - PH + kh*DH, ow*SW - PW + kw*DW] (0 outside), j = oh*OW + ow.
/// `plane` is input channel c [IH, IW].
__attribute__((target("avx2,fma"))) void im2col_row(const ConvGeometry& g, const float* plane, int64_t kh, int64_t kw, const std::vector<Segment>& segs,
                float* dst) {
  const int64_t IH = g.in_size[0], IW = g.in_size[1];
  const int64_t SH = g.stride[0], SW = g.stride[1], PH = g.padding[0], PW = g.padding[1];
  const int64_t DH = g.dilation[0], DW = g.dilation[1];
  // ow in [lo_ow, hi_ow) has iw = ow*SW + off inside [0, IW)
  const int64_t off = kw * DW - PW;
  const int64_t lo_ow = off >= 0 ? 0 : (-off + SW - 1) / SW;
  const int64_t hi_ow = IW - off <= 0 ? 0 : (IW - off + SW - 1) / SW;
  for (const Segment& s : segs) {
    float* d = dst + s.at;
    const int64_t ih = s.oh * SH - PH + kh * DH;
    if (ih < 0 || ih >= IH) {
      for (int64_t t = 0; t < s.len; ++t) d[t] = 0.0f;
      continue;
    }
    const float* src = plane + ih * IW + off;
    const int64_t lo = std::clamp(lo_ow - s.ow0, int64_t{0}, s.len);
    const int64_t hi = std::clamp(hi_ow - s.ow0, lo, s.len);
    for (int64_t t = 0; t < lo; ++t) d[t] = 0.0f;
    if (SW == 1) {
      const float* sp = src + s.ow0;
      for (int64_t t = lo; t < hi; ++t) d[t] = sp[t];
    } else if (SW == 2) {
      // Even elements of 16-float reads (stems: 3x3 / 7x7 stride 2), while the read stays inside
      // the input row (row index (ow0 + t) * 2 + off + 15 < IW); the rest one by one.
      const float* sp = src + 2 * s.ow0;
      int64_t t = lo;
      for (; t + 8 <= hi && (s.ow0 + t) * 2 + off + 15 < IW; t += 8) {
        const __m256 a = _mm256_loadu_ps(sp + 2 * t), b = _mm256_loadu_ps(sp + 2 * t + 8);
        _mm256_storeu_ps(d + t, _mm256_castpd_ps(_mm256_permute4x64_pd(
                                    _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8)));
      }
      for (; t < hi; ++t) d[t] = sp[2 * t];
    } else {
      for (int64_t t = lo; t < hi; ++t) d[t] = src[(s.ow0 + t) * SW];
    }
    for (int64_t t = hi; t < s.len; ++t) d[t] = 0.0f;
  }
}

/// The im2col matrix of one group of one image, [C_in_g * KH * KW, OH * OW], row
/// (c*KH + kh)*KW + kw, produced panel by panel for the GEMM (cpu::GemmBPacker) instead of
/// being stored: one row at a time into a small per-thread buffer (2 x 4 KiB, stays in L1), then
/// into the 16-column panels.
struct Im2col {
  const ConvGeometry* g;
  const float* x;  // the group's first input channel

  /// Row p of the K block (`row`, nc floats) into the 16-column panels.
  __attribute__((target("avx2,fma"))) static void copy_row(float* out, int64_t stride, int64_t full, int64_t nc,
                                                           int64_t p, const float* row) {
    constexpr int64_t P = cpu::kGemmPanelCols;
    for (int64_t jr = 0; jr < full; jr += P) {
      float* d = out + jr / P * stride + p * P;
      _mm256_storeu_ps(d, _mm256_loadu_ps(row + jr));
      _mm256_storeu_ps(d + 8, _mm256_loadu_ps(row + jr + 8));
    }
    if (full < nc) {
      float* d = out + full / P * stride + p * P;
      const int64_t n = nc - full;
      for (int64_t t = 0; t < n; ++t) d[t] = row[full + t];
      for (int64_t t = n; t < P; ++t) d[t] = 0.0f;
    }
  }

  __attribute__((target("avx2,fma"))) static void pack(const void* ctx, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float* out) {
    const Im2col& c = *static_cast<const Im2col*>(ctx);
    const ConvGeometry& g = *c.g;
    const int64_t KH = g.kernel[0], KW = g.kernel[1], KK = KH * KW;
    const int64_t IHW = g.in_size[0] * g.in_size[1];
    constexpr int64_t P = cpu::kGemmPanelCols;
    const int64_t stride = cpu::gemm_panel_stride(kc);
    // Two row buffers: row p is generated, then row p - 1 (written one row earlier) is copied
    // into the panels.
    thread_local std::vector<float> rows;
    thread_local std::vector<Segment> segs;
    const size_t cap = static_cast<size_t>(cpu::kGemmMaxPackCols);
    if (rows.size() < 2 * cap) rows.resize(2 * cap);
    segments_of(g, j0, j0 + nc, segs);
    const int64_t full = nc / P * P;
    for (int64_t p = 0; p <= kc; ++p) {
      if (p < kc) {
        const int64_t q = p0 + p;
        const int64_t ch = q / KK, r = q % KK;
        im2col_row(g, c.x + ch * IHW, r / KW, r % KW, segs, rows.data() + (p % 2) * cap);
      }
      if (p > 0) copy_row(out, stride, full, nc, p - 1, rows.data() + ((p - 1) % 2) * cap);
    }
  }
};

/// General convolution: per (image, group) one GEMM  out[n, group] = W_group [C_out_g x K] *
/// im2col [K x OH*OW] + bias, K = C_in_g * KH * KW, with the im2col matrix packed on the fly.
void conv_im2col(const ConvGeometry& g, const float* px, const float* pw, const float* pb, float* po, ThreadPool* pool,
                 const ConvState* st) {
  const int64_t cin_g = g.in_channels / g.groups, cout_g = g.out_channels / g.groups;
  const int64_t Kdim = cin_g * g.kernel[0] * g.kernel[1];
  const int64_t OHW = g.out_size[0] * g.out_size[1];
  const int64_t IHW = g.in_size[0] * g.in_size[1];
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const Im2col ctx{&g, px + (n * g.in_channels + grp * cin_g) * IHW};
      cpu::GemmEpilogue ep;
      if (pb != nullptr) {
        ep.bias_kind = cpu::GemmBias::PerRow;
        ep.bias = pb + grp * cout_g;
      }
      if (st != nullptr) ep.post = st->post;
      const float* packed = st != nullptr && !st->packed.empty() ? st->packed.data() + grp * st->group_stride : nullptr;
      cpu::sgemm_packed_b(cout_g, OHW, Kdim, 1.0f, pw + grp * cout_g * Kdim, Kdim, cpu::GemmBPacker{Im2col::pack, &ctx},
                          0.0f, po + (n * g.out_channels + grp * cout_g) * OHW, OHW, ep, pool, packed);
    }
  }
}

/// Transposed convolution (the adjoint of the regular one; formula in src/kernels/portable/conv.cpp):
/// per (image, group) one GEMM  col[C_out_g * KH * KW, IH * IW] = W_group^T * X_group, where
/// W_group is the group's [C_in_g, C_out_g * KH * KW] slice of the [C_in, C_out/g, KH, KW] weight,
/// then col2im: out[oc, ih*SH - PH + kh*DH, iw*SW - PW + kw*DW] += col[(oc, kh, kw), (ih, iw)]
/// over the positions inside the output, on top of the bias (the "GEMM + col2im" method of
/// Caffe's and PyTorch's slow_conv_transpose2d). col2im runs in parallel over output channels
/// (each output plane is written by one thread); `post` is applied to each finished plane.
void conv_transposed(const ConvGeometry& g, const float* px, const float* pw, const float* pb, float* po,
                     ThreadPool* pool, const cpu::PostOp& post) {
  const int64_t cin_g = g.in_channels / g.groups, cout_g = g.out_channels / g.groups;
  const int64_t IH = g.in_size[0], IW = g.in_size[1], OH = g.out_size[0], OW = g.out_size[1];
  const int64_t KH = g.kernel[0], KW = g.kernel[1], KK = KH * KW;
  const int64_t SH = g.stride[0], SW = g.stride[1], PH = g.padding[0], PW = g.padding[1];
  const int64_t DH = g.dilation[0], DW = g.dilation[1];
  const int64_t IHW = IH * IW, OHW = OH * OW;
  std::vector<float> col(static_cast<size_t>(cout_g * KK * IHW));
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      // op(A) = W_group^T: A is W_group [cin_g, cout_g * KK] read transposed (trans_a).
      cpu::sgemm(true, false, cout_g * KK, IHW, cin_g, 1.0f, pw + grp * cin_g * cout_g * KK, cout_g * KK,
                 px + (n * g.in_channels + grp * cin_g) * IHW, IHW, 0.0f, col.data(), IHW, cpu::GemmEpilogue{}, pool);
      float* out_group = po + (n * g.out_channels + grp * cout_g) * OHW;
      cpu::parallel_tasks(pool, cout_g, [&](int64_t ocl) {
        float* plane = out_group + ocl * OHW;
        std::fill(plane, plane + OHW, pb != nullptr ? pb[grp * cout_g + ocl] : 0.0f);
        for (int64_t kh = 0; kh < KH; ++kh) {
          for (int64_t kw = 0; kw < KW; ++kw) {
            const float* c = col.data() + ((ocl * KH + kh) * KW + kw) * IHW;
            for (int64_t ih = 0; ih < IH; ++ih) {
              const int64_t oh = ih * SH - PH + kh * DH;
              if (oh < 0 || oh >= OH) continue;
              float* orow = plane + oh * OW;
              const float* crow = c + ih * IW;
              // iw range with 0 <= iw*SW - PW + kw*DW < OW.
              const int64_t off = kw * DW - PW;
              const int64_t iw0 = off >= 0 ? 0 : (-off + SW - 1) / SW;
              const int64_t iw1 = std::min(IW, OW - off <= 0 ? 0 : (OW - off + SW - 1) / SW);
              if (SW == 1) {
                for (int64_t iw = iw0; iw < iw1; ++iw) orow[iw + off] += crow[iw];
              } else {
                for (int64_t iw = iw0; iw < iw1; ++iw) orow[iw * SW + off] += crow[iw];
              }
            }
          }
        }
        cpu::apply_inplace(post, plane, OHW);
      });
    }
  }
}

/// Pointwise (1x1, stride 1, no padding, one group) convolution with few input channels
/// (C_in <= kPwMaxK), computed directly on the NCHW planes:
///   out[n, co, j] = post(bias[co] + sum_ci W[co, ci] * x[n, ci, j]),  j in [0, H*W),
/// the products accumulated in ci order with fused multiply-add, starting from the bias.
/// With so few input channels the GEMM path spends as much on packing the input and on its
/// general tile epilogue as on the multiply-adds (16 -> 64 channels at 112x112: 0.47 ms here,
/// ONNX Runtime 0.34 ms); this kernel reads the input rows where they are (a column block of all
/// C_in rows stays in L1) and keeps a 6-channel x 16-column tile in registers, with the bias in
/// the initial accumulator and the activation (compile-time kind) in the store.
constexpr int64_t kPwMR = 6;     ///< output channels per register tile
constexpr int64_t kPwMaxK = 256;  ///< most input channels this path takes (see use_pointwise_direct)
/// On planes of at most 64 pixels (7x7: one column block, the weights read once), up to this many.
constexpr int64_t kPwMaxKSmallPlane = 1024;

/// Whether the direct pointwise kernel takes this geometry (see above).
bool use_pointwise_direct(const ConvGeometry& g) {
  const int64_t hw = g.in_size[0] * g.in_size[1];
  return !g.transposed && g.groups == 1 && is_plain_1x1(g) && g.in_channels >= 1 &&
         (g.in_channels <= kPwMaxK || (hw <= 64 && g.in_channels <= kPwMaxKSmallPlane)) && g.out_channels >= 2 &&
         hw >= 16;
}

/// One output row of a tile with a fused residual add: o[t] = post(v[t]) + r[t], t < n (<= 16).
template <PwPost P>
KILN_AVX2 inline void pw_store_residual(float* o, const float* r, __m256 v0, __m256 v1, int64_t n, __m256i m0,
                                        __m256i m1, const cpu::PostOp& post) {
  if (n == 16) {
    _mm256_storeu_ps(o, _mm256_add_ps(pw_post<P>(post, v0), _mm256_loadu_ps(r)));
    _mm256_storeu_ps(o + 8, _mm256_add_ps(pw_post<P>(post, v1), _mm256_loadu_ps(r + 8)));
    return;
  }
  _mm256_maskstore_ps(o, m0, _mm256_add_ps(pw_post<P>(post, v0), _mm256_maskload_ps(r, m0)));
  if (n > 8) _mm256_maskstore_ps(o + 8, m1, _mm256_add_ps(pw_post<P>(post, v1), _mm256_maskload_ps(r + 8, m1)));
}

/// One output column (out[i * ldx], i < mr) of a channel group, for a plane's last column when
/// it is alone in its 16-column tile (7x7 planes: 49 = 3 * 16 + 1): the group's 6 channels across
/// the lanes of one vector (lane i: w[k * 6 + i]; lanes 6, 7 read the next input channel's
/// weights and are dropped; pack_pointwise pads st.pw_w by 8 floats for the last group), 4
/// partial sums over k % 4, then the bias, activation and fused residual as pw_rows. A 1-column
/// tile in pw_rows spends 6 FMAs per input channel on 1 useful lane each (12% of a 7x7 layer's
/// multiply-adds); here it is 1.
template <PwPost P>
KILN_AVX2 void pw_one_column(int64_t K, const float* w, const float* b6, const float* x, int64_t ldx, float* out, int mr,
                             const cpu::PostOp& post, const float* res) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    const float* xp = x + k * ldx;
    const float* wp = w + k * kPwMR;
    a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(xp), _mm256_loadu_ps(wp), a0);
    a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(xp + ldx), _mm256_loadu_ps(wp + kPwMR), a1);
    a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(xp + 2 * ldx), _mm256_loadu_ps(wp + 2 * kPwMR), a2);
    a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(xp + 3 * ldx), _mm256_loadu_ps(wp + 3 * kPwMR), a3);
  }
  for (; k < K; ++k) a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + k * ldx), _mm256_loadu_ps(w + k * kPwMR), a0);
  __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  v = pw_post<P>(post, _mm256_add_ps(v, _mm256_maskload_ps(b6, cpu::tail_mask(kPwMR))));
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  for (int i = 0; i < mr; ++i) out[i * ldx] = res != nullptr ? t[i] + res[i * ldx] : t[i];
}

/// Output channels [co0, co0 + mr) (mr <= 6) over columns [j0, j0 + nc) of one image:
/// `w` [K][6] and `b6` [6] are the channel group's packed weights and bias (zero past mr),
/// x [K][ldx] the input planes, out [C_out][ldx].
template <PwPost P>
KILN_AVX2 void pw_rows(int64_t K, const float* w, const float* b6, const float* x, int64_t ldx, float* out, int mr,
                       int64_t j0, int64_t nc, const cpu::PostOp& post, const float* res) {
  const __m256 bb0 = _mm256_broadcast_ss(b6 + 0), bb1 = _mm256_broadcast_ss(b6 + 1), bb2 = _mm256_broadcast_ss(b6 + 2);
  const __m256 bb3 = _mm256_broadcast_ss(b6 + 3), bb4 = _mm256_broadcast_ss(b6 + 4), bb5 = _mm256_broadcast_ss(b6 + 5);
  int64_t j = j0;
  const int64_t end = j0 + nc;
  for (; j < end; j += 16) {
    const int64_t n = std::min<int64_t>(16, end - j);
    if (n == 1) {
      pw_one_column<P>(K, w, b6, x + j, ldx, out + j, mr, post, res != nullptr ? res + j : nullptr);
      continue;
    }
    const __m256i m0 = cpu::tail_mask(std::min<int64_t>(n, 8)), m1 = cpu::tail_mask(std::max<int64_t>(n - 8, 0));
    __m256 c00 = bb0, c01 = bb0, c10 = bb1, c11 = bb1, c20 = bb2, c21 = bb2;
    __m256 c30 = bb3, c31 = bb3, c40 = bb4, c41 = bb4, c50 = bb5, c51 = bb5;
    const float* xp = x + j;
    const float* wp = w;
    if (n == 16) {
      for (int64_t k = 0; k < K; ++k, xp += ldx, wp += kPwMR) {
        const __m256 x0 = _mm256_loadu_ps(xp), x1 = _mm256_loadu_ps(xp + 8);
        __m256 a = _mm256_broadcast_ss(wp + 0);
        c00 = _mm256_fmadd_ps(a, x0, c00);
        c01 = _mm256_fmadd_ps(a, x1, c01);
        a = _mm256_broadcast_ss(wp + 1);
        c10 = _mm256_fmadd_ps(a, x0, c10);
        c11 = _mm256_fmadd_ps(a, x1, c11);
        a = _mm256_broadcast_ss(wp + 2);
        c20 = _mm256_fmadd_ps(a, x0, c20);
        c21 = _mm256_fmadd_ps(a, x1, c21);
        a = _mm256_broadcast_ss(wp + 3);
        c30 = _mm256_fmadd_ps(a, x0, c30);
        c31 = _mm256_fmadd_ps(a, x1, c31);
        a = _mm256_broadcast_ss(wp + 4);
        c40 = _mm256_fmadd_ps(a, x0, c40);
        c41 = _mm256_fmadd_ps(a, x1, c41);
        a = _mm256_broadcast_ss(wp + 5);
        c50 = _mm256_fmadd_ps(a, x0, c50);
        c51 = _mm256_fmadd_ps(a, x1, c51);
      }
    } else if (n <= 8) {  // last (at most 8) columns of the plane: one masked vector
      for (int64_t k = 0; k < K; ++k, xp += ldx, wp += kPwMR) {
        const __m256 x0 = _mm256_maskload_ps(xp, m0);
        c00 = _mm256_fmadd_ps(_mm256_broadcast_ss(wp + 0), x0, c00);
        c10 = _mm256_fmadd_ps(_mm256_broadcast_ss(wp + 1), x0, c10);
        c20 = _mm256_fmadd_ps(_mm256_broadcast_ss(wp + 2), x0, c20);
        c30 = _mm256_fmadd_ps(_mm256_broadcast_ss(wp + 3), x0, c30);
        c40 = _mm256_fmadd_ps(_mm256_broadcast_ss(wp + 4), x0, c40);
        c50 = _mm256_fmadd_ps(_mm256_broadcast_ss(wp + 5), x0, c50);
      }
    } else {  // last 9..15 columns of the plane: masked loads (never past the row's end)
      for (int64_t k = 0; k < K; ++k, xp += ldx, wp += kPwMR) {
        const __m256 x0 = _mm256_maskload_ps(xp, m0), x1 = _mm256_maskload_ps(xp + 8, m1);
        __m256 a = _mm256_broadcast_ss(wp + 0);
        c00 = _mm256_fmadd_ps(a, x0, c00);
        c01 = _mm256_fmadd_ps(a, x1, c01);
        a = _mm256_broadcast_ss(wp + 1);
        c10 = _mm256_fmadd_ps(a, x0, c10);
        c11 = _mm256_fmadd_ps(a, x1, c11);
        a = _mm256_broadcast_ss(wp + 2);
        c20 = _mm256_fmadd_ps(a, x0, c20);
        c21 = _mm256_fmadd_ps(a, x1, c21);
        a = _mm256_broadcast_ss(wp + 3);
        c30 = _mm256_fmadd_ps(a, x0, c30);
        c31 = _mm256_fmadd_ps(a, x1, c31);
        a = _mm256_broadcast_ss(wp + 4);
        c40 = _mm256_fmadd_ps(a, x0, c40);
        c41 = _mm256_fmadd_ps(a, x1, c41);
        a = _mm256_broadcast_ss(wp + 5);
        c50 = _mm256_fmadd_ps(a, x0, c50);
        c51 = _mm256_fmadd_ps(a, x1, c51);
      }
    }
    float* o = out + j;
    if (res != nullptr) {  // fused residual aten.add: (conv result) + res, as the add kernel computes it
      const float* r = res + j;
      pw_store_residual<P>(o, r, c00, c01, n, m0, m1, post);
      if (mr > 1) pw_store_residual<P>(o + ldx, r + ldx, c10, c11, n, m0, m1, post);
      if (mr > 2) pw_store_residual<P>(o + 2 * ldx, r + 2 * ldx, c20, c21, n, m0, m1, post);
      if (mr > 3) pw_store_residual<P>(o + 3 * ldx, r + 3 * ldx, c30, c31, n, m0, m1, post);
      if (mr > 4) pw_store_residual<P>(o + 4 * ldx, r + 4 * ldx, c40, c41, n, m0, m1, post);
      if (mr > 5) pw_store_residual<P>(o + 5 * ldx, r + 5 * ldx, c50, c51, n, m0, m1, post);
      continue;
    }
    if (n == 16 && mr == kPwMR) {
      _mm256_storeu_ps(o, pw_post<P>(post, c00));
      _mm256_storeu_ps(o + 8, pw_post<P>(post, c01));
      o += ldx;
      _mm256_storeu_ps(o, pw_post<P>(post, c10));
      _mm256_storeu_ps(o + 8, pw_post<P>(post, c11));
      o += ldx;
      _mm256_storeu_ps(o, pw_post<P>(post, c20));
      _mm256_storeu_ps(o + 8, pw_post<P>(post, c21));
      o += ldx;
      _mm256_storeu_ps(o, pw_post<P>(post, c30));
      _mm256_storeu_ps(o + 8, pw_post<P>(post, c31));
      o += ldx;
      _mm256_storeu_ps(o, pw_post<P>(post, c40));
      _mm256_storeu_ps(o + 8, pw_post<P>(post, c41));
      o += ldx;
      _mm256_storeu_ps(o, pw_post<P>(post, c50));
      _mm256_storeu_ps(o + 8, pw_post<P>(post, c51));
      continue;
    }
    const __m256 acc[kPwMR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (int i = 0; i < mr; ++i, o += ldx) {
      _mm256_maskstore_ps(o, m0, pw_post<P>(post, acc[i][0]));
      if (n > 8) _mm256_maskstore_ps(o + 8, m1, pw_post<P>(post, acc[i][1]));
    }
  }
}

/// The direct pointwise convolution (use_pointwise_direct) with weights packed by
/// conv_prepare: st.pw_w [ceil(C_out/6)][C_in][6], st.pw_b [ceil(C_out/6) * 6] (zero padded).
/// Work is split over column blocks whose C_in input rows fit in 16 KiB (L1); each block computes
/// all output channels (split in chunks too when there are few blocks and several threads).
template <PwPost P>
void pointwise_direct_impl(const ConvGeometry& g, const float* px, float* po, ThreadPool* pool, const ConvState& st,
                           const float* res) {
  const int64_t K = g.in_channels, M = g.out_channels, HW = g.in_size[0] * g.in_size[1];
  const int64_t groups6 = (M + kPwMR - 1) / kPwMR;
  // Column blocks of nb columns (the last one takes the rest): the block's K input rows take
  // about 16 KiB (L1); planes under 128 columns are one block, so that the weights (C_out x C_in,
  // up to 600 KiB at 7x7) are read once, not once per 16 columns (7x7 160 -> 960: 0.22 -> 0.21 ms).
  const int64_t nb = HW < 128 ? HW : std::max<int64_t>(16, 4096 / K / 16 * 16);
  const int64_t blocks = std::max<int64_t>(1, HW / nb);
  const double flops = 2.0 * static_cast<double>(g.batch * M * K) * static_cast<double>(HW);
  const bool parallel = pool != nullptr && pool->num_threads() > 1 && flops >= 2e6;
  // With few column blocks (7x7, 14x14 planes) the output channels are split too, so that the
  // threads get even shares (about 4 tasks per thread).
  int64_t per = groups6;  // channel groups per task
  if (parallel && g.batch * blocks < 4 * pool->num_threads()) {
    const int64_t want = (4 * pool->num_threads() + g.batch * blocks - 1) / (g.batch * blocks);
    per = (groups6 + std::min(want, groups6) - 1) / std::min(want, groups6);
  }
  const int64_t mchunks = (groups6 + per - 1) / per;
  const int64_t tasks = g.batch * blocks * mchunks;
  auto run = [&](int64_t t) {
    const int64_t mc = t % mchunks, nbk = t / mchunks;
    const int64_t n = nbk / blocks, j0 = (nbk % blocks) * nb, nc = nbk % blocks == blocks - 1 ? HW - j0 : nb;
    const float* x = px + n * K * HW;
    float* out = po + n * M * HW;
    for (int64_t q = mc * per; q < std::min(groups6, (mc + 1) * per); ++q) {
      const int mr = static_cast<int>(std::min(kPwMR, M - q * kPwMR));
      pw_rows<P>(K, st.pw_w.data() + q * K * kPwMR, st.pw_b.data() + q * kPwMR, x, HW, out + q * kPwMR * HW, mr, j0, nc,
                 st.post, res != nullptr ? res + n * M * HW + q * kPwMR * HW : nullptr);
    }
  };
  if (!parallel || tasks < 2) {
    for (int64_t t = 0; t < tasks; ++t) run(t);
    return;
  }
  cpu::parallel_tasks(pool, tasks, run);
}

/// `res` (null: none): the fused residual [N, C_out, H, W] added after the activation.
void pointwise_direct(const ConvGeometry& g, const float* px, float* po, ThreadPool* pool, const ConvState& st,
                      const float* res) {
  switch (st.post.kind) {
    case cpu::PostOp::Kind::None: pointwise_direct_impl<PwPost::None>(g, px, po, pool, st, res); return;
    case cpu::PostOp::Kind::Relu: pointwise_direct_impl<PwPost::Relu>(g, px, po, pool, st, res); return;
    case cpu::PostOp::Kind::Hardswish: pointwise_direct_impl<PwPost::Hardswish>(g, px, po, pool, st, res); return;
    default: pointwise_direct_impl<PwPost::Generic>(g, px, po, pool, st, res); return;
  }
}

/// Packs the weights [C_out, C_in] and bias (or null) of the direct pointwise path into
/// st.pw_w / st.pw_b (layout at pointwise_direct).
void pack_pointwise(const ConvGeometry& g, const float* w, const float* b, ConvState& st) {
  const int64_t K = g.in_channels, M = g.out_channels;
  const int64_t groups6 = (M + kPwMR - 1) / kPwMR;
  st.pw_w.assign(static_cast<size_t>(groups6 * K * kPwMR + 8), 0.0f);  // + 8: pw_one_column's last vector read
  st.pw_b.assign(static_cast<size_t>(groups6 * kPwMR), 0.0f);
  for (int64_t co = 0; co < M; ++co) {
    const int64_t q = co / kPwMR, r = co % kPwMR;
    for (int64_t k = 0; k < K; ++k) st.pw_w[static_cast<size_t>((q * K + k) * kPwMR + r)] = w[co * K + k];
    if (b != nullptr) st.pw_b[static_cast<size_t>(co)] = b[co];
  }
}

/// One-pixel pointwise convolution (1x1, one group, H = W = 1: the squeeze-excite layers'
/// [N, C, 1, 1] after the global average pool), a matrix-vector product per image:
///   out[n, co] = post(bias[co] + sum_ci W[co, ci] * x[n, ci]),
/// accumulated in ci order with fused multiply-add from the bias. It is bound by reading the
/// weights (960 x 240 floats: 0.9 MiB, from L3), so conv_prepare packs them once into blocks of 32
/// output channels, st.gv_w [ceil(C_out/32)][C_in][32] (zero padded; bias st.gv_b likewise):
/// each block is one contiguous stream, read with full vectors, 4 independent accumulators of 8
/// channels, and no horizontal sums (the GEMM's matrix-vector product reads W row by row: one
/// dot product and a horizontal sum per output channel, 2 accumulators).
constexpr int64_t kGvBlock = 32;

/// Whether the one-pixel pointwise path takes this geometry (see above).
bool use_pointwise_gemv(const ConvGeometry& g) {
  return !g.transposed && g.groups == 1 && is_plain_1x1(g) && g.in_size[0] == 1 && g.in_size[1] == 1 &&
         g.in_channels >= 1 && g.out_channels >= 1;
}

/// Packs W [C_out, C_in] and bias [C_out] (or null) into st.gv_w / st.gv_b (layout above).
void pack_pointwise_gemv(const ConvGeometry& g, const float* w, const float* b, ConvState& st) {
  const int64_t K = g.in_channels, M = g.out_channels, blocks = (M + kGvBlock - 1) / kGvBlock;
  st.gv_w.assign(static_cast<size_t>(blocks * K * kGvBlock), 0.0f);
  st.gv_b.assign(static_cast<size_t>(blocks * kGvBlock), 0.0f);
  for (int64_t co = 0; co < M; ++co) {
    const int64_t q = co / kGvBlock, r = co % kGvBlock;
    for (int64_t k = 0; k < K; ++k) st.gv_w[static_cast<size_t>((q * K + k) * kGvBlock + r)] = w[co * K + k];
    if (b != nullptr) st.gv_b[static_cast<size_t>(co)] = b[co];
  }
}

/// Output blocks [q0, q1) of every image (see use_pointwise_gemv); x [N, C_in], out [N, C_out].
template <PwPost P>
KILN_AVX2 void gemv_blocks(const ConvGeometry& g, const ConvState& st, const float* x, float* out, int64_t q0,
                           int64_t q1) {
  const int64_t K = g.in_channels, M = g.out_channels;
  for (int64_t q = q0; q < q1; ++q) {
    const float* wq = st.gv_w.data() + q * K * kGvBlock;
    const float* bq = st.gv_b.data() + q * kGvBlock;
    const int64_t valid = std::min(kGvBlock, M - q * kGvBlock);
    for (int64_t n = 0; n < g.batch; ++n) {
      const float* xn = x + n * K;
      __m256 a0 = _mm256_loadu_ps(bq), a1 = _mm256_loadu_ps(bq + 8), a2 = _mm256_loadu_ps(bq + 16),
             a3 = _mm256_loadu_ps(bq + 24);
      const float* wp = wq;
      for (int64_t k = 0; k < K; ++k, wp += kGvBlock) {
        const __m256 xv = _mm256_broadcast_ss(xn + k);
        a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wp), a0);
        a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wp + 8), a1);
        a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wp + 16), a2);
        a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wp + 24), a3);
      }
      float* o = out + n * M + q * kGvBlock;
      const __m256 r[4] = {pw_post<P>(st.post, a0), pw_post<P>(st.post, a1), pw_post<P>(st.post, a2),
                           pw_post<P>(st.post, a3)};
      for (int v = 0; v < 4; ++v) {
        const int64_t left = valid - 8 * v;
        if (left <= 0) break;
        if (left >= 8) {
          _mm256_storeu_ps(o + 8 * v, r[v]);
        } else {
          cpu::store_tail(o + 8 * v, left, r[v]);
        }
      }
    }
  }
}

/// The one-pixel pointwise convolution with st.gv_w / st.gv_b; parallel over blocks of output
/// channels when the weights take at least 128 KiB (each thread then streams its share).
void pointwise_gemv(const ConvGeometry& g, const float* px, float* po, ThreadPool* pool, const ConvState& st) {
  const int64_t blocks = (g.out_channels + kGvBlock - 1) / kGvBlock;
  with_post_kind(st.post, [&](auto kind) {
    constexpr PwPost P = decltype(kind)::value;
    const bool parallel = pool != nullptr && pool->num_threads() > 1 && blocks > 1 &&
                          g.in_channels * g.out_channels >= 32768;
    if (!parallel) {
      gemv_blocks<P>(g, st, px, po, 0, blocks);
      return;
    }
    const int64_t parts = std::min<int64_t>(blocks, 2 * pool->num_threads());
    const int64_t per = (blocks + parts - 1) / parts;
    cpu::parallel_tasks(pool, (blocks + per - 1) / per, [&](int64_t t) {
      gemv_blocks<P>(g, st, px, po, t * per, std::min(blocks, (t + 1) * per));
    });
  });
}

/// 1x1, stride 1, no padding: one GEMM per (image, group) directly on the NCHW planes.
void conv_1x1(const ConvGeometry& g, const float* px, const float* pw, const float* pb, float* po, ThreadPool* pool,
              const ConvState* st) {
  const int64_t cin_g = g.in_channels / g.groups, cout_g = g.out_channels / g.groups;
  const int64_t HW = g.in_size[0] * g.in_size[1];
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      cpu::GemmEpilogue ep;
      if (pb != nullptr) {
        ep.bias_kind = cpu::GemmBias::PerRow;
        ep.bias = pb + grp * cout_g;
      }
      if (st != nullptr) ep.post = st->post;
      const float* packed = st != nullptr && !st->packed.empty() ? st->packed.data() + grp * st->group_stride : nullptr;
      cpu::sgemm(false, false, cout_g, HW, cin_g, 1.0f, pw + grp * cout_g * cin_g, cin_g,
                 px + (n * g.in_channels + grp * cin_g) * HW, HW, 0.0f, po + (n * g.out_channels + grp * cout_g) * HW,
                 HW, ep, pool, packed);
    }
  }
}

/// aten.convolution, float32, regular and transposed; shapes and formula as
/// src/kernels/portable/conv.cpp. Errors: the geometry's InvalidArgument.
Error convolution(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const Tensor& w = *a.inputs[1];
  const Tensor* b = a.inputs[2];
  TensorType bias_type;
  if (b != nullptr) bias_type = b->type();
  auto geo = geometry_of(x.type(), w.type(), b != nullptr ? &bias_type : nullptr, a.attrs);
  if (!geo.ok()) return Error(geo.error().code(), "aten.convolution: " + geo.error().message());
  const ConvGeometry& g = geo.value();
  if (g.batch == 0 || g.out_channels == 0) return {};
  const float* px = x.data_as<float>();
  const float* pw = w.data_as<float>();
  const float* pb = b != nullptr ? b->data_as<float>() : nullptr;
  float* po = a.outputs[0]->data_as<float>();
  const auto* st = static_cast<const ConvState*>(a.state);  // only conv_prepare makes this kernel's state
  const cpu::PostOp post = st != nullptr ? st->post : cpu::PostOp{};
  if (g.in_channels == 0) {  // empty sum: bias only
    const int64_t plane = g.out_size[0] * g.out_size[1];
    for (int64_t n = 0; n < g.batch; ++n) {
      for (int64_t c = 0; c < g.out_channels; ++c) {
        std::fill(po + (n * g.out_channels + c) * plane, po + (n * g.out_channels + c + 1) * plane,
                  pb != nullptr ? pb[c] : 0.0f);
        cpu::apply_inplace(post, po + (n * g.out_channels + c) * plane, plane);
      }
    }
    return {};
  }
  if (g.transposed) {
    conv_transposed(g, px, pw, pb, po, a.pool, post);
  } else if (use_depthwise_kernel(g)) {
    depthwise(g, px, pw, pb, po, a.pool, post);
  } else if (st != nullptr && !st->gv_w.empty()) {
    pointwise_gemv(g, px, po, a.pool, *st);
  } else if (st != nullptr && !st->pw_w.empty()) {
    const float* res = nullptr;
    if (st->residual) {  // the runtime passes the fused aten.add's other input after ours
      if (a.inputs.size() < 4 || a.inputs[3] == nullptr || a.inputs[3]->type() != a.outputs[0]->type()) {
        return Error(ErrorCode::Internal, "aten.convolution: fused aten.add without its other input");
      }
      res = a.inputs[3]->data_as<float>();
    }
    pointwise_direct(g, px, po, a.pool, *st, res);
  } else if (st != nullptr && st->residual_gw) {  // Winograd / GEMM paths with a fused residual add
    if (a.inputs.size() < 4 || a.inputs[3] == nullptr || a.inputs[3]->type() != a.outputs[0]->type()) {
      return Error(ErrorCode::Internal, "aten.convolution: fused aten.add without its other input");
    }
    const float* res = a.inputs[3]->data_as<float>();
    if (!st->winograd.empty()) {
      cpu::conv_winograd(g, st->winograd_tile, px, st->winograd.data(), pb, po, a.pool, post, res, st->after);
      return {};
    }
    if (is_plain_1x1(g)) {
      conv_1x1(g, px, pw, pb, po, a.pool, st);
    } else {
      conv_im2col(g, px, pw, pb, po, a.pool, st);
    }
    residual_planes(po, res, g.batch * g.out_channels, g.out_size[0] * g.out_size[1], a.pool, st->after);
  } else if (is_plain_1x1(g)) {
    conv_1x1(g, px, pw, pb, po, a.pool, st);
  } else if (st != nullptr && !st->winograd.empty()) {
    cpu::conv_winograd(g, st->winograd_tile, px, st->winograd.data(), pb, po, a.pool, post);
  } else if (cpu::direct_conv_applies(g)) {
    cpu::conv_direct(g, px, pw, pb, po, a.pool, post);
  } else {
    conv_im2col(g, px, pw, pb, po, a.pool, st);
  }
  return {};
}

/// Prepare (once per Method instance): packs constant weights for the GEMM paths and fuses a
/// following activation (KernelPrepareArgs::next) when post_op_of knows it.
Result<std::unique_ptr<KernelState>> conv_prepare(const KernelPrepareArgs& p) {
  const KernelSignature& sig = p.sig;
  auto geo = geometry_of(*sig.inputs[0], *sig.inputs[1], sig.inputs[2], sig.attrs);
  if (!geo.ok()) return std::unique_ptr<KernelState>();
  const ConvGeometry& g = geo.value();
  auto st = std::make_unique<ConvState>();
  if (p.next != nullptr && sig.outputs[0]->dtype == DType::Float32 && cpu::post_op_of(p.next->op, p.next->attrs, &st->post)) {
    st->fused_next = true;
  }
  const Tensor* w = p.constants.size() > 1 ? p.constants[1] : nullptr;
  const int64_t OHW = g.out_size[0] * g.out_size[1];
  if (w != nullptr && w->dtype == DType::Float32 && g.batch > 0 && g.out_channels > 0 && use_pointwise_gemv(g) &&
      p.constants.size() == 3 && (sig.inputs[2] == nullptr || p.constants[2] != nullptr)) {
    pack_pointwise_gemv(g, w->data_as<float>(), sig.inputs[2] != nullptr ? p.constants[2]->data_as<float>() : nullptr,
                        *st);
    st->bytes = (st->gv_w.size() + st->gv_b.size()) * sizeof(float);
    st->released_inputs = {1, 2};  // the one-pixel path reads only the packed copies
    return std::unique_ptr<KernelState>(std::move(st));
  }
  // GEMM paths with a constant weight and more than one output column (a single column is a
  // matrix-vector product, which reads the weights directly; Winograd takes any size it is given).
  if (w != nullptr && !g.transposed && w->dtype == DType::Float32 && g.batch > 0 && g.out_channels > 0 && g.in_channels > 0 && !use_depthwise_kernel(g) && !cpu::direct_conv_applies(g) &&
      (OHW > 1 || cpu::winograd_applies(g))) {
    const int64_t cin_g = g.in_channels / g.groups, cout_g = g.out_channels / g.groups;
    const int64_t Kdim = cin_g * g.kernel[0] * g.kernel[1];
    if (use_pointwise_direct(g) && p.constants.size() == 3 && (sig.inputs[2] == nullptr || p.constants[2] != nullptr)) {
      pack_pointwise(g, w->data_as<float>(), sig.inputs[2] != nullptr ? p.constants[2]->data_as<float>() : nullptr, *st);
      st->bytes = (st->pw_w.size() + st->pw_b.size()) * sizeof(float);
      st->released_inputs = {1, 2};  // the direct path reads only the packed copies
    } else if (const int tile = cpu::winograd_tile(g); tile != 0) {  // the filters transformed for the Winograd path instead
      st->winograd_tile = tile;
      cpu::winograd_pack_weights(w->data_as<float>(), g.out_channels, g.in_channels, tile, st->winograd);
      st->bytes = st->winograd.size() * sizeof(float);
      st->released_inputs = {1};  // the Winograd path reads only the transformed copy
    } else if (cout_g > 1) {
      st->group_stride = cpu::packed_a_floats(cout_g, Kdim);
      st->packed.resize(static_cast<size_t>(st->group_stride * g.groups));
      const float* pw = w->data_as<float>();
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        cpu::pack_a_for_gemm(cout_g, Kdim, pw + grp * cout_g * Kdim, Kdim, st->packed.data() + grp * st->group_stride);
      }
      st->bytes = st->packed.size() * sizeof(float);
      st->released_inputs = {1};  // the GEMM paths read only the packed copy (M, N > 1 here)
    }
  }
  // A residual aten.add (alpha 1) of the output and another tensor of its type, on the direct
  // pointwise path (its store adds the other tensor; no activation was fused, the add is next).
  if (!st->fused_next && p.next != nullptr && p.next->other != nullptr && p.next->op == "aten.add" &&
      p.next->attrs.get_float("alpha", 1.0) == 1.0 && !st->pw_w.empty() && *p.next->other == *sig.outputs[0] &&
      sig.outputs[0]->dtype == DType::Float32) {
    st->residual = true;
    st->fused_next = true;
  }
  // The same on the Winograd and GEMM paths (prepared state: transformed or packed weights), and
  // an activation after the add (FusionCandidate::then, post_op_of) applied to the sum.
  if (!st->fused_next && p.next != nullptr && p.next->other != nullptr && p.next->op == "aten.add" &&
      p.next->attrs.get_float("alpha", 1.0) == 1.0 && (!st->winograd.empty() || !st->packed.empty()) &&
      *p.next->other == *sig.outputs[0] && sig.outputs[0]->dtype == DType::Float32) {
    st->residual_gw = true;
    st->fused_next = true;
    if (p.next->then != nullptr && cpu::post_op_of(p.next->then->op, p.next->then->attrs, &st->after)) {
      st->fused_then = true;
    }
  }
  if (!st->fused_next && st->packed.empty() && st->winograd.empty() && st->pw_w.empty()) return std::unique_ptr<KernelState>();
  return std::unique_ptr<KernelState>(std::move(st));
}

}  // namespace

void register_cpu_conv(KernelRegistry& r) {
  // conv_prepare chooses the path (and packs or transforms the weights) for the call's spatial sizes.
  r.add_optimized("aten.convolution", convolution, conv_accepts, conv_prepare, /*sizes_at_call=*/false);
}

}  // namespace kiln

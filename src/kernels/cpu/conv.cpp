// Optimized cpu kernel for aten.convolution (float32, 1-D and 2-D; NCHW).
//
// Eight paths, chosen per call (semantics: src/kernels/portable/conv.cpp):
//   depthwise (C_in/groups == 1, any multiplier): direct kernels: output rows of at most 32
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
//
// Written once over Google Highway (hwy/foreach_target.h: every SIMD target of the build, the
// 1-lane scalar one included): vector widths are the target's (Lanes(DF): 8 on AVX2, 16 on
// AVX-512, 4 on NEON, 1 on scalar); the channel-interleaved depthwise path works on groups of 8
// channels (CappedTag<float, 8>) and interleaves them with StoreInterleaved4/2 and
// LoadInterleaved4/2 instead of an 8x8 register transpose; stride-2 splits use LoadInterleaved2.
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
#include "kernels/cpu/post_op.h"
#include "kernels/cpu/winograd.h"
#include "kernels/kernel.h"

// Per-target part: compiled once per SIMD target (hwy/foreach_target.h re-includes this file).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/conv.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/post_op-inl.h"
#include "kernels/cpu/vec-inl.h"

#ifndef KILN_CPU_CONV_SHARED_
#define KILN_CPU_CONV_SHARED_
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
    tail = Lw + 64;  // vector reads past a row end: up to one vector (<= 64 floats on any target)
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

/// 1x1 kernel, stride 1, no padding (dilation is then irrelevant): the plain GEMM path.
bool is_plain_1x1(const ConvGeometry& g) {
  return g.kernel[0] == 1 && g.kernel[1] == 1 && g.stride[0] == 1 && g.stride[1] == 1 && g.padding[0] == 0 &&
         g.padding[1] == 0;
}

/// The post-op kinds that the inner loops fix at compile time (Generic: ApplyPostOp's switch).
enum class PwPost { None, Relu, Hardswish, Generic };

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

/// Channel-blocked depthwise convolution (one output channel per input channel): 8 channels at a
/// time, interleaved so that one vector of 8 lanes holds one pixel of 8 channels (the NCHW8c blocking
/// that oneDNN and ONNX Runtime's MLAS use for depthwise convolution, done locally here):
///   1. the block's input planes are interleaved into a zero-padded buffer in[Hp][Wp][8]
///      (Hp = IH + 2 PH, Wp = IW + 2 PW);
///   2. 8 output pixels at a time: out[oh, ow, :] = bias + sum_{kh, kw} w[:, kh, kw] *
///      in[oh*SH + kh*DH, ow*SW + kw*DW, :], taps in (kh, kw) order with fused multiply-add, the
///      same order and operations as depthwise_plane (the two give bit-identical results);
///   3. the [OH*OW][8] result is de-interleaved back into the 8 output planes, post-op applied.
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

/// The im2col matrix of one group of one image, [C_in_g * KH * KW, OH * OW], row
/// (c*KH + kh)*KW + kw, produced panel by panel for the GEMM (cpu::GemmBPacker, Im2colPack)
/// instead of being stored.
struct Im2col {
  const ConvGeometry* g;
  const float* x;  // the group's first input channel
};

/// Pointwise (1x1, stride 1, no padding, one group) convolution with few input channels
/// (C_in <= kPwMaxK), computed directly on the NCHW planes:
///   out[n, co, j] = post(bias[co] + sum_ci W[co, ci] * x[n, ci, j]),  j in [0, H*W),
/// the products accumulated in ci order with fused multiply-add, starting from the bias.
/// With so few input channels the GEMM path spends as much on packing the input and on its
/// general tile epilogue as on the multiply-adds (16 -> 64 channels at 112x112: 0.47 ms here,
/// ONNX Runtime 0.34 ms); this kernel reads the input rows where they are (a column block of all
/// C_in rows stays in L1) and keeps a 6-channel x 2-vector tile in registers (16 columns on AVX2), with the bias in
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

}  // namespace
}  // namespace kiln
#endif  // KILN_CPU_CONV_SHARED_

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// The post-op applied to one vector, with the kind fixed at compile time where it is one of the
/// common ones (Generic: ApplyPostOp's switch); the same float operations as ApplyPostOp.
template <PwPost P, class D, class V>
HWY_INLINE V PwPostV(D d, const PostOp& post, V v) {
  if constexpr (P == PwPost::None) return v;
  if constexpr (P == PwPost::Relu) return Relu(d, v);
  if constexpr (P == PwPost::Hardswish) return Hardswish(d, v);
  if constexpr (P == PwPost::Generic) return ApplyPostOp(d, post, v);
  return v;
}

/// `post` applied in place to y[0, n).
void ApplyPostRange(const PostOp& post, float* y, int64_t n) { ApplyPostOpInplace(post, y, n); }

// ------------------------------------------------------------------------------------------------
// Depthwise, flat plane (DwLayout).

/// Copies input row `src` [IW] into padded row r of `buf` (phase planes as DwLayout).
HWY_INLINE void DwScatterRow(const ConvGeometry& g, const DwLayout& L, const float* src, int64_t r, float* buf) {
  const int64_t IW = g.in_size[1], SH = g.stride[0], SW = g.stride[1], PW = g.padding[1];
  float* rowbase = buf + (r % SH) * SW * L.plane + (r / SH) * L.Lw;  // phase (r % SH, 0)
  if (SW == 1) {
    std::memcpy(rowbase + PW, src, sizeof(float) * static_cast<size_t>(IW));
    return;
  }
  if (SW == 2) {
    // x[2t] -> padded column 2t + PW, x[2t + 1] -> 2t + 1 + PW
    SplitEvenOdd(src, IW, rowbase + (PW % 2) * L.plane + PW / 2, rowbase + ((PW + 1) % 2) * L.plane + (PW + 1) / 2);
    return;
  }
  for (int64_t iw = 0; iw < IW; ++iw) {
    const int64_t c = iw + PW;
    rowbase[(c % SW) * L.plane + c / SW] = src[iw];
  }
}

/// NV vectors (N = Lanes(DF) output columns each) of one output row of a depthwise plane with KK
/// taps: o[N v + i] = post(bias + sum_t wk[t] * src[t][ow + N v + i]), taps in order with fused
/// multiply-add from the bias (the same operations as DepthwisePlane's flat loop); `n` columns
/// are stored (N (NV - 1) < n <= N NV). The NV accumulators stay in registers (every loop over v
/// unrolled); with NV = 8 there are enough independent FMA chains to cover the FMA latency.
template <int KK, int NV, PwPost P>
HWY_INLINE void DwRowVectors(const float* const* src, int64_t ow, const float* wk, VF b0, float* o, int64_t n,
                             const PostOp& post) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = b0;
#pragma GCC unroll 25
  for (int t = 0; t < KK; ++t) {
    const VF wv = hn::Set(d, wk[t]);
    const float* p = src[t] + ow;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[v] = hn::MulAdd(wv, hn::LoadU(d, p + N * v), acc[v]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV - 1; ++v) hn::StoreU(PwPostV<P>(d, post, acc[v]), d, o + N * v);
  const int64_t last = n - N * (NV - 1);
  if (last == N) {
    hn::StoreU(PwPostV<P>(d, post, acc[NV - 1]), d, o + N * (NV - 1));
  } else {
    StoreTail(d, PwPostV<P>(d, post, acc[NV - 1]), o + N * (NV - 1), static_cast<size_t>(last));
  }
}

/// One depthwise output plane out [OH, OW] (weights wk [KK], KK = 9 or 25) from the DwLayout
/// buffer `base` (tap t at offset tap[t]; see DepthwisePlane), output row by output row: each
/// row in blocks of 8 vectors, then one block of the remaining 1..8 N - 1 columns (1..8 vectors,
/// the last one stored partially), straight into the output (no pitch-Lw temporary, no padding
/// columns computed). Reads stay inside the buffer: row oh reads at most (oh + (KH-1)*DH / SH) *
/// Lw + (KW-1)*DW / SW + round_up(OW, N) <= (Lh - 1) * Lw + Lw + N - 1 floats into a phase plane,
/// since (OH - 1) * SH + (KH - 1) * DH < Hp and likewise along W; the phase plane has Lw + 64
/// floats of tail.
template <int KK, PwPost P>
HWY_INLINE void DwPlaneRows(const float* base, const int64_t* tap, int64_t Lw, const float* wk, float bias, float* out,
                            int64_t OH, int64_t OW, const PostOp& post) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF b0 = hn::Set(d, bias);
  const float* src[KK];
  for (int64_t oh = 0; oh < OH; ++oh) {
    for (int t = 0; t < KK; ++t) src[t] = base + oh * Lw + tap[t];
    float* o = out + oh * OW;
    int64_t ow = 0;
    for (; ow + 8 * N <= OW; ow += 8 * N) DwRowVectors<KK, 8, P>(src, ow, wk, b0, o + ow, 8 * N, post);
    const int64_t r = OW - ow;
    switch ((r + N - 1) / N) {
      case 1: DwRowVectors<KK, 1, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 2: DwRowVectors<KK, 2, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 3: DwRowVectors<KK, 3, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 4: DwRowVectors<KK, 4, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 5: DwRowVectors<KK, 5, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 6: DwRowVectors<KK, 6, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 7: DwRowVectors<KK, 7, P>(src, ow, wk, b0, o + ow, r, post); break;
      case 8: DwRowVectors<KK, 8, P>(src, ow, wk, b0, o + ow, r, post); break;
      default: break;  // r == 0
    }
  }
}

/// Depthwise convolution of one input plane x [IH, IW] into `mult` output planes out [mult, OH, OW]
/// with weights w [mult, KH, KW] and bias [mult] (or null):
///   out[m, oh, ow] = bias[m] + sum_{kh, kw} w[m, kh, kw] * x[oh*SH - PH + kh*DH, ow*SW - PW + kw*DW]
/// (zero outside x), computed on the DwLayout of the plane (`buf`, `tmp`: per-thread scratch,
/// `tap`: KH * KW offsets).
void DepthwisePlane(const ConvGeometry& g, const DwLayout& L, const float* x, const float* w, const float* bias,
                    float* out, int64_t mult, float* buf, float* tmp, int64_t* tap, const PostOp& post) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t IH = g.in_size[0], IW = g.in_size[1], OH = g.out_size[0], OW = g.out_size[1];
  const int64_t KH = g.kernel[0], KW = g.kernel[1], SH = g.stride[0], SW = g.stride[1];
  const int64_t PH = g.padding[0], DH = g.dilation[0], DW = g.dilation[1];
  // `buf` was zeroed when laid out for this geometry's (IH, IW, PH, PW, SH, SW) (see depthwise):
  // the scatter writes the same positions for every plane of it, so the padding stays zero from
  // one plane (and one call) to the next.
  for (int64_t ih = 0; ih < IH; ++ih) DwScatterRow(g, L, x + ih * IW, ih + PH, buf);
  for (int64_t kh = 0; kh < KH; ++kh) {
    for (int64_t kw = 0; kw < KW; ++kw) {
      const int64_t a = kh * DH, b = kw * DW;
      tap[kh * KW + kw] = ((a % SH) * SW + b % SW) * L.plane + (a / SH) * L.Lw + b / SW;
    }
  }
  const int64_t KK = KH * KW;
  if (KK == 9 || KK == 25) {  // 3x3, 5x5: taps unrolled, output rows written in place
    with_post_kind(post, [&](auto kind) {
      constexpr PwPost P = decltype(kind)::value;
      for (int64_t m = 0; m < mult; ++m) {
        const float bm = bias != nullptr ? bias[m] : 0.0f;
        if (KK == 9) {
          DwPlaneRows<9, P>(buf, tap, L.Lw, w + m * KK, bm, out + m * OH * OW, OH, OW, post);
        } else {
          DwPlaneRows<25, P>(buf, tap, L.Lw, w + m * KK, bm, out + m * OH * OW, OH, OW, post);
        }
      }
    });
    return;
  }
  const int64_t count = OH * L.Lw;  // flat outputs with pitch Lw
  const bool direct = L.Lw == OW;   // the flat layout is the output layout
  const float* base = buf;
  for (int64_t m = 0; m < mult; ++m) {
    const float* wk = w + m * KK;
    float* dst = direct ? out + m * OH * OW : tmp;
    const VF b0 = hn::Set(d, bias != nullptr ? bias[m] : 0.0f);
    int64_t q = 0;
    for (; q + 4 * N <= count; q += 4 * N) {
      VF a0 = b0, a1 = b0, a2 = b0, a3 = b0;
      for (int64_t t = 0; t < KK; ++t) {
        const VF wv = hn::Set(d, wk[t]);
        const float* p = base + tap[t] + q;
        a0 = hn::MulAdd(wv, hn::LoadU(d, p), a0);
        a1 = hn::MulAdd(wv, hn::LoadU(d, p + N), a1);
        a2 = hn::MulAdd(wv, hn::LoadU(d, p + 2 * N), a2);
        a3 = hn::MulAdd(wv, hn::LoadU(d, p + 3 * N), a3);
      }
      if (post.kind != PostOp::Kind::None) {
        a0 = ApplyPostOp(d, post, a0);
        a1 = ApplyPostOp(d, post, a1);
        a2 = ApplyPostOp(d, post, a2);
        a3 = ApplyPostOp(d, post, a3);
      }
      hn::StoreU(a0, d, dst + q);
      hn::StoreU(a1, d, dst + q + N);
      hn::StoreU(a2, d, dst + q + 2 * N);
      hn::StoreU(a3, d, dst + q + 3 * N);
    }
    for (; q < count; q += N) {  // reads stay inside the tail; the last store is partial
      VF a0 = b0;
      for (int64_t t = 0; t < KK; ++t) a0 = hn::MulAdd(hn::Set(d, wk[t]), hn::LoadU(d, base + tap[t] + q), a0);
      if (post.kind != PostOp::Kind::None) a0 = ApplyPostOp(d, post, a0);
      if (q + N <= count) {
        hn::StoreU(a0, d, dst + q);
      } else {
        StoreTail(d, a0, dst + q, static_cast<size_t>(count - q));
      }
    }
    if (!direct) {
      float* o = out + m * OH * OW;
      for (int64_t oh = 0; oh < OH; ++oh) {
        std::memcpy(o + oh * OW, dst + oh * L.Lw, sizeof(float) * static_cast<size_t>(OW));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Depthwise, channel-interleaved (DwC8).

/// The 8 channels of a DwC8 pixel: Lanes(D8) of them per vector (8 on AVX2 and AVX-512, 4 on
/// NEON, 1 on the scalar target).
using D8 = hn::CappedTag<float, 8>;
using V8 = hn::Vec<D8>;

#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE
/// In-register transpose of 8 vectors of 8 lanes (AVX2; AVX-512's 256-bit CappedTag):
/// r[i] lane k -> r[k] lane i, as 32-bit interleaves within 128-bit blocks, 64-bit interleaves
/// within blocks, then the exchange of 128-bit halves (the classic AVX 8x8 transpose of
/// unpacklo/hi, shuffle 0x44/0xEE and permute2f128 0x20/0x31). Only instantiated for 8 lanes.
template <class D>
HWY_INLINE void Transpose8x8(D d, hn::Vec<D> r[8]) {
  using V = hn::Vec<D>;
  const hn::Repartition<uint64_t, D> d64;
  const V t0 = hn::InterleaveLower(r[0], r[1]), t1 = hn::InterleaveUpper(d, r[0], r[1]);
  const V t2 = hn::InterleaveLower(r[2], r[3]), t3 = hn::InterleaveUpper(d, r[2], r[3]);
  const V t4 = hn::InterleaveLower(r[4], r[5]), t5 = hn::InterleaveUpper(d, r[4], r[5]);
  const V t6 = hn::InterleaveLower(r[6], r[7]), t7 = hn::InterleaveUpper(d, r[6], r[7]);
  const auto lo64 = [&](V a, V b) { return hn::BitCast(d, hn::InterleaveLower(hn::BitCast(d64, a), hn::BitCast(d64, b))); };
  const auto hi64 = [&](V a, V b) {
    return hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  const V u0 = lo64(t0, t2), u1 = hi64(t0, t2), u2 = lo64(t1, t3), u3 = hi64(t1, t3);
  const V u4 = lo64(t4, t6), u5 = hi64(t4, t6), u6 = lo64(t5, t7), u7 = hi64(t5, t7);
  r[0] = hn::ConcatLowerLower(d, u4, u0);
  r[1] = hn::ConcatLowerLower(d, u5, u1);
  r[2] = hn::ConcatLowerLower(d, u6, u2);
  r[3] = hn::ConcatLowerLower(d, u7, u3);
  r[4] = hn::ConcatUpperUpper(d, u4, u0);
  r[5] = hn::ConcatUpperUpper(d, u5, u1);
  r[6] = hn::ConcatUpperUpper(d, u6, u2);
  r[7] = hn::ConcatUpperUpper(d, u7, u3);
}
#define KILN_CONV_HAVE_TRANSPOSE8 1
#else
#define KILN_CONV_HAVE_TRANSPOSE8 0
#endif

/// dst[8 p + c] = r[c][p] for p < Lanes(D8), c < 8 (8 channel vectors -> pixel-major): two
/// 4-way interleaves (a[4 p + k] = r[2 k][p], b[4 p + k] = r[2 k + 1][p]) and one 2-way interleave
/// of a and b (dst[2 q] = a[q], dst[2 q + 1] = b[q]), through the 4 Lanes(D8) floats at `a` and
/// `b` (aligned scratch). Highway's interleaving stores exist on every target; with 8 lanes
/// (AVX2, AVX-512) one in-register transpose (Transpose8x8) instead.
HWY_INLINE void Interleave8(D8 d, const V8 r[8], float* HWY_RESTRICT dst, float* HWY_RESTRICT a,
                            float* HWY_RESTRICT b) {
  const size_t N = hn::Lanes(d);
#if KILN_CONV_HAVE_TRANSPOSE8
  if constexpr (hn::MaxLanes(D8()) == 8) {  // 8 lanes: one in-register transpose
    V8 t[8] = {r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]};
    Transpose8x8(d, t);
    for (size_t k = 0; k < 8; ++k) hn::StoreU(t[k], d, dst + 8 * k);
    return;
  }
#endif
  hn::StoreInterleaved4(r[0], r[2], r[4], r[6], d, a);
  hn::StoreInterleaved4(r[1], r[3], r[5], r[7], d, b);
  for (size_t i = 0; i < 4; ++i) hn::StoreInterleaved2(hn::Load(d, a + i * N), hn::Load(d, b + i * N), d, dst + 2 * i * N);
}

/// The inverse of Interleave8: r[c][p] = src[8 p + c] (8 lanes: Transpose8x8 of 8 loads).
HWY_INLINE void Deinterleave8(D8 d, const float* HWY_RESTRICT src, V8 r[8], float* HWY_RESTRICT a,
                              float* HWY_RESTRICT b) {
  const size_t N = hn::Lanes(d);
#if KILN_CONV_HAVE_TRANSPOSE8
  if constexpr (hn::MaxLanes(D8()) == 8) {  // 8 lanes: one in-register transpose
    for (size_t k = 0; k < 8; ++k) r[k] = hn::LoadU(d, src + 8 * k);
    Transpose8x8(d, r);
    return;
  }
#endif
  for (size_t i = 0; i < 4; ++i) {
    V8 e, o;
    hn::LoadInterleaved2(d, src + 2 * i * N, e, o);
    hn::Store(e, d, a + i * N);
    hn::Store(o, d, b + i * N);
  }
  hn::LoadInterleaved4(d, a, r[0], r[2], r[4], r[6]);
  hn::LoadInterleaved4(d, b, r[1], r[3], r[5], r[7]);
}

/// Channels [c0, c0 + nc) (nc <= 8) of one image: x [C, IH, IW] planes -> out [C, OH, OW] planes.
/// `in` (DwC8::in_floats) has zero borders; `acc` holds round_up(OH * OW, 8) pixels of 8 floats.
/// The output pixels are taken 8 at a time in flat order (oh * OW + ow, across rows), each with
/// its own input position, so only the plane's last block is partial.
template <PwPost P>
HWY_INLINE void DepthwiseC8Block(const ConvGeometry& g, const DwC8& L, const float* x, const float* w,
                                 const float* bias, float* out, int64_t c0, int64_t nc, float* in, float* acc,
                                 const PostOp& post) {
  const D8 d;
  const int64_t N8 = static_cast<int64_t>(hn::Lanes(d));
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
  HWY_ALIGN float ta[32], tb[32];  // Interleave8 scratch (4 Lanes(D8) <= 32 floats each)
  // 1. interleave the input planes into the interior of `in`, Lanes(D8) pixels at a time.
  const float* xc[8];
  for (int64_t c = 0; c < 8; ++c) xc[c] = x + (c0 + std::min(c, nc - 1)) * IHW;
  for (int64_t ih = 0; ih < IH; ++ih) {
    float* dst = in + ((ih + PH) * Wp + PW) * 8;
    for (int64_t iw = 0; iw < IW; iw += N8) {
      const int64_t n = std::min<int64_t>(N8, IW - iw);
      V8 r[8];
      for (int64_t c = 0; c < 8; ++c) {
        const float* src = xc[c] + ih * IW + iw;
        r[c] = c >= nc ? hn::Zero(d) : n == N8 ? hn::LoadU(d, src) : LoadTail(d, src, static_cast<size_t>(n));
      }
      // Pixels past IW are zeros (partial loads) written into this row's right padding or the
      // next row's left padding (zero anyway; the next row's interior is written after this).
      Interleave8(d, r, dst + iw * 8, ta, tb);
    }
  }
  // 2. 8 output pixels at a time (a partial last block repeats its last pixel), the 8 channels
  //    in 8 / Lanes(D8) vectors.
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
    for (int64_t sv = 0; sv < 8; sv += N8) {
      const V8 vb = hn::LoadU(d, b8 + sv);
      V8 a[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) a[j] = vb;
      for (int64_t t = 0; t < KK; ++t) {
        const V8 wv = hn::LoadU(d, w8 + t * 8 + sv);
        const int64_t o = tap[t] + sv;
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) a[j] = hn::MulAdd(wv, hn::LoadU(d, base[j] + o), a[j]);
      }
      float* dp = acc + p * 8 + sv;
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) hn::StoreU(a[j], d, dp + 8 * j);
    }
  }
  // 3. de-interleave back into the output planes, post-op applied.
  for (int64_t p = 0; p < OHW; p += N8) {
    const int64_t n = std::min<int64_t>(N8, OHW - p);
    V8 r[8];
    Deinterleave8(d, acc + p * 8, r, ta, tb);
    for (int64_t c = 0; c < nc; ++c) {
      float* dp = out + (c0 + c) * OHW + p;
      const V8 v = PwPostV<P>(d, post, r[c]);
      if (n == N8) {
        hn::StoreU(v, d, dp);
      } else {
        StoreTail(d, v, dp, static_cast<size_t>(n));
      }
    }
  }
}

/// Tasks [begin, end) of depthwise_c8 (task t: image t / blocks, channels 8 (t % blocks) ..),
/// with the thread's zero-bordered `in` and `acc` buffers.
void DepthwiseC8Tasks(const ConvGeometry& g, const DwC8& L, const float* px, const float* pw, const float* pb,
                      float* po, int64_t begin, int64_t end, int64_t blocks, float* in, float* acc,
                      const PostOp& post) {
  const int64_t C = g.in_channels;
  const int64_t in_plane = g.in_size[0] * g.in_size[1];
  const int64_t out_plane = g.out_size[0] * g.out_size[1];
  with_post_kind(post, [&](auto kind) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t / blocks, c0 = (t % blocks) * 8;
      DepthwiseC8Block<decltype(kind)::value>(g, L, px + n * C * in_plane, pw, pb, po + n * C * out_plane, c0,
                                              std::min<int64_t>(8, C - c0), in, acc, post);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// im2col, packed on the fly for the GEMM.

/// Row (c, kh, kw) of the im2col matrix of one group over the columns of `segs`:
///   dst[j - j0] = x[c, oh*SH - PH + kh*DH, ow*SW - PW + kw*DW] (0 outside), j = oh*OW + ow.
/// `plane` is input channel c [IH, IW].
HWY_INLINE void Im2colRow(const ConvGeometry& g, const float* plane, int64_t kh, int64_t kw,
                          const std::vector<Segment>& segs, float* dst) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t IH = g.in_size[0], IW = g.in_size[1];
  const int64_t SH = g.stride[0], SW = g.stride[1], PH = g.padding[0], PW = g.padding[1];
  const int64_t DH = g.dilation[0], DW = g.dilation[1];
  // ow in [lo_ow, hi_ow) has iw = ow*SW + off inside [0, IW)
  const int64_t off = kw * DW - PW;
  const int64_t lo_ow = off >= 0 ? 0 : (-off + SW - 1) / SW;
  const int64_t hi_ow = IW - off <= 0 ? 0 : (IW - off + SW - 1) / SW;
  for (const Segment& s : segs) {
    float* o = dst + s.at;
    const int64_t ih = s.oh * SH - PH + kh * DH;
    if (ih < 0 || ih >= IH) {
      for (int64_t t = 0; t < s.len; ++t) o[t] = 0.0f;
      continue;
    }
    const float* src = plane + ih * IW + off;
    const int64_t lo = std::clamp(lo_ow - s.ow0, int64_t{0}, s.len);
    const int64_t hi = std::clamp(hi_ow - s.ow0, lo, s.len);
    for (int64_t t = 0; t < lo; ++t) o[t] = 0.0f;
    if (SW == 1) {
      const float* sp = src + s.ow0;
      for (int64_t t = lo; t < hi; ++t) o[t] = sp[t];
    } else if (SW == 2) {
      // Even elements of 2 N-float reads (stems: 3x3 / 7x7 stride 2), while the read stays inside
      // the input row (row index (ow0 + t) * 2 + off + 2 N - 1 < IW); the rest one by one.
      const float* sp = src + 2 * s.ow0;
      int64_t t = lo;
      for (; t + N <= hi && (s.ow0 + t) * 2 + off + 2 * N - 1 < IW; t += N) {
        VF e, odd;
        hn::LoadInterleaved2(d, sp + 2 * t, e, odd);
        hn::StoreU(e, d, o + t);
      }
      for (; t < hi; ++t) o[t] = sp[2 * t];
    } else {
      for (int64_t t = lo; t < hi; ++t) o[t] = src[(s.ow0 + t) * SW];
    }
    for (int64_t t = hi; t < s.len; ++t) o[t] = 0.0f;
  }
}

/// Row p of the K block (`row`, nc floats) into the kGemmPanelCols-column panels.
HWY_INLINE void Im2colCopyRow(float* out, int64_t stride, int64_t full, int64_t nc, int64_t p, const float* row) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t P = kGemmPanelCols;
  for (int64_t jr = 0; jr < full; jr += P) {
    float* o = out + jr / P * stride + p * P;
    int64_t u = 0;
    for (; u + N <= P; u += N) hn::StoreU(hn::LoadU(d, row + jr + u), d, o + u);
    for (; u < P; ++u) o[u] = row[jr + u];
  }
  if (full < nc) {
    float* o = out + full / P * stride + p * P;
    const int64_t n = nc - full;
    for (int64_t t = 0; t < n; ++t) o[t] = row[full + t];
    for (int64_t t = n; t < P; ++t) o[t] = 0.0f;
  }
}

/// GemmBPacker::fn of the im2col matrix (ctx: an Im2col): one row at a time into a small
/// per-thread buffer (2 x 4 KiB, stays in L1), then into the panels.
void Im2colPack(const void* ctx, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float* out) {
  const Im2col& c = *static_cast<const Im2col*>(ctx);
  const ConvGeometry& g = *c.g;
  const int64_t KH = g.kernel[0], KW = g.kernel[1], KK = KH * KW;
  const int64_t IHW = g.in_size[0] * g.in_size[1];
  constexpr int64_t P = kGemmPanelCols;
  const int64_t stride = gemm_panel_stride(kc);
  // Two row buffers: row p is generated, then row p - 1 (written one row earlier) is copied
  // into the panels.
  thread_local std::vector<float> rows;
  thread_local std::vector<Segment> segs;
  const size_t cap = static_cast<size_t>(kGemmMaxPackCols);
  if (rows.size() < 2 * cap) rows.resize(2 * cap);
  segments_of(g, j0, j0 + nc, segs);
  const int64_t full = nc / P * P;
  for (int64_t p = 0; p <= kc; ++p) {
    if (p < kc) {
      const int64_t q = p0 + p;
      const int64_t ch = q / KK, r = q % KK;
      Im2colRow(g, c.x + ch * IHW, r / KW, r % KW, segs, rows.data() + (p % 2) * cap);
    }
    if (p > 0) Im2colCopyRow(out, stride, full, nc, p - 1, rows.data() + ((p - 1) % 2) * cap);
  }
}

// ------------------------------------------------------------------------------------------------
// Direct pointwise (use_pointwise_direct).

/// One output row of a tile with a fused residual add: o[t] = post(v[t]) + r[t], t < n (<= 2 N).
template <class D, PwPost P, class V = hn::Vec<D>>
HWY_INLINE void PwStoreResidual(float* o, const float* r, V v0, V v1, int64_t n, const PostOp& post) {
  const D d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  if (n == 2 * N) {
    hn::StoreU(hn::Add(PwPostV<P>(d, post, v0), hn::LoadU(d, r)), d, o);
    hn::StoreU(hn::Add(PwPostV<P>(d, post, v1), hn::LoadU(d, r + N)), d, o + N);
    return;
  }
  if (n >= N) {
    hn::StoreU(hn::Add(PwPostV<P>(d, post, v0), hn::LoadU(d, r)), d, o);
  } else {
    const size_t k = static_cast<size_t>(n);
    StoreTail(d, hn::Add(PwPostV<P>(d, post, v0), LoadTail(d, r, k)), o, k);
  }
  if (n > N) {
    const size_t k = static_cast<size_t>(n - N);
    StoreTail(d, hn::Add(PwPostV<P>(d, post, v1), LoadTail(d, r + N, k)), o + N, k);
  }
}

/// One output column (out[i * ldx], i < mr) of a channel group, for a plane's last column when
/// it is alone in its 2 N-column tile (7x7 planes on AVX2: 49 = 3 * 16 + 1): the group's 6
/// channels across the lanes (lane i of the vector at i0: w[k * 6 + i0 + i]; lanes past the group
/// read the next input channel's weights and are dropped; pack_pointwise pads st.pw_w by 64
/// floats for the last group), 4 partial sums over k % 4, then the bias, activation and fused
/// residual as PwRows. A 1-column tile in PwRows spends 6 FMAs per input channel on 1 useful lane
/// each (12% of a 7x7 layer's multiply-adds); here it is 6 / Lanes (1 on AVX2).
template <class D, PwPost P>
HWY_INLINE void PwOneColumn(int64_t K, const float* w, const float* b6, const float* x, int64_t ldx, float* out,
                            int mr, const PostOp& post, const float* res) {
  using V = hn::Vec<D>;
  const D d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  HWY_ALIGN float t[kPwMR + HWY_MAX_BYTES / sizeof(float)];
  for (int64_t i0 = 0; i0 < mr; i0 += N) {
    V a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
      const float* xp = x + k * ldx;
      const float* wp = w + k * kPwMR + i0;
      a0 = hn::MulAdd(hn::Set(d, xp[0]), hn::LoadU(d, wp), a0);
      a1 = hn::MulAdd(hn::Set(d, xp[ldx]), hn::LoadU(d, wp + kPwMR), a1);
      a2 = hn::MulAdd(hn::Set(d, xp[2 * ldx]), hn::LoadU(d, wp + 2 * kPwMR), a2);
      a3 = hn::MulAdd(hn::Set(d, xp[3 * ldx]), hn::LoadU(d, wp + 3 * kPwMR), a3);
    }
    for (; k < K; ++k) a0 = hn::MulAdd(hn::Set(d, x[k * ldx]), hn::LoadU(d, w + k * kPwMR + i0), a0);
    V v = hn::Add(hn::Add(a0, a1), hn::Add(a2, a3));
    const int64_t nb = std::min<int64_t>(N, kPwMR - i0);
    const V bv = nb == N ? hn::LoadU(d, b6 + i0) : LoadTail(d, b6 + i0, static_cast<size_t>(nb));
    hn::Store(PwPostV<P>(d, post, hn::Add(v, bv)), d, t + i0);
  }
  for (int i = 0; i < mr; ++i) out[i * ldx] = res != nullptr ? t[i] + res[i * ldx] : t[i];
}

/// Output channels [co0, co0 + mr) (mr <= 6) over columns [j0, j0 + nc) of one image:
/// `w` [K][6] and `b6` [6] are the channel group's packed weights and bias (zero past mr),
/// x [K][ldx] the input planes, out [C_out][ldx]. Tiles of 6 channels x 2 vectors of D (2 N columns).
template <class D, PwPost P>
HWY_INLINE void PwRows(int64_t K, const float* w, const float* b6, const float* x, int64_t ldx, float* out, int mr,
                       int64_t j0, int64_t nc, const PostOp& post, const float* res) {
  using V = hn::Vec<D>;
  const D d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  V bb[kPwMR];
#pragma GCC unroll 6
  for (int i = 0; i < kPwMR; ++i) bb[i] = hn::Set(d, b6[i]);
  int64_t j = j0;
  const int64_t end = j0 + nc;
  for (; j < end; j += 2 * N) {
    const int64_t n = std::min<int64_t>(2 * N, end - j);
    if (n == 1) {
      PwOneColumn<D, P>(K, w, b6, x + j, ldx, out + j, mr, post, res != nullptr ? res + j : nullptr);
      continue;
    }
    V c0[kPwMR], c1[kPwMR];
#pragma GCC unroll 6
    for (int i = 0; i < kPwMR; ++i) c0[i] = c1[i] = bb[i];
    const float* xp = x + j;
    const float* wp = w;
    if (n == 2 * N) {
      for (int64_t k = 0; k < K; ++k, xp += ldx, wp += kPwMR) {
        const V x0 = hn::LoadU(d, xp), x1 = hn::LoadU(d, xp + N);
#pragma GCC unroll 6
        for (int i = 0; i < kPwMR; ++i) {
          const V a = hn::Set(d, wp[i]);
          c0[i] = hn::MulAdd(a, x0, c0[i]);
          c1[i] = hn::MulAdd(a, x1, c1[i]);
        }
      }
    } else if (n <= N) {  // last (at most N) columns of the plane: one vector
      const size_t k0 = static_cast<size_t>(n);
      for (int64_t k = 0; k < K; ++k, xp += ldx, wp += kPwMR) {
        const V x0 = n == N ? hn::LoadU(d, xp) : LoadTail(d, xp, k0);
#pragma GCC unroll 6
        for (int i = 0; i < kPwMR; ++i) c0[i] = hn::MulAdd(hn::Set(d, wp[i]), x0, c0[i]);
      }
    } else {  // last N + 1 .. 2 N - 1 columns of the plane (never read past the row's end)
      const size_t k1 = static_cast<size_t>(n - N);
      for (int64_t k = 0; k < K; ++k, xp += ldx, wp += kPwMR) {
        const V x0 = hn::LoadU(d, xp), x1 = LoadTail(d, xp + N, k1);
#pragma GCC unroll 6
        for (int i = 0; i < kPwMR; ++i) {
          const V a = hn::Set(d, wp[i]);
          c0[i] = hn::MulAdd(a, x0, c0[i]);
          c1[i] = hn::MulAdd(a, x1, c1[i]);
        }
      }
    }
    float* o = out + j;
    if (res != nullptr) {  // fused residual aten.add: (conv result) + res, as the add kernel computes it
      const float* r = res + j;
#pragma GCC unroll 6
      for (int i = 0; i < kPwMR; ++i) {
        if (i < mr) PwStoreResidual<D, P>(o + i * ldx, r + i * ldx, c0[i], c1[i], n, post);
      }
      continue;
    }
    if (n == 2 * N && mr == kPwMR) {
#pragma GCC unroll 6
      for (int i = 0; i < kPwMR; ++i) {
        hn::StoreU(PwPostV<P>(d, post, c0[i]), d, o + i * ldx);
        hn::StoreU(PwPostV<P>(d, post, c1[i]), d, o + i * ldx + N);
      }
      continue;
    }
#pragma GCC unroll 6
    for (int i = 0; i < kPwMR; ++i) {
      if (i >= mr) break;
      float* oi = o + i * ldx;
      if (n >= N) {
        hn::StoreU(PwPostV<P>(d, post, c0[i]), d, oi);
      } else {
        StoreTail(d, PwPostV<P>(d, post, c0[i]), oi, static_cast<size_t>(n));
      }
      if (n == 2 * N) {
        hn::StoreU(PwPostV<P>(d, post, c1[i]), d, oi + N);
      } else if (n > N) {
        StoreTail(d, PwPostV<P>(d, post, c1[i]), oi + N, static_cast<size_t>(n - N));
      }
    }
  }
}

/// Channel groups [q0, q1) (6 output channels each) over columns [j0, j0 + nc) of one image:
/// x [C_in][HW], out [C_out][HW], res (null: none) [C_out][HW]; weights st.pw_w / st.pw_b.
void PointwiseGroups(const ConvGeometry& g, const ConvState& st, const float* x, float* out, const float* res,
                     int64_t q0, int64_t q1, int64_t j0, int64_t nc) {
  const int64_t K = g.in_channels, M = g.out_channels, HW = g.in_size[0] * g.in_size[1];
  with_post_kind(st.post, [&](auto kind) {
    constexpr PwPost P = decltype(kind)::value;
    for (int64_t q = q0; q < q1; ++q) {
      const int mr = static_cast<int>(std::min(kPwMR, M - q * kPwMR));
      const float* w = st.pw_w.data() + q * K * kPwMR;
      const float* b6 = st.pw_b.data() + q * kPwMR;
      const float* r = res != nullptr ? res + q * kPwMR * HW : nullptr;
      // Planes under 128 pixels (14x14, 7x7) take vectors of at most 8 lanes: 16-lane tiles of 32
      // columns would compute 64 lanes for a 7x7 plane's 49 (AVX-512: 10% slower on
      // mobilenet_v3_small than 8 lanes).
      if constexpr (hn::MaxLanes(DF()) > 8) {
        if (HW < 128) {
          PwRows<D8, P>(K, w, b6, x, HW, out + q * kPwMR * HW, mr, j0, nc, st.post, r);
          continue;
        }
      }
      PwRows<DF, P>(K, w, b6, x, HW, out + q * kPwMR * HW, mr, j0, nc, st.post, r);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// One-pixel pointwise (use_pointwise_gemv).

/// Output blocks [q0, q1) of every image (see use_pointwise_gemv); x [N, C_in], out [N, C_out].
/// A block's 32 channels in passes of up to 4 vectors (one pass on AVX2 and AVX-512).
template <PwPost P>
HWY_INLINE void GemvBlocksP(const ConvGeometry& g, const ConvState& st, const float* x, float* out, int64_t q0,
                            int64_t q1) {
  const D8 d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t kMax = static_cast<int64_t>(hn::MaxLanes(D8()));
  constexpr int kV = kGvBlock / kMax >= 4 ? 4 : kGvBlock / kMax >= 2 ? 2 : 1;
  const int64_t K = g.in_channels, M = g.out_channels;
  for (int64_t q = q0; q < q1; ++q) {
    const float* wq = st.gv_w.data() + q * K * kGvBlock;
    const float* bq = st.gv_b.data() + q * kGvBlock;
    const int64_t valid = std::min(kGvBlock, M - q * kGvBlock);
    for (int64_t n = 0; n < g.batch; ++n) {
      const float* xn = x + n * K;
      float* o = out + n * M + q * kGvBlock;
      for (int64_t v0 = 0; v0 < kGvBlock && v0 < valid; v0 += kV * N) {
        V8 a[kV];
#pragma GCC unroll 4
        for (int i = 0; i < kV; ++i) a[i] = hn::LoadU(d, bq + v0 + i * N);
        const float* wp = wq + v0;
        for (int64_t k = 0; k < K; ++k, wp += kGvBlock) {
          const V8 xv = hn::Set(d, xn[k]);
#pragma GCC unroll 4
          for (int i = 0; i < kV; ++i) a[i] = hn::MulAdd(xv, hn::LoadU(d, wp + i * N), a[i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < kV; ++i) {
          const int64_t left = valid - (v0 + i * N);
          if (left <= 0) break;
          const V8 r = PwPostV<P>(d, st.post, a[i]);
          if (left >= N) {
            hn::StoreU(r, d, o + v0 + i * N);
          } else {
            StoreTail(d, r, o + v0 + i * N, static_cast<size_t>(left));
          }
        }
      }
    }
  }
}

void GemvBlocks(const ConvGeometry& g, const ConvState& st, const float* x, float* out, int64_t q0, int64_t q1) {
  with_post_kind(st.post, [&](auto kind) { GemvBlocksP<decltype(kind)::value>(g, st, x, out, q0, q1); });
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
namespace cpu {
HWY_EXPORT(ApplyPostRange);
HWY_EXPORT(DepthwisePlane);
HWY_EXPORT(DepthwiseC8Tasks);
HWY_EXPORT(Im2colPack);
HWY_EXPORT(PointwiseGroups);
HWY_EXPORT(GemvBlocks);
}  // namespace cpu

namespace {

/// `post` applied in place to y[0, n) (the target's ApplyPostOpInplace).
void apply_post(const cpu::PostOp& post, float* y, int64_t n) {
  if (post.kind != cpu::PostOp::Kind::None) KILN_CPU_DISPATCH(ApplyPostRange)(post, y, n);
}

/// out[i] = after(out[i] + res[i]) over [N, C, plane] (the GEMM paths' fused residual add and
/// activation, run after the product while the output is still in the caches), split over the
/// planes on `pool`.
void residual_planes(float* out, const float* res, int64_t planes, int64_t plane, ThreadPool* pool,
                     const cpu::PostOp& after) {
  cpu::parallel_range(pool, planes, std::max<int64_t>(1, 8192 / std::max<int64_t>(plane, 1)), [&](int64_t b, int64_t e) {
    cpu::residual_inplace(out + b * plane, res + b * plane, (e - b) * plane, after);
  });
}

void depthwise_c8(const ConvGeometry& g, const float* px, const float* pw, const float* pb, float* po, ThreadPool* pool,
                  const cpu::PostOp& post) {
  const int64_t C = g.in_channels;
  const int64_t blocks = (C + 7) / 8;
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
    KILN_CPU_DISPATCH(DepthwiseC8Tasks)(g, L, px, pw, pb, po, begin, end, blocks, b, acc.data(), post);
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
      KILN_CPU_DISPATCH(DepthwisePlane)(g, L, px + (n * C + c) * in_plane, pw + c * mult * kk,
                                                pb != nullptr ? pb + c * mult : nullptr,
                                                po + (n * g.out_channels + c * mult) * out_plane, mult, buf.data(),
                                                tmp.data(), tap.data(), post);
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

/// GemmBPacker::fn of the im2col matrix (ctx: an Im2col), the target's Im2colPack.
void im2col_pack(const void* ctx, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float* out) {
  KILN_CPU_DISPATCH(Im2colPack)(ctx, j0, nc, p0, kc, out);
}

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
      cpu::sgemm_packed_b(cout_g, OHW, Kdim, 1.0f, pw + grp * cout_g * Kdim, Kdim, cpu::GemmBPacker{im2col_pack, &ctx},
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
        apply_post(post, plane, OHW);
      });
    }
  }
}

/// The direct pointwise convolution (use_pointwise_direct) with weights packed by
/// conv_prepare: st.pw_w [ceil(C_out/6)][C_in][6], st.pw_b [ceil(C_out/6) * 6] (zero padded).
/// Work is split over column blocks whose C_in input rows fit in 16 KiB (L1); each block computes
/// all output channels (split in chunks too when there are few blocks and several threads).
/// `res` (null: none): the fused residual [N, C_out, H, W] added after the activation.
void pointwise_direct(const ConvGeometry& g, const float* px, float* po, ThreadPool* pool, const ConvState& st,
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
    KILN_CPU_DISPATCH(PointwiseGroups)(g, st, px + n * K * HW, po + n * M * HW,
                                               res != nullptr ? res + n * M * HW : nullptr, mc * per,
                                               std::min(groups6, (mc + 1) * per), j0, nc);
  };
  if (!parallel || tasks < 2) {
    for (int64_t t = 0; t < tasks; ++t) run(t);
    return;
  }
  cpu::parallel_tasks(pool, tasks, run);
}

/// Packs the weights [C_out, C_in] and bias (or null) of the direct pointwise path into
/// st.pw_w / st.pw_b (layout at pointwise_direct).
void pack_pointwise(const ConvGeometry& g, const float* w, const float* b, ConvState& st) {
  const int64_t K = g.in_channels, M = g.out_channels;
  const int64_t groups6 = (M + kPwMR - 1) / kPwMR;
  st.pw_w.assign(static_cast<size_t>(groups6 * K * kPwMR + 64), 0.0f);  // + 64: PwOneColumn's last vector read
  st.pw_b.assign(static_cast<size_t>(groups6 * kPwMR), 0.0f);
  for (int64_t co = 0; co < M; ++co) {
    const int64_t q = co / kPwMR, r = co % kPwMR;
    for (int64_t k = 0; k < K; ++k) st.pw_w[static_cast<size_t>((q * K + k) * kPwMR + r)] = w[co * K + k];
    if (b != nullptr) st.pw_b[static_cast<size_t>(co)] = b[co];
  }
}

/// The one-pixel pointwise convolution with st.gv_w / st.gv_b; parallel over blocks of output
/// channels when the weights take at least 128 KiB (each thread then streams its share).
void pointwise_gemv(const ConvGeometry& g, const float* px, float* po, ThreadPool* pool, const ConvState& st) {
  const int64_t blocks = (g.out_channels + kGvBlock - 1) / kGvBlock;
  const bool parallel = pool != nullptr && pool->num_threads() > 1 && blocks > 1 &&
                        g.in_channels * g.out_channels >= 32768;
  if (!parallel) {
    KILN_CPU_DISPATCH(GemvBlocks)(g, st, px, po, 0, blocks);
    return;
  }
  const int64_t parts = std::min<int64_t>(blocks, 2 * pool->num_threads());
  const int64_t per = (blocks + parts - 1) / parts;
  cpu::parallel_tasks(pool, (blocks + per - 1) / per, [&](int64_t t) {
    KILN_CPU_DISPATCH(GemvBlocks)(g, st, px, po, t * per, std::min(blocks, (t + 1) * per));
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
        apply_post(post, po + (n * g.out_channels + c) * plane, plane);
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
#endif  // HWY_ONCE

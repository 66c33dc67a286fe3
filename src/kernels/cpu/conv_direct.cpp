// See conv_direct.h. Written once over Google Highway (hwy/foreach_target.h: every SIMD target
// of the build); the register tile is kOcBlock output channels x kVectors vectors of the target's
// float lanes (Lanes(DF): 8 on AVX2, 16 on AVX-512, 4 on NEON, 1 on the scalar target).
#include "kernels/cpu/conv_direct.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/parallel_util.h"

// Per-target part: compiled once per SIMD target (hwy/foreach_target.h re-includes this file).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/conv_direct.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/post_op-inl.h"
#include "kernels/cpu/vec-inl.h"

#ifndef KILN_CPU_CONV_DIRECT_SHARED_
#define KILN_CPU_CONV_DIRECT_SHARED_
namespace kiln::cpu {
namespace {

/// Input rows of one image and channel, padded and split by stride phase, built on demand: a
/// ring of kH slots keyed by input row (consecutive output rows share kH - stride of them).
struct RowCache {
  int64_t Lw = 0;                 ///< floats per phase row (ceil(Wp / s) + slack)
  int64_t slot_floats = 0;        ///< s * Lw: one input row, all its phases
  std::vector<float> buf;         ///< C_in * kH slots
  std::vector<int64_t> slot_row;  ///< input row each slot holds (INT64_MIN: none)
};

}  // namespace
}  // namespace kiln::cpu
#endif  // KILN_CPU_CONV_DIRECT_SHARED_

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Register tile: kOcBlock output channels x kVectors vectors of output columns. With the 32
/// vector registers of AVX-512, 8 channels x 2 vectors (32 columns: less waste on the last tile
/// of a 112-column row than 3 x 16); elsewhere 4 channels x 3 vectors (24 columns on AVX2).
#if HWY_TARGET <= HWY_AVX3
constexpr int kOcBlock = 8;
constexpr int kVectors = 2;
#else
constexpr int kOcBlock = 4;
constexpr int kVectors = 3;
#endif

/// Writes input row `ih` of channel plane `xc` (IH x IW), zero-padded by PW on the left, into
/// phase rows dst[p * Lw + t] = padded[t * s + p]; rows outside [0, IH) are all zeros.
HWY_INLINE void BuildRow(const ConvGeometry& g, const float* HWY_RESTRICT xc, int64_t ih, int64_t Lw,
                         float* HWY_RESTRICT dst) {
  const int64_t s = g.stride[1], IW = g.in_size[1], PW = g.padding[1];
  std::fill(dst, dst + s * Lw, 0.0f);
  if (ih < 0 || ih >= g.in_size[0]) return;
  const float* src = xc + ih * IW;
  if (s == 1) {
    std::memcpy(dst + PW, src, sizeof(float) * static_cast<size_t>(IW));
    return;
  }
  // s == 2: padded column j = PW + iw goes to phase j % 2 at j / 2.
  SplitEvenOdd(src, IW, dst + (PW % 2) * Lw + PW / 2, dst + ((PW + 1) % 2) * Lw + (PW + 1) / 2);
}

/// acc[o][v] for output channels oc0 .. oc0 + OCB - 1 and columns ow0 + N v .. + N - 1 of one output
/// row, from the phase rows rows[c * kH + kh] (tap kw at offset koff[kw] = (kw % s) * Lw + kw / s,
/// computed once per call rather than divided out per tap); then bias, activation, store of
/// columns < OW.
template <int OCB>
HWY_INLINE void Tile(const ConvGeometry& g, const float* const* rows, const int64_t* koff, const float* w,
                     const float* bias, int64_t oc0, int64_t ow0, float* out_row, int64_t plane, const PostOp& post) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t C = g.in_channels, KH = g.kernel[0], KW = g.kernel[1], OW = g.out_size[1];
  VF acc[OCB][kVectors];  // in registers: every loop over o and v is unrolled
#pragma GCC unroll 8
  for (int o = 0; o < OCB; ++o) {
#pragma GCC unroll 3
    for (int v = 0; v < kVectors; ++v) acc[o][v] = hn::Zero(d);
  }
  const int64_t wstride = C * KH * KW;  // floats between output channels' filters
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t kh = 0; kh < KH; ++kh) {
      const float* r = rows[c * KH + kh];
      const float* wk = w + oc0 * wstride + (c * KH + kh) * KW;
      for (int64_t kw = 0; kw < KW; ++kw) {
        const float* src = r + koff[kw] + ow0;
        VF in[kVectors];
#pragma GCC unroll 3
        for (int v = 0; v < kVectors; ++v) in[v] = hn::LoadU(d, src + N * v);
#pragma GCC unroll 8
        for (int o = 0; o < OCB; ++o) {
          const VF wv = hn::Set(d, wk[o * wstride + kw]);
#pragma GCC unroll 3
          for (int v = 0; v < kVectors; ++v) acc[o][v] = hn::MulAdd(wv, in[v], acc[o][v]);
        }
      }
    }
  }
  // Spill the tile once (constant indices keep acc in registers above; indexing acc with the
  // epilogue's run-time bounds would keep it in memory for the whole loop), then the epilogue.
  HWY_ALIGN float t[OCB][kVectors * HWY_MAX_BYTES / sizeof(float)];
#pragma GCC unroll 8
  for (int o = 0; o < OCB; ++o) {
#pragma GCC unroll 3
    for (int v = 0; v < kVectors; ++v) hn::Store(acc[o][v], d, t[o] + N * v);
  }
  for (int o = 0; o < OCB; ++o) {
    const VF b = hn::Set(d, bias != nullptr ? bias[oc0 + o] : 0.0f);
    float* dst = out_row + (oc0 + o) * plane;
    for (int v = 0; v < kVectors; ++v) {
      const int64_t col = ow0 + N * v;
      if (col >= OW) break;
      VF y = hn::Load(d, t[o] + N * v);
      if (bias != nullptr) y = hn::Add(y, b);
      y = ApplyPostOp(d, post, y);
      if (col + N <= OW) {
        hn::StoreU(y, d, dst + col);
      } else {
        StoreTail(d, y, dst + col, static_cast<size_t>(OW - col));
      }
    }
  }
}

/// Output rows [r0, r1) of the flattened (image, output row) range.
void DirectRows(const ConvGeometry& g, const float* x, const float* w, const float* bias, float* out, int64_t r0,
                int64_t r1, const PostOp& post) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t C = g.in_channels, KH = g.kernel[0], s = g.stride[1];
  const int64_t OH = g.out_size[0], OW = g.out_size[1], plane = OH * OW, in_plane = g.in_size[0] * g.in_size[1];
  // Zero floats after each phase row: a tile's loads (kVectors N floats from column ow0 < OW, plus
  // kw / s <= 3) stay inside.
  const int64_t slack = kVectors * N + 8;
  thread_local RowCache cache;
  cache.Lw = (g.in_size[1] + 2 * g.padding[1] + s - 1) / s + slack;
  cache.slot_floats = s * cache.Lw;
  cache.buf.resize(static_cast<size_t>(C * KH * cache.slot_floats));
  cache.slot_row.assign(static_cast<size_t>(C * KH), INT64_MIN);
  std::vector<const float*> rows(static_cast<size_t>(C * KH));
  int64_t koff[8];  // kW <= 7 (direct_conv_applies)
  for (int64_t kw = 0; kw < g.kernel[1]; ++kw) koff[kw] = (kw % s) * cache.Lw + kw / s;
  int64_t image = -1;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / OH, oh = r % OH;
    if (n != image) {  // another image: nothing cached applies
      image = n;
      std::fill(cache.slot_row.begin(), cache.slot_row.end(), INT64_MIN);
    }
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t kh = 0; kh < KH; ++kh) {
        const int64_t ih = oh * g.stride[0] - g.padding[0] + kh;
        const int64_t slot = c * KH + ((ih % KH) + KH) % KH;
        float* dst = cache.buf.data() + slot * cache.slot_floats;
        if (cache.slot_row[static_cast<size_t>(slot)] != ih) {
          BuildRow(g, x + (n * C + c) * in_plane, ih, cache.Lw, dst);
          cache.slot_row[static_cast<size_t>(slot)] = ih;
        }
        rows[static_cast<size_t>(c * KH + kh)] = dst;
      }
    }
    float* out_row = out + n * g.out_channels * plane + oh * OW;
    for (int64_t ow0 = 0; ow0 < OW; ow0 += kVectors * N) {
      int64_t oc = 0;
      for (; oc + kOcBlock <= g.out_channels; oc += kOcBlock) {
        Tile<kOcBlock>(g, rows.data(), koff, w, bias, oc, ow0, out_row, plane, post);
      }
      for (; oc + 4 <= g.out_channels && kOcBlock > 4; oc += 4) {
        Tile<4>(g, rows.data(), koff, w, bias, oc, ow0, out_row, plane, post);
      }
      for (; oc < g.out_channels; ++oc) Tile<1>(g, rows.data(), koff, w, bias, oc, ow0, out_row, plane, post);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln::cpu {
HWY_EXPORT(DirectRows);

bool direct_conv_applies(const ConvGeometry& g) {
  return g.spatial_dims == 2 && !g.transposed && g.groups == 1 && g.in_channels >= 1 &&
         g.in_channels <= 4 && g.kernel[0] >= 1 && g.kernel[0] <= 7 && g.kernel[1] >= 1 && g.kernel[1] <= 7 &&
         g.kernel[0] * g.kernel[1] > 1 && g.in_channels * g.kernel[0] * g.kernel[1] <= 64 && g.stride[0] == g.stride[1] && (g.stride[0] == 1 || g.stride[0] == 2) &&
         g.dilation[0] == 1 && g.dilation[1] == 1 && g.padding[1] <= 64 && g.out_size[1] >= 8 && g.batch > 0 &&
         g.out_channels > 0;
}

void conv_direct(const ConvGeometry& g, const float* x, const float* w, const float* bias, float* out,
                 ThreadPool* pool, const PostOp& post) {
  const int64_t rows = g.batch * g.out_size[0];
  const double work = static_cast<double>(rows) * static_cast<double>(g.out_size[1] * g.out_channels) *
                      static_cast<double>(g.in_channels * g.kernel[0] * g.kernel[1]);
  if (pool == nullptr || pool->num_threads() <= 1 || work < 5e5 || rows < 2) {
    KILN_CPU_DISPATCH(DirectRows)(g, x, w, bias, out, 0, rows, post);
    return;
  }
  // Contiguous runs of output rows (each part builds each of its input rows once), a whole
  // number per thread, claimed dynamically.
  const int64_t threads = pool->num_threads();
  int64_t parts = std::min<int64_t>(rows, 4 * threads);
  if (parts > threads) parts = parts / threads * threads;  // fewer rows than threads: one part each
  const int64_t per = (rows + parts - 1) / parts;
  parallel_tasks(pool, parts, [&](int64_t t) {
    KILN_CPU_DISPATCH(DirectRows)(g, x, w, bias, out, std::min(rows, t * per), std::min(rows, (t + 1) * per), post);
  });
}

}  // namespace kiln::cpu
#endif  // HWY_ONCE

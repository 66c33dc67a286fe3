// See conv_direct.h.
#include "kernels/cpu/conv_direct.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/vec_math.h"

namespace kiln::cpu {

#if KILN_CPU_AVX2_KERNELS
namespace {

constexpr int kOcBlock = 4;   ///< output channels per register tile
constexpr int kVectors = 3;   ///< 8-column vectors per register tile (24 output columns)
constexpr int64_t kSlack = 32;  ///< zero floats after each phase row: tile loads past OW stay inside

/// Input rows of one image and channel, padded and split by stride phase, built on demand: a
/// ring of kH slots keyed by input row (consecutive output rows share kH - stride of them).
struct RowCache {
  int64_t Lw = 0;                 ///< floats per phase row (ceil(Wp / s) + kSlack)
  int64_t slot_floats = 0;        ///< s * Lw: one input row, all its phases
  std::vector<float> buf;         ///< C_in * kH slots
  std::vector<int64_t> slot_row;  ///< input row each slot holds (INT64_MIN: none)
};

/// Writes input row `ih` of channel plane `xc` (IH x IW), zero-padded by PW on the left, into
/// phase rows dst[p * Lw + t] = padded[t * s + p]; rows outside [0, IH) are all zeros.
KILN_AVX2 void build_row(const ConvGeometry& g, const float* xc, int64_t ih, int64_t Lw, float* dst) {
  const int64_t s = g.stride[1], IW = g.in_size[1], PW = g.padding[1];
  std::fill(dst, dst + s * Lw, 0.0f);
  if (ih < 0 || ih >= g.in_size[0]) return;
  const float* src = xc + ih * IW;
  if (s == 1) {
    std::memcpy(dst + PW, src, sizeof(float) * static_cast<size_t>(IW));
    return;
  }
  // s == 2: padded column j = PW + iw goes to phase j % 2 at j / 2.
  split_even_odd(src, IW, dst + (PW % 2) * Lw + PW / 2, dst + ((PW + 1) % 2) * Lw + (PW + 1) / 2);
}

/// acc[o][v] for output channels oc0 .. oc0 + OCB - 1 and columns ow0 + 8 v .. + 7 of one output
/// row, from the phase rows rows[c * kH + kh] (tap kw at offset koff[kw] = (kw % s) * Lw + kw / s,
/// computed once per call rather than divided out per tap); then bias, activation, store of
/// columns < OW.
template <int OCB>
KILN_AVX2 void tile(const ConvGeometry& g, const float* const* rows, const int64_t* koff, const float* w,
                    const float* bias, int64_t oc0, int64_t ow0, float* out_row, int64_t plane, const PostOp& post) {
  const int64_t C = g.in_channels, KH = g.kernel[0], KW = g.kernel[1], OW = g.out_size[1];
  __m256 acc[OCB][kVectors];  // in registers: every loop over o and v is unrolled
#pragma GCC unroll 4
  for (int o = 0; o < OCB; ++o) {
#pragma GCC unroll 3
    for (int v = 0; v < kVectors; ++v) acc[o][v] = _mm256_setzero_ps();
  }
  const int64_t wstride = C * KH * KW;  // floats between output channels' filters
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t kh = 0; kh < KH; ++kh) {
      const float* r = rows[c * KH + kh];
      const float* wk = w + oc0 * wstride + (c * KH + kh) * KW;
      for (int64_t kw = 0; kw < KW; ++kw) {
        const float* src = r + koff[kw] + ow0;
        __m256 in[kVectors];
#pragma GCC unroll 3
        for (int v = 0; v < kVectors; ++v) in[v] = _mm256_loadu_ps(src + 8 * v);
#pragma GCC unroll 4
        for (int o = 0; o < OCB; ++o) {
          const __m256 wv = _mm256_broadcast_ss(wk + o * wstride + kw);
#pragma GCC unroll 3
          for (int v = 0; v < kVectors; ++v) acc[o][v] = _mm256_fmadd_ps(wv, in[v], acc[o][v]);
        }
      }
    }
  }
  // Spill the tile once (constant indices keep acc in registers above), then the epilogue.
  alignas(32) float t[OCB][kVectors * 8];
#pragma GCC unroll 4
  for (int o = 0; o < OCB; ++o) {
#pragma GCC unroll 3
    for (int v = 0; v < kVectors; ++v) _mm256_store_ps(t[o] + 8 * v, acc[o][v]);
  }
  for (int o = 0; o < OCB; ++o) {
    const __m256 b = _mm256_set1_ps(bias != nullptr ? bias[oc0 + o] : 0.0f);
    float* dst = out_row + (oc0 + o) * plane;
    for (int v = 0; v < kVectors; ++v) {
      const int64_t col = ow0 + 8 * v;
      if (col >= OW) break;
      __m256 y = _mm256_load_ps(t[o] + 8 * v);
      if (bias != nullptr) y = _mm256_add_ps(y, b);
      y = apply8(post, y);
      if (col + 8 <= OW) {
        _mm256_storeu_ps(dst + col, y);
      } else {
        store_tail(dst + col, OW - col, y);
      }
    }
  }
}

/// Output rows [r0, r1) of the flattened (image, output row) range.
KILN_AVX2 void run_rows(const ConvGeometry& g, const float* x, const float* w, const float* bias, float* out,
                        int64_t r0, int64_t r1, const PostOp& post) {
  const int64_t C = g.in_channels, KH = g.kernel[0], s = g.stride[1];
  const int64_t OH = g.out_size[0], OW = g.out_size[1], plane = OH * OW, in_plane = g.in_size[0] * g.in_size[1];
  thread_local RowCache cache;
  cache.Lw = (g.in_size[1] + 2 * g.padding[1] + s - 1) / s + kSlack;
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
          build_row(g, x + (n * C + c) * in_plane, ih, cache.Lw, dst);
          cache.slot_row[static_cast<size_t>(slot)] = ih;
        }
        rows[static_cast<size_t>(c * KH + kh)] = dst;
      }
    }
    float* out_row = out + n * g.out_channels * plane + oh * OW;
    for (int64_t ow0 = 0; ow0 < OW; ow0 += 8 * kVectors) {
      int64_t oc = 0;
      for (; oc + kOcBlock <= g.out_channels; oc += kOcBlock) {
        tile<kOcBlock>(g, rows.data(), koff, w, bias, oc, ow0, out_row, plane, post);
      }
      for (; oc < g.out_channels; ++oc) tile<1>(g, rows.data(), koff, w, bias, oc, ow0, out_row, plane, post);
    }
  }
}

}  // namespace

bool direct_conv_applies(const ConvGeometry& g) {
  return cpu_has_avx2_fma() && g.spatial_dims == 2 && !g.transposed && g.groups == 1 && g.in_channels >= 1 &&
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
    run_rows(g, x, w, bias, out, 0, rows, post);
    return;
  }
  // Contiguous runs of output rows (each part builds each of its input rows once), a whole
  // number per thread, claimed dynamically.
  const int64_t threads = pool->num_threads();
  int64_t parts = std::min<int64_t>(rows, 4 * threads);
  if (parts > threads) parts = parts / threads * threads;  // fewer rows than threads: one part each
  const int64_t per = (rows + parts - 1) / parts;
  parallel_tasks(pool, parts, [&](int64_t t) {
    run_rows(g, x, w, bias, out, std::min(rows, t * per), std::min(rows, (t + 1) * per), post);
  });
}

#else  // no AVX2 kernels on this target

bool direct_conv_applies(const ConvGeometry&) { return false; }
void conv_direct(const ConvGeometry&, const float*, const float*, const float*, float*, ThreadPool*, const PostOp&) {}

#endif

}  // namespace kiln::cpu

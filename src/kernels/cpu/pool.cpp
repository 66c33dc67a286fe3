// Optimized pooling: global average pooling (aten.adaptive_avg_pool2d to 1x1, the squeeze-excite
// and classifier-head pooling of MobileNetV3 / ResNet) and aten.max_pool2d (any kernel, stride,
// padding, dilation, ceil_mode). fp32, AVX2/FMA; other shapes stay portable.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ir/ops/pool.h"

#include "kernels/cpu/vec_math.h"
#include "kernels/kernel.h"

namespace kiln {
namespace {

#if defined(__x86_64__)
/// Sum of n floats with four 8-lane accumulators (the portable kernel adds left to right; the
/// results agree to float rounding, ~1e-7 relative for these sizes).
__attribute__((target("avx2,fma"))) float sum_avx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) total += p[i];
  return total;
}

/// aten.adaptive_avg_pool2d with output 1x1: out[p] = mean of plane p (H*W floats), over every
/// leading dim; planes split across the pool when there are enough of them.
Error global_avg_pool(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const int64_t r = x.dim();
  const int64_t hw = x.sizes[r - 2] * x.sizes[r - 1];
  const int64_t planes = out.numel();
  const float* px = x.data_as<float>();
  float* po = out.data_as<float>();
  const float inv = 1.0f / static_cast<float>(hw);
  cpu::parallel_range(a.pool, planes, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(hw, 1)),
                      [&](int64_t b, int64_t e) {
                        for (int64_t p = b; p < e; ++p) po[p] = sum_avx2(px + p * hw, hw) * inv;
                      });
  return {};
}

bool global_avg_pool_accepts(const KernelSignature& s) {
  if (!cpu::cpu_has_avx2_fma() || s.inputs.empty() || s.inputs[0] == nullptr || s.outputs.size() != 1) return false;
  const TensorType& x = *s.inputs[0];
  const TensorType& o = *s.outputs[0];
  const int64_t r = x.dim();
  return x.dtype == DType::Float32 && o.dtype == DType::Float32 && r >= 2 && o.dim() == r && o.sizes[r - 2] == 1 &&
         o.sizes[r - 1] == 1 && x.sizes[r - 2] * x.sizes[r - 1] > 0;
}

/// max(a, b) that is NaN when either is NaN, lane by lane (ATen's max pooling lets a NaN win).
__attribute__((target("avx2,fma"))) inline __m256 nan_max8(__m256 a, __m256 b) {
  const __m256 nan = _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
  return _mm256_blendv_ps(_mm256_max_ps(a, b), _mm256_add_ps(a, b), nan);
}

inline float nan_max(float a, float b) { return std::isnan(a) || std::isnan(b) ? a + b : (b > a ? b : a); }

/// row[i] = max over r < nr of rows[r][i] (NaN-propagating, in row order), i < n; nr >= 1.
__attribute__((target("avx2,fma"))) void vertical_max(const float* const* rows, int64_t nr, int64_t n, float* row) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(rows[0] + i);
    for (int64_t r = 1; r < nr; ++r) v = nan_max8(v, _mm256_loadu_ps(rows[r] + i));
    _mm256_storeu_ps(row + i, v);
  }
  for (; i < n; ++i) {
    float v = rows[0][i];
    for (int64_t r = 1; r < nr; ++r) v = nan_max(v, rows[r][i]);
    row[i] = v;
  }
}

/// Horizontal pass of the 3-wide, stride-2 window (resnet's 3x3 / 2 max pooling): orow[ow] =
/// max(rowp[2 ow], rowp[2 ow + 1], rowp[2 ow + 2]) for ow < n, where rowp is the row with its left
/// padding in front and -inf after it (readable up to 2 n + 18). 8 outputs per step: the even and
/// odd columns of two 8-float loads (shuffles within 128-bit halves, one cross-half permute at the end).
__attribute__((target("avx2,fma"))) void hmax3_s2(const float* rowp, float* orow, int64_t n) {
  int64_t ow = 0;
  for (; ow + 8 <= n; ow += 8) {
    const float* s = rowp + 2 * ow;
    const __m256 a = _mm256_loadu_ps(s), b = _mm256_loadu_ps(s + 8);
    const __m256 c = _mm256_loadu_ps(s + 2), d = _mm256_loadu_ps(s + 10);
    // lanes (per half) hold columns 2t, 2t + 1, 2t + 2 of the same outputs t (order 0 1 4 5 2 3 6 7)
    __m256 m = nan_max8(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD));
    m = nan_max8(m, _mm256_shuffle_ps(c, d, 0x88));
    _mm256_storeu_ps(orow + ow, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(m), 0xD8)));
  }
  for (; ow < n; ++ow) orow[ow] = nan_max(nan_max(rowp[2 * ow], rowp[2 * ow + 1]), rowp[2 * ow + 2]);
}

/// aten.max_pool2d, values only, as the portable kernel (src/kernels/portable/pool.cpp, ATen's
/// MaxPoolKernel.cpp): out[p, oh, ow] = max over the window's positions inside the input, NaN if
/// any of them is NaN, -inf for a window with none. The max is separable (and NaN-propagating max
/// is associative), so each output row first takes the max over the window's rows for every input
/// column (8 columns per AVX2 step, all of the window's rows in one pass), into a row buffer with
/// pad_w columns of -inf in front and -inf after the row (a window's positions outside the input
/// then count as -inf, which changes no max), then the max over the window's columns of that row
/// (3 wide with stride 2: hmax3_s2). Planes are split across the pool. Results equal the portable
/// kernel's up to the sign of a zero that ties with another zero.
Error max_pool2d(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto geo = pool2d_geometry(x.type(), a.attrs, true);
  if (!geo.ok()) return Error(geo.error().code(), "aten.max_pool2d: " + geo.error().message());
  const Pool2dGeometry g = geo.value();
  const float* px = x.data_as<float>();
  float* po = out.data_as<float>();
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t work = g.in_h * g.in_w * g.kernel_h + g.out_h * g.out_w * g.kernel_w;  // per plane
  const bool k3s2 = g.kernel_w == 3 && g.stride_w == 2 && g.dilation_w == 1;
  // row buffer: pad_w, the row, then -inf up to every window's last column (+ 16 for hmax3_s2's reads)
  const int64_t last = (g.out_w - 1) * g.stride_w + (g.kernel_w - 1) * g.dilation_w;  // padded column
  const int64_t row_len = std::max(g.pad_w + g.in_w, last + 1) + 24;
  cpu::parallel_range(a.pool, g.planes, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(work, 1)),
                      [&](int64_t b, int64_t e) {
    std::vector<float> buf(static_cast<size_t>(row_len), ninf);
    float* row = buf.data() + g.pad_w;  // row[iw], iw in [-pad_w, row_len - pad_w)
    std::vector<const float*> rows(static_cast<size_t>(g.kernel_h));
    for (int64_t p = b; p < e; ++p) {
      const float* plane = px + p * g.in_h * g.in_w;
      float* oplane = po + p * g.out_h * g.out_w;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        // row[iw] = max over the window's rows inside the input
        int64_t nr = 0;
        for (int64_t kh = 0; kh < g.kernel_h; ++kh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
          if (ih >= 0 && ih < g.in_h) rows[static_cast<size_t>(nr++)] = plane + ih * g.in_w;
        }
        float* orow = oplane + oh * g.out_w;
        if (nr == 0) {
          std::fill(orow, orow + g.out_w, ninf);
          continue;
        }
        vertical_max(rows.data(), nr, g.in_w, row);
        if (k3s2) {
          hmax3_s2(buf.data(), orow, g.out_w);
          continue;
        }
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const float* w0 = buf.data() + ow * g.stride_w;  // padded column of the window's first position
          float best = ninf;
          for (int64_t kw = 0; kw < g.kernel_w; ++kw) best = nan_max(best, w0[kw * g.dilation_w]);
          orow[ow] = best;
        }
      }
    }
  });
  return {};
}

bool max_pool2d_accepts(const KernelSignature& s) {
  if (!cpu::cpu_has_avx2_fma() || s.inputs.empty() || s.inputs[0] == nullptr || s.outputs.size() != 1) return false;
  return s.inputs[0]->dtype == DType::Float32 && s.outputs[0]->dtype == DType::Float32 &&
         pool2d_geometry(*s.inputs[0], s.attrs, true).ok();
}
#endif

}  // namespace

void register_cpu_pool(KernelRegistry& r) {
#if defined(__x86_64__)
  // Their accepts() decide on the input's spatial sizes (a global pool, the window layout).
  r.add_optimized("aten.adaptive_avg_pool2d", global_avg_pool, global_avg_pool_accepts, nullptr, /*sizes_at_call=*/false);
  r.add_optimized("aten.max_pool2d", max_pool2d, max_pool2d_accepts, nullptr, /*sizes_at_call=*/false);
#else
  (void)r;
#endif
}

}  // namespace kiln

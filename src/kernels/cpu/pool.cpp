// Optimized pooling: global average pooling (aten.adaptive_avg_pool2d to 1x1, the squeeze-excite
// and classifier-head pooling of MobileNetV3 / ResNet) and aten.max_pool2d (any kernel, stride,
// padding, dilation, ceil_mode). fp32, written once over Highway for every SIMD target; other
// shapes stay portable.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ir/ops/pool.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/kernel.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/pool.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace pool_detail {

/// Sum of n floats with four vector accumulators (the portable kernel adds left to right; the
/// results agree to float rounding, ~1e-7 relative for these sizes).
HWY_INLINE float Sum(const float* HWY_RESTRICT p, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a0 = hn::Add(a0, hn::LoadU(d, p + i));
    a1 = hn::Add(a1, hn::LoadU(d, p + i + N));
    a2 = hn::Add(a2, hn::LoadU(d, p + i + 2 * N));
    a3 = hn::Add(a3, hn::LoadU(d, p + i + 3 * N));
  }
  for (; i + N <= n; i += N) a0 = hn::Add(a0, hn::LoadU(d, p + i));
  if (i < n) a1 = hn::Add(a1, LoadTail(d, p + i, static_cast<size_t>(n - i)));  // zero lanes past n
  return ReduceSum(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)));
}

/// max(a, b) that is NaN when either is NaN, lane by lane (ATen's max pooling lets a NaN win);
/// b > a ? b : a otherwise, as the portable kernel's nan_max.
template <class V>
HWY_INLINE V NanMax(V a, V b) {
  return hn::IfThenElse(hn::IsNaN(b), b, hn::IfThenElse(hn::Lt(a, b), b, a));
}

inline float nan_max(float a, float b) { return std::isnan(a) || std::isnan(b) ? a + b : (b > a ? b : a); }

/// row[i] = max over r < nr of rows[r][i] (NaN-propagating, in row order), i < n; nr >= 1.
HWY_INLINE void VerticalMax(const float* const* rows, int64_t nr, int64_t n, float* row) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    VF v = hn::LoadU(d, rows[0] + i);
    for (int64_t r = 1; r < nr; ++r) v = NanMax(v, hn::LoadU(d, rows[r] + i));
    hn::StoreU(v, d, row + i);
  }
  for (; i < n; ++i) {
    float v = rows[0][i];
    for (int64_t r = 1; r < nr; ++r) v = nan_max(v, rows[r][i]);
    row[i] = v;
  }
}

/// Horizontal pass of the 3-wide, stride-2 window (resnet's 3x3 / 2 max pooling): orow[ow] =
/// max(rowp[2 ow], rowp[2 ow + 1], rowp[2 ow + 2]) for ow < n, where rowp is the row with its left
/// padding in front and -inf after it (readable up to 2 n + 1). One vector of outputs per step:
/// the even and odd columns of the window starts (LoadInterleaved2), and the even columns one
/// pair later.
HWY_INLINE void HMax3S2(const float* rowp, float* orow, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t ow = 0;
  for (; ow + N <= n; ow += N) {
    const float* s = rowp + 2 * ow;
    VF even, odd, even2, odd2;
    hn::LoadInterleaved2(d, s, even, odd);
    hn::LoadInterleaved2(d, s + 2, even2, odd2);
    hn::StoreU(NanMax(NanMax(even, odd), even2), d, orow + ow);
  }
  for (; ow < n; ++ow) orow[ow] = nan_max(nan_max(rowp[2 * ow], rowp[2 * ow + 1]), rowp[2 * ow + 2]);
}

}  // namespace pool_detail

/// Global average pooling of planes [b, e) of hw floats: out[p] = sum(plane p) * inv.
void GlobalAvgPlanes(const float* x, float* out, int64_t hw, float inv, int64_t b, int64_t e) {
  for (int64_t p = b; p < e; ++p) out[p] = pool_detail::Sum(x + p * hw, hw) * inv;
}

/// aten.max_pool2d, values only, as the portable kernel (src/kernels/portable/pool.cpp, ATen's
/// MaxPoolKernel.cpp): out[p, oh, ow] = max over the window's positions inside the input, NaN if
/// any of them is NaN, -inf for a window with none. The max is separable (and NaN-propagating max
/// is associative), so each output row first takes the max over the window's rows for every input
/// column (a vector of columns per step, all of the window's rows in one pass), into a row buffer
/// with pad_w columns of -inf in front and -inf after the row (a window's positions outside the
/// input then count as -inf, which changes no max), then the max over the window's columns of
/// that row (3 wide with stride 2: HMax3S2). Planes [b, e) of the geometry g. Results equal the
/// portable kernel's.
void MaxPoolPlanes(const Pool2dGeometry& g, const float* px, float* po, int64_t b, int64_t e) {
  using pool_detail::nan_max;
  const float ninf = -std::numeric_limits<float>::infinity();
  const bool k3s2 = g.kernel_w == 3 && g.stride_w == 2 && g.dilation_w == 1;
  // row buffer: pad_w, the row, then -inf up to every window's last column (+ slack)
  const int64_t last = (g.out_w - 1) * g.stride_w + (g.kernel_w - 1) * g.dilation_w;  // padded column
  const int64_t row_len = std::max(g.pad_w + g.in_w, last + 1) + 24;
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
      pool_detail::VerticalMax(rows.data(), nr, g.in_w, row);
      if (k3s2) {
        pool_detail::HMax3S2(buf.data(), orow, g.out_w);
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
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
namespace cpu {
HWY_EXPORT(GlobalAvgPlanes);
HWY_EXPORT(MaxPoolPlanes);
}  // namespace cpu

namespace {

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
                      [&](int64_t b, int64_t e) { KILN_CPU_DISPATCH(GlobalAvgPlanes)(px, po, hw, inv, b, e); });
  return {};
}

bool global_avg_pool_accepts(const KernelSignature& s) {
  if (s.inputs.empty() || s.inputs[0] == nullptr || s.outputs.size() != 1) return false;
  const TensorType& x = *s.inputs[0];
  const TensorType& o = *s.outputs[0];
  const int64_t r = x.dim();
  return x.dtype == DType::Float32 && o.dtype == DType::Float32 && r >= 2 && o.dim() == r && o.sizes[r - 2] == 1 &&
         o.sizes[r - 1] == 1 && x.sizes[r - 2] * x.sizes[r - 1] > 0;
}

/// aten.max_pool2d (see MaxPoolPlanes): planes split across the pool.
Error max_pool2d(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto geo = pool2d_geometry(x.type(), a.attrs, true);
  if (!geo.ok()) return Error(geo.error().code(), "aten.max_pool2d: " + geo.error().message());
  const Pool2dGeometry g = geo.value();
  const float* px = x.data_as<float>();
  float* po = out.data_as<float>();
  const int64_t work = g.in_h * g.in_w * g.kernel_h + g.out_h * g.out_w * g.kernel_w;  // per plane
  cpu::parallel_range(a.pool, g.planes, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(work, 1)),
                      [&](int64_t b, int64_t e) { KILN_CPU_DISPATCH(MaxPoolPlanes)(g, px, po, b, e); });
  return {};
}

bool max_pool2d_accepts(const KernelSignature& s) {
  if (s.inputs.empty() || s.inputs[0] == nullptr || s.outputs.size() != 1) return false;
  return s.inputs[0]->dtype == DType::Float32 && s.outputs[0]->dtype == DType::Float32 &&
         pool2d_geometry(*s.inputs[0], s.attrs, true).ok();
}

}  // namespace

void register_cpu_pool(KernelRegistry& r) {
  // Their accepts() decide on the input's spatial sizes (a global pool, the window layout).
  r.add_optimized("aten.adaptive_avg_pool2d", global_avg_pool, global_avg_pool_accepts, nullptr, /*sizes_at_call=*/false);
  r.add_optimized("aten.max_pool2d", max_pool2d, max_pool2d_accepts, nullptr, /*sizes_at_call=*/false);
}

}  // namespace kiln
#endif  // HWY_ONCE

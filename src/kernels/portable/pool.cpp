// Portable pool kernels: max / average / adaptive average 2-D pooling over contiguous
// (C, H, W) or (N, C, H, W) float32 planes. Sums accumulate in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/ops/pool.h"
#include "kernels/kernel.h"

namespace kiln {
namespace {

/// aten.max_pool2d / aten.max_pool2d_with_indices: out[p, oh, ow] = max over kh < KH, kw < KW of
/// x[p, oh*SH - PH + kh*DH, ow*SW - PW + kw*DW], taken over the positions inside the input;
/// NaN if any of them is NaN. `indices` (may be null) receives ih * W + iw of the chosen element
/// within its plane. Both follow ATen's CPU kernel (aten/src/ATen/native/cpu/MaxPoolKernel.cpp
/// cpu_max_pool): the first maximum wins (strict >), a NaN always replaces the current best (so
/// the last NaN's index), and a window of -inf keeps the first valid position's index.
Error max_pool2d_impl(const KernelArgs& a, const char* op, int64_t* indices) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto geo = pool2d_geometry(x.type(), a.attrs, true);
  if (!geo.ok()) return Error(geo.error().code(), std::string(op) + ": " + geo.error().message());
  const Pool2dGeometry& g = geo.value();
  const float* px = x.data_as<float>();
  float* po = out.data_as<float>();
  for (int64_t p = 0; p < g.planes; ++p) {
    const float* plane = px + p * g.in_h * g.in_w;
    float* oplane = po + p * g.out_h * g.out_w;
    int64_t* iplane = indices != nullptr ? indices + p * g.out_h * g.out_w : nullptr;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      int64_t ih0 = oh * g.stride_h - g.pad_h;
      while (ih0 < 0) ih0 += g.dilation_h;
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        int64_t iw0 = ow * g.stride_w - g.pad_w;
        while (iw0 < 0) iw0 += g.dilation_w;
        float best = -std::numeric_limits<float>::infinity();
        int64_t best_i = ih0 * g.in_w + iw0;
        for (int64_t kh = 0; kh < g.kernel_h; ++kh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
          if (ih < 0 || ih >= g.in_h) continue;
          for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
            const int64_t iw = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
            if (iw < 0 || iw >= g.in_w) continue;
            const float v = plane[ih * g.in_w + iw];
            if (v > best || std::isnan(v)) {
              best = v;
              best_i = ih * g.in_w + iw;
            }
          }
        }
        oplane[oh * g.out_w + ow] = best;
        if (iplane != nullptr) iplane[oh * g.out_w + ow] = best_i;
      }
    }
  }
  return {};
}

Error max_pool2d(const KernelArgs& a) { return max_pool2d_impl(a, "aten.max_pool2d", nullptr); }

Error max_pool2d_with_indices(const KernelArgs& a) {
  Tensor& idx = *a.outputs[1];
  if (idx.dtype != DType::Int64 || idx.sizes != a.outputs[0]->sizes) {
    return Error(ErrorCode::Internal, "aten.max_pool2d_with_indices: indices output must be int64 of the output's sizes");
  }
  return max_pool2d_impl(a, "aten.max_pool2d_with_indices", idx.data_as<int64_t>());
}

/// aten.avg_pool2d (ATen AvgPoolKernel.cpp): the window [ih0, ih0 + KH) x [iw0, iw0 + KW),
/// ih0 = oh*SH - PH, is first clipped to the padded input [-PH, H + PH) x [-PW, W + PW); its
/// area is the divisor when count_include_pad. It is then clipped to the input; the sum of those
/// elements is divided by divisor_override if given, else by that area (count_include_pad) or by
/// the number of input elements summed. A window with no input element gives 0.
Error avg_pool2d(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto geo = pool2d_geometry(x.type(), a.attrs, false);
  if (!geo.ok()) return Error(geo.error().code(), "aten.avg_pool2d: " + geo.error().message());
  const Pool2dGeometry& g = geo.value();
  const bool count_include_pad = a.attrs.get_bool("count_include_pad", true);
  const bool has_override = !a.attrs.is_none("divisor_override");
  const int64_t divisor_override = has_override ? a.attrs.get_int("divisor_override") : 0;
  if (has_override && divisor_override == 0) {
    return Error(ErrorCode::InvalidArgument, "aten.avg_pool2d: divisor_override must be non-zero");
  }
  const float* px = x.data_as<float>();
  float* po = out.data_as<float>();
  for (int64_t p = 0; p < g.planes; ++p) {
    const float* plane = px + p * g.in_h * g.in_w;
    float* oplane = po + p * g.out_h * g.out_w;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      int64_t h0 = oh * g.stride_h - g.pad_h;
      int64_t h1 = std::min(h0 + g.kernel_h, g.in_h + g.pad_h);
      const int64_t pool_h = h1 - h0;
      h0 = std::max<int64_t>(h0, 0);
      h1 = std::min(h1, g.in_h);
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        int64_t w0 = ow * g.stride_w - g.pad_w;
        int64_t w1 = std::min(w0 + g.kernel_w, g.in_w + g.pad_w);
        const int64_t pool_w = w1 - w0;
        w0 = std::max<int64_t>(w0, 0);
        w1 = std::min(w1, g.in_w);
        if (h0 >= h1 || w0 >= w1) {
          oplane[oh * g.out_w + ow] = 0.0f;
          continue;
        }
        double sum = 0.0;
        for (int64_t ih = h0; ih < h1; ++ih) {
          for (int64_t iw = w0; iw < w1; ++iw) sum += plane[ih * g.in_w + iw];
        }
        int64_t divisor;
        if (has_override) {
          divisor = divisor_override;
        } else if (count_include_pad) {
          divisor = pool_h * pool_w;
        } else {
          divisor = (h1 - h0) * (w1 - w0);
        }
        oplane[oh * g.out_w + ow] = static_cast<float>(sum / static_cast<double>(divisor));
      }
    }
  }
  return {};
}

/// aten.adaptive_avg_pool2d (ATen AdaptiveAveragePooling.cpp): output (oh, ow) averages the
/// input rows [floor(oh*H/OH), ceil((oh+1)*H/OH)) and columns [floor(ow*W/OW), ceil((ow+1)*W/OW)).
Error adaptive_avg_pool2d(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const int64_t r = x.dim();
  const int64_t H = x.sizes[r - 2], W = x.sizes[r - 1];
  const int64_t OH = out.sizes[r - 2], OW = out.sizes[r - 1];
  int64_t planes = 1;
  for (int64_t i = 0; i < r - 2; ++i) planes *= x.sizes[i];
  // Window bounds in 128-bit: o * in may exceed int64 for hostile sizes.
  auto start = [](int64_t o, int64_t in, int64_t n) {
    return static_cast<int64_t>(static_cast<__int128>(o) * in / n);
  };
  auto end = [](int64_t o, int64_t in, int64_t n) {
    return static_cast<int64_t>(((static_cast<__int128>(o) + 1) * in + n - 1) / n);
  };
  const float* px = x.data_as<float>();
  float* po = out.data_as<float>();
  for (int64_t p = 0; p < planes; ++p) {
    const float* plane = px + p * H * W;
    float* oplane = po + p * OH * OW;
    for (int64_t oh = 0; oh < OH; ++oh) {
      const int64_t h0 = start(oh, H, OH), h1 = end(oh, H, OH);
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t w0 = start(ow, W, OW), w1 = end(ow, W, OW);
        double sum = 0.0;
        for (int64_t ih = h0; ih < h1; ++ih) {
          for (int64_t iw = w0; iw < w1; ++iw) sum += plane[ih * W + iw];
        }
        oplane[oh * OW + ow] = static_cast<float>(sum / static_cast<double>((h1 - h0) * (w1 - w0)));
      }
    }
  }
  return {};
}

}  // namespace

void register_portable_pool(KernelRegistry& r) {
  r.add("aten.max_pool2d", max_pool2d);
  r.add("aten.max_pool2d_with_indices", max_pool2d_with_indices);
  r.add("aten.avg_pool2d", avg_pool2d);
  r.add("aten.adaptive_avg_pool2d", adaptive_avg_pool2d);
}

}  // namespace kiln

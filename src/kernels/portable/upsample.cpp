// Portable upsampling kernels for (N, C, H, W) tensors. Source indices and weights follow
// PyTorch's CPU kernels exactly, in float arithmetic as PyTorch does (aten/src/ATen/native/
// UpSample.h: compute_scales_value, area_pixel_compute_scale, area_pixel_compute_source_index,
// nearest_idx; aten/src/ATen/native/cpu/UpSampleKernel.cpp: guard_index_and_lambda), so that
// fractional scale factors (e.g. 1.6) pick the same source pixels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <optional>
#include <vector>

#include "kernels/kernel.h"

namespace kiln {
namespace {

std::optional<double> scale_attr(const Attributes& attrs, const char* name) {
  if (attrs.is_none(name)) return std::nullopt;
  return attrs.get_float(name);
}

/// compute_scales_value<float>: 1/scale when a positive scale is given, else in/out.
float compute_scales_value(std::optional<double> scale, int64_t in, int64_t out) {
  if (scale.has_value() && *scale > 0.0) return static_cast<float>(1.0 / *scale);
  return static_cast<float>(in) / static_cast<float>(out);
}

/// floor(v) as an index in [0, in - 1]. PyTorch casts floorf(v) to int64 and takes min with
/// in - 1; v is never negative here, and a non-finite or huge v (from an extreme scale, where
/// PyTorch's cast is undefined) maps to in - 1 instead of an out-of-range index.
int64_t clamp_floor(float v, int64_t in) {
  const float f = std::floor(v);
  if (!(f < static_cast<float>(in - 1))) return in - 1;
  return std::max<int64_t>(0, static_cast<int64_t>(f));
}

/// nearest_idx: source index of output index `dst` along one axis.
int64_t nearest_idx(int64_t dst, int64_t in, int64_t out, std::optional<double> scale) {
  if (out == in) return dst;
  if (out == 2 * in) return dst >> 1;
  const float s = compute_scales_value(scale, in, out);
  return clamp_floor(static_cast<float>(dst) * s, in);
}

template <typename T>
void nearest_planes(const T* src, T* dst, int64_t planes, int64_t ih, int64_t iw, int64_t oh, int64_t ow,
                    const std::vector<int64_t>& hi, const std::vector<int64_t>& wi) {
  for (int64_t p = 0; p < planes; ++p) {
    const T* s = src + p * ih * iw;
    T* d = dst + p * oh * ow;
    for (int64_t y = 0; y < oh; ++y) {
      const T* srow = s + hi[y] * iw;
      T* drow = d + y * ow;
      for (int64_t x = 0; x < ow; ++x) drow[x] = srow[wi[x]];
    }
  }
}

// aten.upsample_nearest2d: out[n, c, y, x] = in[n, c, nearest_idx(y), nearest_idx(x)]; any dtype.
Error upsample_nearest2d(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  if (out.dtype != x.dtype) return Error(ErrorCode::InvalidArgument, "aten.upsample_nearest2d: output dtype differs");
  const int64_t planes = x.sizes[0] * x.sizes[1];
  const int64_t ih = x.sizes[2], iw = x.sizes[3], oh = out.sizes[2], ow = out.sizes[3];
  const auto sh = scale_attr(a.attrs, "scales_h"), sw = scale_attr(a.attrs, "scales_w");
  std::vector<int64_t> hi, wi;
  try {
    hi.resize(static_cast<size_t>(oh));
    wi.resize(static_cast<size_t>(ow));
  } catch (const std::bad_alloc&) {
    return Error(ErrorCode::MemoryAllocationFailed, "aten.upsample_nearest2d: index tables");
  }
  for (int64_t y = 0; y < oh; ++y) hi[y] = nearest_idx(y, ih, oh, sh);
  for (int64_t x0 = 0; x0 < ow; ++x0) wi[x0] = nearest_idx(x0, iw, ow, sw);
  switch (dtype_size(x.dtype)) {
    case 1: nearest_planes(x.data_as<const uint8_t>(), out.data_as<uint8_t>(), planes, ih, iw, oh, ow, hi, wi); break;
    case 2: nearest_planes(x.data_as<const uint16_t>(), out.data_as<uint16_t>(), planes, ih, iw, oh, ow, hi, wi); break;
    case 4: nearest_planes(x.data_as<const uint32_t>(), out.data_as<uint32_t>(), planes, ih, iw, oh, ow, hi, wi); break;
    case 8: nearest_planes(x.data_as<const uint64_t>(), out.data_as<uint64_t>(), planes, ih, iw, oh, ow, hi, wi); break;
    default: return Error(ErrorCode::NotSupported, "aten.upsample_nearest2d: element size");
  }
  return {};
}

/// Two source indices and their weights for one output index of a linear axis.
struct LinearTap {
  int64_t i0, i1;
  float w0, w1;
};

/// Taps of one axis: area_pixel_compute_scale, area_pixel_compute_source_index (negative source
/// clamped to 0 without align_corners), then guard_index_and_lambda; all in float like PyTorch.
/// An axis whose size does not change is copied, whatever the scale (PyTorch's CPU kernel:
/// compute_source_index_and_lambda, "scale_factor = 1, simply copy").
std::vector<LinearTap> linear_taps(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  std::vector<LinearTap> taps(static_cast<size_t>(out));
  if (in == out) {
    for (int64_t dst = 0; dst < out; ++dst) taps[dst] = {dst, dst, 1.0f, 0.0f};
    return taps;
  }
  float step;
  if (align_corners) {
    step = out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.0f;
  } else {
    step = compute_scales_value(scale, in, out);
  }
  for (int64_t dst = 0; dst < out; ++dst) {
    float src;
    if (align_corners) {
      src = step * static_cast<float>(dst);
    } else {
      // PyTorch: scale * (dst_index + 0.5) - 0.5 evaluates in double (the literals), stored as float.
      src = static_cast<float>(static_cast<double>(step) * (static_cast<double>(dst) + 0.5) - 0.5);
      if (src < 0.0f) src = 0.0f;
    }
    const int64_t i0 = clamp_floor(src, in);
    const float lambda = std::min(std::max(src - static_cast<float>(i0), 0.0f), 1.0f);
    taps[dst] = {i0, i0 < in - 1 ? i0 + 1 : i0, 1.0f - lambda, lambda};
  }
  return taps;
}

// aten.upsample_bilinear2d (float32): out = sum over the 2x2 taps of wh * ww * in.
Error upsample_bilinear2d(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  if (x.dtype != DType::Float32 || out.dtype != DType::Float32) {
    return Error(ErrorCode::NotSupported, "aten.upsample_bilinear2d: float32 only");
  }
  const bool align = a.attrs.get_bool("align_corners");
  const int64_t planes = x.sizes[0] * x.sizes[1];
  const int64_t ih = x.sizes[2], iw = x.sizes[3], oh = out.sizes[2], ow = out.sizes[3];
  std::vector<LinearTap> th, tw;
  try {
    th = linear_taps(ih, oh, align, scale_attr(a.attrs, "scales_h"));
    tw = linear_taps(iw, ow, align, scale_attr(a.attrs, "scales_w"));
  } catch (const std::bad_alloc&) {
    return Error(ErrorCode::MemoryAllocationFailed, "aten.upsample_bilinear2d: index tables");
  }
  const float* px = x.data_as<const float>();
  float* po = out.data_as<float>();
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float* s = px + p * ih * iw;
      float* d = po + p * oh * ow;
      for (int64_t y = 0; y < oh; ++y) {
        const LinearTap& h = th[y];
        const float* r0 = s + h.i0 * iw;
        const float* r1 = s + h.i1 * iw;
        for (int64_t x0 = 0; x0 < ow; ++x0) {
          const LinearTap& w = tw[x0];
          d[y * ow + x0] = h.w0 * (w.w0 * r0[w.i0] + w.w1 * r0[w.i1]) + h.w1 * (w.w0 * r1[w.i0] + w.w1 * r1[w.i1]);
        }
      }
    }
  };
  const int64_t per_plane = std::max<int64_t>(1, oh * ow);
  if (a.pool != nullptr && planes > 1) {
    a.pool->parallel_for(planes, std::max<int64_t>(1, 16384 / per_plane), run);
  } else {
    run(0, planes);
  }
  return {};
}

}  // namespace

void register_portable_upsample(KernelRegistry& r) {
  r.add("aten.upsample_nearest2d", upsample_nearest2d);
  r.add("aten.upsample_bilinear2d", upsample_bilinear2d);
}

}  // namespace kiln

// pool op definitions: aten.max_pool2d, aten.max_pool2d_with_indices, aten.avg_pool2d,
// aten.adaptive_avg_pool2d.
#include "ir/ops/pool.h"

#include "ir/op_registry.h"
#include "ir/ops/spatial.h"

namespace kiln {
namespace {

Error invalid(std::string msg) { return Error(ErrorCode::InvalidArgument, std::move(msg)); }

Error check_pool_input(const TensorType& self) {
  if (self.dtype != DType::Float32) {
    return Error(ErrorCode::NotSupported, std::string("dtype ") + dtype_name(self.dtype) + " (float32 only)");
  }
  const int64_t r = self.dim();
  if (r != 3 && r != 4) {
    return invalid("expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got size " + sizes_to_string(self.sizes));
  }
  return {};
}

Result<std::vector<TensorType>> infer_max_pool2d(InputTypes in, const Attributes& attrs) {
  auto g = pool2d_geometry(*in[0], attrs, true);
  if (!g.ok()) return g.error();
  return std::vector<TensorType>{{DType::Float32, g->out_sizes}};
}

// Values as max_pool2d, plus int64 indices of the same sizes (ih * W + iw within each plane).
Result<std::vector<TensorType>> infer_max_pool2d_with_indices(InputTypes in, const Attributes& attrs) {
  auto g = pool2d_geometry(*in[0], attrs, true);
  if (!g.ok()) return g.error();
  return std::vector<TensorType>{{DType::Float32, g->out_sizes}, {DType::Int64, g->out_sizes}};
}

Result<std::vector<TensorType>> infer_avg_pool2d(InputTypes in, const Attributes& attrs) {
  auto g = pool2d_geometry(*in[0], attrs, false);
  if (!g.ok()) return g.error();
  if (!attrs.is_none("divisor_override") && attrs.get_int("divisor_override") == 0) {
    return invalid("divisor_override must be non-zero");
  }
  return std::vector<TensorType>{{DType::Float32, g->out_sizes}};
}

// aten.adaptive_avg_pool2d: self (C, H, W) or (N, C, H, W) float32, H and W non-zero;
// output_size: exactly 2 values >= 0 (PyTorch aten/src/ATen/native/AdaptiveAveragePooling.cpp).
Result<std::vector<TensorType>> infer_adaptive_avg_pool2d(InputTypes in, const Attributes& attrs) {
  const TensorType& self = *in[0];
  KILN_RETURN_IF_ERROR(check_pool_input(self));
  const std::vector<int64_t> os = attrs.get_ints("output_size");
  if (os.size() != 2) {
    return invalid("output_size must have 2 values, got output_size=" + attr_to_string(AttrValue{os}));
  }
  for (int64_t v : os) {
    if (v < 0 || v > kMaxSpatialParam) {
      return invalid("output_size values must be non-negative, got output_size=" + attr_to_string(AttrValue{os}));
    }
  }
  const int64_t r = self.dim();
  if (self.sizes[r - 1] == 0 || self.sizes[r - 2] == 0) {
    return invalid("expected non-zero input height and width, got size " + sizes_to_string(self.sizes));
  }
  std::vector<int64_t> out = self.sizes;
  out[r - 2] = os[0];
  out[r - 1] = os[1];
  return std::vector<TensorType>{{DType::Float32, std::move(out)}};
}

}  // namespace

Result<int64_t> pooling_output_shape(const char* dim, int64_t in, int64_t k, int64_t p, int64_t s, int64_t d,
                                     bool ceil_mode) {
  const int64_t effective = (k - 1) * d + 1;  // k, d <= 2^31: no overflow
  if (p > k / 2 || p > effective / 2) {
    return invalid(std::string("padding should be at most half of the (effective) kernel size, got padding ") + dim +
                   "=" + std::to_string(p) + ", kernel_size=" + std::to_string(k) + ", dilation=" + std::to_string(d));
  }
  __int128 out = floor_div(static_cast<__int128>(in) + 2 * p - effective + (ceil_mode ? s - 1 : 0), s) + 1;
  if (ceil_mode && (out - 1) * s >= static_cast<__int128>(in) + p) --out;  // last window starts inside
  if (out < 1) {
    return invalid(std::string("calculated output ") + dim + " " + std::to_string(static_cast<long long>(out)) +
                   " is too small (input " + dim + " " + std::to_string(in) + ", kernel_size " + std::to_string(k) +
                   ", stride " + std::to_string(s) + ", padding " + std::to_string(p) + ", dilation " +
                   std::to_string(d) + ")");
  }
  if (out > kMaxSpatialSize) return invalid("calculated output size is too large");
  return static_cast<int64_t>(out);
}

Result<Pool2dGeometry> pool2d_geometry(const TensorType& self, const Attributes& attrs, bool with_dilation) {
  KILN_RETURN_IF_ERROR(check_pool_input(self));
  const int64_t r = self.dim();
  // PyTorch pool2d_shape_check: C, H, W non-zero; only the batch may be empty.
  for (int64_t i = r - 3; i < r; ++i) {
    if (self.sizes[i] == 0) {
      return invalid("expected non-zero channel, height and width sizes, got input of size " +
                     sizes_to_string(self.sizes));
    }
  }
  auto kernel = spatial_param(attrs, "kernel_size", 2, 1);
  if (!kernel.ok()) return kernel.error();
  std::vector<int64_t> stride_v = *kernel;  // stride [] means stride = kernel_size
  if (!attrs.get_ints("stride").empty()) {
    auto stride = spatial_param(attrs, "stride", 2, 1);
    if (!stride.ok()) return stride.error();
    stride_v = *stride;
  }
  auto padding = spatial_param(attrs, "padding", 2, 0);
  if (!padding.ok()) return padding.error();
  std::vector<int64_t> dilation_v = {1, 1};
  if (with_dilation) {
    auto dilation = spatial_param(attrs, "dilation", 2, 1);
    if (!dilation.ok()) return dilation.error();
    dilation_v = *dilation;
  }
  const bool ceil_mode = attrs.get_bool("ceil_mode");

  Pool2dGeometry g;
  g.planes = r == 4 ? self.sizes[0] * self.sizes[1] : self.sizes[0];
  g.in_h = self.sizes[r - 2];
  g.in_w = self.sizes[r - 1];
  g.kernel_h = (*kernel)[0], g.kernel_w = (*kernel)[1];
  g.stride_h = stride_v[0], g.stride_w = stride_v[1];
  g.pad_h = (*padding)[0], g.pad_w = (*padding)[1];
  g.dilation_h = dilation_v[0], g.dilation_w = dilation_v[1];
  auto oh = pooling_output_shape("height", g.in_h, g.kernel_h, g.pad_h, g.stride_h, g.dilation_h, ceil_mode);
  if (!oh.ok()) return oh.error();
  auto ow = pooling_output_shape("width", g.in_w, g.kernel_w, g.pad_w, g.stride_w, g.dilation_w, ceil_mode);
  if (!ow.ok()) return ow.error();
  g.out_h = *oh;
  g.out_w = *ow;
  g.out_sizes = self.sizes;
  g.out_sizes[r - 2] = g.out_h;
  g.out_sizes[r - 1] = g.out_w;
  return g;
}

void register_pool_ops(OpRegistry& r) {
  // aten.max_pool2d(self, kernel_size, stride=[], padding=0, dilation=1, ceil_mode=False); the same
  // for aten.max_pool2d_with_indices.
  const std::vector<AttrSpec> max_pool_attrs = {{"kernel_size", AttrKind::Ints, {}, true},
                                                {"stride", AttrKind::Ints, std::vector<int64_t>{}},
                                                {"padding", AttrKind::Ints, std::vector<int64_t>{0}},
                                                {"dilation", AttrKind::Ints, std::vector<int64_t>{1}},
                                                {"ceil_mode", AttrKind::Bool, false}};
  r.add({"aten.max_pool2d",
         {{"self"}},
         max_pool_attrs,
         1, infer_max_pool2d,
         "2-D max pooling over (C,H,W)/(N,C,H,W), NaN propagating (torch.ops.aten.max_pool2d; Pool.h output size)"});
  r.add({"aten.max_pool2d_with_indices",
         {{"self"}},
         max_pool_attrs,
         2, infer_max_pool2d_with_indices,
         "max_pool2d plus int64 indices of the maxima, flattened within each (H, W) plane "
         "(torch.ops.aten.max_pool2d_with_indices; MaxPoolKernel.cpp tie/NaN rules)"});
  r.add({"aten.avg_pool2d",
         {{"self"}},
         {{"kernel_size", AttrKind::Ints, {}, true},
          {"stride", AttrKind::Ints, std::vector<int64_t>{}},
          {"padding", AttrKind::Ints, std::vector<int64_t>{0}},
          {"ceil_mode", AttrKind::Bool, false},
          {"count_include_pad", AttrKind::Bool, true},
          {"divisor_override", AttrKind::Int, {}, false, true}},
         1, infer_avg_pool2d,
         "2-D average pooling over (C,H,W)/(N,C,H,W) (torch.ops.aten.avg_pool2d; ATen AvgPoolKernel.cpp divisor rules)"});
  r.add({"aten.adaptive_avg_pool2d",
         {{"self"}},
         {{"output_size", AttrKind::Ints, {}, true}},
         1, infer_adaptive_avg_pool2d,
         "adaptive 2-D average pooling: window [floor(i*in/out), ceil((i+1)*in/out)) (torch.ops.aten.adaptive_avg_pool2d)"});
}

}  // namespace kiln

// Upsampling op definitions: aten.upsample_nearest2d and aten.upsample_bilinear2d on (N, C, H, W)
// inputs. Argument names and checks follow ATen (aten/src/ATen/native/UpSample.h,
// upsample_2d_common_check): output_size has two positive entries, input H and W are positive.
// scales_h/scales_w may be None; when given and > 0 the kernels use 1/scale as the source step.
#include <string>

#include "ir/op_registry.h"

namespace kiln {
namespace {

using Types = std::vector<TensorType>;

constexpr int64_t kMaxElements = int64_t{1} << 46;  // the loader's bound on any tensor (bytes)

/// Checks input rank/sizes and output_size; returns the output type (N, C, out_h, out_w).
Result<Types> infer_upsample2d(const TensorType& x, const Attributes& attrs) {
  if (x.dim() != 4) return Error(ErrorCode::InvalidArgument, "input must have rank 4 (N, C, H, W), got " + sizes_to_string(x.sizes));
  const auto out = attrs.get_ints("output_size");
  if (out.size() != 2) {
    return Error(ErrorCode::InvalidArgument, "output_size must have 2 elements (out_h, out_w), got " + sizes_to_string(out));
  }
  if (out[0] <= 0 || out[1] <= 0 || x.sizes[2] <= 0 || x.sizes[3] <= 0) {
    return Error(ErrorCode::InvalidArgument, "input and output sizes must be greater than 0, got input (H, W) = (" +
                                                 std::to_string(x.sizes[2]) + ", " + std::to_string(x.sizes[3]) +
                                                 ") and output_size " + sizes_to_string(out));
  }
  // Keep N * C * out_h * out_w * 8 bytes representable (no overflow in planning or kernels).
  int64_t total = x.sizes[0] * x.sizes[1];  // bounded by the input's own size
  for (int64_t s : out) {
    if (total != 0 && s > kMaxElements / total) {
      return Error(ErrorCode::InvalidArgument, "output_size " + sizes_to_string(out) + " is too large");
    }
    total = total == 0 ? 0 : total * s;
  }
  return Types{{x.dtype, {x.sizes[0], x.sizes[1], out[0], out[1]}}};
}

// aten.upsample_nearest2d(self; output_size, scales_h, scales_w): data movement, every dtype.
Result<Types> infer_nearest(InputTypes in, const Attributes& attrs) { return infer_upsample2d(*in[0], attrs); }

// aten.upsample_bilinear2d(self; output_size, align_corners, scales_h, scales_w): float32 only.
Result<Types> infer_bilinear(InputTypes in, const Attributes& attrs) {
  if (in[0]->dtype != DType::Float32) {
    return Error(ErrorCode::NotSupported, std::string("dtype ") + dtype_name(in[0]->dtype) + " is not supported (float32 only)");
  }
  return infer_upsample2d(*in[0], attrs);
}

}  // namespace

void register_upsample_ops(OpRegistry& r) {
  const AttrValue none{};
  r.add({"aten.upsample_nearest2d", {{"self"}},
         {{"output_size", AttrKind::Ints, none, true},
          {"scales_h", AttrKind::Float, none, false, true},
          {"scales_w", AttrKind::Float, none, false, true}},
         1, infer_nearest,
         "nearest-neighbour resize of (N, C, H, W), src = min(floor(dst * step), in - 1) "
         "(PyTorch aten/src/ATen/native/UpSample.h nearest_idx)"});
  r.add({"aten.upsample_bilinear2d", {{"self"}},
         {{"output_size", AttrKind::Ints, none, true},
          {"align_corners", AttrKind::Bool, none, true},
          {"scales_h", AttrKind::Float, none, false, true},
          {"scales_w", AttrKind::Float, none, false, true}},
         1, infer_bilinear,
         "bilinear resize of (N, C, H, W) (PyTorch aten/src/ATen/native/UpSample.h area_pixel_compute_source_index)"});
}

}  // namespace kiln

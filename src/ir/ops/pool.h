// Geometry of the 2-D pooling ops, shared by their inference (src/ir/ops/pool.cpp) and their
// kernels (src/kernels/portable/pool.cpp) so that both use one validated computation.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/attributes.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

/// A validated max_pool2d / avg_pool2d window geometry over `planes` independent H x W planes.
struct Pool2dGeometry {
  int64_t planes = 0;                 ///< N * C (or C for a 3-D input)
  int64_t in_h = 0, in_w = 0;
  int64_t out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  std::vector<int64_t> out_sizes;     ///< output tensor sizes (same rank as the input)
};

/// Output size of one pooled dim (PyTorch aten/src/ATen/native/Pool.h pooling_output_shape with
/// pad_l = pad_r = p; the formula is given at pool2d_geometry). Also checks p <= k/2 and
/// p <= ((k-1)*d+1)/2. `dim` names the dim in errors ("height"). InvalidArgument when out < 1.
Result<int64_t> pooling_output_shape(const char* dim, int64_t in, int64_t k, int64_t p, int64_t s, int64_t d,
                                     bool ceil_mode);

/// Validates aten.max_pool2d(self, kernel_size, stride, padding, dilation, ceil_mode)
/// (`with_dilation` true) or aten.avg_pool2d(self, kernel_size, stride, padding, ceil_mode, ...)
/// (`with_dilation` false: dilation 1). `attrs` must be normalized.
///
/// self: float32 (C, H, W) or (N, C, H, W); C, H, W non-zero (N may be 0).
/// kernel_size: 1 or 2 values >= 1; stride: [] (= kernel_size), 1 or 2 values >= 1; padding: 1 or 2
/// values, 0 <= pad <= kernel/2 and pad <= ((kernel-1)*dilation+1)/2; dilation: 1 or 2 values >= 1.
/// Output size per dim (PyTorch aten/src/ATen/native/Pool.h pooling_output_shape):
///   out = floor((in + 2p - d(k-1) - 1 + (ceil_mode ? s-1 : 0)) / s) + 1, and with ceil_mode the
///   last window must start inside the input or the left padding: if (out-1)*s >= in + p, out -= 1.
///   out must be >= 1.
/// Errors: InvalidArgument naming the bad argument; NotSupported for non-float32 dtypes.
Result<Pool2dGeometry> pool2d_geometry(const TensorType& self, const Attributes& attrs, bool with_dilation);

}  // namespace kiln

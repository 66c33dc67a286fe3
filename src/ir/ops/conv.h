// Geometry of aten.convolution, shared by the op's inference (src/ir/ops/conv.cpp) and its
// kernels (src/kernels/portable/conv.cpp) so that both use one validated computation.
#pragma once

#include <cstdint>

#include "kiln/attributes.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

/// A validated 1-D or 2-D convolution. A 1-D convolution (N, C, L) is described as a 2-D one
/// with height 1 (index 0 = H, 1 = W; for 1-D, H has size 1, kernel 1, stride 1, no padding).
struct ConvGeometry {
  int64_t spatial_dims = 2;      ///< 1 or 2: spatial dims of the ATen tensors
  bool transposed = false;
  int64_t batch = 0;             ///< N
  int64_t in_channels = 0;       ///< C_in
  int64_t out_channels = 0;      ///< C_out
  int64_t groups = 1;
  int64_t in_size[2] = {1, 1};   ///< input H, W
  int64_t out_size[2] = {1, 1};  ///< output H, W
  int64_t kernel[2] = {1, 1};    ///< weight kH, kW
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  int64_t output_padding[2] = {0, 0};
};

/// Validates aten.convolution(input, weight, bias?, stride, padding, dilation, transposed,
/// output_padding, groups) and computes its geometry. `attrs` must be normalized.
///
/// input: float32 [N, C_in, L] or [N, C_in, H, W]. weight: float32, same rank;
/// [C_out, C_in/groups, k...] or, transposed, [C_in, C_out/groups, k...]. bias: float32 [C_out] or null.
/// stride/padding/dilation/output_padding: one value (applies to every spatial dim, as PyTorch's
/// expand_param_if_needed) or one per spatial dim; stride, dilation >= 1; padding, output_padding >= 0;
/// transposed: output_padding < stride or < dilation (PyTorch's rule). groups >= 1 divides C_in and C_out.
/// Output size (PyTorch aten/src/ATen/native/ConvUtils.h conv_output_size / conv_input_size):
///   out = (in + 2p - d(k-1) - 1) / s + 1                 (must be >= 1)
///   out = (in - 1) s - 2p + d(k-1) + output_padding + 1   (transposed, must be >= 1)
/// An empty input is accepted only with a zero batch or zero channels (PyTorch's rule).
/// Errors: InvalidArgument naming the bad argument; NotSupported for non-float32 dtypes or ranks
/// other than 3 and 4 (3-D convolution).
Result<ConvGeometry> conv_geometry(const TensorType& input, const TensorType& weight, const TensorType* bias,
                                   const Attributes& attrs);

}  // namespace kiln

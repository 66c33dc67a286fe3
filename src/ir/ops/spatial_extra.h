// Validated geometry of the padding and 3-D pooling ops, shared by their inference
// (src/ir/ops/spatial_extra.cpp) and their portable kernels (src/kernels/portable/spatial_extra.cpp)
// so that both use one computation.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/attributes.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

/// aten.reflection_pad{1,2,3}d / aten.replication_pad{1,2,3}d over the last `n` dims.
struct PadGeometry {
  int n = 1;                         ///< spatial dims padded (1, 2 or 3)
  int64_t planes = 0;                ///< product of the leading (batch, channel) dims
  std::vector<int64_t> in, out;      ///< spatial sizes, outermost first (D, H, W)
  std::vector<int64_t> before;       ///< padding before each spatial dim (outermost first), may be < 0
  std::vector<int64_t> out_sizes;    ///< output tensor sizes
};

/// Validates a pad call. self: any dtype, rank n+1 (no batch) or n+2 (batch); every dim but the
/// batch dim non-zero (PyTorch padding::check_valid_input). padding: 2n values in ATen order
/// (last dim first: [w_left, w_right, h_top, h_bottom, d_front, d_back]), negative values crop.
/// Each output size in + before + after must be >= 1; for reflection (`reflect` true) every pad
/// must be < the size of its dim (PyTorch: "Padding size should be less than the corresponding
/// input dimension"). InvalidArgument names the argument.
Result<PadGeometry> pad_geometry(const TensorType& self, const Attributes& attrs, int n, bool reflect);

/// A validated aten.avg_pool3d / aten.max_pool3d_with_indices geometry over `planes` D x H x W volumes.
struct Pool3dGeometry {
  int64_t planes = 0;  ///< N * C (or C for a 4-D input)
  std::array<int64_t, 3> in{}, out{}, kernel{}, stride{}, pad{}, dilation{1, 1, 1};
  std::vector<int64_t> out_sizes;
};

/// self: float32 (C, D, H, W) or (N, C, D, H, W), C, D, H, W non-zero. kernel_size 1 or 3 values
/// >= 1; stride [] (= kernel_size), 1 or 3 values >= 1; padding 1 or 3 values, <= kernel/2;
/// dilation (with_dilation only) 1 or 3 values >= 1. Output sizes: pooling_output_shape (pool.h).
Result<Pool3dGeometry> pool3d_geometry(const TensorType& self, const Attributes& attrs, bool with_dilation);

/// Number of sliding blocks along one dim of aten.col2im / im2col:
/// (size + 2 * pad - (dilation * (kernel - 1) + 1)) / stride + 1 (PyTorch Col2Im.cpp), or an error
/// when that is < 1.
Result<int64_t> col2im_blocks(const char* dim, int64_t size, int64_t kernel, int64_t dilation, int64_t pad,
                              int64_t stride);

}  // namespace kiln

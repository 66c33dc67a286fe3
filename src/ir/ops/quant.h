// Weight-only quantized ops (kiln.weight_quantized_linear, kiln.weight_quantized_convolution):
// the layout of a quantized weight, validated once here and shared by the ops' inference
// (src/ir/ops/quant.cpp), the quantization pass (src/compiler/quantize.cpp) and the kernels
// (src/kernels/quantized.h).
//
// A quantized weight is a matrix of `rows` rows (output features / output channels) and `k`
// columns (the reduction dimension: in_features, or C_in/groups * kH * kW of a convolution weight
// flattened in PyTorch's [C_out, C_in/groups, kH, kW] order). Each row is cut into G = ceil(k / gs)
// groups of gs consecutive columns (the last one shorter when gs does not divide k); each group
// has one scale (and, asymmetric 4-bit, one zero). gs = k for per-channel quantization.
//
//   bits 8: weight int8 [rows, k], q in [-127, 127]:           w[n, c] = q[n, c] * s[n, c / gs]
//   bits 4: weight uint8 [rows, ceil(k / 2)], two values per byte, column c in byte c / 2, low
//           nibble for even c, high nibble for odd c; u in [0, 15]:
//           symmetric  (no zeros): w[n, c] = (u[n, c] - 8) * s[n, c / gs]
//           asymmetric (zeros):    w[n, c] = (u[n, c] - 8) * s[n, c / gs] + z[n, c / gs]
//   (the 4-bit formula and the offset 8 are those of ATen's _weight_int4pack_mm,
//   aten/src/ATen/native/cpu/int4mm_kernel.cpp; the nibble order is MLX's, mlx/ops.cpp quantize,
//   so the bytes read as little-endian uint32 words are MLX's packed layout.)
// scales (and zeros): float32 or float16 [rows, G]; a float16 scale is widened to float32 exactly.
//
// Int8 activations (kiln.weight_quantized_linear with activation_bits = 8; requires k and the group
// size to be multiples of kActivationBlock = 32): each row x[i, :] of the input is quantized in
// blocks of 32 columns b, as llama.cpp's Q8_0 activations and ExecuTorch's 8da4w do, by this
// exact rule (float32 arithmetic, IEEE division, round half to even):
//   amax = max |x[i, c]| over the block;  d[i, b] = amax / 127  (d = NaN if the block holds an inf
//   or NaN, which makes the output row NaN);  q[i, c] = d > 0 ? clamp(nearbyint(x / d), -127, 127) : 0
// and the product is computed from integers per block, exact, then scaled:
//   out[i, n] = bias[n] + sum_b d[i, b] * (s[n, g] * sum_c wq[n, c] q[i, c] + z[n, g] * sum_c q[i, c])
// with g the group holding block b, wq = u - 8 (4-bit) or q (8-bit), z = 0 when symmetric: the
// float op applied to the dequantized input q * d, up to float32 rounding (relative error of the
// input about 2^-8 of the block's largest magnitude). The sums over blocks are float32 in the cpu
// kernels (any order), double in the portable kernel.
#pragma once

#include <cstdint>

#include "kiln/attributes.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

/// The validated layout of one quantized weight.
struct QuantLayout {
  int bits = 8;               ///< 4 or 8
  int64_t rows = 0;           ///< N: output features / channels
  int64_t k = 0;              ///< reduction length of a row (>= 1)
  int64_t group_size = 0;     ///< columns per group, 1 <= group_size <= k
  int64_t num_groups = 0;     ///< G = ceil(k / group_size)
  int64_t row_bytes = 0;      ///< bytes of one packed row: k (8-bit) or ceil(k / 2) (4-bit)
  bool has_zeros = false;     ///< asymmetric (4-bit only)
  DType scale_dtype = DType::Float32;  ///< Float32 or Float16 (scales and zeros)
  int activation_bits = 0;    ///< 0: float32 input; 8: int8 input blocks (see above; linear only)
};

/// Columns per int8 activation block (activation_bits = 8): the block of llama.cpp's Q8_0.
inline constexpr int64_t kActivationBlock = 32;

/// Checks a quantized weight (weight, scales, optional zeros) for a reduction length `k` and the
/// attributes `bits` (4 or 8) and `group_size` (0 = per channel, i.e. one group of k columns; else
/// >= 1, capped at k), and `activation_bits` (absent or 0; 8 only where k and the group size are
/// multiples of kActivationBlock). InvalidArgument names the tensor whose dtype or shape does not match
/// (a hostile file cannot make a kernel read outside the packed weight, scales or zeros).
Result<QuantLayout> quant_layout(const TensorType& weight, const TensorType& scales, const TensorType* zeros, int64_t k,
                                 const Attributes& attrs);

/// The aten.convolution attributes (stride, padding, dilation, groups; never transposed) of a
/// kiln.weight_quantized_convolution with normalized attributes `attrs`: with the dequantized
/// weight float32 [C_out, C_in/groups, kernel_size[0], kernel_size[1]], conv_geometry
/// (src/ir/ops/conv.h) gives the op's geometry (its inference and the backends use this one rule).
Attributes quantized_conv_attrs(const Attributes& attrs);

}  // namespace kiln

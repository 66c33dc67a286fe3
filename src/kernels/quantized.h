// Reading weight-only quantized weights (layout and formula: src/ir/ops/quant.h) in the portable
// and cpu kernels: dequantization of a column range of one row, without a full float copy.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ir/ops/quant.h"
#include "kernels/kernel.h"

namespace kiln {

/// A quantized weight as the kernels see it: packed data, scales, zeros (may be null) and the
/// layout that the op's inference validated at load.
struct QuantView {
  QuantLayout layout;
  const uint8_t* data = nullptr;  ///< rows * row_bytes bytes (int8 values or packed nibbles)
  const void* scales = nullptr;   ///< rows * num_groups, float32 or float16
  const void* zeros = nullptr;    ///< as scales, or null (symmetric)

  /// Scale (and zero) of group `g` of row `n`, widened to float32.
  float scale(int64_t n, int64_t g) const { return load(scales, n * layout.num_groups + g); }
  float zero(int64_t n, int64_t g) const { return zeros ? load(zeros, n * layout.num_groups + g) : 0.0f; }

  /// out[i] = w[n, c0 + i] for i in [0, len); requires 0 <= c0, c0 + len <= k. Float32
  /// arithmetic: q * s (8-bit), (u - 8) * s + z (4-bit; z = 0 when symmetric).
  void dequantize(int64_t n, int64_t c0, int64_t len, float* out) const;

 private:
  float load(const void* p, int64_t i) const {
    return layout.scale_dtype == DType::Float16 ? half_to_float(static_cast<const uint16_t*>(p)[i])
                                                : static_cast<const float*>(p)[i];
  }
};

/// The QuantView of arguments 1..3 (weight, scales, zeros) of a quantized op call whose reduction
/// length is k. Errors only if the layout check fails (the loader already ran it).
Result<QuantView> quant_view(const KernelArgs& a, int64_t k);

/// Runs the quantized linear (kiln.weight_quantized_linear) in fp32 for an input `x` [m, k]
/// into `out` [m, rows]: out = x @ dequantize(w)^T (+ bias). Portable reference: double
/// accumulation of the dequantized products; with activation_bits = 8 the integer block sums of
/// src/ir/ops/quant.h (int64), scaled and summed in double.
void quant_linear_reference(const QuantView& w, const float* x, const float* bias, int64_t m, float* out);

/// Quantizes one input row x [k] (k a multiple of kActivationBlock) to int8 blocks by the exact rule
/// of src/ir/ops/quant.h (activation_bits = 8): q [k] in [-127, 127], d [k / 32] the block scales
/// (NaN for a block holding an inf or NaN; its q are 0), qsum [k / 32] the sum of each block's q.
/// Float32 arithmetic, IEEE division, round half to even (the default rounding mode): every kernel
/// calls this one function, so q and d are the same on every target.
inline void quantize_activation_row(const float* x, int64_t k, int8_t* q, float* d, int32_t* qsum) {
  for (int64_t b = 0; b * kActivationBlock < k; ++b) {
    const float* xb = x + b * kActivationBlock;
    int8_t* qb = q + b * kActivationBlock;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t c = 0; c < kActivationBlock; ++c) {
      const float a = std::fabs(xb[c]);
      if (!(a <= FLT_MAX)) finite = false;  // inf or NaN
      amax = a > amax ? a : amax;
    }
    const float db = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    int32_t sum = 0;
    for (int64_t c = 0; c < kActivationBlock; ++c) {
      int v = 0;
      if (db > 0.0f) v = static_cast<int>(std::clamp(std::nearbyint(xb[c] / db), -127.0f, 127.0f));
      qb[c] = static_cast<int8_t>(v);
      sum += v;
    }
    d[b] = db;
    qsum[b] = sum;
  }
}

inline void QuantView::dequantize(int64_t n, int64_t c0, int64_t len, float* out) const {
  const int64_t gs = layout.group_size;
  const uint8_t* row = data + n * layout.row_bytes;
  int64_t c = c0;
  const int64_t end = c0 + len;
  while (c < end) {
    const int64_t g = c / gs;
    const int64_t gend = (g + 1) * gs < end ? (g + 1) * gs : end;
    const float s = scale(n, g);
    const int64_t cnt = gend - c;
    if (layout.bits == 8) {
      const auto* q = reinterpret_cast<const int8_t*>(row) + c;
      for (int64_t i = 0; i < cnt; ++i) out[i] = static_cast<float>(q[i]) * s;
    } else {
      const float z = zero(n, g);
      int64_t i = 0;
      if (c & 1) {  // odd start: the high nibble of its byte
        out[0] = static_cast<float>((row[c >> 1] >> 4) - 8) * s + z;
        i = 1;
      }
      const uint8_t* b = row + ((c + i) >> 1);
      const int64_t pairs = (cnt - i) / 2;
      for (int64_t j = 0; j < pairs; ++j) {
        out[i + 2 * j] = static_cast<float>((b[j] & 0xF) - 8) * s + z;
        out[i + 2 * j + 1] = static_cast<float>((b[j] >> 4) - 8) * s + z;
      }
      if (i + 2 * pairs < cnt) out[cnt - 1] = static_cast<float>((b[pairs] & 0xF) - 8) * s + z;
    }
    out += cnt;
    c = gend;
  }
}

}  // namespace kiln

// Helpers for ops with per-spatial-dim int list attributes (convolution, pooling).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/attributes.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

/// Largest accepted stride / padding / dilation / kernel size / output_padding. Bounding them keeps
/// every index computation of the kernels far from int64 overflow, even for hostile program files.
inline constexpr int64_t kMaxSpatialParam = (int64_t{1} << 31) - 1;
/// Largest accepted output spatial size (the loader's tensor byte limit is 2^46).
inline constexpr int64_t kMaxSpatialSize = int64_t{1} << 46;

/// Reads the int list attribute `name` for `n` spatial dims. One value applies to every dim
/// (PyTorch's expand_param_if_needed); otherwise exactly `n` values are required. Each value must
/// lie in [min_value, kMaxSpatialParam]. InvalidArgument names the attribute and its value.
inline Result<std::vector<int64_t>> spatial_param(const Attributes& attrs, std::string_view name, size_t n,
                                                  int64_t min_value) {
  std::vector<int64_t> v = attrs.get_ints(name);
  const std::string shown = std::string(name) + "=" + attr_to_string(AttrValue{v});
  if (v.size() != 1 && v.size() != n) {
    return Error(ErrorCode::InvalidArgument, std::string(name) + " must have 1 or " + std::to_string(n) +
                                                 " values, got " + shown);
  }
  if (v.size() == 1) v.assign(n, v[0]);
  for (int64_t x : v) {
    if (x < min_value) {
      return Error(ErrorCode::InvalidArgument, std::string(name) + " must be " +
                                                   (min_value == 0 ? "non-negative" : ">= " + std::to_string(min_value)) +
                                                   ", got " + shown);
    }
    if (x > kMaxSpatialParam) {
      return Error(ErrorCode::InvalidArgument, std::string(name) + " out of range, got " + shown);
    }
  }
  return v;
}

/// Floor division for a positive divisor (PyTorch's div_rtn).
inline __int128 floor_div(__int128 a, __int128 b) {
  __int128 q = a / b;
  if ((a % b != 0) && (a < 0)) --q;
  return q;
}

}  // namespace kiln

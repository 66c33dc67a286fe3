// Small helpers shared by the portable kernels (and the cpu kernels that take the same arguments).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernel.h"

namespace kiln {

/// The float32 data of an optional tensor argument (None -> null).
inline const float* data_or_null(const Tensor* t) { return t ? t->data_as<const float>() : nullptr; }

/// Ok when every tensor argument (and allow_bool: or Bool, e.g. masks) and the first output are
/// float32; NotSupported "<op>: float32 only" otherwise.
inline Error check_f32(const KernelArgs& a, const char* op, bool allow_bool = false) {
  for (const Tensor* t : a.inputs) {
    if (t && t->dtype != DType::Float32 && !(allow_bool && t->dtype == DType::Bool)) {
      return Error(ErrorCode::NotSupported, std::string(op) + ": float32 only");
    }
  }
  if (a.outputs[0]->dtype != DType::Float32) return Error(ErrorCode::NotSupported, std::string(op) + ": float32 only");
  return {};
}

/// Maps a flat index of a contiguous `out` shape to the flat index of an input whose shape
/// broadcasts to it (NumPy rules: missing leading dims and size-1 dims repeat).
class BroadcastIndex {
 public:
  BroadcastIndex(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
    const size_t r = out.size();
    out_sizes_ = out;
    in_strides_.assign(r, 0);
    int64_t stride = 1;
    for (size_t k = 0; k < in.size(); ++k) {
      const size_t i = in.size() - 1 - k;
      const size_t o = r - 1 - k;
      in_strides_[o] = in[i] == 1 ? 0 : stride;
      stride *= in[i];
    }
    identity_ = in == out;
  }
  int64_t operator()(int64_t flat) const {
    if (identity_) return flat;
    int64_t idx = 0;
    for (size_t d = out_sizes_.size(); d-- > 0;) {
      const int64_t c = flat % out_sizes_[d];
      flat /= out_sizes_[d];
      idx += c * in_strides_[d];
    }
    return idx;
  }

 private:
  std::vector<int64_t> out_sizes_;
  std::vector<int64_t> in_strides_;
  bool identity_ = false;
};

}  // namespace kiln

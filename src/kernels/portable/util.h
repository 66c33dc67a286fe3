// Small helpers shared by portable kernels.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

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

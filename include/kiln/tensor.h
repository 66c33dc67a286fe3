// Tensor types shared by the compiler and the runtime.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/dtype.h"

namespace kiln {

/// Static type of a tensor: dtype and sizes (contiguous, row-major: NCHW for images).
struct TensorType {
  DType dtype = DType::Float32;
  std::vector<int64_t> sizes;

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim() const { return static_cast<int64_t>(sizes.size()); }
  bool operator==(const TensorType&) const = default;
  /// "float32[1, 3, 224, 224]".
  std::string to_string() const;
};

/// A non-owning view of a contiguous tensor in memory (arena, constant segment or user buffer).
struct Tensor {
  DType dtype = DType::Float32;
  std::vector<int64_t> sizes;
  void* data = nullptr;

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim() const { return static_cast<int64_t>(sizes.size()); }
  int64_t size(int64_t d) const { return sizes[d < 0 ? d + dim() : d]; }
  TensorType type() const { return {dtype, sizes}; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data); }
};

/// Product of sizes (1 for a 0-d tensor).
int64_t numel_of(const std::vector<int64_t>& sizes);
/// "[1, 3, 224, 224]".
std::string sizes_to_string(const std::vector<int64_t>& sizes);

}  // namespace kiln

// Portable sorting kernels: sort, topk. Along dim, every lane is sorted stably (std::stable_sort
// of the indices), so equal values keep increasing indices; NaN orders as the largest value (last
// ascending, first descending), as PyTorch's sort and topk do (aten/src/ATen/native/cpu/SortingKernel.cpp).
// topk takes the first k of that order (largest first, or smallest first when largest=False).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "ir/op_registry.h"
#include "kernels/kernel.h"

namespace kiln {
namespace {

template <class T> struct TypeTag { using type = T; };

template <typename T>
bool nan_of(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(v);
  } else {
    return false;
  }
}

/// a before b ascending (NaN largest; NaNs equal to each other).
template <typename T>
bool less_nan_last(T a, T b) { return !nan_of(a) && (nan_of(b) || a < b); }

/// Sorts each lane along `dim` of x and writes the first `k` entries of the order into values and
/// indices (whose size along dim is k).
template <typename T>
void sort_lanes(const Tensor& x, Tensor& values, Tensor& indices, int64_t dim, int64_t k, bool descending) {
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const int64_t s = x.sizes[static_cast<size_t>(d)];
    if (d < dim) outer *= s;
    else if (d == dim) n = s;
    else inner *= s;
  }
  const T* px = x.data_as<const T>();
  T* pv = values.data_as<T>();
  int64_t* pi = indices.data_as<int64_t>();
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const T* lane = px + o * n * inner + i;
      std::iota(order.begin(), order.end(), int64_t{0});
      if (descending) {
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return less_nan_last(lane[b * inner], lane[a * inner]); });
      } else {
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return less_nan_last(lane[a * inner], lane[b * inner]); });
      }
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = (o * k + j) * inner + i;
        pv[at] = lane[order[static_cast<size_t>(j)] * inner];
        pi[at] = order[static_cast<size_t>(j)];
      }
    }
  }
}

Error sort_impl(const char* op, const KernelArgs& a, int64_t k_attr, bool descending) {
  const Tensor& x = *a.inputs[0];
  Tensor& values = *a.outputs[0];
  Tensor& indices = *a.outputs[1];
  auto d = wrap_dim(a.attrs.get_int("dim"), x.dim());
  if (!d.ok()) return Error(ErrorCode::InvalidArgument, std::string(op) + ": dim: " + d.error().message());
  const int64_t dim = x.dim() == 0 ? 0 : *d;
  const int64_t n = x.dim() == 0 ? 1 : x.sizes[static_cast<size_t>(dim)];
  const int64_t k = k_attr < 0 ? n : k_attr;
  std::vector<int64_t> want = x.sizes;
  if (x.dim() > 0) want[static_cast<size_t>(dim)] = k;
  if (k > n || values.dtype != x.dtype || indices.dtype != DType::Int64 || values.sizes != want ||
      indices.sizes != want) {
    return Error(ErrorCode::Internal, std::string(op) + ": output types differ from the inferred ones");
  }
  if (x.numel() == 0) return {};
  switch (x.dtype) {
    case DType::Float32: sort_lanes<float>(x, values, indices, dim, k, descending); return {};
    case DType::Float64: sort_lanes<double>(x, values, indices, dim, k, descending); return {};
    case DType::Int64: sort_lanes<int64_t>(x, values, indices, dim, k, descending); return {};
    case DType::Int32: sort_lanes<int32_t>(x, values, indices, dim, k, descending); return {};
    case DType::Int8: sort_lanes<int8_t>(x, values, indices, dim, k, descending); return {};
    case DType::UInt8:
    case DType::Bool: sort_lanes<uint8_t>(x, values, indices, dim, k, descending); return {};
    default: return Error(ErrorCode::NotSupported, std::string(op) + ": dtype " + dtype_name(x.dtype));
  }
}

/// aten.sort(self, dim, descending, stable): (values, indices), always stable.
Error sort(const KernelArgs& a) { return sort_impl("aten.sort", a, -1, a.attrs.get_bool("descending")); }

/// aten.topk(self, k, dim, largest, sorted): the first k of the stable order, largest first when
/// largest (NaN first), else smallest first; always sorted.
Error topk(const KernelArgs& a) {
  const int64_t k = a.attrs.get_int("k");
  if (k < 0) return Error(ErrorCode::InvalidArgument, "aten.topk: k must be >= 0");
  return sort_impl("aten.topk", a, k, a.attrs.get_bool("largest"));
}

}  // namespace

void register_portable_sort(KernelRegistry& r) {
  r.add("aten.sort", sort);
  r.add("aten.topk", topk);
}

}  // namespace kiln

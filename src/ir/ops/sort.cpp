// Sorting op definitions: sort, topk. Semantics are PyTorch eager's (aten/src/ATen/native/Sorting.cpp,
// TensorCompare.cpp): two outputs, the values (input dtype) and int64 indices into dim; NaN orders
// as the largest value (last ascending, first descending); a 0-d input is treated as one element.
// dtypes: float32, float64, int64, int32, int8, uint8, bool.
#include "ir/op_registry.h"

namespace kiln {
namespace {

using Types = Result<std::vector<TensorType>>;

Error check_dtype(DType d) {
  switch (d) {
    case DType::Float32: case DType::Float64: case DType::Int64: case DType::Int32: case DType::Int8:
    case DType::UInt8: case DType::Bool: return {};
    default:
      return Error(ErrorCode::NotSupported, std::string("dtype ") + dtype_name(d) +
                                                " (supported: float32, float64, int64, int32, int8, uint8, bool)");
  }
}

/// sort(self, dim=-1, descending=False, stable=False) -> (values, indices), both self's sizes.
/// Kiln always sorts stably (equal values keep their input order), which is one of the orders
/// stable=False allows.
Types infer_sort(InputTypes in, const Attributes& a) {
  const TensorType& t = *in[0];
  KILN_RETURN_IF_ERROR(check_dtype(t.dtype));
  auto d = wrap_dim(a.get_int("dim"), t.dim());
  if (!d.ok()) return Error(ErrorCode::InvalidArgument, "dim: " + d.error().message());
  return std::vector<TensorType>{{t.dtype, t.sizes}, {DType::Int64, t.sizes}};
}

/// topk(self, k, dim=-1, largest=True, sorted=True) -> (values, indices) with size k along dim;
/// 0 <= k <= size of dim (torch: "selected index k out of range"). Results are always in sorted
/// order (largest first when largest), which sorted=False allows.
Types infer_topk(InputTypes in, const Attributes& a) {
  const TensorType& t = *in[0];
  KILN_RETURN_IF_ERROR(check_dtype(t.dtype));
  auto d = wrap_dim(a.get_int("dim"), t.dim());
  if (!d.ok()) return Error(ErrorCode::InvalidArgument, "dim: " + d.error().message());
  const int64_t size = t.dim() == 0 ? 1 : t.sizes[static_cast<size_t>(*d)];
  const int64_t k = a.get_int("k");
  if (k < 0 || k > size) {
    return Error(ErrorCode::InvalidArgument, "k: selected index k=" + std::to_string(k) + " out of range for a dim of size " +
                                                 std::to_string(size));
  }
  std::vector<int64_t> sizes = t.sizes;
  if (t.dim() > 0) sizes[static_cast<size_t>(*d)] = k;
  return std::vector<TensorType>{{t.dtype, sizes}, {DType::Int64, sizes}};
}

}  // namespace

void register_sort_ops(OpRegistry& r) {
  r.add({"aten.sort", {{"self"}},
         {{"dim", AttrKind::Int, int64_t{-1}}, {"descending", AttrKind::Bool, false}, {"stable", AttrKind::Bool, false}},
         2, infer_sort,
         "(values, int64 indices) sorted along dim, always stable; NaN is the largest value (torch.sort, "
         "aten.sort.stable)"});
  r.add({"aten.topk", {{"self"}},
         {{"k", AttrKind::Int, {}, true}, {"dim", AttrKind::Int, int64_t{-1}}, {"largest", AttrKind::Bool, true},
          {"sorted", AttrKind::Bool, true}},
         2, infer_topk,
         "(values, int64 indices) of the k largest (or smallest) along dim, in sorted order, equal values by "
         "increasing index; NaN is the largest value (torch.topk)"});
}

}  // namespace kiln

// Reduction op definitions: mean, sum, amax, amin, argmax, argmin, any, max (dim), min (dim), prod,
// var, _softmax, _log_softmax, cumsum.
// Semantics are PyTorch eager's (aten/src/ATen/native/ReduceOps.cpp, SoftMax.cpp):
// - dims may be negative, a dim listed twice is an error, dim=None or [] reduces every dim;
//   a 0-d input accepts dim 0 / -1 and gives a 0-d result;
// - amax/amin/argmax reject reducing over a dim of size 0 (no identity), sum gives 0 and mean NaN;
// - dtypes: sum and cumsum float32 -> float32, float64 -> float64 and integer/bool -> int64 (torch
//   promotes integral sums to int64); mean, _softmax, _log_softmax float32, float64; amax/amin
//   float32, float64, int64, int32, int8, uint8, bool; argmax float32, float64, int64, int32, int8,
//   uint8 (torch has no bool argmax) -> int64; argmin likewise;
// - any: every dtype -> bool (uint8 -> uint8, as torch) (x != 0, NaN is true); dim None = all dims, dim [] = no dim reduced
//   (aten.any.dims with an empty list is the element-wise x != 0, as torch computes it);
// - max/min (aten.max.dim / aten.min.dim): two outputs, the values (input dtype) and the int64 index
//   of the first extremum along dim; a NaN is the extremum (its first index), as torch;
// - prod: float32/float64 inputs keep their dtype, integer/bool inputs give int64 (torch promotes
//   integral products to int64), or the dtype= argument;
// - var: float32/float64; sum((x - mean)^2) / max(N - correction, 0) (torch.var, ReduceOps.cpp
//   std_var_kernel: N - correction <= 0 gives inf or NaN, not an error).
#include "ir/op_registry.h"
#include "ir/ops/shape_rules.h"

namespace kiln {
namespace {

namespace sr = shape_rules;
using Types = Result<std::vector<TensorType>>;

Error unsupported(DType d, const char* allowed) {
  return Error(ErrorCode::NotSupported, std::string("dtype ") + dtype_name(d) + " (supported: " + allowed + ")");
}

bool is_f32_or_f64(DType d) { return d == DType::Float32 || d == DType::Float64; }

bool is_integral_or_bool(DType d) {
  return d == DType::Int64 || d == DType::Int32 || d == DType::Int8 || d == DType::UInt8 || d == DType::Bool;
}

// The reduction mask of a `dim` int[] attribute (nullable for sum/mean; [] = all).
Result<std::vector<bool>> mask_of(const TensorType& t, const Attributes& a) {
  std::optional<std::vector<int64_t>> dims;
  if (!a.is_none("dim")) dims = a.get_ints("dim");
  return sr::reduction_mask(dims, t.dim(), "dim");
}

// Rejects reducing over a size-0 dim for ops without an identity (amax, amin, argmax).
Error check_nonempty(const TensorType& t, const std::vector<bool>& mask) {
  for (size_t d = 0; d < mask.size(); ++d) {
    if (mask[d] && t.sizes[d] == 0) {
      return Error(ErrorCode::InvalidArgument, "expected reduction dim " + std::to_string(d) +
                                                   " to have non-zero size (input " + sizes_to_string(t.sizes) + ")");
    }
  }
  return {};
}

Types infer_sum(InputTypes in, const Attributes& a) {
  const TensorType& t = *in[0];
  DType out;
  if (is_f32_or_f64(t.dtype)) {
    out = t.dtype;
  } else if (is_integral_or_bool(t.dtype)) {
    out = DType::Int64;
  } else {
    return unsupported(t.dtype, "float32, float64, int64, int32, int8, uint8, bool");
  }
  auto mask = mask_of(t, a);
  if (!mask.ok()) return mask.error();
  return std::vector<TensorType>{{out, sr::reduced_sizes(t.sizes, *mask, a.get_bool("keepdim"))}};
}

/// mean and var (dim: int[]? (None or [] = all), var's correction: float? (None = 1), keepdim):
/// float32 or float64, output of the input's dtype over the kept dims.
Types infer_mean(InputTypes in, const Attributes& a) {
  const TensorType& t = *in[0];
  if (!is_f32_or_f64(t.dtype)) return unsupported(t.dtype, "float32, float64");
  auto mask = mask_of(t, a);
  if (!mask.ok()) return mask.error();
  return std::vector<TensorType>{{t.dtype, sr::reduced_sizes(t.sizes, *mask, a.get_bool("keepdim"))}};
}

Types infer_amax_amin(InputTypes in, const Attributes& a) {
  const TensorType& t = *in[0];
  if (!is_f32_or_f64(t.dtype) && !is_integral_or_bool(t.dtype)) {
    return unsupported(t.dtype, "float32, float64, int64, int32, int8, uint8, bool");
  }
  auto mask = mask_of(t, a);
  if (!mask.ok()) return mask.error();
  KILN_RETURN_IF_ERROR(check_nonempty(t, *mask));
  return std::vector<TensorType>{{t.dtype, sr::reduced_sizes(t.sizes, *mask, a.get_bool("keepdim"))}};
}

Types infer_argmax(InputTypes in, const Attributes& a) {
  const TensorType& t = *in[0];
  if (!is_f32_or_f64(t.dtype) && (!is_integral_or_bool(t.dtype) || t.dtype == DType::Bool)) {
    return unsupported(t.dtype, "float32, float64, int64, int32, int8, uint8");
  }
  const bool keepdim = a.get_bool("keepdim");
  if (a.is_none("dim")) {  // over the flattened input
    if (t.numel() == 0) return Error(ErrorCode::InvalidArgument, "cannot take the argmax of an empty tensor");
    return std::vector<TensorType>{{DType::Int64, std::vector<int64_t>(keepdim ? t.sizes.size() : 0, 1)}};
  }
  auto mask = sr::reduction_mask(std::vector<int64_t>{a.get_int("dim")}, t.dim(), "dim");
  if (!mask.ok()) return mask.error();
  KILN_RETURN_IF_ERROR(check_nonempty(t, *mask));
  return std::vector<TensorType>{{DType::Int64, sr::reduced_sizes(t.sizes, *mask, keepdim)}};
}

/// any(self, dim: int[]? = None, keepdim): dim None reduces every dim, [] none; bool output.
Types infer_any(InputTypes in, const Attributes& a) {
  const TensorType& t = *in[0];
  std::vector<bool> mask(static_cast<size_t>(t.dim()), true);
  if (!a.is_none("dim")) {
    const auto dims = a.get_ints("dim");
    if (!dims.empty()) {
      auto m = sr::reduction_mask(dims, t.dim(), "dim");
      if (!m.ok()) return m.error();
      mask = *m;
    } else {
      mask.assign(mask.size(), false);
    }
  }
  // torch.any keeps uint8 for uint8 inputs (0/1 values); every other dtype gives bool.
  const DType out = t.dtype == DType::UInt8 ? DType::UInt8 : DType::Bool;
  return std::vector<TensorType>{{out, sr::reduced_sizes(t.sizes, mask, a.get_bool("keepdim"))}};
}

/// max/min(self, dim, keepdim) -> (values: self's dtype, indices: int64); the reduced dim must be
/// non-empty (torch: "Expected reduction dim ... to have non-zero size").
Types infer_max_min_dim(InputTypes in, const Attributes& a) {
  const TensorType& t = *in[0];
  if (!is_f32_or_f64(t.dtype) && !is_integral_or_bool(t.dtype)) {
    return unsupported(t.dtype, "float32, float64, int64, int32, int8, uint8, bool");
  }
  auto mask = sr::reduction_mask(std::vector<int64_t>{a.get_int("dim")}, t.dim(), "dim");
  if (!mask.ok()) return mask.error();
  KILN_RETURN_IF_ERROR(check_nonempty(t, *mask));
  auto sizes = sr::reduced_sizes(t.sizes, *mask, a.get_bool("keepdim"));
  return std::vector<TensorType>{{t.dtype, sizes}, {DType::Int64, sizes}};
}

/// prod(self, dim: int? = None, keepdim, dtype: str? = None): dim None = every dim (keepdim then
/// keeps them all as size 1).
Types infer_prod(InputTypes in, const Attributes& a) {
  const TensorType& t = *in[0];
  if (!is_f32_or_f64(t.dtype) && !is_integral_or_bool(t.dtype)) {
    return unsupported(t.dtype, "float32, float64, int64, int32, int8, uint8, bool");
  }
  DType out = is_f32_or_f64(t.dtype) ? t.dtype : DType::Int64;
  if (!a.is_none("dtype")) {
    const std::string name = a.get_string("dtype");
    const auto dt = dtype_from_name(name);
    if (!dt) return Error(ErrorCode::InvalidArgument, "dtype: unknown dtype '" + name + "'");
    if (!is_f32_or_f64(*dt) && *dt != DType::Int64 && *dt != DType::Int32) {
      return unsupported(*dt, "dtype float32, float64, int64, int32");
    }
    if (!is_f32_or_f64(*dt) && is_f32_or_f64(t.dtype)) {
      return Error(ErrorCode::NotSupported, std::string("dtype ") + dtype_name(*dt) + " for a floating input");
    }
    out = *dt;
  }
  std::optional<std::vector<int64_t>> dims;
  if (!a.is_none("dim")) dims = std::vector<int64_t>{a.get_int("dim")};
  auto mask = sr::reduction_mask(dims, t.dim(), "dim");
  if (!mask.ok()) return mask.error();
  return std::vector<TensorType>{{out, sr::reduced_sizes(t.sizes, *mask, a.get_bool("keepdim"))}};
}

Types infer_softmax(InputTypes in, const Attributes& a) {
  const TensorType& t = *in[0];
  if (!is_f32_or_f64(t.dtype)) return unsupported(t.dtype, "float32, float64");
  if (a.get_bool("half_to_float")) {
    return Error(ErrorCode::NotSupported, std::string("half_to_float=True needs a float16 input (") +
                                              dtype_name(t.dtype) + " given)");
  }
  auto d = wrap_dim(a.get_int("dim"), t.dim());
  if (!d.ok()) return Error(ErrorCode::InvalidArgument, "dim: " + d.error().message());
  return std::vector<TensorType>{t};
}

/// cumsum(self, dim, dtype=None): same sizes; dim in range (a 0-d input takes dim 0 / -1); output
/// dtype `dtype` when given (float32, float64, int64), else the input's for float32/float64 and int64
/// for integer/bool inputs (torch.cumsum promotes integral inputs to int64).
Types infer_cumsum(InputTypes in, const Attributes& a) {
  const TensorType& t = *in[0];
  auto d = wrap_dim(a.get_int("dim"), t.dim());
  if (!d.ok()) return Error(ErrorCode::InvalidArgument, "dim: " + d.error().message());
  if (!is_f32_or_f64(t.dtype) && !is_integral_or_bool(t.dtype)) {
    return unsupported(t.dtype, "float32, float64, int64, int32, int8, uint8, bool");
  }
  DType out = is_f32_or_f64(t.dtype) ? t.dtype : DType::Int64;
  if (!a.is_none("dtype")) {
    const std::string name = a.get_string("dtype");
    const auto dt = dtype_from_name(name);
    if (!dt) return Error(ErrorCode::InvalidArgument, "unknown dtype '" + name + "'");
    if (!is_f32_or_f64(*dt) && *dt != DType::Int64) return unsupported(*dt, "dtype float32, float64, int64");
    if (*dt == DType::Int64 && is_f32_or_f64(t.dtype)) {
      return Error(ErrorCode::NotSupported, "dtype int64 for a floating input is not supported");
    }
    out = *dt;
  }
  return std::vector<TensorType>{{out, t.sizes}};
}

AttrSpec dims_nullable() { return {"dim", AttrKind::Ints, {}, false, true}; }
AttrSpec keepdim() { return {"keepdim", AttrKind::Bool, false}; }

}  // namespace

void register_reduction_ops(OpRegistry& r) {
  r.add({"aten.sum", {{"self"}}, {dims_nullable(), keepdim()}, 1, infer_sum,
         "sum over dim (None or [] = all); integer/bool inputs give int64 (torch.sum, aten.sum.dim_IntList)"});
  r.add({"aten.mean", {{"self"}}, {dims_nullable(), keepdim()}, 1, infer_mean,
         "mean over dim (None or [] = all); NaN for an empty reduction (torch.mean, aten.mean.dim)"});
  r.add({"aten.amax", {{"self"}}, {{"dim", AttrKind::Ints, std::vector<int64_t>{}}, keepdim()}, 1, infer_amax_amin,
         "maximum over dim ([] = all), NaN propagates (torch.amax)"});
  r.add({"aten.amin", {{"self"}}, {{"dim", AttrKind::Ints, std::vector<int64_t>{}}, keepdim()}, 1, infer_amax_amin,
         "minimum over dim ([] = all), NaN propagates (torch.amin)"});
  r.add({"aten.argmax", {{"self"}}, {{"dim", AttrKind::Int, {}, false, true}, keepdim()}, 1, infer_argmax,
         "int64 index of the first maximum along dim (None = flattened); NaN counts as maximum (torch.argmax)"});
  r.add({"aten.argmin", {{"self"}}, {{"dim", AttrKind::Int, {}, false, true}, keepdim()}, 1, infer_argmax,
         "int64 index of the first minimum along dim (None = flattened); NaN counts as minimum (torch.argmin)"});
  r.add({"aten.any", {{"self"}}, {dims_nullable(), keepdim()}, 1, infer_any,
         "bool: some element != 0 (NaN counts) over dim (None = all, [] = none) (aten.any.dims)"});
  r.add({"aten.max", {{"self"}}, {{"dim", AttrKind::Int, {}, true}, keepdim()}, 2, infer_max_min_dim,
         "(values, int64 indices) of the maximum along dim; first occurrence; NaN propagates with its first "
         "index (aten.max.dim)"});
  r.add({"aten.min", {{"self"}}, {{"dim", AttrKind::Int, {}, true}, keepdim()}, 2, infer_max_min_dim,
         "(values, int64 indices) of the minimum along dim; first occurrence; NaN propagates with its first "
         "index (aten.min.dim)"});
  r.add({"aten.prod", {{"self"}},
         {{"dim", AttrKind::Int, {}, false, true}, keepdim(), {"dtype", AttrKind::String, {}, false, true}}, 1,
         infer_prod,
         "product over dim (None = all); integer/bool inputs give int64 (wrapping), or dtype= (torch.prod)"});
  r.add({"aten.var", {{"self"}}, {dims_nullable(), {"correction", AttrKind::Float, {}, false, true}, keepdim()}, 1,
         infer_mean,
         "sum((x - mean)^2) / max(N - correction, 0) over dim (None or [] = all), correction None = 1, two "
         "passes in double (aten.var.correction)"});
  r.add({"aten._softmax", {{"self"}}, {{"dim", AttrKind::Int, {}, true}, {"half_to_float", AttrKind::Bool, false}}, 1,
         infer_softmax, "exp(x - max) / sum(exp(x - max)) along dim (torch._softmax)"});
  r.add({"aten._log_softmax", {{"self"}}, {{"dim", AttrKind::Int, {}, true}, {"half_to_float", AttrKind::Bool, false}},
         1, infer_softmax, "x - max - log(sum(exp(x - max))) along dim (torch._log_softmax)"});
  r.add({"aten.cumsum", {{"self"}}, {{"dim", AttrKind::Int, {}, true}, {"dtype", AttrKind::String, {}, false, true}}, 1,
         infer_cumsum,
         "running sum along dim, in the output dtype (float32/float64 sums accumulate in double); integer inputs "
         "give int64 (torch.cumsum)"});
}

}  // namespace kiln

// Creation op definitions: arange, full, full_like, scalar_tensor, fill, copy. Semantics are
// PyTorch eager's (aten/src/ATen/native/RangeFactories.cpp, TensorFactories.cpp, Fill.cpp, Copy.cpp).
// arange, full and scalar_tensor take no tensor argument (their sizes come from attributes); the
// capture usually evaluates them at export time (their inputs are all constant), but the ops exist so
// that a graph can compute them at run time. Numbers are attributes of kind float (double): integer
// values beyond 2^53 are not exact.
#include <cmath>

#include "ir/op_registry.h"
#include "ir/ops/creation.h"
#include "ir/ops/shape_rules.h"

namespace kiln {
namespace {

namespace sr = shape_rules;
using Types = Result<std::vector<TensorType>>;

Result<DType> dtype_attr(const Attributes& a, const char* name, DType fallback) {
  if (a.is_none(name)) return fallback;
  const std::string s = a.get_string(name);
  const auto dt = dtype_from_name(s);
  if (!dt) return Error(ErrorCode::InvalidArgument, std::string(name) + ": unknown dtype '" + s + "'");
  return *dt;
}

Types infer_arange(InputTypes, const Attributes& a) {
  auto dt = dtype_attr(a, "dtype", DType::Float32);
  if (!dt.ok()) return dt.error();
  auto n = arange_length(a.get_float("start"), a.get_float("end"), a.get_float("step"), *dt);
  if (!n.ok()) return n.error();
  return std::vector<TensorType>{{*dt, {*n}}};
}

Types infer_full(InputTypes, const Attributes& a) {
  auto dt = dtype_attr(a, "dtype", DType::Float32);
  if (!dt.ok()) return dt.error();
  const auto size = a.get_ints("size");
  auto n = sr::checked_numel(size);
  if (!n.ok()) return Error(ErrorCode::InvalidArgument, "size: " + n.error().message());
  return std::vector<TensorType>{{*dt, size}};
}

Types infer_full_like(InputTypes in, const Attributes& a) {
  auto dt = dtype_attr(a, "dtype", in[0]->dtype);
  if (!dt.ok()) return dt.error();
  return std::vector<TensorType>{{*dt, in[0]->sizes}};
}

Types infer_scalar_tensor(InputTypes, const Attributes& a) {
  auto dt = dtype_attr(a, "dtype", DType::Float32);
  if (!dt.ok()) return dt.error();
  return std::vector<TensorType>{{*dt, {}}};
}

/// copy(self, src) / fill(self, value): src (value: 0-d) broadcast to self's sizes, converted to
/// self's dtype; the output is self's type.
Types infer_copy_like(InputTypes in, const Attributes&, const char* src_name, bool zero_d) {
  const TensorType& self = *in[0];
  const TensorType& src = *in[1];
  if (zero_d && !src.sizes.empty()) {
    return Error(ErrorCode::InvalidArgument, std::string(src_name) + ": must be a 0-d tensor, got " +
                                                 sizes_to_string(src.sizes));
  }
  auto b = broadcast_shapes(self.sizes, src.sizes);
  if (!b.ok() || *b != self.sizes) {
    return Error(ErrorCode::InvalidArgument, std::string(src_name) + ": sizes " + sizes_to_string(src.sizes) +
                                                 " do not broadcast to self's " + sizes_to_string(self.sizes));
  }
  return std::vector<TensorType>{self};
}

AttrSpec number(const char* name) { return {name, AttrKind::Float, {}, true, false}; }
AttrSpec dtype_nullable() { return {"dtype", AttrKind::String, {}, false, true}; }

}  // namespace

Result<int64_t> arange_length(double start, double end, double step, DType dtype) {
  switch (dtype) {
    case DType::Float32: case DType::Float64: case DType::Int64: case DType::Int32: case DType::Int8:
    case DType::UInt8: break;
    default:
      return Error(ErrorCode::NotSupported, std::string("dtype ") + dtype_name(dtype) +
                                                " (supported: float32, float64, int64, int32, int8, uint8)");
  }
  if (!std::isfinite(start) || !std::isfinite(end)) {
    return Error(ErrorCode::InvalidArgument, "start and end must be finite");
  }
  if (step == 0 || !std::isfinite(step)) return Error(ErrorCode::InvalidArgument, "step must be nonzero and finite");
  if (!((step > 0 && end >= start) || (step < 0 && end <= start))) {
    return Error(ErrorCode::InvalidArgument, "upper bound and larger bound inconsistent with step sign");
  }
  const double n = std::ceil((end - start) / step);
  if (!(n >= 0 && n < 4.6e18)) return Error(ErrorCode::InvalidArgument, "the result would be too large");
  return static_cast<int64_t>(n);
}

void register_creation_ops(OpRegistry& r) {
  r.add({"aten.arange", {},
         {{"start", AttrKind::Float, 0.0}, number("end"), {"step", AttrKind::Float, 1.0}, dtype_nullable()}, 1,
         infer_arange,
         "[start, start + step, ...) with ceil((end - start) / step) elements (computed in double), value i = "
         "start + i * step in double for float dtypes, in int64 of the truncated start/step for integer dtypes; "
         "dtype None = float32 (the capture passes the traced dtype) (torch.arange)"});
  r.add({"aten.full", {}, {{"size", AttrKind::Ints, {}, true}, number("fill_value"), dtype_nullable()}, 1, infer_full,
         "a tensor of `size` filled with fill_value converted to dtype (None = float32) (torch.full)"});
  r.add({"aten.full_like", {{"self"}}, {number("fill_value"), dtype_nullable()}, 1, infer_full_like,
         "full(self.sizes, fill_value, dtype or self's dtype); self's values are not read (torch.full_like)"});
  r.add({"aten.scalar_tensor", {}, {number("s"), dtype_nullable()}, 1, infer_scalar_tensor,
         "a 0-d tensor holding s converted to dtype (None = float32) (torch.scalar_tensor)"});
  r.add({"aten.fill", {{"self"}, {"value"}}, {},
         1, [](InputTypes in, const Attributes& a) { return infer_copy_like(in, a, "value", true); },
         "self's type filled with the 0-d value converted to self's dtype (aten.fill.Tensor; fill.Scalar's "
         "number is captured as a 0-d constant)"});
  r.add({"aten.copy", {{"self"}, {"src"}}, {},
         1, [](InputTypes in, const Attributes& a) { return infer_copy_like(in, a, "src", false); },
         "src broadcast to self's sizes, converted to self's dtype as _to_copy converts (aten.copy)"});
}

}  // namespace kiln

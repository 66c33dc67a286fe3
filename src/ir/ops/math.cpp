// Elementwise math op definitions (docs/op-set.md, family "math"): inverse and hyperbolic
// trigonometry, expm1/log1p/log2/log10, rounding (ceil, floor, round, trunc), sign, isinf/isnan,
// atan2, remainder/fmod, maximum/minimum, logical_xor, the bitwise ops and elu.
// Kernels: src/kernels/portable/math.cpp.
//
// Dtype rules (PyTorch's, restricted to what the portable kernels implement; binary ops broadcast
// NumPy-style and compute in result_type(self, other), ir/op_registry.h):
// - floating math (acos, ..., log10, atan2): float32 output for float32 or integer/bool inputs
//   (PyTorch promotes integers to the default float dtype), float64 for float64;
// - ceil/floor/round/trunc: float32/float64, and integers (identity, as PyTorch); bool is refused
//   as in PyTorch ("not implemented for 'Bool'"); round with decimals != 0: floats only;
// - sign: floats, integers and bool, same dtype; isinf/isnan: any dtype, bool output;
// - remainder/fmod: float32, float64, int64, int32, int8, uint8 (not bool, as PyTorch);
// - maximum/minimum: every dtype but float16/bfloat16; logical_xor: any dtype, bool output;
// - bitwise_and/or/xor/not: integers and bool only (PyTorch rejects floating operands);
// - elu: float32/float64.
// Anything else is NotSupported; shape errors are InvalidArgument.
#include "ir/op_registry.h"

namespace kiln {
namespace {

using Types = Result<std::vector<TensorType>>;

Error not_supported(const char* op, DType d, const char* allowed) {
  return Error(ErrorCode::NotSupported, std::string(op) + ": dtype " + dtype_name(d) + " not supported (" + allowed + ")");
}

Types one(DType dtype, std::vector<int64_t> sizes) { return std::vector<TensorType>{TensorType{dtype, std::move(sizes)}}; }

bool is_half(DType d) { return d == DType::Float16 || d == DType::BFloat16; }
bool is_integer(DType d) { return d == DType::Int64 || d == DType::Int32 || d == DType::Int8 || d == DType::UInt8; }
bool is_float(DType d) { return d == DType::Float32 || d == DType::Float64; }

/// acos, ..., log10: float32 out for float32/integer/bool input, float64 for float64.
Types infer_float_math(InputTypes in, const Attributes&) {
  const DType d = in[0]->dtype;
  if (is_half(d)) return not_supported("floating math", d, "float32, float64 or integer input");
  return one(d == DType::Float64 ? DType::Float64 : DType::Float32, in[0]->sizes);
}

/// ceil/floor/trunc/round: floats and integers keep their dtype; bool is refused (PyTorch).
/// round's `decimals` != 0 takes floats only (PyTorch: "round_cpu" not implemented for integers).
Types infer_rounding(InputTypes in, const Attributes& attrs) {
  const DType d = in[0]->dtype;
  if (attrs.get_int("decimals", 0) != 0 && !is_float(d)) {
    return not_supported("round with decimals", d, "float32, float64");
  }
  if (!is_float(d) && !is_integer(d)) return not_supported("rounding", d, "float32, float64, integers");
  return std::vector<TensorType>{*in[0]};
}

/// sign: floats, integers and bool keep their dtype.
Types infer_sign(InputTypes in, const Attributes&) {
  const DType d = in[0]->dtype;
  if (is_half(d)) return not_supported("aten.sign", d, "float32, float64, integers, bool");
  return std::vector<TensorType>{*in[0]};
}

/// isinf/isnan: any dtype, bool output.
Types infer_bool_unary(InputTypes in, const Attributes&) { return one(DType::Bool, in[0]->sizes); }

/// bitwise_not: integers and bool keep their dtype.
Types infer_bitwise_not(InputTypes in, const Attributes&) {
  const DType d = in[0]->dtype;
  if (!is_integer(d) && d != DType::Bool) return not_supported("aten.bitwise_not", d, "integers and bool only");
  return std::vector<TensorType>{*in[0]};
}

/// elu: float32/float64.
Types infer_elu(InputTypes in, const Attributes&) {
  if (!is_float(in[0]->dtype)) return not_supported("aten.elu", in[0]->dtype, "float32, float64");
  return std::vector<TensorType>{*in[0]};
}

/// atan2: true-division-like promotion: float32 for float32/integer/bool operands, float64 when
/// the promoted type is float64.
Types infer_atan2(InputTypes in, const Attributes&) {
  auto sizes = broadcast_shapes(in[0]->sizes, in[1]->sizes);
  if (!sizes.ok()) return sizes.error();
  const DType dt = result_type(*in[0], *in[1]);
  if (is_half(dt)) return not_supported("aten.atan2", dt, "float32, float64 or integer inputs");
  return one(dt == DType::Float64 ? DType::Float64 : DType::Float32, std::move(sizes.value()));
}

/// Binary ops computed in result_type(self, other): `allow` says which promoted dtypes.
enum class Allow { Numeric, Comparable, Bitwise };

template <Allow kAllow>
Types infer_promoted(InputTypes in, const Attributes&) {
  auto sizes = broadcast_shapes(in[0]->sizes, in[1]->sizes);
  if (!sizes.ok()) return sizes.error();
  const DType dt = result_type(*in[0], *in[1]);
  switch (kAllow) {
    case Allow::Numeric:  // remainder, fmod
      if (!is_float(dt) && !is_integer(dt)) return not_supported("remainder/fmod", dt, "float32, float64, integers");
      break;
    case Allow::Comparable:  // maximum, minimum
      if (is_half(dt)) return not_supported("maximum/minimum", dt, "all but float16/bfloat16");
      break;
    case Allow::Bitwise:
      if (!is_integer(dt) && dt != DType::Bool) return not_supported("bitwise op", dt, "integers and bool only");
      break;
  }
  return one(dt, std::move(sizes.value()));
}

/// logical_xor: any dtypes, bool output.
Types infer_logical_binary(InputTypes in, const Attributes&) {
  auto sizes = broadcast_shapes(in[0]->sizes, in[1]->sizes);
  if (!sizes.ok()) return sizes.error();
  return one(DType::Bool, std::move(sizes.value()));
}

}  // namespace

void register_math_ops(OpRegistry& r) {
  const std::vector<TensorArgSpec> unary = {{"self"}};
  const std::vector<TensorArgSpec> binary = {{"self"}, {"other"}};

  struct Doc { const char* name; const char* doc; };
  for (const Doc& m : {Doc{"aten.acos", "arccosine, NaN outside [-1, 1] (torch.acos)"},
                       Doc{"aten.acosh", "inverse hyperbolic cosine, NaN below 1 (torch.acosh)"},
                       Doc{"aten.asin", "arcsine, NaN outside [-1, 1] (torch.asin)"},
                       Doc{"aten.asinh", "inverse hyperbolic sine (torch.asinh)"},
                       Doc{"aten.atan", "arctangent (torch.atan)"},
                       Doc{"aten.atanh", "inverse hyperbolic tangent, +-inf at +-1 (torch.atanh)"},
                       Doc{"aten.cosh", "hyperbolic cosine (torch.cosh)"}, Doc{"aten.sinh", "hyperbolic sine (torch.sinh)"},
                       Doc{"aten.tan", "tangent, radians (torch.tan)"},
                       Doc{"aten.expm1", "exp(self) - 1, accurate near 0 (torch.expm1)"},
                       Doc{"aten.log1p", "log(1 + self), accurate near 0 (torch.log1p)"},
                       Doc{"aten.log2", "base-2 log (torch.log2)"}, Doc{"aten.log10", "base-10 log (torch.log10)"}}) {
    r.add({m.name, unary, {}, 1, infer_float_math, m.doc});
  }
  r.add({"aten.ceil", unary, {}, 1, infer_rounding, "smallest integer >= self; integers unchanged (torch.ceil)"});
  r.add({"aten.floor", unary, {}, 1, infer_rounding, "largest integer <= self; integers unchanged (torch.floor)"});
  r.add({"aten.trunc", unary, {}, 1, infer_rounding, "self rounded toward zero; integers unchanged (torch.trunc)"});
  r.add({"aten.round", unary, {{"decimals", AttrKind::Int, int64_t{0}}}, 1, infer_rounding,
         "round half to even at `decimals` decimal digits (nearbyint(self * 10^d) / 10^d; d < 0: "
         "nearbyint(self / 10^-d) * 10^-d); integers unchanged (torch.round)"});
  r.add({"aten.sign", unary, {}, 1, infer_sign,
         "(0 < self) - (self < 0): -1, 0 or 1; sign(NaN) = 0 and sign(-0.0) = +0.0 as PyTorch's CPU kernel (torch.sign)"});
  r.add({"aten.isinf", unary, {}, 1, infer_bool_unary, "self is +inf or -inf, bool output (torch.isinf)"});
  r.add({"aten.isnan", unary, {}, 1, infer_bool_unary, "self != self, bool output (torch.isnan)"});
  r.add({"aten.bitwise_not", unary, {}, 1, infer_bitwise_not, "~self: bitwise NOT of integers, logical NOT of bool (torch.bitwise_not)"});
  r.add({"aten.elu", unary,
         {{"alpha", AttrKind::Float, 1.0}, {"scale", AttrKind::Float, 1.0}, {"input_scale", AttrKind::Float, 1.0}}, 1,
         infer_elu,
         "self > 0 ? scale * self : alpha * scale * expm1(input_scale * self) (torch.nn.functional.elu)"});

  r.add({"aten.atan2", binary, {}, 1, infer_atan2, "arctangent of self / other in (-pi, pi], C99 atan2 (torch.atan2)"});
  r.add({"aten.remainder", binary, {}, 1, infer_promoted<Allow::Numeric>,
         "self - floor(self / other) * other: result has the divisor's sign (Python %); integer division "
         "by zero is an error (torch.remainder)"});
  r.add({"aten.fmod", binary, {}, 1, infer_promoted<Allow::Numeric>,
         "C fmod: result has the dividend's sign; integer division by zero is an error (torch.fmod)"});
  r.add({"aten.maximum", binary, {}, 1, infer_promoted<Allow::Comparable>,
         "elementwise max, NaN propagates (torch.maximum)"});
  r.add({"aten.minimum", binary, {}, 1, infer_promoted<Allow::Comparable>,
         "elementwise min, NaN propagates (torch.minimum)"});
  r.add({"aten.logical_xor", binary, {}, 1, infer_logical_binary, "bool(self) != bool(other) (torch.logical_xor)"});
  r.add({"aten.bitwise_and", binary, {}, 1, infer_promoted<Allow::Bitwise>, "self & other, integers and bool (torch.bitwise_and)"});
  r.add({"aten.bitwise_or", binary, {}, 1, infer_promoted<Allow::Bitwise>, "self | other, integers and bool (torch.bitwise_or)"});
  r.add({"aten.bitwise_xor", binary, {}, 1, infer_promoted<Allow::Bitwise>, "self ^ other, integers and bool (torch.bitwise_xor)"});
}

}  // namespace kiln

// Elementwise op definitions (docs/op-set.md, family "elementwise"): arithmetic with
// broadcasting and type promotion, unary math and activations, comparisons, logical ops,
// where, dtype conversion and clone. Kernels: src/kernels/portable/elementwise.cpp.
//
// Dtype rules (PyTorch's, restricted to what the portable kernels implement):
// - binary ops broadcast NumPy-style and compute in result_type(self, other) (PyTorch's type
//   promotion, where 0-d tensors weigh less: ir/op_registry.h);
// - arithmetic (add, sub, mul, div with rounding, neg, abs, relu) on float32, float64, int64, int32;
// - pow on floats and integers (integer powers wrap around, as PyTorch's);
// - floating math (exp, log, ..., sigmoid, tanh, true division) outputs float32 and takes
//   float32 or integer/bool inputs (PyTorch promotes integers to the default float dtype), or
//   float64 -> float64;
// - activations with float attributes (silu, gelu, hardswish, hardtanh, clamp, ...) float32, float64;
// - comparisons on every dtype but float16/bfloat16, bool output; logical ops on any dtype;
// - where (bool condition), _to_copy and clone on all 9 dtypes.
// Anything else is NotSupported; bad attribute values and shapes are InvalidArgument.
#include <cmath>

#include "ir/op_registry.h"

namespace kiln {
namespace {

using Types = Result<std::vector<TensorType>>;

bool is_arith(DType d) {
  return d == DType::Float32 || d == DType::Float64 || d == DType::Int64 || d == DType::Int32;
}

Error not_supported(DType d, const char* allowed) {
  return Error(ErrorCode::NotSupported, std::string("dtype ") + dtype_name(d) + " not supported (" + allowed + ")");
}

Types one(DType dtype, std::vector<int64_t> sizes) {
  return std::vector<TensorType>{TensorType{dtype, std::move(sizes)}};
}

/// Broadcast shape of self and other (InvalidArgument when incompatible).
Result<std::vector<int64_t>> broadcast2(InputTypes in) { return broadcast_shapes(in[0]->sizes, in[1]->sizes); }

// ---- binary ----

/// add/sub/mul: promoted dtype in {float32, int64, int32}. For integer results `alpha` (add,
/// sub) must be integral, as PyTorch requires ("For integral input tensors, argument alpha
/// must not be a floating point number"), and fit the result dtype ("value cannot be converted
/// to type int without overflow").
Types infer_arith_binary(InputTypes in, const Attributes& attrs) {
  auto sizes = broadcast2(in);
  if (!sizes.ok()) return sizes.error();
  const DType dt = result_type(*in[0], *in[1]);
  if (!is_arith(dt)) return not_supported(dt, "float32, float64, int64, int32");
  if (attrs.has("alpha") && !is_floating(dt)) {
    const double alpha = attrs.get_float("alpha", 1.0);
    const double limit = dt == DType::Int32 ? 2147483648.0 : 9223372036854775808.0;  // 2^31, 2^63
    if (!(std::trunc(alpha) == alpha && alpha >= -limit && alpha < limit)) {
      return Error(ErrorCode::InvalidArgument, "alpha " + attr_to_string(*attrs.find("alpha")) + " must be an integer in " +
                                                   "range of " + dtype_name(dt) + " for integer tensors");
    }
  }
  return one(dt, std::move(sizes.value()));
}

/// sub: as add, but PyTorch rejects bool operands ("Subtraction, the `-` operator, with a bool
/// tensor is not supported").
Types infer_sub(InputTypes in, const Attributes& attrs) {
  if (in[0]->dtype == DType::Bool || in[1]->dtype == DType::Bool) {
    return Error(ErrorCode::InvalidArgument, "subtraction with a bool tensor is not supported");
  }
  return infer_arith_binary(in, attrs);
}

/// div: rounding_mode None -> true division, float32 output (integer inputs promoted; float64
/// inputs give float64);
/// "trunc"/"floor" -> promoted dtype in {float32, int64, int32}.
Types infer_div(InputTypes in, const Attributes& attrs) {
  auto sizes = broadcast2(in);
  if (!sizes.ok()) return sizes.error();
  const DType dt = result_type(*in[0], *in[1]);
  if (attrs.is_none("rounding_mode")) {
    if (dt == DType::Float16 || dt == DType::BFloat16) return not_supported(dt, "float32, float64 or integer inputs");
    return one(dt == DType::Float64 ? DType::Float64 : DType::Float32, std::move(sizes.value()));
  }
  const std::string mode = attrs.get_string("rounding_mode");
  if (mode != "trunc" && mode != "floor") {
    return Error(ErrorCode::InvalidArgument, "rounding_mode must be None, 'trunc' or 'floor', got '" + mode + "'");
  }
  if (!is_arith(dt)) return not_supported(dt, "float32, float64, int64, int32");
  return one(dt, std::move(sizes.value()));
}

/// pow: result_type(self, exponent) in {float32, float64, int64, int32, int8, uint8}; bool is
/// refused as in PyTorch ("pow" not implemented for 'Bool').
Types infer_pow(InputTypes in, const Attributes&) {
  auto sizes = broadcast2(in);
  if (!sizes.ok()) return sizes.error();
  const DType dt = result_type(*in[0], *in[1]);
  if (!is_arith(dt) && dt != DType::Int8 && dt != DType::UInt8) {
    return not_supported(dt, "float32, float64, int64, int32, int8, uint8");
  }
  return one(dt, std::move(sizes.value()));
}

/// eq/ne/lt/le/gt/ge: compared in the promoted dtype (not float16/bfloat16); bool output.
Types infer_compare(InputTypes in, const Attributes&) {
  auto sizes = broadcast2(in);
  if (!sizes.ok()) return sizes.error();
  const DType dt = result_type(*in[0], *in[1]);
  if (dt == DType::Float16 || dt == DType::BFloat16) return not_supported(dt, "all but float16/bfloat16");
  return one(DType::Bool, std::move(sizes.value()));
}

/// logical_and/or: any dtypes, bool output.
Types infer_logical_binary(InputTypes in, const Attributes&) {
  auto sizes = broadcast2(in);
  if (!sizes.ok()) return sizes.error();
  return one(DType::Bool, std::move(sizes.value()));
}

/// where(condition, self, other): condition bool; output result_type(self, other), any dtype;
/// shape: the broadcast of all three.
Types infer_where(InputTypes in, const Attributes&) {
  if (in[0]->dtype != DType::Bool) {
    return Error(ErrorCode::NotSupported, std::string("condition must be bool, got ") + dtype_name(in[0]->dtype));
  }
  auto so = broadcast_shapes(in[1]->sizes, in[2]->sizes);
  if (!so.ok()) return so.error();
  auto sizes = broadcast_shapes(in[0]->sizes, so.value());
  if (!sizes.ok()) return sizes.error();
  return one(result_type(*in[1], *in[2]), std::move(sizes.value()));
}

// ---- unary ----

/// neg/abs/relu: same dtype, float32/int64/int32.
Types infer_arith_unary(InputTypes in, const Attributes&) {
  if (!is_arith(in[0]->dtype)) return not_supported(in[0]->dtype, "float32, float64, int64, int32");
  return std::vector<TensorType>{*in[0]};
}

/// exp/log/sqrt/rsqrt/reciprocal/erf/sin/cos/sigmoid/tanh: float32 output for a float32 or
/// integer/bool input (promoted to float32 as in PyTorch); float64 output for a float64 input.
Types infer_float_math(InputTypes in, const Attributes&) {
  const DType d = in[0]->dtype;
  if (d == DType::Float16 || d == DType::BFloat16) return not_supported(d, "float32, float64 or integer input");
  return one(d == DType::Float64 ? DType::Float64 : DType::Float32, in[0]->sizes);
}

/// Activations defined on floats only (silu, hardswish, hardsigmoid, leaky_relu): float32, float64.
Types infer_float_only(InputTypes in, const Attributes&) {
  if (in[0]->dtype != DType::Float32 && in[0]->dtype != DType::Float64) return not_supported(in[0]->dtype, "float32, float64");
  return std::vector<TensorType>{*in[0]};
}

Types infer_gelu(InputTypes in, const Attributes& attrs) {
  const std::string mode = attrs.get_string("approximate", "none");
  if (mode != "none" && mode != "tanh") {
    return Error(ErrorCode::InvalidArgument, "approximate must be 'none' or 'tanh', got '" + mode + "'");
  }
  return infer_float_only(in, attrs);
}

Types infer_clamp(InputTypes in, const Attributes& attrs) {
  if (attrs.is_none("min") && attrs.is_none("max")) {
    return Error(ErrorCode::InvalidArgument, "at least one of 'min' or 'max' must not be None");
  }
  return infer_float_only(in, attrs);
}

/// logical_not: any dtype, bool output.
Types infer_logical_not(InputTypes in, const Attributes&) { return one(DType::Bool, in[0]->sizes); }

/// _to_copy: output dtype from the `dtype` attribute (a Kiln dtype name; None keeps it).
Types infer_to_copy(InputTypes in, const Attributes& attrs) {
  if (attrs.is_none("dtype")) return std::vector<TensorType>{*in[0]};
  const std::string name = attrs.get_string("dtype");
  const auto dt = dtype_from_name(name);
  if (!dt) return Error(ErrorCode::InvalidArgument, "unknown dtype '" + name + "'");
  return one(*dt, in[0]->sizes);
}

/// clone: same type, any dtype.
Types infer_same(InputTypes in, const Attributes&) { return std::vector<TensorType>{*in[0]}; }

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  const std::vector<TensorArgSpec> unary = {{"self"}};
  const std::vector<TensorArgSpec> binary = {{"self"}, {"other"}};
  const AttrSpec alpha{"alpha", AttrKind::Float, 1.0};

  r.add({"aten.add", binary, {alpha}, 1, infer_arith_binary, "self + alpha * other, with broadcasting (torch.add)"});
  r.add({"aten.sub", binary, {alpha}, 1, infer_sub, "self - alpha * other, with broadcasting (torch.sub)"});
  r.add({"aten.mul", binary, {}, 1, infer_arith_binary, "self * other, with broadcasting (torch.mul)"});
  r.add({"aten.div", binary, {{"rounding_mode", AttrKind::String, {}, false, true}}, 1, infer_div,
         "self / other; rounding_mode None (true division, float result), 'trunc' or 'floor' (torch.div)"});
  r.add({"aten.pow", {{"self"}, {"exponent"}}, {}, 1, infer_pow,
         "self ** exponent; integers: exact with wrap-around, negative exponents give 0 (1 and -1 excepted) (torch.pow)"});

  r.add({"aten.neg", unary, {}, 1, infer_arith_unary, "-self (torch.neg)"});
  r.add({"aten.abs", unary, {}, 1, infer_arith_unary, "|self| (torch.abs)"});
  r.add({"aten.relu", unary, {}, 1, infer_arith_unary, "max(self, 0), NaN propagates (torch.relu)"});

  struct Math { const char* name; const char* doc; };
  for (const Math& m : {Math{"aten.exp", "e ** self (torch.exp)"}, Math{"aten.log", "natural log (torch.log)"},
                        Math{"aten.sqrt", "square root (torch.sqrt)"}, Math{"aten.rsqrt", "1 / sqrt(self) (torch.rsqrt)"},
                        Math{"aten.reciprocal", "1 / self (torch.reciprocal)"}, Math{"aten.erf", "error function (torch.erf)"},
                        Math{"aten.sin", "sine, radians (torch.sin)"}, Math{"aten.cos", "cosine, radians (torch.cos)"},
                        Math{"aten.sigmoid", "1 / (1 + exp(-self)) (torch.sigmoid)"},
                        Math{"aten.tanh", "hyperbolic tangent (torch.tanh)"}}) {
    r.add({m.name, unary, {}, 1, infer_float_math, m.doc});
  }

  r.add({"aten.silu", unary, {}, 1, infer_float_only, "self * sigmoid(self) (torch.nn.functional.silu)"});
  r.add({"aten.hardswish", unary, {}, 1, infer_float_only,
         "self * relu6(self + 3) / 6 (torch.nn.functional.hardswish)"});
  r.add({"aten.hardsigmoid", unary, {}, 1, infer_float_only, "relu6(self + 3) / 6 (torch.nn.functional.hardsigmoid)"});
  r.add({"aten.hardtanh", unary, {{"min_val", AttrKind::Float, -1.0}, {"max_val", AttrKind::Float, 1.0}}, 1,
         infer_float_only, "clamp(self, min_val, max_val) (torch.nn.functional.hardtanh)"});
  r.add({"aten.leaky_relu", unary, {{"negative_slope", AttrKind::Float, 0.01}}, 1, infer_float_only,
         "self > 0 ? self : negative_slope * self (torch.nn.functional.leaky_relu)"});
  r.add({"aten.gelu", unary, {{"approximate", AttrKind::String, std::string("none")}}, 1, infer_gelu,
         "self * Phi(self); approximate 'tanh' uses the tanh formula (torch.nn.functional.gelu)"});
  r.add({"aten.clamp", unary,
         {{"min", AttrKind::Float, {}, false, true}, {"max", AttrKind::Float, {}, false, true}}, 1, infer_clamp,
         "min(max(self, min), max), either bound may be None (torch.clamp)"});

  r.add({"aten.where", {{"condition"}, {"self"}, {"other"}}, {}, 1, infer_where,
         "condition ? self : other, broadcasting all three (torch.where)"});
  for (const char* name : {"aten.eq", "aten.ne", "aten.lt", "aten.le", "aten.gt", "aten.ge"}) {
    r.add({name, binary, {}, 1, infer_compare, "elementwise comparison, bool output (torch.eq, ...)"});
  }
  r.add({"aten.logical_not", unary, {}, 1, infer_logical_not, "self == 0, bool output (torch.logical_not)"});
  r.add({"aten.logical_and", binary, {}, 1, infer_logical_binary, "bool(self) and bool(other) (torch.logical_and)"});
  r.add({"aten.logical_or", binary, {}, 1, infer_logical_binary, "bool(self) or bool(other) (torch.logical_or)"});
  r.add({"aten._to_copy", unary, {{"dtype", AttrKind::String, {}, false, true}}, 1, infer_to_copy,
         "self converted to dtype (Tensor.to(dtype)): float->int truncates, ->bool is != 0"});
  r.add({"aten.clone", unary, {}, 1, infer_same, "a copy of self (torch.clone)"});
}

}  // namespace kiln

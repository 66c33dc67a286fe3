// The mlx delegate's lowerings of the elementwise math family (src/ir/ops/math.cpp): inverse and
// hyperbolic trigonometry, expm1/log1p/log2/log10, rounding, sign, isinf/isnan, atan2,
// remainder/fmod, maximum/minimum, logical_xor, bitwise ops and elu, each with MLX primitives
// and PyTorch's semantics (checked against MLX 0.32 on its CPU device: round is half to even,
// sign(NaN) = 0, maximum/minimum propagate NaN from either operand, remainder takes the
// divisor's sign with the same fmod-then-add formula as ATen's remainder_kernel).
//
// Mixed-dtype operands are converted to the output's (PyTorch-promoted) dtype first, so MLX's own
// promotion never decides a result type. Integer division by zero (remainder, fmod) divides by a
// safe 1 instead and raises a runtime check (execute: InvalidArgument naming the op).
#include <cmath>
#include <string>

#include "backends/mlx/mlx_ops.h"
#include "ir/op_registry.h"

namespace kiln::mlxb {
namespace {

bool is_integer(DType d) { return d == DType::Int64 || d == DType::Int32 || d == DType::Int8 || d == DType::UInt8; }
bool is_half(DType d) { return d == DType::Float16 || d == DType::BFloat16; }

/// Input i converted to the output's dtype (the compute dtype for float32).
mx::array as_out(BuildCtx& c, const NodeView& n, const Inputs& in, size_t i) {
  return mx::astype(*in[i], c.dtype(n.out.dtype), c.dev);
}

mx::array scalar_like(double v, const mx::array& x) { return mx::array(static_cast<float>(v), x.dtype()); }

/// Floating unary math: float32 input, or an integer/bool input promoted to float32 (PyTorch).
Error check_float_math(const NodeView& n) {
  const DType d = n.in[0]->dtype;
  if (d != DType::Float32 && !is_integer(d) && d != DType::Bool) {
    return no(std::string("input is ") + dtype_name(d) + " (lowered for float32 and integer inputs)");
  }
  return {};
}
template <mx::array (*F)(const mx::array&, mx::StreamOrDevice)>
mx::array float_math(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  return F(as_out(c, n, in, 0), c.dev);
}

/// Every input float32 (elu).
Error check_float32(const NodeView& n) {
  for (const auto& t : n.in) {
    if (t && t->dtype != DType::Float32) return no(std::string("input is ") + dtype_name(t->dtype) + " (lowered for float32 only)");
  }
  return {};
}

// elu: x <= 0 ? expm1(x * input_scale) * (alpha * scale) : x * scale (Activation.cpp elu_kernel).
mx::array elu(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const mx::array& x = *in[0];
  const float alpha = static_cast<float>(n.attrs.get_float("alpha", 1.0));
  const float scale = static_cast<float>(n.attrs.get_float("scale", 1.0));
  const float input_scale = static_cast<float>(n.attrs.get_float("input_scale", 1.0));
  mx::array neg = mx::multiply(mx::expm1(mx::multiply(x, scalar_like(input_scale, x), c.dev), c.dev),
                               scalar_like(alpha * scale, x), c.dev);
  return mx::where(mx::less_equal(x, scalar_like(0, x), c.dev), neg, mx::multiply(x, scalar_like(scale, x), c.dev), c.dev);
}

/// ceil/floor/trunc/round: float32 or integers (identity); the registry refuses the rest.
Error check_rounding(const NodeView& n) {
  const DType d = n.in[0]->dtype;
  if (d != DType::Float32 && !is_integer(d)) return no(std::string("input is ") + dtype_name(d));
  return {};
}
template <mx::array (*F)(const mx::array&, mx::StreamOrDevice)>
mx::array rounding(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  if (is_integer(n.out.dtype)) return *in[0];
  return F(*in[0], c.dev);
}
// round(x, decimals) as ATen's round_decimals_kernel: p = 10^|d| in the compute type;
// d > 0: nearbyint(x * p) / p, d < 0: nearbyint(x / p) * p (mx::round(.., 0) is half to even).
mx::array round_decimals(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const mx::array& x = *in[0];
  if (is_integer(n.out.dtype)) return x;
  const int64_t d = n.attrs.get_int("decimals", 0);
  if (d == 0) return mx::round(x, 0, c.dev);
  // |d| in double: -d overflows for d = INT64_MIN (attributes come from an untrusted payload).
  const mx::array p = scalar_like(static_cast<float>(std::pow(10.0, std::fabs(static_cast<double>(d)))), x);
  if (d > 0) return mx::divide(mx::round(mx::multiply(x, p, c.dev), 0, c.dev), p, c.dev);
  return mx::multiply(mx::round(mx::divide(x, p, c.dev), 0, c.dev), p, c.dev);
}

Error any_input(const NodeView&) { return {}; }
Error check_not_half(const NodeView& n) {
  for (const auto& t : n.in) {
    if (t && is_half(t->dtype)) return no("half-precision inputs are not lowered");
  }
  return {};
}
// sign: (0 < x) - (x < 0) with sign(NaN) = 0 (mx::sign does the same); bool unchanged.
mx::array sign(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  if (n.out.dtype == DType::Bool) return *in[0];
  return mx::sign(*in[0], c.dev);
}
template <mx::array (*F)(const mx::array&, mx::StreamOrDevice)>
mx::array bool_unary(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return F(*in[0], c.dev);
}

/// Binary ops: inputs may be any non-half dtype that Kiln's inference accepted.
template <mx::array (*F)(const mx::array&, const mx::array&, mx::StreamOrDevice)>
mx::array promoted_binary(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  return F(as_out(c, n, in, 0), as_out(c, n, in, 1), c.dev);
}

// maximum/minimum: MLX's propagate NaN from either operand like ATen; bool: or / and.
mx::array maximum(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  if (n.out.dtype == DType::Bool) return mx::logical_or(*in[0], *in[1], c.dev);
  return mx::maximum(as_out(c, n, in, 0), as_out(c, n, in, 1), c.dev);
}
mx::array minimum(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  if (n.out.dtype == DType::Bool) return mx::logical_and(*in[0], *in[1], c.dev);
  return mx::minimum(as_out(c, n, in, 0), as_out(c, n, in, 1), c.dev);
}

mx::array logical_xor(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return mx::not_equal(mx::astype(*in[0], mx::bool_, c.dev), mx::astype(*in[1], mx::bool_, c.dev), c.dev);
}
mx::array bitwise_not(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  if (n.out.dtype == DType::Bool) return mx::logical_not(*in[0], c.dev);
  return mx::bitwise_invert(*in[0], c.dev);
}

/// remainder: floats and integers; fmod: integers only (MLX has no fmod, and remainder - divisor
/// is not exact for floats).
Error check_remainder(const NodeView& n) { return check_not_half(n); }
Error check_fmod(const NodeView& n) {
  if (!is_integer(n.out.dtype)) return no("fmod of floating tensors is not lowered (MLX has no fmod primitive)");
  return {};
}

/// The integer divisor with 0 (an error, reported by a runtime check) and, for signed types, -1
/// (x % -1 = 0 = x % 1; INT_MIN % -1 traps in C) replaced by 1.
mx::array safe_divisor(BuildCtx& c, const NodeView& n, const mx::array& y) {
  const auto dt = y.dtype();
  mx::array zero = mx::equal(y, mx::array(0, dt), c.dev);
  c.checks->push_back({mx::any(zero, false, c.dev), n.op + ": integer division by zero (PyTorch raises ZeroDivisionError)"});
  mx::array bad = zero;
  if (n.out.dtype != DType::UInt8) bad = mx::logical_or(zero, mx::equal(y, mx::array(-1, dt), c.dev), c.dev);
  return mx::where(bad, mx::array(1, dt), y, c.dev);
}

// remainder: Python-style (the divisor's sign), mx::remainder (same formula as ATen).
mx::array remainder(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  mx::array x = as_out(c, n, in, 0), y = as_out(c, n, in, 1);
  if (is_integer(n.out.dtype)) y = safe_divisor(c, n, y);
  return mx::remainder(x, y, c.dev);
}
// fmod (integers): r = remainder(x, y) has y's sign; fmod has x's: r - y where r != 0 and the
// signs of r and x differ (exact for integers: |r - y| < |y|).
mx::array fmod(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  mx::array x = as_out(c, n, in, 0), y = safe_divisor(c, n, as_out(c, n, in, 1));
  mx::array r = mx::remainder(x, y, c.dev);
  if (n.out.dtype == DType::UInt8) return r;
  const auto dt = r.dtype();
  mx::array zero = mx::array(0, dt);
  mx::array fix = mx::logical_and(mx::not_equal(r, zero, c.dev),
                                  mx::not_equal(mx::less(r, zero, c.dev), mx::less(x, zero, c.dev), c.dev), c.dev);
  return mx::where(fix, mx::subtract(r, y, c.dev), r, c.dev);
}

}  // namespace

std::map<std::string, OpLowering, std::less<>>* add_math_lowerings(std::map<std::string, OpLowering, std::less<>>* t) {
  auto& m = *t;
  m["aten.acos"] = {check_float_math, float_math<mx::arccos>};
  m["aten.acosh"] = {check_float_math, float_math<mx::arccosh>};
  m["aten.asin"] = {check_float_math, float_math<mx::arcsin>};
  m["aten.asinh"] = {check_float_math, float_math<mx::arcsinh>};
  m["aten.atan"] = {check_float_math, float_math<mx::arctan>};
  m["aten.atanh"] = {check_float_math, float_math<mx::arctanh>};
  m["aten.cosh"] = {check_float_math, float_math<mx::cosh>};
  m["aten.sinh"] = {check_float_math, float_math<mx::sinh>};
  m["aten.tan"] = {check_float_math, float_math<mx::tan>};
  m["aten.expm1"] = {check_float_math, float_math<mx::expm1>};
  m["aten.log1p"] = {check_float_math, float_math<mx::log1p>};
  m["aten.log2"] = {check_float_math, float_math<mx::log2>};
  m["aten.log10"] = {check_float_math, float_math<mx::log10>};
  m["aten.elu"] = {check_float32, elu};
  m["aten.ceil"] = {check_rounding, rounding<mx::ceil>};
  m["aten.floor"] = {check_rounding, rounding<mx::floor>};
  m["aten.trunc"] = {check_rounding, rounding<mx::trunc>};
  m["aten.round"] = {check_rounding, round_decimals};
  m["aten.sign"] = {check_not_half, sign};
  m["aten.isinf"] = {check_not_half, bool_unary<mx::isinf>};
  m["aten.isnan"] = {check_not_half, bool_unary<mx::isnan>};
  m["aten.atan2"] = {check_not_half, promoted_binary<mx::arctan2>};
  m["aten.remainder"] = {check_remainder, remainder};
  m["aten.fmod"] = {check_fmod, fmod};
  m["aten.maximum"] = {check_not_half, maximum};
  m["aten.minimum"] = {check_not_half, minimum};
  m["aten.logical_xor"] = {any_input, logical_xor};
  m["aten.bitwise_and"] = {check_not_half, promoted_binary<mx::bitwise_and>};
  m["aten.bitwise_or"] = {check_not_half, promoted_binary<mx::bitwise_or>};
  m["aten.bitwise_xor"] = {check_not_half, promoted_binary<mx::bitwise_xor>};
  m["aten.bitwise_not"] = {check_not_half, bitwise_not};
  return t;
}

}  // namespace kiln::mlxb

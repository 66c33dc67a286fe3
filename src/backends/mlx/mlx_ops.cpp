// The mlx delegate's op table: one entry per Kiln op, check + build (+ prepare for constant-only
// work such as weight relayout). Semantics are PyTorch eager's, as defined by Kiln's op registry
// (src/ir/ops/*.cpp, docs/op-set.md); the formulas cited per op are PyTorch's.
//
// Every op is built with MLX functions given the handle's device explicitly (never the global
// default device), so programs on different devices and threads do not interfere.
#include "backends/mlx/mlx_ops.h"
#include "backends/mlx/mlx_indexing.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <numeric>

#include "ir/op_registry.h"
#include "ir/ops/conv.h"
#include "ir/ops/pool.h"
#include "ir/ops/quant.h"
#include "ir/ops/spatial_extra.h"

namespace kiln::mlxb {
namespace {

Error ok() { return {}; }

const TensorType& in_type(const NodeView& n, size_t i) { return *n.in[i]; }

/// Every present tensor input is float32 (the arithmetic ops of Kiln's op set are float32).
Error float32_inputs(const NodeView& n) {
  for (size_t i = 0; i < n.in.size(); ++i) {
    if (n.in[i] && n.in[i]->dtype != DType::Float32) {
      return no(std::string("input ") + std::to_string(i) + " is " + dtype_name(n.in[i]->dtype) +
                " (the mlx delegate lowers this op for float32 only)");
    }
  }
  return ok();
}
Error any_dtype(const NodeView&) { return ok(); }

/// add / sub / mul: float32 inputs, or integer ones (int32 / int64, e.g. a KV-cache position plus
/// an arange): MLX's integer arithmetic wraps around in two's complement as PyTorch's does, and
/// the result dtype is PyTorch's (int32 with int64 gives int64), which Kiln's inference gave.
Error arith_inputs(const NodeView& n) {
  bool ints = true;
  for (const auto& t : n.in) ints = ints && (!t || t->dtype == DType::Int64 || t->dtype == DType::Int32);
  return ints ? ok() : float32_inputs(n);
}

mx::array scalar(double v, mx::Dtype dt) { return mx::array(static_cast<float>(v), dt); }

// Param of shape [C] reshaped to broadcast over dim 1 of a rank-`rank` tensor: [C, 1, ..., 1].
mx::array channel_param(const mx::array& p, int64_t rank, mx::Device dev) {
  mx::Shape s = {static_cast<int32_t>(p.size())};
  for (int64_t i = 2; i < rank; ++i) s.push_back(1);
  return mx::reshape(p, s, dev);
}

// ---------------------------------------------------------------- elementwise

mx::array build_add_sub(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const double alpha = n.attrs.get_float("alpha", 1.0);
  mx::array b = *in[1];
  if (alpha != 1.0) {
    // Integer tensors: alpha is an integer in range (Kiln's inference checked it).
    const bool integral = b.dtype() == mx::int64 || b.dtype() == mx::int32;
    b = mx::multiply(b, integral ? mx::array(static_cast<int64_t>(alpha), b.dtype()) : scalar(alpha, b.dtype()), c.dev);
  }
  return n.op == "aten.add" ? mx::add(*in[0], b, c.dev) : mx::subtract(*in[0], b, c.dev);
}

Error check_div(const NodeView& n) {
  KILN_RETURN_IF_ERROR(float32_inputs(n));
  if (!n.attrs.is_none("rounding_mode")) {
    return no("div rounding_mode='" + n.attrs.get_string("rounding_mode") + "' is not lowered (only true division)");
  }
  return ok();
}

template <mx::array (*F)(const mx::array&, const mx::array&, mx::StreamOrDevice)>
mx::array build_binary(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return F(*in[0], *in[1], c.dev);
}
template <mx::array (*F)(const mx::array&, mx::StreamOrDevice)>
mx::array build_unary(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return F(*in[0], c.dev);
}

mx::array relu(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return mx::maximum(*in[0], scalar(0, in[0]->dtype()), c.dev);
}
// silu(x) = x * sigmoid(x) (torch.nn.functional.silu).
mx::array silu(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return mx::multiply(*in[0], mx::sigmoid(*in[0], c.dev), c.dev);
}
// relu6(x + 3) / 6 (PyTorch aten/src/ATen/native/cpu/Activation.cpp hardsigmoid_kernel).
mx::array relu6_plus3_div6(BuildCtx& c, const mx::array& x) {
  const auto dt = x.dtype();
  mx::array t = mx::add(x, scalar(3, dt), c.dev);
  t = mx::minimum(mx::maximum(t, scalar(0, dt), c.dev), scalar(6, dt), c.dev);
  return mx::divide(t, scalar(6, dt), c.dev);
}
mx::array hardsigmoid(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return relu6_plus3_div6(c, *in[0]);
}
// x * (relu6(x + 3) / 6) (hardswish_kernel's value), divided before the product so that it does
// not overflow for x > FLT_MAX / 6 (as Kiln's kernels; docs/numerics.md).
mx::array hardswish(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return mx::multiply(*in[0], relu6_plus3_div6(c, *in[0]), c.dev);
}
// min(max(x, lo), hi): PyTorch's clamp order, so lo > hi gives hi everywhere.
mx::array clamp_range(BuildCtx& c, const mx::array& x, std::optional<double> lo, std::optional<double> hi) {
  mx::array y = x;
  if (lo) y = mx::maximum(y, scalar(*lo, x.dtype()), c.dev);
  if (hi) y = mx::minimum(y, scalar(*hi, x.dtype()), c.dev);
  return y;
}
mx::array hardtanh(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  return clamp_range(c, *in[0], n.attrs.get_float("min_val", -1.0), n.attrs.get_float("max_val", 1.0));
}
mx::array clamp(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  std::optional<double> lo, hi;
  if (!n.attrs.is_none("min")) lo = n.attrs.get_float("min");
  if (!n.attrs.is_none("max")) hi = n.attrs.get_float("max");
  return clamp_range(c, *in[0], lo, hi);
}
// x > 0 ? x : x * negative_slope (leaky_relu_kernel).
mx::array leaky_relu(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& x = *in[0];
  const auto dt = x.dtype();
  return mx::where(mx::greater(x, scalar(0, dt), c.dev), x,
                   mx::multiply(x, scalar(n.attrs.get_float("negative_slope", 0.01), dt), c.dev), c.dev);
}
// erf: MLX's mx::erf has an absolute error of about 1e-7 near 0 (mlx 0.32.4, measured: erf(1e-7)
// = 0, erf(1e-6) 6% high, erf(1e-3) 3e-5 relative), so for |x| < 0.1 the Maclaurin series
// erf x = 2/sqrt(pi) (x - x^3/3 + x^5/10 - x^7/42) (Abramowitz & Stegun 7.1.5; the next term,
// x^9/216, is below 5e-11 relative there) and mx::erf elsewhere (5e-7 relative at 0.1).
mx::array erf(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  const mx::array& x = *in[0];
  const mx::Dtype dt = x.dtype();
  const double k = 2.0 / std::sqrt(std::numbers::pi);
  const mx::array x2 = mx::multiply(x, x, c.dev);
  mx::array p = mx::add(scalar(k / 10.0, dt), mx::multiply(x2, scalar(-k / 42.0, dt), c.dev), c.dev);
  p = mx::add(scalar(-k / 3.0, dt), mx::multiply(x2, p, c.dev), c.dev);
  p = mx::add(scalar(k, dt), mx::multiply(x2, p, c.dev), c.dev);
  const mx::array small = mx::less(mx::abs(x, c.dev), scalar(0.1, dt), c.dev);
  return mx::where(small, mx::multiply(x, p, c.dev), mx::erf(x, c.dev), c.dev);
}
// gelu: 0.5 x (1 + erf(x / sqrt 2)); tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// (PyTorch aten/src/ATen/native/cpu/Activation.cpp GeluKernelImpl).
Error check_gelu(const NodeView& n) {
  KILN_RETURN_IF_ERROR(float32_inputs(n));
  const std::string a = n.attrs.get_string("approximate", "none");
  if (a != "none" && a != "tanh") return no("gelu approximate='" + a + "' is not lowered");
  return ok();
}
mx::array gelu(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& x = *in[0];
  const auto dt = x.dtype();
  mx::array inner = x;
  if (n.attrs.get_string("approximate", "none") == "tanh") {
    const double k = std::sqrt(2.0 / std::numbers::pi);
    mx::array x3 = mx::multiply(mx::multiply(x, x, c.dev), x, c.dev);
    inner = mx::tanh(mx::multiply(mx::add(x, mx::multiply(x3, scalar(0.044715, dt), c.dev), c.dev), scalar(k, dt), c.dev),
                     c.dev);
  } else {
    inner = mx::erf(mx::multiply(x, scalar(1.0 / std::numbers::sqrt2, dt), c.dev), c.dev);
  }
  return mx::multiply(mx::multiply(x, scalar(0.5, dt), c.dev), mx::add(inner, scalar(1, dt), c.dev), c.dev);
}

Error check_where(const NodeView& n) {
  if (in_type(n, 0).dtype != DType::Bool) return no("where's condition is not bool");
  return ok();
}
mx::array where(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto dt = c.dtype(n.out.dtype);
  return mx::where(*in[0], mx::astype(*in[1], dt, c.dev), mx::astype(*in[2], dt, c.dev), c.dev);
}

// Comparisons: both operands in PyTorch's result type (at::result_type), bool output.
template <mx::array (*F)(const mx::array&, const mx::array&, mx::StreamOrDevice)>
mx::array compare(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto dt = c.dtype(result_type(in_type(n, 0), in_type(n, 1)));
  return F(mx::astype(*in[0], dt, c.dev), mx::astype(*in[1], dt, c.dev), c.dev);
}
Error check_compare(const NodeView& n) {
  for (size_t i = 0; i < 2; ++i) {
    if (in_type(n, i).dtype == DType::Float16 || in_type(n, i).dtype == DType::BFloat16) {
      return no("comparison of half-precision inputs is not lowered");
    }
  }
  return ok();
}
mx::array logical_not(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return mx::logical_not(mx::astype(*in[0], mx::bool_, c.dev), c.dev);
}
mx::array logical_and(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return mx::logical_and(mx::astype(*in[0], mx::bool_, c.dev), mx::astype(*in[1], mx::bool_, c.dev), c.dev);
}
mx::array logical_or(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return mx::logical_or(mx::astype(*in[0], mx::bool_, c.dev), mx::astype(*in[1], mx::bool_, c.dev), c.dev);
}
// _to_copy: a C cast per element (float -> int truncates toward zero, nonzero -> true), like
// PyTorch's CPU copy kernel.
Error check_to_copy(const NodeView& n) {
  const DType from = in_type(n, 0).dtype, to = n.out.dtype;
  if (is_floating(from) && !is_floating(to) && to != DType::Bool) {
    return no(std::string("conversion ") + dtype_name(from) + " -> " + dtype_name(to) +
              " is not lowered (out-of-range values are undefined behaviour in C, and may differ from PyTorch)");
  }
  return ok();
}
mx::array to_copy(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  return mx::astype(*in[0], c.dtype(n.out.dtype), c.dev);
}
mx::array identity(BuildCtx&, const NodeView&, const Inputs& in, const std::vector<mx::array>&) { return *in[0]; }

// ---------------------------------------------------------------- reductions

std::vector<int> reduce_axes(const NodeView& n, bool none_is_all) {
  const int64_t rank = in_type(n, 0).dim();
  std::vector<int64_t> dims;
  if (!(none_is_all && n.attrs.is_none("dim"))) dims = n.attrs.get_ints("dim");
  std::vector<int> axes;
  if (dims.empty()) {
    axes.resize(static_cast<size_t>(rank));
    std::iota(axes.begin(), axes.end(), 0);
  } else {
    for (int64_t d : dims) axes.push_back(wrap(d, rank));
  }
  return axes;
}
Error check_reduce(const NodeView& n) {
  KILN_RETURN_IF_ERROR(float32_inputs(n));
  if (in_type(n, 0).dim() == 0) return no("reduction of a 0-d tensor is not lowered");
  return ok();
}
mx::array sum_mean(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto axes = reduce_axes(n, true);
  const bool keep = n.attrs.get_bool("keepdim");
  return n.op == "aten.sum" ? mx::sum(*in[0], axes, keep, c.dev) : mx::mean(*in[0], axes, keep, c.dev);
}
mx::array amax_amin(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto axes = reduce_axes(n, false);
  const bool keep = n.attrs.get_bool("keepdim");
  return n.op == "aten.amax" ? mx::max(*in[0], axes, keep, c.dev) : mx::min(*in[0], axes, keep, c.dev);
}
/// argmax of an integer tensor (CLIP's text pooling: input_ids.argmax(-1)) is lowered without
/// MLX's argmax: the first index of the maximum, min(where(x == max(x), iota, N)), exact on every
/// device (PyTorch returns the first maximal index). Float inputs stay declined: NaN ordering would
/// need the same treatment and MLX's tie and NaN rules are not documented to match PyTorch's.
Error check_argmax(const NodeView& n) {
  const DType dt = in_type(n, 0).dtype;
  if (dt == DType::Int64 || dt == DType::Int32 || dt == DType::Int8 || dt == DType::UInt8) {
    if (in_type(n, 0).dim() == 0) return no("argmax of a 0-d tensor is not lowered");
    if (in_type(n, 0).numel() > std::numeric_limits<int32_t>::max()) return no("argmax over more than 2^31 elements");
    return ok();
  }
  KILN_RETURN_IF_ERROR(check_reduce(n));
  return no("argmax is not lowered for floating-point inputs (MLX's tie and NaN rules are not documented to "
            "match PyTorch's)");
}
// argmax(x, dim?, keepdim) = min over the axis of where(x == max(x), index, N), then the output's
// shape (dim=None: over the flattened tensor).
mx::array argmax_first(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  mx::array x = *in[0];
  int axis = 0;
  if (n.attrs.is_none("dim")) {
    x = mx::reshape(x, {-1}, c.dev);
  } else {
    axis = wrap(n.attrs.get_int("dim"), in_type(n, 0).dim());
  }
  const int32_t len = x.shape(axis);
  mx::Shape iota_shape(static_cast<size_t>(x.ndim()), 1);
  iota_shape[static_cast<size_t>(axis)] = len;
  const mx::array iota = mx::reshape(mx::arange(0, len, 1, mx::int32, c.dev), iota_shape, c.dev);
  const mx::array is_max = mx::equal(x, mx::max(x, std::vector<int>{axis}, true, c.dev), c.dev);
  const mx::array idx = mx::where(is_max, iota, mx::array(len, mx::int32), c.dev);
  const mx::array first = mx::min(idx, std::vector<int>{axis}, true, c.dev);
  return mx::reshape(mx::astype(first, c.dtype(n.out.dtype), c.dev), shape_of(n.out.sizes), c.dev);
}
mx::array softmax(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const int axis = wrap(n.attrs.get_int("dim"), in_type(n, 0).dim());
  if (n.op == "aten._softmax") return mx::softmax(*in[0], std::vector<int>{axis}, /*precise=*/true, c.dev);
  // log_softmax = (x - max) - log(sum(exp(x - max))), ATen's formula (host_softmax in
  // aten/src/ATen/native/cpu/SoftMaxKernel.cpp): x - logsumexp(x) would keep the float32 rounding
  // of logsumexp (~|max|) in outputs much smaller than it, and differs from ATen on rows holding +inf.
  const mx::array shifted = mx::subtract(*in[0], mx::max(*in[0], axis, /*keepdims=*/true, c.dev), c.dev);
  const mx::array lse = mx::log(mx::sum(mx::exp(shifted, c.dev), axis, /*keepdims=*/true, c.dev), c.dev);
  return mx::subtract(shifted, lse, c.dev);
}
Error check_softmax(const NodeView& n) {
  KILN_RETURN_IF_ERROR(float32_inputs(n));
  if (in_type(n, 0).dim() == 0) return no("softmax of a 0-d tensor is not lowered");
  return ok();
}

// ---------------------------------------------------------------- shape and data movement

mx::array reshape_to_out(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  return mx::reshape(*in[0], shape_of(n.out.sizes), c.dev);
}
mx::array permute(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  std::vector<int> axes;
  for (int64_t d : n.attrs.get_ints("dims")) axes.push_back(wrap(d, in_type(n, 0).dim()));
  return mx::transpose(*in[0], axes, c.dev);
}
mx::array transpose(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const int64_t r = in_type(n, 0).dim();
  if (r == 0) return *in[0];
  return mx::swapaxes(*in[0], wrap(n.attrs.get_int("dim0"), r), wrap(n.attrs.get_int("dim1"), r), c.dev);
}
mx::array expand(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  return mx::broadcast_to(*in[0], shape_of(n.out.sizes), c.dev);
}
// slice: [start, end) from slice_bounds (mlx_ops.h), with the step.
mx::array slice(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& t = in_type(n, 0);
  const int axis = wrap(n.attrs.get_int("dim"), t.dim());
  const int64_t size = t.sizes[static_cast<size_t>(axis)];
  const auto [start, end] = slice_bounds(n.attrs, size);
  mx::Shape lo(t.sizes.size(), 0), hi = shape_of(t.sizes), st(t.sizes.size(), 1);
  lo[axis] = static_cast<int32_t>(start);
  hi[axis] = static_cast<int32_t>(end);
  st[axis] = static_cast<int32_t>(n.attrs.get_int("step", 1));
  return mx::slice(*in[0], lo, hi, st, c.dev);
}
mx::array select(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& t = in_type(n, 0);
  const int axis = wrap(n.attrs.get_int("dim"), t.dim());
  int64_t index = n.attrs.get_int("index");
  if (index < 0) index += t.sizes[static_cast<size_t>(axis)];
  return mx::take(*in[0], static_cast<int>(index), axis, c.dev);
}
mx::array cat(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  std::vector<mx::array> parts;
  const auto dt = c.dtype(n.out.dtype);
  for (const auto& a : in) parts.push_back(mx::astype(*a, dt, c.dev));
  return mx::concatenate(parts, wrap(n.attrs.get_int("dim"), n.out.dim()), c.dev);
}
// embedding: weight[indices]. Indices are clamped into range for the gather (no out-of-bounds
// read) and an out-of-range index is reported by a runtime check (execute: InvalidArgument).
/// `idx` clamped into [0, v) as int32 for a gather, with a runtime check that reports an index
/// out of range (execute: InvalidArgument naming `op`).
mx::array checked_rows(BuildCtx& c, const mx::array& idx, int64_t v, const char* op) {
  const auto it = idx.dtype();
  mx::array bad = mx::logical_or(mx::less(idx, mx::array(0, it), c.dev),
                                 mx::greater_equal(idx, mx::array(static_cast<int64_t>(v), it), c.dev), c.dev);
  c.checks->push_back({mx::any(bad, false, c.dev),
                       std::string(op) + ": an index is out of range [0, " + std::to_string(v) + ")"});
  mx::array safe = mx::clip(idx, mx::array(0, it), mx::array(static_cast<int64_t>(v - 1), it), c.dev);
  return mx::astype(safe, mx::int32, c.dev);
}
mx::array embedding(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  return mx::take(*in[0], checked_rows(c, *in[1], in_type(n, 0).sizes[0], "aten.embedding"), 0, c.dev);
}
// constant_pad_nd: (before, after) pairs from the last dim backwards; negative pads crop.
mx::array constant_pad(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& t = in_type(n, 0);
  const auto pad = n.attrs.get_ints("pad");
  const int64_t r = t.dim();
  mx::array x = *in[0];
  mx::Shape lo(static_cast<size_t>(r), 0), hi = shape_of(t.sizes), st(static_cast<size_t>(r), 1);
  std::vector<int> axes;
  mx::Shape plo, phi;
  bool crop = false;
  for (size_t i = 0; i * 2 < pad.size(); ++i) {
    const int axis = static_cast<int>(r - 1 - static_cast<int64_t>(i));
    const int64_t b = pad[2 * i], a = pad[2 * i + 1];
    if (b < 0) lo[axis] = static_cast<int32_t>(-b), crop = true;
    if (a < 0) hi[axis] = static_cast<int32_t>(t.sizes[static_cast<size_t>(axis)] + a), crop = true;
    axes.push_back(axis);
    plo.push_back(static_cast<int32_t>(std::max<int64_t>(b, 0)));
    phi.push_back(static_cast<int32_t>(std::max<int64_t>(a, 0)));
  }
  if (crop) x = mx::slice(x, lo, hi, st, c.dev);
  return mx::pad(x, axes, plo, phi, mx::astype(scalar(n.attrs.get_float("value"), mx::float32), x.dtype(), c.dev),
                 "constant", c.dev);
}

// ---------------------------------------------------------------- convolution

// weight in MLX's layout: [C_out, k..., C_in/groups] (conv_general); transposed convolutions
// are computed as a convolution of the stride-dilated input with the flipped kernel, whose
// [C_out, k..., C_in/groups] weight regroups PyTorch's [C_in, C_out/groups, k...].
mx::array conv_weight(const mx::array& w, const ConvGeometry& g, mx::Device dev) {
  const bool two = g.spatial_dims == 2;
  if (!g.transposed) return two ? mx::transpose(w, {0, 2, 3, 1}, dev) : mx::transpose(w, {0, 2, 1}, dev);
  const int G = static_cast<int>(g.groups);
  const int cin_g = static_cast<int>(g.in_channels / g.groups), cout_g = static_cast<int>(g.out_channels / g.groups);
  const int kh = static_cast<int>(g.kernel[0]), kw = static_cast<int>(g.kernel[1]);
  if (two) {
    mx::array r = mx::reshape(w, {G, cin_g, cout_g, kh, kw}, dev);
    r = mx::transpose(r, {0, 2, 3, 4, 1}, dev);
    return mx::reshape(r, {G * cout_g, kh, kw, cin_g}, dev);
  }
  mx::array r = mx::reshape(w, {G, cin_g, cout_g, kw}, dev);
  r = mx::transpose(r, {0, 2, 3, 1}, dev);
  return mx::reshape(r, {G * cout_g, kw, cin_g}, dev);
}
// The padded extent a window reads along one dim, (out - 1) * stride + dilation * (k - 1) + 1 plus
// the padding, must fit MLX's int32 sizes (conv_by_taps and pool_pad compute it in int); in double,
// so that attributes near 2^63 cannot overflow the check itself.
Error window_fits_int32(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t dilation, int64_t pad) {
  const double extent = std::max(static_cast<double>(out - 1) * static_cast<double>(stride) +
                                     static_cast<double>(dilation) * static_cast<double>(k - 1) + 1.0,
                                 static_cast<double>(in - 1) * static_cast<double>(stride) + 1.0) +
                        2.0 * static_cast<double>(pad);
  if (extent > static_cast<double>(std::numeric_limits<int32_t>::max())) {
    return no("the window's padded extent (stride " + std::to_string(stride) + ", dilation " + std::to_string(dilation) +
              ", kernel " + std::to_string(k) + ") exceeds MLX's int32 sizes");
  }
  return ok();
}
Error check_conv(const NodeView& n) {
  KILN_RETURN_IF_ERROR(float32_inputs(n));
  auto g = conv_geometry(in_type(n, 0), in_type(n, 1), n.in[2] ? &*n.in[2] : nullptr, n.attrs);
  if (!g.ok()) return no(g.error().message());
  for (int i = 0; i < 2; ++i) {
    KILN_RETURN_IF_ERROR(window_fits_int32(g->in_size[i], g->out_size[i], g->kernel[i], g->stride[i], g->dilation[i],
                                           g->padding[i] + g->output_padding[i]));
  }
  return ok();
}
std::vector<mx::array> prepare_conv(const NodeView& n, const Inputs& consts, mx::Device dev) {
  if (!consts[1]) return {};
  auto g = conv_geometry(in_type(n, 0), in_type(n, 1), n.in[2] ? &*n.in[2] : nullptr, n.attrs);
  return {mx::contiguous(conv_weight(*consts[1], g.value(), dev), false, dev)};
}
// Convolution from strided slices, for MLX's CPU device, whose convolution is a direct loop
// (about 1 GFLOP/s for a 3x3, 64-channel layer, mlx 0.32.4): groups = 1 as im2col (the kh*kw taps
// of the padded NHWC input concatenated along channels, in the [C_out, kh, kw, C_in] weight's
// order) times the weight on MLX's BLAS matmul; depthwise (groups = C_in = C_out) as the sum of
// the taps times per-channel weights (one fused elementwise kernel). x NHWC, w [C_out, kh, kw, C_in/g].
mx::array conv_by_taps(BuildCtx& c, const mx::array& x, const mx::array& w, const ConvGeometry& g) {
  const int N = x.shape(0), C = x.shape(3), O = w.shape(0);
  const int kh = static_cast<int>(g.kernel[0]), kw = static_cast<int>(g.kernel[1]);
  const int oh = static_cast<int>(g.out_size[0]), ow = static_cast<int>(g.out_size[1]);
  const int sh = static_cast<int>(g.stride[0]), sw = static_cast<int>(g.stride[1]);
  const int dh = static_cast<int>(g.dilation[0]), dw = static_cast<int>(g.dilation[1]);
  const int ph = static_cast<int>(g.padding[0]), pw = static_cast<int>(g.padding[1]);
  std::vector<mx::array> taps;
  if (kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0) {
    taps.push_back(x);
  } else {
    const int hi_h = std::max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - (x.shape(1) + ph));
    const int hi_w = std::max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - (x.shape(2) + pw));
    mx::array xp = x;
    if (ph || pw || hi_h || hi_w) xp = mx::pad(x, {1, 2}, {ph, pw}, {hi_h, hi_w}, mx::array(0.0f, x.dtype()), "constant", c.dev);
    for (int i = 0; i < kh; ++i) {
      for (int j = 0; j < kw; ++j) {
        taps.push_back(mx::slice(xp, {0, i * dh, j * dw, 0}, {N, i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1, C},
                                 {1, sh, sw, 1}, c.dev));
      }
    }
  }
  const int kk = kh * kw;
  if (g.groups == 1) {
    mx::array cols = taps.size() == 1 ? taps[0] : mx::concatenate(taps, 3, c.dev);
    cols = mx::reshape(cols, {N * oh * ow, kk * C}, c.dev);
    mx::array y = mx::matmul(cols, mx::transpose(mx::reshape(w, {O, kk * C}, c.dev), c.dev), c.dev);
    return mx::reshape(y, {N, oh, ow, O}, c.dev);
  }
  // The taps are summed in float32 under fp16 / bf16 compute (a convolution accumulates in float32
  // on every MLX device; summing 9 bf16 products in bf16 loses 1e-2 relative).
  const mx::Dtype acc_dtype = mx::float32;
  const mx::array wt = mx::astype(mx::reshape(w, {C, kk}, c.dev), acc_dtype, c.dev);
  std::optional<mx::array> acc;
  for (int t = 0; t < kk; ++t) {
    mx::array wc = mx::reshape(mx::slice(wt, {0, t}, {C, t + 1}, c.dev), {C}, c.dev);
    mx::array term = mx::multiply(mx::astype(taps[static_cast<size_t>(t)], acc_dtype, c.dev), wc, c.dev);
    acc = acc ? mx::add(*acc, term, c.dev) : term;
  }
  return mx::astype(*acc, x.dtype(), c.dev);
}

// The convolution of geometry `g` (src/ir/ops/conv.h) of input x (Kiln's layout: [N, C, L] or
// [N, C, H, W]) with weight w already in MLX's layout (conv_weight) plus bias [C_out] if given;
// result in Kiln's layout. Shared by aten.convolution and kiln.weight_quantized_convolution.
mx::array conv_with_weight(BuildCtx& c, const mx::array& input, const mx::array& w, const std::optional<mx::array>& bias,
                           const ConvGeometry& g) {
  const bool two = g.spatial_dims == 2;
  mx::array x = two ? mx::transpose(input, {0, 2, 3, 1}, c.dev) : mx::transpose(input, {0, 2, 1}, c.dev);
  const int first = two ? 0 : 1;  // ConvGeometry describes 1-D as 2-D with H = 1
  std::vector<int> stride, pad_lo, pad_hi, dil, ones;
  std::vector<std::pair<int, int>> crop;  // transposed: output rows to drop (start, end)
  for (int d = first; d < 2; ++d) {
    dil.push_back(static_cast<int>(g.dilation[d]));
    ones.push_back(1);
    if (!g.transposed) {
      stride.push_back(static_cast<int>(g.stride[d]));
      pad_lo.push_back(static_cast<int>(g.padding[d]));
      pad_hi.push_back(static_cast<int>(g.padding[d]));
    } else {
      // PyTorch's transposed convolution = convolution of the input dilated by `stride`, padded by
      // d(k-1)-p before and d(k-1)-p+output_padding after, with the flipped kernel (negative
      // padding crops the output instead).
      stride.push_back(1);
      const int64_t span = g.dilation[d] * (g.kernel[d] - 1);
      const int64_t lo = span - g.padding[d], hi = span - g.padding[d] + g.output_padding[d];
      pad_lo.push_back(static_cast<int>(std::max<int64_t>(lo, 0)));
      pad_hi.push_back(static_cast<int>(std::max<int64_t>(hi, 0)));
      crop.push_back({static_cast<int>(std::max<int64_t>(-lo, 0)), static_cast<int>(std::max<int64_t>(-hi, 0))});
    }
  }
  std::vector<int> in_dil = g.transposed ? std::vector<int>() : ones;
  if (g.transposed) {
    for (int d = first; d < 2; ++d) in_dil.push_back(static_cast<int>(g.stride[d]));
  }
  const bool depthwise = g.groups == g.in_channels && g.out_channels == g.in_channels;
  mx::array y = two && !g.transposed && c.taps_conv && (g.groups == 1 || depthwise)
                    ? conv_by_taps(c, x, w, g)
                    : mx::conv_general(x, w, stride, pad_lo, pad_hi, dil, in_dil, static_cast<int>(g.groups),
                                       /*flip=*/g.transposed, c.dev);
  if (g.transposed) {
    bool any = false;
    for (auto& [a, b] : crop) any = any || a > 0 || b > 0;
    if (any) {
      mx::Shape lo(y.ndim(), 0), hi = y.shape(), st(y.ndim(), 1);
      for (size_t i = 0; i < crop.size(); ++i) {
        lo[1 + i] = crop[i].first;
        hi[1 + i] = y.shape(static_cast<int>(1 + i)) - crop[i].second;
      }
      y = mx::slice(y, lo, hi, st, c.dev);
    }
  }
  y = two ? mx::transpose(y, {0, 3, 1, 2}, c.dev) : mx::transpose(y, {0, 2, 1}, c.dev);
  if (bias) y = mx::add(y, channel_param(*bias, y.ndim(), c.dev), c.dev);
  return y;
}
mx::array conv(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>& prep) {
  const ConvGeometry g = conv_geometry(in_type(n, 0), in_type(n, 1), n.in[2] ? &*n.in[2] : nullptr, n.attrs).value();
  const mx::array w = prep.empty() ? conv_weight(*in[1], g, c.dev) : prep[0];
  return conv_with_weight(c, *in[0], w, in[2], g);
}

// ---------------------------------------------------------------- linear algebra

// linear: x @ w^T + b (torch.nn.functional.linear). w [N, K] in the compute dtype.
mx::array linear_with_weight(BuildCtx& c, const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias) {
  mx::array y = mx::matmul(x, mx::transpose(w, c.dev), c.dev);
  if (bias) y = mx::add(y, *bias, c.dev);
  return y;
}
mx::array linear(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return linear_with_weight(c, *in[0], *in[1], in[2]);
}

// ---------------------------------------------------------------- weight-only quantized ops
//
// kiln.weight_quantized_linear / _convolution (layout and formula: src/ir/ops/quant.h). The packed
// bytes are uploaded as they are in the file (no re-quantization or repacking at load), then:
// - 4-bit linear whose group size is 32, 64 or 128 and divides K: MLX's affine quantized_matmul.
//   MLX's affine format (mlx/ops.cpp quantize) is w = scale * u + bias with u the unsigned nibble
//   packed low bits first in little-endian uint32 words: the same bytes as Kiln's packed rows
//   (viewed as uint32), with bias = zero - 8 * scale (computed once at init).
// - everything else (8-bit, other group sizes, K not a multiple of the group size, and every
//   quantized convolution): the weight is dequantized inside the MLX graph on every call
//   (dequantize_weight) and fed to the float linear / convolution lowering above.

/// The reduction length K of a quantized node: the input's last dim (linear) or
/// C_in / groups * kH * kW (convolution).
int64_t quant_k(const NodeView& n) {
  if (n.op == "kiln.weight_quantized_linear") return n.in[0]->sizes.back();
  const auto ks = n.attrs.get_ints("kernel_size");
  return n.in[0]->sizes[1] / n.attrs.get_int("groups", 1) * ks[0] * ks[1];
}
/// The effective group size (group_size 0 or > K means one group of K columns).
int64_t quant_group(const NodeView& n, int64_t k) {
  const int64_t gs = n.attrs.get_int("group_size", 0);
  return gs == 0 || gs > k ? k : gs;
}
/// Whether the node is a 4-bit linear that MLX's quantized_matmul takes as it is.
bool fits_quantized_matmul(const NodeView& n) {
  if (n.op != "kiln.weight_quantized_linear" || n.attrs.get_int("bits", 8) != 4) return false;
  const int64_t k = quant_k(n), gs = quant_group(n, k);
  return (gs == 32 || gs == 64 || gs == 128) && k % gs == 0;
}

/// The float weight [rows, k] (compute dtype) that a packed weight encodes, built in the graph:
/// bits 8: int8 q [rows, k] -> q * s; bits 4: uint8 [rows, ceil(k / 2)], column c in byte c / 2,
/// low nibble for even c -> (u - 8) * s (+ z). Scales / zeros [rows, G], G = ceil(k / gs): each
/// broadcast over its group of gs columns (the last group cut short at k).
mx::array dequantize_weight(BuildCtx& c, const mx::array& packed, const mx::array& scales,
                            const std::optional<mx::array>& zeros, int bits, int64_t k, int64_t gs) {
  const int rows = packed.shape(0), kk = static_cast<int>(k), G = scales.shape(1), g = static_cast<int>(gs);
  const mx::Dtype dt = c.compute;
  mx::array q = packed;
  if (bits == 4) {
    const mx::array lo = mx::bitwise_and(packed, mx::array(uint8_t{15}, mx::uint8), c.dev);
    const mx::array hi = mx::right_shift(packed, mx::array(uint8_t{4}, mx::uint8), c.dev);
    q = mx::reshape(mx::stack({lo, hi}, 2, c.dev), {rows, 2 * packed.shape(1)}, c.dev);  // [rows, 2 ceil(k/2)]
    if (q.shape(1) != kk) q = mx::slice(q, {0, 0}, {rows, kk}, c.dev);
  }
  mx::array v = mx::astype(q, dt, c.dev);
  if (bits == 4) v = mx::subtract(v, mx::array(8.0f, dt), c.dev);
  // Per-column scales: [rows, G] -> [rows, G, gs] -> [rows, G gs] -> first k columns.
  auto per_column = [&](const mx::array& p) {
    mx::array a = mx::astype(p, dt, c.dev);
    if (G == 1) return a;  // [rows, 1] broadcasts over the row
    a = mx::reshape(mx::broadcast_to(mx::reshape(a, {rows, G, 1}, c.dev), {rows, G, g}, c.dev), {rows, G * g}, c.dev);
    return G * g == kk ? a : mx::slice(a, {0, 0}, {rows, kk}, c.dev);
  };
  v = mx::multiply(v, per_column(scales), c.dev);
  if (zeros) v = mx::add(v, per_column(*zeros), c.dev);
  return v;
}

// Both quantized ops: float32 input and bias; weight, scales and zeros need not be constants (the
// in-graph path reads them as inputs; quantized_matmul is used only when they are constants).
Error check_quantized(const NodeView& n) {
  if (!n.in[0] || n.in[0]->dtype != DType::Float32) return no("input is not float32");
  if (n.in[4] && n.in[4]->dtype != DType::Float32) return no("bias is not float32");
  // The weight dequantized in the graph is [rows, K] (rows, K validated by the op's inference).
  if (!fits_quantized_matmul(n) && n.in[1]->sizes[0] * quant_k(n) > (int64_t{1} << 31)) {
    return no("the dequantized weight would have more than 2^31 elements");
  }
  return ok();
}
std::vector<mx::array> prepare_quantized_linear(const NodeView& n, const Inputs& consts, mx::Device dev) {
  if (!fits_quantized_matmul(n) || !consts[1] || !consts[2] || (n.in[3] && !consts[3])) return {};
  mx::array w = mx::view(*consts[1], mx::uint32, dev);  // [N, K / 8]
  mx::array s = mx::astype(*consts[2], mx::float32, dev);
  mx::array b = mx::multiply(s, mx::array(-8.0f), dev);
  if (consts[3]) b = mx::add(b, mx::astype(*consts[3], mx::float32, dev), dev);
  return {mx::contiguous(w, false, dev), s, b};
}
mx::array quantized_linear_float_input(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>& prep,
                                       int64_t k, int64_t gs);
/// The input x [..., K] of a quantized linear with activation_bits = 8, quantized and dequantized by
/// the rule of src/ir/ops/quant.h in float32: per block of 32 columns d = max|x| / 127,
/// q = clamp(round-half-even(x / d), -127, 127) (0 where d = 0), x' = q * d (NaN through a block
/// holding an inf or NaN), returned in x's dtype. The float linear of x' is the op's integer
/// formula up to rounding, so the cpu kernels and this lowering give the same tokens.
mx::array fake_quantize_activations(BuildCtx& c, const mx::array& x) {
  mx::Shape bs = x.shape();
  const int k = bs.back();
  bs.back() = k / static_cast<int>(kActivationBlock);
  bs.push_back(static_cast<int>(kActivationBlock));
  const mx::array xb = mx::reshape(mx::astype(x, mx::float32, c.dev), bs, c.dev);
  const mx::array d = mx::divide(mx::max(mx::abs(xb, c.dev), -1, true, c.dev), mx::array(127.0f), c.dev);
  mx::array q = mx::clip(mx::round(mx::divide(xb, d, c.dev), 0, c.dev), mx::array(-127.0f), mx::array(127.0f), c.dev);
  q = mx::where(mx::greater(d, mx::array(0.0f), c.dev), q, mx::array(0.0f), c.dev);
  return mx::astype(mx::reshape(mx::multiply(q, d, c.dev), x.shape(), c.dev), x.dtype(), c.dev);
}
mx::array quantized_linear(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>& prep) {
  const int64_t k = quant_k(n), gs = quant_group(n, k);
  if (n.attrs.get_int("activation_bits", 0) == 8) {
    Inputs a8 = in;
    a8[0] = fake_quantize_activations(c, *in[0]);
    return quantized_linear_float_input(c, n, a8, prep, k, gs);
  }
  return quantized_linear_float_input(c, n, in, prep, k, gs);
}
mx::array quantized_linear_float_input(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>& prep,
                                       int64_t k, int64_t gs) {
  if (!prep.empty()) {
    mx::array y = mx::quantized_matmul(*in[0], prep.at(0), prep.at(1), prep.at(2), true, static_cast<int>(gs), 4,
                                       "affine", c.dev);
    if (in[4]) y = mx::add(y, *in[4], c.dev);
    return y;
  }
  const int bits = static_cast<int>(n.attrs.get_int("bits", 8));
  return linear_with_weight(c, *in[0], dequantize_weight(c, *in[1], *in[2], in[3], bits, k, gs), in[4]);
}
mx::array quantized_conv(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto ks = n.attrs.get_ints("kernel_size");
  const TensorType dense{DType::Float32, {n.in[1]->sizes[0], n.in[0]->sizes[1] / n.attrs.get_int("groups", 1), ks[0], ks[1]}};
  const ConvGeometry g =
      conv_geometry(in_type(n, 0), dense, n.in[4] ? &*n.in[4] : nullptr, quantized_conv_attrs(n.attrs)).value();
  const int64_t k = quant_k(n);
  mx::array w = dequantize_weight(c, *in[1], *in[2], in[3], static_cast<int>(n.attrs.get_int("bits", 8)), k,
                                  quant_group(n, k));
  w = mx::reshape(w, shape_of(dense.sizes), c.dev);  // PyTorch's [C_out, C_in/groups, kH, kW]
  return conv_with_weight(c, *in[0], conv_weight(w, g, c.dev), in[4], g);
}
// kiln.weight_quantized_embedding: the rows of the packed table, scales (and zeros) that the
// indices select are gathered first, then only those rows are dequantized (dequantize_weight), so
// a step reads one packed row per token, not the table.
mx::array quantized_embedding(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const int64_t d = n.attrs.get_int("embedding_dim", 0);
  const mx::array rows = mx::flatten(checked_rows(c, *in[0], n.in[1]->sizes[0], "kiln.weight_quantized_embedding"), c.dev);
  auto gather = [&](const mx::array& a) { return mx::take(a, rows, 0, c.dev); };
  std::optional<mx::array> zeros;
  if (in[3]) zeros = gather(*in[3]);
  const int64_t gs = n.attrs.get_int("group_size", 0);
  mx::array w = dequantize_weight(c, gather(*in[1]), gather(*in[2]), zeros, static_cast<int>(n.attrs.get_int("bits", 8)),
                                  d, gs == 0 || gs > d ? d : gs);
  return mx::reshape(w, shape_of(n.out.sizes), c.dev);
}
// addmm: beta * self + alpha * (mat1 @ mat2); beta = 0 ignores self (PyTorch's rule).
mx::array addmm(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const double alpha = n.attrs.get_float("alpha", 1.0), beta = n.attrs.get_float("beta", 1.0);
  mx::array p = mx::matmul(*in[1], *in[2], c.dev);
  if (alpha != 1.0) p = mx::multiply(p, scalar(alpha, p.dtype()), c.dev);
  if (beta == 0.0) return p;
  mx::array s = *in[0];
  if (beta != 1.0) s = mx::multiply(s, scalar(beta, s.dtype()), c.dev);
  return mx::add(s, p, c.dev);
}
mx::array matmul(BuildCtx& c, const NodeView&, const Inputs& in, const std::vector<mx::array>&) {
  return mx::matmul(*in[0], *in[1], c.dev);
}

// ---------------------------------------------------------------- normalization

// Inference batch norm: (x - mean) * scale + bias with scale = w / sqrt(var + eps) (PyTorch
// aten/src/ATen/native/Normalization.cpp). The mean is subtracted first rather than folded into one
// shift (x * scale + (b - mean * scale), PyTorch's CPU form): x - mean is exact when x is close to
// the mean (Sterbenz), while x * scale rounds at the magnitude of mean * scale and the shift then
// cancels it (x = 1000 + 0.01 randn, var 1e-4: 4e-3 absolute on outputs of ~3 in float32).
struct BnParams {
  mx::array mean, scale, bias;  // each [C, 1, ..., 1]
};
BnParams bn_params(const NodeView& n, const Inputs& p, mx::Device dev) {
  const double eps = n.attrs.get_float("eps", 1e-5);
  mx::array scale = mx::rsqrt(mx::add(*p[4], scalar(eps, mx::float32), dev), dev);
  if (p[1]) scale = mx::multiply(scale, *p[1], dev);
  mx::array bias = p[2] ? *p[2] : mx::zeros_like(scale, dev);
  const int64_t r = in_type(n, 0).dim();
  return {channel_param(*p[3], r, dev), channel_param(scale, r, dev), channel_param(bias, r, dev)};
}
std::vector<mx::array> prepare_bn(const NodeView& n, const Inputs& consts, mx::Device dev) {
  for (size_t i = 1; i < 5; ++i) {
    if (n.in[i] && !consts[i]) return {};
  }
  BnParams b = bn_params(n, consts, dev);
  return {b.mean, b.scale, b.bias};
}
mx::array batch_norm(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>& prep) {
  const BnParams b = prep.empty() ? bn_params(n, in, c.dev) : BnParams{prep[0], prep[1], prep[2]};
  // float32_inside: with a reduced compute dtype x arrives converted up and the statistics stay
  // float32 (prepared ones are not converted at init), so only x's own rounding is float16's.
  return mx::add(mx::multiply(mx::subtract(*in[0], b.mean, c.dev), b.scale, c.dev), b.bias, c.dev);
}
// x flattened to [..., M] over its trailing `k` dims.
mx::array flatten_trailing(const mx::array& x, size_t k, mx::Device dev) {
  mx::Shape s(x.shape().begin(), x.shape().end() - static_cast<long>(k));
  int32_t m = 1;
  for (size_t i = x.ndim() - k; i < x.ndim(); ++i) m *= x.shape(static_cast<int>(i));
  s.push_back(m);
  return mx::reshape(x, s, dev);
}
std::optional<mx::array> flat(const std::optional<mx::array>& p, mx::Device dev) {
  if (!p) return std::nullopt;
  return mx::reshape(*p, {-1}, dev);
}
// x minus its mean over the last axis. Where the mean is large against the spread, x - mean is
// exact in floating point (Sterbenz: the operands are within a factor 2), so the statistics of the
// result are computed from numbers of the spread's magnitude. MLX's float32 mean of values near
// 1000 is off by a few ulps of 1000 (and even a correctly rounded one by up to half an ulp,
// 3e-5), which is 3e-3 of a spread of 0.01: normalizing x directly inherits that error (issue 22:
// group_norm 0.0235 on outputs of ~3). mx::fast::layer_norm of the centred values subtracts their
// small residual mean, computed accurately, so the first mean's rounding cancels (the corrected
// two-pass scheme: Chan, Golub, LeVeque, "Algorithms for computing the sample variance", 1983).
mx::array centred_last(const mx::array& x, mx::Device dev) {
  return mx::subtract(x, mx::mean(x, -1, /*keepdims=*/true, dev), dev);
}
// layer norm over the trailing normalized_shape dims, biased variance: the trailing dims
// flattened, centred (centred_last), then MLX fast::layer_norm with weight and bias.
mx::array layer_norm(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const size_t k = n.attrs.get_ints("normalized_shape").size();
  mx::array x = centred_last(flatten_trailing(*in[0], k, c.dev), c.dev);
  mx::array y = mx::fast::layer_norm(x, flat(in[1], c.dev), flat(in[2], c.dev),
                                     static_cast<float>(n.attrs.get_float("eps", 1e-5)), c.dev);
  return mx::reshape(y, in[0]->shape(), c.dev);
}
Error check_norm(const NodeView& n) {
  KILN_RETURN_IF_ERROR(float32_inputs(n));
  if (n.op == "aten.native_layer_norm" || n.op == "aten.rms_norm") {
    if (n.attrs.get_ints("normalized_shape").empty()) return no("empty normalized_shape is not lowered");
  }
  return ok();
}
// rms norm: x / sqrt(mean(x^2) + eps) * weight; eps None = float32 epsilon (torch.rms_norm).
mx::array rms_norm(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const size_t k = n.attrs.get_ints("normalized_shape").size();
  const float eps = n.attrs.is_none("eps") ? FLT_EPSILON : static_cast<float>(n.attrs.get_float("eps"));
  mx::array x = flatten_trailing(*in[0], k, c.dev);
  mx::array y = mx::fast::rms_norm(x, flat(in[1], c.dev), eps, c.dev);
  return mx::reshape(y, in[0]->shape(), c.dev);
}
// group norm: x [N, C, *] as [N, group, C/group * HxW], centred (centred_last) and normalized over
// the last axis (biased variance), then the per-channel affine (PyTorch
// aten/src/ATen/native/group_norm.cpp). Instance norm is GroupNorm(C, C) (capture names it so).
mx::array group_norm(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const mx::array& x = *in[0];
  const int groups = static_cast<int>(n.attrs.get_int("group"));
  mx::array y = centred_last(mx::reshape(x, {x.shape(0), groups, -1}, c.dev), c.dev);
  y = mx::fast::layer_norm(y, std::nullopt, std::nullopt, static_cast<float>(n.attrs.get_float("eps", 1e-5)), c.dev);
  y = mx::reshape(y, x.shape(), c.dev);
  if (in[1]) y = mx::multiply(y, channel_param(*in[1], x.ndim(), c.dev), c.dev);
  if (in[2]) y = mx::add(y, channel_param(*in[2], x.ndim(), c.dev), c.dev);
  return y;
}

// ---------------------------------------------------------------- attention

// scaled_dot_product_attention: softmax(q k^T * scale + mask) v, scale = 1/sqrt(E) by default;
// is_causal = lower-triangular (top-left aligned) mask; bool masks keep True; enable_gqa repeats
// key/value heads (repeat_interleave). MLX's fused kernel when q/k/v are rank 4 with equal batch,
// equal head dims and a causal mask only when L == S (MLX's causal mask is bottom-right aligned);
// otherwise the explicit formula (PyTorch's math reference).
Error check_sdpa(const NodeView& n) {
  for (size_t i = 0; i < 3; ++i) {
    if (in_type(n, i).dtype != DType::Float32) return no("query/key/value must be float32");
  }
  if (n.in[3] && n.in[3]->dtype != DType::Float32 && n.in[3]->dtype != DType::Bool) {
    return no("attn_mask must be bool or float32");
  }
  return ok();
}
mx::array sdpa(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  mx::array q = *in[0], k = *in[1], v = *in[2];
  const int64_t E = in_type(n, 0).sizes.back();
  const float scale = n.attrs.is_none("scale") ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(E)))
                                                : static_cast<float>(n.attrs.get_float("scale"));
  const bool causal = n.attrs.get_bool("is_causal");
  const int L = q.shape(-2), S = k.shape(-2);
  const bool gqa = n.attrs.get_bool("enable_gqa");
  const bool rank4 = q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4;
  const bool fast_ok = rank4 && q.shape(0) == k.shape(0) && k.shape(0) == v.shape(0) && k.shape(1) == v.shape(1) &&
                       (q.shape(1) == k.shape(1) || (gqa && q.shape(1) % k.shape(1) == 0)) && q.shape(-1) == v.shape(-1) &&
                       (!causal || L == S);
  // A query row whose mask excludes every key gives 0, as PyTorch's SDPA does (its softmax
  // treats an all -inf row as all zeros), not MLX's NaN or mean of V.
  auto zero_masked_rows = [&](mx::array out) {
    if (causal || !in[3]) return out;  // a top-left causal mask always keeps key 0
    const mx::array& m = *in[3];
    mx::array keep = m.dtype() == mx::bool_ ? m : mx::greater(m, scalar(-std::numeric_limits<float>::infinity(), m.dtype()), c.dev);
    mx::array any_key = mx::any(keep, std::vector<int>{-1}, /*keepdims=*/true, c.dev);
    return mx::where(any_key, out, scalar(0.0f, out.dtype()), c.dev);
  };
  if (fast_ok) {
    if (causal) return mx::fast::scaled_dot_product_attention(q, k, v, scale, "causal", std::nullopt, {}, false, c.dev);
    if (in[3]) return zero_masked_rows(mx::fast::scaled_dot_product_attention(q, k, v, scale, "array", *in[3], {}, false, c.dev));
    return mx::fast::scaled_dot_product_attention(q, k, v, scale, "", std::nullopt, {}, false, c.dev);
  }
  if (gqa) {
    const int hq = q.shape(-3);
    if (k.shape(-3) != hq) k = mx::repeat(k, hq / k.shape(-3), static_cast<int>(k.ndim()) - 3, c.dev);
    if (v.shape(-3) != hq) v = mx::repeat(v, hq / v.shape(-3), static_cast<int>(v.ndim()) - 3, c.dev);
  }
  mx::array s = mx::matmul(mx::multiply(q, scalar(scale, q.dtype()), c.dev), mx::swapaxes(k, -1, -2, c.dev), c.dev);
  const mx::array neg_inf = scalar(-std::numeric_limits<float>::infinity(), s.dtype());
  if (causal) {
    mx::array keep = mx::greater_equal(mx::reshape(mx::arange(0, L, c.dev), {L, 1}, c.dev),
                                       mx::reshape(mx::arange(0, S, c.dev), {1, S}, c.dev), c.dev);
    s = mx::where(keep, s, neg_inf, c.dev);
  } else if (in[3]) {
    s = in[3]->dtype() == mx::bool_ ? mx::where(*in[3], s, neg_inf, c.dev) : mx::add(s, *in[3], c.dev);
  }
  return zero_masked_rows(mx::matmul(mx::softmax(s, std::vector<int>{-1}, /*precise=*/true, c.dev), v, c.dev));
}

// ---------------------------------------------------------------- pooling

// The window tap (i, j) of every output position as one strided slice of the padded input.
mx::array window_tap(const mx::array& xp, const Pool2dGeometry& g, int64_t i, int64_t j, mx::Device dev) {
  const int r = static_cast<int>(xp.ndim());
  mx::Shape lo(static_cast<size_t>(r), 0), hi = xp.shape(), st(static_cast<size_t>(r), 1);
  lo[r - 2] = static_cast<int32_t>(i * g.dilation_h);
  lo[r - 1] = static_cast<int32_t>(j * g.dilation_w);
  hi[r - 2] = static_cast<int32_t>(lo[r - 2] + (g.out_h - 1) * g.stride_h + 1);
  hi[r - 1] = static_cast<int32_t>(lo[r - 1] + (g.out_w - 1) * g.stride_w + 1);
  st[r - 2] = static_cast<int32_t>(g.stride_h);
  st[r - 1] = static_cast<int32_t>(g.stride_w);
  return mx::slice(xp, lo, hi, st, dev);
}
// Pads H, W by the pooling padding before and by what the last window needs after.
mx::array pool_pad(const mx::array& x, const Pool2dGeometry& g, float value, mx::Device dev) {
  const int r = static_cast<int>(x.ndim());
  const int64_t need_h = (g.out_h - 1) * g.stride_h + g.dilation_h * (g.kernel_h - 1) + 1;
  const int64_t need_w = (g.out_w - 1) * g.stride_w + g.dilation_w * (g.kernel_w - 1) + 1;
  const int32_t hi_h = static_cast<int32_t>(std::max<int64_t>(0, need_h - g.in_h - g.pad_h));
  const int32_t hi_w = static_cast<int32_t>(std::max<int64_t>(0, need_w - g.in_w - g.pad_w));
  if (g.pad_h == 0 && g.pad_w == 0 && hi_h == 0 && hi_w == 0) return x;
  return mx::pad(x, {r - 2, r - 1}, {static_cast<int32_t>(g.pad_h), static_cast<int32_t>(g.pad_w)}, {hi_h, hi_w},
                 mx::array(value, x.dtype()), "constant", dev);
}
Error check_pool(const NodeView& n) {
  KILN_RETURN_IF_ERROR(float32_inputs(n));
  auto g = pool2d_geometry(in_type(n, 0), n.attrs, n.op == "aten.max_pool2d");
  if (!g.ok()) return no(g.error().message());
  if (g->kernel_h * g->kernel_w > 1024) return no("pooling windows larger than 1024 elements are not lowered");
  KILN_RETURN_IF_ERROR(window_fits_int32(g->in_h, g->out_h, g->kernel_h, g->stride_h, g->dilation_h, g->pad_h));
  KILN_RETURN_IF_ERROR(window_fits_int32(g->in_w, g->out_w, g->kernel_w, g->stride_w, g->dilation_w, g->pad_w));
  return ok();
}
// max_pool2d: max over the window; padding never wins (padded with -inf).
mx::array max_pool(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const Pool2dGeometry g = pool2d_geometry(in_type(n, 0), n.attrs, true).value();
  const mx::array xp = pool_pad(*in[0], g, -std::numeric_limits<float>::infinity(), c.dev);
  std::optional<mx::array> acc;
  for (int64_t i = 0; i < g.kernel_h; ++i) {
    for (int64_t j = 0; j < g.kernel_w; ++j) {
      mx::array t = window_tap(xp, g, i, j, c.dev);
      acc = acc ? mx::maximum(*acc, t, c.dev) : t;
    }
  }
  return *acc;
}
// avg_pool2d: window sum / divisor, divisor per output position as PyTorch's avg_pool2d CPU
// kernel (aten/src/ATen/native/cpu/AvgPoolKernel.cpp): divisor_override, else the window clipped
// to the padded input (count_include_pad) or to the input.
mx::array avg_pool(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const Pool2dGeometry g = pool2d_geometry(in_type(n, 0), n.attrs, false).value();
  const mx::array xp = pool_pad(*in[0], g, 0.0f, c.dev);
  std::optional<mx::array> acc;
  for (int64_t i = 0; i < g.kernel_h; ++i) {
    for (int64_t j = 0; j < g.kernel_w; ++j) {
      mx::array t = window_tap(xp, g, i, j, c.dev);
      acc = acc ? mx::add(*acc, t, c.dev) : t;
    }
  }
  const bool include_pad = n.attrs.get_bool("count_include_pad", true);
  const bool override_div = !n.attrs.is_none("divisor_override");
  std::vector<float> div(static_cast<size_t>(g.out_h * g.out_w));
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
      int64_t h1 = std::min(h0 + g.kernel_h, g.in_h + g.pad_h), w1 = std::min(w0 + g.kernel_w, g.in_w + g.pad_w);
      const int64_t pool = (h1 - h0) * (w1 - w0);
      h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
      h1 = std::min(h1, g.in_h), w1 = std::min(w1, g.in_w);
      int64_t d = override_div ? n.attrs.get_int("divisor_override") : include_pad ? pool : (h1 - h0) * (w1 - w0);
      div[static_cast<size_t>(oh * g.out_w + ow)] = static_cast<float>(d);
    }
  }
  mx::array dv(div.begin(), {static_cast<int32_t>(g.out_h), static_cast<int32_t>(g.out_w)}, mx::float32);
  return mx::divide(*acc, mx::astype(dv, acc->dtype(), c.dev), c.dev);
}
// adaptive_avg_pool2d: window [floor(i*in/out), ceil((i+1)*in/out)) per axis (PyTorch
// aten/src/ATen/native/AdaptiveAveragePooling.cpp start_index/end_index). 1x1 -> mean; sizes
// that divide -> reshape + mean; otherwise the separable averaging matrices P_h x P_w^T.
Error check_adaptive(const NodeView& n) {
  KILN_RETURN_IF_ERROR(float32_inputs(n));
  const auto& t = in_type(n, 0);
  if (t.dim() != 3 && t.dim() != 4) return no("adaptive_avg_pool2d input must be rank 3 or 4");
  return ok();
}
mx::array averaging_matrix(int64_t in, int64_t out) {
  std::vector<float> m(static_cast<size_t>(in * out), 0.0f);
  for (int64_t i = 0; i < out; ++i) {
    const int64_t s = (i * in) / out, e = ((i + 1) * in + out - 1) / out;
    for (int64_t j = s; j < e; ++j) m[static_cast<size_t>(i * in + j)] = 1.0f / static_cast<float>(e - s);
  }
  return mx::array(m.begin(), {static_cast<int32_t>(out), static_cast<int32_t>(in)}, mx::float32);
}
mx::array adaptive_avg(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const mx::array& x = *in[0];
  const int r = static_cast<int>(x.ndim());
  const int64_t ih = x.shape(r - 2), iw = x.shape(r - 1);
  const int64_t oh = n.out.sizes[static_cast<size_t>(r - 2)], ow = n.out.sizes[static_cast<size_t>(r - 1)];
  if (ih % oh == 0 && iw % ow == 0) {
    mx::Shape s(x.shape().begin(), x.shape().end() - 2);
    s.insert(s.end(), {static_cast<int32_t>(oh), static_cast<int32_t>(ih / oh), static_cast<int32_t>(ow),
                       static_cast<int32_t>(iw / ow)});
    return mx::mean(mx::reshape(x, s, c.dev), std::vector<int>{r - 1, r + 1}, false, c.dev);
  }
  mx::array y = mx::matmul(x, mx::transpose(averaging_matrix(iw, ow), c.dev), c.dev);
  return mx::matmul(averaging_matrix(ih, oh), y, c.dev);
}

// ---------------------------------------------------------------- upsampling

// PyTorch aten/src/ATen/native/UpSample.h in float arithmetic: compute_scales_value (1/scale when
// a positive scale is given, else in/out), nearest_idx, area_pixel_compute_source_index.
float scales_value(const Attributes& a, const char* name, int64_t in, int64_t out) {
  if (!a.is_none(name) && a.get_float(name) > 0.0) return static_cast<float>(1.0 / a.get_float(name));
  return static_cast<float>(in) / static_cast<float>(out);
}
int64_t clamp_floor(float v, int64_t in) {
  const float f = std::floor(v);
  if (!(f < static_cast<float>(in - 1))) return in - 1;
  return std::max<int64_t>(0, static_cast<int64_t>(f));
}
mx::array index_array(const std::vector<int32_t>& idx) {
  return mx::array(idx.begin(), {static_cast<int32_t>(idx.size())}, mx::int32);
}
mx::array upsample_nearest(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  mx::array x = *in[0];
  const char* names[2] = {"scales_h", "scales_w"};
  for (int ax = 0; ax < 2; ++ax) {
    const int64_t isz = in_type(n, 0).sizes[static_cast<size_t>(2 + ax)], osz = n.out.sizes[static_cast<size_t>(2 + ax)];
    if (isz == osz) continue;
    std::vector<int32_t> idx(static_cast<size_t>(osz));
    const float s = scales_value(n.attrs, names[ax], isz, osz);
    for (int64_t d = 0; d < osz; ++d) {
      idx[static_cast<size_t>(d)] =
          static_cast<int32_t>(osz == 2 * isz ? d >> 1 : clamp_floor(static_cast<float>(d) * s, isz));
    }
    x = mx::take(x, index_array(idx), 2 + ax, c.dev);
  }
  return x;
}
// bilinear: per axis two taps (i0, i1) with weights (1 - l, l) (guard_index_and_lambda); W first,
// then H, which is PyTorch's h0 * (w0 x00 + w1 x01) + h1 * (w0 x10 + w1 x11).
mx::array upsample_bilinear(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  mx::array x = *in[0];
  const bool align = n.attrs.get_bool("align_corners");
  const char* names[2] = {"scales_h", "scales_w"};
  for (int ax = 1; ax >= 0; --ax) {
    const int64_t isz = in_type(n, 0).sizes[static_cast<size_t>(2 + ax)], osz = n.out.sizes[static_cast<size_t>(2 + ax)];
    if (isz == osz) continue;
    const float step = align ? (osz > 1 ? static_cast<float>(isz - 1) / static_cast<float>(osz - 1) : 0.0f)
                             : scales_value(n.attrs, names[ax], isz, osz);
    std::vector<int32_t> i0(static_cast<size_t>(osz)), i1(static_cast<size_t>(osz));
    std::vector<float> l0(static_cast<size_t>(osz)), l1(static_cast<size_t>(osz));
    for (int64_t d = 0; d < osz; ++d) {
      float src;
      if (align) {
        src = step * static_cast<float>(d);
      } else {
        src = static_cast<float>(static_cast<double>(step) * (static_cast<double>(d) + 0.5) - 0.5);
        if (src < 0.0f) src = 0.0f;
      }
      const int64_t a = clamp_floor(src, isz);
      const float lam = std::min(std::max(src - static_cast<float>(a), 0.0f), 1.0f);
      const size_t k = static_cast<size_t>(d);
      i0[k] = static_cast<int32_t>(a);
      i1[k] = static_cast<int32_t>(a < isz - 1 ? a + 1 : a);
      l0[k] = 1.0f - lam;
      l1[k] = lam;
    }
    const mx::Shape ws = ax == 1 ? mx::Shape{static_cast<int32_t>(osz)} : mx::Shape{static_cast<int32_t>(osz), 1};
    const mx::array w0(l0.begin(), ws, mx::float32), w1(l1.begin(), ws, mx::float32);
    x = mx::add(mx::multiply(mx::take(x, index_array(i0), 2 + ax, c.dev), mx::astype(w0, x.dtype(), c.dev), c.dev),
                mx::multiply(mx::take(x, index_array(i1), 2 + ax, c.dev), mx::astype(w1, x.dtype(), c.dev), c.dev),
                c.dev);
  }
  return x;
}
Error check_upsample(const NodeView& n) {
  if (in_type(n, 0).dim() != 4) return no("upsampling input must be rank 4");
  return n.op == "aten.upsample_bilinear2d" ? float32_inputs(n) : ok();
}

// ---------------------------------------------------------------- spatial (ir/ops/spatial_extra.h)

// reflection_padNd / replication_padNd: a take along each padded axis with the source index table
// of Kiln's portable kernel (reflect: |v|, then 2(size-1) - v; replicate: clamp), so any dtype,
// negative pads (crops) included, moves exactly the same elements.
Error check_pad(const NodeView& n) {
  const bool reflect = n.op.rfind("aten.reflection", 0) == 0;
  const int dims = n.op[n.op.size() - 2] - '0';  // "aten.reflection_pad2d" -> 2
  auto g = pad_geometry(in_type(n, 0), n.attrs, dims, reflect);
  if (!g.ok()) return no(g.error().message());
  return ok();
}
mx::array pad_take(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const bool reflect = n.op.rfind("aten.reflection", 0) == 0;
  const int dims = n.op[n.op.size() - 2] - '0';
  const PadGeometry g = pad_geometry(in_type(n, 0), n.attrs, dims, reflect).value();
  mx::array x = *in[0];
  const int r = static_cast<int>(x.ndim());
  for (int i = 0; i < dims; ++i) {
    std::vector<int32_t> idx(static_cast<size_t>(g.out[i]));
    for (int64_t o = 0; o < g.out[i]; ++o) {
      int64_t v = o - g.before[i];
      if (reflect) {
        if (v < 0) v = -v;
        if (v >= g.in[i]) v = 2 * (g.in[i] - 1) - v;
      } else {
        v = std::min(std::max<int64_t>(v, 0), g.in[i] - 1);
      }
      idx[static_cast<size_t>(o)] = static_cast<int32_t>(v);
    }
    x = mx::take(x, index_array(idx), r - dims + i, c.dev);
  }
  return x;
}

// grid_sampler_2d, bilinear only (nearest's ties-to-even and bicubic are declined): the portable
// kernel's float formulas (GridSampler.h unnormalize / clip / reflect; NaN clips to 0), four taps
// gathered from the flattened planes, taps outside the image read 0 and keep their weight.
Error check_grid_sampler(const NodeView& n) {
  KILN_RETURN_IF_ERROR(float32_inputs(n));
  if (n.attrs.get_int("interpolation_mode") != 0) {
    return no("grid_sampler_2d interpolation_mode " + std::to_string(n.attrs.get_int("interpolation_mode")) +
              " is not lowered (bilinear only)");
  }
  if (n.attrs.get_int("padding_mode") < 0 || n.attrs.get_int("padding_mode") > 2) return no("padding_mode out of range");
  return ok();
}
mx::array grid_coordinate(const mx::array& g, int64_t size, bool align, int64_t padding, mx::Device dev) {
  const mx::Dtype dt = g.dtype();
  auto f = [&](double v) { return scalar(v, dt); };
  mx::array v = align ? mx::multiply(mx::add(g, f(1.0), dev), f(static_cast<float>(size - 1) / 2.0f), dev)
                      : mx::subtract(mx::multiply(mx::add(g, f(1.0), dev), f(static_cast<float>(size) / 2.0f), dev),
                                     f(0.5), dev);
  auto clip = [&](const mx::array& a) {
    mx::array c = mx::minimum(f(static_cast<double>(size - 1)), mx::maximum(a, f(0.0), dev), dev);
    return mx::where(mx::isnan(a, dev), f(0.0), c, dev);
  };
  if (padding == 1) return clip(v);
  if (padding == 2) {
    const float lo = align ? 0.0f : -0.5f;
    const float span = align ? static_cast<float>(size - 1) : static_cast<float>(size);
    if (span <= 0.0f) return mx::zeros_like(v, dev);
    const mx::array e = mx::remainder(mx::abs(mx::subtract(v, f(lo), dev), dev), f(2.0f * span), dev);
    return clip(mx::add(mx::minimum(e, mx::subtract(f(2.0f * span), e, dev), dev), f(lo), dev));
  }
  return v;
}
mx::array grid_sampler(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& xt = in_type(n, 0);
  const int32_t N = static_cast<int32_t>(xt.sizes[0]), C = static_cast<int32_t>(xt.sizes[1]);
  const int64_t H = xt.sizes[2], W = xt.sizes[3];
  const int32_t OH = static_cast<int32_t>(n.out.sizes[2]), OW = static_cast<int32_t>(n.out.sizes[3]);
  const bool align = n.attrs.get_bool("align_corners");
  const int64_t padding = n.attrs.get_int("padding_mode");
  const mx::array grid = mx::reshape(*in[1], {N, 1, OH * OW, 2}, c.dev);
  const mx::array gx = mx::take(grid, mx::array(0), 3, c.dev), gy = mx::take(grid, mx::array(1), 3, c.dev);
  const mx::array fx = grid_coordinate(gx, W, align, padding, c.dev), fy = grid_coordinate(gy, H, align, padding, c.dev);
  const mx::Dtype dt = fx.dtype();
  const mx::array one = scalar(1.0, dt);
  const mx::array x0 = mx::floor(fx, c.dev), y0 = mx::floor(fy, c.dev);
  const mx::array tx = mx::subtract(fx, x0, c.dev), ty = mx::subtract(fy, y0, c.dev);
  const mx::array ux = mx::subtract(one, tx, c.dev), uy = mx::subtract(one, ty, c.dev);
  const mx::array x1 = mx::add(x0, one, c.dev), y1 = mx::add(y0, one, c.dev);
  const mx::array planes = mx::reshape(*in[0], {N, C, static_cast<int32_t>(H * W)}, c.dev);
  const mx::array xs[4] = {x0, x1, x0, x1}, ys[4] = {y0, y0, y1, y1};
  const mx::array ws[4] = {mx::multiply(uy, ux, c.dev), mx::multiply(uy, tx, c.dev), mx::multiply(ty, ux, c.dev),
                           mx::multiply(ty, tx, c.dev)};
  std::optional<mx::array> acc;
  for (int k = 0; k < 4; ++k) {
    const mx::array valid = mx::logical_and(
        mx::logical_and(mx::greater(xs[k], scalar(-1.0, dt), c.dev), mx::less(xs[k], scalar(static_cast<double>(W), dt), c.dev), c.dev),
        mx::logical_and(mx::greater(ys[k], scalar(-1.0, dt), c.dev), mx::less(ys[k], scalar(static_cast<double>(H), dt), c.dev), c.dev),
        c.dev);
    const mx::array flat = mx::add(mx::multiply(ys[k], scalar(static_cast<double>(W), dt), c.dev), xs[k], c.dev);
    const mx::array idx = mx::astype(mx::where(valid, flat, scalar(0.0, dt), c.dev), mx::int32, c.dev);
    const mx::array v = mx::take_along_axis(planes, mx::broadcast_to(idx, {N, C, OH * OW}, c.dev), 2, c.dev);
    const mx::array term = mx::multiply(mx::where(valid, v, scalar(0.0, v.dtype()), c.dev), ws[k], c.dev);
    acc = acc ? mx::add(*acc, term, c.dev) : term;
  }
  return mx::reshape(*acc, {N, C, OH, OW}, c.dev);
}

// p-norm over the last axis of the differences d (Distance.cpp): p = 0 counts non-zeros, inf is
// the largest |d|, 1 the sum of |d|, 2 sqrt(sum d^2), else (sum |d|^p)^(1/p).
mx::array pnorm_last(const mx::array& d, double p, mx::Device dev) {
  const int ax = static_cast<int>(d.ndim()) - 1;
  const mx::Dtype dt = d.dtype();
  if (p == 0.0) return mx::astype(mx::sum(mx::not_equal(d, scalar(0.0, dt), dev), ax, false, dev), dt, dev);
  const mx::array a = mx::abs(d, dev);
  if (std::isinf(p)) return mx::max(a, ax, false, dev);
  if (p == 1.0) return mx::sum(a, ax, false, dev);
  if (p == 2.0) return mx::sqrt(mx::sum(mx::square(d, dev), ax, false, dev), dev);
  return mx::power(mx::sum(mx::power(a, scalar(p, dt), dev), ax, false, dev), scalar(1.0 / p, dt), dev);
}
// _cdist_forward: x1[..., P, 1, M] - x2[..., 1, R, M] broadcast, then the p-norm over M.
mx::array cdist(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const mx::array a = mx::expand_dims(*in[0], -2, c.dev), b = mx::expand_dims(*in[1], -3, c.dev);
  return pnorm_last(mx::subtract(a, b, c.dev), n.attrs.get_float("p"), c.dev);
}
// _pdist_forward: rows i and j of every pair i < j (row-major) gathered, then the p-norm.
mx::array pdist(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const int64_t rows = in_type(n, 0).sizes[0];
  std::vector<int32_t> ii, jj;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = i + 1; j < rows; ++j) ii.push_back(static_cast<int32_t>(i)), jj.push_back(static_cast<int32_t>(j));
  }
  const mx::array d = mx::subtract(mx::take(*in[0], index_array(ii), 0, c.dev), mx::take(*in[0], index_array(jj), 0, c.dev), c.dev);
  return pnorm_last(d, n.attrs.get_float("p"), c.dev);
}

// ---------------------------------------------------------------- the table

const std::map<std::string, OpLowering, std::less<>>& table() {
  static const auto* t = [] {
    auto* m = add_math_lowerings(new std::map<std::string, OpLowering, std::less<>>{
      {"aten.add", {arith_inputs, build_add_sub}},
      {"aten.sub", {arith_inputs, build_add_sub}},
      {"aten.mul", {arith_inputs, build_binary<mx::multiply>}},
      {"aten.div", {check_div, build_binary<mx::divide>}},
      {"aten.pow", {float32_inputs, build_binary<mx::power>}},
      {"aten.neg", {float32_inputs, build_unary<mx::negative>}},
      {"aten.exp", {float32_inputs, build_unary<mx::exp>}},
      {"aten.log", {float32_inputs, build_unary<mx::log>}},
      {"aten.sqrt", {float32_inputs, build_unary<mx::sqrt>}},
      {"aten.rsqrt", {float32_inputs, build_unary<mx::rsqrt>}},
      {"aten.abs", {float32_inputs, build_unary<mx::abs>}},
      {"aten.reciprocal", {float32_inputs, build_unary<mx::reciprocal>}},
      {"aten.erf", {float32_inputs, erf}},
      {"aten.sin", {float32_inputs, build_unary<mx::sin>}},
      {"aten.cos", {float32_inputs, build_unary<mx::cos>}},
      {"aten.sigmoid", {float32_inputs, build_unary<mx::sigmoid>}},
      {"aten.tanh", {float32_inputs, build_unary<mx::tanh>}},
      {"aten.relu", {float32_inputs, relu}},
      {"aten.silu", {float32_inputs, silu}},
      {"aten.hardswish", {float32_inputs, hardswish}},
      {"aten.hardsigmoid", {float32_inputs, hardsigmoid}},
      {"aten.hardtanh", {float32_inputs, hardtanh}},
      {"aten.clamp", {float32_inputs, clamp}},
      {"aten.leaky_relu", {float32_inputs, leaky_relu}},
      {"aten.gelu", {check_gelu, gelu}},
      {"aten.where", {check_where, where}},
      {"aten.eq", {check_compare, compare<mx::equal>}},
      {"aten.ne", {check_compare, compare<mx::not_equal>}},
      {"aten.lt", {check_compare, compare<mx::less>}},
      {"aten.le", {check_compare, compare<mx::less_equal>}},
      {"aten.gt", {check_compare, compare<mx::greater>}},
      {"aten.ge", {check_compare, compare<mx::greater_equal>}},
      {"aten.logical_not", {any_dtype, logical_not}},
      {"aten.logical_and", {any_dtype, logical_and}},
      {"aten.logical_or", {any_dtype, logical_or}},
      {"aten._to_copy", {check_to_copy, to_copy}},
      {"aten.clone", {any_dtype, identity}},
      {"aten.sum", {check_reduce, sum_mean, nullptr, true}},
      {"aten.mean", {check_reduce, sum_mean, nullptr, true}},
      {"aten.amax", {check_reduce, amax_amin}},
      {"aten.amin", {check_reduce, amax_amin}},
      {"aten.argmax", {check_argmax, argmax_first}},
      {"aten._softmax", {check_softmax, softmax, nullptr, true}},
      {"aten._log_softmax", {check_softmax, softmax, nullptr, true}},
      {"aten.view", {any_dtype, reshape_to_out}},
      {"aten.squeeze", {any_dtype, reshape_to_out}},
      {"aten.unsqueeze", {any_dtype, reshape_to_out}},
      {"aten.permute", {any_dtype, permute}},
      {"aten.transpose", {any_dtype, transpose}},
      {"aten.expand", {any_dtype, expand}},
      {"aten.slice", {any_dtype, slice}},
      {"aten.select", {any_dtype, select}},
      {"aten.cat", {any_dtype, cat}},
      {"aten.embedding", {any_dtype, embedding}},
      {"aten.index", {indexing::check_index, indexing::index}},
      {"aten.index_put", {indexing::check_index_put, indexing::index_put}},
      {"aten.gather", {indexing::check_gather, indexing::gather}},
      {"aten.index_select", {indexing::check_index_select, indexing::index_select}},
      {"aten.scatter", {indexing::check_scatter, indexing::scatter}},
      {"aten.scatter_add", {indexing::check_scatter, indexing::scatter}},
      {"aten.slice_scatter", {indexing::check_slice_scatter, indexing::slice_scatter}},
      {"aten.select_scatter", {indexing::check_slice_scatter, indexing::select_scatter}},
      {"aten.constant_pad_nd", {any_dtype, constant_pad}},
      {"aten.reflection_pad1d", {check_pad, pad_take}}, {"aten.reflection_pad2d", {check_pad, pad_take}},
      {"aten.reflection_pad3d", {check_pad, pad_take}}, {"aten.replication_pad1d", {check_pad, pad_take}},
      {"aten.replication_pad2d", {check_pad, pad_take}}, {"aten.replication_pad3d", {check_pad, pad_take}},
      {"aten._cdist_forward", {float32_inputs, cdist, nullptr, true}},
      {"aten.grid_sampler_2d", {check_grid_sampler, grid_sampler, nullptr, true}},
      {"aten._pdist_forward", {float32_inputs, pdist, nullptr, true}},
      {"aten.convolution", {check_conv, conv, prepare_conv, false, 0b10}},
      {"aten.linear", {float32_inputs, linear}},
      {"kiln.weight_quantized_linear", {check_quantized, quantized_linear, prepare_quantized_linear, false, 0b1110}},
      {"kiln.weight_quantized_convolution", {check_quantized, quantized_conv}},
      {"kiln.weight_quantized_embedding", {any_dtype, quantized_embedding}},
      {"aten.addmm", {float32_inputs, addmm}},
      {"aten.mm", {float32_inputs, matmul}},
      {"aten.bmm", {float32_inputs, matmul}},
      {"aten.native_batch_norm", {check_norm, batch_norm, prepare_bn, true, 0b11110}},
      {"aten.native_layer_norm", {check_norm, layer_norm, nullptr, true}},
      {"aten.native_group_norm", {check_norm, group_norm, nullptr, true}},
      {"aten.rms_norm", {check_norm, rms_norm, nullptr, true}},
      {"aten.scaled_dot_product_attention", {check_sdpa, sdpa}},
      {"aten.max_pool2d", {check_pool, max_pool}},
      {"aten.avg_pool2d", {check_pool, avg_pool}},
      {"aten.adaptive_avg_pool2d", {check_adaptive, adaptive_avg, nullptr, true}},
      {"aten.upsample_nearest2d", {check_upsample, upsample_nearest}},
      {"aten.upsample_bilinear2d", {check_upsample, upsample_bilinear}},
  });
    add_reduce_family_lowerings(*m);  // src/backends/mlx/mlx_ops_reduce.cpp
    add_llm_lowerings(*m);            // src/backends/mlx/mlx_llm.cpp
    return m;
  }();
  return *t;
}

}  // namespace

const OpLowering* find_lowering(std::string_view op) {
  const auto& t = table();
  auto it = t.find(op);
  return it == t.end() ? nullptr : &it->second;
}

std::vector<std::string> lowered_ops() {
  std::vector<std::string> out;
  for (const auto& [name, l] : table()) out.push_back(name);
  return out;
}

mx::Dtype BuildCtx::dtype(DType d) const { return d == DType::Float32 ? compute : to_mx(d); }

mx::Dtype to_mx(DType dtype) {
  switch (dtype) {
    case DType::Float32: return mx::float32;
    case DType::Float16: return mx::float16;
    case DType::BFloat16: return mx::bfloat16;
    case DType::Int64: return mx::int64;
    case DType::Int32: return mx::int32;
    case DType::Int8: return mx::int8;
    case DType::UInt8: return mx::uint8;
    case DType::Bool: return mx::bool_;
    case DType::Float64: break;  // never lowered: check_node declines float64 values
  }
  return mx::float32;
}

Error check_node(const NodeView& n) {
  const OpLowering* l = find_lowering(n.op);
  if (l == nullptr) return no("op " + n.op + " has no mlx lowering");
  constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
  auto fits = [&](const TensorType& t, const std::string& what) -> Error {
    if (t.numel() == 0) return no(what + " " + t.to_string() + " is empty (empty tensors are not lowered)");
    for (int64_t d : t.sizes) {
      if (d > kMaxDim) return no(what + " " + t.to_string() + " has a dim beyond MLX's int32 sizes");
    }
    if (t.dim() > 8) return no(what + " has rank > 8");
    if (t.numel() > (int64_t{1} << 31)) return no(what + " " + t.to_string() + " has more than 2^31 elements");
    // MLX has no float64 on the GPU: such nodes stay on the portable kernels.
    if (t.dtype == DType::Float64) return no(what + " is float64");
    return ok();
  };
  for (size_t i = 0; i < n.in.size(); ++i) {
    if (n.in[i]) KILN_RETURN_IF_ERROR(fits(*n.in[i], "input " + std::to_string(i)));
  }
  KILN_RETURN_IF_ERROR(fits(n.out, "output"));
  return l->check(n);
}

}  // namespace kiln::mlxb

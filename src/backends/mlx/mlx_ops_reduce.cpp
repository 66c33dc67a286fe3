// mlx lowerings of the reduction / creation / layout ops added for core ATen coverage: any, prod,
// var, flip, repeat, diagonal, as_strided, arange, full, full_like, scalar_tensor, fill, copy
// (entries merged into the op table of mlx_ops.cpp by add_reduce_family_lowerings). Semantics are
// Kiln's op definitions (src/ir/ops/{reduction,creation,layout}.cpp), PyTorch's. Two-output ops
// (max/min with indices, sort, topk) are declined by the backend's support check ("op ... has 2
// outputs"); argmin is declined as argmax is (MLX does not document PyTorch's tie and NaN rules).
#include <cmath>
#include <numeric>

#include "backends/mlx/mlx_ops.h"
#include "ir/op_registry.h"
#include "ir/ops/creation.h"
#include "ir/ops/layout.h"

namespace kiln::mlxb {
namespace {

Error f32_in_out(const NodeView& n) {
  if (!n.in[0] || n.in[0]->dtype != DType::Float32 || n.out.dtype != DType::Float32) {
    return no(n.op + " is lowered for float32 only");
  }
  if (n.in[0]->dim() == 0) return no(n.op + " of a 0-d tensor is not lowered");
  return {};
}

/// The reduced axes of a `dim` int[] attribute (None or [] = all) of an input of rank `rank`.
std::vector<int> axes_of(const NodeView& n, int64_t rank) {
  std::vector<int> axes;
  if (!n.attrs.is_none("dim")) {
    for (int64_t d : n.attrs.get_ints("dim")) axes.push_back(wrap(d, rank));
  }
  if (axes.empty()) {
    axes.resize(static_cast<size_t>(rank));
    std::iota(axes.begin(), axes.end(), 0);
  }
  return axes;
}

// ---------------------------------------------------------------- reductions

Error check_any(const NodeView& n) {
  if (n.in[0]->dim() == 0) return no("any of a 0-d tensor is not lowered");
  return {};
}
// any: x != 0 (NaN != 0 is true), reduced with mx::any; dim [] reduces nothing.
mx::array any(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const mx::array& x = *in[0];
  mx::array nz = mx::not_equal(x, mx::astype(mx::array(0), x.dtype(), c.dev), c.dev);
  if (!n.attrs.is_none("dim") && n.attrs.get_ints("dim").empty()) return nz;
  return mx::any(nz, axes_of(n, n.in[0]->dim()), n.attrs.get_bool("keepdim"), c.dev);
}

std::vector<int> prod_axes(const NodeView& n) {
  const int64_t rank = n.in[0]->dim();
  if (n.attrs.is_none("dim")) {
    std::vector<int> all(static_cast<size_t>(rank));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  return {wrap(n.attrs.get_int("dim"), rank)};
}
mx::array prod(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  return mx::prod(*in[0], prod_axes(n), n.attrs.get_bool("keepdim"), c.dev);
}

int64_t reduced_count(const NodeView& n) {
  int64_t count = 1;
  for (int ax : axes_of(n, n.in[0]->dim())) count *= n.in[0]->sizes[static_cast<size_t>(ax)];
  return count;
}
Error check_var(const NodeView& n) {
  KILN_RETURN_IF_ERROR(f32_in_out(n));
  const double corr = n.attrs.is_none("correction") ? 1.0 : n.attrs.get_float("correction");
  if (static_cast<double>(reduced_count(n)) - corr <= 0) {
    return no("var with N - correction <= 0 (inf/NaN results) is not lowered");
  }
  return {};
}
// var: the corrected two-pass formula (Chan, Golub, LeVeque, "Algorithms for computing the sample
// variance", 1983, eq. 1.7): d = x - mean, (sum(d^2) - sum(d)^2 / N) / (N - correction). The
// second term removes the first-order error of the float32 mean (MLX's mean of values near 1000 is
// off by a few ulps of 1000, which alone gives 5e-4 relative error in sum(d^2) when the spread is
// 0.01; mx::var, which subtracts the same mean, shows that error). Where the mean is large against
// the spread, d = x - mean is exact (Sterbenz).
mx::array var(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const mx::array& x = *in[0];
  const auto axes = axes_of(n, n.in[0]->dim());
  const bool keep = n.attrs.get_bool("keepdim");
  const double corr = n.attrs.is_none("correction") ? 1.0 : n.attrs.get_float("correction");
  const double count = static_cast<double>(reduced_count(n));
  const mx::array d = mx::subtract(x, mx::mean(x, axes, true, c.dev), c.dev);
  const mx::array s1 = mx::sum(d, axes, keep, c.dev);
  const mx::array s2 = mx::sum(mx::multiply(d, d, c.dev), axes, keep, c.dev);
  // sum(d) * (sum(d) / N) <= sum(d^2) (Cauchy-Schwarz), so the correction overflows only with
  // sum(d^2); where that is +inf (a spread beyond float32) the variance is +inf, not inf - inf.
  const mx::array s1n = mx::divide(s1, mx::array(static_cast<float>(count), s1.dtype()), c.dev);
  mx::array ss = mx::subtract(s2, mx::multiply(s1, s1n, c.dev), c.dev);
  ss = mx::where(mx::isinf(s2, c.dev), s2, ss, c.dev);
  return mx::divide(ss, mx::array(static_cast<float>(count - corr), ss.dtype()), c.dev);
}

// ---------------------------------------------------------------- layout

Error any_dtype(const NodeView&) { return {}; }

mx::array index_array(const std::vector<int32_t>& idx) {
  return mx::array(idx.begin(), {static_cast<int32_t>(idx.size())}, mx::int32);
}

// flip: a gather with reversed indices along each flipped axis.
mx::array flip(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  mx::array x = *in[0];
  const int64_t rank = n.in[0]->dim();
  for (int64_t d : n.attrs.get_ints("dims")) {
    if (rank == 0) break;
    const int ax = wrap(d, rank);
    const int64_t s = n.in[0]->sizes[static_cast<size_t>(ax)];
    std::vector<int32_t> idx(static_cast<size_t>(s));
    for (int64_t i = 0; i < s; ++i) idx[static_cast<size_t>(i)] = static_cast<int32_t>(s - 1 - i);
    x = mx::take(x, index_array(idx), ax, c.dev);
  }
  return x;
}
// repeat = numpy's tile (leading dims added, each dim tiled repeats[i] times).
mx::array repeat(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  std::vector<int> reps;
  for (int64_t r : n.attrs.get_ints("repeats")) reps.push_back(static_cast<int>(r));
  return mx::tile(*in[0], reps, c.dev);
}
// diagonal = numpy's diagonal (the diagonal appended as the last axis).
mx::array diagonal(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const int64_t r = n.in[0]->dim();
  return mx::diagonal(*in[0], static_cast<int>(n.attrs.get_int("offset")), wrap(n.attrs.get_int("dim1"), r),
                      wrap(n.attrs.get_int("dim2"), r), c.dev);
}
// as_strided: a gather from the flattened input at the view's element indices (computed here from
// the same rule Kiln's inference checked: every index lies inside the input).
mx::array as_strided(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  std::optional<int64_t> off;
  if (!n.attrs.is_none("storage_offset")) off = n.attrs.get_int("storage_offset");
  const auto v = as_strided_view(n.in[0]->numel(), n.attrs.get_ints("size"), n.attrs.get_ints("stride"), off).value();
  std::vector<int32_t> idx;
  idx.reserve(static_cast<size_t>(n.out.numel()));
  std::vector<int64_t> at(v.sizes.size(), 0);
  for (int64_t k = 0; k < n.out.numel(); ++k) {
    int64_t e = v.offset;
    for (size_t d = 0; d < at.size(); ++d) e += at[d] * v.strides[d];
    idx.push_back(static_cast<int32_t>(e));
    for (size_t d = at.size(); d-- > 0;) {
      if (++at[d] < v.sizes[d]) break;
      at[d] = 0;
    }
  }
  mx::array flat = mx::reshape(*in[0], {-1}, c.dev);
  return mx::reshape(mx::take(flat, index_array(idx), 0, c.dev), shape_of(n.out.sizes), c.dev);
}

// ---------------------------------------------------------------- creation

/// The number v as a 0-d array of Kiln dtype `d`, when the conversion is exact to compute here:
/// float32 (rounded), bool (v != 0), integers for integral values in range.
std::optional<mx::array> number_as(double v, DType d) {
  switch (d) {
    case DType::Float32: return mx::array(static_cast<float>(v), mx::float32);
    case DType::Bool: return mx::array(v != 0.0 || std::isnan(v));
    case DType::Int32:
      if (v == std::trunc(v) && std::fabs(v) < 2147483648.0) return mx::array(static_cast<int32_t>(v), mx::int32);
      return std::nullopt;
    case DType::Int64:
      if (v == std::trunc(v) && std::fabs(v) < 9007199254740992.0) return mx::array(static_cast<int64_t>(v), mx::int64);
      return std::nullopt;
    default: return std::nullopt;
  }
}
const char* number_attr(const NodeView& n) {
  return n.op == "aten.scalar_tensor" ? "s" : "fill_value";
}
Error check_full(const NodeView& n) {
  if (!number_as(n.attrs.get_float(number_attr(n)), n.out.dtype)) {
    return no(std::string("fill value into ") + dtype_name(n.out.dtype) +
              " is not lowered (float32, bool, and integral values for int32/int64 are)");
  }
  return {};
}
mx::array full(BuildCtx& c, const NodeView& n, const Inputs&, const std::vector<mx::array>&) {
  mx::array v = *number_as(n.attrs.get_float(number_attr(n)), n.out.dtype);
  return mx::full(shape_of(n.out.sizes), mx::astype(v, c.dtype(n.out.dtype), c.dev), c.dev);
}

Error check_arange(const NodeView& n) {
  const DType d = n.out.dtype;
  if (d != DType::Float32 && d != DType::Int32 && d != DType::Int64) return no("arange is lowered for float32, int32, int64");
  return {};
}
// arange: the values computed here with the rule of Kiln's kernel (value i = start + i * step in
// double for float32; int64 of the truncated start and step for integers), then a constant.
mx::array arange(BuildCtx& c, const NodeView& n, const Inputs&, const std::vector<mx::array>&) {
  const double start = n.attrs.get_float("start"), step = n.attrs.get_float("step");
  const int64_t len = n.out.sizes[0];
  if (n.out.dtype == DType::Float32) {
    std::vector<float> v(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) v[static_cast<size_t>(i)] = static_cast<float>(start + step * static_cast<double>(i));
    return mx::astype(mx::array(v.begin(), {static_cast<int32_t>(len)}, mx::float32), c.dtype(DType::Float32), c.dev);
  }
  const auto is = static_cast<int64_t>(start), ist = static_cast<int64_t>(step);
  std::vector<int64_t> v(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) {
    v[static_cast<size_t>(i)] = static_cast<int64_t>(static_cast<uint64_t>(is) + static_cast<uint64_t>(i) * static_cast<uint64_t>(ist));
  }
  return mx::astype(mx::array(v.begin(), {static_cast<int32_t>(len)}, mx::int64), to_mx(n.out.dtype), c.dev);
}

// copy / fill: input 1 converted to self's dtype and broadcast to self's shape. Float -> integer
// conversions are declined as _to_copy's are (out-of-range values differ between C and PyTorch).
Error check_copy(const NodeView& n) {
  const DType from = n.in[1]->dtype, to = n.out.dtype;
  if (is_floating(from) && !is_floating(to) && to != DType::Bool) {
    return no(std::string("conversion ") + dtype_name(from) + " -> " + dtype_name(to) + " is not lowered");
  }
  return {};
}
mx::array copy(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  return mx::broadcast_to(mx::astype(*in[1], c.dtype(n.out.dtype), c.dev), shape_of(n.out.sizes), c.dev);
}

Error decline_argmin(const NodeView&) {
  return no("argmin is not lowered (MLX's tie and NaN rules are not documented to match PyTorch's)");
}
mx::array unused(BuildCtx&, const NodeView&, const Inputs& in, const std::vector<mx::array>&) { return *in[0]; }

}  // namespace

void add_reduce_family_lowerings(std::map<std::string, OpLowering, std::less<>>& t) {
  t.insert({"aten.any", {check_any, any}});
  t.insert({"aten.argmin", {decline_argmin, unused}});
  t.insert({"aten.prod", {f32_in_out, prod, nullptr, true}});
  t.insert({"aten.var", {check_var, var, nullptr, true}});
  t.insert({"aten.flip", {any_dtype, flip}});
  t.insert({"aten.repeat", {any_dtype, repeat}});
  t.insert({"aten.diagonal", {any_dtype, diagonal}});
  t.insert({"aten.as_strided", {any_dtype, as_strided}});
  t.insert({"aten.full", {check_full, full}});
  t.insert({"aten.full_like", {check_full, full}});
  t.insert({"aten.scalar_tensor", {check_full, full}});
  t.insert({"aten.arange", {check_arange, arange}});
  t.insert({"aten.copy", {check_copy, copy}});
  t.insert({"aten.fill", {check_copy, copy}});
}

}  // namespace kiln::mlxb

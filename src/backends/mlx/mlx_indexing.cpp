// mlx lowerings of aten.index, gather, index_select, scatter / scatter_add, slice_scatter and
// select_scatter (semantics: src/ir/ops/indexing.cpp; PyTorch's TensorAdvancedIndexing.cpp).
// index_put is lowered for integer indices; scatter_reduce, masked_scatter and _embedding_bag have no lowering (the partitioner
// reports "op ... has no mlx lowering" and they run on Kiln's kernels).
#include "backends/mlx/mlx_indexing.h"

#include <algorithm>

#include "ir/op_registry.h"
#include "ir/ops/indexing.h"

namespace kiln::mlxb::indexing {
namespace {

/// `idx` clamped into [0, size) as int32 for MLX; an index outside [0, size) makes execute fail
/// with InvalidArgument (a RuntimeCheck). With `negative_ok` (aten.index, index_put: PyTorch counts
/// negatives from the end) negatives are wrapped first and the valid range is [-size, size);
/// gather, index_select and the scatters refuse negatives, as PyTorch does.
mx::array checked_index(BuildCtx& c, const mx::array& idx, int64_t size, const std::string& op, int64_t dim,
                        bool negative_ok = false) {
  const auto it = idx.dtype();
  const mx::array n = mx::array(static_cast<int64_t>(size), it);
  const mx::array zero = mx::array(0, it);
  mx::array w = negative_ok ? mx::where(mx::less(idx, zero, c.dev), mx::add(idx, n, c.dev), idx, c.dev) : idx;
  mx::array bad = mx::logical_or(mx::less(w, zero, c.dev), mx::greater_equal(w, n, c.dev), c.dev);
  c.checks->push_back({mx::any(bad, false, c.dev), op + ": an index is out of range for dim " + std::to_string(dim) +
                                                       " of size " + std::to_string(size)});
  mx::array safe = mx::clip(w, zero, mx::array(static_cast<int64_t>(std::max<int64_t>(size - 1, 0)), it), c.dev);
  return mx::astype(safe, mx::int32, c.dev);
}

}  // namespace

Error check_index(const NodeView& n) {
  for (size_t k = 1; k < n.in.size(); ++k) {
    if (n.in[k]->dtype != DType::Int64 && n.in[k]->dtype != DType::Int32) return no("index tensors must be integer");
  }
  return {};
}

// self[indices]: mx::gather with size-1 slices on the indexed dims gives bcast + self's sizes
// (indexed dims 1); reshaped to bcast + the other dims, then bcast moved to its place.
mx::array index(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& sizes = n.in[0]->sizes;
  const auto dims = n.attrs.get_ints("dims");
  std::vector<mx::array> idx;
  std::vector<int> axes;
  std::vector<std::vector<int64_t>> shapes;
  mx::Shape slice = shape_of(sizes);
  for (size_t k = 0; k < dims.size(); ++k) {
    const auto d = static_cast<size_t>(dims[k]);
    idx.push_back(checked_index(c, *in[k + 1], sizes[d], "aten.index", dims[k], true));
    axes.push_back(static_cast<int>(d));
    shapes.push_back(n.in[k + 1]->sizes);
    slice[d] = 1;
  }
  auto plan = index_rules::advanced_index(sizes, dims, shapes);  // inference checked it
  mx::array g = mx::gather(*in[0], idx, axes, slice, c.dev);
  std::vector<int64_t> flat = plan->bcast;
  for (int64_t d : plan->out_to_self) {
    if (d >= 0) flat.push_back(sizes[static_cast<size_t>(d)]);
  }
  g = mx::reshape(g, shape_of(flat), c.dev);
  const auto nb = static_cast<int>(plan->bcast.size());
  const auto p = static_cast<int>(plan->bcast_pos);
  if (p > 0 && nb > 0) {
    std::vector<int> order;
    for (int i = 0; i < p; ++i) order.push_back(nb + i);
    for (int i = 0; i < nb; ++i) order.push_back(i);
    for (int i = nb + p; i < static_cast<int>(flat.size()); ++i) order.push_back(i);
    g = mx::transpose(g, order, c.dev);
  }
  return g;
}

Error check_index_put(const NodeView& n) {
  for (size_t k = 2; k < n.in.size(); ++k) {
    if (n.in[k]->dtype == DType::Bool) return no("index_put with a bool mask is not lowered (data-dependent count)");
  }
  return {};
}

// index_put: values broadcast to the shape self[indices] has, rearranged to bcast + self's sizes
// (1 on the indexed dims), the layout mx::scatter takes; accumulate uses scatter_add (duplicates sum).
mx::array index_put(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& sizes = n.in[0]->sizes;
  const auto dims = n.attrs.get_ints("dims");
  std::vector<mx::array> idx;
  std::vector<int> axes;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> slice = sizes;
  for (size_t k = 0; k < dims.size(); ++k) {
    const auto d = static_cast<size_t>(dims[k]);
    mx::array i = checked_index(c, *in[k + 2], sizes[d], "aten.index_put", dims[k], true);
    shapes.push_back(n.in[k + 2]->sizes);
    idx.push_back(i);
    axes.push_back(static_cast<int>(d));
    slice[d] = 1;
  }
  auto plan = index_rules::advanced_index(sizes, dims, shapes);  // inference checked it
  for (auto& i : idx) i = mx::broadcast_to(i, shape_of(plan->bcast), c.dev);
  mx::array v = mx::broadcast_to(*in[1], shape_of(plan->out_sizes), c.dev);
  const auto nb = static_cast<int>(plan->bcast.size());
  const auto p = static_cast<int>(plan->bcast_pos);
  if (p > 0 && nb > 0) {  // out layout pre + bcast + post -> bcast + pre + post
    std::vector<int> order;
    for (int i = 0; i < nb; ++i) order.push_back(p + i);
    for (int i = 0; i < p; ++i) order.push_back(i);
    for (int i = p + nb; i < static_cast<int>(plan->out_sizes.size()); ++i) order.push_back(i);
    v = mx::transpose(v, order, c.dev);
  }
  std::vector<int64_t> up = plan->bcast;
  up.insert(up.end(), slice.begin(), slice.end());
  v = mx::reshape(v, shape_of(up), c.dev);
  return n.attrs.get_bool("accumulate") ? mx::scatter_add(*in[0], idx, v, axes, c.dev)
                                        : mx::scatter(*in[0], idx, v, axes, c.dev);
}

Error check_gather(const NodeView& n) {
  if (n.in[0]->dim() == 0) return no("gather on a 0-d tensor is not lowered");
  return {};
}

// gather: take_along_axis on self cut to index's sizes outside dim.
mx::array gather(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& s = n.in[0]->sizes;
  const auto& is = n.in[1]->sizes;
  const int dim = wrap(n.attrs.get_int("dim"), n.in[0]->dim());
  mx::array x = *in[0];
  mx::Shape stop = shape_of(is);
  stop[static_cast<size_t>(dim)] = static_cast<int32_t>(s[static_cast<size_t>(dim)]);
  if (stop != shape_of(s)) x = mx::slice(x, mx::Shape(s.size(), 0), stop, c.dev);
  return mx::take_along_axis(x, checked_index(c, *in[1], s[static_cast<size_t>(dim)], "aten.gather", dim), dim, c.dev);
}

Error check_index_select(const NodeView& n) {
  if (n.in[0]->dim() == 0) return no("index_select on a 0-d tensor is not lowered");
  return {};
}

mx::array index_select(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const int dim = wrap(n.attrs.get_int("dim"), n.in[0]->dim());
  mx::array i = mx::reshape(*in[1], {static_cast<int32_t>(n.in[1]->numel())}, c.dev);
  i = checked_index(c, i, n.in[0]->sizes[static_cast<size_t>(dim)], "aten.index_select", dim);
  return mx::take(*in[0], i, dim, c.dev);
}

// scatter (reduce None or "add") and scatter_add: put_along_axis / scatter_add_axis with src cut
// to index's sizes; index must span self outside dim (MLX broadcasts index against self).
Error check_scatter(const NodeView& n) {
  if (n.in[0]->dim() == 0) return no("scatter on a 0-d tensor is not lowered");
  if (n.op == "aten.scatter" && !n.attrs.is_none("reduce") && n.attrs.get_string("reduce") != "add") {
    return no("scatter reduce='" + n.attrs.get_string("reduce") + "' is not lowered");
  }
  const int dim = wrap(n.attrs.get_int("dim"), n.in[0]->dim());
  for (size_t d = 0; d < n.in[0]->sizes.size(); ++d) {
    if (static_cast<int>(d) != dim && n.in[1]->sizes[d] != n.in[0]->sizes[d]) {
      return no("scatter with an index smaller than self outside dim is not lowered");
    }
  }
  return {};
}

mx::array scatter(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& s = n.in[0]->sizes;
  const int dim = wrap(n.attrs.get_int("dim"), n.in[0]->dim());
  mx::array src = *in[2];
  if (n.in[2]->sizes != n.in[1]->sizes) src = mx::slice(src, mx::Shape(s.size(), 0), shape_of(n.in[1]->sizes), c.dev);
  mx::array idx = checked_index(c, *in[1], s[static_cast<size_t>(dim)], n.op, dim);
  const bool add = n.op == "aten.scatter_add" || !n.attrs.is_none("reduce");
  return add ? mx::scatter_add_axis(*in[0], idx, src, dim, c.dev) : mx::put_along_axis(*in[0], idx, src, dim, c.dev);
}

Error check_slice_scatter(const NodeView& n) {
  if (n.in[0]->dim() == 0) return no("0-d self is not lowered");
  return {};
}

mx::array slice_scatter(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& s = n.in[0]->sizes;
  const int axis = wrap(n.attrs.get_int("dim", 0), n.in[0]->dim());
  const int64_t size = s[static_cast<size_t>(axis)];
  const auto [start, end] = slice_bounds(n.attrs, size);
  mx::Shape lo(s.size(), 0), hi = shape_of(s), st(s.size(), 1);
  lo[static_cast<size_t>(axis)] = static_cast<int32_t>(start);
  hi[static_cast<size_t>(axis)] = static_cast<int32_t>(end);
  st[static_cast<size_t>(axis)] = static_cast<int32_t>(n.attrs.get_int("step", 1));
  return mx::slice_update(*in[0], *in[1], lo, hi, st, c.dev);
}

mx::array select_scatter(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const auto& s = n.in[0]->sizes;
  const int axis = wrap(n.attrs.get_int("dim"), n.in[0]->dim());
  int64_t index = n.attrs.get_int("index");
  if (index < 0) index += s[static_cast<size_t>(axis)];
  mx::Shape lo(s.size(), 0), hi = shape_of(s);
  lo[static_cast<size_t>(axis)] = static_cast<int32_t>(index);
  hi[static_cast<size_t>(axis)] = static_cast<int32_t>(index + 1);
  return mx::slice_update(*in[0], mx::expand_dims(*in[1], axis, c.dev), lo, hi, c.dev);
}

}  // namespace kiln::mlxb::indexing

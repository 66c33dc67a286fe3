// Portable indexing kernels (ops defined in src/ir/ops/indexing.cpp): index, index_put, gather,
// index_select, scatter, scatter_add, scatter_reduce, select_scatter, slice_scatter,
// masked_scatter, _embedding_bag. Data moves as bytes (every Kiln dtype); the reductions compute
// per element in the dtype's arithmetic (float16/bfloat16 through float, rounded after each
// step, as PyTorch's CPU kernels do; integers wrap). Every data-dependent index is checked before
// it is used: an index out of range is InvalidArgument naming the op, the index value and the dim;
// no kernel reads or writes outside a tensor. Sizes come from the same rules inference used
// (src/ir/ops/indexing.h, shape_rules.h); a mismatch with the given output is Internal.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ir/op_registry.h"
#include "ir/ops/indexing.h"
#include "ir/ops/shape_rules.h"
#include "kernels/kernel.h"
#include "kernels/portable/util.h"

namespace kiln {
namespace {

namespace ir = index_rules;
namespace sr = shape_rules;

Error mismatch(const char* op, const Tensor& out, const std::vector<int64_t>& sizes) {
  return Error(ErrorCode::Internal, std::string(op) + ": output " + out.type().to_string() +
                                        " does not match the computed sizes " + sizes_to_string(sizes));
}

Error out_of_range(const char* op, int64_t v, int64_t dim, int64_t size) {
  return Error(ErrorCode::InvalidArgument, std::string(op) + ": index " + std::to_string(v) +
                                               " is out of range for dim " + std::to_string(dim) + " of size " +
                                               std::to_string(size));
}

/// An int64/int32 index tensor, or int64 values the kernel owns (bool masks turned into coordinates).
struct IndexTensor {
  const void* data = nullptr;
  DType dtype = DType::Int64;
  std::vector<int64_t> sizes;
  int64_t at(int64_t i) const {
    return dtype == DType::Int32 ? static_cast<const int32_t*>(data)[i] : static_cast<const int64_t*>(data)[i];
  }
};

IndexTensor index_of(const Tensor& t) { return {t.data, t.dtype, t.sizes}; }

/// Internal unless `t` is int64/int32 (inference guarantees it; checked before any index is read).
Error check_index_dtype(const char* op, const Tensor& t) {
  if (t.dtype == DType::Int64 || t.dtype == DType::Int32) return {};
  return Error(ErrorCode::Internal, std::string(op) + ": an index tensor is " + dtype_name(t.dtype));
}

/// `v` wrapped into [0, size) (negative counts from the end), or InvalidArgument.
Result<int64_t> wrap_index(const char* op, int64_t v, int64_t dim, int64_t size) {
  if (v < -size || v >= size) return out_of_range(op, v, dim, size);
  return v < 0 ? v + size : v;
}

/// `v` itself when in [0, size), else InvalidArgument: gather, index_select and the scatters
/// refuse negative indices, as PyTorch does ("index -1 is out of bounds for dimension 1").
Result<int64_t> check_index(const char* op, int64_t v, int64_t dim, int64_t size) {
  if (v < 0 || v >= size) return out_of_range(op, v, dim, size);
  return v;
}

std::vector<int64_t> at_least_1d(const std::vector<int64_t>& s) { return s.empty() ? std::vector<int64_t>{1} : s; }

/// Advances `coord` over `sizes` in row-major order.
void next_coord(std::vector<int64_t>& coord, const std::vector<int64_t>& sizes) {
  for (size_t d = coord.size(); d-- > 0;) {
    if (++coord[d] < sizes[d]) return;
    coord[d] = 0;
  }
}

// ---------------------------------------------------------------------------------------------
// Element arithmetic per dtype
// ---------------------------------------------------------------------------------------------

struct Half { uint16_t bits; };
struct BF16 { uint16_t bits; };

/// Compute type C of storage type T, with load/store (float16/bfloat16 go through float).
template <class T> struct Num {
  using C = T;
  static C load(T v) { return v; }
  static T store(C c) { return c; }
};
template <> struct Num<Half> {
  using C = float;
  static C load(Half v) { return half_to_float(v.bits); }
  static Half store(C c) { return Half{float_to_half(c)}; }
};
template <> struct Num<BF16> {
  using C = float;
  static C load(BF16 v) { return bfloat16_to_float(v.bits); }
  static BF16 store(C c) { return BF16{float_to_bfloat16(c)}; }
};

template <class F>
decltype(auto) visit_storage(DType d, F&& f) {
  switch (d) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Float16: return f(Half{});
    case DType::BFloat16: return f(BF16{});
    case DType::Int64: return f(int64_t{});
    case DType::Int32: return f(int32_t{});
    case DType::Int8: return f(int8_t{});
    case DType::UInt8: return f(uint8_t{});
    case DType::Bool: break;
  }
  return f(bool{});
}

enum class Reduce { Assign, Sum, Prod, Mean, Max, Min };

template <class C> C add(C x, C y) {
  if constexpr (std::is_same_v<C, bool>) return x || y;
  else if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(x) + static_cast<U>(y));
  } else return x + y;
}
template <class C> C mul(C x, C y) {
  if constexpr (std::is_same_v<C, bool>) return x && y;
  else if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    // uint8/int8 promote to int in C++; the unsigned product of the promoted values wraps correctly
    return static_cast<C>(static_cast<U>(static_cast<U>(x) * static_cast<U>(y)));
  } else return x * y;
}
// amax/amin propagate NaN (PyTorch's scatter_reduce: a NaN src wins; std::max keeps a NaN self).
template <class C> C max_of(C x, C y) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<C>::quiet_NaN();
  }
  return y > x ? y : x;
}
template <class C> C min_of(C x, C y) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<C>::quiet_NaN();
  }
  return y < x ? y : x;
}

template <class C> C combine(Reduce r, C x, C y) {
  switch (r) {
    case Reduce::Assign: return y;
    case Reduce::Sum:
    case Reduce::Mean: return add(x, y);
    case Reduce::Prod: return mul(x, y);
    case Reduce::Max: return max_of(x, y);
    case Reduce::Min: return min_of(x, y);
  }
  return y;
}

/// The value a position starts from when include_self is false (the reduction's identity).
template <class C> C identity(Reduce r) {
  switch (r) {
    case Reduce::Prod: return C(1);
    case Reduce::Max:
      if constexpr (std::is_floating_point_v<C>) return -std::numeric_limits<C>::infinity();
      else return std::numeric_limits<C>::lowest();
    case Reduce::Min:
      if constexpr (std::is_floating_point_v<C>) return std::numeric_limits<C>::infinity();
      else return std::numeric_limits<C>::max();
    default: return C(0);
  }
}

/// sum / count: true division for floats, floor division for integers (PyTorch's
/// scatter_reduce "mean": out.div_(count, rounding_mode="floor") for integral dtypes).
template <class C> C mean_of(C sum, int64_t count) {
  if constexpr (std::is_floating_point_v<C>) {
    return static_cast<C>(sum / static_cast<C>(count));
  } else {
    const auto s = static_cast<int64_t>(sum);
    int64_t q = s / count;
    if ((s % count != 0) && ((s < 0) != (count < 0))) --q;
    return static_cast<C>(q);
  }
}

/// out[dst] = combine(r, out[dst], src[s]) on raw element pointers of storage type T.
template <class T>
void apply(Reduce r, void* out, int64_t dst, const void* src, int64_t s) {
  T* o = static_cast<T*>(out);
  const T* in = static_cast<const T*>(src);
  if (r == Reduce::Assign) {
    o[dst] = in[s];
    return;
  }
  using N = Num<T>;
  o[dst] = N::store(combine<typename N::C>(r, N::load(o[dst]), N::load(in[s])));
}

void copy_bytes(const Tensor& from, Tensor& to) {
  if (to.nbytes() > 0 && to.data != from.data) std::memcpy(to.data, from.data, to.nbytes());
}

// ---------------------------------------------------------------------------------------------
// Advanced indexing: index, index_put
// ---------------------------------------------------------------------------------------------

/// Calls f(r, self_offset, inner) for every row r of self[indices] (rows: the result's elements
/// grouped by the contiguous block of self's dims after the last indexed dim, `inner` elements;
/// self_offset is the block's first element in self). Every index is checked and wrapped.
template <class F>
Error walk_rows(const char* op, const std::vector<int64_t>& self_sizes, const std::vector<int64_t>& dims,
                const ir::AdvancedIndex& plan, const std::vector<IndexTensor>& idx, F&& f) {
  const auto last = static_cast<size_t>(dims.back());
  int64_t inner = 1;
  for (size_t d = last + 1; d < self_sizes.size(); ++d) inner *= self_sizes[d];
  const size_t outer_rank = plan.out_sizes.size() - (self_sizes.size() - 1 - last);
  const std::vector<int64_t> strides = sr::contiguous_strides(self_sizes);
  const size_t nb = plan.bcast.size();
  std::vector<std::vector<int64_t>> istr(idx.size(), std::vector<int64_t>(nb, 0));
  for (size_t k = 0; k < idx.size(); ++k) {
    const auto& s = idx[k].sizes;
    int64_t st = 1;
    for (size_t j = 0; j < s.size(); ++j) {
      const size_t i = s.size() - 1 - j;
      istr[k][nb - 1 - j] = s[i] == 1 ? 0 : st;
      st *= s[i];
    }
  }
  const std::vector<int64_t> outer(plan.out_sizes.begin(), plan.out_sizes.begin() + static_cast<std::ptrdiff_t>(outer_rank));
  int64_t rows = 1;
  for (int64_t s : outer) rows *= s;
  std::vector<int64_t> coord(outer_rank, 0);
  const auto bpos = static_cast<size_t>(plan.bcast_pos);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (size_t d = 0; d < outer_rank; ++d) {
      const int64_t sd = plan.out_to_self[d];
      if (sd >= 0) off += coord[d] * strides[static_cast<size_t>(sd)];
    }
    for (size_t k = 0; k < idx.size(); ++k) {
      int64_t flat = 0;
      for (size_t j = 0; j < nb; ++j) flat += coord[bpos + j] * istr[k][j];
      const auto d = static_cast<size_t>(dims[k]);
      auto v = wrap_index(op, idx[k].at(flat), dims[k], self_sizes[d]);
      if (!v.ok()) return v.error();
      off += *v * strides[d];
    }
    KILN_RETURN_IF_ERROR(f(r, off, inner));
    next_coord(coord, outer);
  }
  return {};
}

// torch.Tensor.__getitem__ with integer tensors: out = self[indices] (NumPy advanced indexing).
Error index(const KernelArgs& a) {
  const Tensor& self = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const auto dims = a.attrs.get_ints("dims");
  std::vector<IndexTensor> idx;
  std::vector<std::vector<int64_t>> shapes;
  for (size_t k = 1; k < a.inputs.size(); ++k) {
    if (a.inputs[k]->dtype != DType::Int64 && a.inputs[k]->dtype != DType::Int32) {
      return Error(ErrorCode::NotSupported, "aten.index: index tensors must be int64 or int32");
    }
    idx.push_back(index_of(*a.inputs[k]));
    shapes.push_back(a.inputs[k]->sizes);
  }
  auto plan = ir::advanced_index(self.sizes, dims, shapes);
  if (!plan.ok()) return Error(plan.error().code(), "aten.index: " + plan.error().message());
  if (out.sizes != plan->out_sizes || out.dtype != self.dtype) return mismatch("aten.index", out, plan->out_sizes);
  const size_t es = dtype_size(self.dtype);
  const auto* src = static_cast<const uint8_t*>(self.data);
  auto* dst = static_cast<uint8_t*>(out.data);
  return walk_rows("aten.index", self.sizes, dims, *plan, idx, [&](int64_t r, int64_t off, int64_t inner) -> Error {
    const size_t n = static_cast<size_t>(inner) * es;
    if (n > 0) std::memcpy(dst + static_cast<size_t>(r) * n, src + static_cast<size_t>(off) * es, n);
    return {};
  });
}

// index_put(self, values, *indices; dims, accumulate): out = self; out[indices] = values (+= with
// accumulate, where duplicate indices all add). Runs in place when out is exactly self's bytes
// (no copy; every index checked before the first write). Bool masks are turned into the coordinates of their
// true elements (row-major), one int64 index per covered dim (PyTorch: mask -> mask.nonzero()).
Error index_put(const KernelArgs& a) {
  const char* op = "aten.index_put";
  const Tensor& self = *a.inputs[0];
  const Tensor& values = *a.inputs[1];
  Tensor& out = *a.outputs[0];
  if (out.sizes != self.sizes || out.dtype != self.dtype || values.dtype != self.dtype) {
    return mismatch(op, out, self.sizes);
  }
  const auto dims = a.attrs.get_ints("dims");
  if (dims.size() + 2 != a.inputs.size()) return Error(ErrorCode::Internal, "aten.index_put: dims do not match the inputs");
  std::vector<std::vector<int64_t>> owned;  // coordinates of mask elements
  std::vector<IndexTensor> idx;
  std::vector<int64_t> idims;
  std::vector<std::vector<int64_t>> shapes;
  for (size_t k = 0; k < dims.size(); ++k) {
    const Tensor& t = *a.inputs[k + 2];
    if (t.dtype != DType::Bool) {
      KILN_RETURN_IF_ERROR(check_index_dtype(op, t));
      idx.push_back(index_of(t));
      idims.push_back(dims[k]);
      shapes.push_back(t.sizes);
      continue;
    }
    const size_t m = t.sizes.size();
    if (m == 0 || dims[k] + static_cast<int64_t>(m) > self.dim()) return Error(ErrorCode::Internal, "aten.index_put: bad mask");
    const auto* mp = t.data_as<const bool>();
    int64_t count = 0;
    for (int64_t i = 0, n = t.numel(); i < n; ++i) count += mp[i] ? 1 : 0;
    const size_t first = owned.size();
    owned.resize(first + m, std::vector<int64_t>(static_cast<size_t>(count)));
    std::vector<int64_t> coord(m, 0);
    int64_t c = 0;
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      if (mp[i]) {
        for (size_t j = 0; j < m; ++j) owned[first + j][static_cast<size_t>(c)] = coord[j];
        ++c;
      }
      next_coord(coord, t.sizes);
    }
    for (size_t j = 0; j < m; ++j) idims.push_back(dims[k] + static_cast<int64_t>(j));
    for (size_t j = 0; j < m; ++j) shapes.push_back({count});
  }
  // Point the mask indices at their (now stable) storage.
  size_t o = 0;
  std::vector<IndexTensor> all;
  size_t next_int = 0;
  for (size_t k = 0; k < dims.size(); ++k) {
    const Tensor& t = *a.inputs[k + 2];
    if (t.dtype != DType::Bool) {
      all.push_back(idx[next_int++]);
      continue;
    }
    for (size_t j = 0; j < t.sizes.size(); ++j, ++o) {
      all.push_back(IndexTensor{owned[o].data(), DType::Int64, {static_cast<int64_t>(owned[o].size())}});
    }
  }
  auto plan = ir::advanced_index(self.sizes, idims, shapes);
  if (!plan.ok()) return Error(plan.error().code(), std::string(op) + ": " + plan.error().message());
  auto b = broadcast_shapes(values.sizes, plan->out_sizes);
  if (!b.ok() || b.value() != plan->out_sizes) {
    return Error(ErrorCode::InvalidArgument, std::string(op) + ": values of shape " + sizes_to_string(values.sizes) +
                                                 " cannot be broadcast to the indexed shape " +
                                                 sizes_to_string(plan->out_sizes));
  }
  // In place: the memory planner may give out exactly self's bytes (a state tensor updated in
  // place, e.g. a KV cache written at input_pos). Then copy_bytes copies nothing, and every index is
  // checked in a first pass that writes nothing, so that a bad index leaves the buffer untouched.
  KILN_RETURN_IF_ERROR(walk_rows(op, self.sizes, idims, *plan, all, [](int64_t, int64_t, int64_t) -> Error { return {}; }));
  copy_bytes(self, out);
  const BroadcastIndex vb(values.sizes, plan->out_sizes);
  const Reduce r = a.attrs.get_bool("accumulate") ? Reduce::Sum : Reduce::Assign;
  return visit_storage(self.dtype, [&](auto tag) -> Error {
    using T = decltype(tag);
    return walk_rows(op, self.sizes, idims, *plan, all, [&](int64_t row, int64_t off, int64_t inner) -> Error {
      for (int64_t j = 0; j < inner; ++j) apply<T>(r, out.data, off + j, values.data, vb(row * inner + j));
      return {};
    });
  });
}

// ---------------------------------------------------------------------------------------------
// gather, index_select
// ---------------------------------------------------------------------------------------------

// torch.gather: out[c] = self[c with c[dim] = index[c]] for every coordinate c of index.
Error gather(const KernelArgs& a) {
  const char* op = "aten.gather";
  const Tensor& self = *a.inputs[0];
  const Tensor& index = *a.inputs[1];
  Tensor& out = *a.outputs[0];
  KILN_RETURN_IF_ERROR(check_index_dtype(op, index));
  auto d = ir::gather_scatter_check(self.sizes, a.attrs.get_int("dim"), index.sizes, nullptr);
  if (!d.ok()) return Error(d.error().code(), std::string(op) + ": " + d.error().message());
  if (out.sizes != index.sizes || out.dtype != self.dtype) return mismatch(op, out, index.sizes);
  const int64_t n = index.numel();
  if (n == 0) return {};
  const auto ss = at_least_1d(self.sizes);
  const auto is = at_least_1d(index.sizes);
  const auto st = sr::contiguous_strides(ss);
  const auto k = static_cast<size_t>(*d);
  const IndexTensor idx = index_of(index);
  const size_t es = dtype_size(self.dtype);
  const auto* src = static_cast<const uint8_t*>(self.data);
  auto* dst = static_cast<uint8_t*>(out.data);
  std::vector<int64_t> c(is.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    auto v = check_index(op, idx.at(i), *d, ss[k]);
    if (!v.ok()) return v.error();
    int64_t off = 0;
    for (size_t j = 0; j < c.size(); ++j) off += (j == k ? *v : c[j]) * st[j];
    std::memcpy(dst + static_cast<size_t>(i) * es, src + static_cast<size_t>(off) * es, es);
    next_coord(c, is);
  }
  return {};
}

// torch.index_select: the slices self[..., index[k], ...] along dim, in order.
Error index_select(const KernelArgs& a) {
  const char* op = "aten.index_select";
  const Tensor& self = *a.inputs[0];
  const Tensor& index = *a.inputs[1];
  Tensor& out = *a.outputs[0];
  KILN_RETURN_IF_ERROR(check_index_dtype(op, index));
  const auto ss = at_least_1d(self.sizes);
  auto d = wrap_dim(a.attrs.get_int("dim"), self.dim());
  if (!d.ok()) return Error(ErrorCode::Internal, std::string(op) + ": bad dim");
  const auto k = static_cast<size_t>(*d);
  std::vector<int64_t> want = self.sizes;
  if (!want.empty()) want[k] = index.numel();
  if (out.sizes != want || out.dtype != self.dtype || (self.sizes.empty() && index.numel() != 1)) {
    return mismatch(op, out, want);
  }
  int64_t outer = 1, inner = 1;
  for (size_t j = 0; j < k; ++j) outer *= ss[j];
  for (size_t j = k + 1; j < ss.size(); ++j) inner *= ss[j];
  const IndexTensor idx = index_of(index);
  const int64_t m = index.numel();
  const size_t row = static_cast<size_t>(inner) * dtype_size(self.dtype);
  const auto* src = static_cast<const uint8_t*>(self.data);
  auto* dst = static_cast<uint8_t*>(out.data);
  for (int64_t j = 0; j < m; ++j) {  // check every index first: also when the output is empty
    auto v = check_index(op, idx.at(j), *d, ss[k]);
    if (!v.ok()) return v.error();
  }
  if (row == 0) return {};
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < m; ++j) {
      const int64_t v = idx.at(j);  // checked above: 0 <= v < size
      std::memcpy(dst + static_cast<size_t>(o * m + j) * row, src + static_cast<size_t>(o * ss[k] + v) * row, row);
    }
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// The scatter family
// ---------------------------------------------------------------------------------------------

/// Calls f(dst, src) for every coordinate c of index: dst = self offset of c with c[dim] =
/// index[c] (checked: 0 <= index < size), src = src's offset of c (src may be larger than index).
template <class F>
Error walk_scatter(const char* op, const std::vector<int64_t>& self_sizes, int64_t dim, const Tensor& index,
                   const std::vector<int64_t>& src_sizes, F&& f) {
  const int64_t n = index.numel();
  if (n == 0) return {};
  const auto ss = at_least_1d(self_sizes);
  const auto is = at_least_1d(index.sizes);
  const auto st = sr::contiguous_strides(ss);
  const auto srt = sr::contiguous_strides(at_least_1d(src_sizes));
  const auto k = static_cast<size_t>(dim);
  const IndexTensor idx = index_of(index);
  std::vector<int64_t> c(is.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    auto v = check_index(op, idx.at(i), dim, ss[k]);
    if (!v.ok()) return v.error();
    int64_t dst = 0, src = 0;
    for (size_t j = 0; j < c.size(); ++j) {
      dst += (j == k ? *v : c[j]) * st[j];
      src += c[j] * srt[j];
    }
    f(dst, src);
    next_coord(c, is);
  }
  return {};
}

/// out = self, then out[c with c[dim] = index[c]] combined with src[c] by `r`; include_self false:
/// every position that receives a value starts from the reduction's identity instead of self;
/// Mean divides by the number of values a position received (plus one for self when included).
Error scatter_common(const char* op, const KernelArgs& a, Reduce r, bool include_self) {
  const Tensor& self = *a.inputs[0];
  const Tensor& index = *a.inputs[1];
  const Tensor& src = *a.inputs[2];
  Tensor& out = *a.outputs[0];
  KILN_RETURN_IF_ERROR(check_index_dtype(op, index));
  auto d = ir::gather_scatter_check(self.sizes, a.attrs.get_int("dim"), index.sizes, &src.sizes);
  if (!d.ok()) return Error(d.error().code(), std::string(op) + ": " + d.error().message());
  if (out.sizes != self.sizes || out.dtype != self.dtype || src.dtype != self.dtype) return mismatch(op, out, self.sizes);
  // Check every index before writing anything.
  KILN_RETURN_IF_ERROR(walk_scatter(op, self.sizes, *d, index, src.sizes, [](int64_t, int64_t) {}));
  copy_bytes(self, out);
  return visit_storage(self.dtype, [&](auto tag) -> Error {
    using T = decltype(tag);
    using N = Num<T>;
    using C = typename N::C;
    T* o = out.data_as<T>();
    std::vector<int64_t> count;
    if (r == Reduce::Mean) count.assign(static_cast<size_t>(out.numel()), include_self ? 1 : 0);
    if (!include_self) {
      const C id = identity<C>(r);
      (void)walk_scatter(op, self.sizes, *d, index, src.sizes, [&](int64_t dst, int64_t) { o[dst] = N::store(id); });
    }
    (void)walk_scatter(op, self.sizes, *d, index, src.sizes, [&](int64_t dst, int64_t s) {
      apply<T>(r, out.data, dst, src.data, s);
      if (r == Reduce::Mean) ++count[static_cast<size_t>(dst)];
    });
    if (r == Reduce::Mean) {
      for (size_t i = 0; i < count.size(); ++i) {
        if (count[i] > 1) o[i] = N::store(mean_of<C>(N::load(o[i]), count[i]));
      }
    }
    return {};
  });
}

Error scatter(const KernelArgs& a) {
  Reduce r = Reduce::Assign;
  if (!a.attrs.is_none("reduce")) {
    const std::string s = a.attrs.get_string("reduce");
    if (s == "add") r = Reduce::Sum;
    else if (s == "multiply") r = Reduce::Prod;
    else return Error(ErrorCode::InvalidArgument, "aten.scatter: reduce must be 'add' or 'multiply'");
  }
  return scatter_common("aten.scatter", a, r, true);
}

Error scatter_add(const KernelArgs& a) { return scatter_common("aten.scatter_add", a, Reduce::Sum, true); }

Error scatter_reduce(const KernelArgs& a) {
  const std::string s = a.attrs.get_string("reduce");
  Reduce r;
  if (s == "sum") r = Reduce::Sum;
  else if (s == "prod") r = Reduce::Prod;
  else if (s == "mean") r = Reduce::Mean;
  else if (s == "amax") r = Reduce::Max;
  else if (s == "amin") r = Reduce::Min;
  else return Error(ErrorCode::InvalidArgument, "aten.scatter_reduce: unknown reduce '" + s + "'");
  if (a.inputs[0]->dtype == DType::Bool) return Error(ErrorCode::NotSupported, "aten.scatter_reduce: bool");
  return scatter_common("aten.scatter_reduce", a, r, a.attrs.get_bool("include_self"));
}

/// out = self; then src's elements (row-major) written into the strided view `v` of out.
/// In place: out may be exactly self's bytes (the planner's in-place state update: slice
/// assignment into a KV cache); copy_bytes then copies nothing. The view comes from attributes
/// only and is checked, as are the sizes, before anything is written.
Error write_view(const char* op, const Tensor& self, const Tensor& src, Result<sr::StridedView> v, Tensor& out) {
  if (!v.ok()) return Error(v.error().code(), std::string(op) + ": " + v.error().message());
  if (out.sizes != self.sizes || out.dtype != self.dtype || src.dtype != self.dtype || src.sizes != v->sizes) {
    return mismatch(op, out, self.sizes);
  }
  copy_bytes(self, out);
  const size_t es = dtype_size(self.dtype);
  const auto* s = static_cast<const uint8_t*>(src.data);
  auto* o = static_cast<uint8_t*>(out.data);
  std::vector<int64_t> c(v->sizes.size(), 0);
  for (int64_t i = 0, n = src.numel(); i < n; ++i) {
    int64_t off = v->offset;
    for (size_t j = 0; j < c.size(); ++j) off += c[j] * v->strides[j];
    std::memcpy(o + static_cast<size_t>(off) * es, s + static_cast<size_t>(i) * es, es);
    next_coord(c, v->sizes);
  }
  return {};
}

Error select_scatter(const KernelArgs& a) {
  const Tensor& self = *a.inputs[0];
  return write_view("aten.select_scatter", self, *a.inputs[1],
                    sr::select_view(self.sizes, a.attrs.get_int("dim"), a.attrs.get_int("index")), *a.outputs[0]);
}

Error slice_scatter(const KernelArgs& a) {
  const Tensor& self = *a.inputs[0];
  std::optional<int64_t> start, end;
  if (!a.attrs.is_none("start")) start = a.attrs.get_int("start");
  if (!a.attrs.is_none("end")) end = a.attrs.get_int("end");
  return write_view("aten.slice_scatter", self, *a.inputs[1],
                    sr::slice_view(self.sizes, a.attrs.get_int("dim"), start, end, a.attrs.get_int("step")),
                    *a.outputs[0]);
}

// torch.masked_scatter: out = self broadcast with mask; the k-th position (row-major) where the
// mask is true gets source's k-th element (source read as flat). InvalidArgument when source has
// fewer elements than that.
Error masked_scatter(const KernelArgs& a) {
  const char* op = "aten.masked_scatter";
  const Tensor& self = *a.inputs[0];
  const Tensor& mask = *a.inputs[1];
  const Tensor& source = *a.inputs[2];
  Tensor& out = *a.outputs[0];
  auto b = broadcast_shapes(self.sizes, mask.sizes);
  if (!b.ok() || out.sizes != b.value() || out.dtype != self.dtype || source.dtype != self.dtype ||
      mask.dtype != DType::Bool) {
    return mismatch(op, out, b.ok() ? b.value() : self.sizes);
  }
  const BroadcastIndex mb(mask.sizes, out.sizes);
  const BroadcastIndex sb(self.sizes, out.sizes);
  const auto* m = mask.data_as<const bool>();
  const int64_t n = out.numel();
  int64_t need = 0;
  for (int64_t i = 0; i < n; ++i) need += m[mb(i)] ? 1 : 0;
  if (need > source.numel()) {
    return Error(ErrorCode::InvalidArgument, std::string(op) + ": the mask selects " + std::to_string(need) +
                                                 " elements but source has only " + std::to_string(source.numel()));
  }
  const size_t es = dtype_size(self.dtype);
  const auto* s = static_cast<const uint8_t*>(source.data);
  const auto* x = static_cast<const uint8_t*>(self.data);
  auto* o = static_cast<uint8_t*>(out.data);
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* from = m[mb(i)] ? s + static_cast<size_t>(k++) * es : x + static_cast<size_t>(sb(i)) * es;
    std::memcpy(o + static_cast<size_t>(i) * es, from, es);
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// _embedding_bag (output 0)
// ---------------------------------------------------------------------------------------------

// Bag b holds indices[offsets[b] : offsets[b+1]] (the last bag ends at len(indices) unless
// include_last_offset); rows equal to padding_idx (>= 0) are skipped. mode 0: sum of the rows
// (times per_sample_weights), 1: their mean, 2: their elementwise max; an empty bag is zeros
// (PyTorch aten/src/ATen/native/EmbeddingBag.cpp). offsets must start at 0 and be non-decreasing
// within [0, len(indices)]; indices must lie in [0, num_embeddings): InvalidArgument otherwise.
Error embedding_bag(const KernelArgs& a) {
  const char* op = "aten._embedding_bag";
  const Tensor& w = *a.inputs[0];
  const Tensor& indices = *a.inputs[1];
  const Tensor& offsets = *a.inputs[2];
  const Tensor* psw = a.inputs[3];
  Tensor& out = *a.outputs[0];
  const bool last = a.attrs.get_bool("include_last_offset");
  const int64_t nb = offsets.numel() - (last ? 1 : 0);
  if (w.dim() != 2 || out.sizes != std::vector<int64_t>{nb, w.sizes[1]} || out.dtype != w.dtype) {
    return mismatch(op, out, {nb, w.dim() == 2 ? w.sizes[1] : 0});
  }
  KILN_RETURN_IF_ERROR(check_index_dtype(op, indices));
  KILN_RETURN_IF_ERROR(check_index_dtype(op, offsets));
  const int64_t V = w.sizes[0], D = w.sizes[1], N = indices.numel();
  if (psw != nullptr && (psw->numel() != N || psw->dtype != w.dtype)) {
    return Error(ErrorCode::Internal, std::string(op) + ": per_sample_weights do not match indices");
  }
  const int64_t mode = a.attrs.get_int("mode");
  const int64_t pad = a.attrs.get_int("padding_idx");
  const IndexTensor idx = index_of(indices);
  const IndexTensor off = index_of(offsets);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t v = idx.at(i);
    if (v < 0 || v >= V) return out_of_range(op, v, 0, V);
  }
  for (int64_t b = 0; b < offsets.numel(); ++b) {
    const int64_t s = off.at(b);
    const int64_t prev = b == 0 ? 0 : off.at(b - 1);
    if ((b == 0 && s != 0) || s < prev || s > N) {
      return Error(ErrorCode::InvalidArgument, std::string(op) + ": offsets[" + std::to_string(b) + "] = " +
                                                   std::to_string(s) + " (offsets must start at 0 and be "
                                                   "non-decreasing up to the number of indices, " + std::to_string(N) + ")");
    }
  }
  return visit_storage(w.dtype, [&](auto tag) -> Error {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      return Error(ErrorCode::NotSupported, std::string(op) + ": floating weights only");
    } else {
      using N_ = Num<T>;
      using C = typename N_::C;
      const T* wp = w.data_as<const T>();
      const T* pp = psw ? psw->data_as<const T>() : nullptr;
      T* o = out.data_as<T>();
      std::vector<C> acc(static_cast<size_t>(D));
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t s = off.at(b);
        const int64_t e = b + 1 < offsets.numel() ? off.at(b + 1) : N;
        std::fill(acc.begin(), acc.end(), C(0));
        int64_t count = 0;
        for (int64_t i = s; i < e; ++i) {
          const int64_t v = idx.at(i);
          if (pad >= 0 && v == pad) continue;
          const T* row = wp + v * D;
          const C scale = pp ? N_::load(pp[i]) : C(1);
          for (int64_t j = 0; j < D; ++j) {
            const C x = N_::load(row[j]);
            if (mode == 2) acc[static_cast<size_t>(j)] = count == 0 ? x : max_of(acc[static_cast<size_t>(j)], x);
            else acc[static_cast<size_t>(j)] += pp ? x * scale : x;
          }
          ++count;
        }
        for (int64_t j = 0; j < D; ++j) {
          C v = acc[static_cast<size_t>(j)];
          if (mode == 1 && count > 0) v = v / static_cast<C>(count);
          o[b * D + j] = N_::store(v);
        }
      }
      return {};
    }
  });
}

}  // namespace

void register_portable_indexing(KernelRegistry& r) {
  r.add("aten.index", index);
  r.add("aten.index_put", index_put);
  r.add("aten.gather", gather);
  r.add("aten.index_select", index_select);
  r.add("aten.scatter", scatter);
  r.add("aten.scatter_add", scatter_add);
  r.add("aten.scatter_reduce", scatter_reduce);
  r.add("aten.select_scatter", select_scatter);
  r.add("aten.slice_scatter", slice_scatter);
  r.add("aten.masked_scatter", masked_scatter);
  r.add("aten._embedding_bag", embedding_bag);
}

}  // namespace kiln

// Indexing op definitions (docs/op-set.md, family "indexing"): advanced indexing (index,
// index_put), gather / index_select, the scatter family (scatter, scatter_add, scatter_reduce,
// select_scatter, slice_scatter, masked_scatter) and _embedding_bag. Semantics are PyTorch
// eager's (aten/src/ATen/native/TensorAdvancedIndexing.cpp, ScatterGatherChecks.h,
// EmbeddingBag.cpp). The data moved keeps its dtype; every Kiln dtype is supported for the data
// (the arithmetic reductions as noted per op). Index tensors are int64 or int32 (PyTorch takes
// int64 for gather/scatter; int32 is accepted too); their values are data-dependent and bound-checked
// by the kernels (InvalidArgument naming the op, the index value and the dim).
//
// Kiln representation of the None gaps of aten.index.Tensor / aten.index_put: the node is
// variadic, its inputs are self (then values, for index_put), then only the index tensors that are
// not None; the attribute `dims` lists, per index tensor, the dim of self it indexes (for a bool
// mask of index_put, the first of the mask.dim() dims it covers). E.g. x[:, i, :, j] is
// aten.index(x, i, j) with dims [1, 3].
#include "ir/ops/indexing.h"

#include <algorithm>

#include "ir/op_registry.h"
#include "ir/ops/shape_rules.h"

namespace kiln {

namespace index_rules {
namespace {
Error invalid(std::string m) { return Error(ErrorCode::InvalidArgument, std::move(m)); }
int64_t size_or_1(const std::vector<int64_t>& s, size_t d) { return s.empty() ? 1 : s[d]; }
}  // namespace

Result<AdvancedIndex> advanced_index(const std::vector<int64_t>& self_sizes, const std::vector<int64_t>& dims,
                                     const std::vector<std::vector<int64_t>>& index_sizes) {
  const auto rank = static_cast<int64_t>(self_sizes.size());
  if (rank == 0) return invalid("self: a 0-dim tensor cannot be indexed by a tensor (too many indices)");
  if (dims.empty() || dims.size() != index_sizes.size()) {
    return invalid("dims: needs one entry per index tensor (" + std::to_string(index_sizes.size()) + "), got " +
                   std::to_string(dims.size()));
  }
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] < 0 || dims[k] >= rank || (k > 0 && dims[k] <= dims[k - 1])) {
      return invalid("dims: " + sizes_to_string(dims) + " must be strictly increasing dims of self (rank " +
                     std::to_string(rank) + ")");
    }
  }
  AdvancedIndex r;
  for (const auto& s : index_sizes) {
    auto b = broadcast_shapes(r.bcast, s);
    if (!b.ok()) return invalid("indices: " + b.error().message());
    r.bcast = std::move(b.value());
  }
  bool adjacent = true;
  for (size_t k = 1; k < dims.size(); ++k) adjacent = adjacent && dims[k] == dims[k - 1] + 1;
  std::vector<bool> indexed(static_cast<size_t>(rank), false);
  for (int64_t d : dims) indexed[static_cast<size_t>(d)] = true;
  auto put_bcast = [&] {
    r.bcast_pos = static_cast<int64_t>(r.out_sizes.size());
    for (int64_t s : r.bcast) {
      r.out_sizes.push_back(s);
      r.out_to_self.push_back(-1);
    }
  };
  if (!adjacent) put_bcast();
  for (int64_t d = 0; d < rank; ++d) {
    if (indexed[static_cast<size_t>(d)]) {
      if (adjacent && d == dims[0]) put_bcast();
      continue;
    }
    r.out_sizes.push_back(self_sizes[static_cast<size_t>(d)]);
    r.out_to_self.push_back(d);
  }
  auto n = shape_rules::checked_numel(r.out_sizes);
  if (!n.ok()) return n.error();
  return r;
}

Result<int64_t> gather_scatter_check(const std::vector<int64_t>& self_sizes, int64_t dim,
                                     const std::vector<int64_t>& index_sizes, const std::vector<int64_t>* src_sizes) {
  const auto rank = static_cast<int64_t>(self_sizes.size());
  auto d = wrap_dim(dim, rank);
  if (!d.ok()) return invalid("dim: " + d.error().message());
  const auto nonempty = [](size_t r) { return r == 0 ? size_t{1} : r; };
  if (nonempty(index_sizes.size()) != nonempty(self_sizes.size())) {
    return invalid("index: must have the same number of dims as self (" + std::to_string(rank) + "), got " +
                   sizes_to_string(index_sizes));
  }
  if (src_sizes != nullptr && nonempty(src_sizes->size()) != nonempty(self_sizes.size())) {
    return invalid("src: must have the same number of dims as self (" + std::to_string(rank) + "), got " +
                   sizes_to_string(*src_sizes));
  }
  int64_t numel = 1;
  for (int64_t s : index_sizes) numel *= s;
  if (numel == 0) return *d;  // PyTorch skips the size checks for an empty index
  for (size_t k = 0; k < nonempty(self_sizes.size()); ++k) {
    const int64_t i = size_or_1(index_sizes, k);
    if (static_cast<int64_t>(k) != *d && i > size_or_1(self_sizes, k)) {
      return invalid("index: size " + sizes_to_string(index_sizes) + " exceeds self " + sizes_to_string(self_sizes) +
                     " in dim " + std::to_string(k) + " (only dim " + std::to_string(*d) + " may be larger)");
    }
    if (src_sizes != nullptr && i > size_or_1(*src_sizes, k)) {
      return invalid("index: size " + sizes_to_string(index_sizes) + " exceeds src " + sizes_to_string(*src_sizes) +
                     " in dim " + std::to_string(k));
    }
  }
  return *d;
}

}  // namespace index_rules

namespace {

namespace ir = index_rules;
namespace sr = shape_rules;
using Types = Result<std::vector<TensorType>>;

Types one(DType dtype, std::vector<int64_t> sizes) { return std::vector<TensorType>{{dtype, std::move(sizes)}}; }

Error invalid(std::string m) { return Error(ErrorCode::InvalidArgument, std::move(m)); }

bool is_index_dtype(DType d) { return d == DType::Int64 || d == DType::Int32; }

Error check_index_dtype(const TensorType& t, const std::string& what) {
  if (!is_index_dtype(t.dtype)) {
    return invalid(what + ": must be int64 or int32, got " + dtype_name(t.dtype));
  }
  return {};
}

Error same_dtype(const TensorType& self, const TensorType& other, const char* what) {
  if (self.dtype != other.dtype) {
    return invalid(std::string(what) + ": dtype " + dtype_name(other.dtype) + " must equal self's " +
                   dtype_name(self.dtype));
  }
  return {};
}

// aten.index(self, *indices; dims): self[...] with integer index tensors on `dims`.
Types infer_index(InputTypes in, const Attributes& a) {
  if (in.size() < 2) return invalid("indices: at least one index tensor is needed");
  std::vector<std::vector<int64_t>> shapes;
  for (size_t k = 1; k < in.size(); ++k) {
    if (in[k]->dtype == DType::Bool || in[k]->dtype == DType::UInt8) {
      return Error(ErrorCode::NotSupported,
                   "indices: boolean-mask indexing has a data-dependent output shape (not supported)");
    }
    KILN_RETURN_IF_ERROR(check_index_dtype(*in[k], "indices"));
    shapes.push_back(in[k]->sizes);
  }
  auto r = ir::advanced_index(in[0]->sizes, a.get_ints("dims"), shapes);
  if (!r.ok()) return r.error();
  return one(in[0]->dtype, std::move(r->out_sizes));
}

// aten.index_put(self, values, *indices; dims, accumulate): out = self with out[indices] = values
// (or += values). A bool mask covers mask.dim() dims starting at its `dims` entry (its sizes must
// match those of self); the number of true elements is known only at run time, so the kernel
// checks the broadcast of `values` then.
Types infer_index_put(InputTypes in, const Attributes& a) {
  if (in.size() < 3) return invalid("indices: at least one index tensor is needed");
  const TensorType& self = *in[0];
  KILN_RETURN_IF_ERROR(same_dtype(self, *in[1], "values"));
  const auto dims = a.get_ints("dims");
  if (dims.size() != in.size() - 2) return invalid("dims: needs one entry per index tensor");
  const auto rank = static_cast<int64_t>(self.sizes.size());
  if (rank == 0) return invalid("self: a 0-dim tensor cannot be indexed by a tensor (too many indices)");
  int64_t next = 0;  // first dim not yet covered
  bool has_mask = false;
  std::vector<int64_t> idims;
  std::vector<std::vector<int64_t>> shapes;
  for (size_t k = 0; k < dims.size(); ++k) {
    const TensorType& t = *in[k + 2];
    const bool mask = t.dtype == DType::Bool;
    if (!mask) KILN_RETURN_IF_ERROR(check_index_dtype(t, "indices"));
    const int64_t covers = mask ? std::max<int64_t>(t.dim(), 1) : 1;
    if (dims[k] < next || dims[k] + covers > rank) {
      return invalid("dims: " + sizes_to_string(dims) + " must be increasing dims of self (rank " +
                     std::to_string(rank) + "), each index covering its own dims");
    }
    if (mask) {
      has_mask = true;
      if (t.dim() == 0) return Error(ErrorCode::NotSupported, "indices: a 0-dim bool index is not supported");
      for (int64_t j = 0; j < t.dim(); ++j) {
        if (t.sizes[static_cast<size_t>(j)] != self.sizes[static_cast<size_t>(dims[k] + j)]) {
          return invalid("indices: the bool mask " + sizes_to_string(t.sizes) + " does not match self " +
                         sizes_to_string(self.sizes) + " at dim " + std::to_string(dims[k] + j));
        }
      }
    }
    for (int64_t j = 0; j < covers; ++j) idims.push_back(dims[k] + j);
    for (int64_t j = 0; j < covers; ++j) shapes.push_back(mask ? std::vector<int64_t>{1} : t.sizes);
    next = dims[k] + covers;
  }
  auto r = ir::advanced_index(self.sizes, idims, shapes);
  if (!r.ok()) return r.error();
  if (!has_mask) {  // with a mask the count of true elements (a broadcast dim here) is known at run time
    auto b = broadcast_shapes(in[1]->sizes, r->out_sizes);
    if (!b.ok() || b.value() != r->out_sizes) {
      return invalid("values: shape " + sizes_to_string(in[1]->sizes) + " cannot be broadcast to the indexed shape " +
                     sizes_to_string(r->out_sizes));
    }
  }
  return one(self.dtype, self.sizes);
}

Types infer_gather(InputTypes in, const Attributes& a) {
  KILN_RETURN_IF_ERROR(check_index_dtype(*in[1], "index"));
  auto d = ir::gather_scatter_check(in[0]->sizes, a.get_int("dim"), in[1]->sizes, nullptr);
  if (!d.ok()) return d.error();
  return one(in[0]->dtype, in[1]->sizes);
}

Types infer_index_select(InputTypes in, const Attributes& a) {
  const TensorType& self = *in[0];
  const TensorType& idx = *in[1];
  KILN_RETURN_IF_ERROR(check_index_dtype(idx, "index"));
  if (idx.dim() > 1) return invalid("index: must be 0-D or 1-D, got " + sizes_to_string(idx.sizes));
  auto d = wrap_dim(a.get_int("dim"), self.dim());
  if (!d.ok()) return invalid("dim: " + d.error().message());
  if (self.dim() == 0) {
    if (idx.numel() != 1) return invalid("index: a 0-D self takes exactly one index");
    return one(self.dtype, {});
  }
  std::vector<int64_t> out = self.sizes;
  out[static_cast<size_t>(*d)] = idx.numel();
  return one(self.dtype, std::move(out));
}

// scatter / scatter_add / scatter_reduce: self, index, src (same dtype as self).
Error check_scatter(InputTypes in, const Attributes& a) {
  KILN_RETURN_IF_ERROR(check_index_dtype(*in[1], "index"));
  KILN_RETURN_IF_ERROR(same_dtype(*in[0], *in[2], "src"));
  auto d = ir::gather_scatter_check(in[0]->sizes, a.get_int("dim"), in[1]->sizes, &in[2]->sizes);
  return d.ok() ? Error{} : d.error();
}

bool arithmetic_reduce_dtype(DType d) { return d != DType::Bool; }

Types infer_scatter(InputTypes in, const Attributes& a) {
  KILN_RETURN_IF_ERROR(check_scatter(in, a));
  if (!a.is_none("reduce")) {
    const std::string r = a.get_string("reduce");
    if (r != "add" && r != "multiply") return invalid("reduce: must be 'add' or 'multiply', got '" + r + "'");
    if (!arithmetic_reduce_dtype(in[0]->dtype)) return Error(ErrorCode::NotSupported, "reduce: not supported for bool");
  }
  return one(in[0]->dtype, in[0]->sizes);
}

Types infer_scatter_add(InputTypes in, const Attributes& a) {
  KILN_RETURN_IF_ERROR(check_scatter(in, a));
  return one(in[0]->dtype, in[0]->sizes);
}

Types infer_scatter_reduce(InputTypes in, const Attributes& a) {
  KILN_RETURN_IF_ERROR(check_scatter(in, a));
  const std::string r = a.get_string("reduce");
  if (r != "sum" && r != "prod" && r != "mean" && r != "amax" && r != "amin") {
    return invalid("reduce: must be one of sum, prod, mean, amax, amin, got '" + r + "'");
  }
  if (!arithmetic_reduce_dtype(in[0]->dtype)) return Error(ErrorCode::NotSupported, "reduce: not supported for bool");
  return one(in[0]->dtype, in[0]->sizes);
}

Types infer_select_scatter(InputTypes in, const Attributes& a) {
  KILN_RETURN_IF_ERROR(same_dtype(*in[0], *in[1], "src"));
  auto v = sr::select_view(in[0]->sizes, a.get_int("dim"), a.get_int("index"));
  if (!v.ok()) return v.error();
  if (v->sizes != in[1]->sizes) {
    return invalid("src: shape " + sizes_to_string(in[1]->sizes) + " must be the selected slice's " +
                   sizes_to_string(v->sizes));
  }
  return one(in[0]->dtype, in[0]->sizes);
}

std::optional<int64_t> optional_int(const Attributes& a, const char* name) {
  if (a.is_none(name)) return std::nullopt;
  return a.get_int(name);
}

Types infer_slice_scatter(InputTypes in, const Attributes& a) {
  KILN_RETURN_IF_ERROR(same_dtype(*in[0], *in[1], "src"));
  auto v = sr::slice_view(in[0]->sizes, a.get_int("dim"), optional_int(a, "start"), optional_int(a, "end"),
                          a.get_int("step"));
  if (!v.ok()) return v.error();
  if (v->sizes != in[1]->sizes) {
    return invalid("src: shape " + sizes_to_string(in[1]->sizes) + " must be the slice's " + sizes_to_string(v->sizes));
  }
  return one(in[0]->dtype, in[0]->sizes);
}

// masked_scatter(self, mask, source): self and mask (bool) broadcast together; the output has the
// broadcast shape (PyTorch's out-of-place masked_scatter expands both, expand_outplace).
Types infer_masked_scatter(InputTypes in, const Attributes&) {
  if (in[1]->dtype != DType::Bool) return invalid(std::string("mask: must be bool, got ") + dtype_name(in[1]->dtype));
  KILN_RETURN_IF_ERROR(same_dtype(*in[0], *in[2], "source"));
  auto b = broadcast_shapes(in[0]->sizes, in[1]->sizes);
  if (!b.ok()) return invalid("mask: " + b.error().message());
  return one(in[0]->dtype, std::move(b.value()));
}

// _embedding_bag(weight [V, D], indices [N], offsets [B or B+1], per_sample_weights [N]?) -> [B, D].
Types infer_embedding_bag(InputTypes in, const Attributes& a) {
  const TensorType& w = *in[0];
  if (w.dim() != 2) return invalid("weight: must be 2-D [num_embeddings, embedding_dim], got " + sizes_to_string(w.sizes));
  if (w.dtype != DType::Float32 && w.dtype != DType::Float16 && w.dtype != DType::BFloat16 && w.dtype != DType::Float64) {
    return Error(ErrorCode::NotSupported, std::string("weight: floating dtypes only, got ") + dtype_name(w.dtype));
  }
  KILN_RETURN_IF_ERROR(check_index_dtype(*in[1], "indices"));
  KILN_RETURN_IF_ERROR(check_index_dtype(*in[2], "offsets"));
  if (in[1]->dtype != in[2]->dtype) return invalid("offsets: must have the dtype of indices");
  if (in[1]->dim() != 1) return invalid("indices: must be 1-D, got " + sizes_to_string(in[1]->sizes));
  if (in[2]->dim() != 1) return invalid("offsets: must be 1-D, got " + sizes_to_string(in[2]->sizes));
  const int64_t mode = a.get_int("mode");
  if (mode < 0 || mode > 2) return invalid("mode: must be 0 (sum), 1 (mean) or 2 (max), got " + std::to_string(mode));
  if (in[3] != nullptr) {
    if (mode != 0) return invalid("per_sample_weights: only supported with mode sum (0)");
    KILN_RETURN_IF_ERROR(same_dtype(w, *in[3], "per_sample_weights"));
    if (in[3]->sizes != in[1]->sizes) return invalid("per_sample_weights: must have the shape of indices");
  }
  int64_t bags = in[2]->sizes[0];
  if (a.get_bool("include_last_offset")) {
    if (bags < 1) return invalid("offsets: include_last_offset needs at least one offset");
    bags -= 1;
  }
  return one(w.dtype, {bags, w.sizes[1]});
}

AttrSpec required(std::string name, AttrKind kind) { return {std::move(name), kind, {}, true, false}; }
AttrSpec nullable(std::string name, AttrKind kind) { return {std::move(name), kind, {}, false, true}; }

}  // namespace

void register_indexing_ops(OpRegistry& r) {
  OpDef index{"aten.index", {{"self_then_indices"}}, {required("dims", AttrKind::Ints)}, 1, infer_index,
              "self[indices]: inputs self then the non-None int64/int32 index tensors, dims[k] = self dim of index "
              "k; indices broadcast; adjacent indexed dims keep their place, else go first; negative indices wrap; "
              "out of range is InvalidArgument at run time (aten.index.Tensor)"};
  index.variadic = true;
  r.add(std::move(index));
  OpDef put{"aten.index_put", {{"self_values_then_indices"}},
            {required("dims", AttrKind::Ints), {"accumulate", AttrKind::Bool, false}}, 1, infer_index_put,
            "self with self[indices] = values (accumulate: +=, duplicates summed; bool: logical or); inputs self, "
            "values, then the non-None index tensors (int64/int32, or bool masks covering mask.dim() dims) "
            "(aten.index_put)"};
  put.variadic = true;
  r.add(std::move(put));
  r.add({"aten.gather", {{"self"}, {"index"}}, {required("dim", AttrKind::Int), {"sparse_grad", AttrKind::Bool, false}},
         1, infer_gather, "out[i][j] = self[index[i][j]][j] (dim 0), out shape = index's (torch.gather)"});
  r.add({"aten.index_select", {{"self"}, {"index"}}, {required("dim", AttrKind::Int)}, 1, infer_index_select,
         "self's slices index[k] along dim, 0-D or 1-D index (torch.index_select)"});
  r.add({"aten.scatter", {{"self"}, {"index"}, {"src"}}, {required("dim", AttrKind::Int), nullable("reduce", AttrKind::String)},
         1, infer_scatter,
         "self with self[index[i][j]][j] = src[i][j] (dim 0); reduce None, 'add' or 'multiply' "
         "(aten.scatter.src / .reduce; .value is captured with an expanded constant src)"});
  r.add({"aten.scatter_add", {{"self"}, {"index"}, {"src"}}, {required("dim", AttrKind::Int)}, 1, infer_scatter_add,
         "self with self[index[i][j]][j] += src[i][j] (dim 0) (torch.scatter_add)"});
  r.add({"aten.scatter_reduce", {{"self"}, {"index"}, {"src"}},
         {required("dim", AttrKind::Int), required("reduce", AttrKind::String), {"include_self", AttrKind::Bool, true}},
         1, infer_scatter_reduce,
         "scatter with reduce sum/prod/mean/amax/amin, include_self (aten.scatter_reduce.two); integer mean floors"});
  r.add({"aten.select_scatter", {{"self"}, {"src"}}, {required("dim", AttrKind::Int), required("index", AttrKind::Int)},
         1, infer_select_scatter, "self with self.select(dim, index) replaced by src (torch.select_scatter)"});
  r.add({"aten.slice_scatter", {{"self"}, {"src"}},
         {{"dim", AttrKind::Int, int64_t{0}}, nullable("start", AttrKind::Int), nullable("end", AttrKind::Int),
          {"step", AttrKind::Int, int64_t{1}}},
         1, infer_slice_scatter, "self with self[start:end:step] along dim replaced by src (torch.slice_scatter)"});
  r.add({"aten.masked_scatter", {{"self"}, {"mask"}, {"source"}}, {}, 1, infer_masked_scatter,
         "self (broadcast with mask) with the positions where mask is true taken from source's elements in order; too "
         "small a source is InvalidArgument at run time (torch.masked_scatter)"});
  r.add({"aten._embedding_bag", {{"weight"}, {"indices"}, {"offsets"}, {"per_sample_weights", true}},
         {{"scale_grad_by_freq", AttrKind::Bool, false}, {"mode", AttrKind::Int, int64_t{0}},
          {"sparse", AttrKind::Bool, false}, {"include_last_offset", AttrKind::Bool, false},
          {"padding_idx", AttrKind::Int, int64_t{-1}}},
         1, infer_embedding_bag,
         "output 0 of torch's _embedding_bag: per bag (offsets) the sum/mean/max of weight rows; padding_idx rows "
         "skipped; empty bags are zeros (aten._embedding_bag)"});
}

}  // namespace kiln

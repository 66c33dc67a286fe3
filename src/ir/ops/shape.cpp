// Shape / data-movement op definitions: view, permute, transpose, expand, slice, select,
// squeeze, unsqueeze, cat, embedding, constant_pad_nd. Semantics are PyTorch eager's
// (aten/src/ATen/native/TensorShape.cpp, Embedding.cpp, PadNd.cpp); every output is a new
// contiguous tensor of the input's dtype, and every Kiln dtype is supported (kernels copy bytes).
// The size rules live in shape_rules.h so that kernels compute exactly what inference checked.
#include <cmath>

#include "ir/op_registry.h"
#include "ir/ops/shape_rules.h"

namespace kiln {
namespace {

namespace sr = shape_rules;
using Types = Result<std::vector<TensorType>>;

Types one(DType dtype, std::vector<int64_t> sizes) { return std::vector<TensorType>{{dtype, std::move(sizes)}}; }

std::optional<std::vector<int64_t>> optional_ints(const Attributes& a, const char* name) {
  if (a.is_none(name)) return std::nullopt;
  return a.get_ints(name);
}
std::optional<int64_t> optional_int(const Attributes& a, const char* name) {
  if (a.is_none(name)) return std::nullopt;
  return a.get_int(name);
}

Types from_view(DType dtype, Result<sr::StridedView> v) {
  if (!v.ok()) return v.error();
  return one(dtype, std::move(v->sizes));
}

Types infer_view(InputTypes in, const Attributes& a) {
  auto sizes = sr::view_sizes(in[0]->numel(), a.get_ints("size"));
  if (!sizes.ok()) return sizes.error();
  return one(in[0]->dtype, std::move(sizes.value()));
}

Types infer_permute(InputTypes in, const Attributes& a) {
  return from_view(in[0]->dtype, sr::permute_view(in[0]->sizes, a.get_ints("dims")));
}

Types infer_transpose(InputTypes in, const Attributes& a) {
  return from_view(in[0]->dtype, sr::transpose_view(in[0]->sizes, a.get_int("dim0"), a.get_int("dim1")));
}

Types infer_expand(InputTypes in, const Attributes& a) {
  return from_view(in[0]->dtype, sr::expand_view(in[0]->sizes, a.get_ints("size")));
}

Types infer_slice(InputTypes in, const Attributes& a) {
  return from_view(in[0]->dtype, sr::slice_view(in[0]->sizes, a.get_int("dim"), optional_int(a, "start"),
                                                optional_int(a, "end"), a.get_int("step")));
}

Types infer_select(InputTypes in, const Attributes& a) {
  return from_view(in[0]->dtype, sr::select_view(in[0]->sizes, a.get_int("dim"), a.get_int("index")));
}

Types infer_squeeze(InputTypes in, const Attributes& a) {
  auto sizes = sr::squeeze_sizes(in[0]->sizes, optional_ints(a, "dim"));
  if (!sizes.ok()) return sizes.error();
  return one(in[0]->dtype, std::move(sizes.value()));
}

Types infer_unsqueeze(InputTypes in, const Attributes& a) {
  auto sizes = sr::unsqueeze_sizes(in[0]->sizes, a.get_int("dim"));
  if (!sizes.ok()) return sizes.error();
  return one(in[0]->dtype, std::move(sizes.value()));
}

// torch.cat legacy rule (aten/src/ATen/native/TensorShape.cpp, cat_should_skip_tensor): a 1-D
// tensor of shape [0] is skipped whatever the other inputs' shapes.
bool cat_skipped(const TensorType& t) { return t.sizes.size() == 1 && t.sizes[0] == 0; }

Types infer_cat(InputTypes in, const Attributes& a) {
  const DType dtype = in[0]->dtype;
  const TensorType* ref = nullptr;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i]->dtype != dtype) {
      return Error(ErrorCode::InvalidArgument, "tensors: all inputs must have the same dtype, tensor 0 is " +
                                                   std::string(dtype_name(dtype)) + " but tensor " + std::to_string(i) +
                                                   " is " + dtype_name(in[i]->dtype));
    }
    if (in[i]->sizes.empty()) {
      return Error(ErrorCode::InvalidArgument,
                   "tensors: zero-dimensional tensor (at position " + std::to_string(i) + ") cannot be concatenated");
    }
    if (ref == nullptr && !cat_skipped(*in[i])) ref = in[i];
  }
  if (ref == nullptr) {  // every input is an empty [0]
    auto d = wrap_dim(a.get_int("dim"), 1);
    if (!d.ok()) return Error(ErrorCode::InvalidArgument, "dim: " + d.error().message());
    return one(dtype, {0});
  }
  const int64_t rank = ref->dim();
  auto d = wrap_dim(a.get_int("dim"), rank);
  if (!d.ok()) return Error(ErrorCode::InvalidArgument, "dim: " + d.error().message());
  std::vector<int64_t> out = ref->sizes;
  out[static_cast<size_t>(*d)] = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorType& t = *in[i];
    if (cat_skipped(t)) continue;
    if (t.dim() != rank) {
      return Error(ErrorCode::InvalidArgument, "tensors: tensor " + std::to_string(i) + " has rank " +
                                                   std::to_string(t.dim()) + " but the others have rank " +
                                                   std::to_string(rank));
    }
    for (int64_t k = 0; k < rank; ++k) {
      if (k != *d && t.sizes[static_cast<size_t>(k)] != ref->sizes[static_cast<size_t>(k)]) {
        return Error(ErrorCode::InvalidArgument,
                     "tensors: sizes must match except in dimension " + std::to_string(*d) + ": tensor " +
                         std::to_string(i) + " is " + sizes_to_string(t.sizes) + ", expected " +
                         sizes_to_string(ref->sizes) + " there");
      }
    }
    out[static_cast<size_t>(*d)] += t.sizes[static_cast<size_t>(*d)];
  }
  return one(dtype, std::move(out));
}

Types infer_embedding(InputTypes in, const Attributes&) {
  const TensorType& w = *in[0];
  const TensorType& idx = *in[1];
  if (w.dim() != 2) {
    return Error(ErrorCode::InvalidArgument, "weight: must be 2-D [num_embeddings, embedding_dim], got " +
                                                 sizes_to_string(w.sizes));
  }
  if (idx.dtype != DType::Int64 && idx.dtype != DType::Int32) {
    return Error(ErrorCode::InvalidArgument,
                 std::string("indices: must be int64 or int32, got ") + dtype_name(idx.dtype));
  }
  std::vector<int64_t> out = idx.sizes;
  out.push_back(w.sizes[1]);
  auto n = sr::checked_numel(out);
  if (!n.ok()) return n.error();
  return one(w.dtype, std::move(out));
}

// The pad value must be representable in an integer dtype (torch rejects an overflowing
// scalar too); it is truncated toward zero as torch does (1.7 -> 1). bool takes value != 0.
Error check_pad_value(DType dtype, double v) {
  double lo = 0, hi = 0;
  switch (dtype) {
    case DType::Int64: lo = -9223372036854775808.0; hi = 9223372036854775807.0; break;
    case DType::Int32: lo = -2147483648.0; hi = 2147483647.0; break;
    case DType::Int8: lo = -128.0; hi = 127.0; break;
    case DType::UInt8: lo = 0.0; hi = 255.0; break;
    default: return {};
  }
  // Compare after truncation; the int64 bound 2^63 itself is excluded.
  const double t = std::trunc(v);
  if (!(t >= lo && (dtype == DType::Int64 ? t < 9223372036854775808.0 : t <= hi))) {
    return Error(ErrorCode::InvalidArgument, "value: " + std::to_string(v) + " cannot be converted to " +
                                                 dtype_name(dtype) + " without overflow");
  }
  return {};
}

Types infer_constant_pad_nd(InputTypes in, const Attributes& a) {
  KILN_RETURN_IF_ERROR(check_pad_value(in[0]->dtype, a.get_float("value")));
  auto plan = sr::constant_pad_plan(in[0]->sizes, a.get_ints("pad"));
  if (!plan.ok()) return plan.error();
  return one(in[0]->dtype, std::move(plan->out_sizes));
}

AttrSpec required(std::string name, AttrKind kind) { return {std::move(name), kind, {}, true, false}; }
AttrSpec nullable(std::string name, AttrKind kind) { return {std::move(name), kind, {}, false, true}; }

}  // namespace

void register_shape_ops(OpRegistry& r) {
  r.add({"aten.view", {{"self"}}, {required("size", AttrKind::Ints)}, 1, infer_view,
         "self with new sizes (one -1 inferred), same elements in row-major order (torch.Tensor.view)"});
  r.add({"aten.permute", {{"self"}}, {required("dims", AttrKind::Ints)}, 1, infer_permute,
         "out dim i = self dim dims[i] (torch.permute)"});
  r.add({"aten.transpose", {{"self"}}, {required("dim0", AttrKind::Int), required("dim1", AttrKind::Int)}, 1,
         infer_transpose, "swaps dims dim0 and dim1 (torch.transpose)"});
  r.add({"aten.expand", {{"self"}}, {required("size", AttrKind::Ints), {"implicit", AttrKind::Bool, false}}, 1,
         infer_expand, "broadcasts size-1 dims and adds leading dims; -1 keeps a size (torch.Tensor.expand)"});
  r.add({"aten.slice", {{"self"}},
         {{"dim", AttrKind::Int, int64_t{0}}, nullable("start", AttrKind::Int), nullable("end", AttrKind::Int),
          {"step", AttrKind::Int, int64_t{1}}},
         1, infer_slice, "self[..., start:end:step, ...] along dim, start/end clamped as torch (aten.slice.Tensor)"});
  r.add({"aten.select", {{"self"}}, {required("dim", AttrKind::Int), required("index", AttrKind::Int)}, 1,
         infer_select, "self[..., index, ...] along dim, removing it (torch.select)"});
  r.add({"aten.squeeze", {{"self"}}, {nullable("dim", AttrKind::Ints)}, 1, infer_squeeze,
         "removes size-1 dims (all, or those listed; listed dims of other sizes stay) (aten.squeeze.dims)"});
  r.add({"aten.unsqueeze", {{"self"}}, {required("dim", AttrKind::Int)}, 1, infer_unsqueeze,
         "inserts a size-1 dim at dim (torch.unsqueeze)"});
  OpDef cat{"aten.cat", {{"tensors"}}, {{"dim", AttrKind::Int, int64_t{0}}}, 1, infer_cat,
            "concatenation along dim; same dtype; 1-D [0] inputs skipped (torch.cat)"};
  cat.variadic = true;
  r.add(std::move(cat));
  r.add({"aten.embedding", {{"weight"}, {"indices"}},
         {{"padding_idx", AttrKind::Int, int64_t{-1}}, {"scale_grad_by_freq", AttrKind::Bool, false},
          {"sparse", AttrKind::Bool, false}},
         1, infer_embedding,
         "weight[indices]: weight [V, D], int64/int32 indices of any shape -> indices.shape + [D]; indices "
         "out of [0, V) are InvalidArgument at run time; padding_idx etc. only affect training (torch.embedding)"});
  r.add({"aten.constant_pad_nd", {{"self"}}, {required("pad", AttrKind::Ints), {"value", AttrKind::Float, 0.0}}, 1,
         infer_constant_pad_nd,
         "pads (before, after) pairs from the last dim backwards with value; negative pads crop "
         "(torch.constant_pad_nd)"});
}

}  // namespace kiln

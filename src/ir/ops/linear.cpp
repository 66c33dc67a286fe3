// linear op definitions: aten.mm, aten.bmm, aten.addmm, aten.linear (float32).
#include "ir/op_registry.h"

namespace kiln {
namespace {

Error invalid(std::string msg) { return Error(ErrorCode::InvalidArgument, std::move(msg)); }

Error check_float32(InputTypes in) {
  for (const TensorType* t : in) {
    if (t != nullptr && t->dtype != DType::Float32) {
      return Error(ErrorCode::NotSupported, std::string("dtype ") + dtype_name(t->dtype) + " (float32 only)");
    }
  }
  return {};
}

Error check_rank(const TensorType& t, const char* name, int64_t rank) {
  if (t.dim() != rank) {
    return invalid(std::string(name) + " must be a " + std::to_string(rank) + "-D tensor, got size " +
                   sizes_to_string(t.sizes));
  }
  return {};
}

// Checks that `t` (named `name`) broadcasts to `target` without changing it (PyTorch expand rules).
Error check_broadcasts_to(const TensorType& t, const char* name, const std::vector<int64_t>& target) {
  auto b = broadcast_shapes(t.sizes, target);
  if (!b.ok() || b.value() != target) {
    return invalid(std::string(name) + " of size " + sizes_to_string(t.sizes) + " cannot be broadcast to the output size " +
                   sizes_to_string(target));
  }
  return {};
}

std::string matrix_str(int64_t r, int64_t c) { return std::to_string(r) + "x" + std::to_string(c); }

// aten.mm: self [n, k] @ mat2 [k, m] -> [n, m].
Result<std::vector<TensorType>> infer_mm(InputTypes in, const Attributes&) {
  KILN_RETURN_IF_ERROR(check_float32(in));
  KILN_RETURN_IF_ERROR(check_rank(*in[0], "self", 2));
  KILN_RETURN_IF_ERROR(check_rank(*in[1], "mat2", 2));
  const auto& a = in[0]->sizes;
  const auto& b = in[1]->sizes;
  if (a[1] != b[0]) {
    return invalid("self and mat2 shapes cannot be multiplied (" + matrix_str(a[0], a[1]) + " and " +
                   matrix_str(b[0], b[1]) + ")");
  }
  return std::vector<TensorType>{{DType::Float32, {a[0], b[1]}}};
}

// aten.bmm: self [b, n, k] @ mat2 [b, k, m] -> [b, n, m] (no batch broadcasting, as torch.bmm).
Result<std::vector<TensorType>> infer_bmm(InputTypes in, const Attributes&) {
  KILN_RETURN_IF_ERROR(check_float32(in));
  KILN_RETURN_IF_ERROR(check_rank(*in[0], "self", 3));
  KILN_RETURN_IF_ERROR(check_rank(*in[1], "mat2", 3));
  const auto& a = in[0]->sizes;
  const auto& b = in[1]->sizes;
  if (a[0] != b[0]) {
    return invalid("batch sizes differ: self " + sizes_to_string(a) + ", mat2 " + sizes_to_string(b));
  }
  if (a[2] != b[1]) {
    return invalid("self and mat2 shapes cannot be multiplied (" + matrix_str(a[1], a[2]) + " and " +
                   matrix_str(b[1], b[2]) + ")");
  }
  return std::vector<TensorType>{{DType::Float32, {a[0], a[1], b[2]}}};
}

// aten.addmm: beta * self + alpha * (mat1 [n, k] @ mat2 [k, m]) -> [n, m]; self broadcasts to [n, m].
Result<std::vector<TensorType>> infer_addmm(InputTypes in, const Attributes&) {
  KILN_RETURN_IF_ERROR(check_float32(in));
  KILN_RETURN_IF_ERROR(check_rank(*in[1], "mat1", 2));
  KILN_RETURN_IF_ERROR(check_rank(*in[2], "mat2", 2));
  const auto& a = in[1]->sizes;
  const auto& b = in[2]->sizes;
  if (a[1] != b[0]) {
    return invalid("mat1 and mat2 shapes cannot be multiplied (" + matrix_str(a[0], a[1]) + " and " +
                   matrix_str(b[0], b[1]) + ")");
  }
  std::vector<int64_t> out = {a[0], b[1]};
  KILN_RETURN_IF_ERROR(check_broadcasts_to(*in[0], "self", out));
  return std::vector<TensorType>{{DType::Float32, std::move(out)}};
}

// aten.linear: input [..., in] (rank >= 1), weight [out, in], bias? broadcasting to [..., out].
Result<std::vector<TensorType>> infer_linear(InputTypes in, const Attributes&) {
  KILN_RETURN_IF_ERROR(check_float32(in));
  const TensorType& x = *in[0];
  const TensorType& w = *in[1];
  if (x.dim() < 1) return invalid("input must have at least 1 dimension, got a 0-d tensor");
  if (w.dim() == 1) return Error(ErrorCode::NotSupported, "1-D weight (only [out_features, in_features])");
  KILN_RETURN_IF_ERROR(check_rank(w, "weight", 2));
  if (x.sizes.back() != w.sizes[1]) {
    return invalid("input of size " + sizes_to_string(x.sizes) + " and weight of size " + sizes_to_string(w.sizes) +
                   " cannot be multiplied (in_features " + std::to_string(x.sizes.back()) + " != " +
                   std::to_string(w.sizes[1]) + ")");
  }
  std::vector<int64_t> out = x.sizes;
  out.back() = w.sizes[0];
  if (in[2] != nullptr) KILN_RETURN_IF_ERROR(check_broadcasts_to(*in[2], "bias", out));
  return std::vector<TensorType>{{DType::Float32, std::move(out)}};
}

}  // namespace

void register_linear_ops(OpRegistry& r) {
  r.add({"aten.mm", {{"self"}, {"mat2"}}, {}, 1, infer_mm, "matrix product [n,k] @ [k,m] (torch.mm)"});
  r.add({"aten.bmm", {{"self"}, {"mat2"}}, {}, 1, infer_bmm, "batched matrix product [b,n,k] @ [b,k,m] (torch.bmm)"});
  r.add({"aten.addmm",
         {{"self"}, {"mat1"}, {"mat2"}},
         {{"beta", AttrKind::Float, 1.0}, {"alpha", AttrKind::Float, 1.0}},
         1, infer_addmm,
         "beta * self + alpha * (mat1 @ mat2); self broadcasts; beta == 0 ignores self (torch.addmm)"});
  r.add({"aten.linear", {{"input"}, {"weight"}, {"bias", true}}, {}, 1, infer_linear,
         "input @ weight^T + bias over the last dim of input (torch.nn.functional.linear)"});
}

}  // namespace kiln

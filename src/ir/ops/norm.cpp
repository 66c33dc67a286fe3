// Normalization and attention op definitions: native_batch_norm (inference), native_layer_norm,
// native_group_norm, rms_norm and scaled_dot_product_attention. Semantics and argument names are
// ATen's (aten/src/ATen/native/native_functions.yaml); the multi-output norms are single-output
// Kiln ops (their first output, see docs/op-set.md).
#include <string>

#include "ir/op_registry.h"

namespace kiln {
namespace {

using Types = std::vector<TensorType>;

Error invalid(std::string msg) { return Error(ErrorCode::InvalidArgument, std::move(msg)); }
Error unsupported(std::string msg) { return Error(ErrorCode::NotSupported, std::move(msg)); }

/// NotSupported unless `t` is float32 (the portable kernels' only dtype).
Error require_float32(const TensorType& t, const char* what) {
  if (t.dtype != DType::Float32) {
    return unsupported(std::string(what) + ": dtype " + dtype_name(t.dtype) + " is not supported (float32 only)");
  }
  return {};
}

/// An optional per-feature parameter (weight, bias, running stats) must be float32 of exactly `shape`.
Error check_param(const TensorType* t, const char* what, const std::vector<int64_t>& shape) {
  if (t == nullptr) return {};
  KILN_RETURN_IF_ERROR(require_float32(*t, what));
  if (t->sizes != shape) {
    return invalid(std::string(what) + " must have shape " + sizes_to_string(shape) + ", got " +
                   sizes_to_string(t->sizes));
  }
  return {};
}

/// normalized_shape (layer/RMS norm) must be non-empty and equal the trailing dims of `input`.
Error check_normalized_shape(const TensorType& input, const std::vector<int64_t>& shape) {
  if (shape.empty()) return invalid("normalized_shape must have at least one element");
  if (shape.size() > input.sizes.size()) {
    return invalid("normalized_shape " + sizes_to_string(shape) + " has more dims than input " +
                   sizes_to_string(input.sizes));
  }
  const size_t off = input.sizes.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (input.sizes[off + i] != shape[i]) {
      return invalid("normalized_shape " + sizes_to_string(shape) + " does not match the trailing dims of input " +
                     sizes_to_string(input.sizes));
    }
  }
  return {};
}

// aten.native_batch_norm(input, weight?, bias?, running_mean?, running_var?; training, momentum, eps).
// Inference only: out = (x - running_mean[c]) / sqrt(running_var[c] + eps) * weight[c] + bias[c],
// c = dim 1. training=True (batch statistics) is declined; in inference the running statistics are
// required, as in PyTorch ("running_mean must be defined in evaluation mode").
Result<Types> infer_batch_norm(InputTypes in, const Attributes& attrs) {
  const TensorType& x = *in[0];
  KILN_RETURN_IF_ERROR(require_float32(x, "input"));
  if (attrs.get_bool("training")) {
    return unsupported("training=True (batch statistics) is not supported; only inference (training=False)");
  }
  if (x.dim() < 2) return invalid("input must have rank >= 2 (N, C, ...), got " + sizes_to_string(x.sizes));
  if (in[3] == nullptr) return invalid("running_mean must be given when training=False");
  if (in[4] == nullptr) return invalid("running_var must be given when training=False");
  const std::vector<int64_t> c{x.sizes[1]};
  KILN_RETURN_IF_ERROR(check_param(in[1], "weight", c));
  KILN_RETURN_IF_ERROR(check_param(in[2], "bias", c));
  KILN_RETURN_IF_ERROR(check_param(in[3], "running_mean", c));
  KILN_RETURN_IF_ERROR(check_param(in[4], "running_var", c));
  return Types{x};
}

// aten.native_layer_norm(input, weight?, bias?; normalized_shape, eps): normalizes over the trailing
// dims given by normalized_shape with the biased variance; weight/bias have shape normalized_shape.
Result<Types> infer_layer_norm(InputTypes in, const Attributes& attrs) {
  const TensorType& x = *in[0];
  KILN_RETURN_IF_ERROR(require_float32(x, "input"));
  const auto shape = attrs.get_ints("normalized_shape");
  KILN_RETURN_IF_ERROR(check_normalized_shape(x, shape));
  KILN_RETURN_IF_ERROR(check_param(in[1], "weight", shape));
  KILN_RETURN_IF_ERROR(check_param(in[2], "bias", shape));
  return Types{x};
}

// aten.native_group_norm(input, weight?, bias?; N, C, HxW, group, eps): input (N, C, *) with
// prod(*) == HxW; channels split into `group` groups normalized together; weight/bias shape (C).
Result<Types> infer_group_norm(InputTypes in, const Attributes& attrs) {
  const TensorType& x = *in[0];
  KILN_RETURN_IF_ERROR(require_float32(x, "input"));
  if (x.dim() < 2) return invalid("input must have rank >= 2 (N, C, ...), got " + sizes_to_string(x.sizes));
  const int64_t n = attrs.get_int("N"), c = attrs.get_int("C"), hxw = attrs.get_int("HxW");
  const int64_t group = attrs.get_int("group");
  int64_t spatial = 1;
  for (int64_t d = 2; d < x.dim(); ++d) spatial *= x.sizes[d];  // bounded: input sizes are checked
  if (n != x.sizes[0]) return invalid("N=" + std::to_string(n) + " differs from input dim 0 of " + sizes_to_string(x.sizes));
  if (c != x.sizes[1]) return invalid("C=" + std::to_string(c) + " differs from input dim 1 of " + sizes_to_string(x.sizes));
  if (hxw != spatial) {
    return invalid("HxW=" + std::to_string(hxw) + " differs from the product of the spatial dims of input " +
                   sizes_to_string(x.sizes) + " (" + std::to_string(spatial) + ")");
  }
  if (group <= 0) return invalid("group must be positive, got " + std::to_string(group));
  if (c % group != 0) {
    return invalid("group=" + std::to_string(group) + " does not divide the number of channels C=" + std::to_string(c));
  }
  KILN_RETURN_IF_ERROR(check_param(in[1], "weight", {c}));
  KILN_RETURN_IF_ERROR(check_param(in[2], "bias", {c}));
  return Types{x};
}

// aten.rms_norm(input, weight?; normalized_shape, eps): x / sqrt(mean(x^2) + eps) * weight over the
// trailing normalized_shape dims; eps None means torch.finfo(float32).eps.
Result<Types> infer_rms_norm(InputTypes in, const Attributes& attrs) {
  const TensorType& x = *in[0];
  KILN_RETURN_IF_ERROR(require_float32(x, "input"));
  const auto shape = attrs.get_ints("normalized_shape");
  KILN_RETURN_IF_ERROR(check_normalized_shape(x, shape));
  KILN_RETURN_IF_ERROR(check_param(in[1], "weight", shape));
  return Types{x};
}

// aten.scaled_dot_product_attention(query [..., L, E], key [..., S, E], value [..., S, Ev],
// attn_mask? broadcastable to [..., L, S]; dropout_p, is_causal, scale, enable_gqa) -> [..., L, Ev].
// Batch dims broadcast as in torch.matmul; with enable_gqa the key/value heads (dim -3) are
// repeated (repeat_interleave) to the query's heads, which they must divide.
Result<Types> infer_sdpa(InputTypes in, const Attributes& attrs) {
  const TensorType& q = *in[0];
  const TensorType& k = *in[1];
  const TensorType& v = *in[2];
  KILN_RETURN_IF_ERROR(require_float32(q, "query"));
  KILN_RETURN_IF_ERROR(require_float32(k, "key"));
  KILN_RETURN_IF_ERROR(require_float32(v, "value"));
  const double dropout = attrs.get_float("dropout_p");
  if (dropout != 0.0) return unsupported("dropout_p=" + std::to_string(dropout) + " (only 0 is supported in inference)");
  const std::pair<const TensorType*, const char*> named[] = {{&q, "query"}, {&k, "key"}, {&v, "value"}};
  for (const auto& [t, name] : named) {
    if (t->dim() < 3) {
      return unsupported(std::string(name) + " must have rank >= 3 ([..., seq, features]), got " +
                         sizes_to_string(t->sizes));
    }
  }
  const int64_t L = q.sizes.end()[-2], E = q.sizes.back();
  const int64_t S = k.sizes.end()[-2], Ev = v.sizes.back();
  if (k.sizes.back() != E) {
    return invalid("key feature size " + std::to_string(k.sizes.back()) + " differs from query's " + std::to_string(E));
  }
  if (v.sizes.end()[-2] != S) {
    return invalid("value sequence length " + std::to_string(v.sizes.end()[-2]) + " differs from key's " +
                   std::to_string(S));
  }
  std::vector<int64_t> qb(q.sizes.begin(), q.sizes.end() - 2);
  std::vector<int64_t> kb(k.sizes.begin(), k.sizes.end() - 2);
  std::vector<int64_t> vb(v.sizes.begin(), v.sizes.end() - 2);
  if (attrs.get_bool("enable_gqa")) {
    const int64_t hq = qb.back(), hk = kb.back(), hv = vb.back();
    if (hk <= 0 || hv <= 0 || hq % hk != 0 || hq % hv != 0) {
      return invalid("enable_gqa: the number of heads (dim -3) of key (" + std::to_string(hk) + ") and value (" +
                     std::to_string(hv) + ") must divide that of query (" + std::to_string(hq) + ")");
    }
    kb.back() = hq;  // after repeat_interleave
    vb.back() = hq;
  }
  auto b1 = broadcast_shapes(qb, kb);
  if (!b1.ok()) return invalid("batch dims of query and key: " + b1.error().message());
  auto b2 = broadcast_shapes(b1.value(), vb);
  if (!b2.ok()) return invalid("batch dims of query/key and value: " + b2.error().message());
  std::vector<int64_t> scores = b2.value();
  scores.push_back(L);
  scores.push_back(S);
  if (const TensorType* m = in[3]) {
    if (attrs.get_bool("is_causal")) return invalid("attn_mask must be None when is_causal=True");
    if (m->dtype == DType::Float16 || m->dtype == DType::BFloat16 || m->dtype == DType::Float64) {
      return unsupported(std::string("attn_mask dtype ") + dtype_name(m->dtype) + " is not supported (bool or float32)");
    }
    if (m->dtype != DType::Bool && m->dtype != DType::Float32) {
      return invalid(std::string("attn_mask must be bool or float32, got ") + dtype_name(m->dtype));
    }
    auto mb = broadcast_shapes(m->sizes, scores);
    if (!mb.ok() || mb.value() != scores) {
      return invalid("attn_mask shape " + sizes_to_string(m->sizes) + " does not broadcast to the attention shape " +
                     sizes_to_string(scores));
    }
  }
  std::vector<int64_t> out = b2.value();
  out.push_back(L);
  out.push_back(Ev);
  return Types{{DType::Float32, std::move(out)}};
}

}  // namespace

void register_norm_ops(OpRegistry& r) {
  const AttrValue none{};
  r.add({"aten.native_batch_norm",
         {{"input"}, {"weight", true}, {"bias", true}, {"running_mean", true}, {"running_var", true}},
         {{"training", AttrKind::Bool, false}, {"momentum", AttrKind::Float, 0.1}, {"eps", AttrKind::Float, 1e-5}},
         1, infer_batch_norm,
         "inference batch norm over dim 1 with running statistics (torch.ops.aten.native_batch_norm, output 0)"});
  r.add({"aten.native_layer_norm",
         {{"input"}, {"weight", true}, {"bias", true}},
         {{"normalized_shape", AttrKind::Ints, none, true}, {"eps", AttrKind::Float, none, true}},
         1, infer_layer_norm, "layer norm over the trailing normalized_shape dims (torch.ops.aten.native_layer_norm, output 0)"});
  r.add({"aten.native_group_norm",
         {{"input"}, {"weight", true}, {"bias", true}},
         {{"N", AttrKind::Int, none, true}, {"C", AttrKind::Int, none, true}, {"HxW", AttrKind::Int, none, true},
          {"group", AttrKind::Int, none, true}, {"eps", AttrKind::Float, none, true}},
         1, infer_group_norm, "group norm of (N, C, *) input (torch.ops.aten.native_group_norm, output 0)"});
  r.add({"aten.rms_norm",
         {{"input"}, {"weight", true}},
         {{"normalized_shape", AttrKind::Ints, none, true}, {"eps", AttrKind::Float, none, false, true}},
         1, infer_rms_norm, "RMS norm over the trailing normalized_shape dims (torch.ops.aten.rms_norm)"});
  r.add({"aten.scaled_dot_product_attention",
         {{"query"}, {"key"}, {"value"}, {"attn_mask", true}},
         {{"dropout_p", AttrKind::Float, 0.0}, {"is_causal", AttrKind::Bool, false},
          {"scale", AttrKind::Float, none, false, true}, {"enable_gqa", AttrKind::Bool, false}},
         1, infer_sdpa, "softmax(q @ k^T * scale + mask) @ v (torch.nn.functional.scaled_dot_product_attention)"});
}

}  // namespace kiln

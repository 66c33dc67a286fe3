// Kiln's own ops for generative language models: kiln.sdpa_kv_cache, attention of a block of
// query rows over a key/value cache that holds the earlier positions. The PyTorch reference of
// the same name (torch.ops.kiln.sdpa_kv_cache, registered by Kiln's Python package for capture)
// computes exactly the same thing; the kernels are src/kernels/portable/llm.cpp and
// src/kernels/cpu/attention.cpp.
#include <string>

#include "ir/op_registry.h"

namespace kiln {
namespace {

using Types = std::vector<TensorType>;

Error invalid(std::string msg) { return Error(ErrorCode::InvalidArgument, std::move(msg)); }
Error unsupported(std::string msg) { return Error(ErrorCode::NotSupported, std::move(msg)); }

// kiln.sdpa_kv_cache(query [B, Hq, T, D], key_cache [B, Hkv, S, D], value_cache [B, Hkv, S, Dv],
// input_pos int64 [1]; scale, sliding_window) -> float32 [B, Hq, T, Dv].
// With p = input_pos[0] (the cache position of query row 0), query row t of head h (position p + t)
// attends the keys j in [lo, p + t] of kv head h / (Hq / Hkv) (grouped-query attention), where
// lo = max(0, p + t - sliding_window + 1) when sliding_window > 0, else 0:
//   out[b, h, t] = sum_j softmax_j(scale * q[b, h, t] . k[b, h', j]) v[b, h', j], h' = h / (Hq / Hkv),
// scale None = 1 / sqrt(D) (as torch.nn.functional.scaled_dot_product_attention). Cache positions
// past p + t are never read, so the kernels' work is proportional to the filled length p + T (and
// to the window), not to S. p < 0 or p + T > S is InvalidArgument at run time, raised by the
// kernels before they write anything (input_pos is data). Here: ranks, B equal, Hkv >= 1 dividing
// Hq, D equal, value S equal to key S, input_pos int64 with one element, T <= S; float32 only
// (NotSupported otherwise), sliding_window >= 0.
Result<Types> infer_sdpa_kv_cache(InputTypes in, const Attributes& attrs) {
  const TensorType& q = *in[0];
  const TensorType& k = *in[1];
  const TensorType& v = *in[2];
  const TensorType& pos = *in[3];
  const std::pair<const TensorType*, const char*> named[] = {{&q, "query"}, {&k, "key_cache"}, {&v, "value_cache"}};
  for (const auto& [t, name] : named) {
    if (t->dtype != DType::Float32) {
      return unsupported(std::string(name) + ": dtype " + dtype_name(t->dtype) + " is not supported (float32 only)");
    }
    if (t->dim() != 4) {
      return invalid(std::string(name) + " must have rank 4 ([batch, heads, seq, head_dim]), got " +
                     sizes_to_string(t->sizes));
    }
  }
  if (pos.dtype != DType::Int64) return invalid(std::string("input_pos must be int64, got ") + dtype_name(pos.dtype));
  if (pos.numel() != 1) {
    return invalid("input_pos must hold exactly one element (the position of query row 0), got shape " +
                   sizes_to_string(pos.sizes));
  }
  const int64_t B = q.sizes[0], Hq = q.sizes[1], T = q.sizes[2], D = q.sizes[3];
  const int64_t Hkv = k.sizes[1], S = k.sizes[2];
  if (k.sizes[0] != B || v.sizes[0] != B) {
    return invalid("batch sizes differ: query " + sizes_to_string(q.sizes) + ", key_cache " + sizes_to_string(k.sizes) +
                   ", value_cache " + sizes_to_string(v.sizes));
  }
  if (v.sizes[1] != Hkv) {
    return invalid("value_cache heads " + std::to_string(v.sizes[1]) + " differ from key_cache's " + std::to_string(Hkv));
  }
  if (Hkv < 1 || Hq % Hkv != 0) {
    return invalid("the key/value heads (" + std::to_string(Hkv) + ") must divide the query heads (" +
                   std::to_string(Hq) + ")");
  }
  if (k.sizes[3] != D) {
    return invalid("key_cache head dim " + std::to_string(k.sizes[3]) + " differs from query's " + std::to_string(D));
  }
  if (v.sizes[2] != S) {
    return invalid("value_cache length " + std::to_string(v.sizes[2]) + " differs from key_cache's " + std::to_string(S));
  }
  if (T > S) {
    return invalid("query rows T=" + std::to_string(T) + " exceed the cache capacity S=" + std::to_string(S));
  }
  const int64_t window = attrs.get_int("sliding_window");
  if (window < 0) return invalid("sliding_window must be >= 0 (0 = none), got " + std::to_string(window));
  return Types{{DType::Float32, {B, Hq, T, v.sizes[3]}}};
}

Result<Types> infer_check_range(InputTypes in, const Attributes& attrs) {
  const TensorType& x = *in[0];
  if (x.dtype != DType::Int64 && x.dtype != DType::Int32) {
    return invalid(std::string("x must be int64 or int32, got ") + dtype_name(x.dtype));
  }
  (void)attrs;  // lo > hi is legal: then every value is out of range (a run-time error)
  return Types{x};
}

}  // namespace

void register_llm_ops(OpRegistry& r) {
  r.add({"kiln.check_range",
         {{"x"}},
         {{"lo", AttrKind::Int, AttrValue{}, true}, {"hi", AttrKind::Int, AttrValue{}, true},
          {"what", AttrKind::String, std::string()}},
         1, infer_check_range,
         "out = x, after checking lo <= x <= hi elementwise (InvalidArgument naming `what` otherwise): a guard that "
         "runs before the instructions that use x (e.g. a KV cache position before its cache writes) "
         "(torch.ops.kiln.check_range)"});
  const AttrValue none{};
  r.add({"kiln.sdpa_kv_cache",
         {{"query"}, {"key_cache"}, {"value_cache"}, {"input_pos"}},
         {{"scale", AttrKind::Float, none, false, true}, {"sliding_window", AttrKind::Int, int64_t{0}}},
         1, infer_sdpa_kv_cache,
         "causal (optionally sliding-window) grouped-query attention of query rows at positions "
         "[input_pos, input_pos + T) over cache positions [0, input_pos + T) (torch.ops.kiln.sdpa_kv_cache)"});
}

}  // namespace kiln

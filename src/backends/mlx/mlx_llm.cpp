// mlx lowerings of Kiln's ops for generative language models (src/ir/ops/llm.cpp):
// kiln.sdpa_kv_cache and kiln.check_range (entries merged into the op table of mlx_ops.cpp by
// add_llm_lowerings). The semantics are those of the op definitions and of the portable kernels
// (src/kernels/portable/llm.cpp); input_pos and the checked values are data inside the MLX graph,
// so no shape depends on them and one traced graph serves every position.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "backends/mlx/mlx_ops.h"

namespace kiln::mlxb {
namespace {

// ---------------------------------------------------------------- kiln.sdpa_kv_cache

// Declines what MLX's attention cannot hold; Kiln's inference has already checked ranks, heads,
// head dims, input_pos (int64, one element), T <= S and sliding_window >= 0.
Error check_sdpa_kv_cache(const NodeView& n) {
  for (size_t i = 0; i < 3; ++i) {
    if (!n.in[i] || n.in[i]->dtype != DType::Float32) return no("query/key_cache/value_cache must be float32");
  }
  if (!n.in[3] || n.in[3]->dtype != DType::Int64 || n.in[3]->numel() != 1) {
    return no("input_pos must be int64 with one element");
  }
  const TensorType& q = *n.in[0];
  const TensorType& k = *n.in[1];
  // MLX's attention off its fused kernels (always on its CPU device) materializes the scores
  // [B, Hq, T, S]; keep them within the 2^31 elements every other lowered array is held to.
  const double scores = static_cast<double>(q.sizes[0]) * static_cast<double>(q.sizes[1]) *
                        static_cast<double>(q.sizes[2]) * static_cast<double>(k.sizes[2]);
  if (scores > static_cast<double>(int64_t{1} << 31)) {
    return no("the attention scores [B, Hq, T, S] = [" + std::to_string(q.sizes[0]) + ", " +
              std::to_string(q.sizes[1]) + ", " + std::to_string(q.sizes[2]) + ", " + std::to_string(k.sizes[2]) +
              "] have more than 2^31 elements");
  }
  return {};
}

// kiln.sdpa_kv_cache(query [B, Hq, T, D], key_cache [B, Hkv, S, D], value_cache [B, Hkv, S, Dv],
// input_pos int64 [1]; scale, sliding_window) -> [B, Hq, T, Dv] in the compute dtype.
// Definition (src/ir/ops/llm.cpp, portable kernel src/kernels/portable/llm.cpp): with
// p = input_pos[0], query row t attends the cache positions j with
//   j <= p + t  and  (sliding_window == 0 or j > p + t - sliding_window),
// softmax(scale * q . k_j) weighting v_j, kv head h / (Hq / Hkv); scale None = 1 / sqrt(D).
// Built as MLX's fused attention over the whole cache S with that bool mask [T, S], computed in
// the graph from p, so the graph's shapes do not depend on p. MLX's attention takes grouped
// heads (Hq a multiple of Hkv) and D != Dv; its softmax runs in float32 for float16/bfloat16
// (MLX's fallback: softmax(..., precise=true); its GPU kernels accumulate in float32), so with a
// reduced compute dtype only q, k, v and the output are rounded to it. Every row keeps key p + t,
// so no row is fully masked. p < 0 or p + T > S is reported by a runtime check (execute:
// InvalidArgument, the portable kernel's text without the value of p); the mask uses p clamped
// into [0, S - T], so nothing outside the cache is addressed either way. Unlike the portable
// kernel, masked cache positions are read and weighted by exactly 0 rather than skipped: a
// non-finite value stored there (never written by Kiln's KV cache updates, whose caches start at
// zero) would make the row NaN.
mx::array sdpa_kv_cache(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const TensorType& qt = *n.in[0];
  const int64_t T = qt.sizes[2], D = qt.sizes[3];
  const int64_t S = n.in[1]->sizes[2];
  const int64_t window = n.attrs.get_int("sliding_window");
  const float scale = n.attrs.is_none("scale") ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)))
                                               : static_cast<float>(n.attrs.get_float("scale"));
  const mx::array p = mx::reshape(*in[3], {}, c.dev);  // int64 scalar
  const mx::array bad = mx::logical_or(mx::less(p, mx::array(int64_t{0}, mx::int64), c.dev),
                                       mx::greater(p, mx::array(S - T, mx::int64), c.dev), c.dev);
  c.checks->push_back({bad, "kiln.sdpa_kv_cache: input_pos p with T=" + std::to_string(T) +
                                " query rows does not fit the cache of S=" + std::to_string(S) +
                                " positions (needs 0 <= p and p + T <= S)"});
  // p clamped into [0, S - T] (0 <= T <= S by inference), then int32: every position is < S.
  const mx::array pc = mx::astype(
      mx::clip(p, mx::array(int64_t{0}, mx::int64), mx::array(S - T, mx::int64), c.dev), mx::int32, c.dev);
  const int32_t t32 = static_cast<int32_t>(T), s32 = static_cast<int32_t>(S);
  const mx::array row_pos = mx::add(mx::reshape(mx::arange(0, t32, 1, mx::int32, c.dev), {t32, 1}, c.dev), pc, c.dev);
  const mx::array key_pos = mx::reshape(mx::arange(0, s32, 1, mx::int32, c.dev), {1, s32}, c.dev);
  mx::array keep = mx::less_equal(key_pos, row_pos, c.dev);  // [T, S]
  // A window of S or more excludes nothing (p + t - window < 0 <= j); smaller ones fit int32.
  if (window > 0 && window < S) {
    const mx::array first = mx::subtract(row_pos, mx::array(static_cast<int32_t>(window), mx::int32), c.dev);
    keep = mx::logical_and(keep, mx::greater(key_pos, first, c.dev), c.dev);
  }
  return mx::fast::scaled_dot_product_attention(*in[0], *in[1], *in[2], scale, "array", keep, {}, false, c.dev);
}

// ---------------------------------------------------------------- kiln.check_range

Error check_check_range(const NodeView& n) {
  if (!n.in[0] || (n.in[0]->dtype != DType::Int64 && n.in[0]->dtype != DType::Int32)) {
    return no("kiln.check_range is lowered for int64 and int32 values only");
  }
  return {};
}

// kiln.check_range(x int64/int32; lo, hi, what) -> x (src/ir/ops/llm.cpp): a runtime check flags
// any element outside [lo, hi] (compared in int64, so bounds beyond int32 are exact for int32 x;
// lo > hi flags every element). The message is the portable kernel's (src/kernels/portable/llm.cpp
// check_range) without the offending value and its index, which the graph does not report.
mx::array check_range(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&) {
  const mx::array& x = *in[0];
  const int64_t lo = n.attrs.get_int("lo"), hi = n.attrs.get_int("hi");
  const std::string what = n.attrs.get_string("what");
  const mx::array w = x.dtype() == mx::int64 ? x : mx::astype(x, mx::int64, c.dev);
  const mx::array bad = mx::logical_or(mx::less(w, mx::array(lo, mx::int64), c.dev),
                                       mx::greater(w, mx::array(hi, mx::int64), c.dev), c.dev);
  c.checks->push_back({mx::any(bad, false, c.dev), (what.empty() ? std::string("value") : what) + " is outside [" +
                                                       std::to_string(lo) + ", " + std::to_string(hi) + "]"});
  return x;
}

}  // namespace

void add_llm_lowerings(std::map<std::string, OpLowering, std::less<>>& t) {
  t.insert({"kiln.sdpa_kv_cache", {check_sdpa_kv_cache, sdpa_kv_cache}});
  t.insert({"kiln.check_range", {check_check_range, check_range}});
}

}  // namespace kiln::mlxb

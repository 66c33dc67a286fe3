// Portable kernel of kiln.sdpa_kv_cache (op defined in src/ir/ops/llm.cpp): attention of query rows
// at cache positions [p, p + T) over the keys/values [0, p + T) of a cache of capacity S, causal by
// position, optionally within a sliding window, grouped-query. Scores, softmax and the weighted sum
// in double (the numerical oracle for the cpu kernel). Every size is read from the tensors of the
// call (T may be smaller than at load: a bounded dynamic dim), and input_pos is checked before
// anything is written.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "kernels/portable/llm.h"
#include "kernels/portable/util.h"

namespace kiln {

Result<int64_t> sdpa_kv_cache_position(const Tensor& input_pos, int64_t T, int64_t S) {
  if (input_pos.dtype != DType::Int64 || input_pos.numel() != 1) {
    return Error(ErrorCode::Internal, "kiln.sdpa_kv_cache: input_pos must be int64 with one element, got " +
                                          input_pos.type().to_string());
  }
  const int64_t p = input_pos.data_as<const int64_t>()[0];
  if (p < 0 || p > S - T) {  // p + T > S without overflow (0 <= T <= S by inference)
    return Error(ErrorCode::InvalidArgument,
                 "kiln.sdpa_kv_cache: input_pos p=" + std::to_string(p) + " with T=" + std::to_string(T) +
                     " query rows does not fit the cache of S=" + std::to_string(S) +
                     " positions (needs 0 <= p and p + T <= S)");
  }
  return p;
}

namespace {

// out[b, h, t] = sum_{j=lo..p+t} softmax_j(scale * q[b,h,t] . k[b,h',j]) v[b,h',j], h' = h / (Hq / Hkv),
// lo = max(0, p + t - sliding_window + 1) if sliding_window > 0 else 0 (definition: src/ir/ops/llm.cpp).
Error sdpa_kv_cache(const KernelArgs& a) {
  const char* op = "kiln.sdpa_kv_cache";
  const Tensor& q = *a.inputs[0];
  const Tensor& k = *a.inputs[1];
  const Tensor& v = *a.inputs[2];
  Tensor& out = *a.outputs[0];
  if (q.dtype != DType::Float32 || k.dtype != DType::Float32 || v.dtype != DType::Float32 ||
      out.dtype != DType::Float32) {
    return Error(ErrorCode::NotSupported, std::string(op) + ": float32 only");
  }
  const int64_t B = q.sizes[0], Hq = q.sizes[1], T = q.sizes[2], D = q.sizes[3];
  const int64_t Hkv = k.sizes[1], S = k.sizes[2], Dv = v.sizes[3];
  auto pos = sdpa_kv_cache_position(*a.inputs[3], T, S);
  if (!pos.ok()) return pos.error();
  const int64_t p = *pos;
  const int64_t group = Hq / Hkv;
  const int64_t window = a.attrs.get_int("sliding_window");
  const double scale = a.attrs.is_none("scale") ? 1.0 / std::sqrt(static_cast<double>(D)) : a.attrs.get_float("scale");
  const float* pq = q.data_as<const float>();
  const float* pk = k.data_as<const float>();
  const float* pv = v.data_as<const float>();
  float* po = out.data_as<float>();
  const int64_t rows = B * Hq * T;
  if (rows == 0 || Dv == 0) return {};

  auto run = [&](int64_t begin, int64_t end, std::vector<double>& s, std::vector<double>& acc) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row % T, h = (row / T) % Hq, b = row / (T * Hq);
      const int64_t kvh = b * Hkv + h / group;
      const int64_t hi = p + t;  // last key (inclusive)
      const int64_t lo = window > 0 ? std::max<int64_t>(0, hi - window + 1) : 0;
      const float* qi = pq + row * D;
      const float* kb = pk + kvh * S * D;
      const float* vb = pv + kvh * S * Dv;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = lo; j <= hi; ++j) {
        double dot = 0.0;
        const float* kj = kb + j * D;
        for (int64_t e = 0; e < D; ++e) dot += static_cast<double>(qi[e]) * kj[e];
        const double sj = dot * scale;
        s[static_cast<size_t>(j - lo)] = sj;
        if (!std::isnan(mx) && (std::isnan(sj) || sj > mx)) mx = sj;  // NaN sticks: the row is NaN, as in eager
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = lo; j <= hi; ++j) {
        const double w = std::exp(s[static_cast<size_t>(j - lo)] - mx);
        sum += w;
        const float* vj = vb + j * Dv;
        for (int64_t e = 0; e < Dv; ++e) acc[static_cast<size_t>(e)] += w * vj[e];
      }
      float* oi = po + row * Dv;
      for (int64_t e = 0; e < Dv; ++e) oi[e] = static_cast<float>(acc[static_cast<size_t>(e)] / sum);
    }
  };
  std::atomic<bool> alloc_failed{false};
  auto chunk = [&](int64_t begin, int64_t end) {
    std::vector<double> s, acc;
    try {
      s.resize(static_cast<size_t>(p + T));  // at most p + T keys per row
      acc.resize(static_cast<size_t>(Dv));
    } catch (const std::bad_alloc&) {
      alloc_failed = true;
      return;
    }
    run(begin, end, s, acc);
  };
  const int64_t keys = window > 0 ? std::min<int64_t>(window, p + T) : p + T;
  const int64_t min_chunk = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, keys * (D + Dv)));
  if (a.pool == nullptr || rows <= min_chunk) {
    chunk(0, rows);
  } else {
    a.pool->parallel_for(rows, min_chunk, chunk);
  }
  if (alloc_failed) return Error(ErrorCode::MemoryAllocationFailed, std::string(op) + ": scratch");
  return {};
}

}  // namespace

/// kiln.check_range: out = x after checking lo <= x[i] <= hi for every element (int64 or int32);
/// InvalidArgument naming `what`, the element and the range otherwise, before anything is written.
Error check_range(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const int64_t lo = a.attrs.get_int("lo"), hi = a.attrs.get_int("hi");
  const std::string what = a.attrs.get_string("what");
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = x.dtype == DType::Int64 ? x.data_as<const int64_t>()[i] : x.data_as<const int32_t>()[i];
    if (v < lo || v > hi) {
      return Error(ErrorCode::InvalidArgument, (what.empty() ? std::string("value") : what) + " is " + std::to_string(v) +
                                                   (n > 1 ? " (element " + std::to_string(i) + ")" : "") +
                                                   ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
  }
  if (out.data != x.data && x.nbytes() > 0) std::memcpy(out.data, x.data, x.nbytes());
  return {};
}

void register_portable_llm(KernelRegistry& r) {
  r.add("kiln.sdpa_kv_cache", sdpa_kv_cache);
  r.add("kiln.check_range", check_range);
}

}  // namespace kiln

// Optimized cpu kernels for aten._softmax / aten._log_softmax (float32, any dim), AVX2.
//
// softmax(x)_k = e^(x_k - m) / sum_j e^(x_j - m), log_softmax(x)_k = x_k - m - log(sum_j e^(x_j - m)),
// m = max_j x_j (PyTorch aten/src/ATen/native/cpu/SoftMaxKernel.cpp computes the same). The
// reduction dim is either the last one (rows are contiguous: one row at a time) or has `inner`
// elements after it (8 neighbouring columns at a time, one per lane). Sums accumulate in float
// lanes flushed to double every kFlush terms, so long rows keep the accuracy of a double sum;
// e^x is cpu::exp8. NaN anywhere in a row makes the row NaN; an all -inf row gives NaN (as the
// portable kernel and PyTorch do). Rows are split across the pool.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "ir/op_registry.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernel.h"

namespace kiln {

#if KILN_CPU_AVX2_KERNELS
namespace {

using cpu::exp8;
using cpu::load_tail;
using cpu::store_tail;

constexpr int64_t kFlush = 512;  ///< float terms per lane before a flush to double

/// Softmax of one contiguous row x[0..n) into y.
KILN_AVX2 void softmax_row(const float* x, float* y, int64_t n, bool log) {
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 m0 = ninf, m1 = ninf;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
  float mx = cpu::hmax(_mm256_max_ps(m0, m1));
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  const __m256 vm = _mm256_set1_ps(mx);

  double total = 0.0;
  for (int64_t b = 0; b < n; b += kFlush * 8) {
    const int64_t e = std::min(n, b + kFlush * 8);
    __m256 s = _mm256_setzero_ps();
    int64_t j = b;
    for (; j + 8 <= e; j += 8) {
      const __m256 v = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm));
      if (!log) _mm256_storeu_ps(y + j, v);
      s = _mm256_add_ps(s, v);
    }
    if (j < e) {
      const __m256 v = exp8(_mm256_sub_ps(load_tail(x + j, e - j), vm));
      const __m256 keep = _mm256_castsi256_ps(cpu::tail_mask(e - j));
      const __m256 vk = _mm256_and_ps(v, keep);
      if (!log) store_tail(y + j, e - j, vk);
      s = _mm256_add_ps(s, vk);
    }
    total += cpu::hsum_pd(s);
  }
  if (log) {
    const __m256 lse = _mm256_set1_ps(static_cast<float>(std::log(total)));
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm), lse));
    if (j < n) store_tail(y + j, n - j, _mm256_sub_ps(_mm256_sub_ps(load_tail(x + j, n - j), vm), lse));
  } else {
    const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / total));
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(y + j), inv));
    if (j < n) store_tail(y + j, n - j, _mm256_mul_ps(load_tail(y + j, n - j), inv));
  }
}

/// Softmax along a strided dim for `w` (1..8) neighbouring columns: element k of column c is
/// x[k * inner + c].
KILN_AVX2 void softmax_columns(const float* x, float* y, int64_t n, int64_t inner, int64_t w, bool log) {
  auto load = [&](const float* p) KILN_AVX2 { return w == 8 ? _mm256_loadu_ps(p) : load_tail(p, w); };
  auto store = [&](float* p, __m256 v) KILN_AVX2 {
    if (w == 8) _mm256_storeu_ps(p, v);
    else store_tail(p, w, v);
  };
  // A NaN element may be dropped from the max (max_ps returns its second operand then), but
  // e^(NaN - m) is NaN, so the column's sum and every output still become NaN.
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t k = 0; k < n; ++k) mx = _mm256_max_ps(load(x + k * inner), mx);
  __m256d s_lo = _mm256_setzero_pd(), s_hi = _mm256_setzero_pd();
  for (int64_t b = 0; b < n; b += kFlush) {
    const int64_t e = std::min(n, b + kFlush);
    __m256 s = _mm256_setzero_ps();
    for (int64_t k = b; k < e; ++k) {
      const __m256 v = exp8(_mm256_sub_ps(load(x + k * inner), mx));
      if (!log) store(y + k * inner, v);
      s = _mm256_add_ps(s, v);
    }
    s_lo = _mm256_add_pd(s_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(s)));
    s_hi = _mm256_add_pd(s_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(s, 1)));
  }
  if (log) {
    alignas(32) double sums[8];
    _mm256_store_pd(sums, s_lo);
    _mm256_store_pd(sums + 4, s_hi);
    alignas(32) float lse[8];
    for (int c = 0; c < 8; ++c) lse[c] = static_cast<float>(std::log(sums[c]));
    const __m256 vl = _mm256_load_ps(lse);
    for (int64_t k = 0; k < n; ++k) store(y + k * inner, _mm256_sub_ps(_mm256_sub_ps(load(x + k * inner), mx), vl));
  } else {
    const __m256d one = _mm256_set1_pd(1.0);
    const __m256 inv = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_div_pd(one, s_hi)), _mm256_cvtpd_ps(_mm256_div_pd(one, s_lo)));
    for (int64_t k = 0; k < n; ++k) store(y + k * inner, _mm256_mul_ps(load(y + k * inner), inv));
  }
}

bool softmax_accepts(const KernelSignature& s) {
  if (!cpu::cpu_has_avx2_fma()) return false;
  if (s.inputs.size() != 1 || s.inputs[0] == nullptr || s.outputs.size() != 1) return false;
  const TensorType& x = *s.inputs[0];
  if (x.dtype != DType::Float32 || s.outputs[0]->dtype != DType::Float32 || s.outputs[0]->sizes != x.sizes) return false;
  return !s.attrs.get_bool("half_to_float") && wrap_dim(s.attrs.get_int("dim"), x.dim()).ok();
}

Error softmax_impl(const KernelArgs& a, bool log) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const char* op = log ? "aten._log_softmax" : "aten._softmax";
  if (x.dtype != DType::Float32 || out.dtype != DType::Float32 || out.sizes != x.sizes) {
    return Error(ErrorCode::NotSupported, std::string(op) + ": cpu kernel takes float32 only");
  }
  auto d = wrap_dim(a.attrs.get_int("dim"), x.dim());
  if (!d.ok()) return Error(ErrorCode::InvalidArgument, std::string(op) + ": dim: " + d.error().message());
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t k = 0; k < x.dim(); ++k) {
    const int64_t s = x.sizes[static_cast<size_t>(k)];
    if (k < *d) outer *= s;
    else if (k == *d) n = s;
    else inner *= s;
  }
  if (outer == 0 || n == 0 || inner == 0) return {};
  const float* px = x.data_as<const float>();
  float* po = out.data_as<float>();
  if (inner == 1) {
    const int64_t grain = std::max<int64_t>(1, 16384 / n);
    cpu::parallel_range(a.pool, outer, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) softmax_row(px + r * n, po + r * n, n, log);
    });
    return {};
  }
  const int64_t blocks = (inner + 7) / 8;  // 8-column blocks per outer index
  const int64_t grain = std::max<int64_t>(1, 16384 / (8 * n));
  cpu::parallel_range(a.pool, outer * blocks, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / blocks, c = (t % blocks) * 8;
      const int64_t off = o * n * inner + c;
      softmax_columns(px + off, po + off, n, inner, std::min<int64_t>(8, inner - c), log);
    }
  });
  return {};
}

Error softmax(const KernelArgs& a) { return softmax_impl(a, false); }
Error log_softmax(const KernelArgs& a) { return softmax_impl(a, true); }

}  // namespace

void register_cpu_softmax(KernelRegistry& r) {
  r.add_optimized("aten._softmax", softmax, softmax_accepts);
  r.add_optimized("aten._log_softmax", log_softmax, softmax_accepts);
}

#else

void register_cpu_softmax(KernelRegistry&) {}  // no AVX2 kernels on this target

#endif  // KILN_CPU_AVX2_KERNELS

}  // namespace kiln

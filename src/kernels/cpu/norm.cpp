// Optimized cpu kernels for the float32 norms: aten.native_layer_norm, aten.native_group_norm,
// aten.native_batch_norm (inference) and aten.rms_norm. AVX2, parallel over rows / groups /
// channels.
//
// Statistics are two-pass (mean, then the mean of squared deviations: no cancellation) on data
// shifted by its first element c ("shifted data" variance, Chan, Golub & LeVeque 1983, "Algorithms
// for computing the sample variance"): d = x - c is exact or nearly so when the values cluster
// far from 0 (e.g. mean 1e-3, spread 1e-6), so mean and variance keep their accuracy relative to
// the spread rather than to |mean|. Float lanes are flushed to a double every kFlush elements, so
// a long row or a large group keeps the accuracy of a double sum. The normalization runs in float:
// y = ((x - c) - mean_d) * (rstd * w) + b, mean_d = mean - c. Semantics are the portable kernels'
// (src/kernels/portable/norm.cpp): biased variance, eps inside the square root, rms_norm's
// eps None = FLT_EPSILON (torch.finfo(torch.float32).eps).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/vec_math.h"
#include "kernels/kernel.h"
#include "kernels/portable/util.h"  // data_or_null, check_f32

namespace kiln {

#if KILN_CPU_AVX2_KERNELS
namespace {

using cpu::load_tail;
using cpu::store_tail;

constexpr int64_t kFlush = 1024;  ///< elements per float partial sum before it goes to double

/// sum_i (x[i] - c) (kind 0), sum_i ((x[i] - c) - md)^2 (kind 1) over i < n.
template <int kKind>
KILN_AVX2 double reduce(const float* x, int64_t n, float c, float md) {
  const __m256 vc = _mm256_set1_ps(c), vmd = _mm256_set1_ps(md);
  double total = 0.0;
  for (int64_t b = 0; b < n; b += kFlush) {
    const int64_t e = std::min(n, b + kFlush);
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = b;
    auto term = [&](__m256 v) KILN_AVX2 {
      const __m256 d = _mm256_sub_ps(v, vc);
      if constexpr (kKind == 0) return d;
      const __m256 e = _mm256_sub_ps(d, vmd);
      return _mm256_mul_ps(e, e);
    };
    for (; i + 16 <= e; i += 16) {
      s0 = _mm256_add_ps(s0, term(_mm256_loadu_ps(x + i)));
      s1 = _mm256_add_ps(s1, term(_mm256_loadu_ps(x + i + 8)));
    }
    for (; i + 8 <= e; i += 8) s0 = _mm256_add_ps(s0, term(_mm256_loadu_ps(x + i)));
    if (i < e) {
      const __m256 keep = _mm256_castsi256_ps(cpu::tail_mask(e - i));
      s1 = _mm256_add_ps(s1, _mm256_and_ps(keep, term(load_tail(x + i, e - i))));
    }
    total += cpu::hsum_pd(_mm256_add_ps(s0, s1));
  }
  return total;
}

/// Statistics of x[0..n), n > 0: the shift c = x[0], mean_d = mean - c, rstd = 1 / sqrt(biased
/// variance + eps).
struct Moments {
  float c, md, rstd;
};

/// Two-pass statistics in double, one element at a time, unshifted (c = 0): the fallback for data
/// whose float partial sums overflow (a spread that large needs no shift for accuracy, and x - 0
/// cannot overflow in the float normalization).
Moments moments_double(const float* x, int64_t n, double eps) {
  const float c = 0.0f;
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) - c;
  const double md = s / static_cast<double>(n);
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = (static_cast<double>(x[i]) - c) - md;
    ss += e * e;
  }
  return {c, static_cast<float>(md), static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps))};
}

KILN_AVX2 Moments moments(const float* x, int64_t n, double eps) {
  Moments m;
  m.c = std::isfinite(x[0]) ? x[0] : 0.0f;
  const double sd = reduce<0>(x, n, m.c, 0.0f);
  m.md = static_cast<float>(sd / static_cast<double>(n));
  const double var = reduce<1>(x, n, m.c, m.md) / static_cast<double>(n);
  // Float squares overflow once the spread passes ~1.8e19 (float partial sums of the deviations
  // once they pass FLT_MAX): the variance is then inf or NaN although the row's statistics are
  // representable. Recompute such rows in double (a row holding inf or NaN gives NaN either way).
  if (!std::isfinite(var) || !std::isfinite(sd)) return moments_double(x, n, eps);
  m.rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
  return m;
}

/// y[i] = ((x[i] - c) - md) * scale + shift, one scale/shift for the whole range.
KILN_AVX2 void affine_uniform(const float* x, float* y, int64_t n, float c, float md, float scale, float shift) {
  const __m256 vc = _mm256_set1_ps(c), vm = _mm256_set1_ps(md), vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vc), vm);
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(d, vs, vb));
  }
  if (i < n) {
    const __m256 d = _mm256_sub_ps(_mm256_sub_ps(load_tail(x + i, n - i), vc), vm);
    store_tail(y + i, n - i, _mm256_fmadd_ps(d, vs, vb));
  }
}

/// y[i] = (((x[i] - c) - md) * rstd) * w[i] + b[i]; w, b may be null (1, 0).
KILN_AVX2 void affine_elementwise(const float* x, float* y, int64_t n, const Moments& m, const float* w,
                                  const float* b) {
  const __m256 vc = _mm256_set1_ps(m.c), vm = _mm256_set1_ps(m.md), vr = _mm256_set1_ps(m.rstd);
  auto one = [&](int64_t i, int64_t len) KILN_AVX2 {
    const bool full = len == 8;
    const __m256 xv = full ? _mm256_loadu_ps(x + i) : load_tail(x + i, len);
    __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(xv, vc), vm), vr);
    if (w && b) t = _mm256_fmadd_ps(t, full ? _mm256_loadu_ps(w + i) : load_tail(w + i, len),
                                    full ? _mm256_loadu_ps(b + i) : load_tail(b + i, len));
    else if (w) t = _mm256_mul_ps(t, full ? _mm256_loadu_ps(w + i) : load_tail(w + i, len));
    else if (b) t = _mm256_add_ps(t, full ? _mm256_loadu_ps(b + i) : load_tail(b + i, len));
    if (full) _mm256_storeu_ps(y + i, t);
    else store_tail(y + i, len, t);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) one(i, 8);
  if (i < n) one(i, n - i);
}

/// y[i] = (x[i] * rstd) * w[i]; w may be null.
KILN_AVX2 void scale_elementwise(const float* x, float* y, int64_t n, float rstd, const float* w) {
  const __m256 vr = _mm256_set1_ps(rstd);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(x + i), vr);
    if (w) t = _mm256_mul_ps(t, _mm256_loadu_ps(w + i));
    _mm256_storeu_ps(y + i, t);
  }
  if (i < n) {
    __m256 t = _mm256_mul_ps(load_tail(x + i, n - i), vr);
    if (w) t = _mm256_mul_ps(t, load_tail(w + i, n - i));
    store_tail(y + i, n - i, t);
  }
}

/// Rows per thread chunk for rows of `work` elements: at least ~64K elements per chunk (a
/// [77, 768] layer norm takes ~20 us: waking a second thread costs about as much).
int64_t row_grain(int64_t work) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, work)); }

/// True when every given tensor of the call is float32.
bool all_f32(const KernelSignature& s) {
  if (!cpu::cpu_has_avx2_fma() || s.inputs.empty() || s.inputs[0] == nullptr || s.outputs.size() != 1) return false;
  for (const TensorType* t : s.inputs) {
    if (t != nullptr && t->dtype != DType::Float32) return false;
  }
  return s.outputs[0]->dtype == DType::Float32 && s.outputs[0]->sizes == s.inputs[0]->sizes;
}


// aten.native_layer_norm: rows of prod(normalized_shape) elements.
Error layer_norm(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_f32(a, "aten.native_layer_norm"));
  const Tensor& x = *a.inputs[0];
  const float* w = data_or_null(a.inputs[1]);
  const float* b = data_or_null(a.inputs[2]);
  const double eps = a.attrs.get_float("eps");
  const int64_t k = numel_of(a.attrs.get_ints("normalized_shape"));
  const int64_t rows = k == 0 ? 0 : x.numel() / k;
  const float* px = x.data_as<const float>();
  float* po = a.outputs[0]->data_as<float>();
  cpu::parallel_range(a.pool, rows, row_grain(k), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      affine_elementwise(px + r * k, po + r * k, k, moments(px + r * k, k, eps), w, b);
    }
  });
  return {};
}

// aten.native_group_norm: per (n, group) statistics over C/group channels x HxW elements.
Error group_norm(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_f32(a, "aten.native_group_norm"));
  const float* w = data_or_null(a.inputs[1]);
  const float* b = data_or_null(a.inputs[2]);
  const double eps = a.attrs.get_float("eps");
  const int64_t n = a.attrs.get_int("N"), c = a.attrs.get_int("C"), hxw = a.attrs.get_int("HxW");
  const int64_t groups = a.attrs.get_int("group");
  const int64_t cpg = c / groups;
  const int64_t size = cpg * hxw;
  if (size == 0) return {};
  const float* px = a.inputs[0]->data_as<const float>();
  float* po = a.outputs[0]->data_as<float>();
  cpu::parallel_range(a.pool, n * groups, row_grain(size), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t g = r % groups;
      const float* xi = px + r * size;
      float* yo = po + r * size;
      const Moments m = moments(xi, size, eps);
      for (int64_t ci = 0; ci < cpg; ++ci) {
        const int64_t ch = g * cpg + ci;
        const float scale = m.rstd * (w ? w[ch] : 1.0f);
        affine_uniform(xi + ci * hxw, yo + ci * hxw, hxw, m.c, m.md, scale, b ? b[ch] : 0.0f);
      }
    }
  });
  return {};
}

// aten.native_batch_norm (inference): y = (x - mean[c]) * (w[c] / sqrt(var[c] + eps)) + b[c].
Error batch_norm(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_f32(a, "aten.native_batch_norm"));
  const Tensor& x = *a.inputs[0];
  const float* w = data_or_null(a.inputs[1]);
  const float* b = data_or_null(a.inputs[2]);
  const float* mean = a.inputs[3]->data_as<const float>();
  const float* var = a.inputs[4]->data_as<const float>();
  const double eps = a.attrs.get_float("eps", 1e-5);
  const int64_t n = x.sizes[0], c = x.sizes[1];
  const int64_t inner = c == 0 || n == 0 ? 0 : x.numel() / (n * c);
  const float* px = x.data_as<const float>();
  float* po = a.outputs[0]->data_as<float>();
  cpu::parallel_range(a.pool, n * c, row_grain(inner), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t ch = r % c;
      const double scale = 1.0 / std::sqrt(static_cast<double>(var[ch]) + eps) * (w ? w[ch] : 1.0);
      affine_uniform(px + r * inner, po + r * inner, inner, mean[ch], 0.0f, static_cast<float>(scale), b ? b[ch] : 0.0f);
    }
  });
  return {};
}

// aten.rms_norm: y = x / sqrt(mean(x^2) + eps) * w per row.
Error rms_norm(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_f32(a, "aten.rms_norm"));
  const Tensor& x = *a.inputs[0];
  const float* w = data_or_null(a.inputs[1]);
  const double eps = a.attrs.is_none("eps") ? std::numeric_limits<float>::epsilon() : a.attrs.get_float("eps");
  const int64_t k = numel_of(a.attrs.get_ints("normalized_shape"));
  const int64_t rows = k == 0 ? 0 : x.numel() / k;
  const float* px = x.data_as<const float>();
  float* po = a.outputs[0]->data_as<float>();
  cpu::parallel_range(a.pool, rows, row_grain(k), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double sq = reduce<1>(px + r * k, k, 0.0f, 0.0f);
      if (!std::isfinite(sq)) {  // float squares overflow above |x| ~ 1.8e19: sum them in double
        sq = 0.0;
        for (int64_t i = 0; i < k; ++i) sq += static_cast<double>(px[r * k + i]) * px[r * k + i];
      }
      const float rstd = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(k) + eps));
      scale_elementwise(px + r * k, po + r * k, k, rstd, w);
    }
  });
  return {};
}

bool batch_norm_accepts(const KernelSignature& s) {
  return all_f32(s) && s.inputs.size() == 5 && s.inputs[3] != nullptr && s.inputs[4] != nullptr &&
         s.inputs[0]->dim() >= 2 && !s.attrs.get_bool("training");
}

}  // namespace

void register_cpu_norm(KernelRegistry& r) {
  r.add_optimized("aten.native_layer_norm", layer_norm, all_f32);
  r.add_optimized("aten.native_group_norm", group_norm, all_f32);
  r.add_optimized("aten.native_batch_norm", batch_norm, batch_norm_accepts);
  r.add_optimized("aten.rms_norm", rms_norm, all_f32);
}

#else

void register_cpu_norm(KernelRegistry&) {}  // no AVX2 kernels on this target

#endif  // KILN_CPU_AVX2_KERNELS

}  // namespace kiln

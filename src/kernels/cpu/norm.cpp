// Optimized cpu kernels for the float32 norms: aten.native_layer_norm, aten.native_group_norm,
// aten.native_batch_norm (inference) and aten.rms_norm. Written once over Highway for every SIMD
// target (kernels/cpu/vec-inl.h), parallel over rows / groups / channels.
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

#include "kernels/cpu/parallel_util.h"
#include "kernels/kernel.h"
#include "kernels/portable/util.h"  // data_or_null, check_f32

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/norm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/vec-inl.h"

#ifndef KILN_CPU_NORM_SHARED_
#define KILN_CPU_NORM_SHARED_
namespace kiln::cpu {

/// Statistics of x[0..n), n > 0: the shift c = x[0], mean_d = mean - c, rstd = 1 / sqrt(biased
/// variance + eps).
struct Moments {
  float c, md, rstd;
};

/// Two-pass statistics in double, one element at a time, unshifted (c = 0): the fallback for data
/// whose float partial sums overflow (a spread that large needs no shift for accuracy, and x - 0
/// cannot overflow in the float normalization).
inline Moments moments_double(const float* x, int64_t n, double eps) {
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

}  // namespace kiln::cpu
#endif  // KILN_CPU_NORM_SHARED_

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace norm_detail {

constexpr int64_t kFlush = 1024;  ///< elements per float partial sum before it goes to double

/// sum_i (x[i] - c) (kind 0), sum_i ((x[i] - c) - md)^2 (kind 1) over i < n.
template <int kKind>
HWY_INLINE double Reduce(const float* HWY_RESTRICT x, int64_t n, float c, float md) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vc = hn::Set(d, c), vmd = hn::Set(d, md);
  auto term = [&](VF v) {
    const VF t = hn::Sub(v, vc);
    if constexpr (kKind == 0) return t;
    const VF e = hn::Sub(t, vmd);
    return hn::Mul(e, e);
  };
  double total = 0.0;
  for (int64_t b = 0; b < n; b += kFlush) {
    const int64_t e = std::min(n, b + kFlush);
    VF s0 = hn::Zero(d), s1 = hn::Zero(d);
    int64_t i = b;
    for (; i + 2 * N <= e; i += 2 * N) {
      s0 = hn::Add(s0, term(hn::LoadU(d, x + i)));
      s1 = hn::Add(s1, term(hn::LoadU(d, x + i + N)));
    }
    for (; i + N <= e; i += N) s0 = hn::Add(s0, term(hn::LoadU(d, x + i)));
    if (i < e) {
      const size_t r = static_cast<size_t>(e - i);
      s1 = hn::Add(s1, hn::IfThenElseZero(hn::FirstN(d, r), term(LoadTail(d, x + i, r))));
    }
    total += ReduceSumDouble(d, hn::Add(s0, s1));
  }
  return total;
}

HWY_INLINE Moments MomentsOf(const float* x, int64_t n, double eps) {
  Moments m;
  m.c = std::isfinite(x[0]) ? x[0] : 0.0f;
  const double sd = Reduce<0>(x, n, m.c, 0.0f);
  m.md = static_cast<float>(sd / static_cast<double>(n));
  const double var = Reduce<1>(x, n, m.c, m.md) / static_cast<double>(n);
  // Float squares overflow once the spread passes ~1.8e19 (float partial sums of the deviations
  // once they pass FLT_MAX): the variance is then inf or NaN although the row's statistics are
  // representable. Recompute such rows in double (a row holding inf or NaN gives NaN either way).
  if (!std::isfinite(var) || !std::isfinite(sd)) return moments_double(x, n, eps);
  m.rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
  return m;
}

/// y[i] = ((x[i] - c) - md) * scale + shift, one scale/shift for the whole range.
HWY_INLINE void AffineUniform(const float* HWY_RESTRICT x, float* HWY_RESTRICT y, int64_t n, float c, float md,
                              float scale, float shift) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vc = hn::Set(d, c), vm = hn::Set(d, md), vs = hn::Set(d, scale), vb = hn::Set(d, shift);
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::MulAdd(hn::Sub(hn::Sub(hn::LoadU(d, x + i), vc), vm), vs, vb), d, y + i);
  if (i < n) {
    const size_t r = static_cast<size_t>(n - i);
    StoreTail(d, hn::MulAdd(hn::Sub(hn::Sub(LoadTail(d, x + i, r), vc), vm), vs, vb), y + i, r);
  }
}

/// y[i] = (((x[i] - c) - md) * rstd) * w[i] + b[i]; w, b may be null (1, 0).
HWY_INLINE void AffineElementwise(const float* HWY_RESTRICT x, float* HWY_RESTRICT y, int64_t n, const Moments& m,
                                  const float* HWY_RESTRICT w, const float* HWY_RESTRICT b) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vc = hn::Set(d, m.c), vm = hn::Set(d, m.md), vr = hn::Set(d, m.rstd);
  auto one = [&](int64_t i, size_t len) {
    const bool full = len == static_cast<size_t>(N);
    auto ld = [&](const float* p) { return full ? hn::LoadU(d, p + i) : LoadTail(d, p + i, len); };
    VF t = hn::Mul(hn::Sub(hn::Sub(ld(x), vc), vm), vr);
    if (w && b) t = hn::MulAdd(t, ld(w), ld(b));
    else if (w) t = hn::Mul(t, ld(w));
    else if (b) t = hn::Add(t, ld(b));
    if (full) hn::StoreU(t, d, y + i);
    else StoreTail(d, t, y + i, len);
  };
  int64_t i = 0;
  for (; i + N <= n; i += N) one(i, static_cast<size_t>(N));
  if (i < n) one(i, static_cast<size_t>(n - i));
}

/// y[i] = (x[i] * rstd) * w[i]; w may be null.
HWY_INLINE void ScaleElementwise(const float* HWY_RESTRICT x, float* HWY_RESTRICT y, int64_t n, float rstd,
                                 const float* HWY_RESTRICT w) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vr = hn::Set(d, rstd);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    VF t = hn::Mul(hn::LoadU(d, x + i), vr);
    if (w) t = hn::Mul(t, hn::LoadU(d, w + i));
    hn::StoreU(t, d, y + i);
  }
  if (i < n) {
    const size_t r = static_cast<size_t>(n - i);
    VF t = hn::Mul(LoadTail(d, x + i, r), vr);
    if (w) t = hn::Mul(t, LoadTail(d, w + i, r));
    StoreTail(d, t, y + i, r);
  }
}

}  // namespace norm_detail

/// Layer norm of rows [r0, r1) of k floats (x, y: whole tensors; w, b: [k] or null).
void LayerNormRows(const float* x, float* y, int64_t k, int64_t r0, int64_t r1, double eps, const float* w,
                   const float* b) {
  for (int64_t r = r0; r < r1; ++r) {
    norm_detail::AffineElementwise(x + r * k, y + r * k, k, norm_detail::MomentsOf(x + r * k, k, eps), w, b);
  }
}

/// Group norm of (batch, group) rows [r0, r1): each row is cpg channels of hxw floats; w, b: [C]
/// or null.
void GroupNormRows(const float* x, float* y, int64_t groups, int64_t cpg, int64_t hxw, int64_t r0, int64_t r1,
                   double eps, const float* w, const float* b) {
  const int64_t size = cpg * hxw;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t g = r % groups;
    const float* xi = x + r * size;
    float* yo = y + r * size;
    const Moments m = norm_detail::MomentsOf(xi, size, eps);
    for (int64_t ci = 0; ci < cpg; ++ci) {
      const int64_t ch = g * cpg + ci;
      const float scale = m.rstd * (w ? w[ch] : 1.0f);
      norm_detail::AffineUniform(xi + ci * hxw, yo + ci * hxw, hxw, m.c, m.md, scale, b ? b[ch] : 0.0f);
    }
  }
}

/// Inference batch norm of (n, channel) planes [r0, r1) of `inner` floats.
void BatchNormPlanes(const float* x, float* y, int64_t c, int64_t inner, int64_t r0, int64_t r1, double eps,
                     const float* w, const float* b, const float* mean, const float* var) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t ch = r % c;
    const double scale = 1.0 / std::sqrt(static_cast<double>(var[ch]) + eps) * (w ? w[ch] : 1.0);
    norm_detail::AffineUniform(x + r * inner, y + r * inner, inner, mean[ch], 0.0f, static_cast<float>(scale),
                               b ? b[ch] : 0.0f);
  }
}

/// RMS norm of rows [r0, r1) of k floats; w: [k] or null.
void RmsNormRows(const float* x, float* y, int64_t k, int64_t r0, int64_t r1, double eps, const float* w) {
  for (int64_t r = r0; r < r1; ++r) {
    double sq = norm_detail::Reduce<1>(x + r * k, k, 0.0f, 0.0f);
    if (!std::isfinite(sq)) {  // float squares overflow above |x| ~ 1.8e19: sum them in double
      sq = 0.0;
      for (int64_t i = 0; i < k; ++i) sq += static_cast<double>(x[r * k + i]) * x[r * k + i];
    }
    const float rstd = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(k) + eps));
    norm_detail::ScaleElementwise(x + r * k, y + r * k, k, rstd, w);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
namespace cpu {
HWY_EXPORT(LayerNormRows);
HWY_EXPORT(GroupNormRows);
HWY_EXPORT(BatchNormPlanes);
HWY_EXPORT(RmsNormRows);
}  // namespace cpu

namespace {

/// Rows per thread chunk for rows of `work` elements: at least ~64K elements per chunk (a
/// [77, 768] layer norm takes ~20 us: waking a second thread costs about as much).
int64_t row_grain(int64_t work) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, work)); }

/// True when every given tensor of the call is float32.
bool all_f32(const KernelSignature& s) {
  if (s.inputs.empty() || s.inputs[0] == nullptr || s.outputs.size() != 1) return false;
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
    KILN_CPU_DISPATCH(LayerNormRows)(px, po, k, r0, r1, eps, w, b);
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
    KILN_CPU_DISPATCH(GroupNormRows)(px, po, groups, cpg, hxw, r0, r1, eps, w, b);
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
    KILN_CPU_DISPATCH(BatchNormPlanes)(px, po, c, inner, r0, r1, eps, w, b, mean, var);
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
    KILN_CPU_DISPATCH(RmsNormRows)(px, po, k, r0, r1, eps, w);
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

}  // namespace kiln
#endif  // HWY_ONCE

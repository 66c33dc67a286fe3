// Elementwise activations that the cpu kernels apply on their own output (activation fusion) and
// that the cpu activation kernels (activation.cpp) apply on whole tensors: one definition of each
// formula, so a fused result is bit-identical to the convolution followed by the activation.
//
// Formulas and NaN behaviour are the portable kernels' (src/kernels/portable/elementwise.cpp,
// PyTorch Activation.cpp); _mm256_max_ps/min_ps(c, x) return x when x is NaN (the second operand),
// so NaN propagates.
#pragma once

#include <cmath>
#include <limits>
#include <optional>
#include <string_view>

#include "ir/fusion.h"
#include "kernels/cpu/vec_math.h"
#include "kiln/attributes.h"

namespace kiln::cpu {

/// An activation applied to each output value: the fusion table's Epilogue (src/ir/fusion.h):
/// none, relu, clamp [lo, hi] (aten.clamp, aten.hardtanh; an absent bound is -inf / +inf),
/// hardswish, hardsigmoid, sigmoid, silu.
using PostOp = Epilogue;

/// The PostOp computing aten op `op` with (normalized) `attrs`, when it is one of the fusable
/// activations of the epilogue table (epilogue_of, src/ir/fusion.h); false otherwise (also for
/// NaN clamp bounds, which the portable kernel handles).
inline bool post_op_of(std::string_view op, const Attributes& attrs, PostOp* out) {
  const std::optional<Epilogue> e = epilogue_of(op, attrs);
  if (!e) return false;
  *out = *e;
  return true;
}

#if KILN_CPU_AVX2_KERNELS

KILN_AVX2 inline __m256 relu8(__m256 x) { return _mm256_max_ps(_mm256_setzero_ps(), x); }
/// min(max(x, lo), hi); an infinite bound leaves every value (NaN included) as it is.
KILN_AVX2 inline __m256 clamp8(__m256 x, float lo, float hi) {
  return _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), x));
}
/// x * (min(max(x + 3, 0), 6) / 6): the portable kernel's order (no overflow for x > FLT_MAX / 6,
/// where the result is x).
KILN_AVX2 inline __m256 hardswish8(__m256 x) {
  const __m256 r6 =
      _mm256_min_ps(_mm256_set1_ps(6.0f), _mm256_max_ps(_mm256_setzero_ps(), _mm256_add_ps(x, _mm256_set1_ps(3.0f))));
  return _mm256_mul_ps(x, _mm256_div_ps(r6, _mm256_set1_ps(6.0f)));
}
/// min(max(x + 3, 0), 6) / 6.
KILN_AVX2 inline __m256 hardsigmoid8(__m256 x) {
  const __m256 r6 =
      _mm256_min_ps(_mm256_set1_ps(6.0f), _mm256_max_ps(_mm256_setzero_ps(), _mm256_add_ps(x, _mm256_set1_ps(3.0f))));
  return _mm256_div_ps(r6, _mm256_set1_ps(6.0f));
}
/// 1 / (1 + e^-x).
KILN_AVX2 inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)))));
}
/// x / (1 + e^-x) (silu(-inf) is NaN, as in PyTorch).
KILN_AVX2 inline __m256 silu8(__m256 x) {
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)))));
}

/// `p` applied to each lane of x.
KILN_AVX2 inline __m256 apply8(const PostOp& p, __m256 x) {
  switch (p.kind) {
    case PostOp::Kind::None: return x;
    case PostOp::Kind::Relu: return relu8(x);
    case PostOp::Kind::Clamp: return clamp8(x, p.lo, p.hi);
    case PostOp::Kind::Hardswish: return hardswish8(x);
    case PostOp::Kind::Hardsigmoid: return hardsigmoid8(x);
    case PostOp::Kind::Sigmoid: return sigmoid8(x);
    case PostOp::Kind::Silu: return silu8(x);
  }
  return x;
}

/// `p` applied in place to y[0, n).
KILN_AVX2 inline void apply_inplace(const PostOp& p, float* y, int64_t n) {
  if (p.kind == PostOp::Kind::None) return;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, apply8(p, _mm256_loadu_ps(y + i)));
  if (i < n) store_tail(y + i, n - i, apply8(p, load_tail(y + i, n - i)));
}

/// `p` applied to one value (through the same vector code, so identical to apply8's lanes).
KILN_AVX2 inline float apply1(const PostOp& p, float x) {
  return _mm256_cvtss_f32(apply8(p, _mm256_set1_ps(x)));
}

#endif  // KILN_CPU_AVX2_KERNELS

}  // namespace kiln::cpu

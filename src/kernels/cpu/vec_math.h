// AVX2/FMA helpers shared by the optimized cpu kernels (src/kernels/cpu/*.cpp): 8-lane float
// exp, tanh and erfc, partial loads/stores for loop tails, horizontal reductions, and
// parallel_range (the pool policy of these kernels).
//
// Everything here is compiled for AVX2+FMA through a function target attribute (the rest of the
// build stays baseline x86-64), so callers must themselves carry KILN_AVX2 and must only run
// after cpu_has_avx2_fma() returned true (each kernel's accepts() checks it). On other targets
// (e.g. aarch64) KILN_CPU_AVX2_KERNELS is 0: the kernel files register nothing and the portable
// kernels run.
//
// Accuracy (measured against double std::exp / std::tanh / std::erf on dense grids; the tests in
// tests/cpp/cpu_misc_kernels_test.cpp, VecMath.*, hold the bounds in brackets):
// - exp8:  max relative error 1.2e-7 (2 ulp) over [-87.3, 88.7] [2e-7]; overflow -> +inf
//          (x > 88.7228), underflow -> 0 (x < -104), denormal results kept; NaN propagates.
// - exp8_nonpos: as exp8 over [-87.33, 0] [2e-7]; 0 below -87.33 (-inf included); NaN propagates.
// - tanh8: max relative error 1.5e-7 over [-10, 10] [2e-7]; NaN propagates; +-inf -> +-1.
// - erfc8: max relative error 4.3e-7 over [0, 9.1] [5e-7] (Numerical Recipes' 1.2e-7 plus float
//          rounding).
#pragma once

#include <cstdint>

#include "kernels/cpu/parallel_util.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define KILN_CPU_AVX2_KERNELS 1
#include <immintrin.h>
#else
#define KILN_CPU_AVX2_KERNELS 0
#endif

namespace kiln::cpu {

/// True when this CPU executes AVX2 and FMA (checked once; GCC/Clang cpu builtins).
inline bool cpu_has_avx2_fma() {
#if KILN_CPU_AVX2_KERNELS
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
#else
  return false;
#endif
}

#if KILN_CPU_AVX2_KERNELS

/// Function attribute: compile this function for AVX2 + FMA.
#define KILN_AVX2 __attribute__((target("avx2,fma")))

/// Lane mask with the first n (0..8) lanes set, for maskload/maskstore.
KILN_AVX2 inline __m256i tail_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/// Loads the first n (< 8) floats at p, zero in the other lanes; never touches p[n..7].
KILN_AVX2 inline __m256 load_tail(const float* p, int64_t n) { return _mm256_maskload_ps(p, tail_mask(n)); }
/// Stores the first n (< 8) lanes of v to p; never touches p[n..7].
KILN_AVX2 inline void store_tail(float* p, int64_t n, __m256 v) { _mm256_maskstore_ps(p, tail_mask(n), v); }

/// In-register transpose of an 8 x 8 block: r[i] lane k -> r[k] lane i.
KILN_AVX2 inline void transpose8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/// Sum of the 8 lanes.
KILN_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// Sum of the 8 lanes, in double.
KILN_AVX2 inline double hsum_pd(__m256 v) {
  __m256d d = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/// Maximum of the 8 lanes (no NaN handling: callers deal with NaN separately).
KILN_AVX2 inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

/// even[i] = src[2 i], odd[i] = src[2 i + 1]: the n floats of src split by the parity of their
/// index (n / 2 + n % 2 even values, n / 2 odd ones), 16 at a time through two shuffles.
KILN_AVX2 inline void split_even_odd(const float* src, int64_t n, float* even, float* odd) {
  int64_t t = 0;
  for (; 2 * t + 16 <= n; t += 8) {
    const __m256 a = _mm256_loadu_ps(src + 2 * t), b = _mm256_loadu_ps(src + 2 * t + 8);
    // shuffle gives [a0 a2 b0 b2 | a4 a6 b4 b6]; permute 64-bit lanes 0,2,1,3 -> a0 a2 a4 a6 b0 b2 b4 b6
    _mm256_storeu_ps(even + t, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8)));
    _mm256_storeu_ps(odd + t, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8)));
  }
  for (int64_t i = 2 * t; i < n; ++i) (i % 2 == 0 ? even : odd)[i / 2] = src[i];
}

/// e^r ~ 1 + r + r^2 (p0 r^5 + ... + p5) for |r| <= ~ln2/2: the polynomial of the Cephes Math
/// Library expf.c (S. Moshier, coefficients 1.9875691500E-4 ... 5.0000001201E-1).
KILN_AVX2 inline __m256 exp_poly8(__m256 r) {
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  return _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
}

/// e^(hi + lo) per lane, for a float hi and a small correction lo (|lo| <= ~4; 0 for plain e^x):
/// lo enters the reduced argument after the exact Cody-Waite step, so it is not rounded away
/// against a large hi (erfc8 passes the rounding residual of -z^2 this way).
/// Range reduction hi + lo = n ln2 + r, |r| <= ln2/2 (+ |lo| rounding), with ln2 split in two
/// (Cody-Waite constants C1 = 0.693359375, C2 = -2.12194440e-4) and the degree-7 polynomial
/// e^r ~ 1 + r + r^2 (p0 r^5 + ... + p5) of the Cephes Math Library expf.c (S. Moshier,
/// coefficients 1.9875691500E-4 ... 5.0000001201E-1). 2^n is applied as two exact power-of-two
/// factors so that results from 2^-149 (denormal) to FLT_MAX need no special path.
KILN_AVX2 inline __m256 exp8_hl(__m256 hi, __m256 lo) {
  const __m256 max_x = _mm256_set1_ps(88.72283935546875f);  // above: +inf
  const __m256 min_x = _mm256_set1_ps(-104.0f);             // below: 0
  const __m256 x = _mm256_add_ps(hi, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(_mm256_min_ps(_mm256_max_ps(x, min_x), max_x),
                                                 _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), hi);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  r = _mm256_add_ps(r, lo);
  const __m256 p = exp_poly8(r);
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, max_x, _CMP_GT_OQ));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, min_x, _CMP_LT_OQ));
  return _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN in, NaN out
}

/// e^x per lane (exp8_hl with lo = 0).
KILN_AVX2 inline __m256 exp8(__m256 x) { return exp8_hl(x, _mm256_setzero_ps()); }

/// e^x per lane for x <= 0, -inf or NaN (softmax: scores minus their maximum), in about half the
/// instructions of exp8: the same range reduction and polynomial, with 2^n (n in [-126, 0]) as
/// one exact factor. x < -87.33 (results below 2^-126, including x = -inf) gives exactly 0 where
/// exp8 gives a denormal (absolute difference < 1.2e-38); NaN in, NaN out. Positive x is not
/// supported (wrong results above ~0.35).
KILN_AVX2 inline __m256 exp8_nonpos(__m256 x) {
  const __m256 min_x = _mm256_set1_ps(-87.33f);
  const __m256 xc = _mm256_max_ps(min_x, x);  // NaN passes (max returns the second operand)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  const __m256 p = exp_poly8(r);
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(_mm256_cmp_ps(x, min_x, _CMP_LT_OQ), y);  // below -87.33 (not NaN): 0
}

/// tanh per lane. |x| < 0.625: x + x^3 P(x^2), the odd polynomial of the Cephes Math Library
/// tanhf.c (coefficients -5.70498872745E-3 ... -3.33332819422E-1); otherwise
/// sign(x) (1 - 2 / (e^{2|x|} + 1)) (e^{2|x|} = inf gives exactly +-1).
KILN_AVX2 inline __m256 tanh8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 ax = _mm256_andnot_ps(sign, x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-5.70498872745E-3f);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954E-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531E-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036E-1f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422E-1f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  const __m256 e = exp8(_mm256_add_ps(ax, ax));
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
  big = _mm256_or_ps(big, _mm256_and_ps(x, sign));
  return _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
}

/// erfc(z) per lane for z >= 0 (callers pass |x|): the Chebyshev-fitted formula of Numerical
/// Recipes (Press et al., 2nd ed., section 6.2, erfcc), fractional error < 1.2e-7 everywhere:
/// erfc(z) = t exp(-z^2 - 1.26551223 + t (1.00002368 + ... + t 0.17087277)), t = 1 / (1 + z / 2).
/// -z^2 goes to exp8_hl as a float plus its exact FMA residual, so the result keeps its relative
/// accuracy deep in the tail (no 1 - erf cancellation anywhere). +inf -> 0, NaN -> NaN.
KILN_AVX2 inline __m256 erfc8(__m256 z) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.5f), z, one));
  __m256 p = _mm256_set1_ps(0.17087277f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.82215223f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.48851587f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.13520398f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.27886807f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.18628806f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.09678418f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.37409196f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.00002368f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.26551223f));
  const __m256 zz = _mm256_mul_ps(z, z);
  const __m256 zz_lo = _mm256_fmsub_ps(z, z, zz);  // z^2 = zz + zz_lo exactly
  const __m256 e = exp8_hl(_mm256_sub_ps(_mm256_setzero_ps(), zz), _mm256_sub_ps(p, zz_lo));
  // erfc(10) = 2e-45 is below the smallest float; cutting there also maps +inf (whose residual
  // would be NaN) to 0. NaN compares false and stays NaN.
  return _mm256_blendv_ps(_mm256_mul_ps(t, e), _mm256_setzero_ps(), _mm256_cmp_ps(z, _mm256_set1_ps(10.0f), _CMP_GT_OQ));
}

#endif  // KILN_CPU_AVX2_KERNELS

}  // namespace kiln::cpu

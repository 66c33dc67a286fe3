// Per-target SIMD helpers shared by the optimized cpu kernels: partial loads/stores for loop tails,
// horizontal reductions, an even/odd split (stride-2 convolutions), and float exp, tanh and erfc. Written once over Google Highway; a
// Highway "-inl.h" header, included by kernel files after hwy/foreach_target.h so that it is
// compiled once per target (the include guard toggles with HWY_TARGET_TOGGLE).
//
// Usage inside a kernel file (see activation.cpp):
//   #undef HWY_TARGET_INCLUDE
//   #define HWY_TARGET_INCLUDE "kernels/cpu/activation.cpp"
//   #include "hwy/foreach_target.h"
//   #include "hwy/highway.h"
//   #include "kernels/cpu/vec-inl.h"
//   HWY_BEFORE_NAMESPACE();
//   namespace kiln::cpu::HWY_NAMESPACE { ... per-target code ... }
//   HWY_AFTER_NAMESPACE();
//   #if HWY_ONCE ... HWY_EXPORT(Fn) ... HWY_DYNAMIC_DISPATCH(Fn)(args) ... #endif
//
// Accuracy (measured against double std::exp / std::tanh / std::erf on dense grids; the tests in
// tests/cpp/cpu_misc_kernels_test.cpp, VecMath.*, hold the bounds in brackets, at every target):
// - Exp:  max relative error 1.2e-7 (2 ulp) over [-87.3, 88.7] [2e-7]; overflow -> +inf
//         (x > 88.7228), underflow -> 0 (x < -104), denormal results kept; NaN propagates.
// - ExpNonpos: as Exp over [-87.33, 0] [2e-7]; 0 below -87.33 (-inf included); NaN propagates.
// - Tanh: max relative error 1.5e-7 over [-10, 10] [2e-7]; NaN propagates; +-inf -> +-1.
// - Erfc: max relative error 4.3e-7 over [0, 9.1] [5e-7] (Numerical Recipes' 1.2e-7 plus float
//         rounding).
// Targets without a fused multiply-add (Highway's EMU128, "scalar") round each product; the
// bounds above still hold there (the residual of erfc's z^2 comes from Dekker's exact split).

#if defined(KILN_CPU_VEC_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_VEC_INL_H_
#undef KILN_CPU_VEC_INL_H_
#else
#define KILN_CPU_VEC_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// The full float32 vector of this target (8 lanes on AVX2, 16 on AVX-512, 4 on NEON, on
/// SVE a multiple of 4; 1 on the "scalar" target, Highway's HWY_SCALAR with GCC < 12.3, else
/// EMU128 with 4), and its vector type.
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

/// Loads the first n (< Lanes(d)) elements at p, zero in the other lanes; never reads p[n..].
/// x86 uses the hardware masked load; other targets (whose MaskedLoad reads the whole vector)
/// copy through a stack buffer.
template <class D>
HWY_INLINE hn::Vec<D> LoadTail(D d, const hn::TFromD<D>* HWY_RESTRICT p, size_t n) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return hn::MaskedLoad(hn::FirstN(d, n), d, p);
#else
  using T = hn::TFromD<D>;
  HWY_ALIGN T buf[HWY_MAX_BYTES / sizeof(T)] = {};
  std::memcpy(buf, p, n * sizeof(T));
  return hn::Load(d, buf);
#endif
}

/// Stores the first n (< Lanes(d)) lanes of v to p; never touches p[n..].
template <class D>
HWY_INLINE void StoreTail(D d, hn::Vec<D> v, hn::TFromD<D>* HWY_RESTRICT p, size_t n) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  hn::BlendedStore(v, hn::FirstN(d, n), d, p);
#else
  using T = hn::TFromD<D>;
  HWY_ALIGN T buf[HWY_MAX_BYTES / sizeof(T)];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, n * sizeof(T));
#endif
}

/// Sum of the lanes.
template <class D>
HWY_INLINE hn::TFromD<D> ReduceSum(D d, hn::Vec<D> v) {
  return hn::GetLane(hn::SumOfLanes(d, v));
}

/// Maximum of the lanes (no NaN handling: callers deal with NaN separately).
template <class D>
HWY_INLINE hn::TFromD<D> ReduceMax(D d, hn::Vec<D> v) {
  return hn::GetLane(hn::MaxOfLanes(d, v));
}

/// Sum of the float lanes, accumulated in double.
template <class D>
HWY_INLINE double ReduceSumDouble(D d, hn::Vec<D> v) {
#if HWY_HAVE_FLOAT64 && HWY_TARGET != HWY_SCALAR
  const hn::Half<D> dh;
  const hn::RepartitionToWide<D> dd;
  const auto lo = hn::PromoteTo(dd, hn::LowerHalf(dh, v));
  const auto hi = hn::PromoteTo(dd, hn::UpperHalf(dh, v));
  return hn::GetLane(hn::SumOfLanes(dd, hn::Add(lo, hi)));
#else
  HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(v, d, buf);
  double s = 0;
  for (size_t i = 0; i < hn::Lanes(d); ++i) s += buf[i];
  return s;
#endif
}

/// x rounded to the nearest integer (ties to even), for |x| < 2^22. Highway's Round where it is
/// one instruction; on the one-lane scalar target (whose Round branches) the classic
/// add-and-subtract of 1.5 * 2^23, which rounds in the float adder itself.
template <class D, class V>
HWY_INLINE V RoundSmall(D d, V x) {
#if HWY_TARGET == HWY_SCALAR
  const V magic = hn::Set(d, 12582912.0f);
  return hn::Sub(hn::Add(x, magic), magic);
#else
  (void)d;
  return hn::Round(x);
#endif
}

/// even[i] = src[2 i], odd[i] = src[2 i + 1]: the n floats of src split by the parity of their
/// index (n / 2 + n % 2 even values, n / 2 odd ones), 2 Lanes(DF) at a time through
/// LoadInterleaved2 (every target, the 1-lane scalar one included), the rest one by one. Never
/// reads src[n..].
HWY_INLINE void SplitEvenOdd(const float* HWY_RESTRICT src, int64_t n, float* HWY_RESTRICT even,
                             float* HWY_RESTRICT odd) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t t = 0;
  for (; 2 * t + 2 * N <= n; t += N) {
    VF e, o;
    hn::LoadInterleaved2(d, src + 2 * t, e, o);
    hn::StoreU(e, d, even + t);
    hn::StoreU(o, d, odd + t);
  }
  for (int64_t i = 2 * t; i < n; ++i) (i % 2 == 0 ? even : odd)[i / 2] = src[i];
}

/// e^r ~ 1 + r + r^2 (p0 r^5 + ... + p5) for |r| <= ~ln2/2: the polynomial of the Cephes Math
/// Library expf.c (S. Moshier, coefficients 1.9875691500E-4 ... 5.0000001201E-1).
template <class D, class V>
HWY_INLINE V ExpPoly(D d, V r) {
  V p = hn::Set(d, 1.9875691500E-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507E-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073E-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894E-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459E-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201E-1f));
  return hn::MulAdd(p, hn::Mul(r, r), hn::Add(r, hn::Set(d, 1.0f)));
}

/// e^(hi + lo) per lane, for a float hi and a small correction lo (|lo| <= ~4; 0 for plain e^x):
/// lo enters the reduced argument after the exact Cody-Waite step, so it is not rounded away
/// against a large hi (Erfc passes the rounding residual of -z^2 this way).
/// Range reduction hi + lo = n ln2 + r, |r| <= ln2/2 (+ |lo| rounding), with ln2 split in two
/// (Cody-Waite constants C1 = 0.693359375, C2 = -2.12194440e-4) and ExpPoly. 2^n is applied as two
/// exact power-of-two factors so that results from 2^-149 (denormal) to FLT_MAX need no special
/// path.
template <class D, class V>
HWY_INLINE V ExpHL(D d, V hi, V lo) {
  const hn::RebindToSigned<D> di;
  const V max_x = hn::Set(d, 88.72283935546875f);  // above: +inf
  const V min_x = hn::Set(d, -104.0f);             // below: 0
  const V x = hn::Add(hi, lo);
  const V n = RoundSmall(d, hn::Mul(hn::Min(hn::Max(x, min_x), max_x), hn::Set(d, 1.44269504088896341f)));
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), hi);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  r = hn::Add(r, lo);
  const V p = ExpPoly(d, r);
  const auto ni = hn::ConvertTo(di, n);
  const auto n1 = hn::ShiftRight<1>(ni);
  const auto n2 = hn::Sub(ni, n1);
  const auto bias = hn::Set(di, 127);
  const V s1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  const V s2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n2, bias)));
  V y = hn::Mul(hn::Mul(p, s1), s2);
  y = hn::IfThenElse(hn::Gt(x, max_x), hn::Set(d, __builtin_inff()), y);
  y = hn::IfThenZeroElse(hn::Lt(x, min_x), y);
  return hn::IfThenElse(hn::IsNaN(x), hn::Add(x, x), y);  // NaN in, NaN out
}

/// e^x per lane (ExpHL with lo = 0).
template <class D, class V>
HWY_INLINE V Exp(D d, V x) {
  return ExpHL(d, x, hn::Zero(d));
}

/// e^x per lane for x <= 0, -inf or NaN (softmax: scores minus their maximum), in about half the
/// instructions of Exp: the same range reduction and polynomial, with 2^n (n in [-126, 0]) as
/// one exact factor. x < -87.33 (results below 2^-126, including x = -inf) gives exactly 0 where
/// Exp gives a denormal (absolute difference < 1.2e-38); NaN in, NaN out (through r). Positive x
/// is not supported (wrong results above ~0.35).
template <class D, class V>
HWY_INLINE V ExpNonpos(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V min_x = hn::Set(d, -87.33f);
  const V xc = hn::IfThenElse(hn::Lt(x, min_x), min_x, x);  // NaN compares false and passes
  const V n = RoundSmall(d, hn::Mul(xc, hn::Set(d, 1.44269504088896341f)));
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  const V p = ExpPoly(d, r);
  const V e = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127))));
  return hn::IfThenZeroElse(hn::Lt(x, min_x), hn::Mul(p, e));  // below -87.33 (not NaN): 0
}

/// tanh per lane. |x| < 0.625: x + x^3 P(x^2), the odd polynomial of the Cephes Math Library
/// tanhf.c (coefficients -5.70498872745E-3 ... -3.33332819422E-1); otherwise
/// sign(x) (1 - 2 / (e^{2|x|} + 1)) (e^{2|x|} = inf gives exactly +-1).
template <class D, class V>
HWY_INLINE V Tanh(D d, V x) {
  const V ax = hn::Abs(x);
  const V z = hn::Mul(x, x);
  V p = hn::Set(d, -5.70498872745E-3f);
  p = hn::MulAdd(p, z, hn::Set(d, 2.06390887954E-2f));
  p = hn::MulAdd(p, z, hn::Set(d, -5.37397155531E-2f));
  p = hn::MulAdd(p, z, hn::Set(d, 1.33314422036E-1f));
  p = hn::MulAdd(p, z, hn::Set(d, -3.33332819422E-1f));
  const V small = hn::MulAdd(hn::Mul(p, z), x, x);
  const V e = Exp(d, hn::Add(ax, ax));
  const V one = hn::Set(d, 1.0f);
  const V big = hn::CopySignToAbs(hn::Sub(one, hn::Div(hn::Set(d, 2.0f), hn::Add(e, one))), x);
  return hn::IfThenElse(hn::Lt(ax, hn::Set(d, 0.625f)), small, big);
}

/// erfc(z) per lane for z >= 0 (callers pass |x|): the Chebyshev-fitted formula of Numerical
/// Recipes (Press et al., 2nd ed., section 6.2, erfcc), fractional error < 1.2e-7 everywhere:
/// erfc(z) = t exp(-z^2 - 1.26551223 + t (1.00002368 + ... + t 0.17087277)), t = 1 / (1 + z / 2).
/// -z^2 goes to ExpHL as a float plus its exact residual (an FMA where the target has one, else
/// Dekker's split product, T. J. Dekker 1971), so the result keeps its relative accuracy deep in
/// the tail (no 1 - erf cancellation anywhere). +inf -> 0, NaN -> NaN.
template <class D, class V>
HWY_INLINE V Erfc(D d, V z) {
  const V one = hn::Set(d, 1.0f);
  const V t = hn::Div(one, hn::MulAdd(hn::Set(d, 0.5f), z, one));
  V p = hn::Set(d, 0.17087277f);
  p = hn::MulAdd(p, t, hn::Set(d, -0.82215223f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.48851587f));
  p = hn::MulAdd(p, t, hn::Set(d, -1.13520398f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.27886807f));
  p = hn::MulAdd(p, t, hn::Set(d, -0.18628806f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.09678418f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.37409196f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.00002368f));
  p = hn::MulAdd(p, t, hn::Set(d, -1.26551223f));
  const V zz = hn::Mul(z, z);
#if HWY_NATIVE_FMA
  const V zz_lo = hn::MulSub(z, z, zz);  // z^2 = zz + zz_lo exactly
#else
  // Dekker: z = zh + zl with zh of at most 12 significant bits, so zh^2, 2 zh zl are exact.
  const V split = hn::Mul(hn::Set(d, 4097.0f), z);
  const V zh = hn::Sub(split, hn::Sub(split, z));
  const V zl = hn::Sub(z, zh);
  const V zz_lo = hn::Add(hn::Add(hn::Sub(hn::Mul(zh, zh), zz), hn::Mul(hn::Add(zh, zh), zl)), hn::Mul(zl, zl));
#endif
  const V e = ExpHL(d, hn::Neg(zz), hn::Sub(p, zz_lo));
  // erfc(10) = 2e-45 is below the smallest float; cutting there also maps +inf (whose residual
  // would be NaN) to 0. NaN compares false and stays NaN.
  return hn::IfThenZeroElse(hn::Gt(z, hn::Set(d, 10.0f)), hn::Mul(t, e));
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // KILN_CPU_VEC_INL_H_

// Per-target shim for the VecMath tests (cpu_vec_shim.h): compiled once per Highway target, like
// the kernel files (hwy/foreach_target.h re-includes this file).
#include "cpu_vec_shim.h"

#include <cstdint>

#include "kernels/cpu/target.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpp/cpu_vec_shim.cpp"  // relative to tests/ (an include dir of kiln_tests)
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D, class V>
HWY_INLINE V ApplyVecFn(D d, test::VecFn fn, V x) {
  switch (fn) {
    case test::VecFn::Exp: return Exp(d, x);
    case test::VecFn::ExpNonpos: return ExpNonpos(d, x);
    case test::VecFn::Tanh: return Tanh(d, x);
    case test::VecFn::Erfc: return Erfc(d, x);
  }
  return x;
}

void VecMathShim(test::VecFn fn, const float* x, float* y, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(ApplyVecFn(d, fn, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) StoreTail(d, ApplyVecFn(d, fn, LoadTail(d, x + i, n - i)), y + i, n - i);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
namespace cpu {
HWY_EXPORT(VecMathShim);
}  // namespace cpu

void test::vec_math(VecFn fn, const float* x, float* y, size_t n) {
  cpu::select_target();
  KILN_CPU_DISPATCH(VecMathShim)(fn, x, y, n);
}

}  // namespace kiln
#endif  // HWY_ONCE

// The target that Highway's dynamic dispatch actually calls, for checking that it is the one
// kernels/cpu/target.cpp chose (tests/cpp/cpu_target_env.cpp checks it at the start of every
// kiln_tests run): a later reset of Highway's dispatch state would otherwise run the kernels at
// another target than the one a test or benchmark names.
#include "kernels/cpu/target.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/target_probe.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
/// This version's Highway target bit.
int64_t CompiledTarget() { return HWY_TARGET; }
}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln::cpu {
HWY_EXPORT(CompiledTarget);
int64_t dispatched_target() {
  select_target();
  return KILN_CPU_DISPATCH(CompiledTarget)();
}
}  // namespace kiln::cpu
#endif

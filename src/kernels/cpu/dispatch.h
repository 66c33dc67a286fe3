// KILN_CPU_DISPATCH(Fn): the version of kiln::cpu::Fn for the process's SIMD target
// (kernels/cpu/target.h), callable from any namespace. Fn is a per-target function exported with
// HWY_EXPORT(Fn) inside namespace kiln::cpu.
//
// Why not HWY_DYNAMIC_DISPATCH: (1) it reads Highway's process-wide chosen target, which other
// code can reset (see chosen_target() below); (2) with one compiled target (aarch64 compiles only
// NEON, its baseline) it becomes N_NEON::x, which a qualified name breaks. This macro names the
// dispatch table fully and indexes it with Kiln's own choice.
// Include it after "hwy/highway.h" (which itself follows "hwy/foreach_target.h").
#pragma once

#ifndef HWY_TARGETS
#error "include kernels/cpu/dispatch.h after hwy/highway.h"
#endif

namespace kiln::cpu {
/// Kiln's own copy of Highway's dispatch state, set once to the chosen target (target.cpp). Not
/// hwy::GetChosenTarget(): that one is process-wide and shared with every other user of libhwy,
/// and Highway 1.0.3 resets it to the best target whenever anything calls hwy::SupportedTargets(),
/// which would run kernel state prepared for one target (packed weights, tiles) with another
/// target's code.
const hwy::ChosenTarget& chosen_target();
}  // namespace kiln::cpu

#if HWY_IDE || ((HWY_TARGETS & (HWY_TARGETS - 1)) == 0)
#define KILN_CPU_DISPATCH(FN) (*(::kiln::cpu::HWY_DISPATCH_TABLE(FN)[0]))
#else
#define KILN_CPU_DISPATCH(FN) (*(::kiln::cpu::HWY_DISPATCH_TABLE(FN)[::kiln::cpu::chosen_target().GetIndex()]))
#endif

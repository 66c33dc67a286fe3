// KILN_CPU_DISPATCH(Fn): the version of kiln::cpu::Fn for the process's SIMD target
// (kernels/cpu/target.h), callable from any namespace. Fn is a per-target function exported with
// HWY_EXPORT(Fn) inside namespace kiln::cpu.
//
// Why not HWY_DYNAMIC_DISPATCH(cpu::Fn): with one compiled target (aarch64 compiles only NEON,
// its baseline) Highway turns HWY_DYNAMIC_DISPATCH(x) into N_NEON::x, which a qualified name
// breaks; with several it reads a table named after x. This macro names the table fully in both
// cases.
// Include it after "hwy/highway.h" (which itself follows "hwy/foreach_target.h").
#pragma once

#ifndef HWY_TARGETS
#error "include kernels/cpu/dispatch.h after hwy/highway.h"
#endif

#if HWY_IDE || ((HWY_TARGETS & (HWY_TARGETS - 1)) == 0)
#define KILN_CPU_DISPATCH(FN) (*(::kiln::cpu::HWY_DISPATCH_TABLE(FN)[0]))
#else
#define KILN_CPU_DISPATCH(FN) (*(::kiln::cpu::HWY_DISPATCH_TABLE(FN)[hwy::GetChosenTarget().GetIndex()]))
#endif

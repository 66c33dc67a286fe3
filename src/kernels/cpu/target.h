// Internal side of include/kiln/cpu_target.h for the kernel files.
#pragma once

#include <cstdint>

namespace kiln::cpu {

/// Chooses the process's SIMD target once (thread-safe; later calls return the same) and points
/// Highway's dynamic dispatch at it; returns its Highway target bit (HWY_AVX2, ...). Must run
/// before the first HWY_DYNAMIC_DISPATCH of any kernel: register_cpu_kernels calls it, and code
/// that calls per-target functions directly (tests) calls it first.
int64_t select_target();

/// The Highway target bit of the code that HWY_DYNAMIC_DISPATCH calls now (after select_target()):
/// equal to select_target() unless something reset Highway's dispatch state.
int64_t dispatched_target();

/// The name ("avx2", ...) of a Highway target bit.
const char* target_name(int64_t bit);

}  // namespace kiln::cpu

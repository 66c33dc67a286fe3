// Test access to the per-target math of src/kernels/cpu/vec-inl.h (Exp, ExpNonpos, Tanh, Erfc)
// at the process's cpu target (tests/cpp/cpu_vec_shim.cpp: compiled for every Highway target,
// called through HWY_DYNAMIC_DISPATCH after cpu::select_target()).
#pragma once

#include <cstddef>

namespace kiln::test {

/// The vec-inl.h function that vec_math applies.
enum class VecFn { Exp, ExpNonpos, Tanh, Erfc };

/// y[i] = fn(x[i]) for i < n, at the process's cpu target (chosen first if it was not yet):
/// whole vectors, then a LoadTail/StoreTail remainder, as the kernels use them.
void vec_math(VecFn fn, const float* x, float* y, size_t n);

}  // namespace kiln::test

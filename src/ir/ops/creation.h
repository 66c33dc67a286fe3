// Rules shared by the creation ops' inference (src/ir/ops/creation.cpp) and their portable kernels.
#pragma once

#include <cstdint>

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

/// Number of elements of arange(start, end, step) in `dtype`: ceil((end - start) / step) computed
/// in double, as PyTorch's RangeFactories.cpp does. InvalidArgument for a zero or non-finite step,
/// non-finite bounds, or a step whose sign disagrees with end - start ("upper bound and larger
/// bound inconsistent with step sign"); NotSupported for dtypes other than float32, float64, int64,
/// int32, int8, uint8.
Result<int64_t> arange_length(double start, double end, double step, DType dtype);

}  // namespace kiln

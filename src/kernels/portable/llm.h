// Helpers shared by the kernels of kiln.sdpa_kv_cache (portable/llm.cpp, cpu/attention.cpp).
#pragma once

#include <cstdint>

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

/// p = input_pos[0] of a kiln.sdpa_kv_cache call with T query rows over a cache of S positions, or
/// InvalidArgument naming the op, p, T and S when the rows [p, p + T) do not fit [0, S) (checked
/// by each kernel before it writes anything). Internal unless input_pos is int64 with one element.
Result<int64_t> sdpa_kv_cache_position(const Tensor& input_pos, int64_t T, int64_t S);

}  // namespace kiln

// The strided copy behind the data-movement kernels (aten.permute / transpose / slice / expand /
// select): output rows of a shape_rules::StridedView materialized contiguously. One definition
// for the portable kernels (all rows, one thread) and the cpu kernels (row ranges on the pool).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "ir/ops/shape_rules.h"

namespace kiln {

/// Copies `n` elements of `es` bytes, `stride` elements apart in src, contiguously into dst.
inline void copy_strided_elements(const uint8_t* src, int64_t stride, int64_t n, size_t es, uint8_t* dst) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* s = reinterpret_cast<const T*>(src);
    T* d = reinterpret_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = s[i * stride];
  };
  if (stride == 1) {
    std::memcpy(dst, src, static_cast<size_t>(n) * es);
    return;
  }
  switch (es) {
    case 1: run(uint8_t{}); return;
    case 2: run(uint16_t{}); return;
    case 4: run(uint32_t{}); return;
    case 8: run(uint64_t{}); return;
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * es, src + i * stride * static_cast<int64_t>(es), es);
  }
}

/// Output rows [r0, r1) of view `v` (rank >= 1; a row = the last dim) of the elements at `src`
/// (already offset by v.offset; `es` bytes each), written contiguously at dst + r0 * row bytes.
inline void copy_view_rows(const uint8_t* src, const shape_rules::StridedView& v, size_t es, uint8_t* dst, int64_t r0,
                           int64_t r1) {
  const size_t rank = v.sizes.size();
  const int64_t inner = v.sizes[rank - 1], inner_stride = v.strides[rank - 1];
  const auto esz = static_cast<int64_t>(es);
  std::vector<int64_t> idx(rank - 1, 0);  // index of row r0 over the outer dims
  int64_t base = 0;                       // element offset of the current row
  for (int64_t r = r0, d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = r % v.sizes[static_cast<size_t>(d)];
    r /= v.sizes[static_cast<size_t>(d)];
    base += idx[static_cast<size_t>(d)] * v.strides[static_cast<size_t>(d)];
  }
  uint8_t* o = dst + r0 * inner * esz;
  for (int64_t row = r0; row < r1; ++row) {
    copy_strided_elements(src + base * esz, inner_stride, inner, es, o);
    o += inner * esz;
    for (size_t d = rank - 1; d-- > 0;) {
      base += v.strides[d];
      if (++idx[d] < v.sizes[d]) break;
      base -= v.strides[d] * v.sizes[d];
      idx[d] = 0;
    }
  }
}

}  // namespace kiln

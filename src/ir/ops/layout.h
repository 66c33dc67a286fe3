// Layout rules shared by the inference of flip, repeat, diagonal and as_strided
// (src/ir/ops/layout.cpp) and their portable kernels (src/kernels/portable/layout.cpp), so that
// the elements a kernel reads are, by construction, the ones inference checked.
// Semantics follow PyTorch eager (aten/src/ATen/native/TensorTransformations.cpp flip,
// TensorShape.cpp repeat / diagonal / as_strided). InvalidArgument names the attribute.
#pragma once

#include <optional>
#include <vector>

#include "ir/ops/shape_rules.h"

namespace kiln {

/// aten.flip(self, dims): each dim in [-rank, rank) at most once (0-d: 0 / -1); the view reads
/// the input backwards along those dims (negative strides).
Result<shape_rules::StridedView> flip_view(const std::vector<int64_t>& sizes, const std::vector<int64_t>& dims);
/// aten.diagonal(self, offset, dim1, dim2): rank >= 2, dim1 != dim2 (after wrapping); the result has
/// the other dims in order, then the diagonal of length max(0, min(size1, size2 - offset)) for
/// offset >= 0, max(0, min(size1 + offset, size2)) otherwise.
Result<shape_rules::StridedView> diagonal_view(const std::vector<int64_t>& sizes, int64_t offset, int64_t dim1,
                                               int64_t dim2);
/// aten.as_strided(self, size, stride, storage_offset): len(size) == len(stride), sizes >= 0,
/// strides >= 0, storage_offset >= 0 (None = 0), and every element the view names lies inside the
/// input's `numel` elements (row-major); else InvalidArgument naming the extent.
Result<shape_rules::StridedView> as_strided_view(int64_t numel, const std::vector<int64_t>& size,
                                                 const std::vector<int64_t>& stride,
                                                 std::optional<int64_t> storage_offset);
/// aten.repeat(self, repeats): len(repeats) >= rank, repeats >= 0; out sizes = repeats[i] times the
/// (left-padded with 1) input sizes.
Result<std::vector<int64_t>> repeat_sizes(const std::vector<int64_t>& sizes, const std::vector<int64_t>& repeats);

}  // namespace kiln

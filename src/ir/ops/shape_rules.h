// Shape rules shared by the inference of reduction/shape ops (src/ir/ops/{reduction,shape}.cpp)
// and their portable kernels (src/kernels/portable/{reduction,shape}.cpp), so that the sizes a
// kernel computes are, by construction, the sizes inference checked.
//
// Semantics follow PyTorch eager (aten/src/ATen/native/TensorShape.cpp, ReduceOps.cpp,
// aten/src/ATen/ExpandUtils.cpp, c10/core/WrapDimMinimal.h). All functions return
// InvalidArgument with a message naming the offending attribute; none of them throws.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/error.h"

namespace kiln::shape_rules {

/// Product of `sizes`; InvalidArgument when it would exceed 2^62 (a size no program can hold).
Result<int64_t> checked_numel(const std::vector<int64_t>& sizes);

/// Row-major (contiguous) element strides of `sizes`; a 0-d tensor has no strides.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes);

/// Which dims a reduction over `dims` (attribute `what`) reduces, for an input of rank `rank`.
/// `dims` nullopt or empty means every dim (torch.sum/mean/amax with dim=None or []).
/// Dims may be negative; a dim given twice (after wrapping) is InvalidArgument as in torch.
/// The mask has `rank` entries (none for a 0-d input, where dim 0 and -1 are accepted).
Result<std::vector<bool>> reduction_mask(const std::optional<std::vector<int64_t>>& dims, int64_t rank,
                                         const char* what = "dim");

/// Output sizes of a reduction: reduced dims dropped, or kept with size 1 when `keepdim`.
std::vector<int64_t> reduced_sizes(const std::vector<int64_t>& sizes, const std::vector<bool>& mask, bool keepdim);

/// A strided view of a contiguous input: element (i0, ..., ik) of the view is the input's
/// element number `offset + sum_d i_d * strides[d]` (strides in elements, may be 0).
struct StridedView {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;
};

/// aten.permute(self, dims): len(dims) == rank, each dim in [-rank, rank), no dim repeated.
Result<StridedView> permute_view(const std::vector<int64_t>& sizes, const std::vector<int64_t>& dims);
/// aten.transpose(self, dim0, dim1): both in range (0-d: 0 or -1).
Result<StridedView> transpose_view(const std::vector<int64_t>& sizes, int64_t dim0, int64_t dim1);
/// aten.expand(self, size, implicit): len(size) >= rank; new leading dims are >= 0 (not -1);
/// for existing dims, -1 keeps the size, an input size of 1 may become any size >= 0, other
/// sizes must match. Broadcast dims get stride 0.
Result<StridedView> expand_view(const std::vector<int64_t>& sizes, const std::vector<int64_t>& size);
/// aten.slice(self, dim, start, end, step): rank >= 1, step >= 1; start/end (None = 0 / end)
/// are wrapped once when negative, then clamped to [0, size] with end >= start
/// (aten/src/ATen/native/TensorShape.cpp, slice()); end = INT64_MAX means "to the end".
Result<StridedView> slice_view(const std::vector<int64_t>& sizes, int64_t dim, std::optional<int64_t> start,
                               std::optional<int64_t> end, int64_t step);
/// aten.select(self, dim, index): rank >= 1, index in [-size, size).
Result<StridedView> select_view(const std::vector<int64_t>& sizes, int64_t dim, int64_t index);

/// aten.view(self, size): at most one -1, other entries >= 0, product equal to `numel`
/// (a -1 next to a 0 for an empty tensor is ambiguous and rejected, as in torch).
Result<std::vector<int64_t>> view_sizes(int64_t numel, const std::vector<int64_t>& size);
/// aten.squeeze(self, dim): dims nullopt = every size-1 dim; listed dims whose size is not 1
/// are kept, as torch does. Dims may be negative; repeats are InvalidArgument.
Result<std::vector<int64_t>> squeeze_sizes(const std::vector<int64_t>& sizes,
                                           const std::optional<std::vector<int64_t>>& dims);
/// aten.unsqueeze(self, dim): dim in [-(rank+1), rank].
Result<std::vector<int64_t>> unsqueeze_sizes(const std::vector<int64_t>& sizes, int64_t dim);

/// aten.constant_pad_nd(self, pad, value): `pad` holds (before, after) pairs starting from the
/// last dim; its length is even and at most 2 * rank; negative pads crop, and the crops of one
/// dim together may not exceed its size (torch narrows before padding). Returns the per-dim pads before each dim (length rank, 0 for unpadded dims)
/// in `before` and the output sizes.
struct PadPlan {
  std::vector<int64_t> before;
  std::vector<int64_t> out_sizes;
};
Result<PadPlan> constant_pad_plan(const std::vector<int64_t>& sizes, const std::vector<int64_t>& pad);

}  // namespace kiln::shape_rules

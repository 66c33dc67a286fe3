// Size rules of the indexing ops (src/ir/ops/indexing.cpp), shared with their portable kernels
// (src/kernels/portable/indexing.cpp) and the mlx lowering, so that the sizes a kernel computes
// are, by construction, the sizes inference checked.
//
// Semantics follow PyTorch eager (aten/src/ATen/native/TensorAdvancedIndexing.cpp,
// IndexingUtils.h, ScatterGatherChecks.h; the NumPy advanced-indexing rules). All functions return
// InvalidArgument with a message naming the offending argument; none of them throws.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/error.h"

namespace kiln::index_rules {

/// The layout of self[indices] for integer index tensors (aten.index.Tensor after the capture has
/// dropped the None entries): index tensor k indexes self's dim dims[k].
///
/// Rules (NumPy / PyTorch advanced indexing): the index tensors broadcast together to `bcast`;
/// when the indexed dims are adjacent (dims[k+1] == dims[k] + 1) the result is
/// self.shape[:dims[0]] + bcast + self.shape[dims.back()+1:], otherwise the broadcast dims go first:
/// bcast + (self's non-indexed dims in order).
struct AdvancedIndex {
  std::vector<int64_t> out_sizes;
  std::vector<int64_t> bcast;  ///< broadcast shape of the index tensors
  int64_t bcast_pos = 0;       ///< where bcast starts in out_sizes
  /// For each out dim: the self dim it walks, or -1 for a bcast dim.
  std::vector<int64_t> out_to_self;
};

/// `dims` strictly increasing in [0, rank) (rank >= 1), one entry per index tensor (at least one);
/// the index shapes must broadcast. InvalidArgument ("dims: ..." / "indices: ...") otherwise.
Result<AdvancedIndex> advanced_index(const std::vector<int64_t>& self_sizes, const std::vector<int64_t>& dims,
                                     const std::vector<std::vector<int64_t>>& index_sizes);

/// aten.gather / scatter shape checks (ScatterGatherChecks.h), with 0-d tensors counted as
/// 1-D of size 1: index has self's rank; index.size(d) <= self.size(d) for d != dim; for scatter
/// (src given) index.size(d) <= src.size(d) for every d and src has self's rank too. Skipped when
/// index is empty, as PyTorch does. Returns the wrapped dim.
Result<int64_t> gather_scatter_check(const std::vector<int64_t>& self_sizes, int64_t dim,
                                     const std::vector<int64_t>& index_sizes,
                                     const std::vector<int64_t>* src_sizes);

}  // namespace kiln::index_rules

// The mlx delegate's lowerings of the indexing ops (src/backends/mlx/mlx_indexing.cpp), listed in
// the op table of mlx_ops.cpp. Run-time indices are wrapped (negative from the end), clamped for
// the gather/scatter (never an out-of-bounds access) and range-checked with a RuntimeCheck
// (execute: InvalidArgument naming the op, the dim and its size).
#pragma once

#include "backends/mlx/mlx_ops.h"

namespace kiln::mlxb::indexing {

Error check_index(const NodeView& n);
mx::array index(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&);
Error check_gather(const NodeView& n);
mx::array gather(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&);
Error check_index_select(const NodeView& n);
mx::array index_select(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&);
Error check_scatter(const NodeView& n);
mx::array scatter(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&);
Error check_slice_scatter(const NodeView& n);
mx::array slice_scatter(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&);
mx::array select_scatter(BuildCtx& c, const NodeView& n, const Inputs& in, const std::vector<mx::array>&);

}  // namespace kiln::mlxb::indexing

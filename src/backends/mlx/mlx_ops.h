// The mlx delegate's op table (src/backends/mlx/mlx_ops.cpp): for each Kiln op it lowers, one
// entry holding the check that decides support (and names the reason when it declines) and the
// function that builds the op from MLX arrays. The compile half (support, lower) and the run half
// (init, which re-checks every node of an untrusted payload) both call the same check, so what
// the partitioner accepts is exactly what init builds.
//
// Layout: values are MLX arrays in Kiln's logical order (NCHW for images). Convolutions transpose
// to MLX's NHWC and back; MLX transposes are views (no copy), elementwise ops keep their input's
// memory order, so a chain conv -> bn -> relu -> conv stays NHWC in memory with no copies.
#pragma once

#include <mlx/mlx.h>

#include <map>
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/attributes.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln::mlxb {

namespace mx = mlx::core;

/// One node as both halves see it: Kiln op name, input types (nullopt for None) and whether each
/// input is a constant, normalized attributes and the output type Kiln's inference gave.
struct NodeView {
  std::string op;
  std::vector<std::optional<TensorType>> in;
  std::vector<bool> in_const;
  Attributes attrs;
  TensorType out;
};

/// A data-dependent error the graph computes (e.g. an embedding index out of range): `flag` is a
/// bool scalar evaluated with the outputs; execute returns InvalidArgument with `message` if true.
struct RuntimeCheck {
  mx::array flag;
  std::string message;
};

/// State for building one node inside the traced function.
struct BuildCtx {
  mx::Device dev;
  std::vector<RuntimeCheck>* checks;
  /// The dtype float32 values are computed in (float32, float16 or bfloat16).
  mx::Dtype compute = mx::float32;
  /// 2-D convolutions (groups 1 or depthwise) as im2col + matmul / fused taps instead of MLX's
  /// convolution (on MLX's CPU device, where MLX's convolution is a direct loop).
  bool taps_conv = false;
  /// The MLX dtype a value of Kiln dtype `d` has inside the computation.
  mx::Dtype dtype(DType d) const;
};

using Inputs = std::vector<std::optional<mx::array>>;
/// Ok, or NotSupported naming why this node is not lowered (called after Kiln's inference passed).
using CheckFn = Error (*)(const NodeView& n);
/// Optional: derives arrays from the node's constant inputs once at init (e.g. a convolution
/// weight in MLX's OHWI layout); `consts[i]` is null for non-constant inputs. Results are evaluated
/// before the graph is traced, so the traced graph reads them as constants.
using PrepareFn = std::vector<mx::array> (*)(const NodeView& n, const Inputs& consts, mx::Device dev);
/// Builds the node's output from its inputs (None inputs are nullopt). May throw MLX's exceptions;
/// the caller turns them into errors.
using BuildFn = mx::array (*)(BuildCtx& ctx, const NodeView& n, const Inputs& in, const std::vector<mx::array>& prep);

struct OpLowering {
  CheckFn check;
  BuildFn build;
  PrepareFn prepare = nullptr;
  /// With a reduced compute dtype, run this op in float32 (inputs converted up, the result
  /// down): norm statistics, softmax, reductions and averaging. Their prepared arrays stay float32.
  bool float32_inside = false;
  /// Bit i set: when `prepare` returned arrays, build does not read input i (it reads the prepared
  /// form), so a constant used only there is released after init (one copy of conv weights).
  uint32_t prepared_replaces = 0;
};

/// Adds the math family's lowerings (src/backends/mlx/mlx_math.cpp) to the op table; returns `table`.
std::map<std::string, OpLowering, std::less<>>* add_math_lowerings(std::map<std::string, OpLowering, std::less<>>* table);

/// Adds the lowerings of src/backends/mlx/mlx_ops_reduce.cpp (any, prod, var, flip, repeat,
/// diagonal, as_strided, arange, full, fill, copy, ...) to the op table.
void add_reduce_family_lowerings(std::map<std::string, OpLowering, std::less<>>& table);
/// Adds the lowerings of src/backends/mlx/mlx_llm.cpp (kiln.sdpa_kv_cache, kiln.check_range:
/// Kiln's ops for generative language models, src/ir/ops/llm.cpp) to the op table.
void add_llm_lowerings(std::map<std::string, OpLowering, std::less<>>& table);
/// NotSupported with `why` (a check's reason for declining a node).
inline Error no(const std::string& why) { return Error(ErrorCode::NotSupported, why); }
/// Kiln sizes as an MLX shape (check_node has already limited every size to int32).
inline mx::Shape shape_of(const std::vector<int64_t>& s) {
  mx::Shape out;
  for (int64_t d : s) out.push_back(static_cast<int32_t>(d));
  return out;
}
/// A dim in [-rank, rank) wrapped into [0, rank) (inference has checked the range).
inline int wrap(int64_t d, int64_t rank) { return static_cast<int>(d < 0 ? d + rank : d); }
/// aten.slice's [start, end) on a dim of `size`: None is 0 / size, negatives count from the end,
/// both clamped to [0, size] with end >= start (PyTorch aten/src/ATen/native/TensorShape.cpp slice).
inline std::pair<int64_t, int64_t> slice_bounds(const Attributes& attrs, int64_t size) {
  int64_t start = attrs.is_none("start") ? 0 : attrs.get_int("start");
  int64_t end = attrs.is_none("end") ? size : attrs.get_int("end");
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  return {start, end};
}

/// The lowering of `op` ("aten.convolution", ...), or null when the mlx delegate has none.
const OpLowering* find_lowering(std::string_view op);
/// Every op name the table covers, sorted (for docs and reports).
std::vector<std::string> lowered_ops();
/// Kiln dtype -> MLX dtype (all eight Kiln dtypes have one).
mx::Dtype to_mx(DType dtype);
/// Checks that apply to every node (sizes MLX can index with int32, no empty tensors), then the
/// op's own check. NotSupported with the reason.
Error check_node(const NodeView& n);

}  // namespace kiln::mlxb

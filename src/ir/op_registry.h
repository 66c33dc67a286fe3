// The op registry: each Kiln op (an ATen op) is defined exactly once here, by name, with its
// argument schema and shape/dtype inference. Kernels and backend handlers refer to these
// definitions by name; the compiler uses them to type nodes, and the runtime's loader uses
// them to re-check every kernel call of an untrusted program file before any kernel runs.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/attributes.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

/// One tensor argument of an op schema (positional, in ATen order).
struct TensorArgSpec {
  std::string name;
  bool optional = false;  ///< may be None (ValueId -1)
};

/// The kind an attribute must have after normalization.
enum class AttrKind { Bool, Int, Float, String, Ints, Floats };

/// One non-tensor argument with its ATen name and default. `default_value` holding
/// std::monostate with `required` false means "default None".
struct AttrSpec {
  std::string name;
  AttrKind kind;
  AttrValue default_value;
  bool required = false;     ///< no default: must be given
  bool nullable = false;     ///< may be None (e.g. upsample's scales_h)
};

/// Inputs of a node as seen by shape inference: nullptr for an absent optional argument.
using InputTypes = std::span<const TensorType* const>;

/// Infers output types from input types and normalized attributes. Returns InvalidArgument
/// (with a message naming the argument) for inconsistent shapes, NotSupported for valid
/// but unimplemented configurations (e.g. an unsupported dtype).
using InferFn = std::function<Result<std::vector<TensorType>>(InputTypes, const Attributes&)>;

/// The single definition of an op.
struct OpDef {
  std::string name;                     ///< ATen name, e.g. "aten.convolution"
  std::vector<TensorArgSpec> inputs;    ///< tensor arguments in ATen order
  std::vector<AttrSpec> attrs;          ///< non-tensor arguments
  int num_outputs = 1;
  InferFn infer;
  std::string doc;                      ///< one line: semantics and source
  /// A tensor-list op (aten.cat): `inputs` holds one spec naming the list; a node takes one
  /// or more tensors, none of them None.
  bool variadic = false;

  /// Fills defaults, checks that every given attribute is known and of the right kind
  /// (ints are accepted for floats, bools for ints), and returns the normalized list in
  /// schema order. InvalidArgument names the op and the attribute.
  Result<Attributes> normalize_attributes(const Attributes& given) const;
  /// Checks arity and optional-ness of `inputs`, then runs `infer`.
  Result<std::vector<TensorType>> infer_types(InputTypes inputs, const Attributes& normalized) const;
};

// runs_in_place (the activations that may run in place, and fuse): src/ir/fusion.h.

/// True for the ops whose output is their input's bytes unchanged under new sizes: aten.view,
/// aten.squeeze, aten.unsqueeze (Kiln tensors are contiguous, so these reinterpret the same
/// elements in the same order). The memory planner may give the output exactly its input's bytes
/// (a zero-copy view); their kernels then copy nothing. The loader accepts that exact aliasing for
/// them (same byte range, same dtype and byte size).
bool is_byte_view(std::string_view op);

/// True for the ops that may update a state tensor in place (plan_state_updates, the loader's
/// state checks): aten.index_put and aten.slice_scatter, whose kernels (portable; the loader gives
/// such a call no optimized kernel) check every index before writing and skip copying self when
/// the output is self's bytes, so they write only the updated elements.
bool updates_state_in_place(std::string_view op);

/// Registry of all ops. Built once on first use (explicit registration functions, no static
/// initializers), read-only afterwards, safe to use from many threads.
class OpRegistry {
 public:
  static const OpRegistry& get();
  const OpDef* find(std::string_view name) const;
  const std::vector<OpDef>& ops() const { return ops_; }

  void add(OpDef def);  ///< used only while building the registry

 private:
  std::vector<OpDef> ops_;
};

// Registration functions, one per op family (src/ir/ops/*.cpp). Each adds its OpDefs.
void register_elementwise_ops(OpRegistry& r);
void register_math_ops(OpRegistry& r);  // src/ir/ops/math.cpp: elementwise math, rounding, bitwise
void register_conv_ops(OpRegistry& r);
void register_linear_ops(OpRegistry& r);
void register_norm_ops(OpRegistry& r);
void register_pool_ops(OpRegistry& r);
void register_upsample_ops(OpRegistry& r);
void register_reduction_ops(OpRegistry& r);
void register_shape_ops(OpRegistry& r);
void register_quant_ops(OpRegistry& r);  // src/ir/ops/quant.cpp: weight-only quantized linear/conv
void register_sort_ops(OpRegistry& r);      // src/ir/ops/sort.cpp: sort, topk
void register_creation_ops(OpRegistry& r);  // src/ir/ops/creation.cpp: arange, full, fill, copy, ...
void register_layout_ops(OpRegistry& r);    // src/ir/ops/layout.cpp: flip, repeat, diagonal, as_strided
void register_indexing_ops(OpRegistry& r);  // src/ir/ops/indexing.cpp: index, gather, scatter*, embedding_bag
void register_spatial_extra_ops(OpRegistry& r);  // src/ir/ops/spatial_extra.cpp: pads, 3-D pools, grid_sampler, col2im, cdist
void register_llm_ops(OpRegistry& r);       // src/ir/ops/llm.cpp: kiln.sdpa_kv_cache

// Helpers for inference functions.
/// NumPy/PyTorch broadcasting of two shapes; InvalidArgument when incompatible.
Result<std::vector<int64_t>> broadcast_shapes(const std::vector<int64_t>& a,
                                              const std::vector<int64_t>& b);
/// Wraps a possibly negative dim into [0, rank); InvalidArgument when out of range.
Result<int64_t> wrap_dim(int64_t dim, int64_t rank);
/// PyTorch's type promotion for two tensor dtypes (float wins over int; wider wins).
DType promote_types(DType a, DType b);
/// PyTorch's result dtype of an op on two tensors (at::result_type, c10 ResultTypeState):
/// a 0-d tensor changes the dtype only when its category (bool < integer < floating) is higher
/// than the other's, so int32[2, 3] + int64[] is int32 and int32[2, 3] + float32[] is float32;
/// otherwise promote_types.
DType result_type(const TensorType& a, const TensorType& b);

}  // namespace kiln

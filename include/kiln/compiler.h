// Kiln compiler API: build a graph of ATen ops, compile one or more methods into a program.
//
//   kiln::Graph g;
//   auto x = g.add_input("x", {kiln::DType::Float32, {1, 8}});
//   auto w = g.add_constant("w", {kiln::DType::Float32, {4, 8}}, bytes);
//   auto y = g.add_node("aten.linear", {x, w, kiln::kNoValue}, {});
//   g.set_outputs({y.value()[0]});
//   kiln::ProgramBuilder pb; pb.add_method("forward", std::move(g));
//   auto compiled = pb.compile();   // compiled->bytes is the .kiln file
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/attributes.h"
#include "kiln/error.h"
#include "kiln/symbolic.h"
#include "kiln/tensor.h"

namespace kiln {

using ValueId = int32_t;
constexpr ValueId kNoValue = -1;  ///< an absent optional tensor argument (None)

/// Immutable bytes of a constant tensor, shared between graphs and methods.
using ConstantBytes = std::shared_ptr<const std::vector<uint8_t>>;

/// A tensor value of the graph: a method input, a constant or a node output.
struct Value {
  TensorType type;         ///< for a value with symbolic sizes: the upper bound of each size
  std::string name;
  ConstantBytes constant;  ///< non-null for constants
  bool is_input = false;
  /// Empty for a value of fixed sizes; else one expression per dim over the graph's symbols
  /// (constants for the fixed dims). type.sizes then holds each size's upper bound.
  std::vector<SymExpr> sym_sizes;
  /// Index of the graph's state (Graph::states) whose bytes this value is: the state read at the
  /// start of the method, or a new value of it written in place (plan_state_updates); else -1.
  int32_t state = -1;
  bool is_dynamic() const { return !sym_sizes.empty(); }
};

/// A symbolic int attribute of a node: attribute `name` (an int, or element `index` of an int
/// list) is the value of `expr` at run time; the attribute itself holds the upper-bound value.
struct SymAttr {
  std::string name;
  int64_t index = -1;  ///< element of an int list; -1 for an int attribute
  SymExpr expr;
};

/// A tensor that persists across calls (a KV cache): owned by a session, read by the method as
/// `value` and replaced by `update` when the call succeeds.
struct StateDef {
  std::string name;
  TensorType type;        ///< fixed sizes
  ConstantBytes initial;  ///< initial value (type.nbytes() bytes), or null for zeros
  ValueId value = kNoValue;   ///< the graph value holding the state at the start of the method
  ValueId update = kNoValue;  ///< the value the state takes when the method succeeds (kNoValue: unchanged)
};

/// A subgraph lowered by a delegate backend (set on nodes the partitioner created).
struct DelegateBlob {
  std::string backend;            ///< e.g. "xnnpack"
  std::vector<uint8_t> payload;   ///< stored as a payload segment (kind 1)
  std::vector<ValueId> constants; ///< constant values the payload refers to, by position
  /// States the backend holds for the session (Subgraph::states, in the payload's order): indices
  /// into the graph's states(). Their read value is not a boundary input and their update not a
  /// boundary output; the serializer writes no StateUpdate for them.
  std::vector<size_t> states;
};

/// One call of an ATen op, or (when `delegate` is set) of a delegate's lowered subgraph,
/// whose op is then "delegate:<backend>" and whose inputs/outputs are the boundary values.
struct Node {
  std::string op;                 ///< e.g. "aten.convolution"
  std::vector<ValueId> inputs;    ///< schema order; kNoValue for None
  std::vector<ValueId> outputs;
  Attributes attrs;               ///< normalized by the op's schema
  std::string debug_name;         ///< where it came from, e.g. "features.3.block.1"
  std::shared_ptr<const DelegateBlob> delegate;  ///< non-null for delegate calls
  std::vector<SymAttr> sym_attrs; ///< int attributes whose run-time value is a symbolic expression
};

/// A dataflow graph in topological order (nodes are appended after their inputs exist).
class Graph {
 public:
  ValueId add_input(std::string name, TensorType type);
  /// Declares a symbol `name` in [min, max] (0 <= min <= max <= kMaxSymbolValue; names unique):
  /// its index, for SymExpr::symbol. InvalidArgument otherwise.
  Result<int32_t> add_symbol(std::string name, int64_t min, int64_t max);
  /// An input with symbolic sizes: one expression per dim (SymExpr::constant for fixed dims);
  /// type.sizes is replaced by the upper bounds. Every symbol must appear alone as some input's
  /// dim (that is where execute binds it). InvalidArgument for a bad expression.
  Result<ValueId> add_input(std::string name, TensorType type, std::vector<SymExpr> sym_sizes);
  /// A state tensor (fixed sizes) with its initial value (type.nbytes() bytes; null = zeros):
  /// returns the value holding it at the start of the method. InvalidArgument for a duplicate name
  /// or wrong byte count.
  Result<ValueId> add_state(std::string name, TensorType type, ConstantBytes initial = nullptr);
  /// The value `state` (returned by add_state) takes when the method succeeds; it must have the
  /// state's type and fixed sizes. InvalidArgument otherwise.
  Error set_state_update(ValueId state, ValueId value);
  const std::vector<SymbolDef>& symbols() const { return symbols_; }
  const std::vector<StateDef>& states() const { return states_; }
  std::vector<StateDef>& mutable_states() { return states_; }
  /// add_node for symbolic graphs: `sym_attrs` name the int attributes (or list elements) whose
  /// value is an expression of the symbols (the attribute's own value is ignored), and
  /// `out_sym_sizes` gives each output's sizes as expressions (empty: derived, see below). The op's
  /// shape inference runs at every check binding (check_bindings) and must agree with the given
  /// expressions (InvalidArgument naming the op, the binding and both sizes otherwise); without them
  /// each output dim is matched against the inputs' dims, the symbolic attributes and constants
  /// across the bindings (InvalidArgument when none matches). Outputs get the upper bounds over the
  /// bindings as their type.
  Result<std::vector<ValueId>> add_node(const std::string& op, std::vector<ValueId> inputs, const Attributes& attrs,
                                        std::string debug_name, std::vector<SymAttr> sym_attrs,
                                        std::vector<std::vector<SymExpr>> out_sym_sizes);
  /// `bytes` must hold exactly type.nbytes() bytes (InvalidArgument otherwise).
  Result<ValueId> add_constant(std::string name, TensorType type, ConstantBytes bytes);
  Result<ValueId> add_constant(std::string name, TensorType type, std::vector<uint8_t> bytes);
  /// Adds a node: looks the op up in the registry (OperatorMissing if unknown), normalizes
  /// its attributes, infers output types. Errors name the op and debug_name.
  Result<std::vector<ValueId>> add_node(const std::string& op, std::vector<ValueId> inputs,
                                        const Attributes& attrs, std::string debug_name = {});
  /// InvalidArgument when an id is out of range. Clears the output names (set_output_names).
  Error set_outputs(std::vector<ValueId> outputs);
  /// Names the outputs (written to the program file as Method.output_names; `kiln inspect`,
  /// `kiln run`'s .npy file names, MethodMeta::output_names): one per output, each non-empty,
  /// printable UTF-8 (is_printable_name) and distinct (unique_output_names makes them so); an empty
  /// list leaves the outputs unnamed.
  /// InvalidArgument otherwise.
  Error set_output_names(std::vector<std::string> names);
  /// Empty (unnamed), or one name per output.
  const std::vector<std::string>& output_names() const { return output_names_; }

  const std::vector<Value>& values() const { return values_; }
  std::vector<Value>& mutable_values() { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& mutable_nodes() { return nodes_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const Value& value(ValueId id) const { return values_.at(static_cast<size_t>(id)); }

 private:
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
  std::vector<std::string> output_names_;
  std::vector<SymbolDef> symbols_;
  std::vector<StateDef> states_;
};

/// Quantization of constant weights (src/compiler/quantize.cpp; layout and formula:
/// src/ir/ops/quant.h). Activations stay float32 unless activation_bits = 8.
struct QuantizeOptions {
  int bits = 0;                ///< 0 = off; 8 = int8 symmetric per output channel; 4 = int4 group-wise
  int64_t group_size = 128;    ///< 4-bit: columns per group (>= 2; capped at the row length); 8-bit ignores it
  bool symmetric = true;       ///< 4-bit: symmetric (no zeros) or asymmetric (min/max with zeros)
  DType scale_dtype = DType::Float32;  ///< Float32 or Float16 scales (and zeros)
  /// Layers left in float32: glob patterns (fnmatch, e.g. "features.0.*", "*classifier*") matched
  /// against the node's debug_name and its weight's name.
  std::vector<std::string> exclude;
  /// Also quantize aten.embedding tables (float32 constants [V, D]) row by row with the same
  /// scheme (kiln.weight_quantized_embedding); a table tied to a quantized output projection is
  /// then stored once. Off by default: a model's numerics change only where asked
  /// (kiln.export_llm turns it on).
  bool embeddings = false;
  /// 0 (weight-only: float32 activations) or 8: quantized linear layers whose reduction length and
  /// group size are multiples of 32 quantize their input to int8 blocks of 32 at run time and
  /// multiply in integers (kiln.weight_quantized_linear activation_bits = 8, src/ir/ops/quant.h:
  /// llama.cpp's Q8_0 activations); the other layers (and embeddings, convolutions) stay at 0.
  int activation_bits = 0;
};

/// Compile options.
struct CompileOptions {
  bool fold_constants = true;
  bool eliminate_dead_code = true;
  /// Fold inference batch norms into the convolution / linear that feeds them (fold_batch_norm).
  bool fold_batch_norm = true;
  /// Delegate backends in order of preference (e.g. {"xnnpack"}); each takes what it supports
  /// of the nodes the earlier ones left. NotFound when one is not compiled into this build.
  std::vector<std::string> backends;
  /// Element type delegates compute in: Float32 (default), Float16 or BFloat16. Program inputs,
  /// outputs and constants stay as they are; a delegate that supports reduced precision (mlx)
  /// converts at its boundary and keeps numerically sensitive steps (norm statistics, softmax,
  /// reductions) in float32; the others (xnnpack) compute in float32. InvalidArgument otherwise.
  DType compute_dtype = DType::Float32;
  /// Non-empty: compile fails (NotSupported) listing every node not delegated to this backend
  /// (op, debug_name, reason). Implies `backends` = {it} when `backends` is empty.
  std::string require_delegation;
  /// Non-empty: alternatives for every method, in order of preference, each a list of
  /// backends (e.g. {{"mlx"}, {"xnnpack"}}; {} = Kiln's CPU kernels only). The file holds
  /// every alternative; at load the runtime takes the first whose backends are all available
  /// (MethodMeta::alternative says which). Replaces `backends`; not combined with
  /// `require_delegation` (InvalidArgument).
  std::vector<std::vector<std::string>> alternatives;
  /// Weight-only quantization (off by default). Runs after batch-norm folding, before partitioning.
  QuantizeOptions quantize;
  /// Float32 (default) or Float16: how the float32 constants that kernel calls read (weights left
  /// unquantized, biases, norm parameters) are stored in the file. Float16 stores each such constant
  /// of at least 1024 elements whose finite values all lie within float16's range as binary16; the
  /// loader widens it back to float32 once at load, into memory owned by the loaded program
  /// (file size halves for them; resident memory does not). Delegate payload constants are untouched.
  DType weights_dtype = DType::Float32;
};

/// How the partitioner split one method between delegates and Kiln's CPU kernels.
struct DelegationReport {
  struct BackendSummary {
    std::string backend;
    size_t segments = 0;          ///< delegate calls (payload segments) of this backend
    size_t nodes = 0;             ///< graph nodes they replace
    uint64_t constant_bytes = 0;  ///< bytes of the constants their payloads refer to
  };
  /// Nodes of one op left to CPU kernels, with each backend's distinct reasons for declining.
  struct CpuOp {
    std::string op;
    size_t count = 0;
    std::vector<std::pair<std::string, std::string>> reasons;  ///< (backend, reason)
  };
  /// One node not delegated to a backend (for require_delegation).
  struct Declined {
    std::string op, debug_name, backend, reason;
  };
  std::vector<BackendSummary> backends;  ///< in the order requested
  std::vector<CpuOp> cpu_ops;            ///< sorted by op name
  std::vector<Declined> declined;        ///< every (node, backend) pair declined, in node order
  /// Each state that a delegate segment reads or writes: held by that backend for the session
  /// (`resident`: no copy across the boundary per call), or passed through the boundary, with why.
  struct StatePlacement {
    std::string state, backend;
    bool resident = false;
    std::string reason;  ///< why it goes through the boundary (empty when resident)
  };
  std::vector<StatePlacement> states;
};

/// What the compiler did with one method.
struct MethodReport {
  std::string name;
  size_t alternative = 0;          ///< index into CompileOptions::alternatives (0 without)
  size_t num_nodes = 0;            ///< after passes
  size_t num_folded = 0;           ///< nodes removed by constant folding
  size_t num_bn_folded = 0;        ///< batch norms folded into their convolution / linear
  size_t num_hardswish = 0;        ///< elementwise hardswish patterns rewritten to aten.hardswish
  size_t num_affine_folded = 0;    ///< scalar mul/add groups folded into a convolution / linear
  size_t num_quick_gelu = 0;       ///< x * sigmoid(c * x) patterns rewritten to silu (rewrite_quick_gelu)
  size_t num_rms_norm = 0;         ///< x * rsqrt(mean(x^2) + eps) (* w) patterns rewritten to aten.rms_norm
  size_t num_dead = 0;             ///< nodes removed by dead-code elimination
  size_t num_quantized = 0;        ///< linear / matmul / convolution nodes given quantized weights
  uint64_t arena_bytes = 0;        ///< planned arena size
  uint64_t activation_bytes = 0;   ///< sum of all planned values' sizes (arena without reuse)
  uint64_t constant_bytes = 0;     ///< constants this method uses
  DelegationReport delegation;     ///< empty `backends` when none were requested
};

/// Result of ProgramBuilder::compile.
struct CompiledProgram {
  std::vector<uint8_t> bytes;         ///< the whole .kiln file
  std::vector<MethodReport> methods;
  uint64_t constant_bytes = 0;        ///< unique constant bytes stored (after dedup)
  /// Human-readable multi-line summary (per method: nodes, arena, constants).
  std::string report() const;
};

/// Metadata key under which ProgramBuilder::compile records each method's delegation (compact
/// JSON, version 1: {"version":1,"methods":[{"name","alternative","nodes","requested":[backend...],
/// "backends":[{"backend","segments","nodes","constant_bytes"}],"cpu_ops":[{"op","count",
/// "reasons":[[backend, reason]...]}]}]}, one entry per method and alternative). `kiln report`
/// shows it; files compiled before it was recorded do not have the key.
inline constexpr const char* kDelegationMetadataKey = "kiln.delegation";

/// Collects methods and compiles them into one program file.
class ProgramBuilder {
 public:
  /// InvalidArgument for a duplicate or empty name.
  Error add_method(std::string name, Graph graph);
  /// A string key/value stored in the program (e.g. "llm.vocab_size" -> "32000"), shown by
  /// `kiln inspect` and Program::metadata(). A repeated key replaces the earlier value.
  void set_metadata(std::string key, std::string value);
  /// Runs the passes on each method, plans memory, serializes. Constants with identical
  /// dtype, sizes and bytes are stored once across all methods.
  Result<CompiledProgram> compile(const CompileOptions& options = {}) const;

 private:
  std::vector<std::pair<std::string, Graph>> methods_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

/// Writes bytes to path without ever leaving a partial file: a temporary beside it renamed over it
/// once complete (a process that has the old program mapped keeps its bytes); an existing device
/// or FIFO is written in place. NotFound (missing folder) / InvalidArgument with the OS error.
Error write_file(const std::string& path, const std::vector<uint8_t>& bytes);

// Passes (src/ir/passes.cpp, src/compiler/memory_planner.cpp); each fits on a screen.
/// `names` made valid for Graph::set_output_names: an empty name becomes "output_<i>" (its
/// position), control characters and invalid UTF-8 are written as \xNN (printable()), and a
/// repeated name gets the first free suffix "_2", "_3", ... (order kept).
std::vector<std::string> unique_output_names(std::vector<std::string> names);

/// Removes nodes whose outputs are not (transitively) used by the graph outputs. Returns count.
size_t eliminate_dead_code(Graph& graph);
/// Evaluates nodes whose inputs are all constants with the portable kernels and replaces
/// their outputs by constants. Returns the count, or the kernel's error.
Result<size_t> fold_constants(Graph& graph);
/// Folds an inference aten.native_batch_norm (training=False; constant float32 running_mean,
/// running_var and, when present, weight/bias of size [C]) into the aten.convolution (not
/// transposed; any groups, dilation, 1-D or 2-D) or rank-2 aten.linear producing its input, when
/// that producer has a constant weight (and constant or absent bias) and its output is read by the
/// batch norm alone. The producer then gets new constants (PyTorch torch/nn/utils/fusion.py
/// fuse_conv_bn_weights, computed in double): scale[o] = gamma[o] / sqrt(var[o] + eps),
/// w'[o, ...] = w[o, ...] * scale[o], b'[o] = (b[o] - mean[o]) * scale[o] + beta[o] (gamma = 1,
/// beta = 0, b = 0 when absent), writes the batch norm's output and the batch norm is removed.
/// Returns the number of batch norms folded.
Result<size_t> fold_batch_norm(Graph& graph);

/// Folds multiplications and additions by float32 one-element constants into an adjacent
/// aten.convolution (not transposed) or aten.linear with a constant float32 weight and a constant
/// or absent bias, computed in double:
///   after it:  (conv(x, w) + b) * s + t = conv(x, w * s) + (b * s + t)   (a mul and/or an add,
///              each intermediate read only by the next node and not a method output; the result
///              keeps the convolution's type). This is the "learnable affine block" of PP-LCNetV3
///              (PP-OCRv4) after batch-norm folding;
///   before it: conv(x * k, w) + b = conv(x, w * k) + b   (the mul's result read only by the
///              convolution / linear, as its input; zero padding stays zero), e.g. the 1 / 1.702
///              that rewrite_quick_gelu leaves in front of a CLIP MLP's second linear.
/// Only a bias of shape [out_features] (or none) is rewritten after a linear (F.linear also takes
/// biases that broadcast). Scales outside [1e-8, 1e8] in magnitude are not folded (the partial
/// sums could overflow or the weights underflow where eager's would not). Returns the number of
/// mul/add groups folded.
Result<size_t> fold_scalar_affine(Graph& graph);

/// Rewrites quick-GELU, m = x * sigmoid(c * x) (CLIP's activation, c = 1.702; either operand
/// order of both muls), as m = silu(c * x) * (1 / c), which is the same function (silu(y) =
/// y * sigmoid(y), PyTorch Activation.cpp): the sigmoid node becomes aten.silu and the outer mul
/// multiplies by the float32 constant 1 / c. Conditions: c a finite float32 one-element constant
/// with 1e-3 <= |c| <= 1e3, x float32 of m's type, sigmoid(c * x) and c * x read only by the next
/// step (not method outputs). The one difference from eager: where c * x overflows float32
/// (|x| > FLT_MAX / |c|, 2.0e38 for c = 1.702), eager's sigmoid(inf) = 1 returns x while the
/// rewrite returns +-inf or NaN; the bound on |c| keeps that to |x| > 3.4e35. Afterwards x is read only by c * x, so fold_scalar_affine can fold
/// c into a linear / convolution producing x and 1 / c into one consuming m, and the runtime can
/// fuse the silu into the producer's stores: one GEMM with an activation instead of three
/// elementwise passes. Returns the number of rewrites.
Result<size_t> rewrite_quick_gelu(Graph& graph);

/// Rewrites the RMS norm that Hugging Face models write out (LlamaRMSNorm, Qwen3RMSNorm,
/// Gemma3RMSNorm after constant folding of 1 + weight):
///   w * (x * rsqrt(mean(x^2 | pow(x, 2), dim=-1, keepdim=True) + eps))   (either operand order)
/// as aten.rms_norm(x, w; normalized_shape=[D], eps) (w a float32 constant [D], or absent when the
/// pattern ends at the inner product), so that the cpu kernels run one pass per row instead of
/// five elementwise / reduction nodes. Each intermediate must be read only by the next node of the
/// pattern; the nodes left unread are removed by dead-code elimination. Float32 only. Returns the
/// number of rewrites. Same function up to rounding: the kernel computes x / sqrt(mean + eps) * w
/// (src/kernels/cpu/norm.cpp), eager x * rsqrt(mean + eps) * w.
Result<size_t> rewrite_rms_norm(Graph& graph);

/// Recognizes hardswish written out elementwise, as ONNX exporters (Paddle2ONNX's PP-OCR models)
/// and some PyTorch code write it: d = mul(x, clamp(add(x, 3), 0, 6)) / 6, with the mul operands in
/// either order, hardtanh(0, 6) for the clamp, the constant 3 on either side of the add (alpha 1)
/// and mul by float32(1/6) for the division; the constants are float32 with one element, every
/// intermediate is read only by the next node (not a method output) and d has x's float32 type.
/// The four nodes become d = aten.hardswish(x) (PyTorch Activation.cpp: x * min(max(x + 3, 0), 6)
/// / 6, the same arithmetic), which a convolution producing x can fuse into its stores. Returns the
/// number of rewrites.
Result<size_t> fuse_hardswish(Graph& graph);

/// Weight-only quantization pass (src/compiler/quantize.cpp). Replaces, when their weight is a
/// float32 constant and neither the node's debug_name nor the weight's name matches an exclude
/// pattern: aten.linear(x, w [N, K], b?) and aten.mm(x [M, K], w [K, N]) and aten.addmm(b [N], x,
/// w [K, N]) (alpha = beta = 1) by kiln.weight_quantized_linear; aten.convolution (2-D, not
/// transposed, depthwise included) by kiln.weight_quantized_convolution; with options.embeddings,
/// aten.embedding(w [V, D], indices) by kiln.weight_quantized_embedding, its table quantized row by row as a linear weight
/// [N = V, K = D] is. A constant read by several such nodes is quantized once: a tied embedding and
/// output projection (one constant in the exported graph) share one packed table. Quantizer (computed in
/// double, the scale rounded to scale_dtype before the values are rounded against it):
///   8-bit: per output row, s = max|w| / 127, q = clamp(round(w / s), -127, 127);
///   4-bit symmetric: per group, s = max|w| / 7, u = clamp(round(w / s) + 8, 0, 15);
///   4-bit asymmetric: per group, s = (max - min) / 15, z = min + 8 s,
///                     u = clamp(round((w - z) / s) + 8, 0, 15)   (all-equal groups: s = 0, z = w).
/// Returns the number of nodes rewritten; InvalidArgument for bad options.
Result<size_t> quantize_weights(Graph& graph, const QuantizeOptions& options);

/// Quantizes one float32 matrix w [rows, k] as quantize_weights does (for tests and tools):
/// fills the packed weight (rows * row_bytes bytes), scales and zeros (rows * G values of
/// options.scale_dtype, raw bytes; zeros empty when symmetric). InvalidArgument for bad options.
Error quantize_matrix(const float* w, int64_t rows, int64_t k, const QuantizeOptions& options,
                      std::vector<uint8_t>& packed, std::vector<uint8_t>& scales, std::vector<uint8_t>& zeros);

/// The partitioner (src/compiler/partitioner.cpp): for each backend in order, asks its
/// support() for every node not yet delegated, grows maximal connected sets of supported nodes
/// whose contraction keeps the graph acyclic, lowers each with the backend and replaces it by
/// one delegate node (Node::delegate). Errors: NotFound (backend not compiled in), the
/// backend's lowering error.
/// `compute_dtype` is handed to the backends' lower() (Subgraph::compute_dtype).
Result<DelegationReport> partition(Graph& graph, const std::vector<std::string>& backends,
                                   DType compute_dtype = DType::Float32);

/// One value's place in the arena.
struct PlannedValue {
  ValueId value;
  uint64_t offset;
  uint64_t nbytes;
  int64_t first_use;  ///< index of the defining node (-1 for method inputs)
  int64_t last_use;   ///< index of the last reading node (nodes.size() for outputs)
};

/// Lifetime-aware best-fit plan (greedy by size, TFLite-style) of every non-constant value.
struct MemoryPlan {
  std::vector<PlannedValue> values;
  uint64_t arena_bytes = 0;
  uint64_t total_bytes = 0;  ///< sum of sizes, no reuse
};
/// Plans all inputs and node outputs; offsets aligned to 64 bytes. Values of a state
/// (Value::state >= 0) are not planned: they are the session's bytes. Values with symbolic sizes
/// are planned at their upper bound.
MemoryPlan plan_memory(const Graph& graph);

/// Writes state updates in place where it is safe: when a state's update is the output of an
/// aten.index_put / aten.slice_scatter kernel call (updates_state_in_place) whose `self` is the state's
/// value, nothing after that call reads the state's value, and the update is not a method output,
/// the update becomes a value of the state (Value::state): the kernel writes into the session's
/// bytes (only the updated slices: work proportional to the update, not the state) and no copy
/// happens at the end of the call. Other updates are copied into the state after the last
/// instruction. Returns the number of updates made in place.
size_t plan_state_updates(Graph& graph);

/// True when `node` (of `graph`) has a symbolic attribute or reads or writes a value with symbolic
/// sizes: what a delegate whose Backend::symbolic_sizes_reason() is not empty declines. (Inline:
/// the backends' compile half, in the runtime library, uses it too.)
inline bool has_symbolic_sizes(const Graph& graph, const Node& node) {
  if (!node.sym_attrs.empty()) return true;
  for (ValueId v : node.inputs) {
    if (v != kNoValue && graph.value(v).is_dynamic()) return true;
  }
  for (ValueId v : node.outputs) {
    if (graph.value(v).is_dynamic()) return true;
  }
  return false;
}

}  // namespace kiln

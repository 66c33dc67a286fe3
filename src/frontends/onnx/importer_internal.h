// Internals of the ONNX importer shared by importer.cpp (model/tensor reading, graph walk) and
// ops.cpp (one converter per ONNX op type).
#pragma once

#define ONNX_ML 1
#define ONNX_NAMESPACE onnx
#include <onnx/onnx_pb.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/onnx.h"

namespace kiln::onnx::detail {

/// Kiln dtype of an ONNX TensorProto.DataType; NotSupported naming the type otherwise.
Result<DType> kiln_dtype(int onnx_type);
/// "FLOAT", "DOUBLE", ... for messages.
std::string onnx_type_name(int onnx_type);

/// A tensor read from a TensorProto (initializer, Constant, attribute): validated sizes and
/// exactly type.nbytes() bytes.
struct HostTensor {
  TensorType type;
  std::vector<uint8_t> bytes;
};
/// Reads and validates a TensorProto; external data is read below `base_dir`.
Result<HostTensor> read_tensor(const ::onnx::TensorProto& t, const std::string& base_dir, const std::string& what);

/// The importer's state: the graph being built and the ONNX name -> Kiln value map.
struct Importer {
  Graph graph;
  std::map<std::string, ValueId> names;
  std::string base_dir;
  int64_t opset = 0;
  size_t folded = 0;
  std::vector<std::string> notes;
  double max_constant_bytes = double(uint64_t{1} << 30);  ///< ImportOptions::max_constant_bytes
  int depth = 0;               ///< If / Loop subgraphs being inlined
  size_t converted_nodes = 0;  ///< ONNX nodes converted, unrolled Loop bodies included
};

/// One ONNX node being converted. Converters read inputs and attributes through it (every
/// attribute read is marked used; the importer refuses nodes with unread attributes) and emit
/// Kiln nodes with emit(), which evaluates nodes whose inputs are all constants right away
/// (so shape subgraphs become constants the next node can read).
class NodeCtx {
 public:
  NodeCtx(Importer& im, const ::onnx::NodeProto& node, size_t index) : im(im), node(node), index(index) {}

  Importer& im;
  const ::onnx::NodeProto& node;
  size_t index;
  std::set<std::string> used_attrs;

  int64_t opset() const { return im.opset; }
  /// "node 'conv1' (#3, Conv)".
  std::string where() const;
  Error unsupported(const std::string& msg) const;  ///< NotSupported: "<where>: <msg>"
  Error invalid(const std::string& msg) const;      ///< InvalidProgram: "<where>: <msg>"

  // ---- inputs ----
  int num_inputs() const { return node.input_size(); }
  /// True when input i is given (present and not the empty name).
  bool has_input(int i) const { return i < node.input_size() && !node.input(i).empty(); }
  /// Input i (InvalidProgram when absent).
  Result<ValueId> input(int i) const;
  /// Input i or kNoValue when absent.
  Result<ValueId> opt_input(int i) const;
  /// By value: emitting nodes grows the value list (references would dangle).
  TensorType type(ValueId v) const { return im.graph.value(v).type; }
  int64_t rank(ValueId v) const { return type(v).dim(); }
  bool is_const(ValueId v) const { return v != kNoValue && im.graph.value(v).constant != nullptr; }
  /// Elements of a constant integer (int64/int32/int8/uint8/bool) tensor; NotSupported when
  /// the value is not a constant after folding (names `what`).
  Result<std::vector<int64_t>> const_ints(ValueId v, const std::string& what) const;
  /// Elements of a constant tensor of any numeric dtype as doubles.
  Result<std::vector<double>> const_floats(ValueId v, const std::string& what) const;

  // ---- attributes ----
  /// The attribute or nullptr; marks it used.
  const ::onnx::AttributeProto* attr(const std::string& name);
  Result<int64_t> attr_int(const std::string& name, int64_t fallback);
  Result<double> attr_float(const std::string& name, double fallback);
  Result<std::string> attr_string(const std::string& name, const std::string& fallback);
  Result<std::vector<int64_t>> attr_ints(const std::string& name, const std::vector<int64_t>& fallback);
  Result<std::vector<double>> attr_floats(const std::string& name, const std::vector<double>& fallback);
  bool has_attr(const std::string& name) const;
  /// Marks an attribute as read without using it (for attributes that do not change inference
  /// results, e.g. BatchNormalization's momentum); the caller documents why.
  void ignore_attr(const std::string& name) { used_attrs.insert(name); }

  // ---- emitting ----
  /// Adds a Kiln node with one output (errors name this ONNX node); folds it when all its
  /// inputs are constants and the portable kernel runs it.
  Result<ValueId> emit(const std::string& op, std::vector<ValueId> inputs, const Attributes& attrs = {});
  Result<ValueId> constant(TensorType type, std::vector<uint8_t> bytes);
  /// NotSupported unless a constant of `elements` x `element_bytes` bytes stays within
  /// ImportOptions::max_constant_bytes (checked before allocating; sizes come from untrusted files).
  Error check_constant_size(double elements, double element_bytes, const std::string& what) const;
  /// A 0-d constant of `dtype` holding `v` (converted as static_cast / float16 rounding);
  /// NotSupported when an integer dtype cannot hold v truncated (or v is NaN).
  Result<ValueId> scalar(DType dtype, double v);
  Result<ValueId> int64_vector(const std::vector<int64_t>& v);
  /// Binds output i of the ONNX node to `v` (ignored when the output name is empty).
  Error set_output(int i, ValueId v);
  int num_outputs() const { return node.output_size(); }
  bool has_output(int i) const { return i < node.output_size() && !node.output(i).empty(); }
};

using Converter = Error (*)(NodeCtx&);
struct OpConverter {
  Converter fn;
  int64_t min_opset;  ///< models importing an older default opset are refused for this op
};
/// ONNX op type -> converter (default domain).
const std::map<std::string, OpConverter>& converters();

}  // namespace kiln::onnx::detail

// Graph construction: every node is typed by the op registry as it is added.
#include "ir/op_registry.h"
#include "kiln/compiler.h"
#include "runtime/file_format.h"

namespace kiln {

ValueId Graph::add_input(std::string name, TensorType type) {
  values_.push_back(Value{std::move(type), std::move(name), nullptr, true});
  const auto id = static_cast<ValueId>(values_.size() - 1);
  inputs_.push_back(id);
  return id;
}

Result<ValueId> Graph::add_constant(std::string name, TensorType type, ConstantBytes bytes) {
  if (!bytes || bytes->size() != type.nbytes()) {
    return Error(ErrorCode::InvalidArgument,
                 "constant '" + name + "' of type " + type.to_string() + " needs " + std::to_string(type.nbytes()) +
                     " bytes, got " + std::to_string(bytes ? bytes->size() : 0));
  }
  values_.push_back(Value{std::move(type), std::move(name), std::move(bytes), false});
  return static_cast<ValueId>(values_.size() - 1);
}

Result<ValueId> Graph::add_constant(std::string name, TensorType type, std::vector<uint8_t> bytes) {
  return add_constant(std::move(name), std::move(type), std::make_shared<const std::vector<uint8_t>>(std::move(bytes)));
}

Result<std::vector<ValueId>> Graph::add_node(const std::string& op, std::vector<ValueId> inputs,
                                             const Attributes& attrs, std::string debug_name) {
  const std::string where = debug_name.empty() ? "" : " (at " + debug_name + ")";
  const OpDef* def = OpRegistry::get().find(op);
  if (def == nullptr) {
    return Error(ErrorCode::OperatorMissing, "op '" + op + "' is not in Kiln's op set" + where);
  }
  auto norm = def->normalize_attributes(attrs);
  if (!norm.ok()) return Error(norm.error().code(), norm.error().message() + where);
  std::vector<const TensorType*> types;
  for (ValueId id : inputs) {
    if (id == kNoValue) {
      types.push_back(nullptr);
    } else if (id < 0 || static_cast<size_t>(id) >= values_.size()) {
      return Error(ErrorCode::InvalidArgument, op + ": input value id " + std::to_string(id) + " out of range" + where);
    } else {
      types.push_back(&values_[static_cast<size_t>(id)].type);
    }
  }
  auto out_types = def->infer_types(types, norm.value());
  if (!out_types.ok()) return Error(out_types.error().code(), out_types.error().message() + where);
  // No value beyond what a program file may hold (file_format.h): then every numel of the graph
  // fits in int64, whatever sizes the attributes asked for (an ONNX Tile's repeats, ...).
  for (const TensorType& t : out_types.value()) {
    bool fits = t.dim() <= kMaxTensorRank;
    uint64_t volume = dtype_size(t.dtype);
    for (int64_t d : t.sizes) {
      const uint64_t f = d <= 0 ? 1 : static_cast<uint64_t>(d);
      fits = fits && volume <= kMaxTensorBytes / f;
      if (fits) volume *= f;
    }
    if (!fits) {
      return Error(ErrorCode::InvalidArgument, op + ": output " + t.to_string() +
                                                   " exceeds the program format's limits (rank <= 16; at most 2^46 "
                                                   "bytes, zero sizes counted as 1)" + where);
    }
  }
  Node node{op, std::move(inputs), {}, std::move(norm.value()), std::move(debug_name)};
  for (auto& t : out_types.value()) {
    values_.push_back(Value{std::move(t), {}, nullptr, false});
    node.outputs.push_back(static_cast<ValueId>(values_.size() - 1));
  }
  nodes_.push_back(std::move(node));
  return nodes_.back().outputs;
}

Error Graph::set_outputs(std::vector<ValueId> outputs) {
  for (ValueId id : outputs) {
    if (id < 0 || static_cast<size_t>(id) >= values_.size()) {
      return Error(ErrorCode::InvalidArgument, "output value id " + std::to_string(id) + " out of range");
    }
  }
  outputs_ = std::move(outputs);
  return {};
}

}  // namespace kiln

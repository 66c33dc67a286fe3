// Graph passes: dead-code elimination and constant folding.
#include <vector>

#include "kernels/kernel.h"
#include "kiln/compiler.h"

namespace kiln {

size_t eliminate_dead_code(Graph& graph) {
  std::vector<bool> live(graph.values().size(), false);
  for (ValueId id : graph.outputs()) live[static_cast<size_t>(id)] = true;
  auto& nodes = graph.mutable_nodes();
  std::vector<bool> keep(nodes.size(), false);
  for (size_t i = nodes.size(); i-- > 0;) {
    for (ValueId o : nodes[i].outputs) keep[i] = keep[i] || live[static_cast<size_t>(o)];
    if (!keep[i]) continue;
    for (ValueId in : nodes[i].inputs) {
      if (in != kNoValue) live[static_cast<size_t>(in)] = true;
    }
  }
  std::vector<Node> kept;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (keep[i]) kept.push_back(std::move(nodes[i]));
  }
  const size_t removed = nodes.size() - kept.size();
  nodes = std::move(kept);
  return removed;
}

Result<size_t> fold_constants(Graph& graph) {
  auto& values = graph.mutable_values();
  auto& nodes = graph.mutable_nodes();
  std::vector<Node> kept;
  size_t folded = 0;
  for (Node& node : nodes) {
    bool all_const = !node.inputs.empty();
    for (ValueId in : node.inputs) {
      if (in != kNoValue && !values[static_cast<size_t>(in)].constant) all_const = false;
    }
    KernelFn fn = all_const ? KernelRegistry::get().find(node.op) : nullptr;
    if (fn == nullptr) {
      kept.push_back(std::move(node));
      continue;
    }
    std::vector<Tensor> in_t, out_t;
    std::vector<std::vector<uint8_t>> out_bytes;
    in_t.reserve(node.inputs.size());
    for (ValueId in : node.inputs) {
      if (in == kNoValue) { in_t.push_back(Tensor{}); continue; }
      const Value& v = values[static_cast<size_t>(in)];
      in_t.push_back(Tensor{v.type.dtype, v.type.sizes, const_cast<uint8_t*>(v.constant->data())});
    }
    out_bytes.reserve(node.outputs.size());
    for (ValueId o : node.outputs) {
      const Value& v = values[static_cast<size_t>(o)];
      out_bytes.emplace_back(v.type.nbytes());
      out_t.push_back(Tensor{v.type.dtype, v.type.sizes, out_bytes.back().data()});
    }
    std::vector<const Tensor*> in_p;
    for (size_t i = 0; i < in_t.size(); ++i) in_p.push_back(node.inputs[i] == kNoValue ? nullptr : &in_t[i]);
    std::vector<Tensor*> out_p;
    for (Tensor& t : out_t) out_p.push_back(&t);
    Error err = fn(KernelArgs{in_p, out_p, node.attrs, nullptr});
    if (!err.ok()) {
      if (err.code() == ErrorCode::NotSupported) {  // leave it for the runtime to report
        kept.push_back(std::move(node));
        continue;
      }
      return Error(err.code(), "constant folding " + node.op + ": " + err.message());
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      values[static_cast<size_t>(node.outputs[i])].constant =
          std::make_shared<const std::vector<uint8_t>>(std::move(out_bytes[i]));
    }
    ++folded;
  }
  nodes = std::move(kept);
  return folded;
}

}  // namespace kiln

// Graph passes: dead-code elimination, constant folding, conv/linear + batch-norm folding,
// hardswish recognition.
#include <cmath>
#include <cstring>
#include <vector>

#include "ir/op_registry.h"
#include "kernels/kernel.h"
#include "kiln/compiler.h"

namespace kiln {

namespace {

/// Who reads and who writes each value of a graph, for the fusion/folding passes.
struct Uses {
  std::vector<int> readers;      ///< per value: node inputs reading it, plus 1 for a graph output
  std::vector<int> producer;     ///< per value: index of the node writing it, or -1
  std::vector<int> last_reader;  ///< per value: index of the last node reading it, or -1
  explicit Uses(const Graph& graph)
      : readers(graph.values().size(), 0), producer(graph.values().size(), -1), last_reader(graph.values().size(), -1) {
    const auto& nodes = graph.nodes();
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (ValueId in : nodes[i].inputs) {
        if (in == kNoValue) continue;
        ++readers[static_cast<size_t>(in)];
        last_reader[static_cast<size_t>(in)] = static_cast<int>(i);
      }
      for (ValueId o : nodes[i].outputs) producer[static_cast<size_t>(o)] = static_cast<int>(i);
    }
    for (ValueId o : graph.outputs()) ++readers[static_cast<size_t>(o)];
    for (const StateDef& s : graph.states()) {
      if (s.update != kNoValue) ++readers[static_cast<size_t>(s.update)];  // read by the write-back
    }
  }
};

/// The index of the node producing `v` when it is `op`, not delegated, with one output that exactly
/// one node reads (the pattern rewrites may then replace it); -1 otherwise.
int single_use_producer_of(const Graph& graph, const Uses& uses, ValueId v, const char* op) {
  if (v == kNoValue || uses.readers[static_cast<size_t>(v)] != 1) return -1;
  const int pi = uses.producer[static_cast<size_t>(v)];
  if (pi < 0) return -1;
  const Node& n = graph.nodes()[static_cast<size_t>(pi)];
  return n.op == op && n.outputs.size() == 1 && !n.delegate ? pi : -1;
}

}  // namespace

size_t eliminate_dead_code(Graph& graph) {
  std::vector<bool> live(graph.values().size(), false);
  for (ValueId id : graph.outputs()) live[static_cast<size_t>(id)] = true;
  for (const StateDef& s : graph.states()) {
    if (s.update != kNoValue) live[static_cast<size_t>(s.update)] = true;  // written back after the call
  }
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
    bool all_const = !node.inputs.empty() && node.sym_attrs.empty();  // symbolic attributes: known at run time only
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

namespace {

// The float32 data of a constant value, or nullptr when `id` is absent / not a float32 constant.
const float* const_f32(const Graph& g, ValueId id) {
  if (id == kNoValue) return nullptr;
  const Value& v = g.value(id);
  if (!v.constant || v.type.dtype != DType::Float32) return nullptr;
  return reinterpret_cast<const float*>(v.constant->data());
}

// Whether `bn` (an aten.native_batch_norm node) can be folded into a producer whose output has
// `channels` channels on dim 1: inference mode, constant float32 running statistics (and
// weight/bias when present), each of size [channels].
bool foldable_batch_norm(const Graph& g, const Node& bn, int64_t channels) {
  if (bn.attrs.get_bool("training")) return false;
  if (bn.inputs.size() != 5 || bn.outputs.size() != 1) return false;
  for (size_t i = 1; i < 5; ++i) {
    const ValueId id = bn.inputs[i];
    if (id == kNoValue) {
      if (i >= 3) return false;  // running statistics are required in inference
      continue;
    }
    if (const_f32(g, id) == nullptr) return false;
    if (g.value(id).type.sizes != std::vector<int64_t>{channels}) return false;
  }
  return true;
}

}  // namespace

Result<size_t> fold_batch_norm(Graph& graph) {
  const auto& nodes = graph.nodes();
  Uses uses(graph);  // graph outputs count as a reader that is not a node
  const std::vector<int>& readers = uses.readers;
  std::vector<int>& producer = uses.producer;

  std::vector<bool> drop(nodes.size(), false);
  size_t folded = 0;
  for (size_t bi = 0; bi < nodes.size(); ++bi) {
    const Node& bn = graph.nodes()[bi];
    if (bn.op != "aten.native_batch_norm" || bn.inputs.empty() || bn.inputs[0] == kNoValue) continue;
    const ValueId y = bn.inputs[0];
    const int pi = producer[static_cast<size_t>(y)];
    // The producer's output must be read by this batch norm alone (not by another node, not
    // returned), else the unnormalized value would be lost.
    if (pi < 0 || readers[static_cast<size_t>(y)] != 1 || drop[static_cast<size_t>(pi)]) continue;
    const Node& prod = graph.nodes()[static_cast<size_t>(pi)];
    if (prod.outputs.size() != 1 || prod.delegate) continue;
    const TensorType& yt = graph.value(y).type;
    if (yt.dtype != DType::Float32 || yt.dim() < 2) continue;
    const bool conv = prod.op == "aten.convolution";
    // aten.linear's output features are its last dim: that is batch norm's channel dim (1) only
    // for rank-2 outputs.
    const bool linear = prod.op == "aten.linear" && yt.dim() == 2;
    if (!conv && !linear) continue;
    // Transposed convolution keeps output channels on weight dim 1 (and per group): not folded.
    if (conv && prod.attrs.get_bool("transposed")) continue;
    if (prod.inputs.size() != 3) continue;
    const float* w = const_f32(graph, prod.inputs[1]);
    if (w == nullptr) continue;
    const ValueId bias_id = prod.inputs[2];
    const float* b = const_f32(graph, bias_id);
    if (bias_id != kNoValue && b == nullptr) continue;
    const TensorType wt = graph.value(prod.inputs[1]).type;
    const int64_t channels = yt.sizes[1];
    if (wt.dim() < 2 || wt.sizes[0] != channels) continue;
    if (b != nullptr && graph.value(bias_id).type.sizes != std::vector<int64_t>{channels}) continue;
    if (!foldable_batch_norm(graph, bn, channels)) continue;

    const float* gamma = const_f32(graph, bn.inputs[1]);
    const float* beta = const_f32(graph, bn.inputs[2]);
    const float* mean = const_f32(graph, bn.inputs[3]);
    const float* var = const_f32(graph, bn.inputs[4]);
    const double eps = bn.attrs.get_float("eps", 1e-5);
    // PyTorch torch/nn/utils/fusion.py fuse_conv_bn_weights / fuse_linear_bn_weights:
    //   scale = gamma / sqrt(var + eps);  w' = w * scale[o];  b' = (b - mean) * scale + beta.
    const size_t per_out = static_cast<size_t>(wt.numel() / channels);
    std::vector<uint8_t> wbytes(wt.nbytes()), bbytes(static_cast<size_t>(channels) * sizeof(float));
    auto* nw = reinterpret_cast<float*>(wbytes.data());
    auto* nb = reinterpret_cast<float*>(bbytes.data());
    for (int64_t o = 0; o < channels; ++o) {
      const double scale = (gamma ? static_cast<double>(gamma[o]) : 1.0) / std::sqrt(static_cast<double>(var[o]) + eps);
      for (size_t k = 0; k < per_out; ++k) {
        const size_t idx = static_cast<size_t>(o) * per_out + k;
        nw[idx] = static_cast<float>(static_cast<double>(w[idx]) * scale);
      }
      const double b0 = b ? static_cast<double>(b[o]) : 0.0;
      nb[o] = static_cast<float>((b0 - static_cast<double>(mean[o])) * scale + (beta ? static_cast<double>(beta[o]) : 0.0));
    }
    const std::string base = prod.debug_name.empty() ? prod.op : prod.debug_name;
    auto new_w = graph.add_constant(base + ".weight(bn folded)", wt, std::move(wbytes));
    if (!new_w.ok()) return new_w.error();
    auto new_b = graph.add_constant(base + ".bias(bn folded)", TensorType{DType::Float32, {channels}}, std::move(bbytes));
    if (!new_b.ok()) return new_b.error();
    Node& p = graph.mutable_nodes()[static_cast<size_t>(pi)];
    p.inputs[1] = new_w.value();
    p.inputs[2] = new_b.value();
    p.outputs[0] = graph.nodes()[bi].outputs[0];  // same type as y: batch norm keeps the shape
    producer[static_cast<size_t>(p.outputs[0])] = pi;
    drop[bi] = true;
    ++folded;
  }
  if (folded > 0) {
    auto& ns = graph.mutable_nodes();
    std::vector<Node> kept;
    kept.reserve(ns.size() - folded);
    for (size_t i = 0; i < ns.size(); ++i) {
      if (!drop[i]) kept.push_back(std::move(ns[i]));
    }
    ns = std::move(kept);
  }
  return folded;
}

namespace {

/// The value of a float32 constant with one element, or NaN.
double const_scalar(const Graph& g, ValueId id) {
  const float* p = const_f32(g, id);
  if (p == nullptr || g.value(id).type.numel() != 1) return std::nan("");
  return *p;
}

}  // namespace

Result<size_t> fold_scalar_affine(Graph& graph) {
  const auto& nodes = graph.nodes();
  const Uses uses(graph);
  const std::vector<int>& readers = uses.readers;
  const std::vector<int>& reader_node = uses.last_reader;  // the only reader where readers == 1
  // The node reading `v` when it is v's only reader (v not an output), and the scalar it combines
  // v with (mul: any scalar; add: alpha 1), else -1.
  auto scalar_step = [&](ValueId v, double* scalar) -> int {
    if (readers[static_cast<size_t>(v)] != 1) return -1;
    const int ri = reader_node[static_cast<size_t>(v)];
    if (ri < 0) return -1;
    const Node& n = nodes[static_cast<size_t>(ri)];
    if ((n.op != "aten.mul" && n.op != "aten.add") || n.inputs.size() != 2 || n.outputs.size() != 1 || n.delegate) return -1;
    if (n.op == "aten.add" && n.attrs.get_float("alpha", 1.0) != 1.0) return -1;
    const ValueId other = n.inputs[0] == v ? n.inputs[1] : n.inputs[0];
    if (n.inputs[0] != v && n.inputs[1] != v) return -1;
    *scalar = const_scalar(graph, other);
    if (std::isnan(*scalar) || !std::isfinite(*scalar)) return -1;
    if (!(graph.value(n.outputs[0]).type == graph.value(v).type)) return -1;  // the scalar must not broadcast up
    return ri;
  };
  // Scales folded into a weight: well inside float32's range (see below).
  auto foldable_scale = [](double s) { return std::fabs(s) <= 1e8 && std::fabs(s) >= 1e-8; };
  // The weight of a convolution (not transposed) or linear `n` with a constant float32 weight and
  // a constant or absent bias, else nullptr; `channels` = its output features (weight dim 0).
  auto weighted = [&](const Node& n, int64_t* channels) -> const float* {
    const bool conv = n.op == "aten.convolution" && !n.attrs.get_bool("transposed");
    if ((!conv && n.op != "aten.linear") || n.delegate || n.outputs.size() != 1 || n.inputs.size() != 3) return nullptr;
    const float* w = const_f32(graph, n.inputs[1]);
    if (w == nullptr || (n.inputs[2] != kNoValue && const_f32(graph, n.inputs[2]) == nullptr)) return nullptr;
    const TensorType& yt = graph.value(n.outputs[0]).type;
    const TensorType& wt = graph.value(n.inputs[1]).type;
    if (yt.dtype != DType::Float32 || yt.dim() < (conv ? 2 : 1) || wt.dim() < 2) return nullptr;
    if (wt.sizes[0] != (conv ? yt.sizes[1] : yt.sizes.back())) return nullptr;
    *channels = wt.sizes[0];
    return w;
  };
  // A new constant: the weight of `n` times `scale`, computed in double.
  auto scaled_weight = [&](const Node& n, double scale) -> Result<ValueId> {
    const TensorType wt = graph.value(n.inputs[1]).type;
    const float* w = const_f32(graph, n.inputs[1]);
    std::vector<uint8_t> wbytes(wt.nbytes());
    auto* nw = reinterpret_cast<float*>(wbytes.data());
    for (size_t idx = 0; idx < static_cast<size_t>(wt.numel()); ++idx) {
      nw[idx] = static_cast<float>(static_cast<double>(w[idx]) * scale);
    }
    const std::string base = n.debug_name.empty() ? n.op : n.debug_name;
    return graph.add_constant(base + ".weight(affine folded)", wt, std::move(wbytes));
  };
  std::vector<bool> drop(nodes.size(), false);
  size_t folded = 0;
  // Input side: mul(s, k) read only by a convolution / linear (as its input) is folded into its
  // weight: conv(s * k, w) = conv(s, w * k) (zero padding stays zero), likewise linear.
  for (size_t mi = 0; mi < nodes.size(); ++mi) {
    const Node& m = nodes[mi];
    if (m.op != "aten.mul" || m.delegate || m.inputs.size() != 2 || m.outputs.size() != 1) continue;
    const ValueId out = m.outputs[0];
    if (readers[static_cast<size_t>(out)] != 1 || reader_node[static_cast<size_t>(out)] < 0) continue;
    const auto li = static_cast<size_t>(reader_node[static_cast<size_t>(out)]);
    int64_t channels = 0;
    if (weighted(nodes[li], &channels) == nullptr || nodes[li].inputs[0] != out) continue;
    for (int side = 0; side < 2; ++side) {
      const ValueId s = m.inputs[static_cast<size_t>(side)];
      const double k = const_scalar(graph, m.inputs[static_cast<size_t>(1 - side)]);
      if (s == kNoValue || std::isnan(k) || !foldable_scale(k) || !(graph.value(s).type == graph.value(out).type)) {
        continue;
      }
      auto new_w = scaled_weight(nodes[li], k);
      if (!new_w.ok()) return new_w.error();
      Node& l = graph.mutable_nodes()[li];
      l.inputs[0] = s;
      l.inputs[1] = new_w.value();
      drop[mi] = true;
      ++folded;
      break;
    }
  }
  // Output side: conv / linear -> [mul(s)] -> [add(t)].
  for (size_t ci = 0; ci < nodes.size(); ++ci) {
    const Node& conv = nodes[ci];
    int64_t channels = 0;
    if (drop[ci] || weighted(conv, &channels) == nullptr) continue;
    const ValueId bias_id = conv.inputs[2];
    // The bias is rewritten per output feature: only one of shape [channels] (a linear's bias may
    // be any shape broadcasting to its output: [1], [rows, 1], [rows, out_f] are left alone).
    if (bias_id != kNoValue && graph.value(bias_id).type.sizes != std::vector<int64_t>{channels}) continue;
    const float* b = const_f32(graph, bias_id);
    // conv -> [mul(s)] -> [add(t)]: y * s + t, at least one step
    double scale = 1.0, shift = 0.0, v = 0.0;
    ValueId out = conv.outputs[0];
    std::vector<int> steps;
    int ri = scalar_step(out, &v);
    if (ri >= 0 && nodes[static_cast<size_t>(ri)].op == "aten.mul" && !drop[static_cast<size_t>(ri)]) {
      scale = v;
      steps.push_back(ri);
      out = nodes[static_cast<size_t>(ri)].outputs[0];
      ri = scalar_step(out, &v);
    }
    if (ri >= 0 && nodes[static_cast<size_t>(ri)].op == "aten.add" && !drop[static_cast<size_t>(ri)]) {
      shift = v;
      steps.push_back(ri);
      out = nodes[static_cast<size_t>(ri)].outputs[0];
    }
    if (steps.empty()) continue;
    // Folding moves the scale into every product of the convolution's sums: with an extreme
    // scale, partial sums that eager computes before scaling could overflow (or weights flush to
    // zero) after it. Only scales well inside float32's range are folded.
    if (!foldable_scale(scale) || std::fabs(shift) > 1e30) continue;
    std::vector<uint8_t> bbytes(static_cast<size_t>(channels) * sizeof(float));
    auto* nb = reinterpret_cast<float*>(bbytes.data());
    for (int64_t o = 0; o < channels; ++o) {
      nb[o] = static_cast<float>((b ? static_cast<double>(b[o]) : 0.0) * scale + shift);
    }
    const std::string base = conv.debug_name.empty() ? conv.op : conv.debug_name;
    auto new_w = scale == 1.0 ? Result<ValueId>(conv.inputs[1]) : scaled_weight(conv, scale);
    if (!new_w.ok()) return new_w.error();
    auto new_b = graph.add_constant(base + ".bias(affine folded)", TensorType{DType::Float32, {channels}}, std::move(bbytes));
    if (!new_b.ok()) return new_b.error();
    Node& c = graph.mutable_nodes()[ci];
    c.inputs[1] = new_w.value();
    c.inputs[2] = new_b.value();
    c.outputs[0] = out;
    for (int s : steps) drop[static_cast<size_t>(s)] = true;
    ++folded;
  }
  if (folded > 0) {
    auto& ns = graph.mutable_nodes();
    std::vector<Node> kept;
    for (size_t i = 0; i < ns.size(); ++i) {
      if (!drop[i]) kept.push_back(std::move(ns[i]));
    }
    ns = std::move(kept);
  }
  return folded;
}

Result<size_t> fuse_hardswish(Graph& graph) {
  const auto& nodes = graph.nodes();
  const Uses uses(graph);
  const std::vector<int>& readers = uses.readers;
  const std::vector<int>& producer = uses.producer;
  // The node producing `v` when `v` is read by exactly one node (its consumer) and is not an output.
  auto single_use_producer = [&](ValueId v, const char* op) -> const Node* {
    if (v == kNoValue || readers[static_cast<size_t>(v)] != 1) return nullptr;
    const int pi = producer[static_cast<size_t>(v)];
    if (pi < 0) return nullptr;
    const Node& n = nodes[static_cast<size_t>(pi)];
    return n.op == op && n.outputs.size() == 1 && !n.delegate ? &n : nullptr;
  };
  std::vector<bool> drop(nodes.size(), false);
  size_t fused = 0;
  for (size_t di = 0; di < nodes.size(); ++di) {
    const Node& d = nodes[di];
    // d = m / 6 or m * (1/6)
    if (d.outputs.size() != 1 || d.inputs.size() != 2 || d.delegate) continue;
    const bool is_div = d.op == "aten.div" && (!d.attrs.has("rounding_mode") || d.attrs.is_none("rounding_mode"));
    const bool is_mul = d.op == "aten.mul";
    if (!is_div && !is_mul) continue;
    if (is_div && const_scalar(graph, d.inputs[1]) != 6.0) continue;
    if (is_mul && const_scalar(graph, d.inputs[1]) != static_cast<double>(1.0f / 6.0f)) continue;
    const Node* m = single_use_producer(d.inputs[0], "aten.mul");
    if (m == nullptr || m->inputs.size() != 2) continue;
    // m = x * c or c * x, c = clamp(a, 0, 6) / hardtanh(a, 0, 6), a = x + 3 or 3 + x
    for (int side = 0; side < 2; ++side) {
      const ValueId x = m->inputs[static_cast<size_t>(1 - side)];
      const ValueId cv = m->inputs[static_cast<size_t>(side)];
      const Node* c = single_use_producer(cv, "aten.clamp");
      if (c != nullptr && (c->attrs.is_none("min") || c->attrs.is_none("max") || c->attrs.get_float("min", -1) != 0.0 ||
                           c->attrs.get_float("max", -1) != 6.0)) {
        c = nullptr;
      }
      if (c == nullptr) {
        c = single_use_producer(cv, "aten.hardtanh");
        if (c != nullptr && (c->attrs.get_float("min_val", -1) != 0.0 || c->attrs.get_float("max_val", -1) != 6.0)) c = nullptr;
      }
      if (c == nullptr || c->inputs.empty()) continue;
      const Node* a = single_use_producer(c->inputs[0], "aten.add");
      if (a == nullptr || a->inputs.size() != 2 || a->attrs.get_float("alpha", 1.0) != 1.0) continue;
      const bool x_first = a->inputs[0] == x && const_scalar(graph, a->inputs[1]) == 3.0;
      const bool x_second = a->inputs[1] == x && const_scalar(graph, a->inputs[0]) == 3.0;
      if (!x_first && !x_second) continue;
      if (x == kNoValue || !(graph.value(x).type == graph.value(d.outputs[0]).type) ||
          graph.value(x).type.dtype != DType::Float32) {
        continue;
      }
      const size_t ai = static_cast<size_t>(a - nodes.data()), ci = static_cast<size_t>(c - nodes.data()),
                   mi = static_cast<size_t>(m - nodes.data());
      if (drop[ai] || drop[ci] || drop[mi]) continue;
      drop[ai] = drop[ci] = drop[mi] = true;
      Node& h = graph.mutable_nodes()[di];
      h.op = "aten.hardswish";
      h.inputs = {x};
      h.attrs = Attributes();
      if (h.debug_name.empty()) h.debug_name = m->debug_name;
      ++fused;
      break;
    }
  }
  if (fused > 0) {
    auto& ns = graph.mutable_nodes();
    std::vector<Node> kept;
    kept.reserve(ns.size() - 3 * fused);
    for (size_t i = 0; i < ns.size(); ++i) {
      if (!drop[i]) kept.push_back(std::move(ns[i]));
    }
    ns = std::move(kept);
  }
  return fused;
}

Result<size_t> rewrite_quick_gelu(Graph& graph) {
  const auto& nodes = graph.nodes();
  const Uses uses(graph);
  auto single_use_producer = [&](ValueId v, const char* op) { return single_use_producer_of(graph, uses, v, op); };
  size_t rewritten = 0;
  for (size_t mi = 0; mi < nodes.size(); ++mi) {
    const Node& m = nodes[mi];
    if (m.op != "aten.mul" || m.delegate || m.inputs.size() != 2 || m.outputs.size() != 1) continue;
    const TensorType& mt = graph.value(m.outputs[0]).type;
    if (mt.dtype != DType::Float32) continue;
    for (int side = 0; side < 2; ++side) {
      const ValueId x = m.inputs[static_cast<size_t>(1 - side)];
      const int si = single_use_producer(m.inputs[static_cast<size_t>(side)], "aten.sigmoid");
      if (x == kNoValue || si < 0 || !(graph.value(x).type == mt)) continue;
      const Node& s = nodes[static_cast<size_t>(si)];
      if (s.inputs.size() != 1 || !(graph.value(s.outputs[0]).type == mt)) continue;
      const int ai = single_use_producer(s.inputs[0], "aten.mul");
      if (ai < 0) continue;
      const Node& a = nodes[static_cast<size_t>(ai)];
      if (a.inputs.size() != 2 || !(graph.value(a.outputs[0]).type == mt)) continue;
      const ValueId cv = a.inputs[0] == x ? a.inputs[1] : (a.inputs[1] == x ? a.inputs[0] : kNoValue);
      const double c = cv == kNoValue ? std::nan("") : const_scalar(graph, cv);
      if (!std::isfinite(c) || std::fabs(c) < 1e-3 || std::fabs(c) > 1e3) continue;
      const float inv = static_cast<float>(1.0 / c);
      std::vector<uint8_t> bytes(sizeof(float));
      std::memcpy(bytes.data(), &inv, sizeof(float));
      auto k = graph.add_constant((m.debug_name.empty() ? std::string("quick_gelu") : m.debug_name) + ".inverse_scale",
                                  graph.value(cv).type, std::move(bytes));
      if (!k.ok()) return k.error();
      auto& ns = graph.mutable_nodes();
      ns[static_cast<size_t>(si)].op = "aten.silu";
      ns[static_cast<size_t>(si)].attrs = Attributes();
      ns[mi].inputs = {ns[static_cast<size_t>(si)].outputs[0], k.value()};
      ++rewritten;
      break;
    }
  }
  return rewritten;
}

}  // namespace kiln

namespace kiln {

size_t plan_state_updates(Graph& graph) {
  auto& values = graph.mutable_values();
  const auto& nodes = graph.nodes();
  size_t in_place = 0;
  for (size_t si = 0; si < graph.states().size(); ++si) {
    const StateDef& st = graph.states()[si];
    if (st.update == kNoValue || st.update == st.value) continue;
    // The node writing the update.
    size_t writer = nodes.size();
    for (size_t i = 0; i < nodes.size() && writer == nodes.size(); ++i) {
      for (ValueId o : nodes[i].outputs) {
        if (o == st.update) writer = i;
      }
    }
    if (writer == nodes.size()) continue;
    const Node& n = nodes[writer];
    if (!updates_state_in_place(n.op) || n.delegate || n.outputs.size() != 1 || n.inputs.empty() || n.inputs[0] != st.value) continue;
    bool read_later = false;  // the old value must be dead once the new one is written over it
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (size_t k = 0; k < nodes[i].inputs.size(); ++k) {
        if (nodes[i].inputs[k] != st.value) continue;
        if (i > writer || (i == writer && k != 0)) read_later = true;
      }
    }
    bool is_output = false;
    for (ValueId o : graph.outputs()) is_output = is_output || o == st.update || o == st.value;
    if (read_later || is_output) continue;
    values[static_cast<size_t>(st.update)].state = static_cast<int32_t>(si);
    ++in_place;
  }
  return in_place;
}

}  // namespace kiln

namespace kiln {

Result<size_t> rewrite_rms_norm(Graph& graph) {
  const auto& nodes = graph.nodes();
  const Uses uses(graph);
  auto single_use_producer = [&](ValueId v, const char* op) { return single_use_producer_of(graph, uses, v, op); };
  // For p = mul(x, r) (either order) with r = rsqrt(add(mean(pow(x, 2) | mul(x, x), [-1], keepdim), eps)),
  // each intermediate read once: x and eps. Otherwise {kNoValue, NaN}.
  auto normalized = [&](const Node& p) -> std::pair<ValueId, double> {
    const std::pair<ValueId, double> none{kNoValue, std::nan("")};
    if (p.op != "aten.mul" || p.delegate || p.inputs.size() != 2 || p.outputs.size() != 1) return none;
    const TensorType& t = graph.value(p.outputs[0]).type;
    if (t.dtype != DType::Float32 || t.dim() < 1) return none;
    for (int side = 0; side < 2; ++side) {
      const ValueId x = p.inputs[static_cast<size_t>(1 - side)];
      const int ri = single_use_producer(p.inputs[static_cast<size_t>(side)], "aten.rsqrt");
      if (x == kNoValue || ri < 0 || !(graph.value(x).type == t)) continue;
      const int ai = single_use_producer(nodes[static_cast<size_t>(ri)].inputs[0], "aten.add");
      if (ai < 0) continue;
      const Node& a = nodes[static_cast<size_t>(ai)];
      if (a.inputs.size() != 2 || a.attrs.get_float("alpha", 1.0) != 1.0) continue;
      for (int aside = 0; aside < 2; ++aside) {
        const double eps = const_scalar(graph, a.inputs[static_cast<size_t>(1 - aside)]);
        const int mi = single_use_producer(a.inputs[static_cast<size_t>(aside)], "aten.mean");
        if (!(eps >= 0.0) || !std::isfinite(eps) || mi < 0) continue;
        const Node& m = nodes[static_cast<size_t>(mi)];
        const auto dims = m.attrs.get_ints("dim");
        if (!m.attrs.get_bool("keepdim") || dims.size() != 1 || (dims[0] != -1 && dims[0] != t.dim() - 1)) continue;
        if (!(graph.value(m.outputs[0]).type == graph.value(a.outputs[0]).type)) continue;
        const ValueId sq = m.inputs[0];
        int si = single_use_producer(sq, "aten.pow");
        bool square = false;
        if (si >= 0) {
          const Node& s = nodes[static_cast<size_t>(si)];
          square = s.inputs.size() == 2 && s.inputs[0] == x && const_scalar(graph, s.inputs[1]) == 2.0;
        } else if ((si = single_use_producer(sq, "aten.mul")) >= 0) {
          const Node& s = nodes[static_cast<size_t>(si)];
          square = s.inputs.size() == 2 && s.inputs[0] == x && s.inputs[1] == x;
        }
        if (square && graph.value(sq).type == t) return {x, eps};
      }
    }
    return none;
  };
  size_t rewritten = 0;
  // Last node first, so that weight * normalized(x) is matched before its inner normalized(x);
  // the inner product is then marked consumed (left for dead-code elimination).
  std::vector<bool> consumed(nodes.size(), false);
  for (size_t i = nodes.size(); i-- > 0;) {
    const Node& n = nodes[i];
    if (consumed[i] || n.op != "aten.mul" || n.delegate || n.inputs.size() != 2 || n.outputs.size() != 1) continue;
    const TensorType& t = graph.value(n.outputs[0]).type;
    if (t.dtype != DType::Float32 || t.dim() < 1) continue;
    const int64_t d = t.sizes.back();
    ValueId x = kNoValue, w = kNoValue;
    double eps = 0.0;
    // weight * normalized(x), either order: the weight a float32 constant [D].
    for (int side = 0; side < 2 && x == kNoValue; ++side) {
      const ValueId c = n.inputs[static_cast<size_t>(1 - side)];
      const int pi = single_use_producer(n.inputs[static_cast<size_t>(side)], "aten.mul");
      if (pi < 0 || const_f32(graph, c) == nullptr || graph.value(c).type.sizes != std::vector<int64_t>{d}) continue;
      const auto [xv, e] = normalized(nodes[static_cast<size_t>(pi)]);
      if (xv != kNoValue) x = xv, eps = e, w = c, consumed[static_cast<size_t>(pi)] = true;
    }
    if (x == kNoValue) {  // no weight: this node is the normalization itself
      const auto [xv, e] = normalized(n);
      x = xv, eps = e;
    }
    if (x == kNoValue) continue;
    auto& node = graph.mutable_nodes()[i];
    node.op = "aten.rms_norm";
    node.inputs = {x, w};
    node.attrs = Attributes{{"normalized_shape", std::vector<int64_t>{d}}, {"eps", eps}};
    ++rewritten;
  }
  return rewritten;
}

}  // namespace kiln

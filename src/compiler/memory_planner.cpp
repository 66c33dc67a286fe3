// Lifetime-aware best-fit memory planning of activations into one arena.
//
// Algorithm: "greedy by size" offset assignment (Pisarchyk & Lee, "Efficient Memory
// Management for Deep Neural Net Inference", 2020, as used by TFLite): values are placed in
// decreasing size order, each at the lowest-waste gap among already-placed values whose
// lifetimes overlap it.
//
// Fusion-friendly lifetimes: when node i is a convolution whose only output v is read only by
// node i + 1, an activation that the runtime may fuse into the convolution (see fusable_next in
// src/runtime/program.cpp and cpu::post_op_of), that activation's output starts living at node i
// instead of i + 1, so it never shares bytes with the convolution's inputs and the fused kernel
// can write it directly.
#include <algorithm>
#include <string_view>

#include "kiln/compiler.h"

namespace kiln {

namespace {
constexpr uint64_t kAlign = 64;
uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

bool fusable_activation(std::string_view op) {
  return op == "aten.relu" || op == "aten.hardswish" || op == "aten.hardsigmoid" || op == "aten.hardtanh" ||
         op == "aten.clamp" || op == "aten.sigmoid" || op == "aten.silu";
}
}  // namespace

MemoryPlan plan_memory(const Graph& graph) {
  const auto& values = graph.values();
  const auto& nodes = graph.nodes();
  const int64_t end = static_cast<int64_t>(nodes.size());
  std::vector<int64_t> first(values.size(), -2), last(values.size(), -2);
  for (ValueId id : graph.inputs()) first[static_cast<size_t>(id)] = last[static_cast<size_t>(id)] = -1;
  for (int64_t i = 0; i < end; ++i) {
    for (ValueId in : nodes[static_cast<size_t>(i)].inputs) {
      if (in != kNoValue && !values[static_cast<size_t>(in)].constant) last[static_cast<size_t>(in)] = i;
    }
    for (ValueId o : nodes[static_cast<size_t>(i)].outputs) {
      first[static_cast<size_t>(o)] = i;
      last[static_cast<size_t>(o)] = std::max(last[static_cast<size_t>(o)], i);
    }
  }
  for (ValueId o : graph.outputs()) {
    if (!values[static_cast<size_t>(o)].constant) last[static_cast<size_t>(o)] = end;
  }
  // Fusion-friendly lifetimes (see the top of this file).
  std::vector<int> readers(values.size(), 0);
  for (const auto& n : nodes) {
    for (ValueId in : n.inputs) {
      if (in != kNoValue) ++readers[static_cast<size_t>(in)];
    }
  }
  for (int64_t i = 0; i + 1 < end; ++i) {
    const auto& a = nodes[static_cast<size_t>(i)];
    const auto& b = nodes[static_cast<size_t>(i + 1)];
    if (a.op != "aten.convolution" || !fusable_activation(b.op) || a.outputs.size() != 1 || b.outputs.size() != 1 ||
        b.inputs.empty() || b.inputs[0] != a.outputs[0] || readers[static_cast<size_t>(a.outputs[0])] != 1) {
      continue;
    }
    const auto w = static_cast<size_t>(b.outputs[0]);
    if (!values[w].constant) first[w] = std::min(first[w], i);
  }

  MemoryPlan plan;
  for (size_t v = 0; v < values.size(); ++v) {
    if (values[v].constant || first[v] == -2) continue;
    plan.values.push_back({static_cast<ValueId>(v), 0, values[v].type.nbytes(), first[v], last[v]});
    plan.total_bytes += align_up(values[v].type.nbytes());
  }
  std::vector<size_t> order(plan.values.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return plan.values[a].nbytes > plan.values[b].nbytes; });

  std::vector<size_t> placed;
  for (size_t idx : order) {
    PlannedValue& pv = plan.values[idx];
    std::vector<std::pair<uint64_t, uint64_t>> busy;  // [offset, end) of overlapping live values
    for (size_t p : placed) {
      const PlannedValue& q = plan.values[p];
      if (q.first_use <= pv.last_use && pv.first_use <= q.last_use) busy.emplace_back(q.offset, q.offset + align_up(q.nbytes));
    }
    std::sort(busy.begin(), busy.end());
    const uint64_t need = align_up(pv.nbytes);
    uint64_t best = UINT64_MAX, best_waste = UINT64_MAX, cursor = 0;
    for (const auto& [b, e] : busy) {
      if (b >= cursor && b - cursor >= need && b - cursor - need < best_waste) {
        best = cursor;
        best_waste = b - cursor - need;
      }
      cursor = std::max(cursor, e);
    }
    pv.offset = best != UINT64_MAX ? best : cursor;
    plan.arena_bytes = std::max(plan.arena_bytes, pv.offset + need);
    placed.push_back(idx);
  }
  return plan;
}

}  // namespace kiln

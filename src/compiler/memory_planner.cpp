// Lifetime-aware best-fit memory planning of activations into one arena.
//
// Algorithm: "greedy by size" offset assignment (Pisarchyk & Lee, "Efficient Memory
// Management for Deep Neural Net Inference", 2020, as used by TFLite): values are placed in
// decreasing size order, each at the lowest-waste gap among already-placed values whose
// lifetimes overlap it.
//
// In-place activations: when node i is a producer that takes an epilogue (the fusion table,
// src/ir/fusion.h: a convolution or a linear) whose output v (not a method output) is read only
// by node i + 1, an activation that may run in place (runs_in_place: the table's epilogue ops,
// the ones the runtime may fuse into the producer, see fusion_offer in src/runtime/program.cpp),
// of the same type, the activation's output w takes exactly v's bytes: one slot living from node
// i to w's last use. Fused, the producer writes the activated values there directly; unfused,
// the activation runs in place. Either way w never shares bytes with the producer's inputs,
// and the pair needs one buffer instead of two. (Residual adds after a producer: see below.)
//
// Zero-copy views: the output of a view (is_byte_view: aten.view, squeeze, unsqueeze; same
// elements in the same order) takes exactly its input's bytes when the input is a planned value
// that is not a method input and the output is not a method output. The bytes then live from the
// input's first use to the last use of every value sharing them, so nothing else is placed there
// meanwhile; the view's kernel copies nothing, and the instruction stays in the program, so the
// runtime still counts it as a reader of its input (no fusion writes around it).
#include <algorithm>
#include <string_view>

#include "ir/fusion.h"
#include "ir/op_registry.h"
#include "kiln/compiler.h"

namespace kiln {

namespace {
constexpr uint64_t kAlign = 64;
uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

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
  for (const StateDef& st : graph.states()) {  // copied into the state after the last node
    if (st.update != kNoValue && !values[static_cast<size_t>(st.update)].constant) last[static_cast<size_t>(st.update)] = end;
  }
  std::vector<int> readers(values.size(), 0);
  for (const auto& n : nodes) {
    for (ValueId in : n.inputs) {
      if (in != kNoValue) ++readers[static_cast<size_t>(in)];
    }
  }
  std::vector<bool> is_output(values.size(), false);
  for (ValueId o : graph.outputs()) is_output[static_cast<size_t>(o)] = true;
  // Residual adds: when node i is a producer that takes a residual add (the fusion table,
  // src/ir/fusion.h: a convolution) whose output v (not a method output) is read only by node
  // i + 1, a residual add (is_residual_add: aten.add, alpha 1) of v and another value of v's type,
  // the producer's inputs stay live through node i + 1, so that the add's output never shares
  // their bytes and the runtime may fuse the add into the producer (fusion_offer in
  // src/runtime/program.cpp), which writes the sum while it still reads its inputs. (Before the
  // in-place aliasing below, which extends a slot to the last use of the activation output it
  // holds.) When the producer also takes an epilogue after the add (epilogue_after_add), an
  // in-place activation right after such an add (resnet's relu) then takes the add's bytes
  // (below), so the runtime may fuse it too (FusionCandidate::then): it shares no bytes with the
  // inputs either.
  std::vector<bool> epilogue_after(static_cast<size_t>(end), false);  // node i: such an add
  for (int64_t i = 0; i + 1 < end; ++i) {
    const auto& a = nodes[static_cast<size_t>(i)];
    const auto& b = nodes[static_cast<size_t>(i + 1)];
    if (fold_as(a.op, b.op, b.attrs) != FoldAs::ResidualAdd || a.outputs.size() != 1 || b.inputs.size() != 2 ||
        (b.inputs[0] == a.outputs[0]) == (b.inputs[1] == a.outputs[0])) {
      continue;
    }
    const auto v = static_cast<size_t>(a.outputs[0]);
    const ValueId r = b.inputs[0] == a.outputs[0] ? b.inputs[1] : b.inputs[0];
    if (r == kNoValue || readers[v] != 1 || is_output[v] || !(values[static_cast<size_t>(r)].type == values[v].type)) continue;
    for (ValueId in : a.inputs) {
      if (in != kNoValue && !values[static_cast<size_t>(in)].constant) {
        last[static_cast<size_t>(in)] = std::max(last[static_cast<size_t>(in)], i + 1);
      }
    }
    epilogue_after[static_cast<size_t>(i + 1)] = find_fusion_producer(a.op)->epilogue_after_add;
  }
  // In-place activations (see the top of this file): alias[w] = v.
  std::vector<ValueId> alias(values.size(), kNoValue);
  for (int64_t i = 0; i + 1 < end; ++i) {
    const auto& a = nodes[static_cast<size_t>(i)];
    const auto& b = nodes[static_cast<size_t>(i + 1)];
    const FusionProducer* producer = find_fusion_producer(a.op);
    if (!((producer != nullptr && producer->epilogue) || epilogue_after[static_cast<size_t>(i)]) ||
        !runs_in_place(b.op) || a.outputs.size() != 1 || b.outputs.size() != 1 ||
        b.inputs.empty() || b.inputs[0] != a.outputs[0]) {
      continue;
    }
    const auto v = static_cast<size_t>(a.outputs[0]), w = static_cast<size_t>(b.outputs[0]);
    if (readers[v] != 1 || is_output[v] || values[v].constant || values[w].constant || first[w] == -2 ||
        values[v].state >= 0 || values[w].state >= 0 ||
        !(values[v].type == values[w].type)) {
      continue;
    }
    alias[w] = a.outputs[0];
    last[v] = std::max(last[v], last[w]);  // v's slot lives as long as w
  }
  // Zero-copy views (see the top of this file): alias[out] = the value owning the bytes. In node
  // order, so a chain of views resolves to its first input; the owner's slot is extended to each
  // view's last use (which already includes the residual-add extension above).
  std::vector<bool> is_input(values.size(), false);
  for (ValueId id : graph.inputs()) is_input[static_cast<size_t>(id)] = true;
  for (const auto& n : nodes) {
    if (!is_byte_view(n.op) || n.delegate || n.inputs.size() != 1 || n.outputs.size() != 1 || n.inputs[0] == kNoValue) {
      continue;
    }
    const auto in = static_cast<size_t>(n.inputs[0]), out = static_cast<size_t>(n.outputs[0]);
    if (values[in].constant || values[out].constant || is_input[in] || is_output[out] || first[in] == -2 ||
        values[in].state >= 0 || values[out].state >= 0 ||
        first[out] == -2 || alias[out] != kNoValue || values[in].type.dtype != values[out].type.dtype ||
        values[in].type.nbytes() != values[out].type.nbytes()) {
      continue;
    }
    const ValueId owner = alias[in] != kNoValue ? alias[in] : n.inputs[0];
    alias[out] = owner;
    last[static_cast<size_t>(owner)] = std::max(last[static_cast<size_t>(owner)], last[out]);
  }

  MemoryPlan plan;
  for (size_t v = 0; v < values.size(); ++v) {
    if (values[v].constant || values[v].state >= 0 || first[v] == -2 || alias[v] != kNoValue) continue;
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
  // Aliased activation outputs take their input's slot.
  std::vector<uint64_t> offset_of(values.size(), 0);
  for (const PlannedValue& pv : plan.values) offset_of[static_cast<size_t>(pv.value)] = pv.offset;
  for (size_t w = 0; w < values.size(); ++w) {
    const ValueId v = alias[w];
    if (v == kNoValue) continue;
    plan.values.push_back({static_cast<ValueId>(w), offset_of[static_cast<size_t>(v)], values[w].type.nbytes(),
                           first[w], last[w]});
  }
  return plan;
}

}  // namespace kiln

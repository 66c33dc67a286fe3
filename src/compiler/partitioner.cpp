// The partitioner: splits a method's graph between delegate backends and Kiln's CPU kernels.
//
// For each requested backend (in order of preference) every node not yet delegated is offered
// to Backend::support. Supported nodes are visited in topological order; each starts a group
// and absorbs the groups of its supported producers (same backend) one at a time, as long as
// contracting every group to a single node leaves the graph acyclic (checked on the quotient
// graph with Kahn's algorithm, so a group never has a path that leaves it and comes back, also
// through another backend's groups). Each group is then lowered by its backend and replaced by
// one delegate node; the node list is re-sorted topologically (stable by first original node).
//
// Support is decided by building (Backend::check_build): each lowered group is built the way init
// will build it at load. A node that fails is refused for that backend (with the backend's reason)
// and the partition starts again without it; a failure the backend cannot pin on one node refuses
// the whole group. A program that compiled therefore loads wherever its backends are available.
#include <algorithm>
#include <map>
#include <queue>
#include <set>

#include "backends/backend.h"
#include "kiln/compiler.h"

namespace kiln {
namespace {

struct Groups {
  const Graph& g;
  std::vector<int> group;                 // per node: group id (initially its own index)
  std::vector<std::vector<size_t>> producers;  // per node: producing nodes of its inputs

  explicit Groups(const Graph& graph) : g(graph), group(graph.nodes().size()), producers(graph.nodes().size()) {
    std::vector<int> producer_of(graph.values().size(), -1);
    for (size_t i = 0; i < graph.nodes().size(); ++i) {
      group[i] = static_cast<int>(i);
      for (ValueId in : graph.nodes()[i].inputs) {
        if (in != kNoValue && producer_of[static_cast<size_t>(in)] >= 0) {
          producers[i].push_back(static_cast<size_t>(producer_of[static_cast<size_t>(in)]));
        }
      }
      for (ValueId o : graph.nodes()[i].outputs) producer_of[static_cast<size_t>(o)] = static_cast<int>(i);
    }
  }

  // True when contracting every group to one node leaves a DAG.
  bool acyclic() const {
    const size_t n = group.size();
    std::vector<std::set<int>> succ(n);
    std::vector<int> indeg(n, 0);
    std::vector<bool> present(n, false);
    for (size_t i = 0; i < n; ++i) {
      present[static_cast<size_t>(group[i])] = true;
      for (size_t p : producers[i]) {
        const int a = group[p], b = group[i];
        if (a != b && succ[static_cast<size_t>(a)].insert(b).second) ++indeg[static_cast<size_t>(b)];
      }
    }
    std::vector<int> ready;
    size_t total = 0, seen = 0;
    for (size_t k = 0; k < n; ++k) {
      if (!present[k]) continue;
      ++total;
      if (indeg[k] == 0) ready.push_back(static_cast<int>(k));
    }
    while (!ready.empty()) {
      const int k = ready.back();
      ready.pop_back();
      ++seen;
      for (int s : succ[static_cast<size_t>(k)]) {
        if (--indeg[static_cast<size_t>(s)] == 0) ready.push_back(s);
      }
    }
    return seen == total;
  }

  // Merges group `from` into `into` if that keeps the quotient acyclic; returns whether it did.
  bool try_merge(int into, int from) {
    std::vector<size_t> moved;
    for (size_t i = 0; i < group.size(); ++i) {
      if (group[i] == from) {
        group[i] = into;
        moved.push_back(i);
      }
    }
    if (acyclic()) return true;
    for (size_t i : moved) group[i] = from;
    return false;
  }
};

// Boundary of a set of nodes (sorted indices) of `g`.
Subgraph make_subgraph(const Graph& g, std::vector<size_t> nodes) {
  Subgraph sg;
  sg.graph = &g;
  sg.nodes = std::move(nodes);
  std::set<ValueId> produced, seen_in;
  for (size_t i : sg.nodes) {
    for (ValueId in : g.nodes()[i].inputs) {
      if (in == kNoValue || produced.count(in) || !seen_in.insert(in).second) continue;
      (g.value(in).constant ? sg.constants : sg.inputs).push_back(in);
    }
    for (ValueId o : g.nodes()[i].outputs) produced.insert(o);
  }
  std::set<ValueId> used_outside(g.outputs().begin(), g.outputs().end());
  for (const StateDef& st : g.states()) {
    if (st.update != kNoValue) used_outside.insert(st.update);  // copied into the state after the call
  }
  std::set<size_t> inside(sg.nodes.begin(), sg.nodes.end());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (inside.count(i)) continue;
    for (ValueId in : g.nodes()[i].inputs) used_outside.insert(in);
  }
  for (size_t i : sg.nodes) {
    for (ValueId o : g.nodes()[i].outputs) {
      if (used_outside.count(o)) sg.outputs.push_back(o);
    }
  }
  return sg;
}

// The states of `sg` (a group of backend `backend`): each state that the group's nodes read or
// update. One that only they read and write becomes a held state of the subgraph when the backend
// holds state (its read value leaves `inputs`, its update `outputs`); every other one goes through
// the boundary, and the report says why.
void place_states(const Graph& g, const Backend& backend, Subgraph& sg, DelegationReport& report) {
  const std::set<size_t> inside(sg.nodes.begin(), sg.nodes.end());
  const std::set<ValueId> method_outputs(g.outputs().begin(), g.outputs().end());
  for (size_t s = 0; s < g.states().size(); ++s) {
    const StateDef& st = g.states()[s];
    const ValueId update = st.update == st.value ? kNoValue : st.update;
    bool read_in = false, read_out = false, update_in = false, update_read_out = false;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& node = g.nodes()[i];
      const bool in = inside.count(i) > 0;
      for (ValueId v : node.inputs) {
        if (v == st.value) (in ? read_in : read_out) = true;
        if (v == update && update != kNoValue && !in) update_read_out = true;
      }
      for (ValueId v : node.outputs) {
        if (v == update && update != kNoValue && in) update_in = true;
      }
    }
    if (!read_in && !update_in) continue;
    std::string why;
    if (!backend.holds_state()) {
      why = "the " + backend.name() + " delegate does not hold state";
    } else if (read_out) {
      why = "nodes outside the segment read it";
    } else if (method_outputs.count(st.value)) {
      why = "the method returns its value";
    } else if (update != kNoValue && !update_in) {
      why = "its new value is computed outside the segment";
    } else if (update_read_out || (update != kNoValue && method_outputs.count(update))) {
      why = "its new value is also read outside the segment";
    }
    report.states.push_back({st.name, backend.name(), why.empty(), why});
    if (!why.empty()) continue;
    sg.states.push_back({s, read_in ? st.value : kNoValue, update});
    std::erase(sg.inputs, st.value);
    if (update != kNoValue) std::erase(sg.outputs, update);
  }
}

}  // namespace

Result<DelegationReport> partition(Graph& graph, const std::vector<std::string>& backends, DType compute_dtype) {
  DelegationReport report;
  if (!is_compute_float(compute_dtype)) {
    return Error(ErrorCode::InvalidArgument, std::string("compute_dtype must be float32, float16 or bfloat16, got ") +
                                                 dtype_name(compute_dtype));
  }
  if (backends.empty()) return report;
  const size_t n = graph.nodes().size();
  std::vector<const Backend*> bs;
  for (const std::string& name : backends) {
    const Backend* b = BackendRegistry::get().find(name);
    if (b == nullptr) return Error(ErrorCode::NotFound, "backend '" + name + "' is not compiled into this build (not linked: "
                                                 "link the CMake target kiln::backend_" + name + ")");
    if (std::find(bs.begin(), bs.end(), b) != bs.end()) {
      return Error(ErrorCode::InvalidArgument, "backend '" + name + "' requested twice");
    }
    bs.push_back(b);
  }

  // Nodes a backend's build check refused (check_build): (node, backend index) -> reason. Each
  // refusal restarts the partition without that node for that backend, so the loop ends.
  std::map<std::pair<size_t, size_t>, std::string> refused;
  // What does not change between those restarts: each backend's support() answer per node (a
  // backend may build the node to decide, docs/delegation.md), and the groups whose build check
  // passed, (backend index, members) (a build may pack every weight of the group).
  std::map<std::pair<size_t, size_t>, Error> support_of;
  std::set<std::pair<size_t, std::vector<size_t>>> built_ok;
  for (;;) {
    report = DelegationReport{};
    Groups groups(graph);
    std::vector<int> owner(n, -1);  // per node: index into bs of its delegate, -1 = CPU
    std::vector<std::vector<std::pair<size_t, std::string>>> reasons(n);  // (backend index, reason)
    for (size_t bi = 0; bi < bs.size(); ++bi) {
      for (size_t i = 0; i < n; ++i) {
        if (owner[i] >= 0 || graph.nodes()[i].delegate) continue;
        Error why;
        if (auto r = refused.find({i, bi}); r != refused.end()) {
          why = Error(ErrorCode::NotSupported, r->second);
        } else if (has_symbolic_sizes(graph, graph.nodes()[i]) && !bs[bi]->symbolic_sizes_reason().empty()) {
          why = Error(ErrorCode::NotSupported, bs[bi]->symbolic_sizes_reason());
        } else {
          auto s = support_of.find({i, bi});
          if (s == support_of.end()) s = support_of.emplace(std::make_pair(i, bi), bs[bi]->support(i, graph)).first;
          why = s->second;
        }
        if (!why.ok()) {
          reasons[i].emplace_back(bi, why.message());
          continue;
        }
        owner[i] = static_cast<int>(bi);
        const int mine = groups.group[i];
        for (size_t p : groups.producers[i]) {
          if (owner[p] != static_cast<int>(bi)) continue;
          const int theirs = groups.group[p];
          if (theirs == groups.group[i]) continue;
          // Keep the lower id (the earliest node) as the group's id.
          if (theirs < groups.group[i]) {
            groups.try_merge(theirs, groups.group[i]);
          } else {
            groups.try_merge(groups.group[i], theirs);
          }
        }
        (void)mine;
      }
    }

    // Lower each group and build its delegate node.
    std::map<int, std::vector<size_t>> members;
    for (size_t i = 0; i < n; ++i) {
      if (owner[i] >= 0) members[groups.group[i]].push_back(i);
    }
    report.backends.resize(bs.size());
    for (size_t bi = 0; bi < bs.size(); ++bi) report.backends[bi].backend = bs[bi]->name();
    std::map<int, Node> delegate_nodes;
    bool retry = false;
    for (auto& [gid, nodes] : members) {
      const size_t bi = static_cast<size_t>(owner[nodes.front()]);
      Subgraph sg = make_subgraph(graph, nodes);
      sg.compute_dtype = compute_dtype;
      place_states(graph, *bs[bi], sg, report);
      auto payload = bs[bi]->lower(sg);
      if (!payload.ok()) {
        const Node& first = graph.nodes()[nodes.front()];
        return Error(payload.error().code(),
                     "backend '" + bs[bi]->name() + "' failed to lower the subgraph starting at " + first.op +
                         (first.debug_name.empty() ? "" : " (" + first.debug_name + ")") + ": " +
                         payload.error().message());
      }
      // Support decided by building: the segment must build the way init will build it at load.
      // Every group is checked before the restart, so that one restart handles all of them.
      size_t at_fault = SIZE_MAX;
      bool checked = false;
      Error built;
      if (!built_ok.count({bi, nodes})) built = bs[bi]->check_build(sg, payload.value(), &at_fault, &checked);
      if (!built.ok()) {
        if (at_fault < nodes.size()) {
          refused[{nodes[at_fault], bi}] = built.message();
        } else {
          for (size_t i : nodes) {
            refused[{i, bi}] = built.message() + " (in a segment of " + std::to_string(nodes.size()) + " nodes)";
          }
        }
        retry = true;
        continue;
      }
      built_ok.insert({bi, nodes});
      auto blob = std::make_shared<DelegateBlob>();
      blob->backend = bs[bi]->name();
      blob->payload = std::move(payload.value());
      blob->constants = sg.constants;
      for (const Subgraph::State& st : sg.states) blob->states.push_back(st.state);
      DelegationReport::BackendSummary& sum = report.backends[bi];
      ++sum.segments;
      sum.nodes += nodes.size();
      for (ValueId c : sg.constants) sum.constant_bytes += graph.value(c).constant->size();
      Node d;
      d.op = "delegate:" + blob->backend;
      d.inputs = sg.inputs;
      d.outputs = sg.outputs;
      d.debug_name = graph.nodes()[nodes.front()].debug_name;
      d.delegate = std::move(blob);
      delegate_nodes.emplace(gid, std::move(d));
    }

    if (retry) continue;

    // Report: CPU nodes by op, with reasons.
    std::map<std::string, DelegationReport::CpuOp> cpu;
    for (size_t i = 0; i < n; ++i) {
      const Node& node = graph.nodes()[i];
      for (size_t bi = 0; bi < bs.size(); ++bi) {
        if (owner[i] == static_cast<int>(bi)) continue;
        std::string why = owner[i] >= 0 ? "delegated to '" + bs[static_cast<size_t>(owner[i])]->name() + "'"
                                        : "not delegated";
        for (const auto& [rb, r] : reasons[i]) {
          if (rb == bi) why = r;
        }
        report.declined.push_back({node.op, node.debug_name, bs[bi]->name(), why});
      }
      if (owner[i] >= 0 || node.delegate) continue;
      DelegationReport::CpuOp& c = cpu[node.op];
      c.op = node.op;
      ++c.count;
      for (const auto& [rb, r] : reasons[i]) {
        std::pair<std::string, std::string> entry{bs[rb]->name(), r};
        if (std::find(c.reasons.begin(), c.reasons.end(), entry) == c.reasons.end()) c.reasons.push_back(entry);
      }
    }
    for (auto& [op, c] : cpu) report.cpu_ops.push_back(std::move(c));

    // Rebuild the node list: topological order of the quotient, stable by first member.
    std::map<int, std::vector<size_t>> all;  // group -> members (sorted)
    for (size_t i = 0; i < n; ++i) all[groups.group[i]].push_back(i);
    std::map<int, std::set<int>> succ;
    std::map<int, int> indeg;
    for (const auto& [gid, m] : all) indeg[gid] = 0;
    for (size_t i = 0; i < n; ++i) {
      for (size_t p : groups.producers[i]) {
        const int a = groups.group[p], b = groups.group[i];
        if (a != b && succ[a].insert(b).second) ++indeg[b];
      }
    }
    std::priority_queue<std::pair<size_t, int>, std::vector<std::pair<size_t, int>>, std::greater<>> ready;
    for (const auto& [gid, d] : indeg) {
      if (d == 0) ready.push({all[gid].front(), gid});
    }
    std::vector<Node> out;
    auto& old_nodes = graph.mutable_nodes();
    while (!ready.empty()) {
      const int gid = ready.top().second;
      ready.pop();
      auto it = delegate_nodes.find(gid);
      if (it != delegate_nodes.end()) {
        out.push_back(std::move(it->second));
      } else {
        out.push_back(std::move(old_nodes[all[gid].front()]));
      }
      for (int s : succ[gid]) {
        if (--indeg[s] == 0) ready.push({all[s].front(), s});
      }
    }
    if (out.size() != all.size()) return Error(ErrorCode::Internal, "partitioner produced a cyclic graph");
    old_nodes = std::move(out);
    return report;
  }
}

}  // namespace kiln

// Memory planning (src/compiler/memory_planner.cpp): on random DAGs of aten.add / aten.relu /
// aten.view / aten.unsqueeze no two values that are live at the same time share arena bytes (except
// a zero-copy view and the value it views), lifetimes are those of the graph, and the compiled
// program computes what a plain-arithmetic interpreter computes; a chain reuses memory.
#include <algorithm>
#include <map>
#include <random>
#include <string>

#include "runtime_test_util.h"

namespace kiln {
namespace {

using testing::float_bytes;
using testing::pattern;

// ---- a random DAG of add/relu over broadcast-compatible float32 shapes ----

// Every value's shape is a sub-shape of kFull (each dim either 1 or the full size, leading 1s
// sometimes dropped), so any two values broadcast together.
constexpr int64_t kFull[3] = {3, 5, 8};

struct RefValue {
  std::vector<int64_t> sizes;
  std::vector<float> data;
};

// Plain-arithmetic broadcasting helpers (NumPy rules, right-aligned, rank <= 3).
std::vector<int64_t> padded3(const std::vector<int64_t>& s) {
  std::vector<int64_t> p(3 - s.size(), 1);
  p.insert(p.end(), s.begin(), s.end());
  return p;
}

RefValue ref_add(const RefValue& a, const RefValue& b, float alpha) {
  const auto pa = padded3(a.sizes), pb = padded3(b.sizes);
  std::vector<int64_t> po(3);
  for (int d = 0; d < 3; ++d) po[d] = std::max(pa[d], pb[d]);
  RefValue out;
  const size_t rank = std::max(a.sizes.size(), b.sizes.size());
  out.sizes.assign(po.end() - static_cast<int64_t>(rank), po.end());
  out.data.resize(static_cast<size_t>(po[0] * po[1] * po[2]));
  auto at = [](const RefValue& v, const std::vector<int64_t>& p, int64_t i, int64_t j, int64_t k) {
    const int64_t ii = p[0] == 1 ? 0 : i, jj = p[1] == 1 ? 0 : j, kk = p[2] == 1 ? 0 : k;
    return v.data[static_cast<size_t>((ii * p[1] + jj) * p[2] + kk)];
  };
  for (int64_t i = 0; i < po[0]; ++i)
    for (int64_t j = 0; j < po[1]; ++j)
      for (int64_t k = 0; k < po[2]; ++k)
        out.data[static_cast<size_t>((i * po[1] + j) * po[2] + k)] = at(a, pa, i, j, k) + alpha * at(b, pb, i, j, k);
  return out;
}

RefValue ref_relu(const RefValue& a) {
  RefValue out = a;
  for (float& x : out.data) x = x > 0.0f ? x : 0.0f;
  return out;
}

struct RandomDag {
  Graph graph;
  std::map<ValueId, RefValue> ref;     // reference value of every graph value
  std::vector<ValueId> input_ids;
};

std::vector<int64_t> random_shape(std::mt19937& rng) {
  std::vector<int64_t> s;
  for (int d = 0; d < 3; ++d) s.push_back(rng() % 2 ? kFull[d] : 1);
  // Sometimes drop leading 1s (rank 1 or 2), to exercise rank broadcasting.
  while (s.size() > 1 && s[0] == 1 && rng() % 2) s.erase(s.begin());
  return s;
}

// Builds a DAG of `num_nodes` add/relu nodes over 1-3 inputs and a few constants, with
// reference values computed alongside. Outputs: the last node plus a few random values.
void build_random_dag(uint32_t seed, int num_nodes, RandomDag& dag) {
  std::mt19937 rng(seed);
  Graph& g = dag.graph;
  std::vector<ValueId> pool;  // values nodes may read
  const int num_inputs = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < num_inputs; ++i) {
    RefValue v{random_shape(rng), {}};
    v.data = pattern(static_cast<size_t>(numel_of(v.sizes)), seed * 31 + static_cast<uint32_t>(i));
    ValueId id = g.add_input("in" + std::to_string(i), {DType::Float32, v.sizes});
    dag.ref[id] = v;
    dag.input_ids.push_back(id);
    pool.push_back(id);
  }
  for (int i = 0; i < 2; ++i) {
    RefValue v{random_shape(rng), {}};
    v.data = pattern(static_cast<size_t>(numel_of(v.sizes)), seed * 131 + static_cast<uint32_t>(i));
    auto id = g.add_constant("c" + std::to_string(i), {DType::Float32, v.sizes}, float_bytes(v.data));
    ASSERT_TRUE(id.ok()) << id.error().to_string();
    dag.ref[id.value()] = v;
    pool.push_back(id.value());
  }
  const float alphas[] = {1.0f, 0.5f, -1.0f, 2.0f};
  for (int n = 0; n < num_nodes; ++n) {
    // Prefer recent values so that lifetimes vary (some short, some long).
    auto pick = [&]() -> ValueId {
      if (rng() % 3 != 0) {
        const size_t back = std::min<size_t>(pool.size(), 4);
        return pool[pool.size() - 1 - rng() % back];
      }
      return pool[rng() % pool.size()];
    };
    const uint32_t kind = rng() % 6;
    if (kind == 5) {  // a view: same elements, same order (unsqueeze(0) when the rank allows)
      const ValueId a = pick();
      RefValue v = dag.ref[a];
      const bool unsqueeze = v.sizes.size() < 3 && rng() % 2;
      auto out = unsqueeze ? g.add_node("aten.unsqueeze", {a}, {{"dim", int64_t{0}}}, "view" + std::to_string(n))
                           : g.add_node("aten.view", {a}, {{"size", v.sizes}}, "view" + std::to_string(n));
      ASSERT_TRUE(out.ok()) << out.error().to_string();
      if (unsqueeze) v.sizes.insert(v.sizes.begin(), 1);
      dag.ref[out.value()[0]] = v;
      pool.push_back(out.value()[0]);
    } else if (kind < 2) {
      const ValueId a = pick();
      auto out = g.add_node("aten.relu", {a}, {}, "relu" + std::to_string(n));
      ASSERT_TRUE(out.ok()) << out.error().to_string();
      dag.ref[out.value()[0]] = ref_relu(dag.ref[a]);
      pool.push_back(out.value()[0]);
    } else {
      const ValueId a = pick(), b = pick();
      const float alpha = alphas[rng() % 4];
      auto out = g.add_node("aten.add", {a, b}, {{"alpha", static_cast<double>(alpha)}}, "add" + std::to_string(n));
      ASSERT_TRUE(out.ok()) << out.error().to_string();
      dag.ref[out.value()[0]] = ref_add(dag.ref[a], dag.ref[b], alpha);
      pool.push_back(out.value()[0]);
    }
  }
  std::vector<ValueId> outputs = {pool.back()};
  const int extra = static_cast<int>(rng() % 3);
  for (int i = 0; i < extra; ++i) outputs.push_back(pool[rng() % pool.size()]);
  ASSERT_TRUE(g.set_outputs(outputs).ok());
}

// Lifetimes computed here, independently of the planner: [defining node (-1 for inputs),
// last reading node (nodes.size() for method outputs)].
std::map<ValueId, std::pair<int64_t, int64_t>> expected_lifetimes(const Graph& g) {
  std::map<ValueId, std::pair<int64_t, int64_t>> life;
  for (ValueId id : g.inputs()) life[id] = {-1, -1};
  const auto& nodes = g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto t = static_cast<int64_t>(i);
    for (ValueId in : nodes[i].inputs) {
      if (in == kNoValue || g.value(in).constant) continue;
      life[in].second = std::max(life[in].second, t);
    }
    for (ValueId o : nodes[i].outputs) life[o] = {t, t};
  }
  for (ValueId o : g.outputs()) {
    if (!g.value(o).constant) life[o].second = static_cast<int64_t>(nodes.size());
  }
  return life;
}

// Zero-copy views, stated here independently of the planner: the output of an aten.view /
// aten.unsqueeze shares the bytes of the value its input shares them with (chains resolve to the
// first), unless that input is a method input or the output a method output. Returns value ->
// owner of its bytes (absent: its own).
std::map<ValueId, ValueId> view_owners(const Graph& g) {
  std::map<ValueId, ValueId> owner;
  std::vector<bool> is_input(g.values().size(), false), is_output(g.values().size(), false);
  for (ValueId id : g.inputs()) is_input[static_cast<size_t>(id)] = true;
  for (ValueId id : g.outputs()) is_output[static_cast<size_t>(id)] = true;
  for (const Node& n : g.nodes()) {
    if (n.op != "aten.view" && n.op != "aten.unsqueeze") continue;
    const ValueId in = n.inputs[0], out = n.outputs[0];
    if (g.value(in).constant || is_input[static_cast<size_t>(in)] || is_output[static_cast<size_t>(out)]) continue;
    owner[out] = owner.count(in) ? owner.at(in) : in;
  }
  return owner;
}

// Checks a plan against the graph: every non-constant value planned once with its true
// lifetime and size (a value whose bytes views share: until the last use of any of them),
// aligned, inside the arena, and no byte shared by two values whose lifetimes intersect, except
// a view and the value whose bytes it shares (same offset).
void check_plan(const Graph& g, const MemoryPlan& plan) {
  auto life = expected_lifetimes(g);
  const auto owner = view_owners(g);
  for (const auto& [v, o] : owner) life[o].second = std::max(life[o].second, life.at(v).second);
  ASSERT_EQ(plan.values.size(), life.size());
  uint64_t total = 0;
  std::map<ValueId, int> seen;
  std::map<ValueId, uint64_t> offset;
  for (const PlannedValue& pv : plan.values) offset[pv.value] = pv.offset;
  auto owner_of = [&](ValueId v) { return owner.count(v) ? owner.at(v) : v; };
  for (const PlannedValue& pv : plan.values) {
    ASSERT_TRUE(life.count(pv.value)) << "planned value " << pv.value << " is a constant or unused";
    EXPECT_EQ(seen[pv.value]++, 0) << "value " << pv.value << " planned twice";
    EXPECT_EQ(pv.nbytes, g.value(pv.value).type.nbytes()) << "value " << pv.value;
    EXPECT_EQ(pv.first_use, life.at(pv.value).first) << "value " << pv.value;
    EXPECT_EQ(pv.last_use, life.at(pv.value).second) << "value " << pv.value;
    EXPECT_EQ(pv.offset % 64, 0u) << "value " << pv.value;
    EXPECT_LE(pv.offset + pv.nbytes, plan.arena_bytes) << "value " << pv.value;
    EXPECT_EQ(pv.offset, offset[owner_of(pv.value)]) << "view " << pv.value << " does not share " << owner_of(pv.value);
    if (!owner.count(pv.value)) total += (pv.nbytes + 63) / 64 * 64;
  }
  EXPECT_EQ(plan.total_bytes, total);
  EXPECT_LE(plan.arena_bytes, plan.total_bytes);
  for (size_t i = 0; i < plan.values.size(); ++i) {
    for (size_t j = i + 1; j < plan.values.size(); ++j) {
      const PlannedValue& a = plan.values[i];
      const PlannedValue& b = plan.values[j];
      const bool live_together = a.first_use <= b.last_use && b.first_use <= a.last_use;
      if (!live_together || a.nbytes == 0 || b.nbytes == 0 || owner_of(a.value) == owner_of(b.value)) continue;
      const bool disjoint = a.offset + a.nbytes <= b.offset || b.offset + b.nbytes <= a.offset;
      EXPECT_TRUE(disjoint) << "values " << a.value << " [" << a.offset << ", +" << a.nbytes << ") live ["
                            << a.first_use << ", " << a.last_use << "] and " << b.value << " [" << b.offset << ", +"
                            << b.nbytes << ") live [" << b.first_use << ", " << b.last_use << "] overlap";
    }
  }
}

class RandomDagPlan : public ::testing::TestWithParam<uint32_t> {};

TEST_P(RandomDagPlan, LiveValuesNeverOverlapAndResultsMatch) {
  const uint32_t seed = GetParam();
  RandomDag dag;
  build_random_dag(seed, 10 + static_cast<int>(seed % 4) * 10, dag);
  if (HasFatalFailure()) return;
  const Graph& g = dag.graph;

  // The planner on the graph as built (dead nodes included) ...
  check_plan(g, plan_memory(g));
  // ... and after the compiler's passes, as compile() plans it.
  Graph passed = g;
  auto folded = fold_constants(passed);
  ASSERT_TRUE(folded.ok()) << folded.error().to_string();
  eliminate_dead_code(passed);
  const MemoryPlan plan = plan_memory(passed);
  check_plan(passed, plan);

  // End to end: the compiled program agrees with the reference interpreter, so no value was
  // overwritten while still needed.
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", g).ok());
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile());
  EXPECT_EQ(compiled.methods[0].arena_bytes, plan.arena_bytes);
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  EXPECT_EQ(method.meta().arena_bytes, plan.arena_bytes);
  std::vector<Tensor> inputs;
  for (ValueId id : dag.input_ids) {
    RefValue& v = dag.ref[id];
    inputs.push_back(Tensor{DType::Float32, v.sizes, v.data.data()});
  }
  KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute(std::span<const Tensor>(inputs)));
  ASSERT_EQ(outs.size(), g.outputs().size());
  for (size_t o = 0; o < outs.size(); ++o) {
    const RefValue& want = dag.ref[g.outputs()[o]];
    ASSERT_EQ(outs[o].sizes, want.sizes) << "output " << o;
    float scale = 0.0f;
    for (float x : want.data) scale = std::max(scale, std::abs(x));
    const float* got = outs[o].data_as<float>();
    for (size_t i = 0; i < want.data.size(); ++i) {
      ASSERT_NEAR(got[i], want.data[i], 1e-5f * std::max(scale, 1.0f)) << "output " << o << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomDagPlan, ::testing::Range<uint32_t>(1, 25));

TEST(MemoryPlan, ChainArenaIsSmallerThanSumOfActivations) {
  // x -> 20 ops (relu and add(v, v, 0.5) alternating) on float32[64, 64] = 16 KiB each.
  Graph g;
  const std::vector<int64_t> shape = {64, 64};
  ValueId v = g.add_input("x", {DType::Float32, shape});
  for (int i = 0; i < 20; ++i) {
    auto out = i % 2 == 0 ? g.add_node("aten.relu", {v}, {}) : g.add_node("aten.add", {v, v}, {{"alpha", 0.5}});
    ASSERT_TRUE(out.ok()) << out.error().to_string();
    v = out.value()[0];
  }
  ASSERT_TRUE(g.set_outputs({v}).ok());
  const uint64_t one = 64 * 64 * sizeof(float);
  const uint64_t sum = 21 * one;  // the input and 20 outputs, computed here, not by the planner
  const MemoryPlan plan = plan_memory(g);
  check_plan(g, plan);
  EXPECT_EQ(plan.total_bytes, sum);
  EXPECT_LT(plan.arena_bytes, sum);
  // Only an op's input and output are live at once in a chain: two buffers suffice.
  EXPECT_LE(plan.arena_bytes, 2 * one);

  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile());
  EXPECT_LT(compiled.methods[0].arena_bytes, sum);
  EXPECT_EQ(compiled.methods[0].activation_bytes, sum);
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  EXPECT_LT(method.meta().arena_bytes, sum);
  std::vector<float> x = pattern(64 * 64, 7);
  KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute({Tensor{DType::Float32, shape, x.data()}}));
  // relu, then v + 0.5 v, alternating: relu(x) * 1.5^10 (relu is idempotent on non-negatives).
  float factor = 1.0f;
  for (int i = 0; i < 10; ++i) factor = factor + 0.5f * factor;
  const float* got = outs[0].data_as<float>();
  for (size_t i = 0; i < x.size(); ++i) {
    float expect = x[i] > 0.0f ? x[i] : 0.0f;
    for (int k = 0; k < 10; ++k) expect = expect + 0.5f * expect;
    ASSERT_NEAR(got[i], expect, 1e-5f * 2.0f * factor) << i;
  }
}

TEST(MemoryPlan, ZeroSizedAndUnusedValuesArePlannedSafely) {
  // An unused input and a zero-element tensor must not break the plan.
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {0, 4}});
  ValueId unused = g.add_input("unused", {DType::Float32, {4}});
  (void)unused;
  auto r = g.add_node("aten.relu", {x}, {});
  ASSERT_TRUE(r.ok());
  ValueId y = g.add_input("y", {DType::Float32, {2, 4}});
  auto s = g.add_node("aten.add", {y, y}, {});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(g.set_outputs({r.value()[0], s.value()[0]}).ok());
  check_plan(g, plan_memory(g));
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile());
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  std::vector<float> u = {1, 2, 3, 4}, yv = {1, -2, 3, -4, 5, -6, 7, -8};
  KILN_ASSERT_OK_AND_ASSIGN(
      outs, method.execute({Tensor{DType::Float32, {0, 4}, nullptr}, Tensor{DType::Float32, {4}, u.data()},
                            Tensor{DType::Float32, {2, 4}, yv.data()}}));
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].numel(), 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(outs[1].data_as<float>()[i], 2.0f * yv[static_cast<size_t>(i)]) << i;
}

}  // namespace
}  // namespace kiln

// The mlx delegate's run half (src/backends/mlx/): hostile payload bytes give an error value or a
// run of the right shape (never a crash), the backend is NotFound without a GPU unless
// KILN_MLX_DEVICE=cpu, and method instances on two threads are independent. Numerics are tested
// against PyTorch eager in tests/python/test_mlx.py. Skipped when mlx is not built.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "backends/backend.h"
#include "kv_cache_program.h"
#include "runtime_test_util.h"

namespace kiln {
namespace {

using testing::float_bytes;
using testing::pattern;

/// Sets KILN_MLX_DEVICE for the test's scope (MLX's CPU device: there may be no GPU).
class ScopedDevice {
 public:
  explicit ScopedDevice(const char* value) {
    if (const char* old = std::getenv("KILN_MLX_DEVICE")) old_ = old;
    if (value) {
      setenv("KILN_MLX_DEVICE", value, 1);
    } else {
      unsetenv("KILN_MLX_DEVICE");
    }
  }
  ~ScopedDevice() {
    if (old_) {
      setenv("KILN_MLX_DEVICE", old_->c_str(), 1);
    } else {
      unsetenv("KILN_MLX_DEVICE");
    }
  }

 private:
  std::optional<std::string> old_;
};

Result<CompiledProgram> small_cnn() {
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {1, 3, 8, 8}});
  auto w = g.add_constant("w", {DType::Float32, {4, 3, 3, 3}}, float_bytes(pattern(108, 1)));
  auto fw = g.add_constant("fw", {DType::Float32, {2, 4}}, float_bytes(pattern(8, 2)));
  if (!w.ok() || !fw.ok()) return Error(ErrorCode::Internal, "constants");
  Attributes conv{{"stride", std::vector<int64_t>{2, 2}}, {"padding", std::vector<int64_t>{1, 1}},
                  {"dilation", std::vector<int64_t>{1, 1}}, {"transposed", false},
                  {"output_padding", std::vector<int64_t>{0, 0}}, {"groups", int64_t{1}}};
  auto c = g.add_node("aten.convolution", {x, w.value(), kNoValue}, conv);
  if (!c.ok()) return c.error();
  // relu, not a chain of elementwise ops: a fused chain would make MLX compile a new CPU kernel
  // (a C++ compiler run) for many of the corrupted variants, which makes the test slow.
  auto p = g.add_node("aten.relu", {c.value()[0]}, {});
  if (!p.ok()) return p.error();
  auto m = g.add_node("aten.mean", {p.value()[0]}, {{"dim", std::vector<int64_t>{2, 3}}, {"keepdim", false}});
  if (!m.ok()) return m.error();
  auto y = g.add_node("aten.linear", {m.value()[0], fw.value(), kNoValue}, {});
  if (!y.ok()) return y.error();
  KILN_RETURN_IF_ERROR(g.set_outputs({y.value()[0]}));
  ProgramBuilder pb;
  KILN_RETURN_IF_ERROR(pb.add_method("forward", g));
  CompileOptions o;
  o.require_delegation = "mlx";
  return pb.compile(o);
}

size_t payload_start(const std::vector<uint8_t>& bytes) {
  for (size_t off = 4096; off + 4 <= bytes.size(); off += 4096) {
    if (std::memcmp(bytes.data() + off, "KMLX", 4) == 0) return off;
  }
  return 0;
}

TEST(MlxDelegate, CorruptedBytesGiveErrorsNotCrashes) {
  if (BackendRegistry::get().find("mlx") == nullptr) GTEST_SKIP() << "mlx backend not built";
  ScopedDevice cpu("cpu");
  KILN_ASSERT_OK_AND_ASSIGN(compiled, small_cnn());
  ASSERT_EQ(compiled.methods[0].delegation.backends[0].segments, 1u);
  const auto& bytes = compiled.bytes;
  const size_t start = payload_start(bytes);
  ASSERT_NE(start, 0u);
  std::vector<float> x = pattern(192, 3);
  int errors = 0, runs = 0;
  for (size_t off = start; off < bytes.size(); off += 3) {
    for (uint8_t v : {uint8_t{0}, uint8_t{0xFF}}) {
      std::vector<uint8_t> bad = bytes;
      if (bad[off] == v) continue;
      bad[off] = v;
      auto program = Program::load_from_buffer(bad);
      if (!program.ok()) { ++errors; continue; }
      auto method = (*program)->load_method("forward");
      if (!method.ok()) { ++errors; continue; }
      auto out = method->execute({Tensor{DType::Float32, {1, 3, 8, 8}, x.data()}});
      if (!out.ok()) { ++errors; continue; }
      EXPECT_EQ((*out)[0].sizes, (std::vector<int64_t>{1, 2}));
      ++runs;
    }
  }
  EXPECT_GT(errors, 0);
  EXPECT_GT(runs, 0);
  std::printf("[          ] mlx payload byte flips: %d ran, %d rejected\n", runs, errors);
}

/// x [2, 8] -> relu -> linear(w [4, 8]) -> sigmoid, as one segment of all three nodes.
struct ThreeNodes {
  Graph g;
  Subgraph sg;
};
std::unique_ptr<ThreeNodes> three_nodes() {
  auto t = std::make_unique<ThreeNodes>();
  Graph& g = t->g;
  ValueId x = g.add_input("x", {DType::Float32, {2, 8}});
  ValueId w = g.add_constant("w", {DType::Float32, {4, 8}}, float_bytes(pattern(32, 6))).value();
  ValueId r = g.add_node("aten.relu", {x}, {}).value()[0];
  ValueId l = g.add_node("aten.linear", {r, w, kNoValue}, {}).value()[0];
  ValueId y = g.add_node("aten.sigmoid", {l}, {}).value()[0];
  EXPECT_TRUE(g.set_outputs({y}).ok());
  t->sg.graph = &g;
  t->sg.nodes = {0, 1, 2};
  t->sg.inputs = {x};
  t->sg.outputs = {y};
  t->sg.constants = {w};
  return t;
}

// Support decided by building (Backend::check_build): the mlx override builds the segment as init
// does, on MLX's CPU device whatever KILN_MLX_DEVICE says, and names the node that fails by its
// position in Subgraph::nodes, so the partitioner refuses that node only. The payloads here are
// altered by hand: no node that support() accepts is known to fail to build in a segment
// (support traces each node alone with MLX; tests/python/test_mlx_norms.py).
TEST(MlxDelegate, CheckBuildNamesTheNodeThatFails) {
  const Backend* mlx = BackendRegistry::get().find("mlx");
  if (mlx == nullptr) GTEST_SKIP() << "mlx backend not built";
  ScopedDevice none(nullptr);  // no device setting: the check needs none
  auto t = three_nodes();
  KILN_ASSERT_OK_AND_ASSIGN(payload, mlx->lower(t->sg));
  size_t at = 7;
  bool checked = false;
  EXPECT_TRUE(mlx->check_build(t->sg, payload, &at, &checked).ok());
  EXPECT_TRUE(checked);
  EXPECT_EQ(at, SIZE_MAX);

  // Node 1's op renamed to one with no mlx lowering (same length): init fails at node 1.
  std::vector<uint8_t> bad = payload;
  const std::string op = "aten.linear";
  auto it = std::search(bad.begin(), bad.end(), op.begin(), op.end());
  ASSERT_NE(it, bad.end());
  *(it + static_cast<long>(op.size()) - 1) = 'X';
  Error e = mlx->check_build(t->sg, bad, &at, &checked);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.code(), ErrorCode::NotSupported);
  EXPECT_EQ(at, 1u) << e.message();
  EXPECT_NE(e.message().find("node 1"), std::string::npos) << e.message();

  // A payload whose last node builds another type than the segment's output: node 2 is named.
  auto other = three_nodes();
  other->g.mutable_values()[static_cast<size_t>(other->sg.outputs[0])].type.sizes = {2, 5};
  e = mlx->check_build(other->sg, payload, &at, &checked);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(at, 2u) << e.message();

  // A failure before any node (boundary counts) names none: the whole group is refused.
  Subgraph fewer = t->sg;
  fewer.constants.clear();
  e = mlx->check_build(fewer, payload, &at, &checked);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(at, SIZE_MAX) << e.message();
}

TEST(MlxDelegate, NoGpuIsNotFoundUnlessCpuRequested) {
  if (BackendRegistry::get().find("mlx") == nullptr) GTEST_SKIP() << "mlx backend not built";
  ScopedDevice cpu("cpu");
  KILN_ASSERT_OK_AND_ASSIGN(compiled, small_cnn());
  {
    ScopedDevice none(nullptr);
    if (BackendRegistry::get().find("mlx")->is_available({}).ok()) GTEST_SKIP() << "this machine has an MLX GPU";
    auto program = Program::load_from_buffer(compiled.bytes);
    ASSERT_FALSE(program.ok());
    EXPECT_EQ(program.error().code(), ErrorCode::NotFound);
    EXPECT_NE(program.error().message().find("mlx"), std::string::npos) << program.error().message();
    EXPECT_NE(program.error().message().find("KILN_MLX_DEVICE=cpu"), std::string::npos) << program.error().message();
  }
  {
    ScopedDevice wrong("npu");
    auto program = Program::load_from_buffer(compiled.bytes);
    ASSERT_FALSE(program.ok());
    EXPECT_EQ(program.error().code(), ErrorCode::NotFound);
  }
  EXPECT_TRUE(Program::load_from_buffer(compiled.bytes).ok());
}

TEST(MlxDelegate, MethodInstancesOnTwoThreadsAreIndependent) {
  if (BackendRegistry::get().find("mlx") == nullptr) GTEST_SKIP() << "mlx backend not built";
  ScopedDevice cpu("cpu");
  KILN_ASSERT_OK_AND_ASSIGN(compiled, small_cnn());
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(a, program->load_method("forward"));
  KILN_ASSERT_OK_AND_ASSIGN(b, program->load_method("forward"));
  std::vector<float> x1 = pattern(192, 4), x2 = pattern(192, 5);
  auto once = [](Method& m, std::vector<float>& x) {
    auto y = m.execute({Tensor{DType::Float32, {1, 3, 8, 8}, x.data()}});
    return y.ok() ? std::vector<float>(y.value()[0].data_as<float>(), y.value()[0].data_as<float>() + 2)
                  : std::vector<float>{};
  };
  const std::vector<float> ya = once(a, x1), yb = once(b, x2);
  ASSERT_EQ(ya.size(), 2u);
  ASSERT_EQ(yb.size(), 2u);
  EXPECT_NE(ya, yb);
  std::vector<std::vector<float>> ra(20), rb(20);
  std::thread ta([&] {
    for (auto& r : ra) r = once(a, x1);
  });
  std::thread tb([&] {
    for (auto& r : rb) r = once(b, x2);
  });
  ta.join();
  tb.join();
  for (const auto& r : ra) EXPECT_EQ(r, ya);
  for (const auto& r : rb) EXPECT_EQ(r, yb);
}


// ---------------------------------------------------------------- held state, symbolic sizes

/// tests/cpp/kv_cache_program.h's program (symbol seq, a KV cache written by index_put, a counter)
/// delegated to mlx: the cache is held by the delegate (read and written only inside the segment),
/// the counter, whose new value is a method output, goes through the boundary.
std::shared_ptr<Program> load_kv_on_mlx(CompiledProgram* compiled_out = nullptr) {
  auto g = testing::kv_cache_graph();
  EXPECT_TRUE(g.ok());
  ProgramBuilder pb;
  EXPECT_TRUE(pb.add_method("forward", std::move(g.value())).ok());
  CompileOptions o;
  o.require_delegation = "mlx";
  auto compiled = pb.compile(o);
  EXPECT_TRUE(compiled.ok()) << compiled.error().to_string();
  if (!compiled.ok()) return nullptr;
  LoadOptions lo;
  lo.backend_settings = {{"mlx.device", "cpu"}};
  auto p = Program::load_from_buffer(compiled->bytes, lo);
  EXPECT_TRUE(p.ok()) << p.error().to_string();
  if (compiled_out) *compiled_out = compiled.value();
  return p.ok() ? p.value() : nullptr;
}

std::vector<float> state_of(const Session& s, const char* name) {
  auto t = s.state(name);
  EXPECT_TRUE(t.ok()) << t.error().to_string();
  if (!t.ok()) return {};
  return std::vector<float>(t->data_as<float>(), t->data_as<float>() + t->numel());
}

bool near(float a, float b) { return std::abs(a - b) <= 1e-5f * (1.0f + std::abs(b)); }

TEST(MlxDelegate, HoldsTheKvCacheAndRunsEverySymbolBinding) {
  if (BackendRegistry::get().find("mlx") == nullptr) GTEST_SKIP() << "mlx backend not built";
  using testing::kKvCapacity;
  using testing::kKvDim;
  CompiledProgram compiled;
  auto program = load_kv_on_mlx(&compiled);
  ASSERT_NE(program, nullptr);
  const DelegationReport& d = compiled.methods.at(0).delegation;
  ASSERT_EQ(d.backends.size(), 1u);
  EXPECT_EQ(d.backends[0].segments, 2u);  // the counter's add is not connected to the rest
  EXPECT_TRUE(d.cpu_ops.empty());
  ASSERT_EQ(d.states.size(), 2u);
  for (const auto& st : d.states) {
    if (st.state == "cache") EXPECT_TRUE(st.resident) << st.reason;
    if (st.state == "counter") {
      EXPECT_FALSE(st.resident);
      EXPECT_NE(st.reason.find("also read outside the segment"), std::string::npos) << st.reason;
    }
  }
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  EXPECT_EQ(method.meta().num_delegate_calls, 2u);
  EXPECT_EQ(method.meta().num_kernel_calls, 0u);
  // The cache is no boundary input or output: 2 of the 3 method inputs (x, gate, input_pos) and
  // the 3 outputs plus the counter's new value cross it, never a [1, 32, 8] tensor.
  KILN_ASSERT_OK_AND_ASSIGN(session, program->new_session());
  testing::KvReference ref;
  // Ten distinct lengths, more than the handle keeps graphs for (kGraphCacheSize = 8): 7 is built
  // again at the end, after it was evicted.
  const std::vector<std::pair<int64_t, int64_t>> calls = {{7, 0}, {1, 7}, {1, 8}, {5, 9}, {1, 14}, {kKvCapacity, 0},
                                                          {3, 29}, {1, 31}, {2, 0}, {16, 16}, {4, 20}, {6, 24},
                                                          {9, 2}, {7, 11}, {1, 18}};
  uint32_t seed = 100;
  auto run = [&](int64_t seq, int64_t pos, Session& s, testing::KvReference& r) {
    SCOPED_TRACE("seq " + std::to_string(seq) + " pos " + std::to_string(pos));
    auto x = pattern(static_cast<size_t>(seq * kKvDim), seed);
    auto gate = pattern(static_cast<size_t>(seq), seed + 7777);
    ++seed;
    std::vector<int64_t> p = {pos};
    auto outs = method.execute(s, {Tensor{DType::Float32, {1, seq, kKvDim}, x.data()},
                                   Tensor{DType::Float32, {1, seq, 1}, gate.data()}, Tensor{DType::Int64, {1}, p.data()}});
    ASSERT_TRUE(outs.ok()) << outs.error().to_string();
    const auto want = r.step(x, gate, pos);
    ASSERT_EQ(outs->size(), 3u);
    ASSERT_EQ((*outs)[0].sizes, (std::vector<int64_t>{1, seq, kKvDim}));
    for (size_t i = 0; i < want.hg.size(); ++i) ASSERT_TRUE(near((*outs)[0].data_as<float>()[i], want.hg[i])) << i;
    for (size_t i = 0; i < want.total.size(); ++i) ASSERT_TRUE(near((*outs)[1].data_as<float>()[i], want.total[i])) << i;
    EXPECT_EQ((*outs)[2].data_as<float>()[0], want.counter);
    const auto cache = state_of(s, "cache");  // read back from MLX
    ASSERT_EQ(cache.size(), r.cache.size());
    for (size_t i = 0; i < cache.size(); ++i) ASSERT_TRUE(near(cache[i], r.cache[i])) << i;
    EXPECT_EQ(state_of(s, "counter"), std::vector<float>{r.counter});
  };
  for (const auto& [seq, pos] : calls) run(seq, pos, *session, ref);

  // Positions past the cache: the delegate's index_put check fails the call before anything is
  // kept, so the held cache and the counter are unchanged and the session goes on.
  const auto cache0 = state_of(*session, "cache");
  const auto counter0 = state_of(*session, "counter");
  for (int64_t pos : {kKvCapacity - 2, int64_t{-40}}) {
    auto x = pattern(4 * kKvDim, 1);
    std::vector<float> gate(4, 1.0f);
    std::vector<int64_t> p = {pos};
    auto r = method.execute(*session, {Tensor{DType::Float32, {1, 4, kKvDim}, x.data()},
                                       Tensor{DType::Float32, {1, 4, 1}, gate.data()}, Tensor{DType::Int64, {1}, p.data()}});
    ASSERT_FALSE(r.ok()) << "ran at position " << pos;
    EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument) << r.error().to_string();
    EXPECT_EQ(state_of(*session, "cache"), cache0);
    EXPECT_EQ(state_of(*session, "counter"), counter0);
    EXPECT_FALSE(session->failed()) << session->failure();
  }
  run(3, 4, *session, ref);

  // reset(): the delegate's copy is dropped and made again from the initial value.
  session->reset();
  EXPECT_EQ(state_of(*session, "cache"), std::vector<float>(static_cast<size_t>(kKvCapacity * kKvDim), 0.0f));
  testing::KvReference fresh;
  run(5, 0, *session, fresh);

  // A second session on the same method is independent of the first.
  KILN_ASSERT_OK_AND_ASSIGN(other, program->new_session());
  testing::KvReference other_ref;
  run(2, 3, *other, other_ref);
  run(1, 5, *session, fresh);
  run(1, 5, *other, other_ref);
}

}  // namespace
}  // namespace kiln

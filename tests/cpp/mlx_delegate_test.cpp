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

}  // namespace
}  // namespace kiln

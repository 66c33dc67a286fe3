// The xnnpack delegate's run half on hostile payloads (src/backends/xnnpack/): every 32-bit word
// of a real payload replaced by a set of values must give an error value or a run of the right
// shape, never a crash or an out-of-bounds access (run under scripts/sanitizers.sh). Numerics are
// tested against PyTorch eager in tests/python/test_xnnpack.py. Skipped when xnnpack is not built.
#include <cstdlib>
#include <cstring>

#include "backends/backend.h"
#include "runtime_test_util.h"

namespace kiln {
namespace {

using testing::float_bytes;
using testing::pattern;

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
  auto h = g.add_node("aten.hardswish", {c.value()[0]}, {});
  if (!h.ok()) return h.error();
  Attributes pool{{"kernel_size", std::vector<int64_t>{2, 2}}, {"stride", std::vector<int64_t>{2, 2}},
                  {"ceil_mode", true}};
  auto p = g.add_node("aten.max_pool2d", {h.value()[0]}, pool);
  if (!p.ok()) return p.error();
  auto m = g.add_node("aten.mean", {p.value()[0]}, {{"dim", std::vector<int64_t>{2, 3}}, {"keepdim", false}});
  if (!m.ok()) return m.error();
  auto y = g.add_node("aten.linear", {m.value()[0], fw.value(), kNoValue}, {});
  if (!y.ok()) return y.error();
  KILN_RETURN_IF_ERROR(g.set_outputs({y.value()[0]}));
  ProgramBuilder pb;
  KILN_RETURN_IF_ERROR(pb.add_method("forward", g));
  CompileOptions o;
  o.require_delegation = "xnnpack";
  return pb.compile(o);
}

TEST(XnnpackPayload, CorruptedWordsGiveErrorsNotCrashes) {
  if (BackendRegistry::get().find("xnnpack") == nullptr) GTEST_SKIP() << "xnnpack backend not built";
  KILN_ASSERT_OK_AND_ASSIGN(compiled, small_cnn());
  ASSERT_EQ(compiled.methods[0].delegation.backends[0].segments, 1u);
  const auto& bytes = compiled.bytes;
  size_t start = 0;
  for (size_t off = 4096; off + 4 <= bytes.size(); off += 4096) {
    if (std::memcmp(bytes.data() + off, "KXN1", 4) == 0) start = off;
  }
  ASSERT_NE(start, 0u);
  std::vector<float> x = pattern(192, 3);
  int errors = 0, runs = 0;
  for (size_t off = start; off + 4 <= bytes.size(); off += 4) {
    for (uint32_t v : {0u, 1u, 2u, 3u, 7u, 9u, 10u, 255u, 65536u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu}) {
      std::vector<uint8_t> bad = bytes;
      std::memcpy(bad.data() + off, &v, 4);
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
}

TEST(XnnpackPayload, MethodInstancesAreIndependent) {
  if (BackendRegistry::get().find("xnnpack") == nullptr) GTEST_SKIP() << "xnnpack backend not built";
  KILN_ASSERT_OK_AND_ASSIGN(compiled, small_cnn());
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(a, program->load_method("forward"));
  KILN_ASSERT_OK_AND_ASSIGN(b, program->load_method("forward"));
  std::vector<float> x1 = pattern(192, 4), x2 = pattern(192, 5);
  KILN_ASSERT_OK_AND_ASSIGN(ya, a.execute({Tensor{DType::Float32, {1, 3, 8, 8}, x1.data()}}));
  const std::vector<float> first(ya[0].data_as<float>(), ya[0].data_as<float>() + 2);
  KILN_ASSERT_OK_AND_ASSIGN(yb, b.execute({Tensor{DType::Float32, {1, 3, 8, 8}, x2.data()}}));
  KILN_ASSERT_OK_AND_ASSIGN(ya2, a.execute({Tensor{DType::Float32, {1, 3, 8, 8}, x1.data()}}));
  EXPECT_EQ(std::vector<float>(ya2[0].data_as<float>(), ya2[0].data_as<float>() + 2), first);
  EXPECT_NE(std::vector<float>(yb[0].data_as<float>(), yb[0].data_as<float>() + 2), first);
}

// check_build names the Kiln node whose XNNPACK value or node fails (through the lowering's origin
// table, decompositions included), with XNNPACK's status. x[2,3] -> relu -> view to rank 7 ->
// hardsigmoid (a literal, add, clamp, mul inside) -> view back -> relu. With the static checks off
// (KILN_XNNPACK_STATIC_CHECKS=0) the rank-7 values reach XNNPACK, which refuses them.
TEST(XnnpackPayload, CheckBuildNamesTheNodeXnnpackRefuses) {
  const Backend* xnn = BackendRegistry::get().find("xnnpack");
  if (xnn == nullptr) GTEST_SKIP() << "xnnpack backend not built";
  if (!xnn->is_available({}).ok()) GTEST_SKIP() << "XNNPACK is not available here";
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {2, 3}});
  KILN_ASSERT_OK_AND_ASSIGN(r, g.add_node("aten.relu", {x}, {}));
  const std::vector<int64_t> rank7 = {1, 1, 1, 1, 1, 2, 3};
  KILN_ASSERT_OK_AND_ASSIGN(v1, g.add_node("aten.view", {r[0]}, {{"size", rank7}}));
  KILN_ASSERT_OK_AND_ASSIGN(h, g.add_node("aten.hardsigmoid", {v1[0]}, {}));
  KILN_ASSERT_OK_AND_ASSIGN(v2, g.add_node("aten.view", {h[0]}, {{"size", std::vector<int64_t>{2, 3}}}));
  KILN_ASSERT_OK_AND_ASSIGN(y, g.add_node("aten.relu", {v2[0]}, {}));
  ASSERT_TRUE(g.set_outputs({y[0]}).ok());
  auto segment = [&](std::vector<size_t> nodes, ValueId in, ValueId out) {
    Subgraph sg;
    sg.graph = &g;
    sg.nodes = std::move(nodes);
    sg.inputs = {in};
    sg.outputs = {out};
    return sg;
  };
  const Subgraph all = segment({0, 1, 2, 3, 4}, x, y[0]);
  const Subgraph decomposed = segment({2}, v1[0], h[0]);

  // The static checks decline the rank-7 view at lowering, naming the limit.
  auto declined = xnn->lower(all);
  ASSERT_FALSE(declined.ok());
  EXPECT_NE(declined.error().message().find("rank 7 exceeds XNNPACK's limit of 6 dims"), std::string::npos)
      << declined.error().message();

  ASSERT_EQ(setenv("KILN_XNNPACK_STATIC_CHECKS", "0", 1), 0);
  auto payload = xnn->lower(all);
  auto payload_h = xnn->lower(decomposed);
  ASSERT_EQ(unsetenv("KILN_XNNPACK_STATIC_CHECKS"), 0);
  ASSERT_TRUE(payload.ok()) << payload.error().to_string();
  ASSERT_TRUE(payload_h.ok()) << payload_h.error().to_string();
  size_t at = 0;
  bool checked = false;
  Error e = xnn->check_build(all, payload.value(), &at, &checked);
  EXPECT_TRUE(checked);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.code(), ErrorCode::NotSupported);
  EXPECT_EQ(at, 1u) << e.message();  // the first view: its rank-7 output
  EXPECT_NE(e.message().find("xnn_status 4"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("rank 7 exceeds XNNPACK's limit of 6 dims"), std::string::npos) << e.message();
  // The hardsigmoid alone: its first payload node is a rank-7 literal, attributed to it.
  e = xnn->check_build(decomposed, payload_h.value(), &at, &checked);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(at, 0u) << e.message();

  // A segment that builds: Ok, checked.
  const Subgraph first = segment({0}, x, r[0]);
  KILN_ASSERT_OK_AND_ASSIGN(ok_payload, xnn->lower(first));
  at = 7;
  checked = false;
  EXPECT_TRUE(xnn->check_build(first, ok_payload, &at, &checked).ok());
  EXPECT_TRUE(checked);
  EXPECT_EQ(at, SIZE_MAX);
}

}  // namespace
}  // namespace kiln

// The xnnpack delegate's run half on hostile payloads (src/backends/xnnpack/): every 32-bit word
// of a real payload replaced by a set of values must give an error value or a run of the right
// shape, never a crash or an out-of-bounds access (run under scripts/sanitizers.sh). Numerics are
// tested against PyTorch eager in tests/python/test_xnnpack.py. Skipped when xnnpack is not built.
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

}  // namespace
}  // namespace kiln

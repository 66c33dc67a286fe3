// End-to-end: build a graph with the compiler API, serialize, load, execute.
#include <gtest/gtest.h>

#include <cstring>

#include "kiln/compiler.h"
#include "kiln/runtime.h"

namespace kiln {
namespace {

std::vector<uint8_t> floats_to_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(Smoke, AddReluRoundTrip) {
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {2, 3}});
  auto c = g.add_constant("c", {DType::Float32, {3}}, floats_to_bytes({1.0f, -2.0f, 0.5f}));
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  auto s = g.add_node("aten.add", {x, c.value()}, {{"alpha", 2.0}});
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  auto r = g.add_node("aten.relu", {s.value()[0]}, {});
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_TRUE(g.set_outputs({r.value()[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
  auto compiled = pb.compile();
  ASSERT_TRUE(compiled.ok()) << compiled.error().to_string();
  auto program = Program::load_from_buffer(compiled->bytes);
  ASSERT_TRUE(program.ok()) << program.error().to_string();
  auto method = (*program)->load_method("forward");
  ASSERT_TRUE(method.ok()) << method.error().to_string();
  std::vector<float> in = {0, 1, 2, -3, -4, -5};
  auto out = method->execute({Tensor{DType::Float32, {2, 3}, in.data()}});
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  const float* o = (*out)[0].data_as<float>();
  // Independent arithmetic: relu(x + 2 * c) with c = [1, -2, 0.5].
  const float expect[] = {2, 0, 3, 0, 0, 0};
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(o[i], expect[i]) << i;
}

}  // namespace
}  // namespace kiln

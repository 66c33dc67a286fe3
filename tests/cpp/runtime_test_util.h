// Helpers shared by the runtime tests (memory planning, program format, malformed input,
// method API, concurrency). Graphs use only aten.add and aten.relu, whose semantics the tests
// recompute with plain arithmetic: add(x, y, alpha) = x + alpha * y (NumPy broadcasting),
// relu(x) = max(x, 0).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/runtime.h"

namespace kiln::testing {

/// Little-endian bytes of a float vector (constant payloads).
inline std::vector<uint8_t> float_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

/// Values 0..n-1 mapped to a small deterministic pattern in [-2, 2).
inline std::vector<float> pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

/// Unwraps a Result in a test, failing with the error text.
#define KILN_ASSERT_OK_AND_ASSIGN(lhs, expr)                                  \
  auto lhs##_result = (expr);                                                 \
  ASSERT_TRUE(lhs##_result.ok()) << lhs##_result.error().to_string();         \
  auto lhs = std::move(lhs##_result.value())

/// A 64-byte aligned heap buffer (caller-supplied arenas); size must be > 0.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : size(n), data(static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64))) {}
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::span<uint8_t> span() { return {data, size}; }
  size_t size;
  uint8_t* data;
};

/// Compiles a one-method program "forward" computing y = relu(x + alpha * c) on float32[rows, cols]
/// with a constant c of `cols` elements (broadcast over rows). Returns the file bytes.
inline Result<std::vector<uint8_t>> compile_add_relu(int64_t rows, int64_t cols, const std::vector<float>& c,
                                                     double alpha) {
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {rows, cols}});
  auto cid = g.add_constant("c", {DType::Float32, {cols}}, float_bytes(c));
  if (!cid.ok()) return cid.error();
  auto s = g.add_node("aten.add", {x, cid.value()}, {{"alpha", alpha}}, "add");
  if (!s.ok()) return s.error();
  auto r = g.add_node("aten.relu", {s.value()[0]}, {}, "relu");
  if (!r.ok()) return r.error();
  KILN_RETURN_IF_ERROR(g.set_outputs({r.value()[0]}));
  ProgramBuilder pb;
  KILN_RETURN_IF_ERROR(pb.add_method("forward", std::move(g)));
  auto compiled = pb.compile();
  if (!compiled.ok()) return compiled.error();
  return std::move(compiled.value().bytes);
}

/// Reference of compile_add_relu's method, in plain arithmetic.
inline std::vector<float> add_relu_reference(const std::vector<float>& x, int64_t cols, const std::vector<float>& c,
                                             double alpha) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float s = x[i] + static_cast<float>(alpha) * c[i % static_cast<size_t>(cols)];
    y[i] = s > 0.0f ? s : 0.0f;
  }
  return y;
}

}  // namespace kiln::testing

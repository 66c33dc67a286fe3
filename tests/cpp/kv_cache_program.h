// A small program with a symbol and state (format version 2), built through the C++ compiler API,
// with a plain C++ reference of what one call computes. Shared by tests/cpp/symbolic_state_test.cpp,
// tests/cpp/malformed_program_test.cpp and the load fuzzer's seed corpus (tests/fuzz/make_corpus.cpp),
// so this header uses no GoogleTest.
//
//   symbol seq in [1, kKvCapacity]
//   inputs  x: float32[1, seq, D], gate: float32[1, seq, 1], input_pos: int64[1]
//   states  cache: float32[1, kKvCapacity, D] (zeros), counter: float32[1] (initial kCounterInitial)
//   h     = aten.linear(x, W, b)                         [1, seq, D]   (sizes derived)
//   hg    = aten.mul(h, gate)                            [1, seq, D]
//   hv    = aten.view(hg, size=[seq, D])                 [seq, D]      (symbolic attribute size[0])
//   r     = aten.arange(end=seq, dtype=int64)            [seq]         (symbolic attribute end)
//   pos   = aten.add(r, input_pos)                       [seq]
//   cache'= aten.index_put(cache, hv, pos; dims=[1])     [1, kKvCapacity, D]  -> state cache (in place)
//   total = aten.sum(cache', dim=[1])                    [1, D]
//   cnt'  = aten.add(counter, one)                       [1]           -> state counter (copied)
//   outputs hg, total, cnt'
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kiln/compiler.h"

namespace kiln::testing {

inline constexpr int64_t kKvCapacity = 32;  // cache positions; also seq's upper bound
inline constexpr int64_t kKvDim = 8;
inline constexpr float kCounterInitial = 5.0f;

/// Deterministic weights in [-1, 1) (a small LCG, no <random>: the fuzz corpus uses it too).
inline std::vector<float> kv_pattern(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  }
  return v;
}

inline ConstantBytes kv_bytes(const void* p, size_t n) {
  auto b = std::make_shared<std::vector<uint8_t>>(n);
  if (n > 0) std::memcpy(b->data(), p, n);
  return b;
}

/// Value ids of the interesting parts of kv_cache_graph's graph.
struct KvGraphIds {
  int32_t seq = -1;
  ValueId x = kNoValue, gate = kNoValue, input_pos = kNoValue;
  ValueId cache = kNoValue, counter = kNoValue;
  ValueId h = kNoValue, hg = kNoValue, hv = kNoValue, r = kNoValue, pos = kNoValue;
  ValueId new_cache = kNoValue, total = kNoValue, new_counter = kNoValue;
};

/// The graph described at the top of this file; W = kv_pattern(D * D, 1), b = kv_pattern(D, 2).
inline Result<Graph> kv_cache_graph(KvGraphIds* ids_out = nullptr) {
  Graph g;
  KvGraphIds id;
  auto seq = g.add_symbol("seq", 1, kKvCapacity);
  if (!seq.ok()) return seq.error();
  id.seq = seq.value();
  const SymExpr s = SymExpr::symbol(id.seq);
  const SymExpr one = SymExpr::constant(1), d = SymExpr::constant(kKvDim);
  auto x = g.add_input("x", {DType::Float32, {1, kKvCapacity, kKvDim}}, {one, s, d});
  if (!x.ok()) return x.error();
  auto gate = g.add_input("gate", {DType::Float32, {1, kKvCapacity, 1}}, {one, s, one});
  if (!gate.ok()) return gate.error();
  id.x = x.value();
  id.gate = gate.value();
  id.input_pos = g.add_input("input_pos", {DType::Int64, {1}});
  auto cache = g.add_state("cache", {DType::Float32, {1, kKvCapacity, kKvDim}});
  if (!cache.ok()) return cache.error();
  id.cache = cache.value();
  const float c0 = kCounterInitial;
  auto counter = g.add_state("counter", {DType::Float32, {1}}, kv_bytes(&c0, sizeof(c0)));
  if (!counter.ok()) return counter.error();
  id.counter = counter.value();
  const auto w = kv_pattern(kKvDim * kKvDim, 1), b = kv_pattern(kKvDim, 2);
  auto wc = g.add_constant("W", {DType::Float32, {kKvDim, kKvDim}}, kv_bytes(w.data(), w.size() * 4));
  if (!wc.ok()) return wc.error();
  auto bc = g.add_constant("b", {DType::Float32, {kKvDim}}, kv_bytes(b.data(), b.size() * 4));
  if (!bc.ok()) return bc.error();
  const float one_f = 1.0f;
  auto onec = g.add_constant("one", {DType::Float32, {1}}, kv_bytes(&one_f, 4));
  if (!onec.ok()) return onec.error();

  auto h = g.add_node("aten.linear", {id.x, wc.value(), bc.value()}, {}, "linear", {}, {});
  if (!h.ok()) return h.error();
  id.h = h.value()[0];
  auto hg = g.add_node("aten.mul", {id.h, id.gate}, {}, "gate", {}, {});
  if (!hg.ok()) return hg.error();
  id.hg = hg.value()[0];
  auto hv = g.add_node("aten.view", {id.hg}, {{"size", std::vector<int64_t>{kKvCapacity, kKvDim}}}, "view",
                       {SymAttr{"size", 0, s}}, {});
  if (!hv.ok()) return hv.error();
  id.hv = hv.value()[0];
  auto r = g.add_node("aten.arange", {}, {{"end", static_cast<double>(kKvCapacity)}, {"dtype", std::string("int64")}},
                      "arange", {SymAttr{"end", -1, s}}, {});
  if (!r.ok()) return r.error();
  id.r = r.value()[0];
  auto pos = g.add_node("aten.add", {id.r, id.input_pos}, {}, "pos", {}, {});
  if (!pos.ok()) return pos.error();
  id.pos = pos.value()[0];
  auto nc = g.add_node("aten.index_put", {id.cache, id.hv, id.pos}, {{"dims", std::vector<int64_t>{1}}}, "cache_write",
                       {}, {});
  if (!nc.ok()) return nc.error();
  id.new_cache = nc.value()[0];
  auto total = g.add_node("aten.sum", {id.new_cache}, {{"dim", std::vector<int64_t>{1}}}, "total");
  if (!total.ok()) return total.error();
  id.total = total.value()[0];
  auto cnt = g.add_node("aten.add", {id.counter, onec.value()}, {}, "count");
  if (!cnt.ok()) return cnt.error();
  id.new_counter = cnt.value()[0];
  KILN_RETURN_IF_ERROR(g.set_state_update(id.cache, id.new_cache));
  KILN_RETURN_IF_ERROR(g.set_state_update(id.counter, id.new_counter));
  KILN_RETURN_IF_ERROR(g.set_outputs({id.hg, id.total, id.new_counter}));
  if (ids_out) *ids_out = id;
  return g;
}

/// The compiled program of kv_cache_graph (one method "forward").
inline Result<std::vector<uint8_t>> compile_kv_cache_program(const CompileOptions& options = {}) {
  auto g = kv_cache_graph();
  if (!g.ok()) return g.error();
  ProgramBuilder pb;
  KILN_RETURN_IF_ERROR(pb.add_method("forward", std::move(g.value())));
  pb.set_metadata("test.kind", "kv-cache");
  auto compiled = pb.compile(options);
  if (!compiled.ok()) return compiled.error();
  return std::move(compiled.value().bytes);
}

/// What one session of the program holds, and one call of "forward" on it, in plain C++.
struct KvReference {
  std::vector<float> cache = std::vector<float>(kKvCapacity * kKvDim, 0.0f);
  float counter = kCounterInitial;
  struct Outputs {
    std::vector<float> hg;     // [seq, D]
    std::vector<float> total;  // [D]
    float counter = 0;
  };
  /// x: seq * D values, gate: seq values; positions pos .. pos + seq - 1 must be valid.
  Outputs step(const std::vector<float>& x, const std::vector<float>& gate, int64_t pos) {
    const auto w = kv_pattern(kKvDim * kKvDim, 1), b = kv_pattern(kKvDim, 2);
    const size_t seq = gate.size();
    Outputs out;
    out.hg.resize(seq * kKvDim);
    for (size_t i = 0; i < seq; ++i) {
      for (int64_t o = 0; o < kKvDim; ++o) {
        double acc = b[static_cast<size_t>(o)];
        for (int64_t k = 0; k < kKvDim; ++k) {
          acc += static_cast<double>(x[i * kKvDim + static_cast<size_t>(k)]) * w[static_cast<size_t>(o * kKvDim + k)];
        }
        const float hgv = static_cast<float>(acc) * gate[i];
        out.hg[i * kKvDim + static_cast<size_t>(o)] = hgv;
        cache[(static_cast<size_t>(pos) + i) * kKvDim + static_cast<size_t>(o)] = hgv;
      }
    }
    out.total.assign(kKvDim, 0.0f);
    for (int64_t j = 0; j < kKvCapacity; ++j) {
      for (int64_t o = 0; o < kKvDim; ++o) out.total[static_cast<size_t>(o)] += cache[static_cast<size_t>(j * kKvDim + o)];
    }
    counter += 1.0f;
    out.counter = counter;
    return out;
  }
};

}  // namespace kiln::testing

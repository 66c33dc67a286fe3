// Writes the fuzzers' seed corpora, made with the real compiler, loader and .npy writer:
//   kiln_fuzz_corpus <dir>    -> <dir>/load/seed-*.kiln     (kiln_load_fuzzer)
//                                <dir>/xnnpack/*.case        (kiln_xnnpack_payload_fuzzer)
//                                <dir>/mlx/*.case            (kiln_mlx_payload_fuzzer)
//                                <dir>/npy/*.npy             (kiln_npy_fuzzer; NumPy-written seeds
//                                                             are added by scripts/fuzz.sh)
// Loader seeds: aten.add/aten.relu programs (constants, broadcasting, two methods sharing a
// constant, zero-sized and unused inputs), a program with a symbolic dim and state (alone and as
// two methods sharing the state), plus one single-node program for every registered op
// whose attributes all have defaults and whose inference accepts float32[2, 3, 4, 5] inputs, so the
// fuzzer starts from every kernel it can reach without hand-written attributes.
// Delegate seeds: small programs (a CNN, norms, pooling, broadcasting arithmetic, softmax, pad,
// linear/addmm, views, and the every-op programs above) compiled with backends = {xnnpack} or
// {mlx}, then loaded with the real loader; a recording wrapper registered in place of each backend
// writes every (payload, constants, boundary types) its init receives, framed as delegate_case.h
// says. A backend not built (or mlx without its CPU device) gets no seeds and a note.
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../cpp/kv_cache_program.h"
#include "delegate_case.h"
#include "ir/op_registry.h"
#include "kiln/compiler.h"
#include "kiln/npy.h"
#include "kiln/runtime.h"

namespace {

using namespace kiln;

std::vector<uint8_t> floats(std::vector<float> v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// n deterministic floats in [-2, 2) (a small LCG: seeds must be reproducible, not random).
std::vector<float> pattern(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / static_cast<float>(1u << 24) * 4.0f - 2.0f;
  }
  return v;
}

bool write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  if (Error e = write_file(path, bytes); !e.ok()) {
    std::fprintf(stderr, "%s\n", e.to_string().c_str());
    return false;
  }
  return true;
}

// ---------------------------------------------------------------- loader seeds

int written = 0;

void emit(const std::string& dir, const std::string& name, ProgramBuilder& pb) {
  CompileOptions o;  // no folding, no dead-code elimination: the program is written as built
  o.fold_constants = false;
  o.eliminate_dead_code = false;
  auto compiled = pb.compile(o);
  if (!compiled.ok()) {
    std::fprintf(stderr, "skip %s: %s\n", name.c_str(), compiled.error().to_string().c_str());
    return;
  }
  if (write_bytes(dir + "/seed-" + name + ".kiln", compiled->bytes)) ++written;
}

#define OR_SKIP(expr) \
  if (!(expr).ok()) return

void add_relu(const std::string& dir) {
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {2, 8}});
  auto c = g.add_constant("c", {DType::Float32, {8}}, floats({1, -2, 3, -4, 5, -6, 7, -8}));
  OR_SKIP(c);
  auto s = g.add_node("aten.add", {x, c.value()}, {{"alpha", 0.5}}, "add");
  OR_SKIP(s);
  auto r = g.add_node("aten.relu", {s.value()[0]}, {}, "relu");
  OR_SKIP(r);
  OR_SKIP(g.set_outputs({r.value()[0], s.value()[0]}));
  ProgramBuilder pb;
  OR_SKIP(pb.add_method("forward", std::move(g)));
  emit(dir, "add-relu", pb);
}

void two_methods(const std::string& dir) {
  ProgramBuilder pb;
  for (const char* name : {"encode", "decode"}) {
    Graph g;
    ValueId x = g.add_input("x", {DType::Float32, {3, 4}});
    auto c = g.add_constant("w", {DType::Float32, {4}}, floats({0.5f, 1.5f, -2.5f, 3.5f}));
    OR_SKIP(c);
    auto s = g.add_node("aten.add", {c.value(), x}, {});
    OR_SKIP(s);
    OR_SKIP(g.set_outputs({s.value()[0]}));
    OR_SKIP(pb.add_method(name, std::move(g)));
  }
  emit(dir, "two-methods", pb);
}

void odd_shapes(const std::string& dir) {
  Graph g;
  ValueId z = g.add_input("z", {DType::Float32, {0, 3}});
  ValueId unused = g.add_input("unused", {DType::Float32, {5}});
  (void)unused;
  ValueId s0 = g.add_input("scalar", {DType::Float32, {}});
  ValueId v = g.add_input("v", {DType::Float32, {1, 4, 1}});
  auto r = g.add_node("aten.relu", {z}, {});
  OR_SKIP(r);
  auto b = g.add_node("aten.add", {v, s0}, {{"alpha", -1.0}});
  OR_SKIP(b);
  auto w = g.add_node("aten.add", {b.value()[0], g.add_input("w", {DType::Float32, {3, 1, 2}})}, {});
  OR_SKIP(w);
  OR_SKIP(g.set_outputs({r.value()[0], w.value()[0], s0}));
  ProgramBuilder pb;
  OR_SKIP(pb.add_method("forward", std::move(g)));
  emit(dir, "odd-shapes", pb);
}

// Format version 2: a symbol (seq in 1..32), a zero-initialized KV-cache-like state written in
// place by aten.index_put and a counter state with a constant initial value
// (tests/cpp/kv_cache_program.h); once alone and once as two methods sharing the states (the
// prefill/decode layout of an exported LLM).
void kv_cache(const std::string& dir) {
  {
    auto g = testing::kv_cache_graph();
    OR_SKIP(g);
    ProgramBuilder pb;
    OR_SKIP(pb.add_method("forward", std::move(g.value())));
    pb.set_metadata("llm.max_seq_len", "32");
    emit(dir, "kv-cache", pb);
  }
  ProgramBuilder pb;
  for (const char* name : {"prefill", "decode"}) {
    auto g = testing::kv_cache_graph();
    OR_SKIP(g);
    OR_SKIP(pb.add_method(name, std::move(g.value())));
  }
  emit(dir, "kv-cache-two-methods", pb);
}

// One single-node graph per registered op whose attributes all have defaults and whose inference
// accepts float32 `t` inputs; `each(name, graph)` is called for every one.
void every_simple_op(const TensorType& t, const std::function<void(const std::string&, Graph)>& each) {
  for (const OpDef& def : OpRegistry::get().ops()) {
    bool simple = true;
    for (const AttrSpec& a : def.attrs) simple = simple && !a.required;
    if (!simple) continue;
    const size_t arity = def.variadic ? 2 : def.inputs.size();
    Graph g;
    std::vector<ValueId> args;
    for (size_t i = 0; i < arity; ++i) args.push_back(g.add_input("in" + std::to_string(i), t));
    auto out = g.add_node(def.name, args, {});
    if (!out.ok()) continue;
    if (!g.set_outputs(out.value()).ok()) continue;
    each(def.name, std::move(g));
  }
}

// ---------------------------------------------------------------- delegate seeds

// Registered in place of a backend: forwards everything to it and writes each init's arguments.
class Recorder : public Backend {
 public:
  Recorder(const Backend* real, std::string dir) : real_(real), dir_(std::move(dir)) {}
  std::string name() const override { return real_->name(); }
  Error support(size_t node, const Graph& graph) const override { return real_->support(node, graph); }
  Result<std::vector<uint8_t>> lower(const Subgraph& sg) const override { return real_->lower(sg); }
  Error is_available(const BackendSettings& s) const override { return real_->is_available(s); }
  Result<std::unique_ptr<DelegateHandle>> init(std::span<const uint8_t> payload,
                                               std::span<const std::span<const uint8_t>> constants,
                                               std::span<const TensorType> inputs, std::span<const TensorType> outputs,
                                               const DelegateOptions& options) const override {
    fuzz::DelegateCase c;
    c.inputs.assign(inputs.begin(), inputs.end());
    c.outputs.assign(outputs.begin(), outputs.end());
    for (const auto& k : constants) c.constants.emplace_back(k.begin(), k.end());
    c.payload.assign(payload.begin(), payload.end());
    auto h = real_->init(payload, constants, inputs, outputs, options);
    if (!h.ok()) {
      std::fprintf(stderr, "note: %s init failed on %s: %s\n", name().c_str(), program.c_str(), h.error().to_string().c_str());
    }
    // Seeds hold at most 255 of each boundary kind (the framing's u8 counts).
    if (inputs.size() < 256 && outputs.size() < 256 && constants.size() < 256 &&
        write_bytes(dir_ + "/" + program + "-" + std::to_string(segment++) + ".case", fuzz::encode_case(c))) {
      ++count;
    }
    return h;
  }
  Error execute(DelegateHandle& h, std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    return real_->execute(h, in, out);
  }
  void destroy(std::unique_ptr<DelegateHandle> h) const override { real_->destroy(std::move(h)); }

  mutable std::string program;  // name of the program being loaded (seed file names)
  mutable int segment = 0;
  mutable int count = 0;

 private:
  const Backend* real_;
  std::string dir_;
};

using GraphFn = std::function<Result<Graph>()>;

Attributes conv_attrs(std::vector<int64_t> stride, std::vector<int64_t> pad, int64_t groups) {
  return {{"stride", stride}, {"padding", pad}, {"dilation", std::vector<int64_t>{1, 1}}, {"transposed", false},
          {"output_padding", std::vector<int64_t>{0, 0}}, {"groups", groups}};
}

#define TRY_ASSIGN(lhs, expr)              \
  auto lhs##_r = (expr);                   \
  if (!lhs##_r.ok()) return lhs##_r.error(); \
  auto lhs = lhs##_r.value()

// Small programs each backend lowers (nodes a backend declines stay on Kiln's kernels).
std::vector<std::pair<std::string, GraphFn>> delegate_programs() {
  std::vector<std::pair<std::string, GraphFn>> p;
  p.emplace_back("cnn", []() -> Result<Graph> {  // conv s2 p1, hardswish, max pool (ceil), mean, linear
    Graph g;
    ValueId x = g.add_input("x", {DType::Float32, {1, 3, 8, 8}});
    TRY_ASSIGN(w, g.add_constant("w", {DType::Float32, {4, 3, 3, 3}}, floats(pattern(108, 1))));
    TRY_ASSIGN(fw, g.add_constant("fw", {DType::Float32, {2, 4}}, floats(pattern(8, 2))));
    TRY_ASSIGN(c, g.add_node("aten.convolution", {x, w, kNoValue}, conv_attrs({2, 2}, {1, 1}, 1)));
    TRY_ASSIGN(h, g.add_node("aten.hardswish", {c[0]}, {}));
    TRY_ASSIGN(mp, g.add_node("aten.max_pool2d", {h[0]}, {{"kernel_size", std::vector<int64_t>{2, 2}},
                                                         {"stride", std::vector<int64_t>{2, 2}}, {"ceil_mode", true}}));
    TRY_ASSIGN(m, g.add_node("aten.mean", {mp[0]}, {{"dim", std::vector<int64_t>{2, 3}}, {"keepdim", false}}));
    TRY_ASSIGN(y, g.add_node("aten.linear", {m[0], fw, kNoValue}, {}));
    KILN_RETURN_IF_ERROR(g.set_outputs({y[0]}));
    return g;
  });
  p.emplace_back("depthwise-bn-pool", []() -> Result<Graph> {  // depthwise conv + bias, add, bn, hardtanh, pools
    Graph g;
    ValueId x = g.add_input("x", {DType::Float32, {1, 4, 6, 6}});
    TRY_ASSIGN(w, g.add_constant("w", {DType::Float32, {4, 1, 3, 3}}, floats(pattern(36, 3))));
    TRY_ASSIGN(b, g.add_constant("b", {DType::Float32, {4}}, floats(pattern(4, 4))));
    TRY_ASSIGN(c, g.add_node("aten.convolution", {x, w, b}, conv_attrs({1, 1}, {1, 1}, 4)));
    TRY_ASSIGN(s, g.add_node("aten.add", {c[0], x}, {}));
    TRY_ASSIGN(gamma, g.add_constant("gamma", {DType::Float32, {4}}, floats({1.0f, 0.5f, 2.0f, 1.5f})));
    TRY_ASSIGN(beta, g.add_constant("beta", {DType::Float32, {4}}, floats({0.1f, -0.2f, 0.3f, 0.0f})));
    TRY_ASSIGN(mean, g.add_constant("mean", {DType::Float32, {4}}, floats({0.0f, 1.0f, -1.0f, 0.5f})));
    TRY_ASSIGN(var, g.add_constant("var", {DType::Float32, {4}}, floats({1.0f, 2.0f, 0.5f, 4.0f})));
    TRY_ASSIGN(bn, g.add_node("aten.native_batch_norm", {s[0], gamma, beta, mean, var}, {}));
    TRY_ASSIGN(r6, g.add_node("aten.hardtanh", {bn[0]}, {{"min_val", 0.0}, {"max_val", 6.0}}));
    TRY_ASSIGN(ap, g.add_node("aten.avg_pool2d", {r6[0]}, {{"kernel_size", std::vector<int64_t>{2, 2}}}));
    TRY_ASSIGN(aa, g.add_node("aten.adaptive_avg_pool2d", {r6[0]}, {{"output_size", std::vector<int64_t>{3, 3}}}));
    TRY_ASSIGN(sg, g.add_node("aten.sigmoid", {aa[0]}, {}));
    TRY_ASSIGN(y, g.add_node("aten.mul", {ap[0], sg[0]}, {}));
    KILN_RETURN_IF_ERROR(g.set_outputs({y[0]}));
    return g;
  });
  p.emplace_back("elementwise", []() -> Result<Graph> {  // broadcasting arithmetic and activations, rank 3
    Graph g;
    ValueId a = g.add_input("a", {DType::Float32, {2, 3, 5}});
    ValueId b = g.add_input("b", {DType::Float32, {3, 1}});
    TRY_ASSIGN(k, g.add_constant("k", {DType::Float32, {5}}, floats(pattern(5, 5))));
    TRY_ASSIGN(s, g.add_node("aten.sub", {a, b}, {}));
    TRY_ASSIGN(d, g.add_node("aten.div", {s[0], k}, {}));
    TRY_ASSIGN(cl, g.add_node("aten.clamp", {d[0]}, {{"min", -1.5}, {"max", 2.5}}));
    TRY_ASSIGN(lr, g.add_node("aten.leaky_relu", {cl[0]}, {{"negative_slope", 0.2}}));
    TRY_ASSIGN(si, g.add_node("aten.silu", {lr[0]}, {}));
    TRY_ASSIGN(hs, g.add_node("aten.hardsigmoid", {si[0]}, {}));
    TRY_ASSIGN(sm, g.add_node("aten._softmax", {hs[0]}, {{"dim", int64_t{-1}}}));
    TRY_ASSIGN(pd, g.add_node("aten.constant_pad_nd", {sm[0]}, {{"pad", std::vector<int64_t>{1, 2, 0, 1}}, {"value", 0.5}}));
    TRY_ASSIGN(v, g.add_node("aten.view", {pd[0]}, {{"size", std::vector<int64_t>{2, 32}}}));
    KILN_RETURN_IF_ERROR(g.set_outputs({v[0], s[0]}));
    return g;
  });
  p.emplace_back("addmm-relu", []() -> Result<Graph> {  // addmm (transposed weights), relu, linear + bias
    Graph g;
    ValueId x = g.add_input("x", {DType::Float32, {3, 6}});
    TRY_ASSIGN(bias, g.add_constant("bias", {DType::Float32, {4}}, floats(pattern(4, 6))));
    TRY_ASSIGN(m2, g.add_constant("m2", {DType::Float32, {6, 4}}, floats(pattern(24, 7))));
    TRY_ASSIGN(w, g.add_constant("w", {DType::Float32, {2, 4}}, floats(pattern(8, 8))));
    TRY_ASSIGN(b2, g.add_constant("b2", {DType::Float32, {2}}, floats(pattern(2, 9))));
    TRY_ASSIGN(mm, g.add_node("aten.addmm", {bias, x, m2}, {}));
    TRY_ASSIGN(r, g.add_node("aten.relu", {mm[0]}, {}));
    TRY_ASSIGN(y, g.add_node("aten.linear", {r[0], w, b2}, {}));
    KILN_RETURN_IF_ERROR(g.set_outputs({y[0]}));
    return g;
  });
  p.emplace_back("norms", []() -> Result<Graph> {  // layer norm, group norm (mlx)
    Graph g;
    ValueId x = g.add_input("x", {DType::Float32, {2, 4, 3, 3}});
    ValueId q = g.add_input("q", {DType::Float32, {2, 5, 8}});
    TRY_ASSIGN(lw, g.add_constant("lw", {DType::Float32, {8}}, floats(pattern(8, 10))));
    TRY_ASSIGN(ln, g.add_node("aten.native_layer_norm", {q, lw, kNoValue},
                              {{"normalized_shape", std::vector<int64_t>{8}}, {"eps", 1e-5}}));
    TRY_ASSIGN(gn, g.add_node("aten.native_group_norm", {x, kNoValue, kNoValue},
                              {{"N", int64_t{2}}, {"C", int64_t{4}}, {"HxW", int64_t{9}}, {"group", int64_t{2}}, {"eps", 1e-6}}));
    KILN_RETURN_IF_ERROR(g.set_outputs({ln[0], gn[0]}));
    return g;
  });
  // symbols and state: mlx lowers it whole (payload version 2: size expressions, symbolic
  // attributes, a held KV cache); xnnpack takes the nodes of fixed sizes
  p.emplace_back("kv-cache", []() -> Result<Graph> { return testing::kv_cache_graph(); });
  p.emplace_back("tensor-ops", []() -> Result<Graph> {  // layout, indexing, attention (mlx)
    Graph g;
    ValueId x = g.add_input("x", {DType::Float32, {2, 3, 4}});
    ValueId ids = g.add_input("ids", {DType::Int64, {2, 3}});
    TRY_ASSIGN(table, g.add_constant("table", {DType::Float32, {5, 4}}, floats(pattern(20, 11))));
    TRY_ASSIGN(e, g.add_node("aten.embedding", {table, ids}, {}));
    TRY_ASSIGN(pm, g.add_node("aten.permute", {x}, {{"dims", std::vector<int64_t>{0, 2, 1}}}));
    TRY_ASSIGN(tr, g.add_node("aten.transpose", {pm[0]}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}}));
    TRY_ASSIGN(ct, g.add_node("aten.cat", {tr[0], e[0]}, {{"dim", int64_t{1}}}));
    TRY_ASSIGN(at, g.add_node("aten.scaled_dot_product_attention", {ct[0], ct[0], ct[0], kNoValue}, {{"is_causal", true}}));
    TRY_ASSIGN(am, g.add_node("aten.argmax", {at[0]}, {{"dim", int64_t{-1}}}));
    TRY_ASSIGN(ex, g.add_node("aten.expand", {x}, {{"size", std::vector<int64_t>{3, 2, 3, 4}}}));
    TRY_ASSIGN(cs, g.add_node("aten.cumsum", {ex[0]}, {{"dim", int64_t{2}}}));
    KILN_RETURN_IF_ERROR(g.set_outputs({at[0], am[0], cs[0]}));
    return g;
  });
  return p;
}

// Compiles each program for `backend` and loads it (the recorder writes every init's arguments).
void delegate_seeds(const std::string& backend, const BackendSettings& settings, const std::string& dir) {
  const Backend* real = BackendRegistry::get().find(backend);
  if (real == nullptr) {
    std::printf("note: backend %s not built: no seeds for it\n", backend.c_str());
    return;
  }
  if (Error e = real->is_available(settings); !e.ok()) {
    std::printf("note: backend %s unavailable (%s): no seeds for it\n", backend.c_str(), e.to_string().c_str());
    return;
  }
  auto owned = std::make_unique<Recorder>(real, dir);
  Recorder* rec = owned.get();
  register_backend(std::move(owned));
  auto run = [&](const std::string& name, Graph g) {
    ProgramBuilder pb;
    if (!pb.add_method("forward", std::move(g)).ok()) return;
    CompileOptions o;
    o.backends = {backend};
    auto compiled = pb.compile(o);
    if (!compiled.ok()) {
      std::fprintf(stderr, "skip %s/%s: %s\n", backend.c_str(), name.c_str(), compiled.error().to_string().c_str());
      return;
    }
    LoadOptions lo;
    lo.backend_settings = settings;
    auto program = Program::load_from_buffer(compiled->bytes, lo);
    if (!program.ok()) return;
    rec->program = name;
    rec->segment = 0;
    static ThreadPool pool(1);
    MethodOptions mo;
    mo.pool = &pool;
    (void)(*program)->load_method("forward", mo);
  };
  for (auto& [name, fn] : delegate_programs()) {
    auto g = fn();
    if (!g.ok()) {
      std::fprintf(stderr, "skip %s/%s: %s\n", backend.c_str(), name.c_str(), g.error().to_string().c_str());
      continue;
    }
    run(name, std::move(g).value());
  }
  every_simple_op({DType::Float32, {2, 3, 4, 5}}, [&](const std::string& op, Graph g) { run("op-" + op, std::move(g)); });
  std::printf("wrote %d %s delegate seeds to %s\n", rec->count, backend.c_str(), dir.c_str());
  written += rec->count;
}

// ---------------------------------------------------------------- .npy seeds

void npy_seeds(const std::string& dir) {
  int n = 0;
  auto put = [&](const std::string& name, DType dt, std::vector<int64_t> sizes) {
    std::vector<uint8_t> data(static_cast<size_t>(numel_of(sizes)) * dtype_size(dt));
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 37 + 1);
    if (dt == DType::Bool) {
      for (auto& b : data) b &= 1;
    }
    auto bytes = npy::encode(Tensor{dt, sizes, data.empty() ? nullptr : data.data()});
    if (bytes.ok() && write_bytes(dir + "/" + name + ".npy", *bytes)) ++n;
  };
  put("f32-2x3", DType::Float32, {2, 3});
  put("f16-4", DType::Float16, {4});
  put("f64-scalar", DType::Float64, {});
  put("i64-1x2x1", DType::Int64, {1, 2, 1});
  put("i32-empty", DType::Int32, {0, 5});
  put("i8-3", DType::Int8, {3});
  put("u8-2x2x2x2", DType::UInt8, {2, 2, 2, 2});
  put("bool-5", DType::Bool, {5});
  std::printf("wrote %d .npy seeds to %s\n", n, dir.c_str());
  written += n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  for (const char* sub : {"", "/load", "/xnnpack", "/mlx", "/npy"}) ::mkdir((dir + sub).c_str(), 0755);
  const std::string load = dir + "/load";
  add_relu(load);
  two_methods(load);
  odd_shapes(load);
  kv_cache(load);
  every_simple_op({DType::Float32, {2, 3, 4, 5}}, [&](const std::string& op, Graph g) {
    ProgramBuilder pb;
    if (pb.add_method("forward", std::move(g)).ok()) emit(load, "op-" + op, pb);
  });
  std::printf("wrote %d seed programs to %s\n", written, load.c_str());
  delegate_seeds("xnnpack", {}, dir + "/xnnpack");
  delegate_seeds("mlx", {{"mlx.device", "cpu"}}, dir + "/mlx");
  npy_seeds(dir + "/npy");
  return written > 0 ? 0 : 1;
}

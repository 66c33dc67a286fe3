// Writes the fuzzer's seed corpus: small valid .kiln programs made with the real compiler.
//   kiln_fuzz_corpus <dir>    -> <dir>/seed-*.kiln, prints how many
// Seeds: aten.add/aten.relu programs (constants, broadcasting, two methods sharing a constant,
// zero-sized and unused inputs), plus one single-node program for every registered op whose
// attributes all have defaults and whose inference accepts float32[2, 3, 4, 5] inputs, so the
// fuzzer starts from every kernel it can reach without hand-written attributes.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ir/op_registry.h"
#include "kiln/compiler.h"

namespace {

using namespace kiln;

std::vector<uint8_t> floats(std::vector<float> v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

int written = 0;

void emit(const std::string& dir, const std::string& name, ProgramBuilder& pb) {
  auto compiled = pb.compile(CompileOptions{false, false});
  if (!compiled.ok()) {
    std::fprintf(stderr, "skip %s: %s\n", name.c_str(), compiled.error().to_string().c_str());
    return;
  }
  const std::string path = dir + "/seed-" + name + ".kiln";
  if (Error e = write_file(path, compiled->bytes); !e.ok()) {
    std::fprintf(stderr, "%s\n", e.to_string().c_str());
    return;
  }
  ++written;
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

void every_simple_op(const std::string& dir) {
  const TensorType t{DType::Float32, {2, 3, 4, 5}};
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
    ProgramBuilder pb;
    if (!pb.add_method("forward", std::move(g)).ok()) continue;
    emit(dir, "op-" + def.name, pb);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  add_relu(dir);
  two_methods(dir);
  odd_shapes(dir);
  every_simple_op(dir);
  std::printf("wrote %d seed programs to %s\n", written, dir.c_str());
  return written > 0 ? 0 : 1;
}

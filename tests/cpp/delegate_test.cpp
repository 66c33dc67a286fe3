// Delegate contract and partitioner (src/backends/backend.h, src/runtime/loader.cpp,
// src/compiler/partitioner.cpp): unknown and unavailable backends fail at load with NotFound
// naming the backend; init failures are error values; the partitioner groups supported nodes
// into acyclic segments; the report and require_delegation list what stayed on the CPU.
//
// The backends here are test doubles registered by the test: "test_ew" runs aten.relu and
// aten.add (alpha 1, equal shapes) with plain loops, whose results are recomputed with plain
// arithmetic (relu(x) = max(x, 0), add(x, y) = x + y).
#include <algorithm>
#include <cstring>

#include "backends/backend.h"
#include "program_generated.h"
#include "runtime/file_format.h"
#include "runtime_test_util.h"

namespace kiln {
namespace {

using testing::float_bytes;
using testing::pattern;

// ---- "test_ew": payload = u32 num_inputs, u32 num_constants, u32 num_ops, per op {u32 kind
// (0 relu, 1 add), u32 a, u32 b} (locals: inputs, constants, then one per op), u32 num_outputs,
// u32 local per output.
struct EwOp {
  uint32_t kind, a, b;
};
struct EwHandle : DelegateHandle {
  uint32_t num_inputs = 0;
  std::vector<EwOp> ops;
  std::vector<uint32_t> outputs;
  size_t numel = 0;
  std::vector<std::vector<float>> locals;
};

class EwBackend : public Backend {
 public:
  explicit EwBackend(std::string name, std::string unavailable = {}, bool fail_init = false)
      : name_(std::move(name)), unavailable_(std::move(unavailable)), fail_init_(fail_init) {}
  std::string name() const override { return name_; }
  Error support(size_t i, const Graph& g) const override {
    const Node& n = g.nodes()[i];
    for (ValueId v : n.inputs) {
      if (v == kNoValue || g.value(v).type.dtype != DType::Float32) return Error(ErrorCode::NotSupported, "float32 only");
      if (g.value(v).type.sizes != g.value(n.inputs[0]).type.sizes) return Error(ErrorCode::NotSupported, "no broadcasting");
    }
    if (n.op == "aten.relu") return {};
    if (n.op == "aten.add") {
      if (n.attrs.get_float("alpha", 1.0) != 1.0) return Error(ErrorCode::NotSupported, "alpha != 1");
      return {};
    }
    return Error(ErrorCode::NotSupported, "op " + n.op + " is not implemented by " + name_);
  }
  Result<std::vector<uint8_t>> lower(const Subgraph& sg) const override {
    std::vector<uint32_t> w;
    std::vector<ValueId> locals = sg.inputs;
    locals.insert(locals.end(), sg.constants.begin(), sg.constants.end());
    auto local = [&](ValueId v) {
      return static_cast<uint32_t>(std::find(locals.begin(), locals.end(), v) - locals.begin());
    };
    w.push_back(static_cast<uint32_t>(sg.inputs.size()));
    w.push_back(static_cast<uint32_t>(sg.constants.size()));
    w.push_back(static_cast<uint32_t>(sg.nodes.size()));
    for (size_t i : sg.nodes) {
      const Node& n = sg.graph->nodes()[i];
      w.push_back(n.op == "aten.relu" ? 0 : 1);
      w.push_back(local(n.inputs[0]));
      w.push_back(n.op == "aten.relu" ? 0 : local(n.inputs[1]));
      locals.push_back(n.outputs[0]);
    }
    w.push_back(static_cast<uint32_t>(sg.outputs.size()));
    for (ValueId o : sg.outputs) w.push_back(local(o));
    std::vector<uint8_t> bytes(w.size() * 4);
    std::memcpy(bytes.data(), w.data(), bytes.size());
    return bytes;
  }
  Error is_available(const BackendSettings&) const override {
    return unavailable_.empty() ? Error() : Error(ErrorCode::NotFound, unavailable_);
  }
  Result<std::unique_ptr<DelegateHandle>> init(std::span<const uint8_t> payload,
                                               std::span<const std::span<const uint8_t>> constants,
                                               std::span<const TensorType> inputs,
                                               std::span<const TensorType> outputs,
                                               const DelegateOptions& /*options*/) const override {
    if (fail_init_) return Error(ErrorCode::InvalidProgram, "payload rejected by the test backend");
    size_t pos = 0;
    auto next = [&](uint32_t& v) {
      if (pos + 4 > payload.size()) return false;
      std::memcpy(&v, payload.data() + pos, 4);
      pos += 4;
      return true;
    };
    auto h = std::make_unique<EwHandle>();
    uint32_t nconst = 0, nops = 0, nout = 0;
    if (!next(h->num_inputs) || !next(nconst) || !next(nops) || h->num_inputs != inputs.size() || inputs.empty() ||
        nconst != constants.size()) {
      return Error(ErrorCode::InvalidProgram, "bad header");
    }
    h->numel = static_cast<size_t>(inputs[0].numel());
    for (const auto& c : constants) {
      if (c.size() != h->numel * 4) return Error(ErrorCode::InvalidProgram, "constant size mismatch");
    }
    h->num_inputs += nconst;  // constants are locals right after the inputs
    for (uint32_t k = 0; k < nops; ++k) {
      EwOp op{};
      if (!next(op.kind) || !next(op.a) || !next(op.b) || op.kind > 1 || op.a >= h->num_inputs + k ||
          op.b >= h->num_inputs + k) {
        return Error(ErrorCode::InvalidProgram, "bad op");
      }
      h->ops.push_back(op);
    }
    if (!next(nout) || nout != outputs.size()) return Error(ErrorCode::InvalidProgram, "bad outputs");
    for (uint32_t k = 0; k < nout; ++k) {
      uint32_t l = 0;
      if (!next(l) || l >= h->num_inputs + nops) return Error(ErrorCode::InvalidProgram, "bad output");
      h->outputs.push_back(l);
    }
    for (const auto& t : inputs) {
      if (static_cast<size_t>(t.numel()) != h->numel) return Error(ErrorCode::InvalidProgram, "shape mismatch");
    }
    for (const auto& t : outputs) {
      if (static_cast<size_t>(t.numel()) != h->numel) return Error(ErrorCode::InvalidProgram, "shape mismatch");
    }
    h->locals.assign(h->num_inputs + nops, std::vector<float>(h->numel));
    for (size_t k = 0; k < constants.size(); ++k) {
      std::memcpy(h->locals[inputs.size() + k].data(), constants[k].data(), h->numel * 4);
    }
    ++inits;
    return std::unique_ptr<DelegateHandle>(std::move(h));
  }
  Error execute(DelegateHandle& handle, std::span<const Tensor* const> inputs,
                std::span<Tensor* const> outputs) const override {
    auto& h = static_cast<EwHandle&>(handle);
    for (size_t i = 0; i < inputs.size(); ++i) std::memcpy(h.locals[i].data(), inputs[i]->data, h.numel * 4);
    for (size_t k = 0; k < h.ops.size(); ++k) {
      auto& out = h.locals[h.num_inputs + k];
      const auto& a = h.locals[h.ops[k].a];
      const auto& b = h.locals[h.ops[k].b];
      for (size_t e = 0; e < h.numel; ++e) out[e] = h.ops[k].kind == 0 ? std::max(a[e], 0.0f) : a[e] + b[e];
    }
    for (size_t o = 0; o < outputs.size(); ++o) std::memcpy(outputs[o]->data, h.locals[h.outputs[o]].data(), h.numel * 4);
    ++executes;
    return {};
  }
  mutable int inits = 0;
  mutable int executes = 0;

 private:
  std::string name_, unavailable_;
  bool fail_init_;
};

// "test_build" / "test_build_group": test_ew whose check_build refuses every segment holding a
// node whose debug name starts with "nobuild", naming that node ("test_build") or not
// ("test_build_group", SIZE_MAX: the partitioner must then refuse the whole segment).
class RefusingBackend : public EwBackend {
 public:
  RefusingBackend(std::string name, bool names_node) : EwBackend(std::move(name)), names_node_(names_node) {}
  Error check_build(const Subgraph& sg, std::span<const uint8_t>, size_t* node_at_fault, bool* checked) const override {
    ++checks;
    *node_at_fault = SIZE_MAX;
    *checked = true;
    for (size_t k = 0; k < sg.nodes.size(); ++k) {
      if (sg.graph->nodes()[sg.nodes[k]].debug_name.rfind("nobuild", 0) == 0) {
        if (names_node_) *node_at_fault = k;
        return Error(ErrorCode::NotSupported, "the test device cannot build node " + std::to_string(k));
      }
    }
    return {};
  }
  mutable int checks = 0;

 private:
  bool names_node_;
};

EwBackend* test_backend() {
  static EwBackend* b = [] {
    auto owned = std::make_unique<EwBackend>("test_ew");
    EwBackend* raw = owned.get();
    register_backend(std::move(owned));
    register_backend(std::make_unique<EwBackend>("test_unavailable", "no test device on this machine"));
    register_backend(std::make_unique<EwBackend>("test_initfail", "", true));
    register_backend(std::make_unique<RefusingBackend>("test_build", true));
    register_backend(std::make_unique<RefusingBackend>("test_build_group", false));
    return raw;
  }();
  return b;
}

// A hand-built program: y = <backend>(x) through one DelegateCall with a 12-byte payload segment
// (a relu in test_ew's format), x and y float32[4].
std::vector<uint8_t> hand_built_delegate(const std::string& backend) {
  const std::vector<uint32_t> words = {1, 0, 1, 0, 0, 0, 1, 1};
  std::vector<uint8_t> payload(words.size() * 4);
  std::memcpy(payload.data(), words.data(), payload.size());
  auto build = [&](uint64_t seg_offset, flatbuffers::FlatBufferBuilder& b) {
    b.ForceDefaults(true);
    auto x = fb::CreateTensor(b, fb::DType::Float32, b.CreateVector(std::vector<int64_t>{4}), 0, -1, 0, b.CreateString("x"));
    auto y = fb::CreateTensor(b, fb::DType::Float32, b.CreateVector(std::vector<int64_t>{4}), 0, -1, 64);
    auto call = fb::CreateDelegateCall(b, b.CreateString(backend), 0, b.CreateVector(std::vector<int32_t>{0}),
                                       b.CreateVector(std::vector<int32_t>{1}));
    auto entry = fb::CreateInstructionEntry(b, fb::Instruction::DelegateCall, call.Union());
    auto method = fb::CreateMethod(b, b.CreateString("forward"), b.CreateVector({x, y}),
                                   b.CreateVector(std::vector<int32_t>{0}), b.CreateVector(std::vector<int32_t>{1}),
                                   b.CreateVector({entry}), 128);
    auto seg = fb::CreateSegment(b, seg_offset, payload.size(), 1);
    fb::FinishProgramBuffer(b, fb::CreateProgram(b, kFormatVersion, b.CreateVector({method}), 0, b.CreateVector({seg})));
  };
  flatbuffers::FlatBufferBuilder probe;
  build(0, probe);
  const uint64_t seg_offset = (sizeof(FileHeader) + probe.GetSize() + kSegmentAlignment - 1) / kSegmentAlignment * kSegmentAlignment;
  flatbuffers::FlatBufferBuilder b;
  build(seg_offset, b);
  EXPECT_EQ(b.GetSize(), probe.GetSize());
  std::vector<uint8_t> file(seg_offset + payload.size(), 0);
  FileHeader h{};
  std::memcpy(h.magic, kFileMagic, sizeof(kFileMagic));
  h.version = kFormatVersion;
  h.header_size = sizeof(FileHeader);
  h.flatbuffer_offset = sizeof(FileHeader);
  h.flatbuffer_size = b.GetSize();
  h.segments_offset = seg_offset;
  h.file_size = file.size();
  std::memcpy(file.data(), &h, sizeof(h));
  std::memcpy(file.data() + sizeof(h), b.GetBufferPointer(), b.GetSize());
  std::memcpy(file.data() + seg_offset, payload.data(), payload.size());
  return file;
}

TEST(Delegate, HandBuiltDelegateCallRunsThroughARegisteredBackend) {
  test_backend();
  const auto file = hand_built_delegate("test_ew");
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(file));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  EXPECT_EQ(method.meta().num_delegate_calls, 1u);
  EXPECT_EQ(method.meta().num_kernel_calls, 0u);
  std::vector<float> x = {-1.0f, 2.0f, -3.0f, 4.0f};
  KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute({Tensor{DType::Float32, {4}, x.data()}}));
  const float* y = outs[0].data_as<float>();
  EXPECT_EQ(std::vector<float>(y, y + 4), (std::vector<float>{0.0f, 2.0f, 0.0f, 4.0f}));
}

TEST(Delegate, BackendNotCompiledInIsNotFoundNamingIt) {
  const auto file = hand_built_delegate("nosuch");
  auto p = Program::load_from_buffer(file);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), ErrorCode::NotFound);
  EXPECT_NE(p.error().message().find("backend 'nosuch' is not compiled into this runtime"), std::string::npos)
      << p.error().message();
}

TEST(Delegate, UnavailableBackendIsNotFoundWithItsReason) {
  test_backend();
  auto p = Program::load_from_buffer(hand_built_delegate("test_unavailable"));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), ErrorCode::NotFound);
  EXPECT_NE(p.error().message().find("'test_unavailable'"), std::string::npos) << p.error().message();
  EXPECT_NE(p.error().message().find("no test device on this machine"), std::string::npos) << p.error().message();
}

TEST(Delegate, InitFailureIsAnErrorValue) {
  test_backend();
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(hand_built_delegate("test_initfail")));
  auto m = program->load_method("forward");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), ErrorCode::InvalidProgram);
  EXPECT_NE(m.error().message().find("payload rejected by the test backend"), std::string::npos) << m.error().message();
}

TEST(Delegate, BadSegmentIndexIsInvalidProgram) {
  test_backend();
  auto file = hand_built_delegate("test_ew");
  FileHeader h{};
  std::memcpy(&h, file.data(), sizeof(h));
  auto* prog = fb::GetMutableProgram(file.data() + h.flatbuffer_offset);
  auto* entry = prog->mutable_methods()->GetMutableObject(0)->mutable_instructions()->GetMutableObject(0);
  auto* call = static_cast<fb::DelegateCall*>(entry->mutable_instr());
  ASSERT_TRUE(call->mutate_segment(7));
  auto p = Program::load_from_buffer(file);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram) << p.error().to_string();
  // Kind 0 (constants) is not a payload segment.
  ASSERT_TRUE(call->mutate_segment(0));
  ASSERT_TRUE(prog->mutable_segments()->GetMutableObject(0)->mutate_kind(0));
  p = Program::load_from_buffer(file);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram) << p.error().to_string();
}

// y = relu(add(relu(relu(x)), c)) * ... : see each test for the graph.
TEST(Partitioner, ChainsAreOneSegmentAndDeclinedNodesAreReported) {
  test_backend();
  // r1 = relu(x); r2 = relu(r1); m = add(r2, x, alpha=2) [declined]; a = add(m, c); y = relu(a)
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {2, 3}});
  KILN_ASSERT_OK_AND_ASSIGN(c, g.add_constant("c", {DType::Float32, {2, 3}}, float_bytes(pattern(6, 3))));
  KILN_ASSERT_OK_AND_ASSIGN(r1, g.add_node("aten.relu", {x}, {}, "r1"));
  KILN_ASSERT_OK_AND_ASSIGN(r2, g.add_node("aten.relu", {r1[0]}, {}, "r2"));
  KILN_ASSERT_OK_AND_ASSIGN(m, g.add_node("aten.add", {r2[0], x}, {{"alpha", 2.0}}, "m"));
  KILN_ASSERT_OK_AND_ASSIGN(a, g.add_node("aten.add", {m[0], c}, {}, "a"));
  KILN_ASSERT_OK_AND_ASSIGN(y, g.add_node("aten.relu", {a[0]}, {}, "y"));
  ASSERT_TRUE(g.set_outputs({y[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", g).ok());
  CompileOptions opts;
  opts.backends = {"test_ew"};
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile(opts));
  const DelegationReport& d = compiled.methods[0].delegation;
  ASSERT_EQ(d.backends.size(), 1u);
  EXPECT_EQ(d.backends[0].segments, 2u);
  EXPECT_EQ(d.backends[0].nodes, 4u);
  EXPECT_EQ(d.backends[0].constant_bytes, 24u);
  ASSERT_EQ(d.cpu_ops.size(), 1u);
  EXPECT_EQ(d.cpu_ops[0].op, "aten.add");
  EXPECT_EQ(d.cpu_ops[0].count, 1u);
  ASSERT_EQ(d.cpu_ops[0].reasons.size(), 1u);
  EXPECT_EQ(d.cpu_ops[0].reasons[0].second, "alpha != 1");
  const std::string text = compiled.report();
  EXPECT_NE(text.find("test_ew: 2 segment(s), 4 node(s)"), std::string::npos) << text;
  EXPECT_NE(text.find("aten.add x1"), std::string::npos) << text;
  EXPECT_NE(text.find("test_ew: alpha != 1"), std::string::npos) << text;

  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  EXPECT_EQ(method.meta().num_delegate_calls, 2u);
  EXPECT_EQ(method.meta().num_kernel_calls, 1u);
  const auto xv = pattern(6, 9), cv = pattern(6, 3);
  std::vector<float> xin = xv;
  const int before = test_backend()->executes;
  KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute({Tensor{DType::Float32, {2, 3}, xin.data()}}));
  EXPECT_EQ(test_backend()->executes - before, 2);
  for (size_t i = 0; i < 6; ++i) {
    const float expect = std::max(std::max(xv[i], 0.0f) + 2.0f * xv[i] + cv[i], 0.0f);
    EXPECT_FLOAT_EQ(outs[0].data_as<float>()[i], expect) << i;
  }
}

TEST(Partitioner, NeverMergesAcrossAPathThroughTheCpu) {
  test_backend();
  // r = relu(x); m = add(r, x, alpha=2) [CPU]; a = add(r, m): merging a into r's segment would make
  // a cycle r-segment -> mul -> r-segment, so they must stay two segments.
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {4}});
  KILN_ASSERT_OK_AND_ASSIGN(r, g.add_node("aten.relu", {x}, {}));
  KILN_ASSERT_OK_AND_ASSIGN(m, g.add_node("aten.add", {r[0], x}, {{"alpha", 2.0}}));
  KILN_ASSERT_OK_AND_ASSIGN(a, g.add_node("aten.add", {r[0], m[0]}, {}));
  ASSERT_TRUE(g.set_outputs({a[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", g).ok());
  CompileOptions opts;
  opts.backends = {"test_ew"};
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile(opts));
  EXPECT_EQ(compiled.methods[0].delegation.backends[0].segments, 2u);
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  std::vector<float> xin = {-2.0f, -0.5f, 1.5f, 3.0f};
  KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute({Tensor{DType::Float32, {4}, xin.data()}}));
  for (size_t i = 0; i < 4; ++i) {
    const float rr = std::max(xin[i], 0.0f);
    EXPECT_FLOAT_EQ(outs[0].data_as<float>()[i], rr + (rr + 2.0f * xin[i])) << i;
  }
}

TEST(Partitioner, RequireDelegationListsEveryDeclinedNode) {
  test_backend();
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {4}});
  KILN_ASSERT_OK_AND_ASSIGN(r, g.add_node("aten.relu", {x}, {}, "block.relu"));
  Attributes alpha;
  alpha.set("alpha", 10.0);
  KILN_ASSERT_OK_AND_ASSIGN(a, g.add_node("aten.add", {r[0], x}, alpha, "block.add"));
  ValueId one = g.add_input("one", {DType::Float32, {1}});
  KILN_ASSERT_OK_AND_ASSIGN(m, g.add_node("aten.add", {a[0], one}, {}, "block.bcast"));
  ASSERT_TRUE(g.set_outputs({m[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", g).ok());
  CompileOptions opts;
  opts.require_delegation = "test_ew";
  auto compiled = pb.compile(opts);
  ASSERT_FALSE(compiled.ok());
  EXPECT_EQ(compiled.error().code(), ErrorCode::NotSupported);
  const std::string& msg = compiled.error().message();
  EXPECT_NE(msg.find("2 node(s) not delegated to required backend 'test_ew'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("aten.add (block.add): alpha != 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("aten.add (block.bcast): no broadcasting"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("block.relu"), std::string::npos) << msg;

  CompileOptions unknown;
  unknown.backends = {"nosuch"};
  auto c2 = pb.compile(unknown);
  ASSERT_FALSE(c2.ok());
  EXPECT_EQ(c2.error().code(), ErrorCode::NotFound);
  EXPECT_NE(c2.error().message().find("'nosuch'"), std::string::npos);
}

// Support decided by building (Backend::check_build, docs/delegation.md): c = add(x, k);
// b = relu(c) [its build fails]; d = add(b, k); y = relu(d). y = relu(relu(x + k) + k).
Result<CompiledProgram> compile_with_build_check(const std::vector<std::string>& backends) {
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {2, 3}});
  auto k = g.add_constant("k", {DType::Float32, {2, 3}}, float_bytes(pattern(6, 3)));
  if (!k.ok()) return k.error();
  auto c = g.add_node("aten.add", {x, k.value()}, {}, "c");
  if (!c.ok()) return c.error();
  auto b = g.add_node("aten.relu", {c.value()[0]}, {}, "nobuild.b");
  if (!b.ok()) return b.error();
  auto d = g.add_node("aten.add", {b.value()[0], k.value()}, {}, "d");
  if (!d.ok()) return d.error();
  auto y = g.add_node("aten.relu", {d.value()[0]}, {}, "y");
  if (!y.ok()) return y.error();
  KILN_RETURN_IF_ERROR(g.set_outputs({y.value()[0]}));
  ProgramBuilder pb;
  KILN_RETURN_IF_ERROR(pb.add_method("forward", g));
  CompileOptions opts;
  opts.backends = backends;
  return pb.compile(opts);
}

void expect_runs_right(const CompiledProgram& compiled) {
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  const auto xv = pattern(6, 9), kv = pattern(6, 3);
  std::vector<float> xin = xv;
  KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute({Tensor{DType::Float32, {2, 3}, xin.data()}}));
  for (size_t i = 0; i < 6; ++i) {
    const float expect = std::max(std::max(xv[i] + kv[i], 0.0f) + kv[i], 0.0f);
    EXPECT_FLOAT_EQ(outs[0].data_as<float>()[i], expect) << i;
  }
}

TEST(Partitioner, ANodeWhoseBuildFailsRunsOnTheCpuWithTheReasonAndTheRestDelegates) {
  test_backend();
  KILN_ASSERT_OK_AND_ASSIGN(compiled, compile_with_build_check({"test_build"}));
  const DelegationReport& d = compiled.methods[0].delegation;
  ASSERT_EQ(d.backends.size(), 1u);
  EXPECT_EQ(d.backends[0].segments, 2u);  // c, then d + y: the refused relu splits the chain
  EXPECT_EQ(d.backends[0].nodes, 3u);
  ASSERT_EQ(d.cpu_ops.size(), 1u);
  EXPECT_EQ(d.cpu_ops[0].op, "aten.relu");
  EXPECT_EQ(d.cpu_ops[0].count, 1u);
  ASSERT_EQ(d.cpu_ops[0].reasons.size(), 1u);
  EXPECT_EQ(d.cpu_ops[0].reasons[0].first, "test_build");
  EXPECT_EQ(d.cpu_ops[0].reasons[0].second, "the test device cannot build node 1");  // its place in {c, b, d, y}
  expect_runs_right(compiled);
}

TEST(Partitioner, ABuildFailureThatNamesNoNodeRefusesTheWholeSegment) {
  test_backend();
  KILN_ASSERT_OK_AND_ASSIGN(compiled, compile_with_build_check({"test_build_group"}));
  const DelegationReport& d = compiled.methods[0].delegation;
  EXPECT_EQ(d.backends[0].segments, 0u);
  EXPECT_EQ(d.backends[0].nodes, 0u);
  ASSERT_EQ(d.cpu_ops.size(), 2u);  // aten.add x2, aten.relu x2
  for (const auto& c : d.cpu_ops) {
    EXPECT_EQ(c.count, 2u) << c.op;
    ASSERT_EQ(c.reasons.size(), 1u) << c.op;
    EXPECT_EQ(c.reasons[0].second, "the test device cannot build node 1 (in a segment of 4 nodes)") << c.op;
  }
  expect_runs_right(compiled);
}

TEST(Partitioner, ANodeOneBackendCannotBuildGoesToTheNext) {
  test_backend();
  KILN_ASSERT_OK_AND_ASSIGN(compiled, compile_with_build_check({"test_build", "test_ew"}));
  const DelegationReport& d = compiled.methods[0].delegation;
  ASSERT_EQ(d.backends.size(), 2u);
  EXPECT_EQ(d.backends[0].nodes, 3u);
  EXPECT_EQ(d.backends[1].nodes, 1u);  // the relu test_build refused
  EXPECT_TRUE(d.cpu_ops.empty());
  expect_runs_right(compiled);
}

TEST(Partitioner, TheDefaultBuildCheckRunsInitAndRefusesWhatFails) {
  test_backend();
  // test_initfail's init rejects every payload: the default check_build (init + destroy) refuses
  // the segment, so nothing is delegated and the program loads (it would not, delegated).
  KILN_ASSERT_OK_AND_ASSIGN(compiled, compile_with_build_check({"test_initfail"}));
  const DelegationReport& d = compiled.methods[0].delegation;
  EXPECT_EQ(d.backends[0].segments, 0u);
  ASSERT_FALSE(d.cpu_ops.empty());
  EXPECT_NE(d.cpu_ops[0].reasons[0].second.find("payload rejected by the test backend"), std::string::npos)
      << d.cpu_ops[0].reasons[0].second;
  expect_runs_right(compiled);
  // An unavailable backend is not checked (nothing to build with): lowering decides alone.
  KILN_ASSERT_OK_AND_ASSIGN(unavailable, compile_with_build_check({"test_unavailable"}));
  EXPECT_EQ(unavailable.methods[0].delegation.backends[0].nodes, 4u);
}

}  // namespace
}  // namespace kiln

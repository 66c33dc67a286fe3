// The fusion tables (src/ir/fusion.h) are the one description of which ops fuse into which. These
// tests fail when anything that decides about fusion disagrees with them: runs_in_place, the cpu
// kernels' post_op_of, the memory planner (in-place aliasing, residual-add liveness), the loader's
// aliasing check and the runtime's fusion offer (detail::fusion_offer), for every op of the
// epilogue table and a set of ops outside it, after every producer and after ops that are not
// producers. End to end, what the tables offer fuses in the cpu convolution and linear kernels
// and gives results bit-identical to the same program unfused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ir/fusion.h"
#include "ir/op_registry.h"
#include "kernels/cpu/post_op.h"
#include "program_generated.h"
#include "runtime/file_format.h"
#include "runtime/program_data.h"
#include "runtime_test_util.h"

namespace kiln {
namespace {

using testing::float_bytes;
using testing::pattern;
using V = std::vector<int64_t>;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

/// An op with its attributes as given (normalized by add_node / normalized()).
struct OpCase {
  std::string op;
  Attributes attrs;
};

Attributes normalized(const OpCase& c) {
  const OpDef* def = OpRegistry::get().find(c.op);
  EXPECT_NE(def, nullptr) << c.op;
  if (def == nullptr) return c.attrs;
  auto n = def->normalize_attributes(c.attrs);
  EXPECT_TRUE(n.ok()) << c.op << ": " << n.error().message();
  return n.ok() ? n.value() : c.attrs;
}

/// Attributes that a table op needs to be a valid node (clamp needs a bound).
Attributes sample_attrs(std::string_view op) {
  if (op == "aten.clamp") return {{"min", -0.25}};
  if (op == "aten.hardtanh") return {{"min_val", 0.0}, {"max_val", 6.0}};
  return {};
}

/// Every epilogue op of the table (valid attributes), the bounded ones with a NaN bound (not an
/// epilogue: the portable kernel runs them, in place), and single-input float ops outside the table.
std::vector<OpCase> unary_cases() {
  std::vector<OpCase> cases;
  for (const EpilogueOp& e : epilogue_ops()) cases.push_back({std::string(e.op), sample_attrs(e.op)});
  cases.push_back({"aten.clamp", {{"min", static_cast<double>(kNaN)}}});
  cases.push_back({"aten.hardtanh", {{"min_val", static_cast<double>(kNaN)}, {"max_val", 6.0}}});
  cases.push_back({"aten.clamp", {{"min", -1.0}, {"max", static_cast<double>(kNaN)}}});
  for (const char* op : {"aten.tanh", "aten.gelu", "aten.neg", "aten.abs", "aten.exp", "aten.elu", "aten.leaky_relu",
                         "aten.softplus", "aten.sqrt", "aten.log_sigmoid", "aten.mish", "aten.sin"}) {
    if (OpRegistry::get().find(op) != nullptr) cases.push_back({op, {}});
  }
  return cases;
}

std::string name_of(const OpCase& c) {
  std::string s = c.op;
  for (const auto& [k, v] : c.attrs.items()) {
    if (const double* d = std::get_if<double>(&v)) s += " " + k + "=" + std::to_string(*d);
  }
  return s;
}

/// What the table says, computed from its rows (not through fold_as): `next` may fold into
/// `producer` as an epilogue.
bool table_epilogue(std::string_view producer, const OpCase& next) {
  const FusionProducer* p = find_fusion_producer(producer);
  return p != nullptr && p->epilogue && epilogue_of(next.op, normalized(next)).has_value();
}
bool table_residual(std::string_view producer, const OpCase& add) {
  const FusionProducer* p = find_fusion_producer(producer);
  return p != nullptr && p->residual_add && add.op == "aten.add" && normalized(add).get_float("alpha", 1.0) == 1.0;
}
bool table_after_add(std::string_view producer, const OpCase& next) {
  const FusionProducer* p = find_fusion_producer(producer);
  return p != nullptr && p->residual_add && p->epilogue_after_add && epilogue_of(next.op, normalized(next)).has_value();
}

TEST(FusionTable, RowsAreWellFormed) {
  std::set<std::string_view> names;
  std::set<Epilogue::Kind> kinds;
  for (const EpilogueOp& e : epilogue_ops()) {
    EXPECT_TRUE(names.insert(e.op).second) << e.op << " twice";
    EXPECT_NE(e.kind, Epilogue::Kind::None) << e.op;
    kinds.insert(e.kind);
    const OpDef* def = OpRegistry::get().find(e.op);
    ASSERT_NE(def, nullptr) << e.op << " is not a registered op";
    EXPECT_EQ(def->inputs.size(), 1u) << e.op << ": an epilogue op has one tensor input";
    EXPECT_EQ(def->num_outputs, 1) << e.op;
    EXPECT_EQ(e.kind == Epilogue::Kind::Clamp, !e.lo_attr.empty() || !e.hi_attr.empty()) << e.op;
    EXPECT_TRUE(epilogue_of(e.op, normalized({std::string(e.op), sample_attrs(e.op)})).has_value()) << e.op;
  }
  // Every kind a kernel applies (post_op-inl.h's ApplyPostOp) is some op's.
  for (Epilogue::Kind k : {Epilogue::Kind::Relu, Epilogue::Kind::Clamp, Epilogue::Kind::Hardswish,
                           Epilogue::Kind::Hardsigmoid, Epilogue::Kind::Sigmoid, Epilogue::Kind::Silu}) {
    EXPECT_TRUE(kinds.count(k)) << "Epilogue::Kind " << static_cast<int>(k) << " has no op";
  }
  std::set<std::string_view> producers;
  for (const FusionProducer& p : fusion_producers()) {
    EXPECT_TRUE(producers.insert(p.op).second) << p.op << " twice";
    EXPECT_NE(OpRegistry::get().find(p.op), nullptr) << p.op;
    EXPECT_FALSE(find_epilogue_op(p.op)) << p.op;
    EXPECT_TRUE(!p.epilogue_after_add || p.residual_add) << p.op;
  }
  EXPECT_TRUE(find_fusion_producer("aten.convolution") && find_fusion_producer("aten.linear"));
}

TEST(FusionTable, EpilogueBoundsComeFromTheAttributes) {
  auto e = epilogue_of("aten.hardtanh", normalized({"aten.hardtanh", {}}));
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, (Epilogue{Epilogue::Kind::Clamp, -1.0f, 1.0f}));  // PyTorch's defaults
  e = epilogue_of("aten.hardtanh", normalized({"aten.hardtanh", {{"min_val", 0.0}, {"max_val", 6.0}}}));
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, (Epilogue{Epilogue::Kind::Clamp, 0.0f, 6.0f}));
  e = epilogue_of("aten.clamp", normalized({"aten.clamp", {{"min", -0.25}}}));
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, (Epilogue{Epilogue::Kind::Clamp, -0.25f, kInf}));
  e = epilogue_of("aten.clamp", normalized({"aten.clamp", {{"max", int64_t{3}}}}));
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, (Epilogue{Epilogue::Kind::Clamp, -kInf, 3.0f}));
  e = epilogue_of("aten.relu", {});
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, (Epilogue{Epilogue::Kind::Relu}));
  EXPECT_FALSE(epilogue_of("aten.clamp", normalized({"aten.clamp", {{"min", static_cast<double>(kNaN)}}})));
  EXPECT_FALSE(epilogue_of("aten.hardtanh", normalized({"aten.hardtanh", {{"max_val", static_cast<double>(kNaN)}}})));
  EXPECT_FALSE(epilogue_of("aten.tanh", {}));
  EXPECT_TRUE(is_residual_add("aten.add", normalized({"aten.add", {}})));
  EXPECT_FALSE(is_residual_add("aten.add", normalized({"aten.add", {{"alpha", 2.0}}})));
  EXPECT_FALSE(is_residual_add("aten.sub", normalized({"aten.sub", {}})));
  EXPECT_FALSE(is_residual_add("aten.mul", {}));
}

TEST(FusionTable, RunsInPlaceAndPostOpOfFollowTheTable) {
  for (const OpCase& c : unary_cases()) {
    const Attributes attrs = normalized(c);
    const EpilogueOp* row = find_epilogue_op(c.op);
    EXPECT_EQ(runs_in_place(c.op), row != nullptr && row->in_place) << name_of(c);
    const std::optional<Epilogue> e = epilogue_of(c.op, attrs);
    bool nan_bound = false;
    for (const auto& [k, v] : c.attrs.items()) nan_bound = nan_bound || (std::holds_alternative<double>(v) && std::isnan(std::get<double>(v)));
    EXPECT_EQ(e.has_value(), row != nullptr && !nan_bound) << name_of(c);
    cpu::PostOp p;
    p.kind = cpu::PostOp::Kind::Sigmoid;  // must be left alone when refused
    const bool took = cpu::post_op_of(c.op, attrs, &p);
    EXPECT_EQ(took, e.has_value()) << name_of(c) << ": cpu::post_op_of disagrees with the table";
    if (took) {
      EXPECT_EQ(p, *e) << name_of(c);
    } else {
      EXPECT_EQ(p.kind, cpu::PostOp::Kind::Sigmoid) << name_of(c);
    }
  }
}

// ---- graphs: x -> producer -> [binary with r] -> [unary] ----

struct Chain {
  std::string producer;          // aten.convolution, aten.linear, or a unary op that is no producer
  std::optional<OpCase> binary;  // of the producer's output (first) and r
  std::optional<OpCase> unary;   // on the last output
  bool expose_producer = false;  // the producer's output is a method output too (nothing fuses)
};

struct Built {
  Graph g;
  ValueId x = kNoValue, r = kNoValue, v = kNoValue, s = kNoValue, w = kNoValue;
  TensorType xt, vt;
};

Result<Built> build(const Chain& c) {
  Built b;
  Graph& g = b.g;
  if (c.producer == "aten.convolution") {  // 3x3 stride 2: the im2col GEMM path (packed weights)
    b.xt = {DType::Float32, {1, 8, 9, 11}};
    b.vt = {DType::Float32, {1, 12, 5, 6}};
  } else if (c.producer == "aten.linear") {
    b.xt = {DType::Float32, {5, 16}};
    b.vt = {DType::Float32, {5, 24}};
  } else {
    b.xt = b.vt = {DType::Float32, {4, 30}};
  }
  b.x = g.add_input("x", b.xt);
  Result<std::vector<ValueId>> v = Error(ErrorCode::Internal, "unset");
  if (c.producer == "aten.convolution") {
    std::vector<float> wv = pattern(12 * 8 * 9, 7);
    for (float& f : wv) f *= 0.3f;
    auto w = g.add_constant("w", {DType::Float32, {12, 8, 3, 3}}, float_bytes(wv));
    auto bias = g.add_constant("b", {DType::Float32, {12}}, float_bytes(pattern(12, 8)));
    if (!w.ok()) return w.error();
    if (!bias.ok()) return bias.error();
    v = g.add_node("aten.convolution", {b.x, w.value(), bias.value()},
                   {{"stride", V{2, 2}}, {"padding", V{1, 1}}, {"dilation", V{1, 1}}, {"transposed", false},
                    {"output_padding", V{0, 0}}, {"groups", int64_t{1}}},
                   "producer");
  } else if (c.producer == "aten.linear") {
    std::vector<float> wv = pattern(24 * 16, 7);
    for (float& f : wv) f *= 0.3f;
    auto w = g.add_constant("w", {DType::Float32, {24, 16}}, float_bytes(wv));
    auto bias = g.add_constant("b", {DType::Float32, {24}}, float_bytes(pattern(24, 8)));
    if (!w.ok()) return w.error();
    if (!bias.ok()) return bias.error();
    v = g.add_node("aten.linear", {b.x, w.value(), bias.value()}, {}, "producer");
  } else {
    v = g.add_node(c.producer, {b.x}, {}, "producer");
  }
  if (!v.ok()) return v.error();
  b.v = v.value()[0];
  ValueId last = b.v;
  if (c.binary) {
    b.r = g.add_input("r", b.vt);
    auto s = g.add_node(c.binary->op, {b.v, b.r}, c.binary->attrs, "binary");
    if (!s.ok()) return s.error();
    last = b.s = s.value()[0];
  }
  if (c.unary) {
    auto w = g.add_node(c.unary->op, {last}, c.unary->attrs, "unary");
    if (!w.ok()) return w.error();
    last = b.w = w.value()[0];
  }
  std::vector<ValueId> outs{last};
  if (c.expose_producer) outs.push_back(b.v);
  KILN_RETURN_IF_ERROR(g.set_outputs(outs));
  return b;
}

Result<std::vector<uint8_t>> compile(Graph g) {
  ProgramBuilder pb;
  KILN_RETURN_IF_ERROR(pb.add_method("forward", std::move(g)));
  auto compiled = pb.compile();
  if (!compiled.ok()) return compiled.error();
  return std::move(compiled.value().bytes);
}

const char* const kProducers[] = {"aten.convolution", "aten.linear", "aten.neg"};  // neg: no producer

std::vector<OpCase> binary_cases() {
  return {{"aten.add", {}}, {"aten.add", {{"alpha", 1.0}}}, {"aten.add", {{"alpha", 2.0}}}, {"aten.sub", {}},
          {"aten.mul", {}}};
}

const PlannedValue* planned(const MemoryPlan& plan, ValueId v) {
  for (const PlannedValue& p : plan.values) {
    if (p.value == v) return &p;
  }
  return nullptr;
}

TEST(FusionTable, PlannerSharesBuffersExactlyAsTheTableSays) {
  for (const char* producer : kProducers) {
    for (const OpCase& u : unary_cases()) {
      const std::string what = std::string(producer) + " -> " + name_of(u);
      auto b = build({producer, std::nullopt, u});
      ASSERT_TRUE(b.ok()) << what << ": " << b.error().message();
      const MemoryPlan plan = plan_memory(b->g);
      const PlannedValue* pv = planned(plan, b->v);
      const PlannedValue* pw = planned(plan, b->w);
      ASSERT_TRUE(pv && pw) << what;
      const FusionProducer* p = find_fusion_producer(producer);
      const bool share = p != nullptr && p->epilogue && runs_in_place(u.op);
      EXPECT_EQ(pv->offset == pw->offset, share) << what << ": the planner disagrees with the table";
    }
  }
}

TEST(FusionTable, PlannerKeepsResidualInputsLiveExactlyAsTheTableSays) {
  for (const char* producer : kProducers) {
    for (const OpCase& add : binary_cases()) {
      for (const OpCase& u : unary_cases()) {
        const std::string what = std::string(producer) + " -> " + name_of(add) + " -> " + name_of(u);
        auto b = build({producer, add, u});
        ASSERT_TRUE(b.ok()) << what << ": " << b.error().message();
        const MemoryPlan plan = plan_memory(b->g);
        const PlannedValue* px = planned(plan, b->x);
        const PlannedValue* ps = planned(plan, b->s);
        const PlannedValue* pw = planned(plan, b->w);
        ASSERT_TRUE(px && ps && pw) << what;
        const bool residual = table_residual(producer, add);
        // The producer (node 0) reads x; a residual add it may fuse (node 1) keeps x live through it.
        EXPECT_EQ(px->last_use, residual ? 1 : 0) << what << ": residual liveness disagrees with the table";
        const FusionProducer* p = find_fusion_producer(producer);
        const bool share = residual && p->epilogue_after_add && runs_in_place(u.op);
        EXPECT_EQ(ps->offset == pw->offset, share) << what << ": in-place after the add disagrees with the table";
      }
    }
  }
}

/// The loaded plan of a compiled one-method program (the loader's own verification).
Result<std::unique_ptr<detail::ProgramData>> load_plan(const std::vector<uint8_t>& bytes) {
  auto fb = detail::FileBytes::copy(bytes);
  if (!fb.ok()) return fb.error();
  return detail::verify_and_plan(std::move(fb.value()), false, BackendSettings{});
}

std::vector<int> readers_of(const detail::MethodPlan& plan) {
  std::vector<int> readers(plan.value_types.size(), 0);
  for (const auto& ins : plan.instructions) {
    for (int32_t v : ins.args) {
      if (v >= 0) ++readers[static_cast<size_t>(v)];
    }
  }
  return readers;
}

TEST(FusionTable, RuntimeOffersExactlyWhatTheTableSays) {
  for (const char* producer : kProducers) {
    for (const OpCase& u : unary_cases()) {
      for (bool expose : {false, true}) {
        const std::string what = std::string(producer) + " -> " + name_of(u) + (expose ? " (exposed)" : "");
        auto b = build({producer, std::nullopt, u, expose});
        ASSERT_TRUE(b.ok()) << what << ": " << b.error().message();
        KILN_ASSERT_OK_AND_ASSIGN(bytes, compile(std::move(b->g)));
        KILN_ASSERT_OK_AND_ASSIGN(data, load_plan(bytes));
        const detail::MethodPlan& plan = data->methods[0];
        ASSERT_EQ(plan.instructions.size(), 2u) << what;
        ASSERT_EQ(plan.instructions[0].op, producer) << what;
        const detail::FusionOffer offer = detail::fusion_offer(plan, 0, readers_of(plan));
        EXPECT_EQ(offer.next, !expose && table_epilogue(producer, u)) << what << ": the runtime disagrees with the table";
        EXPECT_EQ(offer.other, -1) << what;
        EXPECT_FALSE(offer.then) << what;
      }
    }
    for (const OpCase& add : binary_cases()) {
      for (const OpCase& u : unary_cases()) {
        const std::string what = std::string(producer) + " -> " + name_of(add) + " -> " + name_of(u);
        auto b = build({producer, add, u});
        ASSERT_TRUE(b.ok()) << what << ": " << b.error().message();
        KILN_ASSERT_OK_AND_ASSIGN(bytes, compile(std::move(b->g)));
        KILN_ASSERT_OK_AND_ASSIGN(data, load_plan(bytes));
        const detail::MethodPlan& plan = data->methods[0];
        ASSERT_EQ(plan.instructions.size(), 3u) << what;
        const std::vector<int> readers = readers_of(plan);
        const detail::FusionOffer offer = detail::fusion_offer(plan, 0, readers);
        const bool residual = table_residual(producer, add);
        EXPECT_EQ(offer.next, residual) << what << ": the runtime disagrees with the table";
        EXPECT_EQ(offer.other >= 0, residual) << what;
        EXPECT_EQ(offer.then, residual && table_after_add(producer, u)) << what;
        // The add is no producer: nothing folds into it.
        EXPECT_FALSE(detail::fusion_offer(plan, 1, readers).next) << what;
      }
    }
  }
}

fb::Program* mutable_program(std::vector<uint8_t>& bytes) {
  FileHeader h{};
  std::memcpy(&h, bytes.data(), sizeof(h));
  return fb::GetMutableProgram(bytes.data() + h.flatbuffer_offset);
}

TEST(FusionTable, LoaderAcceptsInPlaceExactlyForTheTable) {
  // x -> a = neg(x) -> op(a), then the file edited so that op's output is exactly a's bytes: the
  // loader accepts that for the table's in-place ops only.
  for (const OpCase& u : unary_cases()) {
    auto b = build({"aten.neg", std::nullopt, u});
    ASSERT_TRUE(b.ok()) << name_of(u) << ": " << b.error().message();
    KILN_ASSERT_OK_AND_ASSIGN(bytes, compile(std::move(b->g)));
    fb::Method* m = mutable_program(bytes)->mutable_methods()->GetMutableObject(0);
    ASSERT_EQ(m->instructions()->size(), 2u);
    const fb::KernelCall* call = m->instructions()->Get(1)->instr_as_KernelCall();
    ASSERT_NE(call, nullptr);
    ASSERT_EQ(call->op()->str(), u.op);
    const auto in = static_cast<flatbuffers::uoffset_t>(call->args()->Get(0));
    const auto out = static_cast<flatbuffers::uoffset_t>(call->outputs()->Get(0));
    const int64_t off = m->values()->Get(in)->arena_offset();
    ASSERT_TRUE(m->mutable_values()->GetMutableObject(out)->mutate_arena_offset(off));
    auto program = Program::load_from_buffer(bytes);
    EXPECT_EQ(program.ok(), runs_in_place(u.op)) << name_of(u) << ": the loader disagrees with the table"
                                                 << (program.ok() ? "" : ": " + program.error().message());
  }
}

// ---- end to end: what the tables offer fuses, bit-identical to unfused ----

struct Outcome {
  std::vector<float> out;
  size_t fused = 0;
  bool cpu_producer = false;  // the producer ran an optimized cpu kernel (those are the ones that fuse)
};

Result<Outcome> run(const std::vector<uint8_t>& bytes, const Built& b, bool portable) {
  auto program = Program::load_from_buffer(bytes);
  if (!program.ok()) return program.error();
  ThreadPool one(1);
  MethodOptions mo;
  mo.portable_kernels_only = portable;
  mo.pool = &one;
  auto method = program.value()->load_method("forward", mo);
  if (!method.ok()) return method.error();
  method->set_profiling(true);
  std::vector<float> x = pattern(static_cast<size_t>(b.xt.numel()), 3), r = pattern(static_cast<size_t>(b.vt.numel()), 5);
  x[1] = kNaN;
  std::vector<Tensor> in{Tensor{DType::Float32, b.xt.sizes, x.data()}};
  if (b.r != kNoValue) in.push_back(Tensor{DType::Float32, b.vt.sizes, r.data()});
  auto outs = method->execute(in);
  if (!outs.ok()) return outs.error();
  Outcome o;
  const Tensor& t = (*outs)[0];
  o.out.assign(t.data_as<float>(), t.data_as<float>() + t.numel());
  o.fused = method->num_fused_instructions();
  const auto prof = method->profile();
  o.cpu_producer = !prof.empty() && prof[0].index == 0 && prof[0].kernel == "cpu";
  return o;
}

void expect_fuses(const Chain& c, size_t want, const std::string& what) {
  auto fusable = build(c);
  ASSERT_TRUE(fusable.ok()) << what << ": " << fusable.error().message();
  Chain exposed = c;
  exposed.expose_producer = true;
  auto unfusable = build(exposed);
  ASSERT_TRUE(unfusable.ok());
  const Built& b = *fusable;
  KILN_ASSERT_OK_AND_ASSIGN(f_bytes, compile(std::move(fusable->g)));
  KILN_ASSERT_OK_AND_ASSIGN(u_bytes, compile(std::move(unfusable->g)));
  KILN_ASSERT_OK_AND_ASSIGN(fused, run(f_bytes, b, false));
  KILN_ASSERT_OK_AND_ASSIGN(plain, run(u_bytes, b, false));
  KILN_ASSERT_OK_AND_ASSIGN(ref, run(f_bytes, b, true));
  EXPECT_EQ(plain.fused, 0u) << what;
  EXPECT_EQ(ref.fused, 0u) << what;
  // Kernels fuse exactly what the runtime offers from the table (on these paths they take all of
  // it); a build or target without the optimized producer kernel runs the portable one, unfused.
  if (fused.cpu_producer) {
    EXPECT_EQ(fused.fused, want) << what << ": the kernels disagree with the table";
  } else {
    EXPECT_EQ(fused.fused, 0u) << what;
  }
  ASSERT_EQ(fused.out.size(), plain.out.size());
  EXPECT_EQ(std::memcmp(fused.out.data(), plain.out.data(), fused.out.size() * sizeof(float)), 0)
      << what << ": fused differs from unfused";
  double maxref = 0, maxerr = 0;
  for (size_t i = 0; i < ref.out.size(); ++i) {
    if (std::isnan(ref.out[i])) {
      EXPECT_TRUE(std::isnan(fused.out[i])) << what << " at " << i;
      continue;
    }
    maxref = std::max(maxref, std::fabs(static_cast<double>(ref.out[i])));
    maxerr = std::max(maxerr, std::fabs(static_cast<double>(fused.out[i]) - ref.out[i]));
  }
  EXPECT_LE(maxerr, 1e-4 * std::max(maxref, 1e-30)) << what << " vs the portable kernels";
}

TEST(FusionTable, ConvAndLinearFuseWhatTheTableOffersAndMatchUnfused) {
  for (const char* producer : {"aten.convolution", "aten.linear"}) {
    for (const OpCase& u : unary_cases()) {
      expect_fuses({producer, std::nullopt, u}, table_epilogue(producer, u) ? 1u : 0u,
                   std::string(producer) + " -> " + name_of(u));
    }
  }
}

TEST(FusionTable, ConvAddActivationFusesWhatTheTableOffersAndMatchesUnfused) {
  for (const char* producer : {"aten.convolution", "aten.linear"}) {
    for (const OpCase& add : binary_cases()) {
      for (const OpCase& u : unary_cases()) {
        const size_t want = table_residual(producer, add) ? (table_after_add(producer, u) ? 2u : 1u) : 0u;
        expect_fuses({producer, add, u}, want, std::string(producer) + " -> " + name_of(add) + " -> " + name_of(u));
      }
    }
  }
}

}  // namespace
}  // namespace kiln

// Symbolic sizes and state (format version 2; include/kiln/symbolic.h, docs/generative.md):
// SymExpr arithmetic and validation, a C++-built graph with a symbol and a KV-cache-like state
// (tests/cpp/kv_cache_program.h) compiled, loaded and run at several sizes against a plain C++
// reference, input checks that leave the state untouched, sessions (independent, reset, from two
// threads: Concurrency.* runs under ThreadSanitizer in scripts/sanitizers.sh), version-1 files,
// and the partitioner declining symbolic nodes for XNNPACK.
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "backends/backend.h"
#include "kv_cache_program.h"
#include "program_generated.h"
#include "runtime/file_format.h"
#include "runtime_test_util.h"

namespace kiln {
namespace {

using testing::KvReference;
using testing::kKvCapacity;
using testing::kKvDim;
using testing::pattern;

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

SymExpr C(int64_t v) { return SymExpr::constant(v); }
SymExpr S(int32_t i) { return SymExpr::symbol(i); }

int64_t eval_ok(const SymExpr& e, std::vector<int64_t> syms = {}) {
  auto v = e.eval(syms);
  EXPECT_TRUE(v.ok()) << v.error().to_string();
  return v.ok() ? v.value() : -999999;
}

// ---------------------------------------------------------------- SymExpr

TEST(SymExpr, ArithmeticWithPythonFloorSemantics) {
  EXPECT_EQ(eval_ok(C(7) + C(5)), 12);
  EXPECT_EQ(eval_ok(C(7) - C(12)), -5);
  EXPECT_EQ(eval_ok(C(-3) * C(4)), -12);
  // Python: 7 // 2 == 3, -7 // 2 == -4, 7 // -2 == -4, -7 // -2 == 3; % takes the divisor's sign.
  EXPECT_EQ(eval_ok(C(7).floordiv(C(2))), 3);
  EXPECT_EQ(eval_ok(C(-7).floordiv(C(2))), -4);
  EXPECT_EQ(eval_ok(C(7).floordiv(C(-2))), -4);
  EXPECT_EQ(eval_ok(C(-7).floordiv(C(-2))), 3);
  EXPECT_EQ(eval_ok(C(-8).floordiv(C(2))), -4);
  EXPECT_EQ(eval_ok(C(7).mod(C(2))), 1);
  EXPECT_EQ(eval_ok(C(-7).mod(C(2))), 1);
  EXPECT_EQ(eval_ok(C(7).mod(C(-2))), -1);
  EXPECT_EQ(eval_ok(C(-7).mod(C(-2))), -1);
  EXPECT_EQ(eval_ok(C(-8).mod(C(2))), 0);
  EXPECT_EQ(eval_ok(C(kI64Min).floordiv(C(2))), kI64Min / 2);
  EXPECT_EQ(eval_ok(C(kI64Min).mod(C(3))), 1);  // Python: -2**63 % 3 == 1
  EXPECT_EQ(eval_ok(C(3).min(C(-4))), -4);
  EXPECT_EQ(eval_ok(C(3).max(C(-4))), 3);
  // Symbols: (seq + 1) // 2 * 64 at seq = 1..9, and min(seq, 4).
  for (int64_t seq = 1; seq <= 9; ++seq) {
    EXPECT_EQ(eval_ok((S(0) + C(1)).floordiv(C(2)) * C(64), {seq}), (seq + 1) / 2 * 64);
    EXPECT_EQ(eval_ok(S(0).min(C(4)), {seq}), std::min<int64_t>(seq, 4));
    EXPECT_EQ(eval_ok(S(1) - S(0), {seq, 10}), 10 - seq);
  }
}

TEST(SymExpr, OverflowAndDivisionByZeroAreErrors) {
  auto expect_error = [](const SymExpr& e, const std::string& needle) {
    auto v = e.eval({});
    ASSERT_FALSE(v.ok()) << "gave " << v.value();
    EXPECT_EQ(v.error().code(), ErrorCode::InvalidArgument);
    EXPECT_NE(v.error().message().find(needle), std::string::npos) << v.error().message();
  };
  expect_error(C(kI64Max) + C(1), "overflow");
  expect_error(C(kI64Min) - C(1), "overflow");
  expect_error(C(int64_t{1} << 40) * C(int64_t{1} << 40), "overflow");
  expect_error(C(kI64Min) * C(-1), "overflow");
  expect_error(C(kI64Min).floordiv(C(-1)), "overflow");
  expect_error(C(kI64Min).mod(C(-1)), "overflow");
  expect_error(C(5).floordiv(C(0)), "division by zero");
  expect_error(C(5).mod(C(0)), "division by zero");
  expect_error(C(5).floordiv(C(3) - C(3)), "division by zero");
  // Just inside the range: no error.
  EXPECT_EQ(eval_ok(C(kI64Max - 1) + C(1)), kI64Max);
  EXPECT_EQ(eval_ok(C(kI64Min + 1) - C(1)), kI64Min);
}

TEST(SymExpr, ValidateRejectsMalformedStreams) {
  auto invalid = [](std::vector<int64_t> code, size_t nsym, const std::string& needle, bool eval_fails = true) {
    SCOPED_TRACE(needle);
    const SymExpr e = SymExpr::from_code(code);
    const Error err = e.validate(nsym);
    ASSERT_FALSE(err.ok());
    EXPECT_EQ(err.code(), ErrorCode::InvalidProgram);
    EXPECT_NE(err.message().find(needle), std::string::npos) << err.message();
    // Evaluating an unvalidated stream is an error value too (or, for a well-formed stream that
    // is only too long, its value), never a crash.
    std::vector<int64_t> syms(nsym, 3);
    EXPECT_EQ(e.eval(syms).ok(), !eval_fails);
    EXPECT_FALSE(e.to_string({}).empty());
  };
  invalid({}, 1, "0 tokens");
  invalid({SymExpr::Add}, 1, "without operands");
  invalid({SymExpr::Const}, 1, "missing operand");
  invalid({SymExpr::Sym}, 1, "missing operand");
  invalid({SymExpr::Const, 1, SymExpr::Const, 2}, 1, "leaves 2 values");
  invalid({SymExpr::Const, 1, SymExpr::Add}, 1, "without operands");
  invalid({99, 0}, 1, "unknown opcode 99");
  invalid({-1, 0}, 1, "unknown opcode -1");
  invalid({SymExpr::Sym, 1}, 1, "symbol index 1 out of range");
  invalid({SymExpr::Sym, -1}, 2, "symbol index -1 out of range");
  invalid({SymExpr::Sym, 0}, 0, "out of range");
  {
    std::vector<int64_t> deep;
    for (int i = 0; i < 65; ++i) deep.insert(deep.end(), {SymExpr::Const, i});
    for (int i = 0; i < 64; ++i) deep.push_back(SymExpr::Add);
    ASSERT_LE(deep.size(), kMaxSymExprTokens);
    invalid(deep, 1, "nests too deeply");
  }
  {
    std::vector<int64_t> long_code = {SymExpr::Const, 0};
    while (long_code.size() <= kMaxSymExprTokens) long_code.insert(long_code.end(), {SymExpr::Const, 1, SymExpr::Add});
    invalid(long_code, 1, "tokens (1..256 allowed)", /*eval_fails=*/false);
  }
  // The longest well-formed stream allowed is fine.
  std::vector<int64_t> ok = {SymExpr::Const, 0};
  while (ok.size() + 3 <= kMaxSymExprTokens) ok.insert(ok.end(), {SymExpr::Const, 1, SymExpr::Add});
  EXPECT_TRUE(SymExpr::from_code(ok).validate(0).ok());
  EXPECT_EQ(eval_ok(SymExpr::from_code(ok)), static_cast<int64_t>((ok.size() - 2) / 3));
  EXPECT_TRUE((S(0) * C(2) + S(1)).validate(2).ok());
}

TEST(SymExpr, ToStringAndShape) {
  const std::vector<SymbolDef> syms = {{"seq", 1, 32}, {"pos", 0, 100}};
  EXPECT_EQ(S(0).to_string(syms), "seq");
  EXPECT_EQ((S(0) * C(64)).to_string(syms), "seq * 64");
  EXPECT_EQ((S(0) + C(1)).floordiv(C(2)).to_string(syms), "(seq + 1) // 2");
  EXPECT_EQ((S(0) + S(1)).mod(C(8)).to_string(syms), "(seq + pos) % 8");
  EXPECT_EQ(S(0).max(C(4)).to_string(syms), "max(seq, 4)");
  EXPECT_EQ(S(1).min(S(0) - C(1)).to_string(syms), "min(pos, seq - 1)");
  EXPECT_EQ((S(0) + C(-1)).to_string(syms), "seq + (-1)");
  EXPECT_EQ(S(5).to_string(syms), "s5");  // an index without a name
  EXPECT_EQ(SymExpr::from_code({SymExpr::Add}).to_string(syms), "<malformed>");
  EXPECT_TRUE(C(3).is_constant());
  EXPECT_EQ(S(1).as_symbol(), 1);
  EXPECT_EQ((S(1) + C(0)).as_symbol(), -1);
  EXPECT_EQ(S(0) + C(1), S(0) + C(1));
  EXPECT_FALSE(S(0) + C(1) == C(1) + S(0));
}

TEST(SymExpr, CheckBindings) {
  // One symbol: its two corners, the midpoint and min + 1.
  const std::vector<SymbolDef> one = {{"seq", 1, 32}};
  EXPECT_EQ(check_bindings(one), (std::vector<std::vector<int64_t>>{{1}, {32}, {16}, {2}}));
  // min == max: min + 1 is clamped.
  const std::vector<SymbolDef> fixed = {{"n", 7, 7}};
  for (const auto& b : check_bindings(fixed)) EXPECT_EQ(b, std::vector<int64_t>{7});
  // Two symbols: four corners, then midpoint and low.
  const std::vector<SymbolDef> two = {{"a", 0, 10}, {"b", 4, 5}};
  const auto b2 = check_bindings(two);
  ASSERT_EQ(b2.size(), 6u);
  EXPECT_EQ(b2[0], (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(b2[3], (std::vector<int64_t>{10, 5}));
  EXPECT_EQ(b2[4], (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(b2[5], (std::vector<int64_t>{1, 5}));
  // More than six symbols: 2^6 corners, the seventh at its max in each.
  std::vector<SymbolDef> seven;
  for (int i = 0; i < 7; ++i) seven.push_back({"s" + std::to_string(i), 1, 2});
  const auto b7 = check_bindings(seven);
  ASSERT_EQ(b7.size(), 64u + 2u);
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(b7[i][6], 2);
  // No symbols: one empty corner (and two empty extras).
  for (const auto& b : check_bindings({})) EXPECT_TRUE(b.empty());
  // The extreme range allowed: no overflow in the midpoint.
  const std::vector<SymbolDef> big = {{"n", 0, kMaxSymbolValue}};
  EXPECT_EQ(check_bindings(big)[2][0], kMaxSymbolValue / 2);
}

TEST(SymExpr, EvalSizesAndSetIntAttribute) {
  std::vector<int64_t> sizes;
  ASSERT_TRUE(eval_sizes({C(1), S(0), S(0) * C(2)}, std::vector<int64_t>{3}, &sizes).ok());
  EXPECT_EQ(sizes, (std::vector<int64_t>{1, 3, 6}));
  const Error neg = eval_sizes({S(0) - C(5)}, std::vector<int64_t>{3}, &sizes);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.message().find("negative size -2"), std::string::npos) << neg.message();

  Attributes a{{"n", int64_t{4}}, {"end", 2.0}, {"size", std::vector<int64_t>{1, 2, 3}}, {"name", std::string("x")}};
  ASSERT_TRUE(set_int_attribute(a, "n", -1, 9).ok());
  EXPECT_EQ(std::get<int64_t>(*a.find("n")), 9);
  ASSERT_TRUE(set_int_attribute(a, "end", -1, 17).ok());  // a float Scalar takes the int's value
  EXPECT_EQ(std::get<double>(*a.find("end")), 17.0);
  ASSERT_TRUE(set_int_attribute(a, "size", 2, 30).ok());
  EXPECT_EQ(std::get<std::vector<int64_t>>(*a.find("size")), (std::vector<int64_t>{1, 2, 30}));
  EXPECT_FALSE(set_int_attribute(a, "missing", -1, 1).ok());
  EXPECT_FALSE(set_int_attribute(a, "size", 3, 1).ok());
  EXPECT_FALSE(set_int_attribute(a, "size", -1, 1).ok());
  EXPECT_FALSE(set_int_attribute(a, "n", 0, 1).ok());
  EXPECT_FALSE(set_int_attribute(a, "name", -1, 1).ok());
}

// ---------------------------------------------------------------- the KV-cache program

struct Call {
  int64_t seq = 1;
  int64_t pos = 0;
  uint32_t seed = 0;
  std::vector<float> x, gate;
  std::vector<int64_t> pos_v;
  Call(int64_t s, int64_t p, uint32_t sd) : seq(s), pos(p), seed(sd) {
    x = pattern(static_cast<size_t>(seq * kKvDim), seed);
    gate = pattern(static_cast<size_t>(seq), seed + 7777);
    pos_v = {pos};
  }
  std::vector<Tensor> inputs() {
    return {Tensor{DType::Float32, {1, seq, kKvDim}, x.data()}, Tensor{DType::Float32, {1, seq, 1}, gate.data()},
            Tensor{DType::Int64, {1}, pos_v.data()}};
  }
};

std::shared_ptr<Program> load_kv(const CompileOptions& options = {}) {
  auto bytes = testing::compile_kv_cache_program(options);
  EXPECT_TRUE(bytes.ok()) << bytes.error().to_string();
  if (!bytes.ok()) return nullptr;
  auto p = Program::load_from_buffer(bytes.value());
  EXPECT_TRUE(p.ok()) << p.error().to_string();
  return p.ok() ? p.value() : nullptr;
}

bool close(float a, float b) { return std::abs(a - b) <= 1e-4f * (1.0f + std::abs(b)); }

// Compares a call's outputs with the reference's; "" when equal.
std::string compare(const std::vector<Tensor>& outs, const KvReference::Outputs& want, int64_t seq) {
  if (outs.size() != 3) return "outputs: " + std::to_string(outs.size());
  if (outs[0].sizes != std::vector<int64_t>{1, seq, kKvDim}) return "hg sizes " + sizes_to_string(outs[0].sizes);
  if (outs[1].sizes != std::vector<int64_t>{1, kKvDim}) return "total sizes " + sizes_to_string(outs[1].sizes);
  if (outs[2].sizes != std::vector<int64_t>{1}) return "counter sizes " + sizes_to_string(outs[2].sizes);
  for (size_t i = 0; i < want.hg.size(); ++i) {
    if (!close(outs[0].data_as<float>()[i], want.hg[i])) {
      return "hg[" + std::to_string(i) + "] " + std::to_string(outs[0].data_as<float>()[i]) + " vs " + std::to_string(want.hg[i]);
    }
  }
  for (size_t i = 0; i < want.total.size(); ++i) {
    if (!close(outs[1].data_as<float>()[i], want.total[i])) {
      return "total[" + std::to_string(i) + "] " + std::to_string(outs[1].data_as<float>()[i]) + " vs " +
             std::to_string(want.total[i]);
    }
  }
  if (outs[2].data_as<float>()[0] != want.counter) return "counter " + std::to_string(outs[2].data_as<float>()[0]);
  return "";
}

std::vector<float> state_values(const Session& s, const char* name) {
  auto t = s.state(name);
  EXPECT_TRUE(t.ok()) << t.error().to_string();
  if (!t.ok()) return {};
  const float* p = t->data_as<float>();
  return std::vector<float>(p, p + t->numel());
}

TEST(SymbolicGraph, CompilerTypesAndPlansTheGraph) {
  testing::KvGraphIds id;
  KILN_ASSERT_OK_AND_ASSIGN(g, testing::kv_cache_graph(&id));
  ASSERT_EQ(g.symbols().size(), 1u);
  EXPECT_EQ(g.symbols()[0].name, "seq");
  // Derived expressions and upper-bound types.
  const SymExpr seq = SymExpr::symbol(id.seq);
  EXPECT_EQ(g.value(id.h).sym_sizes, (std::vector<SymExpr>{C(1), seq, C(kKvDim)}));
  EXPECT_EQ(g.value(id.h).type.sizes, (std::vector<int64_t>{1, kKvCapacity, kKvDim}));
  EXPECT_EQ(g.value(id.hv).sym_sizes, (std::vector<SymExpr>{seq, C(kKvDim)}));
  EXPECT_EQ(g.value(id.r).sym_sizes, std::vector<SymExpr>{seq});
  EXPECT_EQ(g.value(id.r).type, (TensorType{DType::Int64, {kKvCapacity}}));
  EXPECT_EQ(g.value(id.pos).sym_sizes, std::vector<SymExpr>{seq});
  EXPECT_FALSE(g.value(id.new_cache).is_dynamic());
  EXPECT_FALSE(g.value(id.total).is_dynamic());
  EXPECT_EQ(g.value(id.cache).state, 0);
  EXPECT_EQ(g.value(id.counter).state, 1);
  // The cache's index_put update is written in place; the counter's add is copied.
  Graph copy = g;
  EXPECT_EQ(plan_state_updates(copy), 1u);
  EXPECT_EQ(copy.value(id.new_cache).state, 0);
  EXPECT_EQ(copy.value(id.new_counter).state, -1);
  // The compiled file says the same: the cache's update value is a state value, no arena bytes.
  KILN_ASSERT_OK_AND_ASSIGN(bytes, testing::compile_kv_cache_program());
  FileHeader h{};
  std::memcpy(&h, bytes.data(), sizeof(h));
  EXPECT_EQ(h.version, kFormatVersion);
  const fb::Program* prog = fb::GetProgram(bytes.data() + h.flatbuffer_offset);
  ASSERT_NE(prog->states(), nullptr);
  ASSERT_EQ(prog->states()->size(), 2u);
  EXPECT_EQ(prog->states()->Get(0)->initial(), -1);  // zeros
  EXPECT_GE(prog->states()->Get(1)->initial(), 0);   // a constant
  const fb::Method* m = prog->methods()->Get(0);
  ASSERT_NE(m->state_updates(), nullptr);
  ASSERT_EQ(m->state_updates()->size(), 2u);
  for (const fb::StateUpdate* u : *m->state_updates()) {
    const fb::Tensor* v = m->values()->Get(static_cast<flatbuffers::uoffset_t>(u->value()));
    if (u->state() == 0) {
      EXPECT_EQ(v->state(), 0) << "the cache update is not written in place";
      EXPECT_EQ(v->arena_offset(), -1);
    } else {
      EXPECT_EQ(v->state(), -1) << "the counter update should be copied";
      EXPECT_GE(v->arena_offset(), 0);
    }
  }
  // Planned at the upper bound.
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(bytes));
  KILN_ASSERT_OK_AND_ASSIGN(meta, program->method_meta("forward"));
  ASSERT_EQ(meta.symbols.size(), 1u);
  EXPECT_EQ(meta.symbols[0].min, 1);
  EXPECT_EQ(meta.symbols[0].max, kKvCapacity);
  EXPECT_EQ(meta.inputs[0].sizes, (std::vector<int64_t>{1, kKvCapacity, kKvDim}));
  EXPECT_EQ(meta.input_dims[0], (std::vector<std::string>{"", "seq", ""}));
  EXPECT_EQ(meta.input_dims[2], (std::vector<std::string>{""}));
  EXPECT_EQ(meta.output_dims[0], (std::vector<std::string>{"", "seq", ""}));
  EXPECT_EQ(meta.states, (std::vector<std::string>{"cache", "counter"}));
  ASSERT_EQ(program->states().size(), 2u);
  EXPECT_TRUE(program->states()[0].zero_initial);
  EXPECT_FALSE(program->states()[1].zero_initial);
  ASSERT_NE(program->metadata_value("test.kind"), nullptr);
  EXPECT_EQ(*program->metadata_value("test.kind"), "kv-cache");
  EXPECT_EQ(program->format_version(), kFormatVersion);
}

TEST(SymbolicGraph, RunsAtEverySizeAgainstTheReference) {
  for (bool portable : {false, true}) {
    SCOPED_TRACE(portable ? "portable kernels" : "default kernels");
    auto program = load_kv();
    ASSERT_NE(program, nullptr);
    MethodOptions mo;
    mo.portable_kernels_only = portable;
    KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward", mo));
    KILN_ASSERT_OK_AND_ASSIGN(session, program->new_session());
    KvReference ref;
    // Prefill of 7, then single steps, then a chunk, a full-capacity overwrite and seq = 1 at the end.
    const std::vector<std::pair<int64_t, int64_t>> calls = {{7, 0}, {1, 7}, {1, 8}, {5, 9}, {1, 14}, {kKvCapacity, 0},
                                                            {3, 29}, {1, 31}, {2, 0}, {16, 16}};
    uint32_t seed = 100;
    for (const auto& [seq, pos] : calls) {
      SCOPED_TRACE("seq " + std::to_string(seq) + " pos " + std::to_string(pos));
      Call c(seq, pos, seed++);
      auto outs = method.execute(*session, c.inputs());
      ASSERT_TRUE(outs.ok()) << outs.error().to_string();
      EXPECT_EQ(compare(outs.value(), ref.step(c.x, c.gate, pos), seq), "");
      const auto cache = state_values(*session, "cache");
      ASSERT_EQ(cache.size(), ref.cache.size());
      for (size_t i = 0; i < cache.size(); ++i) ASSERT_TRUE(close(cache[i], ref.cache[i])) << i;
      EXPECT_EQ(state_values(*session, "counter"), std::vector<float>{ref.counter});
    }
  }
}

TEST(SymbolicGraph, BadInputsAreInvalidArgumentAndChangeNothing) {
  auto program = load_kv();
  ASSERT_NE(program, nullptr);
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  KILN_ASSERT_OK_AND_ASSIGN(session, program->new_session());
  KvReference ref;
  Call first(4, 0, 1);
  ASSERT_TRUE(method.execute(*session, first.inputs()).ok());
  ref.step(first.x, first.gate, 0);
  const auto cache0 = state_values(*session, "cache");
  const auto counter0 = state_values(*session, "counter");

  auto expect_invalid = [&](const char* what, std::vector<Tensor> inputs, std::vector<std::string> needles,
                            ErrorCode code = ErrorCode::InvalidArgument) {
    SCOPED_TRACE(what);
    auto r = method.execute(*session, inputs);
    ASSERT_FALSE(r.ok()) << "ran";
    EXPECT_EQ(r.error().code(), code) << r.error().to_string();
    for (const auto& n : needles) EXPECT_NE(r.error().message().find(n), std::string::npos) << n << " in " << r.error().message();
    EXPECT_EQ(state_values(*session, "cache"), cache0);
    EXPECT_EQ(state_values(*session, "counter"), counter0);
    EXPECT_FALSE(session->failed()) << session->failure();
  };
  {
    Call c(kKvCapacity + 1, 0, 2);
    expect_invalid("seq above the range", c.inputs(),
                   {"input 0 'x'", "dim 1", "is 33", "symbol 'seq' in [1, 32]",
                    "(expected float32[1, seq <= 32, " + std::to_string(kKvDim) + "])"});
  }
  {
    // The expected type shows the symbolic dim with its bound, never the bare bound ("[1, 32, ...]"
    // reads as "exactly 32").
    Call c(4, 4, 3);
    auto in = c.inputs();
    in[0].dtype = DType::Int32;
    const std::string want = "expected float32[1, seq <= 32, " + std::to_string(kKvDim) + "], got int32[1, 4, ";
    expect_invalid("wrong dtype of a symbolic input", in, {"input 0 'x'", want});
    in = c.inputs();
    in[0].sizes = {2, 4, kKvDim};
    expect_invalid("wrong batch of a symbolic input", in, {"input 0 'x'", "expected float32[1, seq <= 32, "});
    in = c.inputs();
    in[0].sizes = {4, kKvDim};
    expect_invalid("wrong rank of a symbolic input", in, {"input 0 'x'", "expected float32[1, seq <= 32, "});
    in = c.inputs();
    in.clear();
    expect_invalid("missing symbolic input", in, {"missing input 0 'x' (expected float32[1, seq <= 32, "});
  }
  {
    std::vector<float> none;
    std::vector<int64_t> p = {0};
    expect_invalid("seq 0, below the range",
                   {Tensor{DType::Float32, {1, 0, kKvDim}, none.data()}, Tensor{DType::Float32, {1, 0, 1}, none.data()},
                    Tensor{DType::Int64, {1}, p.data()}},
                   {"input 0 'x'", "dim 1", "is 0", "symbol 'seq' in [1, 32]"});
  }
  {
    Call c(4, 4, 3);
    std::vector<float> gate5(5, 1.0f);
    auto in = c.inputs();
    in[1] = Tensor{DType::Float32, {1, 5, 1}, gate5.data()};
    expect_invalid("inputs disagree on seq", in, {"input 1 'gate'", "dim 1", "symbol 'seq' in [1, 32] = 4", "from input 0 dim 1"});
  }
  {
    Call c(4, 4, 4);
    auto in = c.inputs();
    in[0].sizes = {1, 4, kKvDim + 1};
    std::vector<float> wide(static_cast<size_t>(4 * (kKvDim + 1)));
    in[0].data = wide.data();
    expect_invalid("a fixed dim differs", in, {"input 0 'x'"});
  }
  {
    Call c(4, 4, 5);
    auto in = c.inputs();
    in[2].dtype = DType::Int32;
    expect_invalid("wrong dtype", in, {"input 2 'input_pos'", "expected int64[1]"});
  }
  {
    Call c(4, 4, 6);
    auto in = c.inputs();
    in.pop_back();
    expect_invalid("missing input", in, {"takes 3 inputs"});
  }
  // A bad index: positions 30..33 run past the cache. The index_put kernel checks every index
  // before writing, so nothing changed and the session is still usable.
  {
    Call c(4, kKvCapacity - 2, 7);
    auto r = method.execute(*session, c.inputs());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("index_put"), std::string::npos) << r.error().message();
    EXPECT_EQ(state_values(*session, "cache"), cache0);
    EXPECT_EQ(state_values(*session, "counter"), counter0);
    EXPECT_FALSE(session->failed()) << session->failure();
  }
  {
    Call c(2, -40, 8);
    EXPECT_FALSE(method.execute(*session, c.inputs()).ok());
    EXPECT_EQ(state_values(*session, "cache"), cache0);
  }
  // The session goes on where it was.
  Call next(3, 4, 9);
  auto outs = method.execute(*session, next.inputs());
  ASSERT_TRUE(outs.ok()) << outs.error().to_string();
  EXPECT_EQ(compare(outs.value(), ref.step(next.x, next.gate, 4), 3), "");
}

TEST(SymbolicGraph, DerivedOutputSizesAndTheirErrors) {
  Graph g;
  KILN_ASSERT_OK_AND_ASSIGN(seq, g.add_symbol("seq", 2, 10));
  const SymExpr s = SymExpr::symbol(seq);
  KILN_ASSERT_OK_AND_ASSIGN(x, g.add_input("x", {DType::Float32, {0, 0}}, {s, C(4)}));
  EXPECT_EQ(g.value(x).type.sizes, (std::vector<int64_t>{10, 4}));
  // Derived: relu keeps x's expressions; sum over dim 1 gives [seq].
  KILN_ASSERT_OK_AND_ASSIGN(r, g.add_node("aten.relu", {x}, {}, "relu", {}, {}));
  EXPECT_EQ(g.value(r[0]).sym_sizes, (std::vector<SymExpr>{s, C(4)}));
  KILN_ASSERT_OK_AND_ASSIGN(sm, g.add_node("aten.sum", {x}, {{"dim", std::vector<int64_t>{1}}}, "sum", {}, {}));
  EXPECT_EQ(g.value(sm[0]).sym_sizes, std::vector<SymExpr>{s});
  // Summing over the symbolic dim leaves fixed sizes.
  KILN_ASSERT_OK_AND_ASSIGN(s0, g.add_node("aten.sum", {x}, {{"dim", std::vector<int64_t>{0}}}, "sum0", {}, {}));
  EXPECT_FALSE(g.value(s0[0]).is_dynamic());
  EXPECT_EQ(g.value(s0[0]).type.sizes, std::vector<int64_t>{4});
  // cat of x with itself on dim 0 is 2 * seq: no input dim matches, so it cannot be derived...
  auto cat = g.add_node("aten.cat", {x, x}, {{"dim", int64_t{0}}}, "cat", {}, {});
  ASSERT_FALSE(cat.ok());
  EXPECT_EQ(cat.error().code(), ErrorCode::InvalidArgument);
  EXPECT_NE(cat.error().message().find("cannot derive a symbolic expression for output 0 dim 0"), std::string::npos)
      << cat.error().message();
  EXPECT_NE(cat.error().message().find("at cat"), std::string::npos) << cat.error().message();
  // ...given, it is verified and its bound planned;
  KILN_ASSERT_OK_AND_ASSIGN(cat2, g.add_node("aten.cat", {x, x}, {{"dim", int64_t{0}}}, "cat", {}, {{s * C(2), C(4)}}));
  EXPECT_EQ(g.value(cat2[0]).type.sizes, (std::vector<int64_t>{20, 4}));
  // a wrong expression is refused naming both sizes and the binding.
  auto wrong = g.add_node("aten.cat", {x, x}, {{"dim", int64_t{0}}}, "cat", {}, {{s * C(2) + C(1), C(4)}});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message().find("by the op's shape inference at seq=2"), std::string::npos) << wrong.error().message();
  auto rank = g.add_node("aten.relu", {x}, {}, "relu", {}, {{s}});
  ASSERT_FALSE(rank.ok());
  EXPECT_NE(rank.error().message().find("rank 2"), std::string::npos) << rank.error().message();
  // Symbolic attribute errors.
  auto no_attr = g.add_node("aten.view", {x}, {{"size", std::vector<int64_t>{40}}}, "v", {SymAttr{"nope", -1, s}}, {});
  ASSERT_FALSE(no_attr.ok());
  auto bad_expr = g.add_node("aten.view", {x}, {{"size", std::vector<int64_t>{40}}}, "v",
                             {SymAttr{"size", 0, SymExpr::symbol(3)}}, {});
  ASSERT_FALSE(bad_expr.ok());
  EXPECT_NE(bad_expr.error().message().find("out of range"), std::string::npos) << bad_expr.error().message();
  // view with size [seq * 4] derives from the symbolic attribute.
  KILN_ASSERT_OK_AND_ASSIGN(v, g.add_node("aten.view", {x}, {{"size", std::vector<int64_t>{1}}}, "v", {SymAttr{"size", 0, s * C(4)}}, {}));
  EXPECT_EQ(g.value(v[0]).sym_sizes, std::vector<SymExpr>{s * C(4)});
  EXPECT_EQ(g.value(v[0]).type.sizes, std::vector<int64_t>{40});

  // Compiles and runs at seq = 2..10 with the actual sizes.
  ASSERT_TRUE(g.set_outputs({r[0], sm[0], cat2[0], v[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile());
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  for (int64_t n = 2; n <= 10; ++n) {
    std::vector<float> xv = pattern(static_cast<size_t>(n * 4), static_cast<uint32_t>(n));
    // A stateless method runs without a session.
    KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute({Tensor{DType::Float32, {n, 4}, xv.data()}}));
    ASSERT_EQ(outs.size(), 4u);
    EXPECT_EQ(outs[0].sizes, (std::vector<int64_t>{n, 4}));
    EXPECT_EQ(outs[1].sizes, std::vector<int64_t>{n});
    EXPECT_EQ(outs[2].sizes, (std::vector<int64_t>{2 * n, 4}));
    EXPECT_EQ(outs[3].sizes, std::vector<int64_t>{4 * n});
    for (int64_t i = 0; i < n; ++i) {
      float acc = 0;
      for (int64_t j = 0; j < 4; ++j) {
        const float xij = xv[static_cast<size_t>(i * 4 + j)];
        acc += xij;
        EXPECT_EQ(outs[0].data_as<float>()[i * 4 + j], std::max(xij, 0.0f));
        EXPECT_EQ(outs[2].data_as<float>()[i * 4 + j], xij);
        EXPECT_EQ(outs[2].data_as<float>()[(n + i) * 4 + j], xij);
        EXPECT_EQ(outs[3].data_as<float>()[i * 4 + j], xij);
      }
      EXPECT_NEAR(outs[1].data_as<float>()[i], acc, 1e-5f);
    }
  }
  std::vector<float> big(44);
  auto r11 = method.execute({Tensor{DType::Float32, {11, 4}, big.data()}});
  ASSERT_FALSE(r11.ok());
  EXPECT_NE(r11.error().message().find("symbol 'seq' in [2, 10]"), std::string::npos) << r11.error().message();
}

TEST(SymbolicGraph, GraphApiErrors) {
  Graph g;
  EXPECT_FALSE(g.add_symbol("", 1, 2).ok());
  EXPECT_FALSE(g.add_symbol("a", 3, 2).ok());
  EXPECT_FALSE(g.add_symbol("a", -1, 2).ok());
  EXPECT_FALSE(g.add_symbol("a", 1, kMaxSymbolValue + 1).ok());
  ASSERT_TRUE(g.add_symbol("a", 0, kMaxSymbolValue).ok());
  EXPECT_FALSE(g.add_symbol("a", 1, 2).ok());  // declared twice
  EXPECT_FALSE(g.add_input("x", {DType::Float32, {1, 2}}, {S(0)}).ok());  // rank mismatch
  EXPECT_FALSE(g.add_input("x", {DType::Float32, {1}}, {S(1)}).ok());     // no such symbol
  KILN_ASSERT_OK_AND_ASSIGN(st, g.add_state("s", {DType::Float32, {2}}));
  EXPECT_FALSE(g.add_state("s", {DType::Float32, {2}}).ok());  // duplicate name
  EXPECT_FALSE(g.add_state("t", {DType::Float32, {2}}, std::make_shared<std::vector<uint8_t>>(7)).ok());
  ValueId other = g.add_input("o", {DType::Float32, {3}});
  EXPECT_FALSE(g.set_state_update(st, other).ok());   // another type
  EXPECT_FALSE(g.set_state_update(other, st).ok());   // not a state
  EXPECT_FALSE(g.set_state_update(st, 12345).ok());   // out of range
  KILN_ASSERT_OK_AND_ASSIGN(dyn, g.add_input("d", {DType::Float32, {2}}, {S(0).min(C(2))}));
  EXPECT_FALSE(g.set_state_update(st, dyn).ok());     // symbolic sizes
}

// ---------------------------------------------------------------- sessions

TEST(Sessions, IndependentResetForeignAndOwn) {
  auto program = load_kv();
  ASSERT_NE(program, nullptr);
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  KILN_ASSERT_OK_AND_ASSIGN(a, program->new_session());
  KILN_ASSERT_OK_AND_ASSIGN(b, program->new_session());
  EXPECT_EQ(state_values(*a, "cache"), std::vector<float>(kKvCapacity * kKvDim, 0.0f));
  EXPECT_EQ(state_values(*a, "counter"), std::vector<float>{testing::kCounterInitial});
  EXPECT_EQ(a->state("nope").error().code(), ErrorCode::NotFound);
  KvReference ra, rb;
  // Interleaved call by call on one Method: each session sees only its own calls.
  for (int i = 0; i < 6; ++i) {
    Call ca(2, 2 * i, 10 + static_cast<uint32_t>(i)), cb(3, 3 * i, 50 + static_cast<uint32_t>(i));
    KILN_ASSERT_OK_AND_ASSIGN(oa, method.execute(*a, ca.inputs()));
    EXPECT_EQ(compare(oa, ra.step(ca.x, ca.gate, ca.pos), 2), "") << i;
    KILN_ASSERT_OK_AND_ASSIGN(ob, method.execute(*b, cb.inputs()));
    EXPECT_EQ(compare(ob, rb.step(cb.x, cb.gate, cb.pos), 3), "") << i;
  }
  // reset() restores zeros and the constant initial value; the same calls give the same outputs.
  a->reset();
  EXPECT_EQ(state_values(*a, "cache"), std::vector<float>(kKvCapacity * kKvDim, 0.0f));
  EXPECT_EQ(state_values(*a, "counter"), std::vector<float>{testing::kCounterInitial});
  EXPECT_NE(state_values(*b, "cache"), std::vector<float>(kKvCapacity * kKvDim, 0.0f));
  KvReference ra2;
  Call c0(2, 0, 10);
  KILN_ASSERT_OK_AND_ASSIGN(o0, method.execute(*a, c0.inputs()));
  EXPECT_EQ(compare(o0, ra2.step(c0.x, c0.gate, 0), 2), "");
  // A session of another program (the same bytes, loaded again) is refused.
  auto other = load_kv();
  ASSERT_NE(other, nullptr);
  KILN_ASSERT_OK_AND_ASSIGN(foreign, other->new_session());
  auto r = method.execute(*foreign, c0.inputs());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument);
  EXPECT_NE(r.error().message().find("another program"), std::string::npos) << r.error().message();
  EXPECT_EQ(state_values(*foreign, "counter"), std::vector<float>{testing::kCounterInitial});
  // Without a session the method uses its own, which persists across its calls (and is not `a`).
  KILN_ASSERT_OK_AND_ASSIGN(m2, program->load_method("forward"));
  KvReference rown;
  for (int i = 0; i < 3; ++i) {
    Call c(4, 4 * i, 200 + static_cast<uint32_t>(i));
    KILN_ASSERT_OK_AND_ASSIGN(o, m2.execute(c.inputs()));
    EXPECT_EQ(compare(o, rown.step(c.x, c.gate, c.pos), 4), "") << i;
  }
  EXPECT_EQ(state_values(*a, "counter"), std::vector<float>{testing::kCounterInitial + 1});
}

// The calls one conversation makes: prefill, decode steps, wrap-around by reset.
std::vector<Call> conversation(uint32_t seed, int n) {
  std::vector<Call> calls;
  int64_t pos = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t seq = i % 5 == 0 ? 1 + (seed + static_cast<uint32_t>(i)) % 6 : 1;
    if (pos + seq > kKvCapacity) pos = 0;
    calls.emplace_back(seq, pos, seed * 1000 + static_cast<uint32_t>(i));
    pos += seq;
  }
  return calls;
}

// Two sessions of one program, each with its own Method instance, from two threads at once: each
// gives what it gives alone. Runs under ThreadSanitizer (scripts/sanitizers.sh runs Concurrency.*).
TEST(Concurrency, TwoSessionsFromTwoThreadsMatchEachAlone) {
  auto program = load_kv();
  ASSERT_NE(program, nullptr);
  constexpr int kCalls = 24;
  std::vector<std::vector<Call>> convs = {conversation(1, kCalls), conversation(2, kCalls)};
  // Alone: one after the other, on one Method.
  std::vector<std::vector<std::vector<float>>> alone(2);
  {
    KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
    for (int t = 0; t < 2; ++t) {
      KILN_ASSERT_OK_AND_ASSIGN(session, program->new_session());
      for (Call& c : convs[t]) {
        KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute(*session, c.inputs()));
        std::vector<float> flat(outs[1].data_as<float>(), outs[1].data_as<float>() + kKvDim);
        flat.insert(flat.end(), outs[0].data_as<float>(), outs[0].data_as<float>() + outs[0].numel());
        flat.push_back(outs[2].data_as<float>()[0]);
        alone[t].push_back(std::move(flat));
      }
    }
  }
  // Together.
  std::vector<Method> methods;
  std::vector<std::unique_ptr<Session>> sessions;
  for (int t = 0; t < 2; ++t) {
    KILN_ASSERT_OK_AND_ASSIGN(m, program->load_method("forward"));
    methods.push_back(std::move(m));
    KILN_ASSERT_OK_AND_ASSIGN(s, program->new_session());
    sessions.push_back(std::move(s));
  }
  std::vector<std::string> failures(2);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < 2) std::this_thread::yield();
      for (size_t i = 0; i < convs[t].size(); ++i) {
        auto outs = methods[t].execute(*sessions[t], convs[t][i].inputs());
        if (!outs.ok()) { failures[t] = outs.error().to_string(); return; }
        std::vector<float> flat((*outs)[1].data_as<float>(), (*outs)[1].data_as<float>() + kKvDim);
        flat.insert(flat.end(), (*outs)[0].data_as<float>(), (*outs)[0].data_as<float>() + (*outs)[0].numel());
        flat.push_back((*outs)[2].data_as<float>()[0]);
        if (flat != alone[t][i]) { failures[t] = "call " + std::to_string(i) + " differs from the session alone"; return; }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
  // The sessions' states are those of the runs alone: compare the counters.
  EXPECT_EQ(state_values(*sessions[0], "counter"), std::vector<float>{testing::kCounterInitial + kCalls});
  EXPECT_EQ(state_values(*sessions[1], "counter"), std::vector<float>{testing::kCounterInitial + kCalls});
}

// ---------------------------------------------------------------- file versions

TEST(FormatVersions, VersionOneFilesStillLoadAndVersionThreeIsRefused) {
  const std::vector<float> c = pattern(8, 3);
  KILN_ASSERT_OK_AND_ASSIGN(bytes, testing::compile_add_relu(2, 8, c, 2.0));
  auto with_version = [&](uint32_t v) {
    std::vector<uint8_t> b = bytes;
    FileHeader h{};
    std::memcpy(&h, b.data(), sizeof(h));
    h.version = v;
    std::memcpy(b.data(), &h, sizeof(h));
    EXPECT_TRUE(fb::GetMutableProgram(b.data() + h.flatbuffer_offset)->mutate_version(v));
    return b;
  };
  const auto v1 = with_version(1);
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(v1));
  EXPECT_EQ(program->format_version(), 1u);
  EXPECT_TRUE(program->states().empty());
  // A version-1 file had no metadata; this one (compiled now, only its version changed) holds just
  // the compiler's delegation record, which version-1 readers never looked at.
  ASSERT_EQ(program->metadata().size(), 1u);
  EXPECT_EQ(program->metadata()[0].first, "kiln.delegation");
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  KILN_ASSERT_OK_AND_ASSIGN(meta, program->method_meta("forward"));
  EXPECT_TRUE(meta.symbols.empty());
  EXPECT_TRUE(meta.states.empty());
  const std::vector<float> x = pattern(16, 4);
  KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute({Tensor{DType::Float32, {2, 8}, const_cast<float*>(x.data())}}));
  const auto want = testing::add_relu_reference(x, 8, c, 2.0);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(outs[0].data_as<float>()[i], want[i]) << i;
  // A stateless method given a session of its program: runs (the session is not touched).
  KILN_ASSERT_OK_AND_ASSIGN(session, program->new_session());
  EXPECT_TRUE(method.execute(*session, {Tensor{DType::Float32, {2, 8}, const_cast<float*>(x.data())}}).ok());

  for (uint32_t v : {0u, 3u}) {
    auto p = Program::load_from_buffer(with_version(v));
    ASSERT_FALSE(p.ok()) << "version " << v << " loaded";
    EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram);
    EXPECT_NE(p.error().message().find("format version " + std::to_string(v)), std::string::npos) << p.error().message();
  }
}

// ---------------------------------------------------------------- partitioner

TEST(SymbolicPartition, XnnpackDeclinesSymbolicNodesAndTakesTheStaticOnes) {
#ifndef KILN_HAVE_XNNPACK
  GTEST_SKIP() << "built without the xnnpack delegate";
#else
  const Backend* xnn = BackendRegistry::get().find("xnnpack");
  if (xnn == nullptr) GTEST_SKIP() << "xnnpack is not registered";
  Graph g;
  KILN_ASSERT_OK_AND_ASSIGN(seq, g.add_symbol("seq", 1, 16));
  KILN_ASSERT_OK_AND_ASSIGN(x, g.add_input("x", {DType::Float32, {1, 16, 8}}, {C(1), S(seq), C(8)}));
  ValueId y = g.add_input("y", {DType::Float32, {2, 8}});
  const auto w = pattern(64, 1), b = pattern(8, 2);
  KILN_ASSERT_OK_AND_ASSIGN(wc, g.add_constant("w", {DType::Float32, {8, 8}}, testing::float_bytes(w)));
  KILN_ASSERT_OK_AND_ASSIGN(bc, g.add_constant("b", {DType::Float32, {8}}, testing::float_bytes(b)));
  KILN_ASSERT_OK_AND_ASSIGN(hx, g.add_node("aten.linear", {x, wc, bc}, {}, "dyn_linear", {}, {}));
  KILN_ASSERT_OK_AND_ASSIGN(hy, g.add_node("aten.linear", {y, wc, bc}, {}, "static_linear"));
  KILN_ASSERT_OK_AND_ASSIGN(ry, g.add_node("aten.relu", {hy[0]}, {}, "static_relu"));
  ASSERT_TRUE(g.set_outputs({hx[0], ry[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
  CompileOptions o;
  o.backends = {"xnnpack"};
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile(o));
  const DelegationReport& rep = compiled.methods[0].delegation;
  ASSERT_EQ(rep.backends.size(), 1u);
  EXPECT_EQ(rep.backends[0].backend, "xnnpack");
  EXPECT_EQ(rep.backends[0].nodes, 2u) << compiled.report();
  bool declined = false;
  for (const auto& d : rep.declined) {
    if (d.debug_name == "dyn_linear") {
      declined = true;
      EXPECT_EQ(d.backend, "xnnpack");
      EXPECT_EQ(d.reason, xnn->symbolic_sizes_reason());
    } else {
      ADD_FAILURE() << "declined " << d.debug_name << ": " << d.reason;
    }
  }
  EXPECT_TRUE(declined);
  EXPECT_NE(xnn->symbolic_sizes_reason().find("xnn_reshape_runtime"), std::string::npos) << xnn->symbolic_sizes_reason();
  // require_delegation names the symbolic node and the reason.
  {
    Graph g2;
    auto s2 = g2.add_symbol("seq", 1, 4);
    ASSERT_TRUE(s2.ok());
    auto x2 = g2.add_input("x", {DType::Float32, {4, 8}}, {S(0), C(8)});
    ASSERT_TRUE(x2.ok());
    auto r2 = g2.add_node("aten.relu", {x2.value()}, {}, "dyn_relu", {}, {});
    ASSERT_TRUE(r2.ok());
    ASSERT_TRUE(g2.set_outputs({r2.value()[0]}).ok());
    ProgramBuilder pb2;
    ASSERT_TRUE(pb2.add_method("forward", std::move(g2)).ok());
    CompileOptions o2;
    o2.require_delegation = "xnnpack";
    auto c2 = pb2.compile(o2);
    ASSERT_FALSE(c2.ok());
    EXPECT_EQ(c2.error().code(), ErrorCode::NotSupported);
    EXPECT_NE(c2.error().message().find("dyn_relu"), std::string::npos) << c2.error().message();
    EXPECT_NE(c2.error().message().find("symbolic sizes"), std::string::npos) << c2.error().message();
  }
  // The mixed program runs: the symbolic linear on Kiln's kernels, the static part on XNNPACK.
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  for (int64_t n : {1, 5, 16}) {
    std::vector<float> xv = pattern(static_cast<size_t>(n * 8), 9), yv = pattern(16, 10);
    KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute({Tensor{DType::Float32, {1, n, 8}, xv.data()},
                                                    Tensor{DType::Float32, {2, 8}, yv.data()}}));
    ASSERT_EQ(outs[0].sizes, (std::vector<int64_t>{1, n, 8}));
    auto lin = [&](const std::vector<float>& in, int64_t row, int64_t o) {
      double acc = b[static_cast<size_t>(o)];
      for (int64_t k = 0; k < 8; ++k) acc += static_cast<double>(in[static_cast<size_t>(row * 8 + k)]) * w[static_cast<size_t>(o * 8 + k)];
      return static_cast<float>(acc);
    };
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t o2 = 0; o2 < 8; ++o2) EXPECT_TRUE(close(outs[0].data_as<float>()[i * 8 + o2], lin(xv, i, o2))) << i << "," << o2;
    }
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t o2 = 0; o2 < 8; ++o2) {
        EXPECT_TRUE(close(outs[1].data_as<float>()[i * 8 + o2], std::max(lin(yv, i, o2), 0.0f))) << i << "," << o2;
      }
    }
  }
#endif
}

}  // namespace
}  // namespace kiln

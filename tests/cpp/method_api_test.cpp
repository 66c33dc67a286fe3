// Method API (src/runtime/program.cpp): input validation errors, caller-supplied arenas, and
// concurrent execution of several Method instances of one Program (run under
// -DKILN_SANITIZE=thread by scripts/sanitizers.sh).
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "runtime_test_util.h"

namespace kiln {
namespace {

using testing::AlignedBuffer;
using testing::pattern;

// y = relu(x + bias), x: float32[2, 3] named "x", bias: float32[3] named "bias".
std::shared_ptr<Program> two_input_program() {
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {2, 3}});
  ValueId bias = g.add_input("bias", {DType::Float32, {3}});
  auto s = g.add_node("aten.add", {x, bias}, {});
  EXPECT_TRUE(s.ok());
  auto r = g.add_node("aten.relu", {s.value()[0]}, {});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(g.set_outputs({r.value()[0]}).ok());
  ProgramBuilder pb;
  EXPECT_TRUE(pb.add_method("forward", std::move(g)).ok());
  auto compiled = pb.compile();
  EXPECT_TRUE(compiled.ok()) << compiled.error().to_string();
  if (!compiled.ok()) return nullptr;
  auto program = Program::load_from_buffer(compiled->bytes);
  EXPECT_TRUE(program.ok()) << program.error().to_string();
  return program.ok() ? program.value() : nullptr;
}

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
}

class MethodInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    program_ = two_input_program();
    ASSERT_NE(program_, nullptr);
    auto m = program_->load_method("forward");
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    method_.emplace(std::move(m.value()));
  }
  void expect_good_run() {
    auto outs = method_->execute({Tensor{DType::Float32, {2, 3}, x_.data()}, Tensor{DType::Float32, {3}, bias_.data()}});
    ASSERT_TRUE(outs.ok()) << outs.error().to_string();
    const float want[] = {1.5f, 0.0f, 1.0f, 4.5f, 2.0f, 0.0f};  // relu(x + bias), by hand
    for (int i = 0; i < 6; ++i) EXPECT_EQ((*outs)[0].data_as<float>()[i], want[i]) << i;
  }

  std::shared_ptr<Program> program_;
  std::optional<Method> method_;
  std::vector<float> x_ = {1, 2, 3, 4, 5, -6};
  std::vector<float> bias_ = {0.5f, -3.0f, -2.0f};
};

TEST_F(MethodInputs, MetaNamesInputs) {
  EXPECT_EQ(method_->meta().input_names, (std::vector<std::string>{"x", "bias"}));
  ASSERT_EQ(method_->meta().inputs.size(), 2u);
  EXPECT_EQ(method_->meta().inputs[1], (TensorType{DType::Float32, {3}}));
  expect_good_run();
}

TEST_F(MethodInputs, WrongDTypeNamesInputAndTypes) {
  std::vector<int32_t> ib = {1, 2, 3};
  auto r = method_->execute({Tensor{DType::Float32, {2, 3}, x_.data()}, Tensor{DType::Int32, {3}, ib.data()}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument);
  expect_contains(r.error().message(), {"input 1", "'bias'", "expected float32[3]", "got int32[3]"});
  expect_good_run();  // the method is still usable
}

TEST_F(MethodInputs, WrongShapeNamesInputAndTypes) {
  auto r = method_->execute({Tensor{DType::Float32, {3, 2}, x_.data()}, Tensor{DType::Float32, {3}, bias_.data()}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument);
  expect_contains(r.error().message(), {"input 0", "'x'", "expected float32[2, 3]", "got float32[3, 2]"});

  auto rank = method_->execute({Tensor{DType::Float32, {6}, x_.data()}, Tensor{DType::Float32, {3}, bias_.data()}});
  ASSERT_FALSE(rank.ok());
  EXPECT_EQ(rank.error().code(), ErrorCode::InvalidArgument);
  expect_contains(rank.error().message(), {"input 0", "'x'", "float32[2, 3]", "float32[6]"});

  auto both = method_->execute({Tensor{DType::Float32, {2, 3}, x_.data()}, Tensor{DType::Float16, {1, 3}, bias_.data()}});
  ASSERT_FALSE(both.ok());
  expect_contains(both.error().message(), {"input 1", "'bias'", "float32[3]", "float16[1, 3]"});
  expect_good_run();
}

TEST_F(MethodInputs, WrongCountIsInvalidArgument) {
  auto one = method_->execute({Tensor{DType::Float32, {2, 3}, x_.data()}});
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.error().code(), ErrorCode::InvalidArgument);
  expect_contains(one.error().message(), {"forward", "2 inputs", "got 1", "missing input 1 'bias'", "float32[3]"});
  auto none = method_->execute(std::span<const Tensor>());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), ErrorCode::InvalidArgument);
  expect_contains(none.error().message(), {"got 0", "missing input 0 'x'", "float32[2, 3]"});
  auto three = method_->execute({Tensor{DType::Float32, {2, 3}, x_.data()}, Tensor{DType::Float32, {3}, bias_.data()},
                                 Tensor{DType::Float32, {3}, bias_.data()}});
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.error().code(), ErrorCode::InvalidArgument);
  expect_contains(three.error().message(), {"got 3", "unexpected input 2", "float32[3]"});
  expect_good_run();
}

TEST_F(MethodInputs, MissingDataIsInvalidArgument) {
  auto r = method_->execute({Tensor{DType::Float32, {2, 3}, x_.data()}, Tensor{DType::Float32, {3}, nullptr}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument);
  expect_contains(r.error().message(), {"input 1"});
}

// ---- caller-supplied arenas ----

TEST(CallerArena, TooSmallIsMemoryAllocationFailed) {
  auto program = two_input_program();
  ASSERT_NE(program, nullptr);
  KILN_ASSERT_OK_AND_ASSIGN(meta, program->method_meta("forward"));
  ASSERT_GT(meta.arena_bytes, 64u);
  AlignedBuffer small(meta.arena_bytes - 1);
  MethodOptions opts;
  opts.arena = small.span();
  auto m = program->load_method("forward", opts);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), ErrorCode::MemoryAllocationFailed);
  expect_contains(m.error().message(), {std::to_string(meta.arena_bytes), std::to_string(meta.arena_bytes - 1)});

  AlignedBuffer tiny(1);
  opts.arena = tiny.span();
  auto m2 = program->load_method("forward", opts);
  ASSERT_FALSE(m2.ok());
  EXPECT_EQ(m2.error().code(), ErrorCode::MemoryAllocationFailed);
}

TEST(CallerArena, MisalignedIsInvalidArgument) {
  auto program = two_input_program();
  ASSERT_NE(program, nullptr);
  KILN_ASSERT_OK_AND_ASSIGN(meta, program->method_meta("forward"));
  AlignedBuffer buf(meta.arena_bytes + 64);
  MethodOptions opts;
  opts.arena = std::span<uint8_t>(buf.data + 8, meta.arena_bytes);
  auto m = program->load_method("forward", opts);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), ErrorCode::InvalidArgument);
  expect_contains(m.error().message(), {"aligned"});
}

TEST(CallerArena, AdequateArenaIsUsedAndWorks) {
  auto program = two_input_program();
  ASSERT_NE(program, nullptr);
  KILN_ASSERT_OK_AND_ASSIGN(meta, program->method_meta("forward"));
  // Exactly the planned size (ASan catches a write past it), and two instances with their own
  // arenas give independent results.
  AlignedBuffer a(meta.arena_bytes), b(meta.arena_bytes);
  MethodOptions oa, ob;
  oa.arena = a.span();
  ob.arena = b.span();
  KILN_ASSERT_OK_AND_ASSIGN(ma, program->load_method("forward", oa));
  KILN_ASSERT_OK_AND_ASSIGN(mb, program->load_method("forward", ob));
  std::vector<float> xa = {1, 2, 3, 4, 5, 6}, xb = {-1, -2, -3, 10, 20, 30}, bias = {0.25f, -1.0f, 0.0f};
  KILN_ASSERT_OK_AND_ASSIGN(outa, ma.execute({Tensor{DType::Float32, {2, 3}, xa.data()}, Tensor{DType::Float32, {3}, bias.data()}}));
  KILN_ASSERT_OK_AND_ASSIGN(outb, mb.execute({Tensor{DType::Float32, {2, 3}, xb.data()}, Tensor{DType::Float32, {3}, bias.data()}}));
  const auto* pa = static_cast<const uint8_t*>(outa[0].data);
  const auto* pb = static_cast<const uint8_t*>(outb[0].data);
  EXPECT_TRUE(pa >= a.data && pa + outa[0].nbytes() <= a.data + a.size) << "output is not in the caller's arena";
  EXPECT_TRUE(pb >= b.data && pb + outb[0].nbytes() <= b.data + b.size) << "output is not in the caller's arena";
  const float want_a[] = {1.25f, 1.0f, 3.0f, 4.25f, 4.0f, 6.0f};
  const float want_b[] = {0.0f, 0.0f, 0.0f, 10.25f, 19.0f, 30.0f};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(outa[0].data_as<float>()[i], want_a[i]) << i;
    EXPECT_EQ(outb[0].data_as<float>()[i], want_b[i]) << i;
  }
}

// ---- concurrency ----

constexpr int64_t kRows = 32;
constexpr int64_t kCols = 256;

// A 6-op chain with a constant: v = x; repeat 3x { v = relu(v + (-0.5) * c) ; } ; y = v + v.
std::shared_ptr<Program> chain_program(const std::vector<float>& c) {
  Graph g;
  ValueId v = g.add_input("x", {DType::Float32, {kRows, kCols}});
  auto cid = g.add_constant("c", {DType::Float32, {kCols}}, testing::float_bytes(c));
  EXPECT_TRUE(cid.ok());
  for (int i = 0; i < 3; ++i) {
    auto s = g.add_node("aten.add", {v, cid.value()}, {{"alpha", -0.5}});
    EXPECT_TRUE(s.ok());
    auto r = g.add_node("aten.relu", {s.value()[0]}, {});
    EXPECT_TRUE(r.ok());
    v = r.value()[0];
  }
  auto y = g.add_node("aten.add", {v, v}, {});
  EXPECT_TRUE(y.ok());
  EXPECT_TRUE(g.set_outputs({y.value()[0]}).ok());
  ProgramBuilder pb;
  EXPECT_TRUE(pb.add_method("forward", std::move(g)).ok());
  auto compiled = pb.compile();
  EXPECT_TRUE(compiled.ok());
  if (!compiled.ok()) return nullptr;
  auto program = Program::load_from_buffer(compiled->bytes);
  return program.ok() ? program.value() : nullptr;
}

std::vector<float> chain_reference(const std::vector<float>& x, const std::vector<float>& c) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    float v = x[i];
    for (int k = 0; k < 3; ++k) {
      v = v + -0.5f * c[i % kCols];
      v = v > 0.0f ? v : 0.0f;
    }
    y[i] = v + v;
  }
  return y;
}

TEST(Concurrency, MethodsOfOneProgramRunInParallel) {
  const std::vector<float> c = pattern(kCols, 17);
  auto program = chain_program(c);
  ASSERT_NE(program, nullptr);
  constexpr int kThreads = 4;
  constexpr int kIters = 25;
  std::vector<std::string> failures(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread loads its own Method (load_method itself runs concurrently too); half use a
      // caller-supplied arena.
      auto meta = program->method_meta("forward");
      AlignedBuffer arena(meta.ok() ? meta->arena_bytes : 64);
      MethodOptions opts;
      if (t % 2 == 1) opts.arena = arena.span();
      auto method = program->load_method("forward", opts);
      if (!method.ok()) { failures[t] = method.error().to_string(); return; }
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();  // start executing together
      for (int it = 0; it < kIters; ++it) {
        const std::vector<float> x = pattern(kRows * kCols, static_cast<uint32_t>(1000 * t + it));
        const std::vector<float> want = chain_reference(x, c);
        auto outs = method->execute({Tensor{DType::Float32, {kRows, kCols}, const_cast<float*>(x.data())}});
        if (!outs.ok()) { failures[t] = outs.error().to_string(); return; }
        const float* y = (*outs)[0].data_as<float>();
        for (size_t i = 0; i < want.size(); ++i) {
          if (std::abs(y[i] - want[i]) > 1e-5f * 8.0f) {
            failures[t] = "thread " + std::to_string(t) + " iteration " + std::to_string(it) + " element " +
                          std::to_string(i) + ": got " + std::to_string(y[i]) + ", want " + std::to_string(want[i]);
            return;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
}

TEST(Concurrency, ProgramsLoadedAndDroppedInParallel) {
  // Loading (registry look-ups, verification) and destroying programs from several threads.
  const std::vector<float> c = pattern(16, 3);
  auto bytes = testing::compile_add_relu(2, 16, c, 1.0);
  ASSERT_TRUE(bytes.ok());
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int it = 0; it < 20; ++it) {
        auto p = Program::load_from_buffer(bytes.value());
        if (!p.ok()) { failures[t] = p.error().to_string(); return; }
        auto m = (*p)->load_method("forward");
        if (!m.ok()) { failures[t] = m.error().to_string(); return; }
        std::vector<float> x(32, static_cast<float>(t));
        auto outs = m->execute({Tensor{DType::Float32, {2, 16}, x.data()}});
        if (!outs.ok()) { failures[t] = outs.error().to_string(); return; }
        const auto want = testing::add_relu_reference(x, 16, c, 1.0);
        for (size_t i = 0; i < 32; ++i) {
          if (std::abs((*outs)[0].data_as<float>()[i] - want[i]) > 1e-5f * 4.0f) { failures[t] = "wrong value"; return; }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
}

TEST(Concurrency, ThreadPoolParallelForFromManyCallers) {
  // Several threads share one pool (as Methods share the default pool): every call covers
  // [0, n) exactly once whether it ran on the workers or inline.
  ThreadPool pool(4);
  constexpr int kCallers = 4;
  std::vector<std::string> failures(kCallers);
  std::vector<std::thread> threads;
  for (int t = 0; t < kCallers; ++t) {
    threads.emplace_back([&, t] {
      for (int it = 0; it < 200; ++it) {
        const int64_t n = 1 + (it * 37 + t * 11) % 1000;
        std::vector<int> hits(static_cast<size_t>(n), 0);
        pool.parallel_for(n, 16, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)] += 1;
        });
        for (int64_t i = 0; i < n; ++i) {
          if (hits[static_cast<size_t>(i)] != 1) {
            failures[t] = "n=" + std::to_string(n) + " index " + std::to_string(i) + " hit " +
                          std::to_string(hits[static_cast<size_t>(i)]) + " times";
            return;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kCallers; ++t) EXPECT_EQ(failures[t], "") << "caller " << t;
}

TEST(Concurrency, ThreadPoolChunksClaimedOnceAndFinishedBeforeReturn) {
  // Chunks are claimed dynamically (a late worker leaves its chunk to the caller): every index is
  // still run exactly once, no chunk runs after parallel_for returned (the body's captures are
  // gone by then), and workers that went to sleep between jobs (pauses > the ~200 us spin) wake
  // for the next one.
  ThreadPool pool(3);
  std::atomic<int> inside{0};
  std::atomic<int64_t> late{0};
  for (int it = 0; it < 300; ++it) {
    const int64_t n = 1 + (it * 53) % 97;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<bool> returned{false};
    pool.parallel_for(n, 1 + it % 5, [&](int64_t b, int64_t e) {
      inside.fetch_add(1);
      if (returned.load()) late.fetch_add(1);
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      if (it % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      inside.fetch_sub(1);
    });
    returned.store(true);
    ASSERT_EQ(inside.load(), 0) << "a chunk still running after parallel_for returned (job " << it << ")";
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "job " << it << " index " << i;
    if (it % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // workers sleep
  }
  EXPECT_EQ(late.load(), 0);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(MethodReuse, OutputsFedBackAsInputsAreNotClobbered) {
  // outputs (b, a, relu(a)) of inputs (a, b): the first two are the input slots themselves.
  // Feeding the views of one execute into the next (swapped) must read the values they held
  // when execute() was called, even though writing one input slot overwrites the other's view.
  Graph g;
  ValueId a = g.add_input("a", {DType::Float32, {4}});
  ValueId b = g.add_input("b", {DType::Float32, {4}});
  auto r = g.add_node("aten.relu", {a}, {});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(g.set_outputs({b, a, r.value()[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("swap", std::move(g)).ok());
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile());
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("swap"));
  std::vector<float> a0 = {1, -2, 3, -4}, b0 = {-10, 20, -30, 40};
  KILN_ASSERT_OK_AND_ASSIGN(first, method.execute({Tensor{DType::Float32, {4}, a0.data()}, Tensor{DType::Float32, {4}, b0.data()}}));
  ASSERT_EQ(first.size(), 3u);
  KILN_ASSERT_OK_AND_ASSIGN(second, method.execute({first[0], first[1]}));  // inputs (b0, a0)
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(second[0].data_as<float>()[i], a0[i]) << i;
    EXPECT_EQ(second[1].data_as<float>()[i], b0[i]) << i;
    EXPECT_EQ(second[2].data_as<float>()[i], b0[i] > 0 ? b0[i] : 0.0f) << i;
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Program::method_instructions: the loader's view of each instruction (what `kiln report` shows),
// checked against the graph that was compiled and the method's planned arena.
TEST(MethodInstructions, ListsOpsArgumentsAndArenaRanges) {
  const std::vector<float> c = {1.0f, -2.0f, 3.0f, -4.0f};
  KILN_ASSERT_OK_AND_ASSIGN(bytes, testing::compile_add_relu(3, 4, c, 0.5));
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(bytes));
  KILN_ASSERT_OK_AND_ASSIGN(meta, program->method_meta("forward"));
  KILN_ASSERT_OK_AND_ASSIGN(list, program->method_instructions("forward"));
  ASSERT_EQ(list.size(), meta.num_instructions);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].op, "aten.add");
  EXPECT_EQ(list[0].debug_name, "add");
  EXPECT_EQ(list[1].op, "aten.relu");
  for (size_t k = 0; k < list.size(); ++k) {
    EXPECT_EQ(list[k].index, k);
    EXPECT_TRUE(list[k].kernel == "cpu" || list[k].kernel == "portable") << list[k].kernel;
    EXPECT_TRUE(list[k].backend.empty());
    for (const InstructionValue& v : list[k].outputs) {
      ASSERT_GE(v.arena_offset, 0);
      EXPECT_LE(static_cast<uint64_t>(v.arena_offset) + v.type.nbytes(), meta.arena_bytes);
      EXPECT_EQ(v.type, (TensorType{DType::Float32, {3, 4}}));
    }
  }
  // add(x, c): the input in the arena, the constant not; relu reads add's output.
  ASSERT_EQ(list[0].inputs.size(), 2u);
  EXPECT_EQ(list[0].inputs[0].name, "x");
  EXPECT_FALSE(list[0].inputs[0].constant);
  EXPECT_TRUE(list[0].inputs[1].constant);
  EXPECT_EQ(list[0].inputs[1].arena_offset, -1);
  EXPECT_EQ(list[0].inputs[1].type, (TensorType{DType::Float32, {4}}));
  EXPECT_EQ(list[1].inputs[0].index, list[0].outputs[0].index);
  EXPECT_EQ(list[1].inputs[0].arena_offset, list[0].outputs[0].arena_offset);

  EXPECT_EQ(program->method_instructions("nope").error().code(), ErrorCode::NotFound);
  EXPECT_EQ(program->method_instructions("forward", 1).error().code(), ErrorCode::NotFound);
  KILN_ASSERT_OK_AND_ASSIGN(same, program->method_instructions("forward", 0));
  EXPECT_EQ(same.size(), list.size());

  // The compiler's delegation record is in the metadata (no backends requested here).
  const std::string* d = program->metadata_value("kiln.delegation");
  ASSERT_NE(d, nullptr);
  EXPECT_NE(d->find("\"name\":\"forward\""), std::string::npos) << *d;
  EXPECT_NE(d->find("\"requested\":[]"), std::string::npos) << *d;
}

TEST(MethodInstructions, EveryAlternativeIsListed) {
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {2, 2}});
  KILN_ASSERT_OK_AND_ASSIGN(r, g.add_node("aten.relu", {x}, {}, "relu"));
  ASSERT_TRUE(g.set_outputs({r[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
  CompileOptions co;
  co.alternatives = {{}, {}};
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile(co));
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(meta, program->method_meta("forward"));
  ASSERT_EQ(meta.num_alternatives, 2u);
  EXPECT_EQ(meta.alternative, 0u);
  KILN_ASSERT_OK_AND_ASSIGN(other, program->method_instructions("forward", 1));
  ASSERT_EQ(other.size(), 1u);
  EXPECT_EQ(other[0].op, "aten.relu");
  EXPECT_EQ(program->method_instructions("forward", 2).error().code(), ErrorCode::NotFound);
  // both alternatives recorded by the compiler
  const std::string* d = program->metadata_value("kiln.delegation");
  ASSERT_NE(d, nullptr);
  EXPECT_NE(d->find("\"alternative\":1"), std::string::npos) << *d;
}

}  // namespace
}  // namespace kiln

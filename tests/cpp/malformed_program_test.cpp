// Malformed program files (src/runtime/loader.cpp): truncation, random byte flips, wrong magic
// and version, and out-of-range indices/offsets crafted by editing a real file's FlatBuffer in
// place through the generated mutable API. Every case must give an error value, never a crash;
// run under -DKILN_SANITIZE="address;undefined" (scripts/sanitizers.sh) to catch bad reads.
#include <cstdio>
#include <limits>
#include <type_traits>

#include "program_generated.h"
#include "runtime/file_format.h"
#include "runtime_test_util.h"

namespace kiln {
namespace {

using testing::pattern;

constexpr int64_t kRows = 2;
constexpr int64_t kCols = 8;

std::vector<uint8_t> small_program() {
  auto bytes = testing::compile_add_relu(kRows, kCols, pattern(kCols, 11), 2.0);
  EXPECT_TRUE(bytes.ok()) << bytes.error().to_string();
  return bytes.ok() ? bytes.value() : std::vector<uint8_t>{};
}

FileHeader header_of(const std::vector<uint8_t>& bytes) {
  FileHeader h{};
  std::memcpy(&h, bytes.data(), sizeof(h));
  return h;
}

void set_header(std::vector<uint8_t>& bytes, const FileHeader& h) { std::memcpy(bytes.data(), &h, sizeof(h)); }

fb::Program* mutable_program(std::vector<uint8_t>& bytes) {
  return fb::GetMutableProgram(bytes.data() + header_of(bytes).flatbuffer_offset);
}

// Loads a program and, if that works, loads and runs every method on zero inputs (skipping
// methods whose arena or inputs exceed 64 MiB: a file may legitimately ask for a lot).
// Returns the load error (Ok when the file loaded). Must never crash.
Error load_and_run(std::span<const uint8_t> bytes) {
  auto program = Program::load_from_buffer(bytes);
  if (!program.ok()) return program.error();
  constexpr uint64_t kCap = 64ull << 20;
  for (const std::string& name : (*program)->method_names()) {
    auto meta = (*program)->method_meta(name);
    if (!meta.ok() || meta->arena_bytes > kCap) continue;
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<Tensor> inputs;
    bool too_big = false;
    for (const TensorType& t : meta->inputs) {
      if (t.nbytes() > kCap) too_big = true;
    }
    if (too_big) continue;
    for (const TensorType& t : meta->inputs) {
      buffers.emplace_back(t.nbytes());
      inputs.push_back(Tensor{t.dtype, t.sizes, buffers.back().data()});
    }
    auto method = (*program)->load_method(name);
    if (!method.ok()) continue;
    auto outs = method->execute(std::span<const Tensor>(inputs));
    if (outs.ok()) {
      // Touch every output byte: a view outside the arena would be caught by ASan here.
      volatile uint8_t sink = 0;
      for (const Tensor& o : *outs) {
        const auto* p = static_cast<const uint8_t*>(o.data);
        for (size_t i = 0; i < o.nbytes(); ++i) sink = sink ^ p[i];
      }
      (void)sink;
    }
  }
  return {};
}

TEST(MalformedProgram, TheUnmodifiedProgramLoadsAndRuns) {
  const auto bytes = small_program();
  ASSERT_FALSE(bytes.empty());
  EXPECT_TRUE(load_and_run(bytes).ok());
  // A sanity check of the layout the other tests edit: header, FlatBuffer, one constant segment.
  const FileHeader h = header_of(bytes);
  EXPECT_EQ(h.file_size, bytes.size());
  EXPECT_EQ(h.flatbuffer_offset, sizeof(FileHeader));
  EXPECT_EQ(h.segments_offset % kSegmentAlignment, 0u);
  EXPECT_LT(h.segments_offset, bytes.size());
}

TEST(MalformedProgram, EveryTruncationIsAnError) {
  const auto bytes = small_program();
  ASSERT_FALSE(bytes.empty());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto p = Program::load_from_buffer(std::span<const uint8_t>(bytes.data(), n));
    ASSERT_FALSE(p.ok()) << "prefix of " << n << " bytes loaded";
    EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram) << n << ": " << p.error().to_string();
  }
}

TEST(MalformedProgram, TruncationWithAConsistentHeaderIsAnError) {
  // A truncated file whose header was patched to its new length: the deeper checks
  // (FlatBuffer extent, segment bounds) must catch it.
  const auto bytes = small_program();
  ASSERT_FALSE(bytes.empty());
  for (size_t n = sizeof(FileHeader); n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    FileHeader h = header_of(cut);
    h.file_size = n;
    set_header(cut, h);
    auto p = Program::load_from_buffer(cut);
    ASSERT_FALSE(p.ok()) << "prefix of " << n << " bytes with a patched header loaded";
    EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram) << n << ": " << p.error().to_string();
  }
}

TEST(MalformedProgram, RandomByteFlipsNeverCrash) {
  const auto bytes = small_program();
  ASSERT_FALSE(bytes.empty());
  const uint64_t fb_end = header_of(bytes).flatbuffer_offset + header_of(bytes).flatbuffer_size;
  std::mt19937_64 rng(20240611);
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::vector<uint8_t> b = bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      // Mostly inside header + FlatBuffer, where the structure is; sometimes anywhere.
      const uint64_t limit = rng() % 4 != 0 ? fb_end : b.size();
      const size_t pos = static_cast<size_t>(rng() % limit);
      if (rng() % 2) {
        b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
      } else {
        b[pos] = static_cast<uint8_t>(rng());
      }
    }
    const Error err = load_and_run(b);
    if (err.ok()) {
      ++loaded;
    } else {
      ++rejected;
      EXPECT_FALSE(err.message().empty()) << "iteration " << iter;
      EXPECT_NE(err.code(), ErrorCode::Internal) << "iteration " << iter << ": " << err.to_string();
    }
  }
  // Both outcomes occur: the flips hit both checked structure and don't-care bytes.
  EXPECT_GT(rejected, 0);
  EXPECT_GT(loaded, 0);
  std::printf("[          ] byte flips: %d loaded, %d rejected\n", loaded, rejected);
}

TEST(MalformedProgram, WrongMagicIsInvalidProgram) {
  auto bytes = small_program();
  ASSERT_FALSE(bytes.empty());
  bytes[0] = 'X';
  auto p = Program::load_from_buffer(bytes);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram);
  EXPECT_NE(p.error().message().find("magic"), std::string::npos) << p.error().message();
}

TEST(MalformedProgram, WrongVersionIsInvalidProgramNamingTheVersion) {
  auto bytes = small_program();
  ASSERT_FALSE(bytes.empty());
  FileHeader h = header_of(bytes);
  h.version = 4242;
  set_header(bytes, h);
  auto p = Program::load_from_buffer(bytes);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram);
  EXPECT_NE(p.error().message().find("4242"), std::string::npos) << p.error().message();

  // The FlatBuffer's own version must agree with the header's.
  auto bytes2 = small_program();
  ASSERT_TRUE(mutable_program(bytes2)->mutate_version(kFormatVersion + 1));
  auto p2 = Program::load_from_buffer(bytes2);
  ASSERT_FALSE(p2.ok());
  EXPECT_EQ(p2.error().code(), ErrorCode::InvalidProgram);
}

TEST(MalformedProgram, HeaderFieldsOutOfRange) {
  const auto bytes = small_program();
  ASSERT_FALSE(bytes.empty());
  auto expect_invalid = [&](const char* what, auto edit) {
    std::vector<uint8_t> b = bytes;
    FileHeader h = header_of(b);
    edit(h);
    set_header(b, h);
    auto p = Program::load_from_buffer(b);
    ASSERT_FALSE(p.ok()) << what;
    EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram) << what << ": " << p.error().to_string();
  };
  expect_invalid("header_size", [](FileHeader& h) { h.header_size = 32; });
  expect_invalid("flatbuffer_offset", [](FileHeader& h) { h.flatbuffer_offset = 128; });
  expect_invalid("flatbuffer_size huge", [](FileHeader& h) { h.flatbuffer_size = ~0ull; });
  expect_invalid("flatbuffer_size past end", [&](FileHeader& h) { h.flatbuffer_size = bytes.size(); });
  expect_invalid("flatbuffer_size short", [](FileHeader& h) { h.flatbuffer_size = 16; });
  expect_invalid("file_size", [](FileHeader& h) { h.file_size += 1; });
}

// ---- targeted edits of the FlatBuffer (scalars only, so the FlatBuffers verifier still passes
// and the loader's semantic checks are what must catch them) ----

class EditedProgram : public ::testing::Test {
 protected:
  void SetUp() override {
    bytes_ = small_program();
    ASSERT_FALSE(bytes_.empty());
    // Find the constant value and a planned (arena) value with bytes.
    fb::Method* m = mutable_program(bytes_)->mutable_methods()->GetMutableObject(0);
    for (flatbuffers::uoffset_t i = 0; i < m->values()->size(); ++i) {
      const fb::Tensor* t = m->values()->Get(i);
      if (t->constant() >= 0) constant_value_ = static_cast<int>(i);
      if (t->constant() < 0 && arena_value_ < 0) arena_value_ = static_cast<int>(i);
    }
    ASSERT_GE(constant_value_, 0);
    ASSERT_GE(arena_value_, 0);
  }

  // Applies `edit` to a copy and checks that loading fails with `code` and a message
  // containing `needle`.
  template <typename Edit>
  void expect_error(const char* what, Edit edit, const std::string& needle = "",
                    ErrorCode code = ErrorCode::InvalidProgram) {
    SCOPED_TRACE(what);
    std::vector<uint8_t> b = bytes_;
    fb::Program* prog = mutable_program(b);
    if constexpr (std::is_void_v<decltype(edit(prog))>) {
      edit(prog);  // Vector::Mutate: always applies
    } else {
      ASSERT_TRUE(edit(prog)) << "the edit did not apply (field absent from the buffer?)";
    }
    auto p = Program::load_from_buffer(b);
    ASSERT_FALSE(p.ok()) << "loaded";
    EXPECT_EQ(p.error().code(), code) << p.error().to_string();
    EXPECT_NE(p.error().message().find(needle), std::string::npos) << p.error().message();
  }

  fb::Method* method(fb::Program* p) { return p->mutable_methods()->GetMutableObject(0); }
  fb::Tensor* value(fb::Program* p, int i) {
    return method(p)->mutable_values()->GetMutableObject(static_cast<flatbuffers::uoffset_t>(i));
  }
  fb::KernelCall* call(fb::Program* p, int k) {
    auto* e = method(p)->mutable_instructions()->GetMutableObject(static_cast<flatbuffers::uoffset_t>(k));
    return static_cast<fb::KernelCall*>(e->mutable_instr());
  }

  std::vector<uint8_t> bytes_;
  int constant_value_ = -1;
  int arena_value_ = -1;
};

TEST_F(EditedProgram, ValueIndicesOutOfRange) {
  expect_error("kernel arg", [&](fb::Program* p) { return call(p, 0)->mutable_args()->Mutate(0, 1000); }, "out of range");
  expect_error("kernel arg negative", [&](fb::Program* p) { return call(p, 0)->mutable_args()->Mutate(1, -7); },
               "out of range");
  expect_error("kernel output", [&](fb::Program* p) { return call(p, 1)->mutable_outputs()->Mutate(0, 1 << 30); },
               "out of range");
  expect_error("method input", [&](fb::Program* p) { return method(p)->mutable_inputs()->Mutate(0, 77); },
               "out of range");
  expect_error("method output", [&](fb::Program* p) { return method(p)->mutable_outputs()->Mutate(0, -1); },
               "out of range");
  // In range but semantically wrong: reading a value before it is written, writing a constant.
  expect_error("read before write",
               [&](fb::Program* p) { return call(p, 0)->mutable_args()->Mutate(0, call(p, 1)->outputs()->Get(0)); },
               "before it is written");
  expect_error("write a constant",
               [&](fb::Program* p) { return call(p, 1)->mutable_outputs()->Mutate(0, constant_value_); });
}

TEST_F(EditedProgram, ConstantIndicesOutOfRange) {
  expect_error("constant index", [&](fb::Program* p) { return value(p, constant_value_)->mutate_constant(1); },
               "constant index out of range");
  expect_error("constant index huge",
               [&](fb::Program* p) { return value(p, constant_value_)->mutate_constant(std::numeric_limits<int32_t>::max()); },
               "constant index out of range");
  expect_error("constant index negative", [&](fb::Program* p) { return value(p, constant_value_)->mutate_constant(-5); },
               "invalid constant index");
  expect_error("constant nbytes past segment",
               [&](fb::Program* p) { return p->mutable_constants()->GetMutableObject(0)->mutate_nbytes(1 << 20); },
               "constant range");
  expect_error("constant nbytes overflow",
               [&](fb::Program* p) { return p->mutable_constants()->GetMutableObject(0)->mutate_nbytes(~0ull); },
               "constant range");
  expect_error("constant nbytes differs from type",
               [&](fb::Program* p) { return p->mutable_constants()->GetMutableObject(0)->mutate_nbytes(kCols * 4 - 4); },
               "constant holds");
}

TEST_F(EditedProgram, SegmentOffsetsOutOfRange) {
  const uint64_t size = bytes_.size();
  expect_error("segment past end",
               [&](fb::Program* p) { return p->mutable_segments()->GetMutableObject(0)->mutate_offset(size + 4096 * 4); },
               "segment");
  expect_error("segment unaligned",
               [&](fb::Program* p) {
                 auto* s = p->mutable_segments()->GetMutableObject(0);
                 return s->mutate_offset(s->offset() + 64);
               },
               "segment");
  expect_error("segment overlapping the FlatBuffer",
               [&](fb::Program* p) {
                 auto* s = p->mutable_segments()->GetMutableObject(0);
                 return s->mutate_offset(s->offset() - kSegmentAlignment);
               },
               "segment");
  expect_error("segment size past end",
               [&](fb::Program* p) { return p->mutable_segments()->GetMutableObject(0)->mutate_size(size); }, "segment");
  expect_error("segment size overflow",
               [&](fb::Program* p) { return p->mutable_segments()->GetMutableObject(0)->mutate_size(~0ull - 100); },
               "segment");
  expect_error("segment offset overflow",
               [&](fb::Program* p) { return p->mutable_segments()->GetMutableObject(0)->mutate_offset(~0ull - 4095); },
               "segment");
}

TEST_F(EditedProgram, ArenaOffsetsOutOfRange) {
  const uint64_t arena = bytes_.empty() ? 0 : mutable_program(bytes_)->methods()->Get(0)->arena_size();
  ASSERT_GT(arena, 0u);
  expect_error("offset at arena end",
               [&](fb::Program* p) { return value(p, arena_value_)->mutate_arena_offset(static_cast<int64_t>(arena)); },
               "arena range");
  expect_error("offset huge",
               [&](fb::Program* p) {
                 return value(p, arena_value_)->mutate_arena_offset(std::numeric_limits<int64_t>::max() - 3);
               },
               "arena");
  expect_error("offset unaligned", [&](fb::Program* p) { return value(p, arena_value_)->mutate_arena_offset(4); },
               "arena range");
  expect_error("offset negative", [&](fb::Program* p) { return value(p, arena_value_)->mutate_arena_offset(-64); },
               "arena offset");
  expect_error("arena too small", [&](fb::Program* p) { return method(p)->mutate_arena_size(64); }, "arena range");
  expect_error("arena huge", [&](fb::Program* p) { return method(p)->mutate_arena_size(~0ull); }, "arena size");
  // A value grown past the arena (its sizes edited): the byte range no longer fits.
  expect_error("value grown",
               [&](fb::Program* p) { return value(p, arena_value_)->mutable_sizes()->Mutate(0, 1 << 20); });
  expect_error("negative size", [&](fb::Program* p) { return value(p, arena_value_)->mutable_sizes()->Mutate(0, -2); },
               "negative size");
  expect_error("size overflow",
               [&](fb::Program* p) { return value(p, arena_value_)->mutable_sizes()->Mutate(0, int64_t{1} << 62); },
               "overflow");
}

TEST_F(EditedProgram, OpsAndAttributes) {
  expect_error(
      "unknown op",
      [&](fb::Program* p) {
        flatbuffers::String* op = call(p, 0)->mutable_op();
        op->data()[5] = 'x';  // "aten.add" -> "aten.xdd"
        return true;
      },
      "aten.xdd", ErrorCode::OperatorMissing);
  expect_error("invalid attribute kind",
               [&](fb::Program* p) {
                 return call(p, 0)->mutable_attributes()->GetMutableObject(0)->mutate_kind(static_cast<fb::AttrKind>(99));
               },
               "invalid kind");
  expect_error("attribute of the wrong kind",
               [&](fb::Program* p) {
                 return call(p, 0)->mutable_attributes()->GetMutableObject(0)->mutate_kind(fb::AttrKind::String);
               },
               "alpha");
  // The output's recorded type no longer matches what the op infers from its inputs.
  expect_error("output type differs",
               [&](fb::Program* p) {
                 const int out = call(p, 1)->outputs()->Get(0);
                 return value(p, out)->mutable_sizes()->Mutate(0, 1);
               },
               "differs");
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST_F(EditedProgram, InstructionOutputsOverlappingInputsAreRejected) {
  // All activations placed on the same arena bytes: aten.add would write over the input it
  // reads (found by the fuzzer as a memcpy-param-overlap in aten.cat).
  expect_error("every value at offset 0",
               [&](fb::Program* p) {
                 bool ok = true;
                 auto* values = method(p)->mutable_values();
                 for (flatbuffers::uoffset_t i = 0; i < values->size(); ++i) {
                   auto* v = values->GetMutableObject(i);
                   if (v->arena_offset() >= 0) ok = ok && v->mutate_arena_offset(0);
                 }
                 return ok;
               },
               "overlaps");
}

TEST(MalformedProgram, ViewsShareBytesOnlyExactly) {
  // x -> a = x + x -> v = view(a) -> relu(v) * a: the planner gives v exactly a's bytes (a
  // zero-copy view, accepted and computing the right values); a file placing v on part of a's
  // bytes, or the add's output on exactly x's bytes (not a view), is rejected.
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {4, 16}});
  auto a = g.add_node("aten.add", {x, x}, {});
  ASSERT_TRUE(a.ok());
  auto v = g.add_node("aten.view", {a.value()[0]}, {{"size", std::vector<int64_t>{64}}});
  ASSERT_TRUE(v.ok());
  auto r = g.add_node("aten.relu", {v.value()[0]}, {});
  ASSERT_TRUE(r.ok());
  auto a64 = g.add_node("aten.view", {a.value()[0]}, {{"size", std::vector<int64_t>{64}}});
  ASSERT_TRUE(a64.ok());
  auto y = g.add_node("aten.mul", {r.value()[0], a64.value()[0]}, {});
  ASSERT_TRUE(y.ok());
  ASSERT_TRUE(g.set_outputs({y.value()[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile());
  // Value indices in the file: x 0, then each instruction's new arguments and results in order
  // (add: a 1; view: v 2; relu: 3; view: 4; mul: 5).
  const fb::Method* m0 = mutable_program(compiled.bytes)->methods()->Get(0);
  ASSERT_EQ(m0->values()->size(), 6u);
  const int64_t a_off = m0->values()->Get(1)->arena_offset();
  EXPECT_EQ(m0->values()->Get(2)->arena_offset(), a_off) << "the view does not share a's bytes";
  EXPECT_EQ(m0->values()->Get(4)->arena_offset(), a_off) << "the view does not share a's bytes";
  {
    KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
    KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
    std::vector<float> xv = pattern(64, 5);
    KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute({Tensor{DType::Float32, {4, 16}, xv.data()}}));
    for (size_t i = 0; i < 64; ++i) {
      const float s = xv[i] + xv[i];
      EXPECT_EQ(outs[0].data_as<float>()[i], (s > 0.0f ? s : 0.0f) * s) << i;
    }
  }
  auto expect_rejected = [&](const char* what, int value, int64_t offset) {
    SCOPED_TRACE(what);
    std::vector<uint8_t> b = compiled.bytes;
    fb::Method* m = mutable_program(b)->mutable_methods()->GetMutableObject(0);
    ASSERT_TRUE(m->mutable_values()->GetMutableObject(static_cast<flatbuffers::uoffset_t>(value))->mutate_arena_offset(offset));
    auto p = Program::load_from_buffer(b);
    ASSERT_FALSE(p.ok()) << "loaded";
    EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram);
    EXPECT_NE(p.error().message().find("overlaps"), std::string::npos) << p.error().message();
  };
  const int64_t arena = static_cast<int64_t>(m0->arena_size());
  expect_rejected("view output on part of its input", 2, a_off + 64 + 256 <= arena ? a_off + 64 : a_off - 64);
  expect_rejected("add output on exactly its input's bytes", 1, m0->values()->Get(0)->arena_offset());
}

TEST(MalformedProgram, HugeSizesBesideAZeroSizeAreRejected) {
  // relu on float32[0, 4], then both tensors edited to [0, 2^62]: zero elements, but a kernel
  // multiplying the other sizes would overflow, so the loader bounds the non-zero sizes too.
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {0, 4, 1}});
  auto r = g.add_node("aten.relu", {x}, {});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(g.set_outputs({r.value()[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile());
  ASSERT_TRUE(Program::load_from_buffer(compiled.bytes).ok());
  std::vector<uint8_t> b = compiled.bytes;
  fb::Method* m = mutable_program(b)->mutable_methods()->GetMutableObject(0);
  for (flatbuffers::uoffset_t i = 0; i < m->values()->size(); ++i) {
    m->mutable_values()->GetMutableObject(i)->mutable_sizes()->Mutate(1, int64_t{1} << 62);
    m->mutable_values()->GetMutableObject(i)->mutable_sizes()->Mutate(2, int64_t{1} << 40);
  }
  auto p = Program::load_from_buffer(b);
  ASSERT_FALSE(p.ok()) << "a [0, 2^62, 2^40] tensor was accepted";
  EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram);
  EXPECT_NE(p.error().message().find("size overflow"), std::string::npos) << p.error().message();
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A hand-built program: y = relu(x), x and y float32[2], x's sizes vector either a normal
// int64 vector or one whose elements sit on a 4-byte (not 8-byte) boundary. The FlatBuffers
// verifier only checks a vector's 4-byte length prefix, so the loader must check the rest.
std::vector<uint8_t> hand_built_relu(bool misaligned_sizes) {
  flatbuffers::FlatBufferBuilder b;
  flatbuffers::Offset<flatbuffers::Vector<int64_t>> x_sizes;
  if (misaligned_sizes) {
    // The builder grows downwards; an object's final alignment is -(offset from the end) mod 8.
    // Pad so that the 8 data bytes end up at 4 mod 8, then write length 1 by hand.
    b.Align(4);
    if (b.GetSize() % 8 == 0) b.PushElement<uint32_t>(0);
    b.StartVector(8, 1);
    for (int i = 7; i >= 0; --i) b.PushElement<uint8_t>(i == 0 ? 2 : 0);  // int64 2, little-endian
    x_sizes = flatbuffers::Offset<flatbuffers::Vector<int64_t>>(b.EndVector(1));
    EXPECT_EQ(x_sizes.o % 8, 0u);  // data at (o - 4) from the end: 4 mod 8
  } else {
    x_sizes = b.CreateVector(std::vector<int64_t>{2});
  }
  auto x = fb::CreateTensor(b, fb::DType::Float32, x_sizes, 0, -1, 0, b.CreateString("x"));
  auto y = fb::CreateTensor(b, fb::DType::Float32, b.CreateVector(std::vector<int64_t>{2}), 0, -1, 64);
  auto call = fb::CreateKernelCall(b, b.CreateString("aten.relu"), b.CreateVector(std::vector<int32_t>{0}),
                                   b.CreateVector(std::vector<int32_t>{1}));
  auto entry = fb::CreateInstructionEntry(b, fb::Instruction::KernelCall, call.Union());
  auto method = fb::CreateMethod(b, b.CreateString("forward"), b.CreateVector({x, y}),
                                 b.CreateVector(std::vector<int32_t>{0}), b.CreateVector(std::vector<int32_t>{1}),
                                 b.CreateVector({entry}), 128);
  fb::FinishProgramBuffer(b, fb::CreateProgram(b, kFormatVersion, b.CreateVector({method})));
  std::vector<uint8_t> file(sizeof(FileHeader) + b.GetSize());
  FileHeader h{};
  std::memcpy(h.magic, kFileMagic, sizeof(kFileMagic));
  h.version = kFormatVersion;
  h.header_size = sizeof(FileHeader);
  h.flatbuffer_offset = sizeof(FileHeader);
  h.flatbuffer_size = b.GetSize();
  h.segments_offset = file.size();
  h.file_size = file.size();
  std::memcpy(file.data(), &h, sizeof(h));
  std::memcpy(file.data() + sizeof(h), b.GetBufferPointer(), b.GetSize());
  return file;
}

TEST(MalformedProgram, MisalignedVectorIsRejected) {
  // The well-formed twin loads and runs, so the construction itself is sound.
  const auto good = hand_built_relu(false);
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(good));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  std::vector<float> x = {-1.0f, 3.0f};
  KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute({Tensor{DType::Float32, {2}, x.data()}}));
  EXPECT_EQ(outs[0].data_as<float>()[0], 0.0f);
  EXPECT_EQ(outs[0].data_as<float>()[1], 3.0f);

  const auto bad = hand_built_relu(true);
  auto p = Program::load_from_buffer(bad);
  ASSERT_FALSE(p.ok()) << "an int64 vector on a 4-byte boundary was read";
  EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram);
  EXPECT_NE(p.error().message().find("misaligned"), std::string::npos) << p.error().message();
}

}  // namespace
}  // namespace kiln

// Malformed program files (src/runtime/loader.cpp): truncation, random byte flips, wrong magic
// and version, and out-of-range indices/offsets crafted by editing a real file's FlatBuffer in
// place through the generated mutable API. Every case must give an error value, never a crash;
// run under -DKILN_SANITIZE="address;undefined" (scripts/sanitizers.sh) to catch bad reads.
#include <cstdio>
#include <functional>
#include <limits>
#include <type_traits>

#include "kiln/format.h"
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

// Bytes of a damaged file never reach a message raw: a string that is not UTF-8 (or a name with a
// control character) is InvalidProgram, quoted with those bytes as \xNN.
TEST_F(EditedProgram, StringsThatAreNotUtf8AreRefusedPrintably) {
  const auto printable_message = [](const std::string& m) {
    for (unsigned char c : m) {
      if (c < 0x20 || c == 0x7F || c >= 0x80) return false;  // the escaped text is ASCII here
    }
    return true;
  };
  struct Case {
    const char* what;
    std::function<flatbuffers::String*(fb::Program*)> field;
    std::string junk;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"op name", [&](fb::Program* p) { return call(p, 0)->mutable_op(); }, "\xff\xfe", "the op name is not a printable UTF-8 name: 'at\\xff\\xfe"},
      {"method name", [&](fb::Program* p) { return method(p)->mutable_name(); }, "\xc3(", "the name is not a printable UTF-8 name: "},
      {"attribute name", [&](fb::Program* p) { return call(p, 0)->mutable_attributes()->GetMutableObject(0)->mutable_name(); },
       "\x1b[", "an attribute name is not a printable UTF-8 name: "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<uint8_t> b = bytes_;
    flatbuffers::String* s = c.field(mutable_program(b));
    ASSERT_NE(s, nullptr);
    ASSERT_GE(s->size(), c.junk.size());
    std::memcpy(reinterpret_cast<char*>(s->data()) + (s->size() >= 2 + c.junk.size() ? 2 : 0), c.junk.data(), c.junk.size());
    auto p = Program::load_from_buffer(b);
    ASSERT_FALSE(p.ok()) << "loaded";
    EXPECT_EQ(p.error().code(), ErrorCode::InvalidProgram) << p.error().to_string();
    EXPECT_NE(p.error().message().find(c.needle), std::string::npos) << p.error().message();
    EXPECT_NE(p.error().message().find("\\x"), std::string::npos) << p.error().message();
    EXPECT_TRUE(printable_message(p.error().message())) << p.error().message();
  }
  EXPECT_EQ(printable("a\xff\x01" "b\xe2\x82\xac"), "a\\xff\\x01" "b\xe2\x82\xac");  // the euro sign stays
  EXPECT_TRUE(is_valid_utf8("\xe2\x82\xac"));
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));  // a surrogate
  EXPECT_FALSE(is_valid_utf8("\xc0\xaf"));       // overlong
  EXPECT_FALSE(is_valid_utf8("\xe2\x82"));       // truncated
}

TEST(JsonQuote, EscapesPerRfc8259AndKeepsUtf8) {
  // RFC 8259 section 7: '"', '\\' and U+0000..U+001F must be escaped; other characters may stand as
  // they are (UTF-8). DEL is escaped too (printable-ASCII output for it).
  EXPECT_EQ(json_quote("plain"), "\"plain\"");
  EXPECT_EQ(json_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(json_quote("l1\nl2\r\t"), "\"l1\\nl2\\r\\t\"");
  EXPECT_EQ(json_quote(std::string("\x00\x01\x1f\x7f", 4)), "\"\\u0000\\u0001\\u001f\\u007f\"");
  EXPECT_EQ(json_quote("caf\xc3\xa9 \xe2\x82\xac"), "\"caf\xc3\xa9 \xe2\x82\xac\"");  // UTF-8 kept, not \u00c3
  // Not UTF-8: the bad byte becomes the text \xff (printable), whose backslash JSON escapes.
  EXPECT_EQ(json_quote("x\xffy"), "\"x\\\\xffy\"");
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

// ---------------------------------------------------------------- format version 2: symbols and state
//
// The KV-cache program of kv_cache_program.h (a symbol `seq`, a zero-initialized cache written in
// place by aten.index_put and a counter with a constant initial value copied at the end), unpacked
// into plain structs, edited, and written back with the generated builders (fields at their default
// value are absent from a FlatBuffer, so most of these edits cannot be made in place). Every edit
// must give InvalidProgram at load, never a crash.

#include <optional>
#include <tuple>

#include "kv_cache_program.h"

namespace kiln {
namespace {

template <typename T>
std::vector<T> vec(const flatbuffers::Vector<T>* v) {
  return v ? std::vector<T>(v->begin(), v->end()) : std::vector<T>{};
}
template <typename T>
std::optional<std::vector<T>> opt_vec(const flatbuffers::Vector<T>* v) {
  if (!v) return std::nullopt;
  return std::vector<T>(v->begin(), v->end());
}
std::optional<std::string> opt_str(const flatbuffers::String* s) {
  if (!s) return std::nullopt;
  return s->str();
}

struct PTensor {
  fb::DType dtype = fb::DType::Float32;
  std::optional<std::vector<int64_t>> sizes;
  std::optional<std::vector<uint8_t>> dim_order;
  int32_t constant = -1;
  int64_t arena_offset = -1;
  std::optional<std::string> name;
  bool stored_as_float16 = false;
  std::vector<std::vector<int64_t>> sym;  // empty: fixed sizes
  int32_t state = -1;
};
struct PAttr {
  std::string name;
  fb::AttrKind kind = fb::AttrKind::None;
  int64_t i = 0;
  double f = 0;
  std::optional<std::string> s;
  std::optional<std::vector<int64_t>> ints;
  std::optional<std::vector<double>> floats;
};
struct PSymAttr {
  std::string name;
  int64_t index = -1;
  std::vector<int64_t> code;
};
struct PCall {
  std::string op;
  std::vector<int32_t> args, outputs;
  std::vector<PAttr> attrs;
  std::optional<std::string> debug_name;
  std::vector<PSymAttr> sym_attrs;
};
struct PSymbol {
  std::string name;
  int64_t min = 0, max = 0;
};
struct PMethod {
  std::string name;
  std::vector<PTensor> values;
  std::vector<int32_t> inputs, outputs;
  std::vector<PCall> calls;
  uint64_t arena_size = 0;
  std::vector<PSymbol> symbols;
  std::vector<std::pair<uint32_t, int32_t>> updates;  // (state, value)
  // Value indices of the KV-cache program, found by structure (unpack).
  int cache_read = -1, cache_write = -1, counter_read = -1, counter_write = -1, x = -1, h = -1, hg = -1, weight = -1;
  int index_put = -1, view = -1;
};
struct PState {
  std::string name;
  fb::DType dtype = fb::DType::Float32;
  std::optional<std::vector<int64_t>> sizes;
  int32_t initial = -1;
};
struct PProgram {
  uint32_t version = 0;
  std::vector<PMethod> methods;
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t>> constants;  // segment, offset, nbytes
  std::vector<std::tuple<uint64_t, uint64_t, uint8_t>> segments;    // offset, size, kind
  std::vector<PState> states;
  std::vector<std::pair<std::string, std::string>> metadata;
};

PProgram unpack(const std::vector<uint8_t>& bytes) {
  const fb::Program* p = fb::GetProgram(bytes.data() + header_of(bytes).flatbuffer_offset);
  PProgram out;
  out.version = p->version();
  for (const fb::ConstantRef* c : *p->constants()) out.constants.emplace_back(c->segment(), c->offset(), c->nbytes());
  for (const fb::Segment* s : *p->segments()) out.segments.emplace_back(s->offset(), s->size(), s->kind());
  if (p->states()) {
    for (const fb::State* s : *p->states()) out.states.push_back({s->name()->str(), s->dtype(), opt_vec(s->sizes()), s->initial()});
  }
  if (p->metadata()) {
    for (const fb::KeyValue* kv : *p->metadata()) out.metadata.emplace_back(kv->key()->str(), kv->value() ? kv->value()->str() : "");
  }
  for (const fb::Method* m : *p->methods()) {
    PMethod pm;
    pm.name = m->name()->str();
    for (const fb::Tensor* t : *m->values()) {
      PTensor pt{t->dtype(), opt_vec(t->sizes()), opt_vec(t->dim_order()), t->constant(), t->arena_offset(),
                 opt_str(t->name()), t->stored_as_float16(), {}, t->state()};
      if (t->sym_sizes()) {
        for (const fb::SizeExpr* e : *t->sym_sizes()) pt.sym.push_back(vec(e->code()));
      }
      pm.values.push_back(std::move(pt));
    }
    pm.inputs = vec(m->inputs());
    pm.outputs = vec(m->outputs());
    for (const fb::InstructionEntry* e : *m->instructions()) {
      const fb::KernelCall* k = e->instr_as_KernelCall();
      EXPECT_NE(k, nullptr) << "unpack: only kernel calls";
      if (!k) continue;
      PCall c{k->op()->str(), vec(k->args()), vec(k->outputs()), {}, opt_str(k->debug_name()), {}};
      if (k->attributes()) {
        for (const fb::Attribute* a : *k->attributes()) {
          c.attrs.push_back({a->name()->str(), a->kind(), a->i(), a->f(), opt_str(a->s()), opt_vec(a->ints()), opt_vec(a->floats())});
        }
      }
      if (k->sym_attributes()) {
        for (const fb::SymAttribute* s : *k->sym_attributes()) c.sym_attrs.push_back({s->name()->str(), s->index(), vec(s->expr()->code())});
      }
      pm.calls.push_back(std::move(c));
    }
    pm.arena_size = m->arena_size();
    if (m->symbols()) {
      for (const fb::Symbol* s : *m->symbols()) pm.symbols.push_back({s->name()->str(), s->min(), s->max()});
    }
    if (m->state_updates()) {
      for (const fb::StateUpdate* u : *m->state_updates()) pm.updates.emplace_back(u->state(), u->value());
    }
    for (size_t k = 0; k < pm.calls.size(); ++k) {
      const PCall& c = pm.calls[k];
      if (c.op == "aten.index_put") {
        pm.index_put = static_cast<int>(k);
        pm.cache_read = c.args[0];
        pm.cache_write = c.outputs[0];
      }
      if (c.op == "aten.view") pm.view = static_cast<int>(k);
      if (c.op == "aten.linear") {
        pm.x = c.args[0];
        pm.weight = c.args[1];
        pm.h = c.outputs[0];
      }
      if (c.op == "aten.mul") pm.hg = c.outputs[0];
      if (c.op == "aten.add" && pm.values[static_cast<size_t>(c.args[0])].state == 1) {
        pm.counter_read = c.args[0];
        pm.counter_write = c.outputs[0];
      }
    }
    out.methods.push_back(std::move(pm));
  }
  return out;
}

// Writes `p` as a file whose segments are `orig`'s (moved to follow the new FlatBuffer).
std::vector<uint8_t> pack(const PProgram& p, const std::vector<uint8_t>& orig) {
  const FileHeader oh = header_of(orig);
  const uint64_t old_seg = oh.segments_offset;
  const bool has_segments = !p.segments.empty();
  int64_t delta = 0;
  for (int attempt = 0; attempt < 4; ++attempt) {
    flatbuffers::FlatBufferBuilder b;
    std::vector<flatbuffers::Offset<fb::Method>> methods;
    for (const PMethod& m : p.methods) {
      std::vector<flatbuffers::Offset<fb::Tensor>> values;
      for (const PTensor& t : m.values) {
        std::vector<flatbuffers::Offset<fb::SizeExpr>> sym;
        for (const auto& code : t.sym) sym.push_back(fb::CreateSizeExprDirect(b, &code));
        values.push_back(fb::CreateTensor(b, t.dtype, t.sizes ? b.CreateVector(*t.sizes) : 0,
                                          t.dim_order ? b.CreateVector(*t.dim_order) : 0, t.constant, t.arena_offset,
                                          t.name ? b.CreateString(*t.name) : 0, t.stored_as_float16,
                                          sym.empty() ? 0 : b.CreateVector(sym), t.state));
      }
      std::vector<flatbuffers::Offset<fb::InstructionEntry>> instrs;
      for (const PCall& c : m.calls) {
        std::vector<flatbuffers::Offset<fb::Attribute>> attrs;
        for (const PAttr& a : c.attrs) {
          attrs.push_back(fb::CreateAttribute(b, b.CreateString(a.name), a.kind, a.i, a.f, a.s ? b.CreateString(*a.s) : 0,
                                              a.ints ? b.CreateVector(*a.ints) : 0, a.floats ? b.CreateVector(*a.floats) : 0));
        }
        std::vector<flatbuffers::Offset<fb::SymAttribute>> sattrs;
        for (const PSymAttr& s : c.sym_attrs) {
          sattrs.push_back(fb::CreateSymAttribute(b, b.CreateString(s.name), s.index, fb::CreateSizeExprDirect(b, &s.code)));
        }
        auto call = fb::CreateKernelCall(b, b.CreateString(c.op), b.CreateVector(c.args), b.CreateVector(c.outputs),
                                         b.CreateVector(attrs), c.debug_name ? b.CreateString(*c.debug_name) : 0,
                                         sattrs.empty() ? 0 : b.CreateVector(sattrs));
        instrs.push_back(fb::CreateInstructionEntry(b, fb::Instruction::KernelCall, call.Union()));
      }
      std::vector<flatbuffers::Offset<fb::Symbol>> syms;
      for (const PSymbol& s : m.symbols) syms.push_back(fb::CreateSymbol(b, b.CreateString(s.name), s.min, s.max));
      std::vector<flatbuffers::Offset<fb::StateUpdate>> ups;
      for (const auto& [st, v] : m.updates) ups.push_back(fb::CreateStateUpdate(b, st, v));
      methods.push_back(fb::CreateMethod(b, b.CreateString(m.name), b.CreateVector(values), b.CreateVector(m.inputs),
                                         b.CreateVector(m.outputs), b.CreateVector(instrs), m.arena_size,
                                         syms.empty() ? 0 : b.CreateVector(syms), ups.empty() ? 0 : b.CreateVector(ups)));
    }
    std::vector<flatbuffers::Offset<fb::ConstantRef>> consts;
    for (const auto& [seg, off, n] : p.constants) consts.push_back(fb::CreateConstantRef(b, seg, off, n));
    std::vector<flatbuffers::Offset<fb::Segment>> segs;
    for (const auto& [off, size, kind] : p.segments) {
      segs.push_back(fb::CreateSegment(b, static_cast<uint64_t>(static_cast<int64_t>(off) + delta), size, kind));
    }
    std::vector<flatbuffers::Offset<fb::State>> states;
    for (const PState& s : p.states) {
      states.push_back(fb::CreateState(b, b.CreateString(s.name), s.dtype, s.sizes ? b.CreateVector(*s.sizes) : 0, s.initial));
    }
    std::vector<flatbuffers::Offset<fb::KeyValue>> kvs;
    for (const auto& [k, v] : p.metadata) kvs.push_back(fb::CreateKeyValue(b, b.CreateString(k), b.CreateString(v)));
    fb::FinishProgramBuffer(b, fb::CreateProgram(b, p.version, b.CreateVector(methods), b.CreateVector(consts),
                                                 b.CreateVector(segs), states.empty() ? 0 : b.CreateVector(states),
                                                 kvs.empty() ? 0 : b.CreateVector(kvs)));
    const uint64_t fb_end = sizeof(FileHeader) + b.GetSize();
    const uint64_t seg_start = has_segments ? (fb_end + kSegmentAlignment - 1) / kSegmentAlignment * kSegmentAlignment : fb_end;
    const int64_t want_delta = has_segments ? static_cast<int64_t>(seg_start) - static_cast<int64_t>(old_seg) : 0;
    if (want_delta != delta) {
      delta = want_delta;
      continue;
    }
    std::vector<uint8_t> file(seg_start, 0);
    FileHeader h = oh;
    h.flatbuffer_offset = sizeof(FileHeader);
    h.flatbuffer_size = b.GetSize();
    std::memcpy(file.data() + sizeof(FileHeader), b.GetBufferPointer(), b.GetSize());
    if (has_segments) file.insert(file.end(), orig.begin() + static_cast<std::ptrdiff_t>(old_seg), orig.end());
    h.segments_offset = has_segments ? seg_start : file.size();
    h.file_size = file.size();
    set_header(file, h);
    return file;
  }
  ADD_FAILURE() << "pack: segment offsets do not settle";
  return {};
}

class MalformedStateProgram : public ::testing::Test {
 protected:
  void SetUp() override {
    auto bytes = testing::compile_kv_cache_program();
    ASSERT_TRUE(bytes.ok()) << bytes.error().to_string();
    bytes_ = std::move(bytes.value());
    base_ = unpack(bytes_);
    ASSERT_EQ(base_.methods.size(), 1u);
    const PMethod& m = base_.methods[0];
    ASSERT_GE(m.cache_read, 0);
    ASSERT_GE(m.cache_write, 0);
    ASSERT_GE(m.counter_read, 0);
    ASSERT_GE(m.counter_write, 0);
    ASSERT_GE(m.x, 0);
    ASSERT_GE(m.h, 0);
    ASSERT_GE(m.hg, 0);
    ASSERT_GE(m.weight, 0);
    ASSERT_GE(m.view, 0);
    ASSERT_EQ(m.values[static_cast<size_t>(m.cache_write)].state, 0) << "the cache update is not in place";
    ASSERT_EQ(base_.states.size(), 2u);
    ASSERT_EQ(m.symbols.size(), 1u);
  }

  // Packs an edited copy of the program and checks that loading gives InvalidProgram with a
  // message containing `needle` (and that the load-and-run path does not crash either).
  template <typename Edit>
  void expect_invalid(const char* what, Edit edit, const std::string& needle) {
    SCOPED_TRACE(what);
    PProgram p = base_;
    edit(p, p.methods[0]);
    const std::vector<uint8_t> file = pack(p, bytes_);
    ASSERT_FALSE(file.empty());
    auto prog = Program::load_from_buffer(file);
    ASSERT_FALSE(prog.ok()) << "loaded";
    EXPECT_EQ(prog.error().code(), ErrorCode::InvalidProgram) << prog.error().to_string();
    EXPECT_NE(prog.error().message().find(needle), std::string::npos) << prog.error().message();
    EXPECT_FALSE(load_and_run(file).ok());
  }

  std::vector<uint8_t> bytes_;
  PProgram base_;
};

TEST_F(MalformedStateProgram, TheRepackedProgramLoadsAndRuns) {
  const std::vector<uint8_t> file = pack(base_, bytes_);
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(file));
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  KILN_ASSERT_OK_AND_ASSIGN(session, program->new_session());
  testing::KvReference ref;
  for (int64_t seq : {5, 1, 3}) {
    std::vector<float> x = pattern(static_cast<size_t>(seq * testing::kKvDim), static_cast<uint32_t>(seq));
    std::vector<float> gate(static_cast<size_t>(seq), 0.5f);
    const int64_t at = static_cast<int64_t>(ref.counter - testing::kCounterInitial) * 5;
    std::vector<int64_t> pos = {at};
    KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute(*session, {Tensor{DType::Float32, {1, seq, testing::kKvDim}, x.data()},
                                                              Tensor{DType::Float32, {1, seq, 1}, gate.data()},
                                                              Tensor{DType::Int64, {1}, pos.data()}}));
    const auto want = ref.step(x, gate, at);
    ASSERT_EQ(outs[0].sizes, (std::vector<int64_t>{1, seq, testing::kKvDim}));
    for (size_t i = 0; i < want.total.size(); ++i) EXPECT_NEAR(outs[1].data_as<float>()[i], want.total[i], 1e-4f) << i;
    EXPECT_EQ(outs[2].data_as<float>()[0], want.counter);
  }
  EXPECT_TRUE(load_and_run(file).ok());
}

TEST_F(MalformedStateProgram, SymbolsOutOfRange) {
  expect_invalid("min > max", [](PProgram&, PMethod& m) { m.symbols[0].min = 40; }, "invalid range [40, 32]");
  expect_invalid("max > 2^40", [](PProgram&, PMethod& m) { m.symbols[0].max = kMaxSymbolValue + 1; }, "invalid range");
  expect_invalid("max = int64 max", [](PProgram&, PMethod& m) { m.symbols[0].max = std::numeric_limits<int64_t>::max(); },
                 "invalid range");
  expect_invalid("negative min", [](PProgram&, PMethod& m) { m.symbols[0].min = -1; }, "invalid range");
  expect_invalid("empty name", [](PProgram&, PMethod& m) { m.symbols[0].name = ""; }, "invalid range");
  expect_invalid("declared twice", [](PProgram&, PMethod& m) { m.symbols.push_back(m.symbols[0]); }, "declared twice");
  expect_invalid("17 symbols",
                 [](PProgram&, PMethod& m) {
                   for (int i = 0; i < 16; ++i) m.symbols.push_back({"s" + std::to_string(i), 1, 2});
                 },
                 "more than 16 symbols");
  expect_invalid("a symbol bound by no input", [](PProgram&, PMethod& m) { m.symbols.push_back({"extra", 1, 4}); },
                 "symbol 'extra' is bound by no input dimension");
  // An expression over seq raised so that every binding is out of the planned bound.
  expect_invalid("the bound lowered below the symbol's max",
                 [](PProgram&, PMethod& m) { (*m.values[static_cast<size_t>(m.x)].sizes)[1] = 16; }, "exceeds its planned bound 16");
}

TEST_F(MalformedStateProgram, SizeExpressionsMalformedOrDisagreeing) {
  using E = SymExpr;
  expect_invalid("missing symbol", [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.h)].sym[1] = {E::Sym, 1}; },
                 "symbol index 1 out of range");
  expect_invalid("operator without operands", [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.h)].sym[1] = {E::Add}; },
                 "without operands");
  expect_invalid("empty expression", [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.h)].sym[1] = {}; }, "0 tokens");
  expect_invalid("unknown opcode", [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.x)].sym[1] = {42, 0}; },
                 "unknown opcode 42");
  expect_invalid("wrong count", [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.x)].sym.pop_back(); },
                 "differ in number from the rank");
  expect_invalid("symbolic constant",
                 [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.weight)].sym = {{E::Sym, 0}, {E::Const, 8}}; },
                 "cannot have symbolic sizes");
  expect_invalid("symbolic state",
                 [](PProgram&, PMethod& m) {
                   m.values[static_cast<size_t>(m.cache_read)].sym = {{E::Const, 1}, {E::Sym, 0}, {E::Const, 8}};
                 },
                 "cannot have symbolic sizes");
  // seq * 2 exceeds the planned [1, 32, 8] at seq = 32.
  expect_invalid("symbolic size beyond the bound",
                 [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.h)].sym[1] = {E::Sym, 0, E::Const, 2, E::Mul}; },
                 "exceeds its planned bound 32");
  // seq - 1 fits the bound, but the linear's inference gives seq.
  expect_invalid("shapes disagree with the symbols",
                 [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.h)].sym[1] = {E::Sym, 0, E::Const, 1, E::Sub}; },
                 "shapes disagree with the symbols");
  // An expression that is negative at some binding.
  expect_invalid("negative size",
                 [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.h)].sym[1] = {E::Sym, 0, E::Const, 2, E::Sub}; },
                 "negative size");
  // Division by zero at every binding.
  expect_invalid("division by zero",
                 [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.h)].sym[1] = {E::Sym, 0, E::Const, 0, E::FloorDiv}; },
                 "division by zero");
  // Symbolic attributes.
  expect_invalid("symbolic attribute with a missing symbol",
                 [](PProgram&, PMethod& m) { m.calls[static_cast<size_t>(m.view)].sym_attrs[0].code = {E::Sym, 3}; },
                 "symbol index 3 out of range");
  expect_invalid("symbolic attribute not of the op",
                 [](PProgram&, PMethod& m) { m.calls[static_cast<size_t>(m.view)].sym_attrs[0].name = "nope"; },
                 "not an attribute of the op");
  expect_invalid("symbolic attribute element out of the list",
                 [](PProgram&, PMethod& m) { m.calls[static_cast<size_t>(m.view)].sym_attrs[0].index = 7; },
                 "not an element of an int list");
  expect_invalid("symbolic attribute disagreeing with the output",
                 [](PProgram&, PMethod& m) {
                   m.calls[static_cast<size_t>(m.view)].sym_attrs[0].code = {E::Sym, 0, E::Const, 2, E::Max};
                 },
                 "numel mismatch");
  expect_invalid("symbolic attribute disagreeing with the output's expression",
                 [](PProgram&, PMethod& m) {
                   for (PCall& c : m.calls) {
                     if (c.op == "aten.arange") c.sym_attrs[0].code = {E::Sym, 0, E::Const, 1, E::Add};
                   }
                 },
                 "shapes disagree with the symbols");
}

TEST_F(MalformedStateProgram, StatesAndTheirValues) {
  expect_invalid("state value with an arena offset (overlapping the arena)",
                 [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.cache_read)].arena_offset = 0; }, "arena offset");
  expect_invalid("in-place update with an arena offset",
                 [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.cache_write)].arena_offset = 0; }, "arena offset");
  expect_invalid("state index out of range", [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.cache_read)].state = 2; },
                 "state index out of range");
  expect_invalid("state index negative", [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.cache_read)].state = -3; },
                 "state index out of range");
  expect_invalid("a state that is a constant",
                 [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.cache_read)].constant = 0; }, "cannot be a constant");
  expect_invalid("initial value constant out of range", [](PProgram& p, PMethod&) { p.states[1].initial = 99; },
                 "initial value constant out of range");
  expect_invalid("invalid initial value index", [](PProgram& p, PMethod&) { p.states[1].initial = -2; }, "invalid initial value index");
  expect_invalid("initial value of the wrong byte count (missing initial value)",
                 [](PProgram& p, PMethod& m) { p.states[0].initial = m.values[static_cast<size_t>(m.weight)].constant; },
                 "initial value of 256 bytes, type needs 1024");
  expect_invalid("value type differs from its state's (sizes)",
                 [](PProgram&, PMethod& m) { (*m.values[static_cast<size_t>(m.cache_read)].sizes)[1] = 31; }, "differs from state 'cache'");
  expect_invalid("value type differs from its state's (dtype)",
                 [](PProgram&, PMethod& m) { m.values[static_cast<size_t>(m.counter_read)].dtype = fb::DType::Int32; },
                 "differs from state 'counter'");
  expect_invalid("state sizes differ from its values'", [](PProgram& p, PMethod&) { (*p.states[0].sizes)[1] = 16; },
                 "differs from state 'cache'");
  expect_invalid("state declared twice", [](PProgram& p, PMethod&) { p.states[1].name = "cache"; }, "declared twice");
  expect_invalid("state of an invalid dtype", [](PProgram& p, PMethod&) { p.states[0].dtype = static_cast<fb::DType>(99); },
                 "invalid dtype");
  expect_invalid("state with a negative size", [](PProgram& p, PMethod&) { (*p.states[0].sizes)[1] = -1; }, "negative size");
  expect_invalid("state of 2^60 bytes", [](PProgram& p, PMethod&) { p.states[0].sizes = std::vector<int64_t>{1 << 20, 1 << 20, 1 << 20}; },
                 "size overflow");
  expect_invalid("an input that is a state",
                 [](PProgram&, PMethod& m) { m.inputs.push_back(m.cache_read); }, "an input is a state");
}

TEST_F(MalformedStateProgram, StateUpdates) {
  expect_invalid("updated twice", [](PProgram&, PMethod& m) { m.updates.push_back(m.updates[0]); }, "updated twice");
  expect_invalid("update of a missing state", [](PProgram&, PMethod& m) { m.updates[0].first = 2; }, "state update out of range");
  expect_invalid("update from a missing value", [](PProgram&, PMethod& m) { m.updates[1].second = 1000; }, "state update out of range");
  expect_invalid("update from a negative value", [](PProgram&, PMethod& m) { m.updates[1].second = -1; }, "state update out of range");
  expect_invalid("update with a value of another type",
                 [](PProgram&, PMethod& m) {
                   for (auto& u : m.updates) {
                     if (u.first == 1) u.second = m.hg;
                   }
                 },
                 "another type");
  expect_invalid("update from another state's bytes",
                 [](PProgram&, PMethod& m) {
                   for (auto& u : m.updates) {
                     if (u.first == 1) u.second = m.cache_write;
                   }
                 },
                 "");
  expect_invalid("in place but not declared updated",
                 [](PProgram&, PMethod& m) {
                   std::erase_if(m.updates, [](const auto& u) { return u.first == 0; });
                 },
                 "written in place but not declared updated");
  expect_invalid("update from the state's unchanged value",
                 [](PProgram&, PMethod& m) {
                   for (auto& u : m.updates) {
                     if (u.first == 1) u.second = m.counter_read;
                   }
                 },
                 "unchanged value");
  // An in-place write of a state by an op that is not index_put / slice_scatter: the
  // counter's aten.add given the counter's bytes as its output.
  expect_invalid("in-place write by aten.add",
                 [](PProgram&, PMethod& m) {
                   PTensor& t = m.values[static_cast<size_t>(m.counter_write)];
                   t.state = 1;
                   t.arena_offset = -1;
                 },
                 "only an index_put or slice_scatter");
  // The index_put writing into the counter's bytes while reading the cache.
  expect_invalid("in-place write into another state",
                 [](PProgram&, PMethod& m) {
                   PTensor& t = m.values[static_cast<size_t>(m.cache_write)];
                   t.state = 1;
                   t.sizes = std::vector<int64_t>{1};
                 },
                 "");
  // Reading the cache's old value after the in-place write.
  expect_invalid("reads the old value after the write",
                 [](PProgram&, PMethod& m) {
                   for (PCall& c : m.calls) {
                     if (c.op == "aten.sum") c.args[0] = m.cache_read;
                   }
                 },
                 "after it was written in place");
}

TEST_F(MalformedStateProgram, RandomByteFlipsNeverCrash) {
  std::mt19937_64 rng(20261202);
  const uint64_t fb_end = header_of(bytes_).flatbuffer_offset + header_of(bytes_).flatbuffer_size;
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::vector<uint8_t> b = bytes_;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      const size_t pos = static_cast<size_t>(rng() % fb_end);
      b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    const Error err = load_and_run(b);
    if (err.ok()) {
      ++loaded;
    } else {
      ++rejected;
      EXPECT_NE(err.code(), ErrorCode::Internal) << iter << ": " << err.to_string();
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(loaded, 0);
  std::printf("[          ] byte flips of a program with state: %d loaded, %d rejected\n", loaded, rejected);
}

}  // namespace
}  // namespace kiln

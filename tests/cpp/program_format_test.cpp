// Program file layout: a constant shared by two methods is stored once (the file size shows
// it), both methods load and run from one file (mapped from disk or copied from memory).
#include <unistd.h>

#include <filesystem>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "ir/op_registry.h"
#include "program_generated.h"
#include "runtime/file_format.h"
#include "runtime_test_util.h"

namespace kiln {
namespace {

using testing::float_bytes;
using testing::pattern;

constexpr int64_t kRows = 4;
constexpr int64_t kCols = 1024;                    // the constant: float32[1024] = 4 KiB
constexpr uint64_t kConstBytes = kCols * sizeof(float);

// Method "plus":  y = x + c
// Method "mixed": y = relu(x) + (-0.5) * c2
// `c2` is the same bytes as `c` (shared) or other bytes of the same size (not shared).
Result<CompiledProgram> compile_two_methods(const std::vector<float>& c, const std::vector<float>& c2) {
  ProgramBuilder pb;
  {
    Graph g;
    ValueId x = g.add_input("x", {DType::Float32, {kRows, kCols}});
    auto cid = g.add_constant("c", {DType::Float32, {kCols}}, float_bytes(c));
    if (!cid.ok()) return cid.error();
    auto y = g.add_node("aten.add", {x, cid.value()}, {});
    if (!y.ok()) return y.error();
    KILN_RETURN_IF_ERROR(g.set_outputs({y.value()[0]}));
    KILN_RETURN_IF_ERROR(pb.add_method("plus", std::move(g)));
  }
  {
    Graph g;
    ValueId x = g.add_input("x", {DType::Float32, {kRows, kCols}});
    // A separate byte vector with the same content: deduplication is by content.
    auto cid = g.add_constant("c_again", {DType::Float32, {kCols}}, float_bytes(c2));
    if (!cid.ok()) return cid.error();
    auto r = g.add_node("aten.relu", {x}, {});
    if (!r.ok()) return r.error();
    auto y = g.add_node("aten.add", {r.value()[0], cid.value()}, {{"alpha", -0.5}});
    if (!y.ok()) return y.error();
    KILN_RETURN_IF_ERROR(g.set_outputs({y.value()[0]}));
    KILN_RETURN_IF_ERROR(pb.add_method("mixed", std::move(g)));
  }
  return pb.compile();
}

void check_methods(const Program& program, const std::vector<float>& c, const std::vector<float>& c2) {
  const std::vector<float> x = pattern(kRows * kCols, 99);
  {
    KILN_ASSERT_OK_AND_ASSIGN(m, program.load_method("plus"));
    KILN_ASSERT_OK_AND_ASSIGN(outs, m.execute({Tensor{DType::Float32, {kRows, kCols}, const_cast<float*>(x.data())}}));
    ASSERT_EQ(outs.size(), 1u);
    ASSERT_EQ(outs[0].sizes, (std::vector<int64_t>{kRows, kCols}));
    const float* y = outs[0].data_as<float>();
    for (int64_t i = 0; i < kRows * kCols; ++i) {
      const float want = x[static_cast<size_t>(i)] + c[static_cast<size_t>(i % kCols)];
      ASSERT_NEAR(y[i], want, 1e-5f * 4.0f) << "plus " << i;
    }
  }
  {
    KILN_ASSERT_OK_AND_ASSIGN(m, program.load_method("mixed"));
    KILN_ASSERT_OK_AND_ASSIGN(outs, m.execute({Tensor{DType::Float32, {kRows, kCols}, const_cast<float*>(x.data())}}));
    const float* y = outs[0].data_as<float>();
    for (int64_t i = 0; i < kRows * kCols; ++i) {
      const float xi = x[static_cast<size_t>(i)];
      const float want = (xi > 0.0f ? xi : 0.0f) - 0.5f * c2[static_cast<size_t>(i % kCols)];
      ASSERT_NEAR(y[i], want, 1e-5f * 4.0f) << "mixed " << i;
    }
  }
}

std::string temp_path(const std::string& stem) {
  return (std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid()) + ".kiln")).string();
}

TEST(ProgramFormat, ConstantSharedByTwoMethodsIsStoredOnce) {
  const std::vector<float> c = pattern(kCols, 1);
  std::vector<float> other = pattern(kCols, 2);
  KILN_ASSERT_OK_AND_ASSIGN(shared, compile_two_methods(c, c));
  KILN_ASSERT_OK_AND_ASSIGN(distinct, compile_two_methods(c, other));

  // The compiler's own accounting ...
  EXPECT_EQ(shared.constant_bytes, kConstBytes);
  EXPECT_EQ(distinct.constant_bytes, 2 * kConstBytes);
  ASSERT_EQ(shared.methods.size(), 2u);
  EXPECT_EQ(shared.methods[0].constant_bytes, kConstBytes);
  EXPECT_EQ(shared.methods[1].constant_bytes, kConstBytes);
  // ... and the file itself: the second copy costs at least its size.
  EXPECT_GE(distinct.bytes.size(), shared.bytes.size() + kConstBytes)
      << "shared " << shared.bytes.size() << " bytes, distinct " << distinct.bytes.size() << " bytes";

  // Both files load, report what they hold, and both methods compute the right values.
  KILN_ASSERT_OK_AND_ASSIGN(ps, Program::load_from_buffer(shared.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(pd, Program::load_from_buffer(distinct.bytes));
  EXPECT_EQ(ps->constant_bytes(), kConstBytes);
  EXPECT_EQ(pd->constant_bytes(), 2 * kConstBytes);
  EXPECT_EQ(ps->file_size(), shared.bytes.size());
  EXPECT_EQ(ps->method_names(), (std::vector<std::string>{"plus", "mixed"}));
  check_methods(*ps, c, c);
  check_methods(*pd, c, other);
}

TEST(ProgramFormat, LoadFromFileMappedAndRead) {
  const std::vector<float> c = pattern(kCols, 3);
  KILN_ASSERT_OK_AND_ASSIGN(compiled, compile_two_methods(c, c));
  const std::string path = temp_path("kiln-format-test");
  ASSERT_TRUE(write_file(path, compiled.bytes).ok());
  for (bool use_mmap : {true, false}) {
    SCOPED_TRACE(use_mmap ? "mmap" : "read");
    KILN_ASSERT_OK_AND_ASSIGN(program, Program::load(path, LoadOptions{use_mmap}));
    EXPECT_EQ(program->file_size(), compiled.bytes.size());
    EXPECT_EQ(program->format_version(), kFormatVersion);
    EXPECT_EQ(program->constant_bytes(), kConstBytes);
    KILN_ASSERT_OK_AND_ASSIGN(meta, program->method_meta("mixed"));
    EXPECT_EQ(meta.input_names, (std::vector<std::string>{"x"}));
    EXPECT_EQ(meta.num_kernel_calls, 2u);
    check_methods(*program, c, c);
  }
  std::filesystem::remove(path);
}

// Files of 2 MiB or more are mapped at a 2 MiB-aligned address (the reservation around it given
// back) and, with prefault, populated at load: the constant must read back exactly, from every
// load path, for a file whose size is not a multiple of the page size.
TEST(ProgramFormat, LargeFileLoadsMappedPrefaultedAndRead) {
  constexpr int64_t kBig = (int64_t{3} << 20) / 4 + 1001;  // float32 constant of 3 MiB + 4004 bytes
  std::vector<float> c(static_cast<size_t>(kBig));
  for (int64_t i = 0; i < kBig; ++i) c[static_cast<size_t>(i)] = static_cast<float>(i % 9973) - 4000.0f;
  ProgramBuilder pb;
  {
    Graph g;
    ValueId x = g.add_input("x", {DType::Float32, {1, kBig}});
    KILN_ASSERT_OK_AND_ASSIGN(cid, g.add_constant("c", {DType::Float32, {kBig}}, float_bytes(c)));
    KILN_ASSERT_OK_AND_ASSIGN(y, g.add_node("aten.add", {x, cid}, {}));
    ASSERT_TRUE(g.set_outputs({y[0]}).ok());
    ASSERT_TRUE(pb.add_method("plus", std::move(g)).ok());
  }
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile());
  ASSERT_GT(compiled.bytes.size(), uint64_t{2} << 20);
  const std::string path = temp_path("kiln-large-file-test");
  ASSERT_TRUE(write_file(path, compiled.bytes).ok());
  std::vector<float> x(static_cast<size_t>(kBig), 0.25f);
  for (const auto& [use_mmap, prefault] : {std::pair{true, false}, std::pair{true, true}, std::pair{false, false}}) {
    SCOPED_TRACE(std::string(use_mmap ? "mmap" : "read") + (prefault ? " prefault" : ""));
    LoadOptions o;
    o.use_mmap = use_mmap;
    o.prefault = prefault;
    KILN_ASSERT_OK_AND_ASSIGN(program, Program::load(path, o));
    EXPECT_EQ(program->file_size(), compiled.bytes.size());
    KILN_ASSERT_OK_AND_ASSIGN(m, program->load_method("plus"));
    KILN_ASSERT_OK_AND_ASSIGN(outs, m.execute({Tensor{DType::Float32, {1, kBig}, x.data()}}));
    const float* y = outs[0].data_as<float>();
    for (int64_t i = 0; i < kBig; ++i) ASSERT_EQ(y[i], c[static_cast<size_t>(i)] + 0.25f) << i;
  }
  std::filesystem::remove(path);
}

// A large file of another kind is refused by its first bytes, before it is read or prefaulted.
TEST(ProgramFormat, LargeFileOfAnotherKindIsRefusedByItsMagic) {
  const std::string path = temp_path("kiln-not-a-program");
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("GGUF and then nothing a Kiln loader should read", f);
    std::fclose(f);
  }
  std::filesystem::resize_file(path, uint64_t{64} << 20);  // sparse: 64 MiB
  for (bool use_mmap : {true, false}) {
    LoadOptions o;
    o.use_mmap = use_mmap;
    o.prefault = true;
    auto program = Program::load(path, o);
    ASSERT_FALSE(program.ok());
    EXPECT_EQ(program.error().code(), ErrorCode::InvalidProgram);
    EXPECT_NE(program.error().message().find("wrong magic"), std::string::npos) << program.error().message();
  }
  std::filesystem::remove(path);
}

TEST(ProgramFormat, MethodOutlivesProgramHandle) {
  // A Method keeps its Program (and the mapping) alive.
  const std::vector<float> c = pattern(kCols, 4);
  KILN_ASSERT_OK_AND_ASSIGN(compiled, compile_two_methods(c, c));
  const std::string path = temp_path("kiln-outlive-test");
  ASSERT_TRUE(write_file(path, compiled.bytes).ok());
  std::optional<Method> method;
  {
    KILN_ASSERT_OK_AND_ASSIGN(program, Program::load(path));
    KILN_ASSERT_OK_AND_ASSIGN(m, program->load_method("plus"));
    method.emplace(std::move(m));
  }
  std::filesystem::remove(path);
  std::vector<float> x(kRows * kCols, 1.0f);
  KILN_ASSERT_OK_AND_ASSIGN(outs, method->execute({Tensor{DType::Float32, {kRows, kCols}, x.data()}}));
  for (int64_t i = 0; i < kRows * kCols; ++i) {
    ASSERT_NEAR(outs[0].data_as<float>()[i], 1.0f + c[static_cast<size_t>(i % kCols)], 1e-5f * 4.0f) << i;
  }
}

TEST(ProgramFormat, MissingMethodAndMissingFileAreNotFound) {
  const std::vector<float> c = pattern(kCols, 5);
  KILN_ASSERT_OK_AND_ASSIGN(compiled, compile_two_methods(c, c));
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  auto m = program->load_method("nope");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), ErrorCode::NotFound);
  EXPECT_NE(m.error().message().find("nope"), std::string::npos) << m.error().message();
  EXPECT_EQ(program->method_meta("nope").error().code(), ErrorCode::NotFound);

  const std::string missing = temp_path("kiln-does-not-exist");
  std::filesystem::remove(missing);
  for (bool use_mmap : {true, false}) {
    auto p = Program::load(missing, LoadOptions{use_mmap});
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.error().code(), ErrorCode::NotFound) << p.error().to_string();
    EXPECT_NE(p.error().message().find(missing), std::string::npos) << p.error().message();
  }
  // A directory is not a program file.
  auto dir = Program::load(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.error().code(), ErrorCode::Ok);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The dtype tables: Float64 is value 8 (appended, so older files keep their meaning), 8 bytes,
// floating but not a delegate compute dtype, the highest float in type promotion, and the
// program file's enum agrees with the C++ one.
TEST(DTypeTable, Float64IsAppendedAndConsistent) {
  EXPECT_EQ(static_cast<int>(DType::Float64), 8);
  EXPECT_EQ(kNumDTypes, 9);
  EXPECT_EQ(static_cast<int>(fb::DType::Float64), 8);
  EXPECT_EQ(static_cast<int>(fb::DType::MAX), kNumDTypes - 1);
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType d = static_cast<DType>(i);
    EXPECT_TRUE(is_valid_dtype(i));
    EXPECT_GT(dtype_size(d), 0u) << i;
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d) << dtype_name(d);
  }
  EXPECT_FALSE(is_valid_dtype(kNumDTypes));
  EXPECT_EQ(dtype_size(DType::Float64), 8u);
  EXPECT_STREQ(dtype_name(DType::Float64), "float64");
  EXPECT_TRUE(is_floating(DType::Float64));
  EXPECT_FALSE(is_compute_float(DType::Float64));
  EXPECT_TRUE(is_compute_float(DType::BFloat16));
  EXPECT_EQ(promote_types(DType::Float32, DType::Float64), DType::Float64);
  EXPECT_EQ(promote_types(DType::Float64, DType::Int64), DType::Float64);
  EXPECT_EQ(promote_types(DType::Float16, DType::Float64), DType::Float64);
}

// A float64 constant and input survive the serializer and the loader bit for bit, and the
// portable add computes in double (1 + 2^-40 would round to 1 in float32).
TEST(DTypeTable, Float64ProgramRoundTrips) {
  const std::vector<double> c = {1.0 + std::ldexp(1.0, -40), -3.25, 1e300};
  std::vector<uint8_t> cb(c.size() * 8);
  std::memcpy(cb.data(), c.data(), cb.size());
  Graph g;
  ValueId x = g.add_input("x", {DType::Float64, {3}});
  KILN_ASSERT_OK_AND_ASSIGN(cid, g.add_constant("c", {DType::Float64, {3}}, cb));
  KILN_ASSERT_OK_AND_ASSIGN(y, g.add_node("aten.add", {x, cid}, {}));
  ASSERT_EQ(g.value(y[0]).type.dtype, DType::Float64);
  ASSERT_TRUE(g.set_outputs({y[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile());
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  KILN_ASSERT_OK_AND_ASSIGN(m, program->load_method("forward"));
  std::vector<double> xv = {1.0, 0.5, 1e300};
  KILN_ASSERT_OK_AND_ASSIGN(outs, m.execute({Tensor{DType::Float64, {3}, xv.data()}}));
  ASSERT_EQ(outs[0].dtype, DType::Float64);
  const double* o = outs[0].data_as<double>();
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(o[i], xv[i] + c[i]) << i;
  EXPECT_NE(o[0], 2.0);
}

}  // namespace
}  // namespace kiln

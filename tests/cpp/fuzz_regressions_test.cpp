// Bugs the libFuzzer targets (tests/fuzz, scripts/fuzz.sh) found, each as a unit test through the
// public path that reaches it, so that the regular and the sanitizer builds (scripts/sanitizers.sh:
// ASan + UBSan) keep them fixed without clang. The fuzzers' reproducers are kept as regression
// inputs in tests/fuzz/regressions/<target>/ (replayed by every scripts/fuzz.sh run); the last test
// here replays the delegate ones through the fuzzers' own harness (tests/fuzz/delegate_case.h).
// Expected values come from PyTorch (torch.round / torch.diagonal), noted at each test.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>

#include "../fuzz/delegate_case.h"
#include "backends/backend.h"
#include "runtime_test_util.h"
#ifdef KILN_HAVE_ONNX
#include "kiln/onnx.h"
#endif

namespace kiln {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// Compiles a one-node program op(x) on float32 `x_sizes` and runs it on x (portable kernels, or
// the backend when given: mlx on MLX's CPU device).
Result<std::vector<float>> run_one(const std::string& op, const Attributes& attrs, std::vector<int64_t> x_sizes,
                                   std::vector<float> x, const std::string& backend = "") {
  Graph g;
  ValueId in = g.add_input("x", {DType::Float32, x_sizes});
  auto y = g.add_node(op, {in}, attrs);
  if (!y.ok()) return y.error();
  KILN_RETURN_IF_ERROR(g.set_outputs({y.value()[0]}));
  ProgramBuilder pb;
  KILN_RETURN_IF_ERROR(pb.add_method("forward", std::move(g)));
  CompileOptions o;
  if (!backend.empty()) o.require_delegation = backend;
  auto compiled = pb.compile(o);
  if (!compiled.ok()) return compiled.error();
  LoadOptions lo;
  if (backend == "mlx") lo.backend_settings = {{"mlx.device", "cpu"}};
  auto program = Program::load_from_buffer(compiled->bytes, lo);
  if (!program.ok()) return program.error();
  auto method = (*program)->load_method("forward");
  if (!method.ok()) return method.error();
  auto out = method->execute({Tensor{DType::Float32, x_sizes, x.data()}});
  if (!out.ok()) return out.error();
  const Tensor& t = (*out)[0];
  const float* p = t.data_as<const float>();
  return std::vector<float>(p, p + t.numel());
}

// Fuzz finding (kiln_mlx_payload_fuzzer, regressions/diagonal-offset-overflow.case): aten.diagonal's
// inference computed offset * stride before knowing the diagonal is empty: signed overflow for
// offsets far beyond the tensor. PyTorch: torch.diagonal(torch.zeros(3, 4), offset=2**62).shape
// == (0,), and likewise for any offset past the dims.
TEST(FuzzRegressions, DiagonalOffsetFarBeyondTheTensorIsEmpty) {
  for (int64_t offset : {int64_t{1} << 62, -(int64_t{1} << 62), kMax, kMin, int64_t{4}, int64_t{-3}}) {
    Graph g;
    ValueId x = g.add_input("x", {DType::Float32, {3, 4}});
    auto y = g.add_node("aten.diagonal", {x}, {{"offset", offset}});
    ASSERT_TRUE(y.ok()) << offset << ": " << y.error().to_string();
    EXPECT_EQ(g.value(y.value()[0]).type.sizes, (std::vector<int64_t>{0})) << "offset " << offset;
  }
}

// Fuzz finding (kiln_mlx_payload_fuzzer, regressions/round-decimals-int64-min.case): aten.round with
// decimals = INT64_MIN negated it (signed overflow) in the mlx lowering and the portable kernel.
// PyTorch: torch.round(torch.tensor([1.5, -2.25, 0.0, 3e38]), decimals=-400) (and 400) is all NaN
// (10^|d| overflows float32 to inf); INT64_MIN and INT64_MAX are the same |d| > 38 case.
TEST(FuzzRegressions, RoundWithExtremeDecimalsIsNaNLikePyTorch) {
  const std::vector<float> x = {1.5f, -2.25f, 0.0f, 3e38f};
  std::vector<std::string> backends = {""};
  if (BackendRegistry::get().find("mlx") != nullptr) backends.push_back("mlx");
  for (const std::string& b : backends) {
    for (int64_t d : {kMin, kMax, int64_t{-400}, int64_t{400}}) {
      auto y = run_one("aten.round", {{"decimals", d}}, {4}, x, b);
      ASSERT_TRUE(y.ok()) << (b.empty() ? "portable" : b) << " decimals " << d << ": " << y.error().to_string();
      for (float v : *y) EXPECT_TRUE(std::isnan(v)) << (b.empty() ? "portable" : b) << " decimals " << d << ": " << v;
    }
  }
}

// The mlx delegate refuses, at init, an array above the load setting mlx.max_array_bytes (MLX does
// not survive a failed allocation; found by kiln_mlx_payload_fuzzer as a 3.9 GB aten.cat,
// regressions/value-beyond-limit-cat.case). x float32[4, 1] expanded to [4, 2^20] (16 MiB), then
// summed over dim 1: sum = 2^20 * x exactly for small integers.
TEST(FuzzRegressions, MlxRefusesAValueAboveMaxArrayBytes) {
  if (BackendRegistry::get().find("mlx") == nullptr) GTEST_SKIP() << "mlx backend not built";
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {4, 1}});
  auto e = g.add_node("aten.expand", {x}, {{"size", std::vector<int64_t>{4, 1 << 20}}});
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  auto s = g.add_node("aten.sum", {e.value()[0]}, {{"dim", std::vector<int64_t>{1}}});
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  ASSERT_TRUE(g.set_outputs({s.value()[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
  CompileOptions o;
  o.require_delegation = "mlx";
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile(o));
  auto load = [&](const std::string& limit) {
    LoadOptions lo;
    lo.backend_settings = {{"mlx.device", "cpu"}};
    if (!limit.empty()) lo.backend_settings.emplace_back("mlx.max_array_bytes", limit);
    return Program::load_from_buffer(compiled.bytes, lo);
  };
  {
    KILN_ASSERT_OK_AND_ASSIGN(program, load("1048576"));
    auto method = program->load_method("forward");
    ASSERT_FALSE(method.ok());
    EXPECT_EQ(method.error().code(), ErrorCode::MemoryAllocationFailed) << method.error().to_string();
    EXPECT_NE(method.error().message().find("above the limit of 1048576"), std::string::npos) << method.error().to_string();
    EXPECT_NE(method.error().message().find("mlx.max_array_bytes"), std::string::npos) << method.error().to_string();
  }
  for (const std::string limit : {"", "16777216"}) {  // the default (this machine's memory) and exactly 16 MiB
    KILN_ASSERT_OK_AND_ASSIGN(program, load(limit));
    KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
    std::vector<float> in = {1, -2, 3, 0};
    KILN_ASSERT_OK_AND_ASSIGN(out, method.execute({Tensor{DType::Float32, {4, 1}, in.data()}}));
    const float* y = out[0].data_as<const float>();
    for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], in[static_cast<size_t>(i)] * float(1 << 20)) << "limit '" << limit << "'";
  }
  for (const std::string bad : {"16M", "-1", "99999999999999999999"}) {
    auto program = load(bad);
    ASSERT_FALSE(program.ok()) << bad;
    EXPECT_EQ(program.error().code(), ErrorCode::NotFound) << program.error().to_string();
    EXPECT_NE(program.error().message().find("is not a byte count"), std::string::npos) << program.error().to_string();
  }
}

// The xnnpack delegate refuses a payload whose node would build a value of more than 2^34
// elements (XNNPACK multiplies dims in size_t unchecked): three float32[65536] inputs reshaped to
// [65536,1,1,1], [1,65536,1,1], [1,1,65536,1] and broadcast-added (2^48 elements), then a global
// average pooling. regressions/broadcast-beyond-2e34-elements.case is the same case framed for
// kiln_xnnpack_payload_fuzzer.
TEST(FuzzRegressions, XnnpackRefusesANodeBeyond2To34Elements) {
  const Backend* xnn = BackendRegistry::get().find("xnnpack");
  if (xnn == nullptr) GTEST_SKIP() << "xnnpack backend not built";
  const std::vector<uint32_t> w = {
      0x314E584Bu, 3, 1, 0, 0, 0, 0,  // KXN1, 3 inputs, 1 output, no constants, layouts
      6,                               // nodes
      10, 1, 0, 5, 4, 65536, 1, 1, 1,  // 3 = reshape(0)
      10, 1, 1, 5, 4, 1, 65536, 1, 1,  // 4 = reshape(1)
      10, 1, 2, 5, 4, 1, 1, 65536, 1,  // 5 = reshape(2)
      4, 2, 3, 4, 0,                   // 6 = 3 + 4: [65536, 65536, 1, 1], 2^32 elements
      4, 2, 6, 5, 0,                   // 7 = 6 + 5: 2^48 elements
      6, 1, 7, 0,                      // 8 = global average pooling of 7
      8};                              // output: value 8
  std::vector<uint8_t> payload(w.size() * 4);
  std::memcpy(payload.data(), w.data(), payload.size());
  const std::vector<TensorType> in(3, TensorType{DType::Float32, {65536}});
  const std::vector<TensorType> out = {{DType::Float32, {65536, 1, 1, 1}}};
  BackendSettings settings;
  DelegateOptions options;
  options.settings = &settings;
  auto h = xnn->init(payload, {}, in, out, options);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.error().code(), ErrorCode::InvalidProgram) << h.error().to_string();
  EXPECT_NE(h.error().message().find("node 4: output has more than 2^34 elements"), std::string::npos)
      << h.error().to_string();
}

// ImportOptions::max_constant_bytes (kiln_onnx_import_fuzzer imports with 16 MiB, so that a small
// hostile file cannot make the importer allocate 1 GiB constants): the ONNX backend test model
// test_constantofshape_float_ones with its shape input bound to [4, 3, 2] folds to a constant of
// 96 bytes (ONNX ConstantOfShape: value 1.0 in every element): imported under the default limit,
// refused (NotSupported naming the limit) under 64 bytes.
TEST(FuzzRegressions, OnnxMaxConstantBytesBoundsWhatTheImportAllocates) {
#ifndef KILN_HAVE_ONNX
  GTEST_SKIP() << "ONNX importer not built";
#else
  const std::string model = "/usr/share/libonnx-testdata/data/node/test_constantofshape_float_ones/model.onnx";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "libonnx-testdata not installed";
  onnx::ImportOptions o;
  const std::vector<int64_t> shape = {4, 3, 2};
  std::vector<uint8_t> bytes(24);
  std::memcpy(bytes.data(), shape.data(), 24);
  o.constant_inputs["x"] = {TensorType{DType::Int64, {3}}, bytes};
  {
    KILN_ASSERT_OK_AND_ASSIGN(m, onnx::import_model(model, o));
    const Value& y = m.graph.value(m.graph.outputs()[0]);
    EXPECT_EQ(y.type, (TensorType{DType::Float32, {4, 3, 2}}));
  }
  o.max_constant_bytes = 64;
  auto m = onnx::import_model(model, o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), ErrorCode::NotSupported) << m.error().to_string();
  EXPECT_NE(m.error().message().find("more than 64 bytes"), std::string::npos) << m.error().to_string();
#endif
}

std::vector<uint8_t> read_regression(const std::string& target, const std::string& name) {
  std::ifstream f(std::string(KILN_SOURCE_DIR) + "/tests/fuzz/regressions/" + target + "/" + name, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Fuzz finding (kiln_mlx_payload_fuzzer, regressions/max-pool-dilation-pads-81TB.case): a
// max_pool2d whose values are all small (output [1, 4, 1, 1]) but whose dilated window (kernel 34,
// dilation 393217) made the lowering pad its input to an 81 TB array; MLX then wrote through the
// null buffer of the failed allocation. init now walks every array of the traced computation and
// refuses it (MemoryAllocationFailed; or InvalidProgram, should the op's check decline it first).
TEST(FuzzRegressions, MlxRefusesALoweringTemporaryAboveTheLimit) {
  const Backend* mlx = BackendRegistry::get().find("mlx");
  if (mlx == nullptr) GTEST_SKIP() << "mlx backend not built";
  auto c = fuzz::decode_case(read_regression("kiln_mlx_payload_fuzzer", "max-pool-dilation-pads-81TB.case"));
  ASSERT_TRUE(c.has_value());
  std::vector<std::span<const uint8_t>> constants(c->constants.begin(), c->constants.end());
  const BackendSettings settings = {{"mlx.device", "cpu"}};  // default limit: this machine's memory
  DelegateOptions options;
  options.settings = &settings;
  auto h = mlx->init(c->payload, constants, c->inputs, c->outputs, options);
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(h.error().code() == ErrorCode::MemoryAllocationFailed || h.error().code() == ErrorCode::InvalidProgram)
      << h.error().to_string();
}

// Fuzz finding (kiln_mlx_payload_fuzzer, regressions/conv-taps-int32-overflow.case): a
// convolution with a dilation near 2^28 made the taps lowering compute its padded extent in int
// (signed overflow, UBSan). The op's check (support and init alike) now declines a window whose
// padded extent exceeds MLX's int32 sizes.
TEST(FuzzRegressions, MlxDeclinesAWindowBeyondInt32) {
  const Backend* mlx = BackendRegistry::get().find("mlx");
  if (mlx == nullptr) GTEST_SKIP() << "mlx backend not built";
  auto c = fuzz::decode_case(read_regression("kiln_mlx_payload_fuzzer", "conv-taps-int32-overflow.case"));
  ASSERT_TRUE(c.has_value());
  std::vector<std::span<const uint8_t>> constants(c->constants.begin(), c->constants.end());
  const BackendSettings settings = {{"mlx.device", "cpu"}};
  DelegateOptions options;
  options.settings = &settings;
  auto h = mlx->init(c->payload, constants, c->inputs, c->outputs, options);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.error().code(), ErrorCode::InvalidProgram) << h.error().to_string();
  EXPECT_NE(h.error().message().find("exceeds MLX's int32 sizes"), std::string::npos) << h.error().to_string();
}

// Fuzz findings of kiln_onnx_import_fuzzer: Tile with a repeat whose product with the dim
// overflows int64 (signed overflow, UBSan); NegativeLogLikelihoodLoss with a 0-d weight (read
// past an empty size list); Reshape to sizes whose product overflows int64; Tile of a zero-size
// input to sizes beyond the program format (see below); AveragePool with asymmetric pads on an
// int8 input wrote its float32 count mask past a buffer sized for int8 (ASan heap overflow); Elu
// with alpha 2^33 on a uint8 input converted it to uint8 (out of range: undefined); Pad in edge mode
// allocated a huge index vector (ASan out-of-memory). All are error values naming the node now.
TEST(FuzzRegressions, OnnxImporterRejectsTheFuzzersModels) {
#ifndef KILN_HAVE_ONNX
  GTEST_SKIP() << "ONNX importer not built";
#else
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/tests/fuzz/regressions/kiln_onnx_import_fuzzer/";
  // The fuzzer gives a dynamic dim other than the first the size 64 (tile's input is 1x2x3x?).
  const ErrorCode invalid = ErrorCode::InvalidProgram;
  for (const auto& [file, code, message] :
       {std::tuple{"tile-repeat-overflow.onnx", invalid, "Tile): repeat 576460752303423492 of dim 3"},
        std::tuple{"nll-loss-weight-rank-0.onnx", invalid, "weight must be [C] = [5], got []"},
        std::tuple{"reshape-shape-product-overflow.onnx", invalid, "cannot reshape [1, 9, 4, 4] to [1, 577034697373122561"},
        std::tuple{"tile-zero-size-beyond-format-limit.onnx", invalid, "exceeds the program format's limits"},
        std::tuple{"average-pool-int8-count-mask.onnx", ErrorCode::NotSupported, "AveragePool): dtype int8"},
        std::tuple{"elu-alpha-beyond-uint8.onnx", ErrorCode::NotSupported, "the constant 8589934592.000000 does not fit uint8"}}) {
    onnx::ImportOptions o;
    if (std::string(file) == "tile-repeat-overflow.onnx") o.input_shapes["0"] = {1, 2, 3, 64};
    auto m = onnx::import_model(dir + file, o);
    ASSERT_FALSE(m.ok()) << file;
    EXPECT_EQ(m.error().code(), code) << m.error().to_string();
    EXPECT_NE(m.error().message().find(message), std::string::npos) << m.error().to_string();
  }
  // Pad in edge mode with a pad of ~2^26 built its gather's index vector (750 MB) before any check;
  // now the indices are a constant within max_constant_bytes (the fuzzer's 16 MiB).
  onnx::ImportOptions o;
  o.max_constant_bytes = uint64_t{16} << 20;
  auto m = onnx::import_model(dir + "edge-pad-huge-index.onnx", o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), ErrorCode::NotSupported) << m.error().to_string();
  EXPECT_NE(m.error().message().find("the edge-pad indices of dim"), std::string::npos) << m.error().to_string();
#endif
}

// Fuzz finding (kiln_onnx_import_fuzzer's compile -> load property,
// regressions/tile-zero-size-beyond-format-limit.onnx): Tile of a [0, 2, 3, 4] input gave a
// zero-element value whose other sizes multiply past the loader's 2^46-byte limit; the compiler
// wrote it and the loader refused the file. Now Graph::add_node refuses an output beyond the
// program format's limits (so every numel of a graph fits in int64: the ONNX Reshape overflow of
// regressions/reshape-shape-product-overflow.onnx came from such sizes), and the compiler refuses
// a graph input beyond them.
TEST(FuzzRegressions, CompilerRefusesWhatTheLoaderWould) {
  for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{0, int64_t{1} << 30, int64_t{1} << 30},
                                            std::vector<int64_t>(17, 1)}) {
    Graph g;
    ValueId x = g.add_input("x", {DType::Float32, sizes});
    auto y = g.add_node("aten.relu", {x}, {});
    ASSERT_FALSE(y.ok()) << sizes_to_string(sizes);
    EXPECT_EQ(y.error().code(), ErrorCode::InvalidArgument) << y.error().to_string();
    EXPECT_NE(y.error().message().find("exceeds the program format's limits"), std::string::npos) << y.error().to_string();
    // The same type as a graph input (not produced by a node): the compiler refuses it.
    Graph h;
    h.add_input("big", {DType::Float32, sizes});
    ValueId small = h.add_input("small", {DType::Float32, {2}});
    auto r = h.add_node("aten.relu", {small}, {});
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    ASSERT_TRUE(h.set_outputs({r.value()[0]}).ok());
    ProgramBuilder pb;
    ASSERT_TRUE(pb.add_method("forward", std::move(h)).ok());
    auto compiled = pb.compile();
    ASSERT_FALSE(compiled.ok()) << sizes_to_string(sizes);
    EXPECT_EQ(compiled.error().code(), ErrorCode::InvalidArgument) << compiled.error().to_string();
    EXPECT_NE(compiled.error().message().find("value 'big'"), std::string::npos) << compiled.error().to_string();
  }
  // At the limit (2^44 float32 elements beside a zero: 2^46 bytes counted) it compiles and loads.
  Graph g;
  ValueId x = g.add_input("x", {DType::Float32, {0, int64_t{1} << 22, int64_t{1} << 22}});
  auto y = g.add_node("aten.relu", {x}, {});
  ASSERT_TRUE(y.ok()) << y.error().to_string();
  ASSERT_TRUE(g.set_outputs({y.value()[0]}).ok());
  ProgramBuilder pb;
  ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
  KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile());
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
  EXPECT_TRUE(program->load_method("forward").ok());
}

// Every delegate regression input of tests/fuzz/regressions runs through the fuzzers' harness
// without a crash or a sanitizer report (init and, where it succeeds, execute on zeros).
TEST(FuzzRegressions, DelegateRegressionInputsReplay) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(KILN_SOURCE_DIR) / "tests" / "fuzz" / "regressions";
  const BackendSettings mlx_settings = {{"mlx.device", "cpu"}, {"mlx.max_array_bytes", "67108864"}};
  const BackendSettings none;
  int replayed = 0;
  for (const auto& [backend, dir, settings] :
       {std::tuple{"xnnpack", "kiln_xnnpack_payload_fuzzer", &none}, std::tuple{"mlx", "kiln_mlx_payload_fuzzer", &mlx_settings}}) {
    const Backend* b = BackendRegistry::get().find(backend);
    if (b == nullptr || !fs::is_directory(root / dir)) continue;
    DelegateOptions options;
    options.settings = settings;
    for (const auto& entry : fs::directory_iterator(root / dir)) {
      std::ifstream f(entry.path(), std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      fuzz::run_delegate_case(*b, bytes, options);
      ++replayed;
    }
  }
  if (replayed == 0) GTEST_SKIP() << "no delegate backend built, or no regression inputs under " << root;
  std::printf("[          ] replayed %d delegate regression inputs\n", replayed);
}

}  // namespace
}  // namespace kiln

// Optimized cpu kernels (src/kernels/cpu: conv, mm/bmm/addmm/linear, sgemm) against the portable
// reference kernels on random inputs with awkward sizes, with and without a thread pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <optional>
#include <cmath>
#include <memory>
#include <random>
#include <sstream>
#include <string>

#include "ir/op_registry.h"
#include "kernels/cpu/gemm.h"
#include "kernels/kernel.h"

namespace kiln {
namespace {

std::vector<float> random_floats(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

/// max |a - e| <= rel * max |e| (with a floor for all-zero e).
void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, double rel,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double max_e = 0.0, max_err = 0.0;
  size_t where = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    max_e = std::max(max_e, std::fabs(static_cast<double>(expected[i])));
    const double err = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    if (!(err <= max_err)) {  // also catches NaN
      max_err = err;
      where = i;
    }
  }
  EXPECT_LE(max_err, rel * std::max(max_e, 1e-6))
      << what << ": max error " << max_err << " at " << where << " (actual " << actual[where] << ", expected "
      << expected[where] << "), max |expected| " << max_e;
}

/// Tolerance for fp32 sums of `k` products against the (double-accumulated) portable kernel.
double tol_for(int64_t k) { return (getenv("KILN_TEST_TOL0") ? 0.0 : 1e-5) * std::max(1.0, std::sqrt(static_cast<double>(k) / 64.0)); }

/// Runs `op` on the given inputs (null type = None) with the cpu kernel (which must be selected)
/// and the portable kernel, each with and without a 2-thread pool, and compares.
void check_op(const std::string& op, const std::vector<std::optional<TensorType>>& types, const Attributes& given,
              int64_t k, const std::string& what, uint32_t seed = 1) {
  SCOPED_TRACE(op + " " + what);
  const OpDef* def = OpRegistry::get().find(op);
  ASSERT_NE(def, nullptr);
  auto attrs = def->normalize_attributes(given);
  ASSERT_TRUE(attrs.ok()) << attrs.error().to_string();
  std::vector<const TensorType*> in_ptrs;
  for (const auto& t : types) in_ptrs.push_back(t ? &*t : nullptr);
  auto out_types = def->infer_types(in_ptrs, *attrs);
  ASSERT_TRUE(out_types.ok()) << out_types.error().to_string();
  std::vector<const TensorType*> out_ptrs;
  for (const auto& t : *out_types) out_ptrs.push_back(&t);
  const KernelRegistry& reg = KernelRegistry::get();
  KernelSignature sig{in_ptrs, out_ptrs, *attrs};
  KernelFn cpu = reg.select(op, sig, KernelSet::Optimized);
  KernelFn portable = reg.find(op);
  ASSERT_NE(portable, nullptr);
  ASSERT_STREQ(reg.set_name(cpu), "cpu") << "the cpu kernel should accept " << what;

  std::mt19937 rng(seed);
  std::vector<std::vector<float>> data(types.size());
  std::vector<Tensor> in_tensors(types.size());
  std::vector<const Tensor*> in_args(types.size(), nullptr);
  for (size_t i = 0; i < types.size(); ++i) {
    if (!types[i]) continue;
    data[i] = random_floats(types[i]->numel(), rng);
    in_tensors[i] = Tensor{DType::Float32, types[i]->sizes, data[i].data()};
    in_args[i] = &in_tensors[i];
  }

  auto run = [&](KernelFn fn, ThreadPool* pool) {
    const TensorType& ot = (*out_types)[0];
    std::vector<float> out(static_cast<size_t>(ot.numel()), std::nanf(""));  // kernels must write all
    Tensor o{DType::Float32, ot.sizes, out.data()};
    Tensor* outs[] = {&o};
    KernelArgs args{in_args, outs, *attrs, pool};
    Error e = fn(args);
    EXPECT_TRUE(e.ok()) << e.to_string();
    return out;
  };
  ThreadPool pool(2);
  const std::vector<float> expected = run(portable, nullptr);
  expect_close(run(cpu, nullptr), expected, tol_for(k), what + " (1 thread)");
  expect_close(run(cpu, &pool), expected, tol_for(k), what + " (2 threads)");
}

TensorType f32(std::vector<int64_t> sizes) { return TensorType{DType::Float32, std::move(sizes)}; }

struct ConvCase {
  int64_t n, cin, h, w, cout, kh, kw;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  bool bias;
};

void check_conv(const ConvCase& c, bool one_d = false) {
  std::vector<std::optional<TensorType>> types;
  if (one_d) {
    types = {f32({c.n, c.cin, c.w}), f32({c.cout, c.cin / c.groups, c.kw}), std::nullopt};
  } else {
    types = {f32({c.n, c.cin, c.h, c.w}), f32({c.cout, c.cin / c.groups, c.kh, c.kw}), std::nullopt};
  }
  if (c.bias) types[2] = f32({c.cout});
  Attributes attrs{{"stride", c.stride}, {"padding", c.padding}, {"dilation", c.dilation},
                   {"transposed", false}, {"output_padding", std::vector<int64_t>{0}}, {"groups", c.groups}};
  const std::string what = std::string("N") + std::to_string(c.n) + " Cin" + std::to_string(c.cin) + " " + std::to_string(c.h) +
                           "x" + std::to_string(c.w) + " Cout" + std::to_string(c.cout) + " k" + std::to_string(c.kh) +
                           "x" + std::to_string(c.kw) + " s" + attr_to_string(c.stride) + " p" +
                           attr_to_string(c.padding) + " d" + attr_to_string(c.dilation) + " g" +
                           std::to_string(c.groups) + (c.bias ? " bias" : "") + (one_d ? " 1-D" : "");
  check_op("aten.convolution", types, attrs, c.cin / c.groups * c.kh * c.kw, what);
}

using V = std::vector<int64_t>;

TEST(CpuConv, OneByOne) {
  check_conv({1, 16, 7, 9, 24, 1, 1, V{1}, V{0}, V{1}, 1, true});
  check_conv({3, 13, 5, 11, 7, 1, 1, V{1}, V{0}, V{1}, 1, false});
  check_conv({2, 64, 14, 14, 130, 1, 1, V{1}, V{0}, V{1}, 1, true});   // M, N past one block
  check_conv({1, 300, 3, 3, 37, 1, 1, V{1}, V{0}, V{1}, 1, true});     // K > 256: several K blocks
  check_conv({2, 12, 6, 5, 18, 1, 1, V{1}, V{0}, V{1}, 3, true});      // grouped 1x1
  check_conv({1, 1, 1, 1, 1, 1, 1, V{1}, V{0}, V{1}, 1, true});        // 1 everywhere
  check_conv({1, 8, 9, 9, 5, 1, 1, V{2}, V{0}, V{1}, 1, true});        // 1x1 stride 2 (im2col path)
  check_conv({1, 8, 9, 9, 5, 1, 1, V{1}, V{1}, V{1}, 1, false});       // 1x1 padded
  check_conv({1, 96, 1, 1, 24, 1, 1, V{1}, V{0}, V{1}, 1, true});      // squeeze-excite: N == 1 (gemv)
  check_conv({2, 130, 1, 1, 300, 1, 1, V{1}, V{0}, V{1}, 1, true});
}

TEST(CpuConv, Im2col) {
  check_conv({1, 3, 23, 23, 16, 3, 3, V{2}, V{1}, V{1}, 1, true});     // mv3 stem-like
  check_conv({2, 5, 17, 13, 11, 3, 3, V{1}, V{1}, V{1}, 1, true});
  check_conv({1, 7, 19, 21, 9, 5, 3, V{2, 1}, V{2, 0}, V{1, 2}, 1, false});
  check_conv({1, 6, 15, 15, 10, 3, 3, V{3}, V{4}, V{2}, 1, true});     // padding > kernel reach
  check_conv({1, 3, 31, 29, 8, 7, 7, V{2}, V{3}, V{1}, 1, true});      // resnet stem-like
  // Stride-2 rows wide enough for the vector (even-element) gather of im2col, odd widths, and
  // 1024-column blocks that start inside an output row.
  check_conv({1, 3, 70, 67, 16, 3, 3, V{2}, V{1}, V{1}, 1, true});
  check_conv({1, 3, 45, 101, 8, 7, 7, V{2}, V{3}, V{1}, 1, false});
  check_conv({1, 2, 30, 64, 5, 3, 3, V{2, 2}, V{0, 0}, V{1, 2}, 1, true});  // no padding, dilation 2
  check_conv({1, 64, 9, 9, 70, 3, 3, V{1}, V{1}, V{1}, 1, true});      // K = 576
  check_conv({2, 12, 10, 10, 8, 3, 3, V{1}, V{1}, V{1}, 4, true});     // groups 4
  check_conv({1, 6, 11, 11, 9, 2, 2, V{2}, V{0}, V{3}, 3, false});     // groups 3, dilation 3
  check_conv({1, 4, 1, 1, 5, 1, 1, V{1}, V{0}, V{1}, 1, true});
  check_conv({1, 2, 4, 4, 3, 4, 4, V{1}, V{0}, V{1}, 1, true});        // kernel == input
  check_conv({1, 512, 5, 5, 17, 3, 3, V{1}, V{1}, V{1}, 1, true});     // K = 4608, N = 25
  check_conv({1, 4, 80, 80, 6, 3, 3, V{1}, V{1}, V{1}, 1, true});      // several column blocks
  check_conv({1, 32, 30, 30, 64, 3, 3, V{1}, V{1}, V{1}, 1, true});    // large enough for the pool (split N)
  check_conv({1, 256, 7, 7, 300, 3, 3, V{1}, V{1}, V{1}, 1, false});   // pool, split M, N = 49
}

TEST(CpuConv, Depthwise) {
  check_conv({1, 16, 13, 17, 16, 3, 3, V{1}, V{1}, V{1}, 16, true});
  check_conv({2, 7, 45, 37, 7, 3, 3, V{2}, V{1}, V{1}, 7, false});      // stride 2, wide rows (vector + tail)
  check_conv({1, 5, 40, 41, 5, 5, 5, V{2}, V{2}, V{1}, 5, true});       // mv3 5x5 s2
  check_conv({1, 6, 23, 50, 6, 3, 3, V{1}, V{2}, V{2}, 6, true});       // dilation 2
  check_conv({1, 4, 19, 70, 12, 3, 5, V{3, 2}, V{1, 2}, V{1, 3}, 4, true});  // multiplier 3, mixed params
  check_conv({1, 3, 9, 9, 6, 3, 3, V{1}, V{0}, V{1}, 3, false});        // no padding, multiplier 2
  check_conv({3, 2, 1, 1, 2, 1, 1, V{1}, V{0}, V{1}, 2, true});
  check_conv({1, 8, 10, 10, 8, 3, 3, V{4}, V{5}, V{1}, 8, true});       // padding larger than kernel
  check_conv({2, 32, 57, 55, 32, 3, 3, V{1}, V{1}, V{1}, 32, true});    // large enough to run on the pool
  check_conv({1, 32, 56, 56, 64, 5, 5, V{2}, V{2}, V{1}, 32, false});   // pool, stride 2, multiplier 2
  check_conv({1, 3, 4, 5, 3, 2, 2, V{300}, V{200}, V{1}, 3, true});      // huge stride/padding: GEMM path
  // Stride 1 shapes of mobilenet_v3 and odd borders (the padded plane buffer is zeroed once per
  // thread and reused across planes: its padding must stay zero).
  check_conv({1, 4, 7, 7, 4, 5, 5, V{1}, V{2}, V{1}, 4, true});         // mv3 7x7 5x5: all border
  check_conv({1, 5, 14, 14, 5, 3, 3, V{1}, V{1}, V{1}, 5, true});       // mv3 14x14
  check_conv({1, 3, 28, 28, 3, 5, 5, V{1}, V{2}, V{1}, 3, false});      // mv3 28x28 5x5
  check_conv({1, 2, 6, 37, 2, 3, 3, V{1}, V{1}, V{1}, 2, true});        // rows not a multiple of 4
  check_conv({1, 3, 5, 3, 3, 1, 7, V{1}, V{0, 9}, V{1}, 3, true});      // padding wider than the plane
  check_conv({1, 2, 9, 11, 4, 2, 4, V{1}, V{0, 1}, V{1}, 2, true});     // even kernel, multiplier 2
  check_conv({1, 2, 5, 40, 2, 3, 3, V{1}, V{0, 3}, V{1}, 2, true});     // no row padding, wide columns
  check_conv({1, 2, 3, 3, 2, 3, 3, V{1}, V{4}, V{1}, 2, true});         // output rows entirely outside the input
}

// The channel-blocked kernel (multiplier 1, output rows of at most 32 columns): 8 channels at a
// time, so channel counts that are not a multiple of 8 leave a partial last block; plane sizes
// whose pixel count is not a multiple of 8 leave a partial last pixel block; the padded buffer is
// per thread and reused across calls of different geometries (its borders must be re-zeroed).
TEST(CpuConv, DepthwiseChannelBlocked) {
  check_conv({1, 960, 7, 7, 960, 5, 5, V{1}, V{2}, V{1}, 960, true});   // mv3 7x7 5x5
  check_conv({1, 9, 7, 7, 9, 5, 5, V{1}, V{2}, V{1}, 9, true});         // 8 + 1 channels
  check_conv({2, 13, 14, 14, 13, 5, 5, V{2}, V{2}, V{1}, 13, false});   // mv3 5x5 s2, batch 2, 8 + 5
  check_conv({1, 17, 28, 28, 17, 3, 3, V{2}, V{1}, V{1}, 17, true});    // mv3 3x3 s2 at 28x28
  check_conv({1, 3, 11, 13, 3, 3, 3, V{1}, V{1}, V{1}, 3, true});       // fewer than 8 channels, 143 pixels
  check_conv({1, 12, 9, 10, 12, 3, 5, V{2, 3}, V{1, 2}, V{2, 1}, 12, true});  // mixed strides, dilation
  check_conv({1, 8, 5, 5, 8, 3, 3, V{1}, V{0}, V{1}, 8, false});        // no padding, 3x3 output
  check_conv({1, 10, 6, 6, 10, 3, 3, V{3}, V{4}, V{1}, 10, true});      // padding larger than the kernel
  check_conv({1, 16, 1, 1, 16, 3, 3, V{1}, V{1}, V{1}, 16, true});      // 1x1 plane: all padding
  check_conv({1, 11, 40, 30, 11, 3, 3, V{1}, V{1}, V{1}, 11, true});    // tall plane, 30 columns
  check_conv({3, 24, 14, 14, 24, 3, 3, V{1}, V{1}, V{1}, 24, true});    // large enough for the pool
  check_conv({1, 120, 28, 28, 120, 5, 5, V{1}, V{2}, V{1}, 120, true}); // mv3 28x28 5x5
  check_conv({1, 9, 1, 30, 9, 1, 3, V{1}, V{1}, V{2}, 9, true}, true);   // 1-D, dilation 2
}

TEST(CpuConv, OneD) {
  check_conv({2, 6, 1, 37, 10, 1, 5, V{2}, V{2}, V{1}, 1, true}, true);
  check_conv({1, 8, 1, 50, 8, 1, 3, V{1}, V{1}, V{2}, 8, true}, true);  // depthwise 1-D
  check_conv({1, 8, 1, 20, 12, 1, 1, V{1}, V{0}, V{1}, 2, false}, true);
}

/// Transposed convolution: weight [C_in, C_out/groups, KH, KW]; cpu (GEMM + col2im) vs portable.
void check_conv_transposed(const ConvCase& c, const std::vector<int64_t>& output_padding) {
  std::vector<std::optional<TensorType>> types = {f32({c.n, c.cin, c.h, c.w}), f32({c.cin, c.cout / c.groups, c.kh, c.kw}),
                                                  std::nullopt};
  if (c.bias) types[2] = f32({c.cout});
  Attributes attrs{{"stride", c.stride}, {"padding", c.padding}, {"dilation", c.dilation},
                   {"transposed", true}, {"output_padding", output_padding}, {"groups", c.groups}};
  const std::string what = "transposed Cin" + std::to_string(c.cin) + " " + std::to_string(c.h) + "x" +
                           std::to_string(c.w) + " Cout" + std::to_string(c.cout) + " k" + std::to_string(c.kh) + "x" +
                           std::to_string(c.kw) + " s" + attr_to_string(c.stride) + " p" + attr_to_string(c.padding) +
                           " op" + attr_to_string(output_padding) + " d" + attr_to_string(c.dilation) + " g" +
                           std::to_string(c.groups);
  check_op("aten.convolution", types, attrs, c.cin / c.groups * c.kh * c.kw, what);
}

TEST(CpuConv, Transposed) {
  check_conv_transposed({1, 4, 5, 5, 3, 3, 3, V{2}, V{0}, V{1}, 1, false}, V{1});
  check_conv_transposed({1, 96, 40, 40, 24, 2, 2, V{2}, V{0}, V{1}, 1, true}, V{0});   // PP-OCR det upsampling
  check_conv_transposed({2, 6, 7, 4, 9, 3, 3, V{2, 1}, V{1, 0}, V{1}, 3, true}, V{1, 0});
  check_conv_transposed({1, 4, 6, 6, 4, 4, 3, V{3, 2}, V{2, 1}, V{1, 2}, 1, true}, V{2, 1});
  check_conv_transposed({1, 8, 9, 9, 8, 3, 3, V{2}, V{1}, V{1}, 8, true}, V{1});       // depthwise
  check_conv_transposed({1, 3, 1, 1, 5, 4, 4, V{1}, V{0}, V{1}, 1, true}, V{0});       // 1x1 input
  check_conv_transposed({1, 32, 20, 20, 16, 4, 4, V{2}, V{1}, V{1}, 1, true}, V{0});   // large enough for the pool
}

TEST(CpuLinear, Mm) {
  for (auto [n, k, m] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1}, {7, 13, 5}, {1, 300, 17}, {1, 70, 100}, {37, 300, 19}, {150, 290, 33}, {6, 16, 16}, {200, 3, 1}}) {
    check_op("aten.mm", {f32({n, k}), f32({k, m})}, {}, k,
             std::to_string(n) + "x" + std::to_string(k) + " @ " + std::to_string(k) + "x" + std::to_string(m));
  }
}

TEST(CpuLinear, Bmm) {
  for (auto [b, n, k, m] : std::vector<std::array<int64_t, 4>>{
           {1, 7, 13, 5}, {3, 17, 9, 29}, {4, 64, 40, 50}, {5, 1, 33, 7}, {4, 77, 64, 120}, {3, 200, 100, 70}}) {
    check_op("aten.bmm", {f32({b, n, k}), f32({b, k, m})}, {}, k,
             std::string("b") + std::to_string(b) + " " + std::to_string(n) + "x" + std::to_string(k) + "x" + std::to_string(m));
  }
}

TEST(CpuLinear, Addmm) {
  check_op("aten.addmm", {f32({19}), f32({11, 23}), f32({23, 19})}, {}, 23, "row bias");
  check_op("aten.addmm", {f32({1, 19}), f32({11, 23}), f32({23, 19})}, {{"beta", 0.5}, {"alpha", -2.0}}, 23,
           "row bias, beta 0.5 alpha -2");
  check_op("aten.addmm", {f32({11, 1}), f32({11, 23}), f32({23, 19})}, {}, 23, "column bias");
  check_op("aten.addmm", {f32({11, 19}), f32({11, 23}), f32({23, 19})}, {{"beta", 3.0}}, 23, "full self");
  check_op("aten.addmm", {f32({}), f32({1, 300}), f32({300, 40})}, {{"alpha", 0.25}}, 300, "scalar self, M=1");
  check_op("aten.addmm", {f32({11, 19}), f32({11, 23}), f32({23, 19})}, {{"beta", 0.0}}, 23, "beta 0");
  check_op("aten.addmm", {f32({1}), f32({70, 300}), f32({300, 1})}, {}, 300, "N == 1");
  check_op("aten.addmm", {f32({70, 1}), f32({70, 300}), f32({300, 1})}, {{"beta", -1.5}}, 300, "N == 1, full self");
}

TEST(CpuLinear, Linear) {
  check_op("aten.linear", {f32({1, 1280}), f32({1000, 1280}), f32({1000})}, {}, 1280, "classifier head");
  check_op("aten.linear", {f32({3, 5, 37}), f32({29, 37}), f32({29})}, {}, 37, "3-D input");
  check_op("aten.linear", {f32({77, 70}), f32({130, 70}), std::nullopt}, {}, 70, "no bias");
  check_op("aten.linear", {f32({13}), f32({7, 13}), f32({7})}, {}, 13, "1-D input");
  check_op("aten.linear", {f32({4, 9}), f32({6, 9}), f32({4, 6})}, {}, 9, "full bias");
  check_op("aten.linear", {f32({300, 260}), f32({33, 260}), f32({1})}, {}, 260, "scalar-like bias");
}

/// Naive double reference for cpu::sgemm's documented contract.
void reference_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    const float* B, int64_t ldb, float beta, std::vector<float>& C, int64_t ldc,
                    const cpu::GemmEpilogue& ep) {
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < K; ++p) {
        acc += static_cast<double>(ta ? A[p * lda + i] : A[i * lda + p]) * (tb ? B[j * ldb + p] : B[p * ldb + j]);
      }
      double v = alpha * acc;
      if (beta != 0.0f) v += static_cast<double>(beta) * C[i * ldc + j];
      if (ep.bias_kind == cpu::GemmBias::PerRow) v += ep.bias[i];
      if (ep.bias_kind == cpu::GemmBias::PerCol) v += ep.bias[j];
      if (ep.clamp) v = std::min<double>(std::max<double>(v, ep.clamp_min), ep.clamp_max);
      C[i * ldc + j] = static_cast<float>(v);
    }
  }
}

void check_sgemm_contract() {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  struct G {
    int64_t M, N, K;
  };
  for (G s : {G{1, 1, 1}, G{5, 3, 2}, G{13, 37, 300}, G{150, 17, 29}, G{1, 70, 513}, G{37, 1, 300}, G{200, 1, 7}, G{64, 200, 0}, G{300, 290, 50}}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const int64_t lda = (ta ? s.M : s.K) + 3, ldb = (tb ? s.K : s.N) + 2, ldc = s.N + 5;
      auto A = random_floats((ta ? s.K : s.M) * lda, rng);
      auto B = random_floats((tb ? s.N : s.K) * ldb, rng);
      auto C0 = random_floats(s.M * ldc, rng);
      auto row_bias = random_floats(s.M, rng);
      auto col_bias = random_floats(s.N, rng);
      for (int variant = 0; variant < 3; ++variant) {
        cpu::GemmEpilogue ep;
        float alpha = 1.0f, beta = 0.0f;
        if (variant == 1) {
          alpha = -0.5f;
          beta = 2.0f;
          ep.bias_kind = cpu::GemmBias::PerRow;
          ep.bias = row_bias.data();
        } else if (variant == 2) {
          beta = 1.0f;
          ep.bias_kind = cpu::GemmBias::PerCol;
          ep.bias = col_bias.data();
          ep.clamp = true;
          ep.clamp_min = -0.5f;
          ep.clamp_max = 0.75f;
        }
        std::vector<float> expected = C0;
        if (beta == 0.0f) {  // C must not be read: poison it
          for (float& v : expected) v = std::nanf("");
        }
        std::vector<float> in_c = expected;
        reference_gemm(ta, tb, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta, expected, ldc, ep);
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
          std::vector<float> c = in_c;
          cpu::sgemm(ta, tb, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta, c.data(), ldc, ep, p);
          // compare only the M x N window; the padding columns must be untouched
          std::vector<float> got, want;
          for (int64_t i = 0; i < s.M; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              if (j < s.N) {
                got.push_back(c[i * ldc + j]);
                want.push_back(expected[i * ldc + j]);
              } else {
                EXPECT_TRUE(std::isnan(in_c[i * ldc + j]) ? std::isnan(c[i * ldc + j])
                                                          : c[i * ldc + j] == in_c[i * ldc + j])
                    << "padding of C written at " << i << "," << j;
              }
            }
          }
          expect_close(got, want, tol_for(s.K),
                       std::string("sgemm M") + std::to_string(s.M) + " N" + std::to_string(s.N) + " K" + std::to_string(s.K) +
                           " ta" + std::to_string(ta) + " tb" + std::to_string(tb) + " variant" +
                           std::to_string(variant) + (p ? " pool" : ""));
        }
      }
    }
  }
}

TEST(CpuGemm, TransposesLeadingDimsEpilogue) { check_sgemm_contract(); }

/// cpu::sgemm_prepacked on A packed by pack_a_for_gemm and B written in the documented
/// prepacked_b_floats layout (K over 2 blocks, partial panels, M not a multiple of 6), against the
/// double reference; C outside the M x N window untouched.
void check_sgemm_prepacked() {
  std::mt19937 rng(11);
  struct G {
    int64_t M, N, K;
  };
  for (G s : {G{1, 1, 1}, G{64, 16, 64}, G{7, 40, 300}, G{13, 8, 257}, G{64, 24, 512}}) {
    const int64_t ldc = s.N + 3;
    auto A = random_floats(s.M * s.K, rng);
    auto B = random_floats(s.K * s.N, rng);
    std::vector<float> packed_a(static_cast<size_t>(cpu::packed_a_floats(s.M, s.K)));
    cpu::pack_a_for_gemm(s.M, s.K, A.data(), s.K, packed_a.data());
    std::vector<float> packed_b(static_cast<size_t>(cpu::prepacked_b_floats(s.N, s.K)), std::nanf(""));
    const int64_t npanels = (s.N + cpu::kGemmPanelCols - 1) / cpu::kGemmPanelCols;
    for (int64_t p = 0; p < s.K; ++p) {
      const int64_t q = p / cpu::kGemmKBlock, kc = std::min<int64_t>(cpu::kGemmKBlock, s.K - q * cpu::kGemmKBlock);
      for (int64_t j = 0; j < s.N; ++j) {
        packed_b[static_cast<size_t>(q * npanels * cpu::gemm_panel_stride(cpu::kGemmKBlock) +
                                     j / cpu::kGemmPanelCols * cpu::gemm_panel_stride(kc) +
                                     p % cpu::kGemmKBlock * cpu::kGemmPanelCols + j % cpu::kGemmPanelCols)] = B[p * s.N + j];
      }
    }
    auto bias = random_floats(s.M, rng);
    cpu::GemmEpilogue ep;
    ep.bias_kind = cpu::GemmBias::PerRow;
    ep.bias = bias.data();
    std::vector<float> expected(static_cast<size_t>(s.M * ldc), 0.0f);
    reference_gemm(false, false, s.M, s.N, s.K, 1.0f, A.data(), s.K, B.data(), s.N, 0.0f, expected, ldc, ep);
    std::vector<float> c(static_cast<size_t>(s.M * ldc), 12345.0f);
    cpu::sgemm_prepacked(s.M, s.N, s.K, packed_a.data(), packed_b.data(), c.data(), ldc, ep);
    std::vector<float> got, want;
    for (int64_t i = 0; i < s.M; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        if (j < s.N) {
          got.push_back(c[i * ldc + j]);
          want.push_back(expected[i * ldc + j]);
        } else {
          EXPECT_EQ(c[i * ldc + j], 12345.0f) << "padding of C written at " << i << "," << j;
        }
      }
    }
    expect_close(got, want, tol_for(s.K),
                 "sgemm_prepacked M" + std::to_string(s.M) + " N" + std::to_string(s.N) + " K" + std::to_string(s.K));
  }
}

// sgemm is one source for every SIMD target: the other targets (scalar included) run these tests
// with KILN_CPU_TARGET set (the former test-only switch to a portable microkernel is gone).
TEST(CpuGemm, Prepacked) { check_sgemm_prepacked(); }

/// cpu::sgemm with op(B) prepacked by pack_b_for_gemm (a linear layer's weights: W [N, K], trans_b;
/// the microkernel then prefetches the next panel while computing, including across K blocks whose
/// last one is short): against the double reference, and bit-identical to the same product packing
/// B per call (same K blocks and microkernel, so the same sums), at 1 and 2 threads; C outside the
/// M x N window untouched.
TEST(CpuGemm, PrepackedWeightsMatchPerCallPacking) {
  std::mt19937 rng(13);
  ThreadPool pool(2);
  struct G {
    int64_t M, N, K;
  };
  for (G s : {G{77, 40, 257}, G{7, 17, 300}, G{150, 100, 513}, G{77, 33, 769}, G{13, 48, 256}, G{6, 16, 8}}) {
    const int64_t ldc = s.N + 2;
    auto A = random_floats(s.M * s.K, rng);
    auto W = random_floats(s.N * s.K, rng);
    auto bias = random_floats(s.N, rng);
    std::vector<float> packed(static_cast<size_t>(cpu::prepacked_b_floats(s.N, s.K)));
    cpu::pack_b_for_gemm(true, s.K, s.N, W.data(), s.K, packed.data());
    cpu::GemmEpilogue ep;
    ep.bias_kind = cpu::GemmBias::PerCol;
    ep.bias = bias.data();
    std::vector<float> expected(static_cast<size_t>(s.M * ldc), 0.0f);
    reference_gemm(false, true, s.M, s.N, s.K, 1.0f, A.data(), s.K, W.data(), s.K, 0.0f, expected, ldc, ep);
    std::vector<float> per_call(static_cast<size_t>(s.M * ldc), std::nanf(""));
    cpu::sgemm(false, true, s.M, s.N, s.K, 1.0f, A.data(), s.K, W.data(), s.K, 0.0f, per_call.data(), ldc, ep);
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> c(static_cast<size_t>(s.M * ldc), std::nanf(""));
      cpu::sgemm(false, true, s.M, s.N, s.K, 1.0f, A.data(), s.K, W.data(), s.K, 0.0f, c.data(), ldc, ep, p, nullptr,
                 packed.data());
      std::ostringstream name;
      name << "M" << s.M << " N" << s.N << " K" << s.K << (p ? " pool" : "");
      const std::string what = name.str();
      std::vector<float> got, want;
      int64_t differ = 0;
      for (int64_t i = 0; i < s.M; ++i) {
        for (int64_t j = 0; j < ldc; ++j) {
          const size_t k = static_cast<size_t>(i * ldc + j);
          if (j < s.N) {
            got.push_back(c[k]);
            want.push_back(expected[k]);
            differ += c[k] != per_call[k];
          } else {
            EXPECT_TRUE(std::isnan(c[k])) << "padding of C written at " << i << "," << j << " " << what;
          }
        }
      }
      expect_close(got, want, tol_for(s.K), "prepacked sgemm " + what);
      EXPECT_EQ(differ, 0) << "prepacked and per-call packed B differ in " << differ << " values, " << what;
    }
  }
}

}  // namespace
}  // namespace kiln

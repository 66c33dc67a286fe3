// The optimized cpu kernels of src/kernels/cpu/{attention,norm,softmax,activation,elementwise}.cpp
// against the portable reference kernels (KernelRegistry::find), on random inputs with odd sizes,
// broadcast shapes and non-default attributes, with and without a thread pool. Each case also
// checks that select() really picks a "cpu" kernel (or, where it must not, the portable one).
// Tolerance: max |cpu - portable| <= tol * max |portable| (NaN positions equal).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ir/op_registry.h"
#include "cpu_vec_shim.h"
#include "kernels/kernel.h"
#include "kiln/cpu_target.h"
#include "kiln/thread_pool.h"

namespace kiln {
namespace {

/// An owned tensor: dtype, sizes and bytes.
struct Buf {
  DType dtype = DType::Float32;
  std::vector<int64_t> sizes;
  std::vector<uint8_t> bytes;
  Tensor view() { return Tensor{dtype, sizes, bytes.data()}; }
  TensorType type() const { return {dtype, sizes}; }
  const float* f() const { return reinterpret_cast<const float*>(bytes.data()); }
};

Buf rand_f32(std::mt19937& rng, std::vector<int64_t> sizes, float lo = -2.0f, float hi = 2.0f) {
  Buf b{DType::Float32, std::move(sizes), {}};
  const int64_t n = numel_of(b.sizes);
  b.bytes.resize(static_cast<size_t>(n) * 4);
  std::uniform_real_distribution<float> d(lo, hi);
  float* p = reinterpret_cast<float*>(b.bytes.data());
  for (int64_t i = 0; i < n; ++i) p[i] = d(rng);
  return b;
}

Buf rand_bool(std::mt19937& rng, std::vector<int64_t> sizes, double p_true) {
  Buf b{DType::Bool, std::move(sizes), {}};
  b.bytes.resize(static_cast<size_t>(numel_of(b.sizes)));
  std::bernoulli_distribution d(p_true);
  for (auto& v : b.bytes) v = d(rng) ? 1 : 0;
  return b;
}

Buf from_floats(std::vector<int64_t> sizes, const std::vector<float>& v) {
  Buf b{DType::Float32, std::move(sizes), {}};
  b.bytes.resize(v.size() * 4);
  std::memcpy(b.bytes.data(), v.data(), b.bytes.size());
  return b;
}

ThreadPool& pool2() {
  static ThreadPool p(2);
  return p;
}

/// Runs `op` through the cpu kernel select() picks and through the portable kernel; expects the
/// cpu kernel to be chosen (expect_cpu) or not, and the outputs to agree within `tol`.
void check(const std::string& op, std::vector<std::optional<Buf>> in, const Attributes& given, double tol,
           bool expect_cpu = true) {
  SCOPED_TRACE(op + " " + given.to_string());
  const OpDef* def = OpRegistry::get().find(op);
  ASSERT_NE(def, nullptr);
  auto attrs = def->normalize_attributes(given);
  ASSERT_TRUE(attrs.ok()) << attrs.error().message();
  std::vector<TensorType> in_types(in.size());
  std::vector<const TensorType*> in_ptrs(in.size(), nullptr);
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i]) {
      in_types[i] = in[i]->type();
      in_ptrs[i] = &in_types[i];
    }
  }
  auto out_types = def->infer_types(in_ptrs, *attrs);
  ASSERT_TRUE(out_types.ok()) << out_types.error().message();
  ASSERT_EQ(out_types->size(), 1u);
  const TensorType& ot = (*out_types)[0];
  std::vector<const TensorType*> out_ptrs{&ot};
  const KernelSignature sig{in_ptrs, out_ptrs, *attrs};
  const KernelRegistry& reg = KernelRegistry::get();
  KernelFn fast = reg.select(op, sig, KernelSet::Optimized);
  KernelFn ref = reg.find(op);
  ASSERT_NE(ref, nullptr);
  if (!expect_cpu) {  // a call that the cpu kernels decline stays portable
    EXPECT_EQ(fast, ref) << "expected the portable kernel";
    return;
  }
  ASSERT_STREQ(reg.set_name(fast), "cpu");
  ASSERT_NE(fast, ref);

  std::vector<Tensor> tin(in.size());
  std::vector<const Tensor*> tin_ptrs(in.size(), nullptr);
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i]) {
      tin[i] = in[i]->view();
      tin_ptrs[i] = &tin[i];
    }
  }
  const int64_t n = ot.numel();
  std::vector<float> expect(static_cast<size_t>(n), 123.0f);
  Tensor te{ot.dtype, ot.sizes, expect.data()};
  Tensor* te_ptr = &te;
  ASSERT_TRUE(ref(KernelArgs{tin_ptrs, std::span<Tensor* const>(&te_ptr, 1), *attrs, nullptr}).ok());
  double scale = 0.0;
  for (float e : expect) {
    if (std::isfinite(e)) scale = std::max(scale, static_cast<double>(std::fabs(e)));
  }
  scale = std::max(scale, 1e-6);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2()}) {
    std::vector<float> got(static_cast<size_t>(n), -77.0f);
    Tensor tg{ot.dtype, ot.sizes, got.data()};
    Tensor* tg_ptr = &tg;
    const Error err = fast(KernelArgs{tin_ptrs, std::span<Tensor* const>(&tg_ptr, 1), *attrs, pool});
    ASSERT_TRUE(err.ok()) << err.message();
    double worst = 0.0;
    int64_t worst_i = -1;
    for (int64_t i = 0; i < n; ++i) {
      const float e = expect[static_cast<size_t>(i)], g = got[static_cast<size_t>(i)];
      if (std::isnan(e) || std::isnan(g)) {
        ASSERT_EQ(std::isnan(e), std::isnan(g)) << "NaN mismatch at " << i << ": expected " << e << " got " << g;
        continue;
      }
      if (std::isinf(e) || std::isinf(g)) {
        ASSERT_EQ(e, g) << "at " << i;
        continue;
      }
      const double d = std::fabs(static_cast<double>(e) - g);
      if (d > worst) {
        worst = d;
        worst_i = i;
      }
    }
    EXPECT_LE(worst, tol * scale) << (pool ? "pool(2)" : "no pool") << ": worst at " << worst_i << " expected "
                                  << expect[static_cast<size_t>(std::max<int64_t>(0, worst_i))] << " got "
                                  << got[static_cast<size_t>(std::max<int64_t>(0, worst_i))];
  }
}

// ------------------------------------------------------------------------------ vec_math
// The per-target math of src/kernels/cpu/vec-inl.h at the process's cpu target (KILN_CPU_TARGET
// picks it: run these at every target), through tests/cpp/cpu_vec_shim.cpp.

/// fn applied to xs (whole vectors and a tail, as the kernels call it).
std::vector<float> apply(test::VecFn fn, const std::vector<float>& xs) {
  std::vector<float> out(xs.size());
  test::vec_math(fn, xs.data(), out.data(), xs.size());
  return out;
}

/// Max relative error of fn against ref over xs (results with |ref| < floor use absolute error).
template <class Ref>
double max_rel_error(test::VecFn fn, Ref ref, const std::vector<float>& xs, double floor) {
  const std::vector<float> out = apply(fn, xs);
  double worst = 0.0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double e = ref(static_cast<double>(xs[i]));
    const double g = out[i];
    if (std::isnan(e)) {
      EXPECT_TRUE(std::isnan(g)) << xs[i];
      continue;
    }
    if (std::isinf(e) || std::fabs(e) > 3.4028234663852886e38) {
      EXPECT_TRUE(std::isinf(g) && (g > 0) == (e > 0)) << "x=" << xs[i] << " got " << g;
      continue;
    }
    const double err = std::fabs(g - e) / std::max(std::fabs(e), floor);
    worst = std::max(worst, err);
  }
  return worst;
}

/// A grid and as many random points over [lo, hi], plus the special values inside it; the count
/// is odd, so the shim's tail path runs too.
std::vector<float> test_points(float lo, float hi, int n) {
  std::vector<float> xs;
  for (int i = 0; i < n; ++i) xs.push_back(lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n - 1));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int i = 0; i < n; ++i) xs.push_back(d(rng));
  const float specials[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-8f, 0.625f, -0.625f, 0.6249999f, 88.7f, -87.4f, -103.0f};
  for (float s : specials) {
    if (s >= lo && s <= hi) xs.push_back(s);
  }
  if (xs.size() % 2 == 0) xs.push_back(0.5f);
  return xs;
}

TEST(VecMath, ExpRelativeError) {
  // Normal results: relative error against double exp.
  const double e = max_rel_error(test::VecFn::Exp, [](double x) { return std::exp(x); }, test_points(-87.3f, 88.7f, 200001), 0.0);
  EXPECT_LE(e, 2e-7) << "target " << cpu_target();
  std::printf("Exp max relative error at %s: %.3g\n", cpu_target().c_str(), e);
  // Overflow, underflow, denormals (absolute error below the smallest normal), NaN.
  const std::vector<float> xs = {89.0f, 1e30f, std::numeric_limits<float>::infinity(), -104.5f, -1e30f,
                                 -std::numeric_limits<float>::infinity(), -100.0f, std::nanf("")};
  const std::vector<float> out = apply(test::VecFn::Exp, xs);
  EXPECT_TRUE(std::isinf(out[0]) && std::isinf(out[1]) && std::isinf(out[2]));
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_NEAR(out[6], std::exp(-100.0), 2e-45);
  EXPECT_TRUE(std::isnan(out[7]));
}

TEST(VecMath, ExpNonPositiveRelativeError) {
  const double e = max_rel_error(test::VecFn::ExpNonpos, [](double x) { return std::exp(x); }, test_points(-87.33f, 0.0f, 200001), 0.0);
  EXPECT_LE(e, 2e-7) << "target " << cpu_target();
  std::printf("ExpNonpos max relative error at %s: %.3g\n", cpu_target().c_str(), e);
  // Below -87.33 (-inf included): exactly 0; NaN stays NaN; 0 and -0 give 1.
  const std::vector<float> xs = {-87.34f, -100.0f, -std::numeric_limits<float>::infinity(), -1e30f,
                                 std::nanf(""), 0.0f, -0.0f, -87.32f};
  const std::vector<float> out = apply(test::VecFn::ExpNonpos, xs);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_TRUE(std::isnan(out[4]));
  EXPECT_EQ(out[5], 1.0f);
  EXPECT_EQ(out[6], 1.0f);
  const double want = std::exp(static_cast<double>(xs[7]));
  EXPECT_NEAR(out[7], want, 2e-7 * want);
}

TEST(VecMath, TanhRelativeError) {
  const double e = max_rel_error(test::VecFn::Tanh, [](double x) { return std::tanh(x); }, test_points(-12.0f, 12.0f, 200001), 0.0);
  EXPECT_LE(e, 2e-7) << "target " << cpu_target();
  std::printf("Tanh max relative error at %s: %.3g\n", cpu_target().c_str(), e);
  const std::vector<float> xs = {100.0f, -100.0f, std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity(), std::nanf(""), 1e-20f, -1e-20f, 0.0f};
  const std::vector<float> out = apply(test::VecFn::Tanh, xs);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -1.0f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], -1.0f);
  EXPECT_TRUE(std::isnan(out[4]));
  EXPECT_EQ(out[5], 1e-20f);
  EXPECT_EQ(out[6], -1e-20f);
  EXPECT_EQ(out[7], 0.0f);
}

TEST(VecMath, ErfcRelativeError) {
  // Relative error over the whole normal range of erfc (erfc(9.1) ~ 1e-37), the tail included.
  const double e = max_rel_error(test::VecFn::Erfc, [](double x) { return std::erfc(x); }, test_points(0.0f, 9.1f, 200001), 0.0);
  EXPECT_LE(e, 5e-7) << "target " << cpu_target();
  std::printf("Erfc max relative error at %s: %.3g\n", cpu_target().c_str(), e);
  const std::vector<float> xs = {std::numeric_limits<float>::infinity(), std::nanf(""), 10.5f, 0.0f, 1e-30f, 30.0f, 5.0f, 1.0f};
  const std::vector<float> out = apply(test::VecFn::Erfc, xs);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_NEAR(out[3], 1.0f, 2e-7);
  EXPECT_NEAR(out[4], 1.0f, 2e-7);
  EXPECT_EQ(out[5], 0.0f);
}

// ------------------------------------------------------------------------------ elementwise

TEST(CpuElementwise, UnaryOpsMatchPortable) {
  std::mt19937 rng(1);
  // {2, 3, 211, 217} (274,722 elements) is large enough for cheap ops to split across the pool.
  const std::vector<std::vector<int64_t>> shapes = {{1}, {7}, {3, 5, 17}, {2, 3, 33, 35}, {70001}, {2, 3, 211, 217}};
  struct Case {
    const char* op;
    Attributes attrs;
    float lo, hi;
  };
  const std::vector<Case> cases = {
      {"aten.relu", {}, -3, 3},
      {"aten.neg", {}, -3, 3},
      {"aten.abs", {}, -3, 3},
      {"aten.sqrt", {}, 0, 9},
      {"aten.rsqrt", {}, 0.01f, 9},
      {"aten.reciprocal", {}, 0.5f, 9},
      {"aten.exp", {}, -20, 20},
      {"aten.sigmoid", {}, -20, 20},
      {"aten.tanh", {}, -6, 6},
      {"aten.silu", {}, -12, 12},
      {"aten.gelu", {}, -8, 8},
      {"aten.gelu", {{"approximate", std::string("tanh")}}, -8, 8},
      {"aten.hardswish", {}, -5, 5},
      {"aten.hardsigmoid", {}, -5, 5},
      {"aten.leaky_relu", {{"negative_slope", 0.2}}, -3, 3},
      {"aten.hardtanh", {{"min_val", -0.5}, {"max_val", 1.25}}, -3, 3},
      {"aten.clamp", {{"min", -0.25}}, -3, 3},
      {"aten.clamp", {{"max", 0.75}}, -3, 3},
      {"aten.clamp", {{"min", 1.0}, {"max", 0.5}}, -3, 3},  // min > max: all max
  };
  for (const auto& c : cases) {
    for (const auto& s : shapes) {
      // One negative element: portable's float 1 + erf / 1 + tanh cancels (1e-5 relative there);
      // the cpu kernel's tail is checked against double in GeluNegativeTailIsAccurate.
      if (std::string(c.op) == "aten.gelu" && numel_of(s) == 1) continue;
      // exp's output spans e^-20 .. e^20: relative-to-max tolerance is tight enough there.
      check(c.op, {rand_f32(rng, s, c.lo, c.hi)}, c.attrs, 1e-6);
    }
  }
}

/// Runs the cpu kernel of `op` on x (1-D) and returns the output.
std::vector<float> run_cpu(const char* op, const Attributes& given, const std::vector<float>& x) {
  const OpDef* def = OpRegistry::get().find(op);
  Attributes at = def->normalize_attributes(given).value();
  const TensorType t{DType::Float32, {static_cast<int64_t>(x.size())}};
  const TensorType* tp[] = {&t};
  KernelFn fn = KernelRegistry::get().select(op, KernelSignature{tp, tp, at}, KernelSet::Optimized);
  EXPECT_STREQ(KernelRegistry::get().set_name(fn), "cpu");
  std::vector<float> y(x.size());
  Tensor tx{DType::Float32, t.sizes, const_cast<float*>(x.data())}, ty{DType::Float32, t.sizes, y.data()};
  const Tensor* ins[] = {&tx};
  Tensor* outs[] = {&ty};
  EXPECT_TRUE(fn(KernelArgs{ins, outs, at, nullptr}).ok());
  return y;
}

TEST(CpuElementwise, GeluNegativeTailIsAccurate) {
  // Per-element relative error against double, x in [-9, 0): gelu(x) spans 1e-18 .. 0.17 there.
  std::vector<float> x;
  for (int i = 1; i <= 90000; ++i) x.push_back(-9.0f * static_cast<float>(i) / 90000.0f);
  const std::vector<float> exact = run_cpu("aten.gelu", {}, x);
  const std::vector<float> tanh_approx = run_cpu("aten.gelu", {{"approximate", std::string("tanh")}}, x);
  double worst_exact = 0, worst_tanh = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double xd = x[i];
    // The kernel rounds z = x / sqrt(2) to float first (as the portable kernel and PyTorch do).
    const double z = static_cast<float>(x[i] * static_cast<float>(0.70710678118654752440));
    const double ref = 0.5 * xd * std::erfc(-z);
    worst_exact = std::max(worst_exact, std::fabs(exact[i] - ref) / std::fabs(ref));
    const double u = 0.79788456080286535588 * (xd + 0.044715 * xd * xd * xd);
    const double ref_t = xd / (1.0 + std::exp(-2.0 * u));  // = 0.5 x (1 + tanh(u)) without cancellation
    if (ref_t < -1e-30) worst_tanh = std::max(worst_tanh, std::fabs(tanh_approx[i] - ref_t) / std::fabs(ref_t));
  }
  EXPECT_LE(worst_exact, 1e-6);
  // u is formed in float: its rounding (~|u| 6e-8) moves e^(-2u) by ~|2u| 6e-8 relative.
  EXPECT_LE(worst_tanh, 2e-5);
  std::printf("gelu tail max relative error: exact %.2e, tanh %.2e\n", worst_exact, worst_tanh);
}

TEST(CpuElementwise, UnarySpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v = {std::nanf(""), inf, -inf, 0.0f, -0.0f, 1e-30f, -1e-30f, 3.0f, -3.0f, 88.0f, -88.0f, 50.0f};
  for (const char* op : {"aten.relu", "aten.exp", "aten.sigmoid", "aten.tanh", "aten.silu", "aten.gelu",
                         "aten.hardswish", "aten.hardsigmoid", "aten.leaky_relu", "aten.hardtanh", "aten.abs"}) {
    check(op, {from_floats({12}, v)}, {}, 1e-6);
  }
  check("aten.gelu", {from_floats({12}, v)}, {{"approximate", std::string("tanh")}}, 1e-6);
  check("aten.clamp", {from_floats({12}, v)}, {{"min", -1.0}, {"max", 2.0}}, 0.0);
}

TEST(CpuElementwise, DeclinesWhatItDoesNotHandle) {
  std::mt19937 rng(2);
  Buf i{DType::Int64, {5}, std::vector<uint8_t>(40, 1)};
  check("aten.relu", {i}, {}, 0, /*expect_cpu=*/false);
  check("aten.clamp", {rand_f32(rng, {9})}, {{"min", std::nan("")}}, 0, false);
  check("aten.div", {rand_f32(rng, {33}), rand_f32(rng, {33})}, {{"rounding_mode", std::string("floor")}}, 0, false);
  // A short innermost broadcast run ([4, 3] row against [5, 4, 3]) stays portable.
  check("aten.add", {rand_f32(rng, {5, 4, 3}), rand_f32(rng, {1, 3})}, {}, 0, false);
}

TEST(CpuElementwise, BinaryOpsMatchPortable) {
  std::mt19937 rng(3);
  // (a, b): same shape, scalar either side, per-channel, [N,C,H,W] op [C,1,1], both broadcasting.
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{37}, {37}},
      {{2, 3, 31, 29}, {2, 3, 31, 29}},
      {{300, 301}, {300, 301}},
      {{600, 501}, {600, 501}},  // split across the pool
      {{2, 64, 57, 57}, {2, 64, 1, 1}},
      {{5, 7, 19}, {}},
      {{}, {5, 7, 19}},
      {{1}, {1000}},
      {{2, 24, 7, 7}, {2, 24, 1, 1}},
      {{2, 24, 1, 1}, {2, 24, 7, 7}},
      {{1, 96, 56, 57}, {1, 96, 1, 1}},
      {{3, 16, 9, 9}, {16, 1, 1}},
      {{17, 1}, {1, 40}},
      {{4, 1, 33}, {4, 5, 33}},
      {{6, 70}, {70}},
  };
  const std::vector<std::pair<const char*, Attributes>> ops = {
      {"aten.add", {}}, {"aten.add", {{"alpha", 10.0}}}, {"aten.sub", {}}, {"aten.sub", {{"alpha", -0.3}}},
      {"aten.mul", {}}, {"aten.div", {}}};
  for (const auto& [op, attrs] : ops) {
    for (const auto& [sa, sb] : shapes) {
      Buf b = rand_f32(rng, sb, 0.5f, 3.0f);  // away from 0 for div
      check(op, {rand_f32(rng, sa), b}, attrs, 1e-6);
    }
  }
}

// ------------------------------------------------------------------------------ softmax

TEST(CpuSoftmax, MatchesPortableAnyDim) {
  std::mt19937 rng(4);
  const std::vector<std::vector<int64_t>> shapes = {{1}, {13}, {3, 1000}, {5, 7, 3}, {2, 9, 11, 6}, {4, 2049}, {2, 5000, 3}, {64, 1000}};
  for (const char* op : {"aten._softmax", "aten._log_softmax"}) {
    for (const auto& s : shapes) {
      for (int64_t d = -static_cast<int64_t>(s.size()); d < static_cast<int64_t>(s.size()); ++d) {
        check(op, {rand_f32(rng, s, -10, 10)}, {{"dim", d}, {"half_to_float", false}}, 1e-5);
      }
    }
  }
}

TEST(CpuSoftmax, SpecialRows) {
  const float inf = std::numeric_limits<float>::infinity();
  // Row 0 all -inf (NaN), row 1 has a NaN, row 2 partly -inf, row 3 has +inf.
  const std::vector<float> v = {-inf, -inf, -inf, -inf, 1, std::nanf(""), 2, 3, -inf, 0, 1, -inf, inf, 1, 2, 3};
  for (const char* op : {"aten._softmax", "aten._log_softmax"}) {
    check(op, {from_floats({4, 4}, v)}, {{"dim", 1}}, 1e-6);
    check(op, {from_floats({4, 4}, v)}, {{"dim", 0}}, 1e-6);
  }
}

// ------------------------------------------------------------------------------ norms

TEST(CpuNorm, LayerNormMatchesPortable) {
  std::mt19937 rng(5);
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{3, 7}, {7}}, {{2, 77, 768}, {768}}, {{4, 5, 6}, {5, 6}}, {{1, 3}, {3}}, {{9, 4099}, {4099}}, {{2, 1}, {1}}};
  for (const auto& [shape, ns] : cases) {
    for (int affine = 0; affine < 4; ++affine) {
      std::optional<Buf> w, b;
      if (affine & 1) w = rand_f32(rng, ns);
      if (affine & 2) b = rand_f32(rng, ns);
      // Offset inputs (mean 50, spread 2) test the two-pass variance.
      check("aten.native_layer_norm", {rand_f32(rng, shape, 48, 52), w, b}, {{"normalized_shape", ns}, {"eps", 1e-5}}, 1e-5);
      check("aten.native_layer_norm", {rand_f32(rng, shape), w, b}, {{"normalized_shape", ns}, {"eps", 0.1}}, 1e-5);
      // Ill-conditioned: mean 1e-3, spread 1e-6 (|mean| / std ~ 1e3), eps below the variance.
      check("aten.native_layer_norm", {rand_f32(rng, shape, 1e-3f - 2e-6f, 1e-3f + 2e-6f), w, b},
            {{"normalized_shape", ns}, {"eps", 1e-15}}, 1e-5);
    }
  }
}

TEST(CpuNorm, GroupNormMatchesPortable) {
  std::mt19937 rng(6);
  struct Case { std::vector<int64_t> shape; int64_t groups; };
  const std::vector<Case> cases = {{{2, 6, 5, 7}, 3}, {{1, 32, 9, 9}, 32}, {{2, 64, 33, 17}, 8}, {{3, 4, 10}, 1},
                                   {{1, 320, 16, 16}, 32}, {{1, 320, 32, 32}, 32}, {{2, 5}, 5}, {{1, 8, 3, 3, 3}, 2}};
  for (const auto& c : cases) {
    const int64_t n = c.shape[0], ch = c.shape[1];
    int64_t hxw = 1;
    for (size_t d = 2; d < c.shape.size(); ++d) hxw *= c.shape[d];
    for (int affine = 0; affine < 4; ++affine) {
      std::optional<Buf> w, b;
      if (affine & 1) w = rand_f32(rng, {ch});
      if (affine & 2) b = rand_f32(rng, {ch});
      check("aten.native_group_norm", {rand_f32(rng, c.shape, -1, 3), w, b},
            {{"N", n}, {"C", ch}, {"HxW", hxw}, {"group", c.groups}, {"eps", 1e-6}}, 1e-5);
      check("aten.native_group_norm", {rand_f32(rng, c.shape, 100.0f - 1e-3f, 100.0f + 1e-3f), w, b},
            {{"N", n}, {"C", ch}, {"HxW", hxw}, {"group", c.groups}, {"eps", 1e-15}}, 1e-5);
    }
  }
}

TEST(CpuNorm, BatchNormMatchesPortable) {
  std::mt19937 rng(7);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{2, 3, 23, 23}, {3, 5}, {1, 16, 7, 9}, {2, 3, 4, 5, 6}, {4, 64, 33, 33}}) {
    const int64_t c = shape[1];
    for (int affine = 0; affine < 4; ++affine) {
      std::optional<Buf> w, b;
      if (affine & 1) w = rand_f32(rng, {c});
      if (affine & 2) b = rand_f32(rng, {c});
      check("aten.native_batch_norm", {rand_f32(rng, shape, -3, 5), w, b, rand_f32(rng, {c}), rand_f32(rng, {c}, 0.05f, 3)},
            {{"training", false}, {"eps", 1e-3}}, 1e-5);
    }
  }
}

TEST(CpuNorm, RmsNormMatchesPortable) {
  std::mt19937 rng(8);
  for (const auto& [shape, ns] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{3, 7}, {7}}, {{2, 77, 768}, {768}}, {{4, 5, 6}, {5, 6}}, {{5, 3001}, {3001}}}) {
    for (bool weighted : {false, true}) {
      std::optional<Buf> w;
      if (weighted) w = rand_f32(rng, ns);
      check("aten.rms_norm", {rand_f32(rng, shape), w}, {{"normalized_shape", ns}}, 1e-5);
      check("aten.rms_norm", {rand_f32(rng, shape), w}, {{"normalized_shape", ns}, {"eps", 0.5}}, 1e-5);
    }
  }
}

// ------------------------------------------------------------------------------ attention

/// One attention call: q/k/v shapes, then options set by the chainable setters.
struct SdpaCase {
  std::vector<int64_t> q, k, v;
  std::optional<std::vector<int64_t>> mask = std::nullopt;
  bool bool_mask = false;
  bool causal = false;
  std::optional<double> scale = std::nullopt;
  bool gqa = false;
  SdpaCase(std::vector<int64_t> q_, std::vector<int64_t> k_, std::vector<int64_t> v_)
      : q(std::move(q_)), k(std::move(k_)), v(std::move(v_)) {}
  SdpaCase& with_mask(std::vector<int64_t> m, bool is_bool) { mask = std::move(m); bool_mask = is_bool; return *this; }
  SdpaCase& with_causal() { causal = true; return *this; }
  SdpaCase& with_scale(double s) { scale = s; return *this; }
  SdpaCase& with_gqa() { gqa = true; return *this; }
};

void check_sdpa(std::mt19937& rng, const SdpaCase& c, double p_true = 0.7) {
  std::optional<Buf> mask;
  if (c.mask) mask = c.bool_mask ? rand_bool(rng, *c.mask, p_true) : rand_f32(rng, *c.mask, -3, 1);
  Attributes at{{"is_causal", c.causal}, {"enable_gqa", c.gqa}};
  if (c.scale) at.set("scale", *c.scale);
  check("aten.scaled_dot_product_attention", {rand_f32(rng, c.q), rand_f32(rng, c.k), rand_f32(rng, c.v), mask}, at, 1e-5);
}

TEST(CpuAttention, ShapesAndOptions) {
  std::mt19937 rng(9);
  using C = SdpaCase;
  const std::vector<SdpaCase> cases = {
      C({1, 2, 5, 8}, {1, 2, 5, 8}, {1, 2, 5, 8}),
      C({2, 3, 77, 64}, {2, 3, 77, 64}, {2, 3, 77, 64}),
      C({1, 2, 100, 13}, {1, 2, 300, 13}, {1, 2, 300, 7}),  // L != S, odd head dims, E != Ev
      C({1, 1, 130, 33}, {1, 1, 61, 33}, {1, 1, 61, 40}),    // L > S
      C({2, 4, 70, 16}, {2, 4, 70, 16}, {2, 4, 70, 16}).with_causal(),
      C({1, 2, 200, 24}, {1, 2, 150, 24}, {1, 2, 150, 24}).with_causal(),  // causal, L > S
      C({1, 2, 90, 24}, {1, 2, 300, 24}, {1, 2, 300, 24}).with_causal(),   // causal, L < S
      C({1, 3, 40, 20}, {1, 3, 50, 20}, {1, 3, 50, 20}).with_scale(0.37),
      C({3, 9, 16}, {3, 11, 16}, {3, 11, 16}),           // rank 3
      C({2, 1, 33, 8}, {1, 4, 29, 8}, {2, 4, 29, 8}),    // broadcast batch dims
      C({1, 8, 45, 16}, {1, 2, 45, 16}, {1, 2, 45, 16}).with_gqa(),
      C({2, 6, 37, 12}, {2, 3, 41, 12}, {2, 1, 41, 12}).with_gqa().with_causal(),
      // masks: full, per-head broadcast, [L, S], row [S], column [.., L, 1], 0-d; bool and float
      C({2, 3, 45, 16}, {2, 3, 57, 16}, {2, 3, 57, 16}).with_mask({2, 3, 45, 57}, false),
      C({2, 3, 45, 16}, {2, 3, 57, 16}, {2, 3, 57, 16}).with_mask({2, 3, 45, 57}, true),
      C({2, 3, 45, 16}, {2, 3, 57, 16}, {2, 3, 57, 16}).with_mask({2, 1, 45, 57}, true),
      C({2, 3, 45, 16}, {2, 3, 57, 16}, {2, 3, 57, 16}).with_mask({45, 57}, false),
      C({2, 3, 45, 16}, {2, 3, 57, 16}, {2, 3, 57, 16}).with_mask({57}, true),
      C({2, 3, 45, 16}, {2, 3, 57, 16}, {2, 3, 57, 16}).with_mask({1, 3, 45, 1}, false),
      C({2, 3, 45, 16}, {2, 3, 57, 16}, {2, 3, 57, 16}).with_mask({}, false),
      C({1, 2, 150, 40}, {1, 2, 333, 40}, {1, 2, 333, 24}).with_mask({1, 1, 150, 333}, true),
  };
  for (const auto& c : cases) check_sdpa(rng, c);
}

TEST(CpuAttention, LongSequenceTiling) {
  std::mt19937 rng(10);
  check_sdpa(rng, SdpaCase({1, 2, 1024, 64}, {1, 2, 1024, 64}, {1, 2, 1024, 64}));
  check_sdpa(rng, SdpaCase({1, 2, 1024, 64}, {1, 2, 1024, 64}, {1, 2, 1024, 64}).with_causal());
  check_sdpa(rng, SdpaCase({1, 1, 257, 80}, {1, 1, 1031, 80}, {1, 1, 1031, 80}).with_mask({257, 1031}, true), 0.3);
}

TEST(CpuAttention, FullyMaskedRowsGiveZero) {
  std::mt19937 rng(11);
  const int64_t L = 70, S = 150;
  Buf mask = rand_bool(rng, {L, S}, 0.5);
  for (int64_t i : {0, 5, 63, 64, 69}) std::fill(mask.bytes.begin() + i * S, mask.bytes.begin() + (i + 1) * S, 0);
  Buf fmask = rand_f32(rng, {L, S});
  float* fm = reinterpret_cast<float*>(fmask.bytes.data());
  for (int64_t i : {1, 64}) std::fill(fm + i * S, fm + (i + 1) * S, -std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < S; j += 2) fm[2 * S + j] = -std::numeric_limits<float>::infinity();  // half of row 2
  const Attributes at{{"is_causal", false}};
  check("aten.scaled_dot_product_attention",
        {rand_f32(rng, {1, 2, L, 16}), rand_f32(rng, {1, 2, S, 16}), rand_f32(rng, {1, 2, S, 16}), mask}, at, 1e-5);
  check("aten.scaled_dot_product_attention",
        {rand_f32(rng, {1, 2, L, 16}), rand_f32(rng, {1, 2, S, 16}), rand_f32(rng, {1, 2, S, 16}), fmask}, at, 1e-5);
  // And the zeros are really zeros (not only close to the portable kernel).
  const OpDef* def = OpRegistry::get().find("aten.scaled_dot_product_attention");
  auto attrs = def->normalize_attributes(at);
  ASSERT_TRUE(attrs.ok());
  Buf q = rand_f32(rng, {1, 1, L, 16}), k = rand_f32(rng, {1, 1, S, 16}), v = rand_f32(rng, {1, 1, S, 16});
  std::vector<TensorType> types{q.type(), k.type(), v.type(), mask.type()};
  const TensorType* tp[] = {&types[0], &types[1], &types[2], &types[3]};
  const TensorType ot{DType::Float32, {1, 1, L, 16}};
  const TensorType* op[] = {&ot};
  KernelFn fn = KernelRegistry::get().select("aten.scaled_dot_product_attention", KernelSignature{tp, op, *attrs},
                                             KernelSet::Optimized);
  ASSERT_STREQ(KernelRegistry::get().set_name(fn), "cpu");
  Tensor tq = q.view(), tk = k.view(), tv = v.view(), tm = mask.view();
  const Tensor* ins[] = {&tq, &tk, &tv, &tm};
  std::vector<float> out(static_cast<size_t>(L * 16), 5.0f);
  Tensor to{DType::Float32, ot.sizes, out.data()};
  Tensor* outs[] = {&to};
  ASSERT_TRUE(fn(KernelArgs{ins, outs, *attrs, &pool2()}).ok());
  for (int64_t e = 0; e < 16; ++e) {
    EXPECT_EQ(out[static_cast<size_t>(64 * 16 + e)], 0.0f);
    EXPECT_EQ(out[static_cast<size_t>(0 * 16 + e)], 0.0f);
  }
}

TEST(CpuPool, GlobalAveragePoolMatchesPortable) {
  std::mt19937 rng(11);
  // (shape): odd plane sizes (tails of the 32- and 8-float loops), 1x1 planes, 3-D input, many planes.
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 72, 56, 56}, {2, 3, 7, 7}, {1, 5, 1, 1}, {3, 1, 33, 9}, {4, 13, 17}, {1, 960, 7, 7}, {1, 2, 1, 31}};
  for (const auto& shape : shapes) {
    check("aten.adaptive_avg_pool2d", {rand_f32(rng, shape)}, {{"output_size", std::vector<int64_t>{1, 1}}}, 1e-6);
    check("aten.adaptive_avg_pool2d", {rand_f32(rng, shape, 99, 101)}, {{"output_size", std::vector<int64_t>{1, 1}}},
          1e-6);
  }
  // Other output sizes stay portable.
  check("aten.adaptive_avg_pool2d", {rand_f32(rng, {1, 4, 9, 9})}, {{"output_size", std::vector<int64_t>{2, 3}}}, 0,
        /*expect_cpu=*/false);
}

}  // namespace
}  // namespace kiln

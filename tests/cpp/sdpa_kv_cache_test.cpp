// kiln.sdpa_kv_cache (src/ir/ops/llm.cpp): the portable kernel (src/kernels/portable/llm.cpp) and
// the cpu kernel (src/kernels/cpu/attention.cpp) against a float64 reference written from the op's
// definition, for prefill, decode, chunks at p > 0, GQA / MHA, sliding windows, Dv != D, with no
// pool and with 1- and 2-thread pools; the run-time position check (output untouched); inference
// errors. Cache positions that no query row may see are filled with NaN, so reading one shows.
// Also aten.index_put run in place (output = self's bytes, as the planner does for a KV-cache
// update), where a bad index must leave the buffer unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ir/op_registry.h"
#include "kernels/kernel.h"
#include "kiln/thread_pool.h"

namespace kiln {
namespace {

constexpr const char* kOp = "kiln.sdpa_kv_cache";
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Case {
  const char* name;
  int64_t B, Hq, Hkv, S, T, D, Dv, p;
  int64_t window = 0;
  std::optional<double> scale = std::nullopt;
};

struct Inputs {
  std::vector<float> q, k, v;
  int64_t pos = 0;
};

/// Random query and caches; cache positions outside [lo(0), p + T) (never visible to the call) are NaN.
Inputs make_inputs(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  Inputs in;
  in.q.resize(static_cast<size_t>(c.B * c.Hq * c.T * c.D));
  in.k.resize(static_cast<size_t>(c.B * c.Hkv * c.S * c.D));
  in.v.resize(static_cast<size_t>(c.B * c.Hkv * c.S * c.Dv));
  for (float& x : in.q) x = d(rng);
  const int64_t lo0 = c.window > 0 ? std::max<int64_t>(0, c.p - c.window + 1) : 0;
  auto fill = [&](std::vector<float>& cache, int64_t width) {
    for (size_t i = 0; i < cache.size(); ++i) {
      const int64_t j = static_cast<int64_t>(i) / width % c.S;
      cache[i] = j >= lo0 && j < c.p + c.T ? d(rng) : kNaN;
    }
  };
  fill(in.k, c.D);
  fill(in.v, c.Dv);
  in.pos = c.p;
  return in;
}

/// The definition, in double: row t of head h (position p + t) attends keys [lo, p + t] of kv head
/// h / (Hq / Hkv), lo = max(0, p + t - window + 1) with a window.
std::vector<double> reference(const Case& c, const Inputs& in) {
  std::vector<double> out(static_cast<size_t>(c.B * c.Hq * c.T * c.Dv));
  const double scale = c.scale ? *c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t kvh = h / (c.Hq / c.Hkv);
      for (int64_t t = 0; t < c.T; ++t) {
        const int64_t hi = c.p + t, lo = c.window > 0 ? std::max<int64_t>(0, hi - c.window + 1) : 0;
        const float* qr = &in.q[static_cast<size_t>(((b * c.Hq + h) * c.T + t) * c.D)];
        std::vector<double> s;
        double mx = -INFINITY;
        for (int64_t j = lo; j <= hi; ++j) {
          const float* kr = &in.k[static_cast<size_t>(((b * c.Hkv + kvh) * c.S + j) * c.D)];
          double dot = 0.0;
          for (int64_t e = 0; e < c.D; ++e) dot += static_cast<double>(qr[e]) * kr[e];
          s.push_back(scale * dot);
          mx = std::max(mx, s.back());
        }
        double sum = 0.0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t e = 0; e < c.Dv; ++e) {
          double acc = 0.0;
          for (int64_t j = lo; j <= hi; ++j) {
            acc += s[static_cast<size_t>(j - lo)] * in.v[static_cast<size_t>(((b * c.Hkv + kvh) * c.S + j) * c.Dv + e)];
          }
          out[static_cast<size_t>(((b * c.Hq + h) * c.T + t) * c.Dv + e)] = acc / sum;
        }
      }
    }
  }
  return out;
}

Attributes attrs_of(const Case& c) {
  Attributes given;
  if (c.scale) given.set("scale", *c.scale);
  if (c.window > 0) given.set("sliding_window", c.window);
  return OpRegistry::get().find(kOp)->normalize_attributes(given).value();
}

/// Runs `fn` on the inputs (the output starts as `fill`); returns the kernel's error.
Error run(KernelFn fn, const Case& c, Inputs& in, const Attributes& at, ThreadPool* pool, std::vector<float>& out,
          float fill = -77.0f) {
  Tensor q{DType::Float32, {c.B, c.Hq, c.T, c.D}, in.q.data()};
  Tensor k{DType::Float32, {c.B, c.Hkv, c.S, c.D}, in.k.data()};
  Tensor v{DType::Float32, {c.B, c.Hkv, c.S, c.Dv}, in.v.data()};
  Tensor pos{DType::Int64, {1}, &in.pos};
  out.assign(static_cast<size_t>(c.B * c.Hq * c.T * c.Dv), fill);
  Tensor o{DType::Float32, {c.B, c.Hq, c.T, c.Dv}, out.data()};
  const Tensor* ins[] = {&q, &k, &v, &pos};
  Tensor* outs[] = {&o};
  return fn(KernelArgs{ins, outs, at, pool});
}

/// The cpu kernel select() picks for the call's types (it runs at every cpu target).
KernelFn select_cpu(const Case& c, const Attributes& at) {
  const TensorType q{DType::Float32, {c.B, c.Hq, c.T, c.D}}, k{DType::Float32, {c.B, c.Hkv, c.S, c.D}},
      v{DType::Float32, {c.B, c.Hkv, c.S, c.Dv}}, pos{DType::Int64, {1}};
  const TensorType* ins[] = {&q, &k, &v, &pos};
  auto out = OpRegistry::get().find(kOp)->infer_types(ins, at);
  EXPECT_TRUE(out.ok()) << out.error().message();
  if (!out.ok()) return nullptr;
  EXPECT_EQ((*out)[0].sizes, (std::vector<int64_t>{c.B, c.Hq, c.T, c.Dv}));
  const TensorType* outs[] = {&(*out)[0]};
  const KernelRegistry& reg = KernelRegistry::get();
  KernelFn fn = reg.select(kOp, KernelSignature{ins, outs, at}, KernelSet::Optimized);
  EXPECT_STREQ(reg.set_name(fn), "cpu");
  EXPECT_EQ(reg.prepare_of(fn), nullptr);  // nothing size-dependent is prepared at load
  return fn;
}

ThreadPool& pool(int n) {
  static ThreadPool p1(1), p2(2);
  return n == 1 ? p1 : p2;
}

/// max |got - want| / max |want|.
double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0.0, mag = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    mag = std::max(mag, std::fabs(want[i]));
    const double d = std::fabs(got[i] - want[i]);
    err = std::isnan(d) ? INFINITY : std::max(err, d);
  }
  return err / mag;
}

const Case kCases[] = {
    {"prefill", 1, 4, 4, 40, 13, 16, 16, 0},
    {"prefill_long_gqa", 1, 8, 2, 300, 150, 32, 32, 0},           // > kBlockQ rows of one head
    {"decode", 1, 4, 4, 64, 1, 16, 16, 37},
    {"decode_gqa", 2, 8, 2, 300, 1, 64, 64, 260},                 // several key blocks
    {"chunk_at_p", 1, 4, 4, 64, 5, 8, 8, 20},
    {"chunk_gqa", 2, 8, 2, 96, 7, 24, 24, 40},
    {"mha_batched", 3, 3, 3, 20, 4, 5, 5, 9},
    {"mqa", 1, 6, 1, 50, 3, 12, 12, 30},
    {"window_prefill", 1, 4, 2, 64, 30, 16, 16, 0, 8},
    {"window_chunk", 1, 8, 2, 300, 6, 16, 16, 200, 16},          // window shorter than p + T
    {"window_decode", 1, 8, 2, 300, 1, 16, 16, 280, 100},
    {"window_wide", 1, 2, 1, 64, 10, 8, 8, 5, 1000},               // window longer than the cache
    {"dv_ne_d", 1, 4, 2, 48, 3, 20, 11, 17},
    {"dv_ne_d_prefill", 2, 2, 1, 48, 19, 7, 12, 0, 0, 0.3},
    {"full_cache", 1, 4, 2, 32, 4, 16, 16, 28},                    // p + T == S
    {"one_row_cache", 1, 2, 2, 1, 1, 4, 4, 0},
    {"explicit_scale", 1, 4, 4, 40, 2, 16, 16, 10, 0, 0.05},
    {"negative_scale", 1, 4, 4, 40, 2, 16, 16, 10, 0, -0.7},
};

TEST(SdpaKvCache, KernelsMatchReference) {
  const KernelFn portable = KernelRegistry::get().find(kOp);
  ASSERT_NE(portable, nullptr);
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    Inputs in = make_inputs(c, seed++);
    const std::vector<double> want = reference(c, in);
    const Attributes at = attrs_of(c);
    const KernelFn cpu_fn = select_cpu(c, at);
    ASSERT_NE(cpu_fn, nullptr);
    for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool(1), &pool(2)}) {
      SCOPED_TRACE(tp ? std::to_string(tp->num_threads()) + " threads" : "no pool");
      std::vector<float> got;
      ASSERT_TRUE(run(portable, c, in, at, tp, got).ok());
      EXPECT_LE(rel_err(got, want), 1e-6) << "portable";
      const Error err = run(cpu_fn, c, in, at, tp, got);
      ASSERT_TRUE(err.ok()) << err.message();
      EXPECT_LE(rel_err(got, want), 2e-5) << "cpu";
    }
  }
}

// The kernel is selected for the types seen at load (T at its bound) and then called with fewer
// query rows: it reads every size from the call's tensors.
TEST(SdpaKvCache, SmallerTThanAtLoad) {
  const Case at_load{"load", 1, 8, 2, 64, 16, 16, 16, 0};
  const Attributes at = attrs_of(at_load);
  const KernelFn cpu_fn = select_cpu(at_load, at);
  ASSERT_NE(cpu_fn, nullptr);
  for (const Case& c : {Case{"T=1", 1, 8, 2, 64, 1, 16, 16, 40}, Case{"T=3", 1, 8, 2, 64, 3, 16, 16, 61}}) {
    SCOPED_TRACE(c.name);
    Inputs in = make_inputs(c, 99);
    std::vector<float> got;
    ASSERT_TRUE(run(cpu_fn, c, in, at, &pool(2), got).ok());
    EXPECT_LE(rel_err(got, reference(c, in)), 2e-5);
  }
}

TEST(SdpaKvCache, PositionOutOfRangeLeavesOutputUntouched) {
  const KernelRegistry& reg = KernelRegistry::get();
  struct Bad {
    int64_t T, p;
  };
  for (const Bad bad : {Bad{4, 29}, Bad{1, 32}, Bad{1, -1}, Bad{3, std::numeric_limits<int64_t>::max()}}) {
    const Case c{"bad", 1, 4, 2, 32, bad.T, 8, 8, 0};
    SCOPED_TRACE("T=" + std::to_string(bad.T) + " p=" + std::to_string(bad.p));
    Inputs in = make_inputs(c, 5);
    in.pos = bad.p;
    const Attributes at = attrs_of(c);
    for (KernelFn fn : {reg.find(kOp), select_cpu(c, at)}) {
      std::vector<float> out;
      const Error err = run(fn, c, in, at, &pool(2), out, 42.0f);
      ASSERT_FALSE(err.ok());
      EXPECT_EQ(err.code(), ErrorCode::InvalidArgument);
      const std::string msg = err.message();
      EXPECT_NE(msg.find("kiln.sdpa_kv_cache"), std::string::npos) << msg;
      EXPECT_NE(msg.find("p=" + std::to_string(bad.p)), std::string::npos) << msg;
      EXPECT_NE(msg.find("T=" + std::to_string(bad.T)), std::string::npos) << msg;
      EXPECT_NE(msg.find("S=32"), std::string::npos) << msg;
      for (float x : out) ASSERT_EQ(x, 42.0f);
    }
  }
}

TEST(SdpaKvCache, InferenceChecks) {
  const OpDef* def = OpRegistry::get().find(kOp);
  ASSERT_NE(def, nullptr);
  auto infer = [&](const std::vector<TensorType>& t, Attributes given = {}) {
    std::vector<const TensorType*> p;
    for (const auto& x : t) p.push_back(&x);
    auto at = def->normalize_attributes(given);
    if (!at.ok()) return Result<std::vector<TensorType>>(at.error());
    return def->infer_types(p, *at);
  };
  const DType f = DType::Float32;
  const TensorType pos{DType::Int64, {1}};
  auto ok = infer({{f, {2, 8, 3, 16}}, {f, {2, 2, 10, 16}}, {f, {2, 2, 10, 24}}, pos});
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_EQ((*ok)[0].sizes, (std::vector<int64_t>{2, 8, 3, 24}));
  EXPECT_EQ((*ok)[0].dtype, f);
  const std::vector<std::pair<const char*, std::vector<TensorType>>> bad = {
      {"rank 4", {{f, {8, 3, 16}}, {f, {2, 2, 10, 16}}, {f, {2, 2, 10, 16}}, pos}},
      {"batch", {{f, {1, 8, 3, 16}}, {f, {2, 2, 10, 16}}, {f, {2, 2, 10, 16}}, pos}},
      {"divide", {{f, {2, 6, 3, 16}}, {f, {2, 4, 10, 16}}, {f, {2, 4, 10, 16}}, pos}},
      {"head dim", {{f, {2, 8, 3, 16}}, {f, {2, 2, 10, 8}}, {f, {2, 2, 10, 16}}, pos}},
      {"length", {{f, {2, 8, 3, 16}}, {f, {2, 2, 10, 16}}, {f, {2, 2, 9, 16}}, pos}},
      {"T=11", {{f, {2, 8, 11, 16}}, {f, {2, 2, 10, 16}}, {f, {2, 2, 10, 16}}, pos}},
      {"int64", {{f, {2, 8, 3, 16}}, {f, {2, 2, 10, 16}}, {f, {2, 2, 10, 16}}, {DType::Int32, {1}}}},
      {"one element", {{f, {2, 8, 3, 16}}, {f, {2, 2, 10, 16}}, {f, {2, 2, 10, 16}}, {DType::Int64, {2}}}},
      {"heads", {{f, {2, 8, 3, 16}}, {f, {2, 0, 10, 16}}, {f, {2, 0, 10, 16}}, pos}},
  };
  for (const auto& [what, types] : bad) {
    auto r = infer(types);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument) << what << ": " << r.error().message();
    EXPECT_NE(r.error().message().find("kiln.sdpa_kv_cache"), std::string::npos) << r.error().message();
  }
  auto f16 = infer({{DType::Float16, {2, 8, 3, 16}}, {f, {2, 2, 10, 16}}, {f, {2, 2, 10, 16}}, pos});
  ASSERT_FALSE(f16.ok());
  EXPECT_EQ(f16.error().code(), ErrorCode::NotSupported);
  auto neg = infer({{f, {2, 8, 3, 16}}, {f, {2, 2, 10, 16}}, {f, {2, 2, 10, 16}}, pos}, {{"sliding_window", int64_t{-1}}});
  ASSERT_FALSE(neg.ok());
  // Schema: scale is a nullable float (None = 1/sqrt(D)), sliding_window an int (0 = none).
  ASSERT_EQ(def->inputs.size(), 4u);
  EXPECT_EQ(def->inputs[3].name, "input_pos");
  ASSERT_EQ(def->attrs.size(), 2u);
  EXPECT_EQ(def->attrs[0].name, "scale");
  EXPECT_TRUE(def->attrs[0].nullable);
  EXPECT_EQ(def->attrs[1].name, "sliding_window");
}

// aten.index_put with out == self (the planner's in-place state update, e.g. cache[:, :, pos] = k).
TEST(IndexPutInPlace, WritesIntoSelfAndBadIndexChangesNothing) {
  const KernelFn fn = KernelRegistry::get().find("aten.index_put");
  ASSERT_NE(fn, nullptr);
  const OpDef* def = OpRegistry::get().find("aten.index_put");
  const Attributes at = def->normalize_attributes({{"dims", std::vector<int64_t>{2}}}).value();
  const int64_t H = 2, S = 6, D = 3, T = 2;
  std::vector<float> cache(static_cast<size_t>(H * S * D));
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = static_cast<float>(i);
  std::vector<float> vals(static_cast<size_t>(H * T * D));
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = -1.0f - static_cast<float>(i);
  std::vector<int64_t> idx{3, 4};
  Tensor self{DType::Float32, {1, H, S, D}, cache.data()};
  Tensor values{DType::Float32, {1, H, T, D}, vals.data()};
  Tensor index{DType::Int64, {T}, idx.data()};
  Tensor out{DType::Float32, {1, H, S, D}, cache.data()};  // same bytes as self
  const Tensor* ins[] = {&self, &values, &index};
  Tensor* outs[] = {&out};
  const std::vector<float> before = cache;
  ASSERT_TRUE(fn(KernelArgs{ins, outs, at, nullptr}).ok());
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t e = 0; e < D; ++e) {
        const size_t i = static_cast<size_t>((h * S + s) * D + e);
        const float want = s == 3 || s == 4 ? vals[static_cast<size_t>((h * T + (s - 3)) * D + e)] : before[i];
        ASSERT_EQ(cache[i], want) << "h=" << h << " s=" << s << " e=" << e;
      }
    }
  }
  // A bad index after a good one: InvalidArgument, nothing written (row 1 keeps its values).
  const std::vector<float> after_first = cache;
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{1, 6}, std::vector<int64_t>{1, -7}}) {
    idx = bad;
    const Error err = fn(KernelArgs{ins, outs, at, nullptr});
    ASSERT_FALSE(err.ok());
    EXPECT_EQ(err.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(err.message().find("aten.index_put"), std::string::npos) << err.message();
    EXPECT_EQ(cache, after_first);
  }
  // Accumulate in place: duplicates all add.
  const Attributes acc = def->normalize_attributes({{"dims", std::vector<int64_t>{2}}, {"accumulate", true}}).value();
  idx = {0, 0};
  ASSERT_TRUE(fn(KernelArgs{ins, outs, acc, nullptr}).ok());
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t e = 0; e < D; ++e) {
      const size_t i = static_cast<size_t>(h * S * D + e);
      const float want = after_first[i] + vals[static_cast<size_t>((h * T) * D + e)] +
                         vals[static_cast<size_t>((h * T + 1) * D + e)];
      EXPECT_EQ(cache[i], want);
    }
  }
}

// aten.slice_scatter with out == self (slice assignment into a cache, in place).
TEST(IndexPutInPlace, SliceScatterInPlace) {
  const KernelFn fn = KernelRegistry::get().find("aten.slice_scatter");
  ASSERT_NE(fn, nullptr);
  const Attributes at = OpRegistry::get()
                            .find("aten.slice_scatter")
                            ->normalize_attributes({{"dim", int64_t{1}}, {"start", int64_t{2}}, {"end", int64_t{4}}})
                            .value();
  std::vector<float> cache(2 * 5);
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = static_cast<float>(i);
  std::vector<float> src{-1, -2, -3, -4};
  Tensor self{DType::Float32, {2, 5}, cache.data()};
  Tensor s{DType::Float32, {2, 2}, src.data()};
  Tensor out{DType::Float32, {2, 5}, cache.data()};
  const Tensor* ins[] = {&self, &s};
  Tensor* outs[] = {&out};
  ASSERT_TRUE(fn(KernelArgs{ins, outs, at, nullptr}).ok());
  EXPECT_EQ(cache, (std::vector<float>{0, 1, -1, -2, 4, 5, 6, -3, -4, 9}));
}

}  // namespace
}  // namespace kiln

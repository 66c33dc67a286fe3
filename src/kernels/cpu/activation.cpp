// Optimized cpu kernels for float32 unary elementwise ops: relu, neg, abs, sqrt, rsqrt,
// reciprocal, exp, sigmoid, tanh, silu, gelu (approximate "none" and "tanh"), hardswish,
// hardsigmoid, hardtanh, clamp, leaky_relu. AVX2 over the flat tensor, split across the pool
// for large tensors only.
//
// Formulas (and NaN behaviour) are the portable kernels' (src/kernels/portable/elementwise.cpp,
// which cites PyTorch's Activation.cpp / UnaryOpsKernel.cpp); exp, tanh and erfc come from
// cpu/vec_math.h (error bounds there). Ops built only from IEEE +, -, *, /, sqrt, min and max
// give the portable kernel's results bit for bit (relu/clamp may differ in the sign of a zero).
#include <cmath>
#include <string>

#include "kernels/cpu/post_op.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernel.h"

namespace kiln {

#if KILN_CPU_AVX2_KERNELS
namespace {

using cpu::erfc8;
using cpu::exp8;
using cpu::tanh8;

constexpr int64_t kCheapGrain = 1 << 15;   ///< elements per thread, at least: memory-bound ops
constexpr int64_t kCostlyGrain = 1 << 13;  ///< elements per thread, at least: exp/tanh/erfc ops

KILN_AVX2 inline __m256 sign_mask() { return _mm256_set1_ps(-0.0f); }

// Each op: a functor with a KILN_AVX2 operator()(__m256), constructed from the attributes, and
// kGrain. max_ps/min_ps(c, x) return x when x is NaN (the second operand), so NaN propagates.
struct Relu {
  static constexpr int64_t kGrain = kCheapGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return cpu::relu8(x); }
};
struct Neg {
  static constexpr int64_t kGrain = kCheapGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return _mm256_xor_ps(x, sign_mask()); }
};
struct Abs {
  static constexpr int64_t kGrain = kCheapGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return _mm256_andnot_ps(sign_mask(), x); }
};
struct Sqrt {
  static constexpr int64_t kGrain = kCheapGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return _mm256_sqrt_ps(x); }
};
/// 1 / sqrt(x), correctly rounded division (not the approximate rsqrt instruction).
struct Rsqrt {
  static constexpr int64_t kGrain = kCheapGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_sqrt_ps(x)); }
};
struct Reciprocal {
  static constexpr int64_t kGrain = kCheapGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return _mm256_div_ps(_mm256_set1_ps(1.0f), x); }
};
struct Exp {
  static constexpr int64_t kGrain = kCostlyGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return exp8(x); }
};
/// 1 / (1 + e^-x).
struct Sigmoid {
  static constexpr int64_t kGrain = kCostlyGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return cpu::sigmoid8(x); }
};
struct Tanh {
  static constexpr int64_t kGrain = kCostlyGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return tanh8(x); }
};
/// x / (1 + e^-x) (silu(-inf) is NaN, as in PyTorch).
struct Silu {
  static constexpr int64_t kGrain = kCostlyGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return cpu::silu8(x); }
};
/// approximate "none": x * 0.5 * (1 + erf(x / sqrt(2))), evaluated as x * 0.5 * erfc(|z|) for
/// x < 0 and x * 0.5 * (2 - erfc(z)) otherwise (z = x / sqrt(2)), so the negative tail keeps its
/// relative accuracy (1 + erf(z) would cancel);
/// "tanh": 0.5 * x * (1 + tanh(u)), u = sqrt(2 / pi) * (x + 0.044715 x^3) (PyTorch
/// Activation.cpp), evaluated as x / (1 + e^(-2u)) for the same reason.
struct Gelu {
  static constexpr int64_t kGrain = kCostlyGrain;
  bool tanh_mode;
  explicit Gelu(const Attributes& at) : tanh_mode(at.get_string("approximate", "none") == "tanh") {}
  KILN_AVX2 __m256 operator()(__m256 x) const {
    const __m256 half = _mm256_set1_ps(0.5f);
    if (tanh_mode) {
      const __m256 one = _mm256_set1_ps(1.0f);
      const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
      const __m256 inner = _mm256_mul_ps(_mm256_set1_ps(0.79788456080286535588f),
                                         _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
      // 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)): the same value without 1 + tanh cancelling.
      return _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), inner))));
    }
    const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752440f));
    const __m256 c = erfc8(_mm256_andnot_ps(sign_mask(), z));
    const __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 one_plus_erf = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.0f), c), c, neg);
    return _mm256_mul_ps(_mm256_mul_ps(x, half), one_plus_erf);
  }
};
/// x * min(max(x + 3, 0), 6) / 6.
struct Hardswish {
  static constexpr int64_t kGrain = kCheapGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return cpu::hardswish8(x); }
};
/// min(max(x + 3, 0), 6) / 6.
struct Hardsigmoid {
  static constexpr int64_t kGrain = kCheapGrain;
  KILN_AVX2 __m256 operator()(__m256 x) const { return cpu::hardsigmoid8(x); }
};
/// x > 0 ? x : x * negative_slope.
struct LeakyRelu {
  static constexpr int64_t kGrain = kCheapGrain;
  float slope;
  explicit LeakyRelu(const Attributes& at) : slope(static_cast<float>(at.get_float("negative_slope", 0.01))) {}
  KILN_AVX2 __m256 operator()(__m256 x) const {
    const __m256 pos = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ);
    return _mm256_blendv_ps(_mm256_mul_ps(x, _mm256_set1_ps(slope)), x, pos);
  }
};
/// aten.clamp (min/max nullable) and aten.hardtanh (min_val, max_val): min(max(x, lo), hi);
/// NaN x propagates; lo > hi gives hi. NaN bounds are declined by accepts() (portable handles
/// them: every output is NaN).
struct Clamp {
  static constexpr int64_t kGrain = kCheapGrain;
  bool has_lo = false, has_hi = false;
  float lo = 0, hi = 0;
  explicit Clamp(const Attributes& at) {
    if (at.has("min_val")) {
      has_lo = has_hi = true;
      lo = static_cast<float>(at.get_float("min_val", -1.0));
      hi = static_cast<float>(at.get_float("max_val", 1.0));
      return;
    }
    has_lo = !at.is_none("min");
    has_hi = !at.is_none("max");
    lo = static_cast<float>(at.get_float("min"));
    hi = static_cast<float>(at.get_float("max"));
  }
  KILN_AVX2 __m256 operator()(__m256 x) const {
    if (has_lo) x = _mm256_max_ps(_mm256_set1_ps(lo), x);
    if (has_hi) x = _mm256_min_ps(_mm256_set1_ps(hi), x);
    return x;
  }
  static bool bounds_ok(const Attributes& at) {
    const Clamp c(at);
    return !(c.has_lo && std::isnan(c.lo)) && !(c.has_hi && std::isnan(c.hi));
  }
};

template <class Op>
Op make_op(const Attributes& at) {
  if constexpr (std::is_constructible_v<Op, const Attributes&>) return Op(at);
  else return Op{};
}

/// y[i] = op(x[i]) for i < n.
template <class Op>
KILN_AVX2 void unary_range(const Op& op, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = op(_mm256_loadu_ps(x + i));
    const __m256 b = op(_mm256_loadu_ps(x + i + 8));
    _mm256_storeu_ps(y + i, a);
    _mm256_storeu_ps(y + i + 8, b);
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, op(_mm256_loadu_ps(x + i)));
  if (i < n) cpu::store_tail(y + i, n - i, op(cpu::load_tail(x + i, n - i)));
}

template <class Op>
bool unary_accepts(const KernelSignature& s) {
  if (!cpu::cpu_has_avx2_fma()) return false;
  if (s.inputs.empty() || s.inputs[0] == nullptr || s.outputs.size() != 1) return false;
  if (s.inputs[0]->dtype != DType::Float32 || s.outputs[0]->dtype != DType::Float32) return false;
  if (s.inputs[0]->numel() != s.outputs[0]->numel()) return false;
  if constexpr (std::is_same_v<Op, Clamp>) return Clamp::bounds_ok(s.attrs);
  return true;
}

template <class Op>
Error unary_kernel(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& y = *a.outputs[0];
  if (x.dtype != DType::Float32 || y.dtype != DType::Float32 || x.numel() != y.numel()) {
    return Error(ErrorCode::NotSupported, "cpu unary kernel: float32 in and out of equal size only");
  }
  const Op op = make_op<Op>(a.attrs);
  const float* px = x.data_as<const float>();
  float* py = y.data_as<float>();
  cpu::parallel_range(a.pool, y.numel(), Op::kGrain, [&](int64_t b, int64_t e) { unary_range(op, px + b, py + b, e - b); });
  return {};
}

template <class Op>
void add_unary(KernelRegistry& r, const char* name) {
  r.add_optimized(name, unary_kernel<Op>, unary_accepts<Op>);
}

}  // namespace

void register_cpu_activation(KernelRegistry& r) {
  add_unary<Relu>(r, "aten.relu");
  add_unary<Neg>(r, "aten.neg");
  add_unary<Abs>(r, "aten.abs");
  add_unary<Sqrt>(r, "aten.sqrt");
  add_unary<Rsqrt>(r, "aten.rsqrt");
  add_unary<Reciprocal>(r, "aten.reciprocal");
  add_unary<Exp>(r, "aten.exp");
  add_unary<Sigmoid>(r, "aten.sigmoid");
  add_unary<Tanh>(r, "aten.tanh");
  add_unary<Silu>(r, "aten.silu");
  add_unary<Gelu>(r, "aten.gelu");
  add_unary<Hardswish>(r, "aten.hardswish");
  add_unary<Hardsigmoid>(r, "aten.hardsigmoid");
  add_unary<LeakyRelu>(r, "aten.leaky_relu");
  add_unary<Clamp>(r, "aten.hardtanh");
  add_unary<Clamp>(r, "aten.clamp");
}

#else

void register_cpu_activation(KernelRegistry&) {}  // no AVX2 kernels on this target

#endif  // KILN_CPU_AVX2_KERNELS

}  // namespace kiln

// Optimized cpu kernels for float32 unary elementwise ops: relu, neg, abs, sqrt, rsqrt,
// reciprocal, exp, sigmoid, tanh, silu, gelu (approximate "none" and "tanh"), hardswish,
// hardsigmoid, hardtanh, clamp, leaky_relu. Written once over Highway (every SIMD target) over the flat tensor, split across the pool
// for large tensors only.
//
// Formulas (and NaN behaviour) are the portable kernels' (src/kernels/portable/elementwise.cpp,
// which cites PyTorch's Activation.cpp / UnaryOpsKernel.cpp); exp, tanh and erfc come from
// cpu/vec-inl.h (error bounds there). Ops built only from IEEE +, -, *, /, sqrt, min and max
// give the portable kernel's results bit for bit (relu/clamp may differ in the sign of a zero).
#include <cmath>
#include <string>

#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/post_op.h"
#include "kernels/kernel.h"

// Per-target part: compiled once per SIMD target (hwy/foreach_target.h re-includes this file).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/activation.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/post_op-inl.h"
#include "kernels/cpu/vec-inl.h"

#ifndef KILN_CPU_ACTIVATION_SHARED_
#define KILN_CPU_ACTIVATION_SHARED_
namespace kiln::cpu {
/// The unary ops of this file.
enum class UnaryKind { Relu, Neg, Abs, Sqrt, Rsqrt, Reciprocal, Exp, Sigmoid, Tanh, Silu, Gelu, Hardswish, Hardsigmoid, LeakyRelu, Clamp };
/// An op and its attributes, read once per call.
struct UnaryOp {
  UnaryKind kind = UnaryKind::Relu;
  bool gelu_tanh = false;            ///< Gelu: approximate == "tanh"
  float slope = 0.01f;               ///< LeakyRelu: negative_slope
  bool has_lo = false, has_hi = false;  ///< Clamp: which bounds are present
  float lo = 0, hi = 0;              ///< Clamp: the bounds
};
}  // namespace kiln::cpu
#endif

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// approximate "none": x * 0.5 * (1 + erf(x / sqrt(2))), evaluated as x * 0.5 * erfc(|z|) for
/// x < 0 and x * 0.5 * (2 - erfc(z)) otherwise (z = x / sqrt(2)), so the negative tail keeps its
/// relative accuracy (1 + erf(z) would cancel);
/// "tanh": 0.5 * x * (1 + tanh(u)), u = sqrt(2 / pi) * (x + 0.044715 x^3) (PyTorch
/// Activation.cpp), evaluated as x / (1 + e^(-2u)) for the same reason.
template <class D, class V>
HWY_INLINE V Gelu(D d, V x, bool tanh_mode) {
  if (tanh_mode) {
    const V x3 = hn::Mul(hn::Mul(x, x), x);
    const V inner = hn::Mul(hn::Set(d, 0.79788456080286535588f), hn::MulAdd(hn::Set(d, 0.044715f), x3, x));
    return hn::Div(x, hn::Add(hn::Set(d, 1.0f), Exp(d, hn::Mul(hn::Set(d, -2.0f), inner))));
  }
  const V z = hn::Mul(x, hn::Set(d, 0.70710678118654752440f));
  const V c = Erfc(d, hn::Abs(z));
  const V one_plus_erf = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), c, hn::Sub(hn::Set(d, 2.0f), c));
  return hn::Mul(hn::Mul(x, hn::Set(d, 0.5f)), one_plus_erf);
}

/// One op on one vector. Clamp/LeakyRelu: compare-and-select, so NaN x propagates; clamp with
/// lo > hi gives hi.
template <UnaryKind K, class D, class V>
HWY_INLINE V Unary(D d, const UnaryOp& op, V x) {
  if constexpr (K == UnaryKind::Relu) return Relu(d, x);
  if constexpr (K == UnaryKind::Neg) return hn::Neg(x);
  if constexpr (K == UnaryKind::Abs) return hn::Abs(x);
  if constexpr (K == UnaryKind::Sqrt) return hn::Sqrt(x);
  // 1 / sqrt(x), correctly rounded division (not the approximate rsqrt instruction).
  if constexpr (K == UnaryKind::Rsqrt) return hn::Div(hn::Set(d, 1.0f), hn::Sqrt(x));
  if constexpr (K == UnaryKind::Reciprocal) return hn::Div(hn::Set(d, 1.0f), x);
  if constexpr (K == UnaryKind::Exp) return Exp(d, x);
  if constexpr (K == UnaryKind::Sigmoid) return Sigmoid(d, x);
  if constexpr (K == UnaryKind::Tanh) return Tanh(d, x);
  if constexpr (K == UnaryKind::Silu) return Silu(d, x);
  if constexpr (K == UnaryKind::Gelu) return Gelu(d, x, op.gelu_tanh);
  if constexpr (K == UnaryKind::Hardswish) return Hardswish(d, x);
  if constexpr (K == UnaryKind::Hardsigmoid) return Hardsigmoid(d, x);
  // x > 0 ? x : x * negative_slope.
  if constexpr (K == UnaryKind::LeakyRelu) return hn::IfThenElse(hn::Gt(x, hn::Zero(d)), x, hn::Mul(x, hn::Set(d, op.slope)));
  if constexpr (K == UnaryKind::Clamp) {
    if (op.has_lo) x = MaxNaN(hn::Set(d, op.lo), x);
    if (op.has_hi) x = MinNaN(hn::Set(d, op.hi), x);
    return x;
  }
}

/// y[i] = op(x[i]) for i < n, two vectors per step.
template <UnaryKind K>
HWY_INLINE void UnaryRangeK(const UnaryOp& op, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const VF a = Unary<K>(d, op, hn::LoadU(d, x + i));
    const VF b = Unary<K>(d, op, hn::LoadU(d, x + i + N));
    hn::StoreU(a, d, y + i);
    hn::StoreU(b, d, y + i + N);
  }
  for (; i + N <= n; i += N) hn::StoreU(Unary<K>(d, op, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {
    const size_t r = static_cast<size_t>(n - i);
    StoreTail(d, Unary<K>(d, op, LoadTail(d, x + i, r)), y + i, r);
  }
}

/// y[i] = op(x[i]) for i < n (x == y allowed).
void UnaryRange(const UnaryOp& op, const float* x, float* y, int64_t n) {
  switch (op.kind) {
#define KILN_UNARY_CASE(K) \
  case UnaryKind::K: return UnaryRangeK<UnaryKind::K>(op, x, y, n);
    KILN_UNARY_CASE(Relu) KILN_UNARY_CASE(Neg) KILN_UNARY_CASE(Abs) KILN_UNARY_CASE(Sqrt) KILN_UNARY_CASE(Rsqrt)
    KILN_UNARY_CASE(Reciprocal) KILN_UNARY_CASE(Exp) KILN_UNARY_CASE(Sigmoid) KILN_UNARY_CASE(Tanh)
    KILN_UNARY_CASE(Silu) KILN_UNARY_CASE(Gelu) KILN_UNARY_CASE(Hardswish) KILN_UNARY_CASE(Hardsigmoid)
    KILN_UNARY_CASE(LeakyRelu) KILN_UNARY_CASE(Clamp)
#undef KILN_UNARY_CASE
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
namespace cpu {
HWY_EXPORT(UnaryRange);
}  // namespace cpu

namespace {

using cpu::UnaryKind;
using cpu::UnaryOp;

constexpr int64_t kCheapGrain = 1 << 15;   ///< elements per thread, at least: memory-bound ops
constexpr int64_t kCostlyGrain = 1 << 13;  ///< elements per thread, at least: exp/tanh/erfc ops

/// The op's attributes: aten.gelu approximate; aten.leaky_relu negative_slope; aten.clamp
/// (min/max nullable) and aten.hardtanh (min_val, max_val).
UnaryOp make_op(UnaryKind kind, const Attributes& at) {
  UnaryOp op;
  op.kind = kind;
  if (kind == UnaryKind::Gelu) op.gelu_tanh = at.get_string("approximate", "none") == "tanh";
  if (kind == UnaryKind::LeakyRelu) op.slope = static_cast<float>(at.get_float("negative_slope", 0.01));
  if (kind == UnaryKind::Clamp) {
    if (at.has("min_val")) {
      op.has_lo = op.has_hi = true;
      op.lo = static_cast<float>(at.get_float("min_val", -1.0));
      op.hi = static_cast<float>(at.get_float("max_val", 1.0));
    } else {
      op.has_lo = !at.is_none("min");
      op.has_hi = !at.is_none("max");
      op.lo = static_cast<float>(at.get_float("min"));
      op.hi = static_cast<float>(at.get_float("max"));
    }
  }
  return op;
}

int64_t grain_of(UnaryKind k) {
  switch (k) {
    case UnaryKind::Exp: case UnaryKind::Sigmoid: case UnaryKind::Tanh: case UnaryKind::Silu: case UnaryKind::Gelu:
      return kCostlyGrain;
    default:
      return kCheapGrain;
  }
}

/// Float32 in and out of equal size; clamp bounds that are NaN are declined (the portable kernel
/// handles them: every output is NaN).
template <UnaryKind K>
bool unary_accepts(const KernelSignature& s) {
  if (s.inputs.empty() || s.inputs[0] == nullptr || s.outputs.size() != 1) return false;
  if (s.inputs[0]->dtype != DType::Float32 || s.outputs[0]->dtype != DType::Float32) return false;
  if (s.inputs[0]->numel() != s.outputs[0]->numel()) return false;
  if constexpr (K == UnaryKind::Clamp) {
    const UnaryOp op = make_op(K, s.attrs);
    return !(op.has_lo && std::isnan(op.lo)) && !(op.has_hi && std::isnan(op.hi));
  }
  return true;
}

template <UnaryKind K>
Error unary_kernel(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& y = *a.outputs[0];
  if (x.dtype != DType::Float32 || y.dtype != DType::Float32 || x.numel() != y.numel()) {
    return Error(ErrorCode::NotSupported, "cpu unary kernel: float32 in and out of equal size only");
  }
  const UnaryOp op = make_op(K, a.attrs);
  const float* px = x.data_as<const float>();
  float* py = y.data_as<float>();
  cpu::parallel_range(a.pool, y.numel(), grain_of(K), [&](int64_t b, int64_t e) {
    KILN_CPU_DISPATCH(UnaryRange)(op, px + b, py + b, e - b);
  });
  return {};
}

template <UnaryKind K>
void add_unary(KernelRegistry& r, const char* name) {
  r.add_optimized(name, unary_kernel<K>, unary_accepts<K>);
}

}  // namespace

void register_cpu_activation(KernelRegistry& r) {
  add_unary<UnaryKind::Relu>(r, "aten.relu");
  add_unary<UnaryKind::Neg>(r, "aten.neg");
  add_unary<UnaryKind::Abs>(r, "aten.abs");
  add_unary<UnaryKind::Sqrt>(r, "aten.sqrt");
  add_unary<UnaryKind::Rsqrt>(r, "aten.rsqrt");
  add_unary<UnaryKind::Reciprocal>(r, "aten.reciprocal");
  add_unary<UnaryKind::Exp>(r, "aten.exp");
  add_unary<UnaryKind::Sigmoid>(r, "aten.sigmoid");
  add_unary<UnaryKind::Tanh>(r, "aten.tanh");
  add_unary<UnaryKind::Silu>(r, "aten.silu");
  add_unary<UnaryKind::Gelu>(r, "aten.gelu");
  add_unary<UnaryKind::Hardswish>(r, "aten.hardswish");
  add_unary<UnaryKind::Hardsigmoid>(r, "aten.hardsigmoid");
  add_unary<UnaryKind::LeakyRelu>(r, "aten.leaky_relu");
  add_unary<UnaryKind::Clamp>(r, "aten.hardtanh");
  add_unary<UnaryKind::Clamp>(r, "aten.clamp");
}

}  // namespace kiln
#endif  // HWY_ONCE

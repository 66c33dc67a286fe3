// Per-target code of the fused activations (PostOp, kernels/cpu/post_op.h): the formulas that the
// cpu kernels apply on their own output (activation fusion) and that the cpu activation kernels
// (activation.cpp) apply on whole tensors, one definition each, so a fused result is bit-identical
// to the convolution followed by the activation. A Highway "-inl.h" header (see vec-inl.h).
//
// Formulas and NaN behaviour are the portable kernels' (src/kernels/portable/elementwise.cpp,
// PyTorch Activation.cpp). Max/Min are written as compare-and-select so that a NaN input
// propagates on every target (Highway leaves Max/Min of NaN implementation-defined).

#if defined(KILN_CPU_POST_OP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_POST_OP_INL_H_
#undef KILN_CPU_POST_OP_INL_H_
#else
#define KILN_CPU_POST_OP_INL_H_
#endif

#include "hwy/highway.h"
#include "kernels/cpu/post_op.h"
#include "kernels/cpu/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// max(c, x) with x returned when it is NaN.
template <class V>
HWY_INLINE V MaxNaN(V c, V x) {
  return hn::IfThenElse(hn::Lt(x, c), c, x);
}
/// min(c, x) with x returned when it is NaN.
template <class V>
HWY_INLINE V MinNaN(V c, V x) {
  return hn::IfThenElse(hn::Gt(x, c), c, x);
}

template <class D, class V>
HWY_INLINE V Relu(D d, V x) {
  return MaxNaN(hn::Zero(d), x);
}
/// min(max(x, lo), hi); an infinite bound leaves every value (NaN included) as it is.
template <class D, class V>
HWY_INLINE V Clamp(D d, V x, float lo, float hi) {
  return MinNaN(hn::Set(d, hi), MaxNaN(hn::Set(d, lo), x));
}
/// x * (min(max(x + 3, 0), 6) / 6): the portable kernel's order (no overflow for x > FLT_MAX / 6,
/// where the result is x).
template <class D, class V>
HWY_INLINE V Hardswish(D d, V x) {
  const V r6 = MinNaN(hn::Set(d, 6.0f), MaxNaN(hn::Zero(d), hn::Add(x, hn::Set(d, 3.0f))));
  return hn::Mul(x, hn::Div(r6, hn::Set(d, 6.0f)));
}
/// min(max(x + 3, 0), 6) / 6.
template <class D, class V>
HWY_INLINE V Hardsigmoid(D d, V x) {
  const V r6 = MinNaN(hn::Set(d, 6.0f), MaxNaN(hn::Zero(d), hn::Add(x, hn::Set(d, 3.0f))));
  return hn::Div(r6, hn::Set(d, 6.0f));
}
/// 1 / (1 + e^-x).
template <class D, class V>
HWY_INLINE V Sigmoid(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, Exp(d, hn::Neg(x))));
}
/// x / (1 + e^-x) (silu(-inf) is NaN, as in PyTorch).
template <class D, class V>
HWY_INLINE V Silu(D d, V x) {
  return hn::Div(x, hn::Add(hn::Set(d, 1.0f), Exp(d, hn::Neg(x))));
}

/// `p` applied to each lane of x.
template <class D, class V>
HWY_INLINE V ApplyPostOp(D d, const PostOp& p, V x) {
  switch (p.kind) {
    case PostOp::Kind::None: return x;
    case PostOp::Kind::Relu: return Relu(d, x);
    case PostOp::Kind::Clamp: return Clamp(d, x, p.lo, p.hi);
    case PostOp::Kind::Hardswish: return Hardswish(d, x);
    case PostOp::Kind::Hardsigmoid: return Hardsigmoid(d, x);
    case PostOp::Kind::Sigmoid: return Sigmoid(d, x);
    case PostOp::Kind::Silu: return Silu(d, x);
  }
  return x;
}

/// `p` applied in place to y[0, n).
HWY_INLINE void ApplyPostOpInplace(const PostOp& p, float* y, int64_t n) {
  if (p.kind == PostOp::Kind::None) return;
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(ApplyPostOp(d, p, hn::LoadU(d, y + i)), d, y + i);
  if (i < n) StoreTail(d, ApplyPostOp(d, p, LoadTail(d, y + i, static_cast<size_t>(n - i))), y + i, static_cast<size_t>(n - i));
}

/// `p` applied to one value (through the same vector code, so identical to ApplyPostOp's lanes).
HWY_INLINE float ApplyPostOp1(const PostOp& p, float x) {
  const DF d;
  return hn::GetLane(ApplyPostOp(d, p, hn::Set(d, x)));
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#endif  // KILN_CPU_POST_OP_INL_H_

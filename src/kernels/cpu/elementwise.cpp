// Optimized cpu kernels for the float32 binary arithmetic ops aten.add / aten.sub (alpha
// honoured), aten.mul and aten.div (rounding_mode None) over runs of the output, written once over
// Highway for every SIMD target.
//
// Broadcasting: the two operand shapes are coalesced against the output (size-1 output dims
// dropped, neighbouring dims merged where both operands either span or broadcast them, as the
// portable kernel does); the innermost coalesced dim is a run where each operand is either a
// vector (step 1) or a scalar (step 0). That covers same-shape (one run), tensor-scalar and
// "per-channel" operands ([N, C, H, W] op [N, C, 1, 1] or [C, 1, 1]: runs of H*W against one
// value). accepts() declines plans whose innermost run is shorter than kMinRun (e.g. an operand
// that is a short [1, W] row): those stay on the portable kernel.
//
// Formulas are the portable kernel's (src/kernels/portable/elementwise.cpp): add/sub compute
// self +- (alpha * other) with alpha rounded to float (PyTorch BinaryOpsKernel.cpp add_kernel),
// div is IEEE true division; results are bit-identical to the portable kernel's.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cpu/parallel_util.h"
#include "kernels/kernel.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/elementwise.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/vec-inl.h"

#ifndef KILN_CPU_ELEMENTWISE_SHARED_
#define KILN_CPU_ELEMENTWISE_SHARED_
namespace kiln::cpu {

/// The output as coalesced dims; sa/sb are each operand's element strides (0 = broadcast).
struct BinaryPlan {
  std::vector<int64_t> sizes, sa, sb;
};

/// Coalesces `a` and `b` (each broadcastable to `out`, checked by inference) against `out`.
inline BinaryPlan make_plan(const std::vector<int64_t>& out, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  BinaryPlan p;
  std::vector<std::pair<bool, bool>> flags;  // per coalesced dim: a broadcasts, b broadcasts
  const size_t r = out.size();
  auto bcast = [&](const std::vector<int64_t>& in, size_t d) {
    const size_t lead = r - in.size();
    return d < lead || in[d - lead] == 1;
  };
  for (size_t d = 0; d < r; ++d) {
    if (out[d] == 1) continue;
    const std::pair<bool, bool> f{bcast(a, d), bcast(b, d)};
    if (!flags.empty() && flags.back() == f) {
      p.sizes.back() *= out[d];
    } else {
      p.sizes.push_back(out[d]);
      flags.push_back(f);
    }
  }
  if (p.sizes.empty()) {
    p.sizes.push_back(1);
    flags.push_back({false, false});
  }
  const size_t n = p.sizes.size();
  p.sa.assign(n, 0);
  p.sb.assign(n, 0);
  int64_t ra = 1, rb = 1;
  for (size_t d = n; d-- > 0;) {
    if (!flags[d].first) { p.sa[d] = ra; ra *= p.sizes[d]; }
    if (!flags[d].second) { p.sb[d] = rb; rb *= p.sizes[d]; }
  }
  return p;
}

/// The binary ops of this file.
enum class BinaryKind { Add, Sub, Mul, Div };

}  // namespace kiln::cpu
#endif  // KILN_CPU_ELEMENTWISE_SHARED_

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace elementwise_detail {

/// One op on one vector: alpha is used by Add/Sub only (self +- alpha * other).
template <BinaryKind K>
struct BinOp {
  float alpha = 1.0f;
  template <class D, class V>
  HWY_INLINE V operator()(D d, V x, V y) const {
    if constexpr (K == BinaryKind::Add) return hn::Add(x, alpha == 1.0f ? y : hn::Mul(hn::Set(d, alpha), y));
    if constexpr (K == BinaryKind::Sub) return hn::Sub(x, alpha == 1.0f ? y : hn::Mul(hn::Set(d, alpha), y));
    if constexpr (K == BinaryKind::Mul) return hn::Mul(x, y);
    return hn::Div(x, y);
  }
};

/// o[j] = op(a[j * sa], b[j * sb]) for j < n, sa and sb in {0, 1}.
template <class Op>
HWY_INLINE void RunBinary(const Op& op, const float* HWY_RESTRICT a, int64_t sa, const float* HWY_RESTRICT b,
                          int64_t sb, float* HWY_RESTRICT o, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  // x(j) / y(j): operand vectors at element j (a broadcast operand is one vector throughout).
  auto run = [&](auto x, auto y) {
    int64_t j = 0;
    for (; j + 2 * N <= n; j += 2 * N) {
      hn::StoreU(op(d, x(j), y(j)), d, o + j);
      hn::StoreU(op(d, x(j + N), y(j + N)), d, o + j + N);
    }
    for (; j + N <= n; j += N) hn::StoreU(op(d, x(j), y(j)), d, o + j);
    if (j < n) {
      const size_t r = static_cast<size_t>(n - j);
      // Tail operands through LoadTail (never reads past the run).
      const VF xv = sa != 0 ? LoadTail(d, a + j, r) : hn::Set(d, *a);
      const VF yv = sb != 0 ? LoadTail(d, b + j, r) : hn::Set(d, *b);
      StoreTail(d, op(d, xv, yv), o + j, r);
    }
  };
  if (sa != 0 && sb != 0) {
    run([&](int64_t j) { return hn::LoadU(d, a + j); }, [&](int64_t j) { return hn::LoadU(d, b + j); });
  } else if (sa != 0) {
    const VF vb = hn::Set(d, *b);
    run([&](int64_t j) { return hn::LoadU(d, a + j); }, [&](int64_t) { return vb; });
  } else if (sb != 0) {
    const VF va = hn::Set(d, *a);
    run([&](int64_t) { return va; }, [&](int64_t j) { return hn::LoadU(d, b + j); });
  } else {
    const VF v = op(d, hn::Set(d, *a), hn::Set(d, *b));
    int64_t j = 0;
    for (; j + N <= n; j += N) hn::StoreU(v, d, o + j);
    if (j < n) StoreTail(d, v, o + j, static_cast<size_t>(n - j));
  }
}

/// Computes output elements [begin, end) of the plan, run by run.
template <class Op>
HWY_INLINE void RunRange(const Op& op, const BinaryPlan& p, const float* a, const float* b, float* o, int64_t begin,
                         int64_t end) {
  const size_t r = p.sizes.size();
  int64_t idx[16] = {};  // coalesced rank <= output rank <= 16; checked by accepts()
  int64_t oa = 0, ob = 0, rem = begin;
  for (size_t d = r; d-- > 0;) {
    idx[d] = rem % p.sizes[d];
    rem /= p.sizes[d];
    oa += idx[d] * p.sa[d];
    ob += idx[d] * p.sb[d];
  }
  const int64_t inner = p.sizes[r - 1], sa = p.sa[r - 1], sb = p.sb[r - 1];
  int64_t pos = begin;
  while (pos < end) {
    const int64_t len = std::min(inner - idx[r - 1], end - pos);
    RunBinary(op, a + oa, sa, b + ob, sb, o + pos, len);
    pos += len;
    idx[r - 1] += len;
    oa += len * sa;
    ob += len * sb;
    for (size_t d = r - 1; d > 0 && idx[d] == p.sizes[d]; --d) {
      idx[d] = 0;
      idx[d - 1] += 1;
      oa += p.sa[d - 1] - p.sizes[d] * p.sa[d];
      ob += p.sb[d - 1] - p.sizes[d] * p.sb[d];
    }
  }
}

}  // namespace elementwise_detail

/// Output elements [begin, end) of `kind` over the plan (alpha: Add/Sub only).
void BinaryRange(BinaryKind kind, float alpha, const BinaryPlan& p, const float* a, const float* b, float* o,
                 int64_t begin, int64_t end) {
  using elementwise_detail::BinOp;
  using elementwise_detail::RunRange;
  switch (kind) {
    case BinaryKind::Add: return RunRange(BinOp<BinaryKind::Add>{alpha}, p, a, b, o, begin, end);
    case BinaryKind::Sub: return RunRange(BinOp<BinaryKind::Sub>{alpha}, p, a, b, o, begin, end);
    case BinaryKind::Mul: return RunRange(BinOp<BinaryKind::Mul>{alpha}, p, a, b, o, begin, end);
    case BinaryKind::Div: return RunRange(BinOp<BinaryKind::Div>{alpha}, p, a, b, o, begin, end);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
namespace cpu {
HWY_EXPORT(BinaryRange);
}  // namespace cpu

namespace {

using cpu::BinaryPlan;
using cpu::make_plan;
using Kind = cpu::BinaryKind;

constexpr int64_t kMinRun = 16;         ///< shortest innermost run accepted
constexpr int64_t kParallelGrain = 1 << 15;  ///< output elements per thread, at least (memory-bound)

template <Kind K>
bool binary_accepts(const KernelSignature& s) {
  if (s.inputs.size() != 2 || s.outputs.size() != 1 || !s.inputs[0] || !s.inputs[1]) return false;
  const TensorType& x = *s.inputs[0];
  const TensorType& y = *s.inputs[1];
  const TensorType& o = *s.outputs[0];
  if (x.dtype != DType::Float32 || y.dtype != DType::Float32 || o.dtype != DType::Float32) return false;
  if (o.sizes.size() > 16 || x.sizes.size() > o.sizes.size() || y.sizes.size() > o.sizes.size()) return false;
  if constexpr (K == Kind::Div) {
    if (!s.attrs.is_none("rounding_mode")) return false;
  }
  const BinaryPlan p = make_plan(o.sizes, x.sizes, y.sizes);
  return p.sizes.size() == 1 || p.sizes.back() >= kMinRun;
}

template <Kind K>
Error binary_kernel(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const Tensor& y = *a.inputs[1];
  Tensor& out = *a.outputs[0];
  if (x.dtype != DType::Float32 || y.dtype != DType::Float32 || out.dtype != DType::Float32 || out.sizes.size() > 16) {
    return Error(ErrorCode::NotSupported, "cpu binary kernel: float32 operands of rank <= 16 only");
  }
  float alpha = 1.0f;
  if constexpr (K == Kind::Add || K == Kind::Sub) alpha = static_cast<float>(a.attrs.get_float("alpha", 1.0));
  const int64_t n = out.numel();
  if (n == 0) return {};
  const BinaryPlan p = make_plan(out.sizes, x.sizes, y.sizes);
  const float* px = x.data_as<const float>();
  const float* py = y.data_as<const float>();
  float* po = out.data_as<float>();
  cpu::parallel_range(a.pool, n, kParallelGrain, [&](int64_t b, int64_t e) {
    KILN_CPU_DISPATCH(BinaryRange)(K, alpha, p, px, py, po, b, e);
  });
  return {};
}

}  // namespace

void register_cpu_elementwise(KernelRegistry& r) {
  r.add_optimized("aten.add", binary_kernel<Kind::Add>, binary_accepts<Kind::Add>);
  r.add_optimized("aten.sub", binary_kernel<Kind::Sub>, binary_accepts<Kind::Sub>);
  r.add_optimized("aten.mul", binary_kernel<Kind::Mul>, binary_accepts<Kind::Mul>);
  r.add_optimized("aten.div", binary_kernel<Kind::Div>, binary_accepts<Kind::Div>);
}

}  // namespace kiln
#endif  // HWY_ONCE

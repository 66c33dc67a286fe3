// Optimized cpu kernels for the float32 binary arithmetic ops aten.add / aten.sub (alpha
// honoured), aten.mul and aten.div (rounding_mode None): AVX2 over runs of the output.
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

#include "kernels/cpu/vec_math.h"
#include "kernels/kernel.h"

namespace kiln {

#if KILN_CPU_AVX2_KERNELS
namespace {

using cpu::load_tail;
using cpu::store_tail;

constexpr int64_t kMinRun = 16;         ///< shortest innermost run accepted
constexpr int64_t kParallelGrain = 1 << 15;  ///< output elements per thread, at least (memory-bound)

/// The output as coalesced dims; sa/sb are each operand's element strides (0 = broadcast).
struct BinaryPlan {
  std::vector<int64_t> sizes, sa, sb;
};

/// Coalesces `a` and `b` (each broadcastable to `out`, checked by inference) against `out`.
BinaryPlan make_plan(const std::vector<int64_t>& out, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
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

enum class Kind { Add, Sub, Mul, Div };

/// One op: alpha is used by Add/Sub only (self +- alpha * other).
template <Kind K>
struct BinOp {
  float alpha = 1.0f;
  KILN_AVX2 __m256 operator()(__m256 x, __m256 y) const {
    if constexpr (K == Kind::Add) return _mm256_add_ps(x, alpha == 1.0f ? y : _mm256_mul_ps(_mm256_set1_ps(alpha), y));
    if constexpr (K == Kind::Sub) return _mm256_sub_ps(x, alpha == 1.0f ? y : _mm256_mul_ps(_mm256_set1_ps(alpha), y));
    if constexpr (K == Kind::Mul) return _mm256_mul_ps(x, y);
    return _mm256_div_ps(x, y);
  }
};

/// o[j] = op(a[j * sa], b[j * sb]) for j < n, sa and sb in {0, 1}.
template <class Op>
KILN_AVX2 void run_binary(const Op& op, const float* a, int64_t sa, const float* b, int64_t sb, float* o, int64_t n) {
  int64_t j = 0;
  if (sa != 0 && sb != 0) {
    for (; j + 16 <= n; j += 16) {
      _mm256_storeu_ps(o + j, op(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j)));
      _mm256_storeu_ps(o + j + 8, op(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8)));
    }
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(o + j, op(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j)));
    if (j < n) store_tail(o + j, n - j, op(load_tail(a + j, n - j), load_tail(b + j, n - j)));
  } else if (sa != 0) {
    const __m256 vb = _mm256_set1_ps(*b);
    for (; j + 16 <= n; j += 16) {
      _mm256_storeu_ps(o + j, op(_mm256_loadu_ps(a + j), vb));
      _mm256_storeu_ps(o + j + 8, op(_mm256_loadu_ps(a + j + 8), vb));
    }
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(o + j, op(_mm256_loadu_ps(a + j), vb));
    if (j < n) store_tail(o + j, n - j, op(load_tail(a + j, n - j), vb));
  } else if (sb != 0) {
    const __m256 va = _mm256_set1_ps(*a);
    for (; j + 16 <= n; j += 16) {
      _mm256_storeu_ps(o + j, op(va, _mm256_loadu_ps(b + j)));
      _mm256_storeu_ps(o + j + 8, op(va, _mm256_loadu_ps(b + j + 8)));
    }
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(o + j, op(va, _mm256_loadu_ps(b + j)));
    if (j < n) store_tail(o + j, n - j, op(va, load_tail(b + j, n - j)));
  } else {
    const __m256 v = op(_mm256_set1_ps(*a), _mm256_set1_ps(*b));
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(o + j, v);
    if (j < n) store_tail(o + j, n - j, v);
  }
}

/// Computes output elements [begin, end) of the plan, run by run.
template <class Op>
KILN_AVX2 void run_range(const Op& op, const BinaryPlan& p, const float* a, const float* b, float* o, int64_t begin,
                         int64_t end) {
  const size_t r = p.sizes.size();
  int64_t idx[16] = {};  // coalesced rank <= output rank <= kMaxRank (16); checked by accepts()
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
    run_binary(op, a + oa, sa, b + ob, sb, o + pos, len);
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

template <Kind K>
bool binary_accepts(const KernelSignature& s) {
  if (!cpu::cpu_has_avx2_fma()) return false;
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
  BinOp<K> op;
  if constexpr (K == Kind::Add || K == Kind::Sub) op.alpha = static_cast<float>(a.attrs.get_float("alpha", 1.0));
  const int64_t n = out.numel();
  if (n == 0) return {};
  const BinaryPlan p = make_plan(out.sizes, x.sizes, y.sizes);
  const float* px = x.data_as<const float>();
  const float* py = y.data_as<const float>();
  float* po = out.data_as<float>();
  cpu::parallel_range(a.pool, n, kParallelGrain, [&](int64_t b, int64_t e) { run_range(op, p, px, py, po, b, e); });
  return {};
}

}  // namespace

void register_cpu_elementwise(KernelRegistry& r) {
  r.add_optimized("aten.add", binary_kernel<Kind::Add>, binary_accepts<Kind::Add>);
  r.add_optimized("aten.sub", binary_kernel<Kind::Sub>, binary_accepts<Kind::Sub>);
  r.add_optimized("aten.mul", binary_kernel<Kind::Mul>, binary_accepts<Kind::Mul>);
  r.add_optimized("aten.div", binary_kernel<Kind::Div>, binary_accepts<Kind::Div>);
}

#else

void register_cpu_elementwise(KernelRegistry&) {}  // no AVX2 kernels on this target

#endif  // KILN_CPU_AVX2_KERNELS

}  // namespace kiln

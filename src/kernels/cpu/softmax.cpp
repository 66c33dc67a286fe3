// Optimized cpu kernels for aten._softmax / aten._log_softmax (float32, any dim), written once over
// Highway for every SIMD target (kernels/cpu/vec-inl.h).
//
// softmax(x)_k = e^(x_k - m) / sum_j e^(x_j - m), log_softmax(x)_k = x_k - m - log(sum_j e^(x_j - m)),
// m = max_j x_j (PyTorch aten/src/ATen/native/cpu/SoftMaxKernel.cpp computes the same). The
// reduction dim is either the last one (rows are contiguous: one row at a time) or has `inner`
// elements after it (one vector of neighbouring columns at a time, one column per lane). Sums
// accumulate in float lanes flushed to double every kFlush terms, so long rows keep the accuracy
// of a double sum; e^(x - m) (never positive) is ExpNonpos of vec-inl.h (exactly 0 below -87.33,
// where the result is below FLT_MIN relative to the row's largest term 1). NaN anywhere in a row
// makes the row NaN; an all -inf row gives NaN (as the portable kernel and PyTorch do). Rows are
// split across the pool.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "ir/op_registry.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/kernel.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/softmax.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace softmax_detail {

constexpr int64_t kFlush = 512;  ///< float terms per lane before a flush to double

/// Softmax (log: log_softmax) of one contiguous row x[0..n), n > 0, into y.
HWY_INLINE void SoftmaxRow(const float* HWY_RESTRICT x, float* HWY_RESTRICT y, int64_t n, bool log) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  // A NaN may be dropped from the maximum (Max of NaN is implementation-defined), but e^(NaN - m)
  // is NaN, so the sum and every output still become NaN.
  VF m0 = hn::Set(d, -std::numeric_limits<float>::infinity()), m1 = m0;
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    m0 = hn::Max(m0, hn::LoadU(d, x + i));
    m1 = hn::Max(m1, hn::LoadU(d, x + i + N));
  }
  for (; i + N <= n; i += N) m0 = hn::Max(m0, hn::LoadU(d, x + i));
  float mx = ReduceMax(d, hn::Max(m0, m1));
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  const VF vm = hn::Set(d, mx);

  double total = 0.0;
  for (int64_t b = 0; b < n; b += kFlush * N) {
    const int64_t e = std::min(n, b + kFlush * N);
    VF s0 = hn::Zero(d), s1 = hn::Zero(d);
    int64_t j = b;
    for (; j + 2 * N <= e; j += 2 * N) {
      const VF v0 = ExpNonpos(d, hn::Sub(hn::LoadU(d, x + j), vm));
      const VF v1 = ExpNonpos(d, hn::Sub(hn::LoadU(d, x + j + N), vm));
      if (!log) {
        hn::StoreU(v0, d, y + j);
        hn::StoreU(v1, d, y + j + N);
      }
      s0 = hn::Add(s0, v0);
      s1 = hn::Add(s1, v1);
    }
    for (; j + N <= e; j += N) {
      const VF v = ExpNonpos(d, hn::Sub(hn::LoadU(d, x + j), vm));
      if (!log) hn::StoreU(v, d, y + j);
      s0 = hn::Add(s0, v);
    }
    if (j < e) {
      const size_t r = static_cast<size_t>(e - j);
      const VF v = hn::IfThenElseZero(hn::FirstN(d, r), ExpNonpos(d, hn::Sub(LoadTail(d, x + j, r), vm)));
      if (!log) StoreTail(d, v, y + j, r);
      s1 = hn::Add(s1, v);
    }
    total += ReduceSumDouble(d, hn::Add(s0, s1));
  }
  int64_t j = 0;
  if (log) {
    const VF lse = hn::Set(d, static_cast<float>(std::log(total)));
    for (; j + N <= n; j += N) hn::StoreU(hn::Sub(hn::Sub(hn::LoadU(d, x + j), vm), lse), d, y + j);
    if (j < n) {
      const size_t r = static_cast<size_t>(n - j);
      StoreTail(d, hn::Sub(hn::Sub(LoadTail(d, x + j, r), vm), lse), y + j, r);
    }
  } else {
    const VF inv = hn::Set(d, static_cast<float>(1.0 / total));
    for (; j + N <= n; j += N) hn::StoreU(hn::Mul(hn::LoadU(d, y + j), inv), d, y + j);
    if (j < n) {
      const size_t r = static_cast<size_t>(n - j);
      StoreTail(d, hn::Mul(LoadTail(d, y + j, r), inv), y + j, r);
    }
  }
}

/// Softmax along a strided dim for `w` (1..Lanes) neighbouring columns: element k of column c is
/// x[k * inner + c]. Column sums go to double per lane every kFlush terms (through a stack array:
/// no shuffles, any lane count).
HWY_INLINE void SoftmaxColumns(const float* HWY_RESTRICT x, float* HWY_RESTRICT y, int64_t n, int64_t inner,
                               size_t w, bool log) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const bool full = w == N;
  auto load = [&](const float* p) { return full ? hn::LoadU(d, p) : LoadTail(d, p, w); };
  auto store = [&](float* p, VF v) {
    if (full) hn::StoreU(v, d, p);
    else StoreTail(d, v, p, w);
  };
  constexpr size_t kMax = HWY_MAX_BYTES / sizeof(float);
  VF mx = hn::Set(d, -std::numeric_limits<float>::infinity());
  for (int64_t k = 0; k < n; ++k) mx = hn::Max(load(x + k * inner), mx);
  double sums[kMax] = {};
  HWY_ALIGN float lanes[kMax];
  for (int64_t b = 0; b < n; b += kFlush) {
    const int64_t e = std::min(n, b + kFlush);
    VF s = hn::Zero(d);
    for (int64_t k = b; k < e; ++k) {
      const VF v = ExpNonpos(d, hn::Sub(load(x + k * inner), mx));
      if (!log) store(y + k * inner, v);
      s = hn::Add(s, v);
    }
    hn::Store(s, d, lanes);
    for (size_t c = 0; c < N; ++c) sums[c] += lanes[c];
  }
  if (log) {
    for (size_t c = 0; c < N; ++c) lanes[c] = static_cast<float>(std::log(sums[c]));
    const VF vl = hn::Load(d, lanes);
    for (int64_t k = 0; k < n; ++k) store(y + k * inner, hn::Sub(hn::Sub(load(x + k * inner), mx), vl));
  } else {
    for (size_t c = 0; c < N; ++c) lanes[c] = static_cast<float>(1.0 / sums[c]);
    const VF inv = hn::Load(d, lanes);
    for (int64_t k = 0; k < n; ++k) store(y + k * inner, hn::Mul(load(y + k * inner), inv));
  }
}

}  // namespace softmax_detail

/// Rows [r0, r1) of a softmax over contiguous rows of n floats (x, y: the whole tensors).
void SoftmaxRows(const float* x, float* y, int64_t n, int64_t r0, int64_t r1, bool log) {
  for (int64_t r = r0; r < r1; ++r) softmax_detail::SoftmaxRow(x + r * n, y + r * n, n, log);
}

/// Tasks [t0, t1) of a softmax over a strided dim: task t is outer index t / blocks and the
/// column block t % blocks (Lanes columns from (t % blocks) * Lanes, fewer at the end).
void SoftmaxColumnBlocks(const float* x, float* y, int64_t n, int64_t inner, int64_t t0, int64_t t1, bool log) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t blocks = (inner + N - 1) / N;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t o = t / blocks, c = (t % blocks) * N;
    const int64_t off = o * n * inner + c;
    softmax_detail::SoftmaxColumns(x + off, y + off, n, inner, static_cast<size_t>(std::min(N, inner - c)), log);
  }
}

/// Lanes of this target's float vector (the column block width).
int64_t SoftmaxLanes() { return static_cast<int64_t>(hn::Lanes(DF())); }

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
namespace cpu {
HWY_EXPORT(SoftmaxRows);
HWY_EXPORT(SoftmaxColumnBlocks);
HWY_EXPORT(SoftmaxLanes);
}  // namespace cpu

namespace {

bool softmax_accepts(const KernelSignature& s) {
  if (s.inputs.size() != 1 || s.inputs[0] == nullptr || s.outputs.size() != 1) return false;
  const TensorType& x = *s.inputs[0];
  if (x.dtype != DType::Float32 || s.outputs[0]->dtype != DType::Float32 || s.outputs[0]->sizes != x.sizes) return false;
  return !s.attrs.get_bool("half_to_float") && wrap_dim(s.attrs.get_int("dim"), x.dim()).ok();
}

Error softmax_impl(const KernelArgs& a, bool log) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const char* op = log ? "aten._log_softmax" : "aten._softmax";
  if (x.dtype != DType::Float32 || out.dtype != DType::Float32 || out.sizes != x.sizes) {
    return Error(ErrorCode::NotSupported, std::string(op) + ": cpu kernel takes float32 only");
  }
  auto d = wrap_dim(a.attrs.get_int("dim"), x.dim());
  if (!d.ok()) return Error(ErrorCode::InvalidArgument, std::string(op) + ": dim: " + d.error().message());
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t k = 0; k < x.dim(); ++k) {
    const int64_t s = x.sizes[static_cast<size_t>(k)];
    if (k < *d) outer *= s;
    else if (k == *d) n = s;
    else inner *= s;
  }
  if (outer == 0 || n == 0 || inner == 0) return {};
  const float* px = x.data_as<const float>();
  float* po = out.data_as<float>();
  if (inner == 1) {
    const int64_t grain = std::max<int64_t>(1, 16384 / n);
    cpu::parallel_range(a.pool, outer, grain, [&](int64_t b, int64_t e) {
      KILN_CPU_DISPATCH(SoftmaxRows)(px, po, n, b, e, log);
    });
    return {};
  }
  const int64_t lanes = KILN_CPU_DISPATCH(SoftmaxLanes)();
  const int64_t blocks = (inner + lanes - 1) / lanes;  // column blocks per outer index
  const int64_t grain = std::max<int64_t>(1, 16384 / (lanes * n));
  cpu::parallel_range(a.pool, outer * blocks, grain, [&](int64_t b, int64_t e) {
    KILN_CPU_DISPATCH(SoftmaxColumnBlocks)(px, po, n, inner, b, e, log);
  });
  return {};
}

Error softmax(const KernelArgs& a) { return softmax_impl(a, false); }
Error log_softmax(const KernelArgs& a) { return softmax_impl(a, true); }

}  // namespace

void register_cpu_softmax(KernelRegistry& r) {
  r.add_optimized("aten._softmax", softmax, softmax_accepts);
  r.add_optimized("aten._log_softmax", log_softmax, softmax_accepts);
}

}  // namespace kiln
#endif  // HWY_ONCE

// Optimized pooling: global average pooling (aten.adaptive_avg_pool2d to 1x1, the squeeze-excite
// and classifier-head pooling of MobileNetV3 / ResNet). fp32, AVX2/FMA; other shapes stay portable.
#include <immintrin.h>

#include "kernels/cpu/vec_math.h"
#include "kernels/kernel.h"

namespace kiln {
namespace {

#if defined(__x86_64__)
/// Sum of n floats with four 8-lane accumulators (the portable kernel adds left to right; the
/// results agree to float rounding, ~1e-7 relative for these sizes).
__attribute__((target("avx2,fma"))) float sum_avx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) total += p[i];
  return total;
}

/// aten.adaptive_avg_pool2d with output 1x1: out[p] = mean of plane p (H*W floats), over every
/// leading dim; planes split across the pool when there are enough of them.
Error global_avg_pool(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const int64_t r = x.dim();
  const int64_t hw = x.sizes[r - 2] * x.sizes[r - 1];
  const int64_t planes = out.numel();
  const float* px = x.data_as<float>();
  float* po = out.data_as<float>();
  const float inv = 1.0f / static_cast<float>(hw);
  cpu::parallel_range(a.pool, planes, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(hw, 1)),
                      [&](int64_t b, int64_t e) {
                        for (int64_t p = b; p < e; ++p) po[p] = sum_avx2(px + p * hw, hw) * inv;
                      });
  return {};
}

bool global_avg_pool_accepts(const KernelSignature& s) {
  if (!cpu::cpu_has_avx2_fma() || s.inputs.empty() || s.inputs[0] == nullptr || s.outputs.size() != 1) return false;
  const TensorType& x = *s.inputs[0];
  const TensorType& o = *s.outputs[0];
  const int64_t r = x.dim();
  return x.dtype == DType::Float32 && o.dtype == DType::Float32 && r >= 2 && o.dim() == r && o.sizes[r - 2] == 1 &&
         o.sizes[r - 1] == 1 && x.sizes[r - 2] * x.sizes[r - 1] > 0;
}
#endif

}  // namespace

void register_cpu_pool(KernelRegistry& r) {
#if defined(__x86_64__)
  r.add_optimized("aten.adaptive_avg_pool2d", global_avg_pool, global_avg_pool_accepts);
#else
  (void)r;
#endif
}

}  // namespace kiln

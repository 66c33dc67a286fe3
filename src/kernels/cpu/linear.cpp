// Optimized cpu kernels for aten.mm, aten.bmm, aten.addmm and aten.linear (float32, contiguous),
// all on cpu::sgemm. Semantics and shapes: src/ir/ops/linear.cpp, src/kernels/portable/linear.cpp.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/post_op.h"
#include "kernels/kernel.h"
#include "kernels/portable/util.h"

namespace kiln {
namespace {

bool all_float32(const KernelSignature& sig) {
  for (const TensorType* t : sig.inputs) {
    if (t != nullptr && t->dtype != DType::Float32) return false;
  }
  for (const TensorType* t : sig.outputs) {
    if (t == nullptr || t->dtype != DType::Float32) return false;
  }
  return true;
}

/// mm / bmm / addmm / linear: float32 with the ranks the op's inference guarantees, on every
/// SIMD target (cpu::sgemm is compiled for each).
bool matmul_accepts(const KernelSignature& sig) { return all_float32(sig); }

/// True when `t` (broadcasting to [rows, cols]) holds one value per column: sizes [..., 1, cols]
/// with every leading size 1 (so a per-column bias of the GEMM).
bool is_per_column(const std::vector<int64_t>& sizes, int64_t cols) {
  if (sizes.empty() || sizes.back() != cols) return false;
  for (size_t d = 0; d + 1 < sizes.size(); ++d) {
    if (sizes[d] != 1) return false;
  }
  return true;
}

/// out = t broadcast to out's shape (NumPy rules; the op's inference checked they broadcast).
void fill_broadcast(const Tensor& t, Tensor& out) {
  const float* src = t.data_as<float>();
  float* dst = out.data_as<float>();
  const int64_t n = out.numel();
  if (t.sizes == out.sizes) {
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
    return;
  }
  BroadcastIndex bi(t.sizes, out.sizes);
  for (int64_t i = 0; i < n; ++i) dst[i] = src[bi(i)];
}

/// aten.mm: self [n, k] @ mat2 [k, m] -> [n, m].
Error mm(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const Tensor& y = *a.inputs[1];
  const int64_t n = x.sizes[0], k = x.sizes[1], m = y.sizes[1];
  cpu::sgemm(false, false, n, m, k, 1.0f, x.data_as<float>(), k, y.data_as<float>(), m, 0.0f,
             a.outputs[0]->data_as<float>(), m, {}, a.pool);
  return {};
}

/// aten.bmm: self [b, n, k] @ mat2 [b, k, m] -> [b, n, m]. Parallel over the batch (matrices
/// claimed dynamically) when it splits evenly over the threads or is large, else over each product.
Error bmm(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const Tensor& y = *a.inputs[1];
  const int64_t batch = x.sizes[0], n = x.sizes[1], k = x.sizes[2], m = y.sizes[2];
  const float* px = x.data_as<float>();
  const float* py = y.data_as<float>();
  float* po = a.outputs[0]->data_as<float>();
  auto one = [&](int64_t i, ThreadPool* pool) {
    cpu::sgemm(false, false, n, m, k, 1.0f, px + i * n * k, k, py + i * k * m, m, 0.0f, po + i * n * m, m, {}, pool);
  };
  const int threads = a.pool != nullptr ? a.pool->num_threads() : 1;
  const double flops = 2.0 * static_cast<double>(batch) * static_cast<double>(n * m) * static_cast<double>(k);
  if (threads > 1 && flops >= 4e6 && (batch % threads == 0 || batch >= 2 * threads)) {
    cpu::parallel_tasks(a.pool, batch, [&](int64_t i) { one(i, nullptr); });
  } else {
    for (int64_t i = 0; i < batch; ++i) one(i, a.pool);
  }
  return {};
}

/// aten.addmm: out [n, m] = beta * self + alpha * (mat1 [n, k] @ mat2 [k, m]); self broadcasts
/// to [n, m]; beta == 0 ignores self (torch.addmm).
Error addmm(const KernelArgs& a) {
  const Tensor& self = *a.inputs[0];
  const Tensor& x = *a.inputs[1];
  const Tensor& y = *a.inputs[2];
  Tensor& out = *a.outputs[0];
  const float beta = static_cast<float>(a.attrs.get_float("beta", 1.0));
  const float alpha = static_cast<float>(a.attrs.get_float("alpha", 1.0));
  const int64_t n = x.sizes[0], k = x.sizes[1], m = y.sizes[1];
  cpu::GemmEpilogue ep;
  float gemm_beta = 0.0f;
  if (beta != 0.0f) {
    if (beta == 1.0f && is_per_column(self.sizes, m)) {
      ep.bias_kind = cpu::GemmBias::PerCol;
      ep.bias = self.data_as<float>();
    } else {
      fill_broadcast(self, out);
      gemm_beta = beta;
    }
  }
  cpu::sgemm(false, false, n, m, k, alpha, x.data_as<float>(), k, y.data_as<float>(), m, gemm_beta,
             out.data_as<float>(), m, ep, a.pool);
  return {};
}

/// What linear_prepare built: the constant weight [out_f, in_f] packed as the GEMM's op(B)
/// [in_f, out_f] (cpu::pack_b_for_gemm with trans_b), so that calls skip the per-call
/// transposing pack of all weights (for 77 rows, as in a text encoder, that pack costs ~10%);
/// and the following activation computed in the GEMM's stores (fused_next).
struct LinearState : KernelState {
  std::vector<float> packed_b;  ///< cpu::prepacked_b_floats(out_f, in_f) floats; empty: not packed
  cpu::PostOp post;             ///< the fused activation (kind None: none)
};

/// Prepare (once per Method instance): fuses a following activation that cpu::post_op_of knows
/// (KernelPrepareArgs::next: e.g. the silu of a CLIP MLP after rewrite_quick_gelu, mobilenet_v3's
/// classifier hardswish), and packs a constant float32 weight when the product is a real GEMM
/// (more than one row and more than one output feature; otherwise sgemm takes its matrix-vector
/// path, which reads the weight directly).
Result<std::unique_ptr<KernelState>> linear_prepare(const KernelPrepareArgs& p) {
  const Tensor* w = p.constants.size() > 1 ? p.constants[1] : nullptr;
  const TensorType* out = p.sig.outputs[0];
  if (out == nullptr || out->dtype != DType::Float32) return std::unique_ptr<KernelState>();
  auto st = std::make_unique<LinearState>();
  if (p.next != nullptr && p.next->other == nullptr && cpu::post_op_of(p.next->op, p.next->attrs, &st->post)) {
    st->fused_next = true;
  }
  if (w != nullptr && w->dtype == DType::Float32 && w->sizes.size() == 2) {
    const int64_t out_f = w->sizes[0], in_f = w->sizes[1];
    int64_t numel = 1;
    for (int64_t s : out->sizes) numel *= s;
    const int64_t rows = out_f == 0 ? 0 : numel / out_f;
    if (rows > 1 && out_f > 1 && in_f > 0) {
      st->packed_b.resize(static_cast<size_t>(cpu::prepacked_b_floats(out_f, in_f)));
      cpu::pack_b_for_gemm(true, in_f, out_f, w->data_as<float>(), in_f, st->packed_b.data());
      st->bytes = st->packed_b.size() * sizeof(float);
      st->released_inputs = {1};  // read again only through the file if ever (never for rows, out_f > 1)
    }
  }
  if (!st->fused_next && st->packed_b.empty()) return std::unique_ptr<KernelState>();
  return std::unique_ptr<KernelState>(std::move(st));
}

/// aten.linear: out [..., out_f] = input [..., in_f] @ weight [out_f, in_f]^T + bias (bias
/// broadcasts to the output shape).
Error linear(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const Tensor& w = *a.inputs[1];
  const Tensor* b = a.inputs[2];
  Tensor& out = *a.outputs[0];
  const int64_t in_f = w.sizes[1], out_f = w.sizes[0];
  const int64_t rows = out_f == 0 ? 0 : out.numel() / out_f;
  cpu::GemmEpilogue ep;
  float beta = 0.0f;
  if (b != nullptr) {
    if (is_per_column(b->sizes, out_f)) {
      ep.bias_kind = cpu::GemmBias::PerCol;
      ep.bias = b->data_as<float>();
    } else {
      fill_broadcast(*b, out);
      beta = 1.0f;
    }
  }
  const auto* st = static_cast<const LinearState*>(a.state);
  if (st != nullptr) ep.post = st->post;
  const float* packed = st != nullptr && !st->packed_b.empty() ? st->packed_b.data() : nullptr;
  cpu::sgemm(false, true, rows, out_f, in_f, 1.0f, x.data_as<float>(), in_f, w.data_as<float>(), in_f, beta,
             out.data_as<float>(), out_f, ep, a.pool, nullptr, packed);
  return {};
}

}  // namespace

void register_cpu_linear(KernelRegistry& r) {
  r.add_optimized("aten.mm", mm, matmul_accepts);
  r.add_optimized("aten.bmm", bmm, matmul_accepts);
  r.add_optimized("aten.addmm", addmm, matmul_accepts);
  r.add_optimized("aten.linear", linear, matmul_accepts, linear_prepare);
}

}  // namespace kiln

// Portable linear kernels: row-by-row matrix products with double accumulation (exactly
// rounded dot products up to double rounding, which eager fp32 GEMM approximates).
#include <vector>

#include "kernels/kernel.h"
#include "kernels/portable/util.h"

namespace kiln {
namespace {

/// acc[j] = sum_p a[p] * B[p, j] for a row a [k] and B [k, m] row-major.
void row_times_matrix(const float* a, const float* b, int64_t k, int64_t m, std::vector<double>& acc) {
  acc.assign(static_cast<size_t>(m), 0.0);
  for (int64_t p = 0; p < k; ++p) {
    const double ap = a[p];
    const float* brow = b + p * m;
    for (int64_t j = 0; j < m; ++j) acc[static_cast<size_t>(j)] += ap * static_cast<double>(brow[j]);
  }
}

/// out [n, m] = a [n, k] @ b [k, m], float32.
void matmul(const float* a, const float* b, float* out, int64_t n, int64_t k, int64_t m) {
  std::vector<double> acc;
  for (int64_t i = 0; i < n; ++i) {
    row_times_matrix(a + i * k, b, k, m, acc);
    for (int64_t j = 0; j < m; ++j) out[i * m + j] = static_cast<float>(acc[static_cast<size_t>(j)]);
  }
}

/// aten.mm: self [n, k] @ mat2 [k, m] -> [n, m].
Error mm(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const Tensor& y = *a.inputs[1];
  matmul(x.data_as<float>(), y.data_as<float>(), a.outputs[0]->data_as<float>(), x.sizes[0], x.sizes[1], y.sizes[1]);
  return {};
}

/// aten.bmm: self [b, n, k] @ mat2 [b, k, m] -> [b, n, m].
Error bmm(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const Tensor& y = *a.inputs[1];
  const int64_t batch = x.sizes[0], n = x.sizes[1], k = x.sizes[2], m = y.sizes[2];
  const float* px = x.data_as<float>();
  const float* py = y.data_as<float>();
  float* po = a.outputs[0]->data_as<float>();
  for (int64_t i = 0; i < batch; ++i) matmul(px + i * n * k, py + i * k * m, po + i * n * m, n, k, m);
  return {};
}

/// aten.addmm: out [n, m] = beta * self + alpha * (mat1 [n, k] @ mat2 [k, m]); self broadcasts to
/// [n, m]. As torch.addmm, beta == 0 ignores self entirely (NaN/inf in self do not propagate).
Error addmm(const KernelArgs& a) {
  const Tensor& self = *a.inputs[0];
  const Tensor& x = *a.inputs[1];
  const Tensor& y = *a.inputs[2];
  Tensor& out = *a.outputs[0];
  const double beta = a.attrs.get_float("beta", 1.0);
  const double alpha = a.attrs.get_float("alpha", 1.0);
  const int64_t n = x.sizes[0], k = x.sizes[1], m = y.sizes[1];
  BroadcastIndex bs(self.sizes, out.sizes);
  const float* ps = self.data_as<float>();
  const float* px = x.data_as<float>();
  const float* py = y.data_as<float>();
  float* po = out.data_as<float>();
  std::vector<double> acc;
  for (int64_t i = 0; i < n; ++i) {
    row_times_matrix(px + i * k, py, k, m, acc);
    for (int64_t j = 0; j < m; ++j) {
      double v = alpha * acc[static_cast<size_t>(j)];
      if (beta != 0.0) v += beta * static_cast<double>(ps[bs(i * m + j)]);
      po[i * m + j] = static_cast<float>(v);
    }
  }
  return {};
}

/// aten.linear: out [..., out] = input [..., in] @ weight[out, in]^T + bias (bias broadcasts to
/// the output shape).
Error linear(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const Tensor& w = *a.inputs[1];
  const Tensor* b = a.inputs[2];
  Tensor& out = *a.outputs[0];
  const int64_t in_f = w.sizes[1], out_f = w.sizes[0];
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < out.dim(); ++d) rows *= out.sizes[d];
  const float* px = x.data_as<float>();
  const float* pw = w.data_as<float>();
  float* po = out.data_as<float>();
  const float* pb = b != nullptr ? b->data_as<float>() : nullptr;
  BroadcastIndex bb(b != nullptr ? b->sizes : std::vector<int64_t>{}, out.sizes);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = px + i * in_f;
    for (int64_t j = 0; j < out_f; ++j) {
      const float* wr = pw + j * in_f;
      double acc = 0.0;
      for (int64_t p = 0; p < in_f; ++p) acc += static_cast<double>(xr[p]) * static_cast<double>(wr[p]);
      const int64_t o = i * out_f + j;
      if (pb != nullptr) acc += static_cast<double>(pb[bb(o)]);
      po[o] = static_cast<float>(acc);
    }
  }
  return {};
}

}  // namespace

void register_portable_linear(KernelRegistry& r) {
  r.add("aten.mm", mm);
  r.add("aten.bmm", bmm);
  r.add("aten.addmm", addmm);
  r.add("aten.linear", linear);
}

}  // namespace kiln

// Portable normalization and attention kernels (float32 tensors, statistics and reductions in
// double). Shapes and attributes were validated by the op definitions in src/ir/ops/norm.cpp.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <new>
#include <vector>

#include "kernels/kernel.h"
#include "kernels/portable/util.h"

namespace kiln {
namespace {

/// Runs fn(begin, end) over [0, n), on the pool when there is one.
template <typename F>
void parallel_rows(ThreadPool* pool, int64_t n, int64_t work_per_row, F&& fn) {
  if (n <= 0) return;
  const int64_t min_chunk = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, work_per_row));
  if (pool == nullptr || n <= min_chunk) {
    fn(int64_t{0}, n);
    return;
  }
  pool->parallel_for(n, min_chunk, fn);
}


/// Mean and 1/sqrt(biased variance + eps) of x[0..n) (two passes, in double).
void moments(const float* x, int64_t n, double eps, double& mean, double& rstd) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  mean = n > 0 ? sum / static_cast<double>(n) : 0.0;
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    sq += d * d;
  }
  const double var = n > 0 ? sq / static_cast<double>(n) : 0.0;
  rstd = 1.0 / std::sqrt(var + eps);
}

// aten.native_batch_norm, inference: y = (x - mean[c]) / sqrt(var[c] + eps) * w[c] + b[c], c = dim 1.
Error batch_norm(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_f32(a, "aten.native_batch_norm", /*allow_bool=*/true));
  const Tensor& x = *a.inputs[0];
  const float* w = data_or_null(a.inputs[1]);
  const float* b = data_or_null(a.inputs[2]);
  const float* mean = a.inputs[3]->data_as<const float>();
  const float* var = a.inputs[4]->data_as<const float>();
  const double eps = a.attrs.get_float("eps", 1e-5);
  const int64_t n = x.sizes[0], c = x.sizes[1];
  const int64_t inner = c == 0 || n == 0 ? 0 : x.numel() / (n * c);
  const float* px = x.data_as<const float>();
  float* po = a.outputs[0]->data_as<float>();
  parallel_rows(a.pool, n * c, inner, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t ch = row % c;
      const double scale = 1.0 / std::sqrt(static_cast<double>(var[ch]) + eps) * (w ? w[ch] : 1.0);
      const double shift = (b ? b[ch] : 0.0);
      const double m = mean[ch];
      const float* xi = px + row * inner;
      float* yo = po + row * inner;
      for (int64_t i = 0; i < inner; ++i) yo[i] = static_cast<float>((xi[i] - m) * scale + shift);
    }
  });
  return {};
}

// aten.native_layer_norm: per row of prod(normalized_shape) elements, y = (x - mean) * rstd * w + b.
Error layer_norm(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_f32(a, "aten.native_layer_norm", /*allow_bool=*/true));
  const Tensor& x = *a.inputs[0];
  const float* w = data_or_null(a.inputs[1]);
  const float* b = data_or_null(a.inputs[2]);
  const double eps = a.attrs.get_float("eps");
  const int64_t k = numel_of(a.attrs.get_ints("normalized_shape"));
  const int64_t rows = k == 0 ? 0 : x.numel() / k;
  const float* px = x.data_as<const float>();
  float* po = a.outputs[0]->data_as<float>();
  parallel_rows(a.pool, rows, k, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xi = px + r * k;
      float* yo = po + r * k;
      double mean, rstd;
      moments(xi, k, eps, mean, rstd);
      for (int64_t i = 0; i < k; ++i) {
        const double y = (xi[i] - mean) * rstd;
        yo[i] = static_cast<float>(y * (w ? w[i] : 1.0) + (b ? b[i] : 0.0));
      }
    }
  });
  return {};
}

// aten.native_group_norm: for each (n, g), the C/group channels x HxW elements share one mean and
// rstd; then y = (x - mean) * rstd * w[c] + b[c].
Error group_norm(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_f32(a, "aten.native_group_norm", /*allow_bool=*/true));
  const Tensor& x = *a.inputs[0];
  const float* w = data_or_null(a.inputs[1]);
  const float* b = data_or_null(a.inputs[2]);
  const double eps = a.attrs.get_float("eps");
  const int64_t n = a.attrs.get_int("N"), c = a.attrs.get_int("C"), hxw = a.attrs.get_int("HxW");
  const int64_t groups = a.attrs.get_int("group");
  const int64_t cpg = c / groups;  // channels per group
  const float* px = x.data_as<const float>();
  float* po = a.outputs[0]->data_as<float>();
  parallel_rows(a.pool, n * groups, cpg * hxw, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = r % groups;
      const float* xi = px + r * cpg * hxw;
      float* yo = po + r * cpg * hxw;
      double mean, rstd;
      moments(xi, cpg * hxw, eps, mean, rstd);
      for (int64_t ci = 0; ci < cpg; ++ci) {
        const int64_t ch = g * cpg + ci;
        const double scale = rstd * (w ? w[ch] : 1.0);
        const double shift = b ? b[ch] : 0.0;
        for (int64_t i = 0; i < hxw; ++i) {
          yo[ci * hxw + i] = static_cast<float>((xi[ci * hxw + i] - mean) * scale + shift);
        }
      }
    }
  });
  return {};
}

// aten.rms_norm: per row, y = x / sqrt(mean(x^2) + eps) * w; eps None = FLT_EPSILON
// (torch.finfo(torch.float32).eps, as in PyTorch's rms_norm).
Error rms_norm(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_f32(a, "aten.rms_norm", /*allow_bool=*/true));
  const Tensor& x = *a.inputs[0];
  const float* w = data_or_null(a.inputs[1]);
  const double eps = a.attrs.is_none("eps") ? std::numeric_limits<float>::epsilon() : a.attrs.get_float("eps");
  const int64_t k = numel_of(a.attrs.get_ints("normalized_shape"));
  const int64_t rows = k == 0 ? 0 : x.numel() / k;
  const float* px = x.data_as<const float>();
  float* po = a.outputs[0]->data_as<float>();
  parallel_rows(a.pool, rows, k, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xi = px + r * k;
      float* yo = po + r * k;
      double sq = 0.0;
      for (int64_t i = 0; i < k; ++i) sq += static_cast<double>(xi[i]) * xi[i];
      const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(k) + eps);
      for (int64_t i = 0; i < k; ++i) yo[i] = static_cast<float>(xi[i] * rstd * (w ? w[i] : 1.0));
    }
  });
  return {};
}

/// Maps a flat index over the output's batch dims to the element offset of one operand's
/// [rows, cols] matrix: broadcast dims (size 1) repeat; with enable_gqa the head dim (last batch
/// dim) of key/value is indexed by out_head / (out_heads / heads) (repeat_interleave).
class BatchOffsets {
 public:
  BatchOffsets(const std::vector<int64_t>& sizes, const std::vector<int64_t>& out_batch, bool gqa) {
    const size_t rank = sizes.size() - 2;
    const size_t ob = out_batch.size();
    out_batch_ = out_batch;
    stride_.assign(ob, 0);
    div_.assign(ob, 1);
    int64_t stride = sizes.end()[-2] * sizes.back();
    for (size_t k = 0; k < rank; ++k) {
      const size_t i = rank - 1 - k, o = ob - 1 - k;
      const int64_t s = sizes[i];
      if (s != 1) {
        stride_[o] = stride;
        if (gqa && k == 0 && s != out_batch[o]) div_[o] = out_batch[o] / s;
      }
      stride *= s;
    }
  }
  int64_t operator()(int64_t flat) const {
    int64_t off = 0;
    for (size_t d = out_batch_.size(); d-- > 0;) {
      const int64_t c = flat % out_batch_[d];
      flat /= out_batch_[d];
      off += (c / div_[d]) * stride_[d];
    }
    return off;
  }

 private:
  std::vector<int64_t> out_batch_, stride_, div_;
};

// aten.scaled_dot_product_attention: out[b, i] = sum_j softmax_j(scale * q[b,i].k[b,j] + mask) v[b,j].
// Bool masks keep True positions; is_causal keeps j <= i (torch.tril). Rows whose scores are all
// -inf give 0, as PyTorch's _safe_softmax does. dropout_p is 0 (checked by inference).
Error sdpa(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_f32(a, "aten.scaled_dot_product_attention", /*allow_bool=*/true));
  const Tensor& q = *a.inputs[0];
  const Tensor& k = *a.inputs[1];
  const Tensor& v = *a.inputs[2];
  const Tensor* mask = a.inputs[3];
  Tensor& out = *a.outputs[0];
  const bool gqa = a.attrs.get_bool("enable_gqa");
  const bool causal = a.attrs.get_bool("is_causal");
  const int64_t L = q.sizes.end()[-2], E = q.sizes.back(), S = k.sizes.end()[-2], Ev = v.sizes.back();
  const double scale = a.attrs.is_none("scale") ? 1.0 / std::sqrt(static_cast<double>(E)) : a.attrs.get_float("scale");
  const std::vector<int64_t> out_batch(out.sizes.begin(), out.sizes.end() - 2);
  const int64_t nb = numel_of(out_batch);
  const BatchOffsets qo(q.sizes, out_batch, false), ko(k.sizes, out_batch, gqa), vo(v.sizes, out_batch, gqa);

  // The mask broadcasts to out_batch + [L, S]: its offset is linear in (i, j) for a fixed batch.
  std::vector<int64_t> score_shape = out_batch;
  score_shape.push_back(L);
  score_shape.push_back(S);
  int64_t mask_si = 0, mask_sj = 0;
  std::vector<int64_t> mask_base;
  if (mask != nullptr) {
    const int64_t mr = mask->dim();
    if (mr >= 1 && mask->sizes[mr - 1] != 1) mask_sj = 1;
    if (mr >= 2 && mask->sizes[mr - 2] != 1) mask_si = mask->sizes[mr - 1];
    const BroadcastIndex mi(mask->sizes, score_shape);
    try {
      mask_base.resize(static_cast<size_t>(nb));
    } catch (const std::bad_alloc&) {
      return Error(ErrorCode::MemoryAllocationFailed, "aten.scaled_dot_product_attention: scratch");
    }
    for (int64_t bi = 0; bi < nb; ++bi) mask_base[bi] = mi(bi * L * S);
  }
  const float* pq = q.data_as<const float>();
  const float* pk = k.data_as<const float>();
  const float* pv = v.data_as<const float>();
  float* po = out.data_as<float>();
  const bool* mb = mask && mask->dtype == DType::Bool ? mask->data_as<const bool>() : nullptr;
  const float* mf = mask && mask->dtype == DType::Float32 ? mask->data_as<const float>() : nullptr;
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();

  std::atomic<bool> alloc_failed{false};
  parallel_rows(a.pool, nb * L, S * (E + Ev), [&](int64_t begin, int64_t end) {
    std::vector<double> p, acc;
    try {
      p.resize(static_cast<size_t>(S));
      acc.resize(static_cast<size_t>(Ev));
    } catch (const std::bad_alloc&) {
      alloc_failed = true;
      return;
    }
    for (int64_t row = begin; row < end; ++row) {
      const int64_t bi = row / L, i = row % L;
      const float* qi = pq + qo(bi) + i * E;
      const float* kb = pk + ko(bi);
      const float* vb = pv + vo(bi);
      const int64_t moff = mask ? mask_base[bi] + i * mask_si : 0;
      double mx = kNegInf;
      bool all_masked = true;
      for (int64_t j = 0; j < S; ++j) {
        double s;
        if ((causal && j > i) || (mb && !mb[moff + j * mask_sj])) {
          s = kNegInf;
        } else {
          double dot = 0.0;
          const float* kj = kb + j * E;
          for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(qi[e]) * kj[e];
          s = dot * scale;
          if (mf) s += mf[moff + j * mask_sj];
        }
        p[j] = s;
        if (s != kNegInf) all_masked = false;
        if (s > mx) mx = s;
      }
      float* oi = po + row * Ev;
      if (all_masked) {
        for (int64_t e = 0; e < Ev; ++e) oi[e] = 0.0f;
        continue;
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < S; ++j) {
        const double w = std::exp(p[j] - mx);
        sum += w;
        const float* vj = vb + j * Ev;
        for (int64_t e = 0; e < Ev; ++e) acc[e] += w * vj[e];
      }
      for (int64_t e = 0; e < Ev; ++e) oi[e] = static_cast<float>(acc[e] / sum);
    }
  });
  if (alloc_failed) return Error(ErrorCode::MemoryAllocationFailed, "aten.scaled_dot_product_attention: scratch");
  return {};
}

}  // namespace

void register_portable_norm(KernelRegistry& r) {
  r.add("aten.native_batch_norm", batch_norm);
  r.add("aten.native_layer_norm", layer_norm);
  r.add("aten.native_group_norm", group_norm);
  r.add("aten.rms_norm", rms_norm);
  r.add("aten.scaled_dot_product_attention", sdpa);
}

}  // namespace kiln

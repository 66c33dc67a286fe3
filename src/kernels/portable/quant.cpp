// Portable kernels of the weight-only quantized ops (src/ir/ops/quant.h): each output element
// is a double-accumulated dot product of the input with one dequantized weight row. Simple and
// exact; the reference the cpu kernels (src/kernels/cpu/quantized.cpp) are tested against.
#include <vector>

#include "ir/ops/conv.h"
#include "kernels/portable/util.h"
#include "kernels/quantized.h"

namespace kiln {

Result<QuantView> quant_view(const KernelArgs& a, int64_t k) {
  const Tensor* zeros = a.inputs[3];
  const TensorType zt = zeros ? zeros->type() : TensorType{};
  auto layout = quant_layout(a.inputs[1]->type(), a.inputs[2]->type(), zeros ? &zt : nullptr, k, a.attrs);
  if (!layout.ok()) return layout.error();
  QuantView v;
  v.layout = layout.value();
  v.data = a.inputs[1]->data_as<const uint8_t>();
  v.scales = a.inputs[2]->data;
  v.zeros = zeros ? zeros->data : nullptr;
  return v;
}

namespace {

/// quant_linear_reference with activation_bits = 8 (src/ir/ops/quant.h): per block the exact
/// integer sums sum_c wq q and sum_c q, then d * (s * S1 + z * S2) summed over blocks in double.
void quant_linear_reference_a8(const QuantView& w, const float* x, const float* bias, int64_t m, float* out) {
  const QuantLayout& L = w.layout;
  const int64_t k = L.k, n = L.rows, B = k / kActivationBlock;
  std::vector<int8_t> q(static_cast<size_t>(k));
  std::vector<float> d(static_cast<size_t>(B));
  std::vector<int32_t> qsum(static_cast<size_t>(B));
  for (int64_t i = 0; i < m; ++i) {
    quantize_activation_row(x + i * k, k, q.data(), d.data(), qsum.data());
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* row = w.data + j * L.row_bytes;
      double acc = bias ? static_cast<double>(bias[j]) : 0.0;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t g = b * kActivationBlock / L.group_size;
        int64_t s1 = 0;
        for (int64_t c = b * kActivationBlock; c < (b + 1) * kActivationBlock; ++c) {
          const int64_t wq = L.bits == 8 ? static_cast<int8_t>(row[c]) : static_cast<int64_t>((row[c >> 1] >> ((c & 1) * 4)) & 0xF) - 8;
          s1 += wq * q[static_cast<size_t>(c)];
        }
        acc += static_cast<double>(d[static_cast<size_t>(b)]) *
               (static_cast<double>(w.scale(j, g)) * static_cast<double>(s1) +
                static_cast<double>(w.zero(j, g)) * static_cast<double>(qsum[static_cast<size_t>(b)]));
      }
      out[i * n + j] = static_cast<float>(acc);
    }
  }
}

}  // namespace

void quant_linear_reference(const QuantView& w, const float* x, const float* bias, int64_t m, float* out) {
  if (w.layout.activation_bits == 8) {
    quant_linear_reference_a8(w, x, bias, m, out);
    return;
  }
  const int64_t k = w.layout.k, n = w.layout.rows;
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    w.dequantize(j, 0, k, row.data());
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * k;
      double acc = 0.0;
      for (int64_t p = 0; p < k; ++p) acc += static_cast<double>(xi[p]) * static_cast<double>(row[static_cast<size_t>(p)]);
      if (bias) acc += static_cast<double>(bias[j]);
      out[i * n + j] = static_cast<float>(acc);
    }
  }
}

namespace {

/// kiln.weight_quantized_linear: input [..., K] -> [..., N].
Error linear(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const int64_t k = x.sizes.back();
  auto w = quant_view(a, k);
  if (!w.ok()) return w.error();
  const int64_t m = k == 0 ? 0 : x.numel() / k;
  quant_linear_reference(w.value(), x.data_as<const float>(), data_or_null(a.inputs[4]), m, a.outputs[0]->data_as<float>());
  return {};
}

/// kiln.weight_quantized_convolution: direct convolution with one dequantized weight row
/// [C_in/groups * kH * kW] per output channel.
Error convolution(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const std::vector<int64_t> ks = a.attrs.get_ints("kernel_size");
  const int64_t groups = a.attrs.get_int("groups", 1);
  const int64_t cin_g = x.sizes[1] / groups;
  auto w = quant_view(a, cin_g * ks[0] * ks[1]);
  if (!w.ok()) return w.error();
  const TensorType dense{DType::Float32, {w->layout.rows, cin_g, ks[0], ks[1]}};
  const Tensor* b = a.inputs[4];
  const TensorType bt = b ? b->type() : TensorType{};
  Attributes ca{{"stride", a.attrs.get_ints("stride")}, {"padding", a.attrs.get_ints("padding")},
                {"dilation", a.attrs.get_ints("dilation")}, {"transposed", false},
                {"output_padding", std::vector<int64_t>{0}}, {"groups", groups}};
  auto geo = conv_geometry(x.type(), dense, b ? &bt : nullptr, ca);
  if (!geo.ok()) return geo.error();
  const ConvGeometry& g = geo.value();
  const int64_t cout_g = g.out_channels / groups;
  const int64_t H = g.in_size[0], W = g.in_size[1], OH = g.out_size[0], OW = g.out_size[1];
  const int64_t KH = g.kernel[0], KW = g.kernel[1];
  const float* in = x.data_as<const float>();
  const float* bias = data_or_null(b);
  float* out = a.outputs[0]->data_as<float>();
  std::vector<float> row(static_cast<size_t>(w->layout.k));
  for (int64_t oc = 0; oc < g.out_channels; ++oc) {
    w->dequantize(oc, 0, w->layout.k, row.data());
    const int64_t grp = oc / cout_g;
    for (int64_t nb = 0; nb < g.batch; ++nb) {
      const float* xin = in + (nb * g.in_channels + grp * cin_g) * H * W;
      float* o = out + (nb * g.out_channels + oc) * OH * OW;
      for (int64_t oy = 0; oy < OH; ++oy) {
        for (int64_t ox = 0; ox < OW; ++ox) {
          double acc = bias ? static_cast<double>(bias[oc]) : 0.0;
          for (int64_t c = 0; c < cin_g; ++c) {
            for (int64_t ky = 0; ky < KH; ++ky) {
              const int64_t iy = oy * g.stride[0] - g.padding[0] + ky * g.dilation[0];
              if (iy < 0 || iy >= H) continue;
              for (int64_t kx = 0; kx < KW; ++kx) {
                const int64_t ix = ox * g.stride[1] - g.padding[1] + kx * g.dilation[1];
                if (ix < 0 || ix >= W) continue;
                acc += static_cast<double>(xin[(c * H + iy) * W + ix]) *
                       static_cast<double>(row[static_cast<size_t>((c * KH + ky) * KW + kx)]);
              }
            }
          }
          o[oy * OW + ox] = static_cast<float>(acc);
        }
      }
    }
  }
  return {};
}

template <typename I>
Error gather_dequantized(const QuantView& w, const I* idx, int64_t count, float* out) {
  const int64_t k = w.layout.k;
  for (int64_t i = 0; i < count; ++i) {
    const auto v = static_cast<int64_t>(idx[i]);
    if (v < 0 || v >= w.layout.rows) {
      return Error(ErrorCode::InvalidArgument, "kiln.weight_quantized_embedding: index " + std::to_string(v) +
                                                   " (at flat position " + std::to_string(i) +
                                                   ") is out of range for a table of " + std::to_string(w.layout.rows) +
                                                   " rows");
    }
    w.dequantize(v, 0, k, out + i * k);
  }
  return {};
}

/// kiln.weight_quantized_embedding: out[i..., :] = dequantize(weight)[indices[i...], :], one row
/// dequantized per index (float32 arithmetic of QuantView::dequantize); every index is checked
/// before its row is read. Fast enough for every target: it touches one row per token.
Error embedding(const KernelArgs& a) {
  const Tensor& idx = *a.inputs[0];
  auto w = quant_view(a, a.attrs.get_int("embedding_dim", 0));
  if (!w.ok()) return w.error();
  float* out = a.outputs[0]->data_as<float>();
  if (idx.dtype == DType::Int64) return gather_dequantized(w.value(), idx.data_as<const int64_t>(), idx.numel(), out);
  if (idx.dtype == DType::Int32) return gather_dequantized(w.value(), idx.data_as<const int32_t>(), idx.numel(), out);
  return Error(ErrorCode::NotSupported, "kiln.weight_quantized_embedding: indices must be int64 or int32");
}

}  // namespace

void register_portable_quant(KernelRegistry& r) {
  r.add("kiln.weight_quantized_linear", linear);
  r.add("kiln.weight_quantized_convolution", convolution);
  r.add("kiln.weight_quantized_embedding", embedding);
}

}  // namespace kiln

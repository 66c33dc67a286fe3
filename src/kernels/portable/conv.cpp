// Portable conv kernels: direct (gather) convolution, one output element at a time with
// double accumulation, so results are the exactly rounded sums that eager fp32 approximates.
#include "ir/ops/conv.h"
#include "kernels/kernel.h"

namespace kiln {
namespace {

/// aten.convolution, float32, NCL / NCHW (see conv_geometry for shapes and the size formula).
/// Regular:    out[n, oc, oh, ow] = bias[oc] + sum_{ic in group, kh, kw}
///               x[n, ic, oh*s - p + kh*d, ow*s - p + kw*d] * w[oc, ic - g*Cin_g, kh, kw]
/// Transposed: out[n, oc, oh, ow] = bias[oc] + sum over ic in group and (ih, kh) with
///               oh = ih*s - p + kh*d (likewise for w) of x[n, ic, ih, iw] * w[ic, oc - g*Cout_g, kh, kw]
/// (the adjoint of the regular convolution, as torch.nn.functional.conv_transpose2d).
Error convolution(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const Tensor& w = *a.inputs[1];
  const Tensor* b = a.inputs[2];
  Tensor& out = *a.outputs[0];
  TensorType bias_type;
  if (b != nullptr) bias_type = b->type();
  auto geo = conv_geometry(x.type(), w.type(), b != nullptr ? &bias_type : nullptr, a.attrs);
  if (!geo.ok()) return Error(geo.error().code(), "aten.convolution: " + geo.error().message());
  const ConvGeometry& g = geo.value();

  const float* px = x.data_as<float>();
  const float* pw = w.data_as<float>();
  const float* pb = b != nullptr ? b->data_as<float>() : nullptr;
  float* po = out.data_as<float>();

  const int64_t IH = g.in_size[0], IW = g.in_size[1];
  const int64_t OH = g.out_size[0], OW = g.out_size[1];
  const int64_t KH = g.kernel[0], KW = g.kernel[1];
  const int64_t SH = g.stride[0], SW = g.stride[1];
  const int64_t PH = g.padding[0], PW = g.padding[1];
  const int64_t DH = g.dilation[0], DW = g.dilation[1];
  const int64_t cin_g = g.in_channels / g.groups;
  const int64_t cout_g = g.out_channels / g.groups;

  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t oc = 0; oc < g.out_channels; ++oc) {
      const int64_t grp = oc / cout_g;
      const int64_t ocl = oc - grp * cout_g;  // channel within its group
      float* orow = po + (n * g.out_channels + oc) * OH * OW;
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = pb != nullptr ? static_cast<double>(pb[oc]) : 0.0;
          for (int64_t icl = 0; icl < cin_g; ++icl) {
            const int64_t ic = grp * cin_g + icl;
            const float* xplane = px + (n * g.in_channels + ic) * IH * IW;
            // weight [C_out, C_in/g, KH, KW] or, transposed, [C_in, C_out/g, KH, KW]
            const float* wk = g.transposed ? pw + (ic * cout_g + ocl) * KH * KW : pw + (oc * cin_g + icl) * KH * KW;
            for (int64_t kh = 0; kh < KH; ++kh) {
              int64_t ih;
              if (!g.transposed) {
                ih = oh * SH - PH + kh * DH;
              } else {
                const int64_t t = oh + PH - kh * DH;  // = ih * SH
                if (t < 0 || t % SH != 0) continue;
                ih = t / SH;
              }
              if (ih < 0 || ih >= IH) continue;
              for (int64_t kw = 0; kw < KW; ++kw) {
                int64_t iw;
                if (!g.transposed) {
                  iw = ow * SW - PW + kw * DW;
                } else {
                  const int64_t t = ow + PW - kw * DW;
                  if (t < 0 || t % SW != 0) continue;
                  iw = t / SW;
                }
                if (iw < 0 || iw >= IW) continue;
                acc += static_cast<double>(xplane[ih * IW + iw]) * static_cast<double>(wk[kh * KW + kw]);
              }
            }
          }
          orow[oh * OW + ow] = static_cast<float>(acc);
        }
      }
    }
  }
  return {};
}

}  // namespace

void register_portable_conv(KernelRegistry& r) { r.add("aten.convolution", convolution); }

}  // namespace kiln

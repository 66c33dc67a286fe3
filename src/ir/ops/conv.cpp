// conv op definitions: aten.convolution (1-D and 2-D, transposed, grouped, dilated).
#include "ir/ops/conv.h"

#include "ir/op_registry.h"
#include "ir/ops/spatial.h"

namespace kiln {
namespace {

Error invalid(std::string msg) { return Error(ErrorCode::InvalidArgument, std::move(msg)); }

Result<std::vector<TensorType>> infer_convolution(InputTypes in, const Attributes& attrs) {
  auto g = conv_geometry(*in[0], *in[1], in[2], attrs);
  if (!g.ok()) return g.error();
  std::vector<int64_t> sizes = {g->batch, g->out_channels};
  if (g->spatial_dims == 2) sizes.push_back(g->out_size[0]);
  sizes.push_back(g->out_size[1]);
  return std::vector<TensorType>{{DType::Float32, std::move(sizes)}};
}

}  // namespace

Result<ConvGeometry> conv_geometry(const TensorType& input, const TensorType& weight, const TensorType* bias,
                                   const Attributes& attrs) {
  for (const TensorType* t : {&input, &weight, bias}) {
    if (t != nullptr && t->dtype != DType::Float32) {
      return Error(ErrorCode::NotSupported, std::string("dtype ") + dtype_name(t->dtype) + " (float32 only)");
    }
  }
  if (weight.dim() < 3) {
    return invalid("weight should have at least three dimensions, got weight of size " + sizes_to_string(weight.sizes));
  }
  if (weight.dim() > 4) {
    return Error(ErrorCode::NotSupported, "only 1-D and 2-D convolutions are supported, got weight of size " +
                                              sizes_to_string(weight.sizes));
  }
  if (input.dim() != weight.dim()) {
    return invalid("expected " + std::to_string(weight.dim()) + "-D input for " + std::to_string(weight.dim()) +
                   "-D weight " + sizes_to_string(weight.sizes) + ", got input of size " + sizes_to_string(input.sizes));
  }
  ConvGeometry g;
  g.spatial_dims = weight.dim() - 2;
  const size_t n = static_cast<size_t>(g.spatial_dims);
  g.transposed = attrs.get_bool("transposed");
  g.groups = attrs.get_int("groups", 1);
  if (g.groups < 1) return invalid("groups must be positive, got groups=" + std::to_string(g.groups));
  if (g.groups > kMaxSpatialParam) return invalid("groups out of range, got groups=" + std::to_string(g.groups));

  auto stride = spatial_param(attrs, "stride", n, 1);
  if (!stride.ok()) return stride.error();
  auto padding = spatial_param(attrs, "padding", n, 0);
  if (!padding.ok()) return padding.error();
  auto dilation = spatial_param(attrs, "dilation", n, 1);
  if (!dilation.ok()) return dilation.error();
  auto output_padding = spatial_param(attrs, "output_padding", n, 0);
  if (!output_padding.ok()) return output_padding.error();

  g.batch = input.sizes[0];
  g.in_channels = input.sizes[1];
  const int64_t w0 = weight.sizes[0];
  const int64_t w1 = weight.sizes[1];
  const std::string gs = "groups=" + std::to_string(g.groups);
  if (!g.transposed) {
    // weight [C_out, C_in / groups, k...]
    if (w0 % g.groups != 0) {
      return invalid(gs + " does not divide the weight's output channels " + std::to_string(w0) + " (weight " +
                     sizes_to_string(weight.sizes) + ")");
    }
    if (g.in_channels % g.groups != 0) {
      return invalid(gs + " does not divide the input channels " + std::to_string(g.in_channels));
    }
    if (static_cast<__int128>(w1) * g.groups != g.in_channels) {
      return invalid("weight of size " + sizes_to_string(weight.sizes) + " with " + gs + " expects " +
                     std::to_string(w1) + " * " + std::to_string(g.groups) + " input channels, got input of size " +
                     sizes_to_string(input.sizes));
    }
    g.out_channels = w0;
  } else {
    // weight [C_in, C_out / groups, k...]
    if (w0 != g.in_channels) {
      return invalid("transposed weight of size " + sizes_to_string(weight.sizes) + " expects " + std::to_string(w0) +
                     " input channels, got input of size " + sizes_to_string(input.sizes));
    }
    if (g.in_channels % g.groups != 0) {
      return invalid(gs + " does not divide the input channels " + std::to_string(g.in_channels));
    }
    if (static_cast<__int128>(w1) * g.groups > kMaxSpatialSize) {
      return invalid("transposed weight of size " + sizes_to_string(weight.sizes) + " with " + gs +
                     " gives too many output channels");
    }
    g.out_channels = w1 * g.groups;
  }
  if (bias != nullptr && (bias->dim() != 1 || bias->sizes[0] != g.out_channels)) {
    return invalid("bias must have shape [" + std::to_string(g.out_channels) + "], got " +
                   sizes_to_string(bias->sizes));
  }

  bool empty_spatial = false;
  for (int64_t i = 2; i < input.dim(); ++i) empty_spatial = empty_spatial || input.sizes[i] == 0;
  if (empty_spatial && g.batch != 0 && g.in_channels != 0) {
    // PyTorch's rule: only a zero batch or zero channels may make the input empty.
    return invalid("only zero batch or zero channel inputs are supported, got input of size " +
                   sizes_to_string(input.sizes));
  }
  const size_t off = 2 - n;  // 1-D convs fill index 1 (W) only
  for (size_t i = 0; i < n; ++i) {
    const size_t d = off + i;
    g.in_size[d] = input.sizes[2 + i];
    g.kernel[d] = weight.sizes[2 + i];
    g.stride[d] = (*stride)[i];
    g.padding[d] = (*padding)[i];
    g.dilation[d] = (*dilation)[i];
    g.output_padding[d] = g.transposed ? (*output_padding)[i] : 0;  // PyTorch ignores it when not transposed
    if (g.kernel[d] < 1) return invalid("weight has an empty spatial dim: " + sizes_to_string(weight.sizes));
    if (g.kernel[d] > kMaxSpatialParam) return invalid("weight spatial size out of range: " + sizes_to_string(weight.sizes));
    const __int128 in = g.in_size[d], k = g.kernel[d], s = g.stride[d], p = g.padding[d], dil = g.dilation[d];
    __int128 out;
    if (!g.transposed) {
      const __int128 padded = in + 2 * p;
      const __int128 extent = dil * (k - 1) + 1;
      if (padded < extent) {
        return invalid("kernel size can't be greater than the padded input size: input " + sizes_to_string(input.sizes) +
                       ", weight " + sizes_to_string(weight.sizes) + ", padding " + std::to_string(g.padding[d]) +
                       ", dilation " + std::to_string(g.dilation[d]));
      }
      out = (padded - extent) / s + 1;
    } else {
      if (g.output_padding[d] >= g.stride[d] && g.output_padding[d] >= g.dilation[d]) {
        return invalid("output_padding must be smaller than either stride or dilation, got output_padding=" +
                       std::to_string(g.output_padding[d]) + ", stride=" + std::to_string(g.stride[d]) +
                       ", dilation=" + std::to_string(g.dilation[d]));
      }
      out = (in - 1) * s - 2 * p + dil * (k - 1) + g.output_padding[d] + 1;
    }
    // PyTorch: "Output size is too small" (its grouped transposed path alone returns an empty
    // tensor for 0; Kiln rejects 0 everywhere).
    if (out < 1) {
      return invalid("calculated output size " + std::to_string(static_cast<long long>(out)) +
                     " is too small (input " + sizes_to_string(input.sizes) + ", weight " +
                     sizes_to_string(weight.sizes) + ")");
    }
    if (out > kMaxSpatialSize) return invalid("calculated output size is too large");
    g.out_size[d] = static_cast<int64_t>(out);
  }
  return g;
}

void register_conv_ops(OpRegistry& r) {
  r.add({"aten.convolution",
         {{"input"}, {"weight"}, {"bias", true}},
         {{"stride", AttrKind::Ints, {}, true},
          {"padding", AttrKind::Ints, {}, true},
          {"dilation", AttrKind::Ints, {}, true},
          {"transposed", AttrKind::Bool, {}, true},
          {"output_padding", AttrKind::Ints, {}, true},
          {"groups", AttrKind::Int, {}, true}},
         1, infer_convolution,
         "1-D/2-D convolution or transposed convolution, NCL/NCHW, grouped and dilated (torch.ops.aten.convolution)"});
}

}  // namespace kiln

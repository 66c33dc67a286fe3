// Weight-only quantized op definitions: kiln.weight_quantized_linear,
// kiln.weight_quantized_convolution and kiln.weight_quantized_embedding (layout and dequantization formula: src/ir/ops/quant.h).
#include "ir/ops/quant.h"

#include "ir/op_registry.h"
#include "ir/ops/conv.h"
#include "ir/ops/shape_rules.h"
#include "ir/ops/spatial.h"

namespace kiln {
namespace {

namespace sr = shape_rules;

Error invalid(std::string msg) { return Error(ErrorCode::InvalidArgument, std::move(msg)); }

// kiln.weight_quantized_linear(input [..., K], weight, scales, zeros?, bias? [N]) -> [..., N].
Result<std::vector<TensorType>> infer_linear(InputTypes in, const Attributes& attrs) {
  const TensorType& x = *in[0];
  if (x.dtype != DType::Float32) return Error(ErrorCode::NotSupported, std::string("input dtype ") + dtype_name(x.dtype) + " (float32 only)");
  if (x.dim() < 1) return invalid("input must have at least one dimension");
  auto q = quant_layout(*in[1], *in[2], in[3], x.sizes.back(), attrs);
  if (!q.ok()) return q.error();
  if (in[4] != nullptr && (in[4]->dtype != DType::Float32 || in[4]->sizes != std::vector<int64_t>{q->rows})) {
    return invalid("bias must be float32[" + std::to_string(q->rows) + "], got " + in[4]->to_string());
  }
  std::vector<int64_t> out = x.sizes;
  out.back() = q->rows;
  return std::vector<TensorType>{{DType::Float32, std::move(out)}};
}

// kiln.weight_quantized_convolution(input [N, C_in, H, W], weight, scales, zeros?, bias? [C_out])
// -> [N, C_out, H_out, W_out], as aten.convolution with the dequantized weight
// [C_out, C_in/groups, kernel_size[0], kernel_size[1]].
Result<std::vector<TensorType>> infer_conv(InputTypes in, const Attributes& attrs) {
  const TensorType& x = *in[0];
  if (x.dim() != 4) return Error(ErrorCode::NotSupported, "only 2-D convolutions (input [N, C, H, W]), got input " + x.to_string());
  const std::vector<int64_t> ks = attrs.get_ints("kernel_size");
  if (ks.size() != 2) return invalid("kernel_size must have 2 values");
  for (int64_t v : ks) {
    if (v < 1 || v > 4096) return invalid("kernel_size values must lie in [1, 4096], got " + std::to_string(v));
  }
  const int64_t groups = attrs.get_int("groups", 1);
  if (groups < 1 || groups > kMaxSpatialParam || x.sizes[1] % groups != 0) {
    return invalid("groups=" + std::to_string(groups) + " must be positive and divide the input channels " +
                   std::to_string(x.sizes[1]));
  }
  const int64_t cin_g = x.sizes[1] / groups;
  if (cin_g < 1) return invalid("input has no channels");
  if (in[1]->dim() != 2) return invalid("weight must be 2-D [C_out, packed row bytes], got " + in[1]->to_string());
  const TensorType dense{DType::Float32, {in[1]->sizes[0], cin_g, ks[0], ks[1]}};
  auto g = conv_geometry(x, dense, in[4], quantized_conv_attrs(attrs));
  if (!g.ok()) return g.error();
  auto q = quant_layout(*in[1], *in[2], in[3], cin_g * ks[0] * ks[1], attrs);
  if (!q.ok()) return q.error();
  return std::vector<TensorType>{{DType::Float32, {g->batch, g->out_channels, g->out_size[0], g->out_size[1]}}};
}

// kiln.weight_quantized_embedding(indices, weight, scales, zeros?; bits, group_size, embedding_dim)
// -> indices.shape + [embedding_dim]: aten.embedding(dequantize(weight, scales, zeros), indices), the
// table quantized row by row as a linear weight [V, embedding_dim] is (a tied output projection
// reads the same constants).
Result<std::vector<TensorType>> infer_embedding(InputTypes in, const Attributes& attrs) {
  const TensorType& idx = *in[0];
  if (idx.dtype != DType::Int64 && idx.dtype != DType::Int32) {
    return invalid(std::string("indices must be int64 or int32, got ") + dtype_name(idx.dtype));
  }
  const int64_t d = attrs.get_int("embedding_dim", 0);
  if (d < 1) return invalid("embedding_dim must be >= 1, got " + std::to_string(d));
  auto q = quant_layout(*in[1], *in[2], in[3], d, attrs);
  if (!q.ok()) return q.error();
  std::vector<int64_t> out = idx.sizes;
  out.push_back(d);
  auto n = sr::checked_numel(out);
  if (!n.ok()) return n.error();
  return std::vector<TensorType>{{DType::Float32, std::move(out)}};
}

}  // namespace

Attributes quantized_conv_attrs(const Attributes& attrs) {
  return Attributes{{"stride", attrs.get_ints("stride")},
                    {"padding", attrs.get_ints("padding")},
                    {"dilation", attrs.get_ints("dilation")},
                    {"transposed", false},
                    {"output_padding", std::vector<int64_t>{0}},
                    {"groups", attrs.get_int("groups", 1)}};
}

Result<QuantLayout> quant_layout(const TensorType& weight, const TensorType& scales, const TensorType* zeros, int64_t k,
                                 const Attributes& attrs) {
  QuantLayout q;
  const int64_t bits = attrs.get_int("bits", 8);
  if (bits != 4 && bits != 8) return invalid("bits must be 4 or 8, got " + std::to_string(bits));
  q.bits = static_cast<int>(bits);
  if (k < 1) return invalid("the reduction dimension is empty");
  const int64_t gs = attrs.get_int("group_size", 0);
  if (gs < 0) return invalid("group_size must be >= 0 (0 = per channel), got " + std::to_string(gs));
  q.k = k;
  q.group_size = (gs == 0 || gs > k) ? k : gs;
  q.num_groups = (k + q.group_size - 1) / q.group_size;
  q.row_bytes = q.bits == 8 ? k : (k + 1) / 2;
  const DType wdt = q.bits == 8 ? DType::Int8 : DType::UInt8;
  if (weight.dtype != wdt || weight.dim() != 2 || weight.sizes[1] != q.row_bytes || weight.sizes[0] < 1) {
    return invalid(std::string("weight must be ") + dtype_name(wdt) + "[N, " + std::to_string(q.row_bytes) + "] for bits=" +
                   std::to_string(bits) + " and " + std::to_string(k) + " reduction elements, got " + weight.to_string());
  }
  q.rows = weight.sizes[0];
  if (scales.dtype != DType::Float32 && scales.dtype != DType::Float16) {
    return invalid("scales must be float32 or float16, got " + scales.to_string());
  }
  q.scale_dtype = scales.dtype;
  const std::vector<int64_t> sshape = {q.rows, q.num_groups};
  if (scales.sizes != sshape) {
    return invalid("scales must have shape " + sizes_to_string(sshape) + " (rows, ceil(" + std::to_string(k) + " / group_size " +
                   std::to_string(q.group_size) + ")), got " + scales.to_string());
  }
  if (zeros != nullptr) {
    if (q.bits != 4) return invalid("zeros are only defined for bits=4 (8-bit is symmetric)");
    if (zeros->dtype != scales.dtype || zeros->sizes != sshape) {
      return invalid("zeros must match scales (" + scales.to_string() + "), got " + zeros->to_string());
    }
    q.has_zeros = true;
  }
  const int64_t abits = attrs.get_int("activation_bits", 0);
  if (abits != 0 && abits != 8) return invalid("activation_bits must be 0 (float32) or 8, got " + std::to_string(abits));
  if (abits == 8 && (k % kActivationBlock != 0 || q.group_size % kActivationBlock != 0)) {
    return invalid("activation_bits=8 needs the reduction length (" + std::to_string(k) + ") and the group size (" +
                   std::to_string(q.group_size) + ") to be multiples of " + std::to_string(kActivationBlock));
  }
  q.activation_bits = static_cast<int>(abits);
  return q;
}

void register_quant_ops(OpRegistry& r) {
  r.add({"kiln.weight_quantized_linear",
         {{"input"}, {"weight"}, {"scales"}, {"zeros", true}, {"bias", true}},
         {{"bits", AttrKind::Int, {}, true},
          {"group_size", AttrKind::Int, int64_t{0}},
          {"activation_bits", AttrKind::Int, int64_t{0}}},
         1, infer_linear,
         "aten.linear(input, dequantize(weight, scales, zeros), bias) with a quantized weight [N, K] (layout and "
         "formula: src/ir/ops/quant.h); float32 input and output; activation_bits=8: the input quantized to int8 "
         "in blocks of 32 columns and multiplied in integers (src/ir/ops/quant.h)"});
  r.add({"kiln.weight_quantized_convolution",
         {{"input"}, {"weight"}, {"scales"}, {"zeros", true}, {"bias", true}},
         {{"bits", AttrKind::Int, {}, true},
          {"group_size", AttrKind::Int, int64_t{0}},
          {"kernel_size", AttrKind::Ints, {}, true},
          {"stride", AttrKind::Ints, std::vector<int64_t>{1}},
          {"padding", AttrKind::Ints, std::vector<int64_t>{0}},
          {"dilation", AttrKind::Ints, std::vector<int64_t>{1}},
          {"groups", AttrKind::Int, int64_t{1}}},
         1, infer_conv,
         "aten.convolution (2-D, not transposed) with the dequantized weight [C_out, C_in/groups, kernel_size...] "
         "of a weight-only quantized [C_out, K] weight (src/ir/ops/quant.h); float32 input and output"});
  r.add({"kiln.weight_quantized_embedding",
         {{"indices"}, {"weight"}, {"scales"}, {"zeros", true}},
         {{"bits", AttrKind::Int, {}, true},
          {"group_size", AttrKind::Int, int64_t{0}},
          {"embedding_dim", AttrKind::Int, {}, true}},
         1, infer_embedding,
         "aten.embedding(dequantize(weight, scales, zeros), indices) with a table [V, embedding_dim] quantized "
         "row by row (layout and formula: src/ir/ops/quant.h); int64/int32 indices of any shape -> "
         "indices.shape + [embedding_dim] float32; indices out of [0, V) are InvalidArgument at run time"});
}

}  // namespace kiln

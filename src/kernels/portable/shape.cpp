// Portable shape / data-movement kernels. Every op writes a new contiguous output and works for
// every Kiln dtype by copying elements as bytes (dtype_size). Sizes, strides and offsets come
// from shape_rules.h, the same functions the ops' inference uses; each kernel still checks that
// they agree with the output it was given and returns Internal otherwise (never a stray write).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ir/op_registry.h"
#include "ir/ops/shape_rules.h"
#include "kernels/kernel.h"
#include "kernels/strided_copy.h"

namespace kiln {
namespace {

namespace sr = shape_rules;

Error mismatch(const char* op, const Tensor& out, const std::vector<int64_t>& sizes) {
  return Error(ErrorCode::Internal, std::string(op) + ": output " + out.type().to_string() +
                                        " does not match the computed sizes " + sizes_to_string(sizes));
}

// Materializes the strided view `v` of `in` into the contiguous `out` (sizes must equal v.sizes).
Error copy_view(const char* op, const Tensor& in, const sr::StridedView& v, Tensor& out) {
  if (out.sizes != v.sizes || out.dtype != in.dtype) return mismatch(op, out, v.sizes);
  const int64_t n = out.numel();
  if (n == 0) return {};
  const size_t es = dtype_size(in.dtype);
  const auto* src = static_cast<const uint8_t*>(in.data) + v.offset * static_cast<int64_t>(es);
  auto* dst = static_cast<uint8_t*>(out.data);
  const size_t rank = v.sizes.size();
  if (rank == 0) {
    std::memcpy(dst, src, es);
    return {};
  }
  copy_view_rows(src, v, es, dst, 0, n / v.sizes[rank - 1]);
  return {};
}

Error run_view_result(const char* op, const Tensor& in, Result<sr::StridedView> v, Tensor& out) {
  if (!v.ok()) return Error(v.error().code(), std::string(op) + ": " + v.error().message());
  return copy_view(op, in, v.value(), out);
}

// view / squeeze / unsqueeze: same elements in the same order, new sizes. Nothing to copy when
// the planner gave the output its input's bytes (a zero-copy view: is_byte_view).
Error copy_same_order(const char* op, const Tensor& in, Result<std::vector<int64_t>> sizes, Tensor& out) {
  if (!sizes.ok()) return Error(sizes.error().code(), std::string(op) + ": " + sizes.error().message());
  if (out.sizes != sizes.value() || out.dtype != in.dtype || out.nbytes() != in.nbytes()) {
    return mismatch(op, out, sizes.value());
  }
  if (out.nbytes() > 0 && out.data != in.data) std::memcpy(out.data, in.data, out.nbytes());
  return {};
}

std::optional<int64_t> optional_int(const Attributes& a, const char* name) {
  if (a.is_none(name)) return std::nullopt;
  return a.get_int(name);
}

Error view(const KernelArgs& a) {
  return copy_same_order("aten.view", *a.inputs[0], sr::view_sizes(a.inputs[0]->numel(), a.attrs.get_ints("size")),
                         *a.outputs[0]);
}

Error squeeze(const KernelArgs& a) {
  std::optional<std::vector<int64_t>> dims;
  if (!a.attrs.is_none("dim")) dims = a.attrs.get_ints("dim");
  return copy_same_order("aten.squeeze", *a.inputs[0], sr::squeeze_sizes(a.inputs[0]->sizes, dims), *a.outputs[0]);
}

Error unsqueeze(const KernelArgs& a) {
  return copy_same_order("aten.unsqueeze", *a.inputs[0], sr::unsqueeze_sizes(a.inputs[0]->sizes, a.attrs.get_int("dim")),
                         *a.outputs[0]);
}

Error permute(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  return run_view_result("aten.permute", x, sr::permute_view(x.sizes, a.attrs.get_ints("dims")), *a.outputs[0]);
}

Error transpose(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  return run_view_result("aten.transpose", x,
                         sr::transpose_view(x.sizes, a.attrs.get_int("dim0"), a.attrs.get_int("dim1")), *a.outputs[0]);
}

Error expand(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  return run_view_result("aten.expand", x, sr::expand_view(x.sizes, a.attrs.get_ints("size")), *a.outputs[0]);
}

Error slice(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  return run_view_result("aten.slice", x,
                         sr::slice_view(x.sizes, a.attrs.get_int("dim"), optional_int(a.attrs, "start"),
                                        optional_int(a.attrs, "end"), a.attrs.get_int("step")),
                         *a.outputs[0]);
}

Error select(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  return run_view_result("aten.select", x, sr::select_view(x.sizes, a.attrs.get_int("dim"), a.attrs.get_int("index")),
                         *a.outputs[0]);
}

// torch.cat: out = [t_0 | t_1 | ...] along dim. Inputs with no elements contribute nothing
// (this covers the legacy 1-D [0] inputs that inference skips).
Error cat(const KernelArgs& a) {
  Tensor& out = *a.outputs[0];
  const int64_t rank = out.dim();
  auto d = wrap_dim(a.attrs.get_int("dim"), rank);
  if (!d.ok() || rank == 0) return Error(ErrorCode::Internal, "aten.cat: dim does not fit the output");
  const size_t es = dtype_size(out.dtype);
  const auto k = static_cast<size_t>(*d);
  int64_t outer = 1;
  for (size_t i = 0; i < k; ++i) outer *= out.sizes[i];
  int64_t inner = 1;  // elements after dim
  for (size_t i = k + 1; i < out.sizes.size(); ++i) inner *= out.sizes[i];
  const int64_t out_row = out.sizes[k] * inner * static_cast<int64_t>(es);  // bytes per outer index
  int64_t filled = 0;                                                        // dim-k extent written so far
  for (const Tensor* t : a.inputs) {
    if (t->dtype != out.dtype) return Error(ErrorCode::Internal, "aten.cat: input dtype differs from the output's");
    if (t->numel() == 0) continue;
    if (t->dim() != rank) return Error(ErrorCode::Internal, "aten.cat: input rank differs from the output's");
    for (size_t i = 0; i < out.sizes.size(); ++i) {
      if (i != k && t->sizes[i] != out.sizes[i]) return Error(ErrorCode::Internal, "aten.cat: input sizes differ");
    }
    const int64_t extent = t->sizes[k];
    if (filled + extent > out.sizes[k]) return Error(ErrorCode::Internal, "aten.cat: inputs exceed the output");
    const int64_t row = extent * inner * static_cast<int64_t>(es);
    const auto* src = static_cast<const uint8_t*>(t->data);
    auto* dst = static_cast<uint8_t*>(out.data) + filled * inner * static_cast<int64_t>(es);
    for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + o * out_row, src + o * row, static_cast<size_t>(row));
    filled += extent;
  }
  if (filled != out.sizes[k] && out.numel() != 0) return Error(ErrorCode::Internal, "aten.cat: inputs do not fill the output");
  return {};
}

template <typename I>
Error gather_rows(const Tensor& w, const Tensor& idx, Tensor& out) {
  const int64_t num = w.sizes[0];
  const size_t row = static_cast<size_t>(w.sizes[1]) * dtype_size(w.dtype);
  const I* ip = idx.data_as<const I>();
  const auto* src = static_cast<const uint8_t*>(w.data);
  auto* dst = static_cast<uint8_t*>(out.data);
  for (int64_t i = 0, n = idx.numel(); i < n; ++i) {
    const auto v = static_cast<int64_t>(ip[i]);
    if (v < 0 || v >= num) {
      return Error(ErrorCode::InvalidArgument, "aten.embedding: index " + std::to_string(v) + " (at flat position " +
                                                   std::to_string(i) + ") is out of range for a weight of " +
                                                   std::to_string(num) + " rows");
    }
    if (row > 0) std::memcpy(dst + static_cast<size_t>(i) * row, src + static_cast<size_t>(v) * row, row);
  }
  return {};
}

// torch.embedding (inference): out[i..., :] = weight[indices[i...], :]; every index is checked.
Error embedding(const KernelArgs& a) {
  const Tensor& w = *a.inputs[0];
  const Tensor& idx = *a.inputs[1];
  Tensor& out = *a.outputs[0];
  std::vector<int64_t> want = idx.sizes;
  if (w.dim() != 2) return Error(ErrorCode::Internal, "aten.embedding: weight is not 2-D");
  want.push_back(w.sizes[1]);
  if (out.sizes != want || out.dtype != w.dtype) return mismatch("aten.embedding", out, want);
  if (idx.dtype == DType::Int64) return gather_rows<int64_t>(w, idx, out);
  if (idx.dtype == DType::Int32) return gather_rows<int32_t>(w, idx, out);
  return Error(ErrorCode::NotSupported, "aten.embedding: indices must be int64 or int32");
}

// Writes `value` converted to `dtype` into `bytes` (torch's scalar conversion: integers
// truncate toward zero, bool is value != 0, float16/bfloat16 round to nearest even). Inference
// has checked that the value fits an integer dtype.
void encode_value(DType dtype, double value, uint8_t* bytes) {
  switch (dtype) {
    case DType::Float32: { const auto v = static_cast<float>(value); std::memcpy(bytes, &v, 4); return; }
    case DType::Float64: std::memcpy(bytes, &value, 8); return;
    case DType::Float16: { const uint16_t v = float_to_half(static_cast<float>(value)); std::memcpy(bytes, &v, 2); return; }
    case DType::BFloat16: { const uint16_t v = float_to_bfloat16(static_cast<float>(value)); std::memcpy(bytes, &v, 2); return; }
    case DType::Int64: { const auto v = static_cast<int64_t>(value); std::memcpy(bytes, &v, 8); return; }
    case DType::Int32: { const auto v = static_cast<int32_t>(value); std::memcpy(bytes, &v, 4); return; }
    case DType::Int8: { const auto v = static_cast<int8_t>(value); std::memcpy(bytes, &v, 1); return; }
    case DType::UInt8: { const auto v = static_cast<uint8_t>(value); std::memcpy(bytes, &v, 1); return; }
    case DType::Bool: { const uint8_t v = value != 0.0 ? 1 : 0; std::memcpy(bytes, &v, 1); return; }
  }
}

// torch.constant_pad_nd: out[j] = in[j - before] where that index lies inside the input, else value.
Error constant_pad_nd(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto plan = sr::constant_pad_plan(x.sizes, a.attrs.get_ints("pad"));
  if (!plan.ok()) return Error(plan.error().code(), "aten.constant_pad_nd: " + plan.error().message());
  if (out.sizes != plan->out_sizes || out.dtype != x.dtype) return mismatch("aten.constant_pad_nd", out, plan->out_sizes);
  const double value = a.attrs.get_float("value");
  if (!std::isfinite(value) && !is_floating(x.dtype) && x.dtype != DType::Bool) {
    return Error(ErrorCode::InvalidArgument, "aten.constant_pad_nd: value is not finite for an integer dtype");
  }
  const int64_t n = out.numel();
  if (n == 0) return {};
  const auto es = static_cast<int64_t>(dtype_size(x.dtype));
  uint8_t fill[8];
  encode_value(x.dtype, value, fill);
  auto* dst = static_cast<uint8_t*>(out.data);
  const auto* src = static_cast<const uint8_t*>(x.data);
  const size_t rank = out.sizes.size();
  if (rank == 0) {  // nothing padded: a plain copy
    std::memcpy(dst, src, static_cast<size_t>(es));
    return {};
  }
  const std::vector<int64_t> in_strides = sr::contiguous_strides(x.sizes);
  const int64_t width = out.sizes[rank - 1];
  const int64_t in_width = x.sizes[rank - 1];
  const int64_t before = plan->before[rank - 1];
  // Output columns [c0, c1) come from input columns [c0 - before, c1 - before).
  const int64_t c0 = std::min<int64_t>(width, std::max<int64_t>(0, before));
  const int64_t c1 = std::min<int64_t>(width, in_width + before);
  std::vector<int64_t> idx(rank - 1, 0);  // output coordinates of the current row
  for (int64_t r = 0, rows = n / width; r < rows; ++r) {
    uint8_t* row = dst + r * width * es;
    bool inside = true;
    int64_t src_off = 0;  // element offset of the input row
    for (size_t d = 0; d + 1 < rank; ++d) {
      const int64_t j = idx[d] - plan->before[d];
      if (j < 0 || j >= x.sizes[d]) { inside = false; break; }
      src_off += j * in_strides[d];
    }
    const int64_t copy_from = inside ? c0 : width;
    const int64_t copy_to = inside ? std::max(c0, c1) : width;
    for (int64_t c = 0; c < copy_from; ++c) std::memcpy(row + c * es, fill, static_cast<size_t>(es));
    if (copy_to > copy_from) {
      std::memcpy(row + copy_from * es, src + (src_off + copy_from - before) * es,
                  static_cast<size_t>((copy_to - copy_from) * es));
    }
    for (int64_t c = copy_to; c < width; ++c) std::memcpy(row + c * es, fill, static_cast<size_t>(es));
    for (size_t d = rank - 1; d-- > 0;) {
      if (++idx[d] < out.sizes[d]) break;
      idx[d] = 0;
    }
  }
  return {};
}

}  // namespace

void register_portable_shape(KernelRegistry& r) {
  r.add("aten.view", view);
  r.add("aten.permute", permute);
  r.add("aten.transpose", transpose);
  r.add("aten.expand", expand);
  r.add("aten.slice", slice);
  r.add("aten.select", select);
  r.add("aten.squeeze", squeeze);
  r.add("aten.unsqueeze", unsqueeze);
  r.add("aten.cat", cat);
  r.add("aten.embedding", embedding);
  r.add("aten.constant_pad_nd", constant_pad_nd);
}

}  // namespace kiln

// Portable layout kernels: flip, diagonal, as_strided (strided views of the input materialized
// contiguously, kernels/strided_copy.h) and repeat. Every dtype (elements are copied as bytes).
// The views come from ir/ops/layout.h, the rules the ops' inference checked, so every element read
// lies inside the input.
#include <cstring>

#include "ir/op_registry.h"
#include "ir/ops/layout.h"
#include "kernels/kernel.h"
#include "kernels/strided_copy.h"

namespace kiln {
namespace {

namespace sr = shape_rules;

Error copy_view(const char* op, const Tensor& in, Result<sr::StridedView> rv, Tensor& out) {
  if (!rv.ok()) return Error(rv.error().code(), std::string(op) + ": " + rv.error().message());
  const sr::StridedView& v = *rv;
  if (out.sizes != v.sizes || out.dtype != in.dtype) {
    return Error(ErrorCode::Internal, std::string(op) + ": output " + out.type().to_string() +
                                          " does not match the computed sizes " + sizes_to_string(v.sizes));
  }
  const int64_t n = out.numel();
  if (n == 0) return {};
  const size_t es = dtype_size(in.dtype);
  const auto* src = static_cast<const uint8_t*>(in.data) + v.offset * static_cast<int64_t>(es);
  auto* dst = static_cast<uint8_t*>(out.data);
  if (v.sizes.empty()) {
    std::memcpy(dst, src, es);
    return {};
  }
  copy_view_rows(src, v, es, dst, 0, n / v.sizes.back());
  return {};
}

Error flip(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  return copy_view("aten.flip", x, flip_view(x.sizes, a.attrs.get_ints("dims")), *a.outputs[0]);
}

Error diagonal(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  return copy_view("aten.diagonal", x,
                   diagonal_view(x.sizes, a.attrs.get_int("offset"), a.attrs.get_int("dim1"), a.attrs.get_int("dim2")),
                   *a.outputs[0]);
}

Error as_strided(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  std::optional<int64_t> off;
  if (!a.attrs.is_none("storage_offset")) off = a.attrs.get_int("storage_offset");
  return copy_view("aten.as_strided", x, as_strided_view(x.numel(), a.attrs.get_ints("size"), a.attrs.get_ints("stride"), off),
                   *a.outputs[0]);
}

/// repeat: out[j_0, ..., j_r] = x[j_pad mod s_0, ...] (the input left-padded with size-1 dims):
/// the input expanded to [reps_0, s_0, reps_1, s_1, ...] (stride 0 on the repeat dims) and
/// flattened pairwise, which is the same row-major order.
Error repeat(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const auto reps = a.attrs.get_ints("repeats");
  auto sizes = repeat_sizes(x.sizes, reps);
  if (!sizes.ok()) return Error(sizes.error().code(), "aten.repeat: " + sizes.error().message());
  if (out.sizes != *sizes || out.dtype != x.dtype) return Error(ErrorCode::Internal, "aten.repeat: output type differs");
  std::vector<int64_t> padded(reps.size() - x.sizes.size(), 1);
  padded.insert(padded.end(), x.sizes.begin(), x.sizes.end());
  const std::vector<int64_t> in_strides = sr::contiguous_strides(padded);
  sr::StridedView v;
  for (size_t i = 0; i < reps.size(); ++i) {
    v.sizes.push_back(reps[i]);
    v.strides.push_back(0);
    v.sizes.push_back(padded[i]);
    v.strides.push_back(in_strides[i]);
  }
  Tensor flat{out.dtype, v.sizes, out.data};  // same bytes, the pairwise shape
  return copy_view("aten.repeat", x, v, flat);
}

}  // namespace

void register_portable_layout(KernelRegistry& r) {
  r.add("aten.flip", flip);
  r.add("aten.diagonal", diagonal);
  r.add("aten.as_strided", as_strided);
  r.add("aten.repeat", repeat);
}

}  // namespace kiln

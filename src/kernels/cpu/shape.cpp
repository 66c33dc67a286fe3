// Optimized cpu kernels for the data-movement ops that copy a strided view of their input:
// aten.permute, aten.transpose and aten.slice (every dtype; semantics, sizes and strides from
// src/ir/ops/shape_rules.h, as the portable kernels in src/kernels/portable/shape.cpp). The
// portable kernels copy on one thread; these split the output rows over the pool (a transformer
// block moves its [tokens, heads, head_dim] activations this way several times per layer), and
// copy whole contiguous rows with memcpy (kernels/strided_copy.h, shared with them). Results are
// identical to the portable kernels' (copies).
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "ir/ops/shape_rules.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/kernel.h"
#include "kernels/strided_copy.h"

namespace kiln {
namespace {

namespace sr = shape_rules;

constexpr int64_t kRowGrainBytes = 64 * 1024;  ///< bytes of output per thread, at least

/// out = the strided view `v` of `in` (out's sizes must be v.sizes), rows split over `pool`.
Error copy_view(const char* op, const Tensor& in, const Result<sr::StridedView>& rv, Tensor& out, ThreadPool* pool) {
  if (!rv.ok()) return Error(rv.error().code(), std::string(op) + ": " + rv.error().message());
  const sr::StridedView& v = rv.value();
  if (out.sizes != v.sizes || out.dtype != in.dtype) {
    return Error(ErrorCode::Internal, std::string(op) + ": output " + out.type().to_string() +
                                          " does not match the computed sizes " + sizes_to_string(v.sizes));
  }
  const int64_t n = out.numel();
  if (n == 0) return {};
  const auto es = static_cast<int64_t>(dtype_size(in.dtype));
  const auto* src = static_cast<const uint8_t*>(in.data) + v.offset * es;
  auto* dst = static_cast<uint8_t*>(out.data);
  const size_t rank = v.sizes.size();
  if (rank == 0) {
    std::memcpy(dst, src, static_cast<size_t>(es));
    return {};
  }
  const int64_t inner = v.sizes[rank - 1];
  auto run = [&](int64_t r0, int64_t r1) { copy_view_rows(src, v, static_cast<size_t>(es), dst, r0, r1); };
  const int64_t min_rows = std::max<int64_t>(1, kRowGrainBytes / std::max<int64_t>(1, inner * es));
  cpu::parallel_range(pool, n / inner, min_rows, run);
  return {};
}

std::optional<int64_t> optional_int(const Attributes& a, const char* name) {
  if (a.is_none(name)) return std::nullopt;
  return a.get_int(name);
}

Error permute(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  return copy_view("aten.permute", x, sr::permute_view(x.sizes, a.attrs.get_ints("dims")), *a.outputs[0], a.pool);
}

Error transpose(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  return copy_view("aten.transpose", x, sr::transpose_view(x.sizes, a.attrs.get_int("dim0"), a.attrs.get_int("dim1")),
                   *a.outputs[0], a.pool);
}

Error slice(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  return copy_view("aten.slice", x,
                   sr::slice_view(x.sizes, a.attrs.get_int("dim"), optional_int(a.attrs, "start"),
                                  optional_int(a.attrs, "end"), a.attrs.get_int("step")),
                   *a.outputs[0], a.pool);
}

/// Worth a pool: at least two threads' grain of output (smaller copies stay portable).
bool copy_accepts(const KernelSignature& s) {
  if (s.outputs.size() != 1 || s.outputs[0] == nullptr) return false;
  return static_cast<int64_t>(s.outputs[0]->nbytes()) >= 2 * kRowGrainBytes;
}

}  // namespace

void register_cpu_shape(KernelRegistry& r) {
  r.add_optimized("aten.permute", permute, copy_accepts);
  r.add_optimized("aten.transpose", transpose, copy_accepts);
  r.add_optimized("aten.slice", slice, copy_accepts);
}

}  // namespace kiln

// Optimized cpu kernels for the data-movement ops that copy a strided view of their input:
// aten.permute, aten.transpose and aten.slice (every dtype; semantics, sizes and strides from
// src/ir/ops/shape_rules.h, as the portable kernels in src/kernels/portable/shape.cpp). The
// portable kernels copy on one thread; these split the output rows over the pool (a transformer
// block moves its [tokens, heads, head_dim] activations this way several times per layer), and
// copy whole contiguous rows with memcpy. Results are identical to the portable kernels' (copies).
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "ir/ops/shape_rules.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernel.h"

namespace kiln {
namespace {

namespace sr = shape_rules;

constexpr int64_t kRowGrainBytes = 64 * 1024;  ///< bytes of output per thread, at least

template <typename T>
void gather(const uint8_t* src, int64_t stride, int64_t n, uint8_t* dst) {
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = s[i * stride];
}

/// Copies `n` elements of `es` bytes, `stride` elements apart, contiguously into dst.
void copy_row(const uint8_t* src, int64_t stride, int64_t n, size_t es, uint8_t* dst) {
  if (stride == 1) {
    std::memcpy(dst, src, static_cast<size_t>(n) * es);
    return;
  }
  switch (es) {
    case 1: gather<uint8_t>(src, stride, n, dst); return;
    case 2: gather<uint16_t>(src, stride, n, dst); return;
    case 4: gather<uint32_t>(src, stride, n, dst); return;
    case 8: gather<uint64_t>(src, stride, n, dst); return;
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * es, src + i * stride * static_cast<int64_t>(es), es);
  }
}

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
  const int64_t inner = v.sizes[rank - 1], inner_stride = v.strides[rank - 1];
  const int64_t rows = n / inner;
  auto run = [&](int64_t r0, int64_t r1) {
    // Index of row r0 over the outer dims, and its element offset.
    std::vector<int64_t> idx(rank - 1, 0);
    int64_t base = 0;
    for (int64_t r = r0, d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = r % v.sizes[static_cast<size_t>(d)];
      r /= v.sizes[static_cast<size_t>(d)];
      base += idx[static_cast<size_t>(d)] * v.strides[static_cast<size_t>(d)];
    }
    uint8_t* o = dst + r0 * inner * es;
    for (int64_t row = r0; row < r1; ++row) {
      copy_row(src + base * es, inner_stride, inner, static_cast<size_t>(es), o);
      o += inner * es;
      for (size_t d = rank - 1; d-- > 0;) {
        base += v.strides[d];
        if (++idx[d] < v.sizes[d]) break;
        base -= v.strides[d] * v.sizes[d];
        idx[d] = 0;
      }
    }
  };
  const int64_t min_rows = std::max<int64_t>(1, kRowGrainBytes / std::max<int64_t>(1, inner * es));
  cpu::parallel_range(pool, rows, min_rows, run);
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

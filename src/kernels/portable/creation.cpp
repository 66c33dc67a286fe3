// Portable creation kernels: arange, full, full_like, scalar_tensor, fill, copy. Conversions to the
// output dtype are aten._to_copy's (the portable _to_copy kernel runs them: truncation toward zero
// for float -> integer, v != 0 for bool, ...), so every op converts exactly as Tensor.to does.
#include <cmath>
#include <cstring>
#include <vector>

#include "ir/op_registry.h"
#include "ir/ops/creation.h"
#include "kernels/kernel.h"
#include "kernels/portable/util.h"

namespace kiln {
namespace {

/// Converts the contiguous tensor `src` to `to` with the portable _to_copy kernel; returns the bytes.
Result<std::vector<uint8_t>> convert_to(const Tensor& src, DType to) {
  TensorType t{to, src.sizes};
  std::vector<uint8_t> bytes(t.nbytes());
  if (src.dtype == to) {
    if (!bytes.empty()) std::memcpy(bytes.data(), src.data, bytes.size());
    return bytes;
  }
  KernelFn to_copy = KernelRegistry::get().find("aten._to_copy");
  if (to_copy == nullptr) return Error(ErrorCode::Internal, "aten._to_copy has no portable kernel");
  Tensor out{to, src.sizes, bytes.data()};
  Attributes attrs;
  attrs.set("dtype", std::string(dtype_name(to)));
  const Tensor* in[] = {&src};
  Tensor* outs[] = {&out};
  KILN_RETURN_IF_ERROR(to_copy(KernelArgs{in, outs, attrs, nullptr}));
  return bytes;
}

/// Writes `src` (already of out's dtype; its sizes broadcast to out's) into out, broadcasting.
void broadcast_bytes(const std::vector<uint8_t>& src, const std::vector<int64_t>& src_sizes, Tensor& out) {
  const size_t es = dtype_size(out.dtype);
  const int64_t n = out.numel();
  auto* po = static_cast<uint8_t*>(out.data);
  if (src.size() == es) {  // one value everywhere
    for (int64_t i = 0; i < n; ++i) std::memcpy(po + static_cast<size_t>(i) * es, src.data(), es);
    return;
  }
  const BroadcastIndex bi(src_sizes, out.sizes);
  for (int64_t i = 0; i < n; ++i) std::memcpy(po + static_cast<size_t>(i) * es, src.data() + bi(i) * es, es);
}

/// Fills out with the number v converted to out's dtype (through a float64 0-d tensor).
Error fill_number(double v, Tensor& out) {
  Tensor s{DType::Float64, {}, &v};
  auto bytes = convert_to(s, out.dtype);
  if (!bytes.ok()) return bytes.error();
  broadcast_bytes(*bytes, {}, out);
  return {};
}

Error full(const KernelArgs& a) { return fill_number(a.attrs.get_float("fill_value"), *a.outputs[0]); }
Error scalar_tensor(const KernelArgs& a) { return fill_number(a.attrs.get_float("s"), *a.outputs[0]); }

/// copy(self, src) and fill(self, value): input 1 broadcast to self's sizes in self's dtype.
Error copy(const KernelArgs& a) {
  const Tensor& src = *a.inputs[1];
  Tensor& out = *a.outputs[0];
  if (out.dtype != a.inputs[0]->dtype || out.sizes != a.inputs[0]->sizes) {
    return Error(ErrorCode::Internal, "aten.copy: output type differs from self's");
  }
  auto b = broadcast_shapes(out.sizes, src.sizes);  // inference checked it; the kernel reads src by it
  if (!b.ok() || *b != out.sizes) return Error(ErrorCode::Internal, "aten.copy: src does not broadcast to self");
  auto bytes = convert_to(src, out.dtype);
  if (!bytes.ok()) return bytes.error();
  broadcast_bytes(*bytes, src.sizes, out);
  return {};
}

/// arange: value i = start + i * step, in double for float outputs (PyTorch's CPU accumulation type
/// for float is double), in int64 from the truncated start and step for integer outputs (acc type
/// int64), then converted to the output dtype (int8/uint8 keep the low byte).
Error arange(const KernelArgs& a) {
  Tensor& out = *a.outputs[0];
  const double start = a.attrs.get_float("start"), end = a.attrs.get_float("end"), step = a.attrs.get_float("step");
  auto n = arange_length(start, end, step, out.dtype);
  if (!n.ok()) return Error(n.error().code(), "aten.arange: " + n.error().message());
  if (out.sizes != std::vector<int64_t>{*n}) return Error(ErrorCode::Internal, "aten.arange: output size differs");
  const int64_t is = static_cast<int64_t>(start), ist = static_cast<int64_t>(step);
  auto ival = [&](int64_t i) {
    return static_cast<int64_t>(static_cast<uint64_t>(is) + static_cast<uint64_t>(i) * static_cast<uint64_t>(ist));
  };
  for (int64_t i = 0; i < *n; ++i) {
    switch (out.dtype) {
      case DType::Float32: out.data_as<float>()[i] = static_cast<float>(start + step * static_cast<double>(i)); break;
      case DType::Float64: out.data_as<double>()[i] = start + step * static_cast<double>(i); break;
      case DType::Int64: out.data_as<int64_t>()[i] = ival(i); break;
      case DType::Int32: out.data_as<int32_t>()[i] = static_cast<int32_t>(ival(i)); break;
      case DType::Int8: out.data_as<int8_t>()[i] = static_cast<int8_t>(ival(i)); break;
      case DType::UInt8: out.data_as<uint8_t>()[i] = static_cast<uint8_t>(ival(i)); break;
      default: return Error(ErrorCode::NotSupported, std::string("aten.arange: dtype ") + dtype_name(out.dtype));
    }
  }
  return {};
}

}  // namespace

void register_portable_creation(KernelRegistry& r) {
  r.add("aten.arange", arange);
  r.add("aten.full", full);
  r.add("aten.full_like", full);
  r.add("aten.scalar_tensor", scalar_tensor);
  r.add("aten.fill", copy);
  r.add("aten.copy", copy);
}

}  // namespace kiln

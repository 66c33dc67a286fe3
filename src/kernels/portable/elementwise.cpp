// Portable elementwise kernels: simple loops, exact fp32 semantics of PyTorch eager.
#include <algorithm>

#include "kernels/kernel.h"
#include "kernels/portable/util.h"

namespace kiln {
namespace {

Error add(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  const Tensor& y = *a.inputs[1];
  Tensor& out = *a.outputs[0];
  if (x.dtype != DType::Float32 || y.dtype != DType::Float32 || out.dtype != DType::Float32) {
    return Error(ErrorCode::NotSupported, "aten.add: float32 only");
  }
  const float alpha = static_cast<float>(a.attrs.get_float("alpha", 1.0));
  BroadcastIndex bx(x.sizes, out.sizes), by(y.sizes, out.sizes);
  const float* px = x.data_as<float>();
  const float* py = y.data_as<float>();
  float* po = out.data_as<float>();
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) po[i] = px[bx(i)] + alpha * py[by(i)];
  return {};
}

Error relu(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const float* px = x.data_as<float>();
  float* po = out.data_as<float>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] = std::max(px[i], 0.0f);
  return {};
}

}  // namespace

void register_portable_elementwise(KernelRegistry& r) {
  r.add("aten.add", add);
  r.add("aten.relu", relu);
}

}  // namespace kiln

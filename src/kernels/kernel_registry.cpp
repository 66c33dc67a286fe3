// The kernel registry: every kernel compiled into this build, by op name.
#include <algorithm>

#include "kernels/kernel.h"

namespace kiln {

const KernelRegistry& KernelRegistry::get() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    register_portable_elementwise(r);
    register_portable_conv(r);
    register_portable_linear(r);
    register_portable_norm(r);
    register_portable_pool(r);
    register_portable_upsample(r);
    register_portable_reduction(r);
    register_portable_shape(r);
    return r;
  }();
  return registry;
}

KernelFn KernelRegistry::find(std::string_view op) const {
  for (const auto& [name, fn] : kernels_) {
    if (name == op) return fn;
  }
  return nullptr;
}

void KernelRegistry::add(std::string op, KernelFn fn) {
  for (auto& [name, f] : kernels_) {
    if (name == op) { f = fn; return; }  // later sets override
  }
  kernels_.emplace_back(std::move(op), fn);
}

std::vector<std::string> KernelRegistry::ops() const {
  std::vector<std::string> out;
  for (const auto& [name, fn] : kernels_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kiln

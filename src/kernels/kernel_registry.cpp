// The kernel registry: every kernel compiled into this build, by op name.
#include <algorithm>

#include "kernels/kernel.h"

namespace kiln {

const KernelRegistry& KernelRegistry::get() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    register_portable_elementwise(r);
    register_portable_math(r);
    register_portable_conv(r);
    register_portable_linear(r);
    register_portable_norm(r);
    register_portable_pool(r);
    register_portable_upsample(r);
    register_portable_reduction(r);
    register_portable_shape(r);
    register_portable_quant(r);
    register_portable_sort(r);
    register_portable_creation(r);
    register_portable_layout(r);
    register_portable_indexing(r);
    register_portable_spatial_extra(r);
    register_portable_llm(r);
    register_cpu_kernels(r);
    register_cpu_quantized(r);
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

void KernelRegistry::add_optimized(std::string op, KernelFn fn, KernelAccepts accepts, KernelPrepare prepare,
                                   bool sizes_at_call) {
  optimized_.push_back(Optimized{std::move(op), fn, accepts, prepare, sizes_at_call});
}

KernelPrepare KernelRegistry::prepare_of(KernelFn fn) const {
  for (const auto& k : optimized_) {
    if (k.fn == fn) return k.prepare;
  }
  return nullptr;
}

KernelFn KernelRegistry::select(std::string_view op, const KernelSignature& sig, KernelSet set, bool symbolic) const {
  if (set == KernelSet::Optimized) {
    for (const auto& k : optimized_) {
      if (k.op == op && (!symbolic || k.sizes_at_call) && (k.accepts == nullptr || k.accepts(sig))) return k.fn;
    }
  }
  return find(op);
}

const char* KernelRegistry::set_name(KernelFn fn) const {
  for (const auto& k : optimized_) {
    if (k.fn == fn) return "cpu";
  }
  return "portable";
}

std::vector<std::string> KernelRegistry::optimized_ops() const {
  std::vector<std::string> out;
  for (const auto& k : optimized_) {
    if (std::find(out.begin(), out.end(), k.op) == out.end()) out.push_back(k.op);
  }
  return out;
}

std::vector<std::string> KernelRegistry::ops() const {
  std::vector<std::string> out;
  for (const auto& [name, fn] : kernels_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kiln

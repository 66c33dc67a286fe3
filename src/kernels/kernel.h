// The kernel interface: a kernel implements one op of the registry (src/ir/op_registry.h)
// for contiguous tensors whose shapes the op's inference has already checked.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "kiln/attributes.h"
#include "kiln/error.h"
#include "kiln/tensor.h"
#include "kiln/thread_pool.h"

namespace kiln {

/// Arguments of one kernel call. Inputs follow the op's schema order (nullptr = None);
/// outputs are preallocated with their inferred types. `attrs` are normalized.
struct KernelArgs {
  std::span<const Tensor* const> inputs;
  std::span<Tensor* const> outputs;
  const Attributes& attrs;
  ThreadPool* pool = nullptr;  ///< may be null: run single-threaded
};

/// Runs the op. Returns NotSupported for a dtype or configuration the kernel lacks.
using KernelFn = Error (*)(const KernelArgs&);

/// A named set of kernels ("portable", "cpu"). Later sets override earlier ones by op name.
class KernelRegistry {
 public:
  /// The registry with every kernel compiled into this build (portable, then cpu overrides).
  static const KernelRegistry& get();
  KernelFn find(std::string_view op) const;
  void add(std::string op, KernelFn fn);  ///< used only while building
  std::vector<std::string> ops() const;

 private:
  std::vector<std::pair<std::string, KernelFn>> kernels_;
};

// Registration functions, one per kernel family (src/kernels/portable/*.cpp).
void register_portable_elementwise(KernelRegistry& r);
void register_portable_conv(KernelRegistry& r);
void register_portable_linear(KernelRegistry& r);
void register_portable_norm(KernelRegistry& r);
void register_portable_pool(KernelRegistry& r);
void register_portable_upsample(KernelRegistry& r);
void register_portable_reduction(KernelRegistry& r);
void register_portable_shape(KernelRegistry& r);

}  // namespace kiln

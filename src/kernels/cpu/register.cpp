// Registers the optimized cpu kernels (one register function per family, each in its own file).
#include "kernels/cpu/target.h"
#include "kernels/kernel.h"

namespace kiln {

void register_cpu_kernels(KernelRegistry& r) {
  cpu::select_target();  // before any kernel can be dispatched (kernels/cpu/target.h)
  register_cpu_conv(r);
  register_cpu_linear(r);
  register_cpu_pool(r);
  register_cpu_attention(r);
  register_cpu_norm(r);
  register_cpu_softmax(r);
  register_cpu_activation(r);
  register_cpu_elementwise(r);
  register_cpu_shape(r);
}

}  // namespace kiln

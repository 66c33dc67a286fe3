// Registers the optimized cpu kernels (one register function per family, each in its own file).
#include "kernels/kernel.h"

namespace kiln {

void register_cpu_kernels(KernelRegistry& r) {
  register_cpu_conv(r);
  register_cpu_linear(r);
}

}  // namespace kiln

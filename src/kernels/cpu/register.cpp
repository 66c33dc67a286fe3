// Registers the optimized cpu kernels (one register function per family, each in its own file).
#include "kernels/kernel.h"

namespace kiln {

void register_cpu_kernels(KernelRegistry& r) {
  (void)r;  // families are added here as they land
}

}  // namespace kiln

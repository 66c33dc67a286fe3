// register_cpu_kernels for a build without the optimized cpu kernels (CMake KILN_CPU_KERNELS=OFF,
// the fuzz build): registers nothing, so every call runs its portable kernel.
#include "kernels/cpu/target.h"
#include "kernels/kernel.h"

namespace kiln {

void register_cpu_kernels(KernelRegistry&) { cpu::select_target(); }
void register_cpu_quantized(KernelRegistry&) {}

}  // namespace kiln

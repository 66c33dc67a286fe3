// Portable linear kernels.
#include "kernels/kernel.h"

namespace kiln {

void register_portable_linear(KernelRegistry& r) { (void)r; }

}  // namespace kiln

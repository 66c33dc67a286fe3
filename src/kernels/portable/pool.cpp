// Portable pool kernels.
#include "kernels/kernel.h"

namespace kiln {

void register_portable_pool(KernelRegistry& r) { (void)r; }

}  // namespace kiln

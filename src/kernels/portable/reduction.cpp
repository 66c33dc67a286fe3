// Portable reduction kernels.
#include "kernels/kernel.h"

namespace kiln {

void register_portable_reduction(KernelRegistry& r) { (void)r; }

}  // namespace kiln

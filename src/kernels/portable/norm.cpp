// Portable norm kernels.
#include "kernels/kernel.h"

namespace kiln {

void register_portable_norm(KernelRegistry& r) { (void)r; }

}  // namespace kiln

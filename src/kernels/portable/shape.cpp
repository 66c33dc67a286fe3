// Portable shape kernels.
#include "kernels/kernel.h"

namespace kiln {

void register_portable_shape(KernelRegistry& r) { (void)r; }

}  // namespace kiln

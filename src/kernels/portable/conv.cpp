// Portable conv kernels.
#include "kernels/kernel.h"

namespace kiln {

void register_portable_conv(KernelRegistry& r) { (void)r; }

}  // namespace kiln

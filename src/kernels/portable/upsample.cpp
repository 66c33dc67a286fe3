// Portable upsample kernels.
#include "kernels/kernel.h"

namespace kiln {

void register_portable_upsample(KernelRegistry& r) { (void)r; }

}  // namespace kiln

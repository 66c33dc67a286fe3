// conv op definitions.
#include "ir/op_registry.h"

namespace kiln {

void register_conv_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln

// linear op definitions.
#include "ir/op_registry.h"

namespace kiln {

void register_linear_ops(OpRegistry& r) { (void)r; }

}  // namespace kiln

// Elementwise op definitions: binary arithmetic with broadcasting, unary activations.
#include "ir/op_registry.h"

namespace kiln {
namespace {

Result<std::vector<TensorType>> infer_binary(InputTypes in, const Attributes&) {
  auto sizes = broadcast_shapes(in[0]->sizes, in[1]->sizes);
  if (!sizes.ok()) return sizes.error();
  return std::vector<TensorType>{{promote_types(in[0]->dtype, in[1]->dtype), std::move(sizes.value())}};
}

Result<std::vector<TensorType>> infer_unary_float(InputTypes in, const Attributes&) {
  if (in[0]->dtype != DType::Float32) {
    return Error(ErrorCode::NotSupported, std::string("dtype ") + dtype_name(in[0]->dtype) + " (float32 only)");
  }
  return std::vector<TensorType>{*in[0]};
}

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  r.add({"aten.add", {{"self"}, {"other"}}, {{"alpha", AttrKind::Float, 1.0}}, 1, infer_binary,
         "self + alpha * other, with broadcasting (torch.add)"});
  r.add({"aten.relu", {{"self"}}, {}, 1, infer_unary_float, "max(self, 0) (torch.relu)"});
}

}  // namespace kiln

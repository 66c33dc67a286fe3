// kiln_app: the smallest useful program on top of Kiln's C++ runtime API.
//
//   kiln_app model.kiln [method] [fill]
//
// Loads (and verifies) `model.kiln`, runs `method` (default "forward") with every input
// filled with the value `fill` (default 0; converted to the input's dtype), and prints each
// output's dtype, shape and first values. Exit status 0 on success, 1 on any Kiln error.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <kiln/runtime.h>

namespace {

/// Fills `count` elements of `dtype` at `dst` with `value` (rounded/converted as a cast would).
void fill(kiln::DType dtype, void* dst, size_t count, double value) {
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case kiln::DType::Float32: static_cast<float*>(dst)[i] = static_cast<float>(value); break;
      case kiln::DType::Float16: static_cast<uint16_t*>(dst)[i] = kiln::float_to_half(static_cast<float>(value)); break;
      case kiln::DType::BFloat16: static_cast<uint16_t*>(dst)[i] = kiln::float_to_bfloat16(static_cast<float>(value)); break;
      case kiln::DType::Int64: static_cast<int64_t*>(dst)[i] = static_cast<int64_t>(value); break;
      case kiln::DType::Int32: static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(value); break;
      case kiln::DType::Int8: static_cast<int8_t*>(dst)[i] = static_cast<int8_t>(value); break;
      case kiln::DType::UInt8: static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(value); break;
      case kiln::DType::Bool: static_cast<uint8_t*>(dst)[i] = value != 0; break;
    }
  }
}

/// Element `i` of a tensor as a double, whatever its dtype.
double element(const kiln::Tensor& t, size_t i) {
  switch (t.dtype) {
    case kiln::DType::Float32: return t.data_as<const float>()[i];
    case kiln::DType::Float16: return kiln::half_to_float(t.data_as<const uint16_t>()[i]);
    case kiln::DType::BFloat16: return kiln::bfloat16_to_float(t.data_as<const uint16_t>()[i]);
    case kiln::DType::Int64: return static_cast<double>(t.data_as<const int64_t>()[i]);
    case kiln::DType::Int32: return t.data_as<const int32_t>()[i];
    case kiln::DType::Int8: return t.data_as<const int8_t>()[i];
    case kiln::DType::UInt8: return t.data_as<const uint8_t>()[i];
    case kiln::DType::Bool: return t.data_as<const uint8_t>()[i];
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr, "usage: %s model.kiln [method] [fill]\n", argv[0]);
    return 2;
  }
  const std::string method_name = argc > 2 ? argv[2] : "forward";
  const double value = argc > 3 ? std::strtod(argv[3], nullptr) : 0.0;

  auto program = kiln::Program::load(argv[1]);
  if (!program.ok()) {
    std::fprintf(stderr, "error: %s\n", program.error().to_string().c_str());
    return 1;
  }
  auto method = (*program)->load_method(method_name);
  if (!method.ok()) {
    std::fprintf(stderr, "error: %s\n", method.error().to_string().c_str());
    return 1;
  }

  // One buffer per input, sized and typed from the method's metadata.
  const kiln::MethodMeta& meta = method->meta();
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<kiln::Tensor> inputs;
  for (const kiln::TensorType& type : meta.inputs) {
    buffers.emplace_back(type.nbytes() + 8);  // + 8: never a zero-size allocation
    fill(type.dtype, buffers.back().data(), static_cast<size_t>(type.numel()), value);
    inputs.push_back(kiln::Tensor{type.dtype, type.sizes, buffers.back().data()});
    std::printf("input %zu: %s filled with %g\n", inputs.size() - 1, type.to_string().c_str(), value);
  }

  auto outputs = method->execute(inputs);
  if (!outputs.ok()) {
    std::fprintf(stderr, "error: %s\n", outputs.error().to_string().c_str());
    return 1;
  }
  for (size_t i = 0; i < outputs->size(); ++i) {
    const kiln::Tensor& t = (*outputs)[i];
    std::printf("output %zu: %s first values:", i, t.type().to_string().c_str());
    const size_t n = static_cast<size_t>(t.numel());
    for (size_t k = 0; k < n && k < 8; ++k) std::printf(" %.9g", element(t, k));
    std::printf("\n");
  }
  return 0;
}

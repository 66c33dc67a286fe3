// Element types of Kiln tensors (the same set as the program file's DType enum).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln {

/// Element type. Values match kiln.fb.DType in schema/program.fbs.
/// Float64 was appended last (value 8) so that files written before it keep their meaning.
enum class DType : int8_t { Float32 = 0, Float16, BFloat16, Int64, Int32, Int8, UInt8, Bool, Float64 };

constexpr int kNumDTypes = 9;

/// Bytes per element: 4, 2, 2, 8, 4, 1, 1, 1, 8.
size_t dtype_size(DType dtype);
/// Short name as in PyTorch: "float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool",
/// "float64".
const char* dtype_name(DType dtype);
/// Inverse of dtype_name; nullopt for an unknown name.
std::optional<DType> dtype_from_name(std::string_view name);
/// True for Float32, Float16, BFloat16, Float64.
bool is_floating(DType dtype);
/// True for the float types a delegate may compute in (CompileOptions::compute_dtype):
/// Float32, Float16, BFloat16 (not Float64, which only the portable kernels run).
bool is_compute_float(DType dtype);
/// True when the raw value is one of the enumerators (files are untrusted).
bool is_valid_dtype(int value);

/// IEEE-754 binary16 <-> float32 conversion (round to nearest even).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
/// bfloat16 <-> float32 (round to nearest even; NaN kept quiet).
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

}  // namespace kiln

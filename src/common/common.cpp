// Error, dtype, tensor and attribute helpers shared by compiler and runtime.
#include <bit>
#include <cmath>
#include <cstring>
#include <sstream>

#include "kiln/attributes.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/format.h"
#include "kiln/tensor.h"

namespace kiln {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::Ok: return "Ok";
    case ErrorCode::InvalidProgram: return "InvalidProgram";
    case ErrorCode::NotFound: return "NotFound";
    case ErrorCode::OperatorMissing: return "OperatorMissing";
    case ErrorCode::InvalidArgument: return "InvalidArgument";
    case ErrorCode::NotSupported: return "NotSupported";
    case ErrorCode::MemoryAllocationFailed: return "MemoryAllocationFailed";
    case ErrorCode::Internal: return "Internal";
  }
  return "Unknown";
}

std::string Error::to_string() const {
  if (ok()) return "Ok";
  return std::string(error_code_name(code_)) + ": " + message_;
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Float32: case DType::Int32: return 4;
    case DType::Float16: case DType::BFloat16: return 2;
    case DType::Int64: case DType::Float64: return 8;
    case DType::Int8: case DType::UInt8: case DType::Bool: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int64: return "int64";
    case DType::Int32: return "int32";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::Bool: return "bool";
    case DType::Float64: return "float64";
  }
  return "invalid";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (name == dtype_name(static_cast<DType>(i))) return static_cast<DType>(i);
  }
  return std::nullopt;
}

bool is_floating(DType d) { return is_compute_float(d) || d == DType::Float64; }
bool is_compute_float(DType d) { return d == DType::Float32 || d == DType::Float16 || d == DType::BFloat16; }
bool is_valid_dtype(int value) { return value >= 0 && value < kNumDTypes; }

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: value = mant * 2^-24
      float f = std::ldexp(static_cast<float>(mant), -24);
      bits = std::bit_cast<uint32_t>(f) | sign;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float f) {
  // Round-to-nearest-even conversion (as in IEEE-754 and numpy's npy_float_to_half).
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (ax < 0x38800000u) {                          // below 2^-14: subnormal or zero
    const float a = std::bit_cast<float>(ax);
    const float scaled = a * 16777216.0f;  // 2^24: subnormal units
    const float r = std::nearbyint(scaled);  // default rounding mode: nearest even
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t mant = ax & 0x7fffffu;
  uint32_t exp = (ax >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float bfloat16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t float_to_bfloat16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// Length of the valid UTF-8 sequence at text[i] (1 to 4), or 0 when the bytes there are not one
// (a stray continuation byte, a truncated sequence, an overlong form, a surrogate, > U+10FFFF).
size_t utf8_sequence(std::string_view text, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > text.size() || b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

bool is_valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_sequence(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

bool is_printable_name(std::string_view text) {
  if (!is_valid_utf8(text)) return false;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F) return false;
  }
  return true;
}

std::string printable(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_sequence(text, i);
    const auto c = static_cast<unsigned char>(text[i]);
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7F))) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string json_quote(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  const std::string safe = is_valid_utf8(text) ? std::string(text) : printable(text);
  std::string out = "\"";
  out.reserve(safe.size() + 2);
  for (const char ch : safe) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

int64_t numel_of(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::string sizes_to_string(const std::vector<int64_t>& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(sizes[i]);
  }
  return s + "]";
}

std::string type_to_string(const TensorType& type, const std::vector<std::string>& dims) {
  std::string s = std::string(dtype_name(type.dtype)) + "[";
  for (size_t d = 0; d < type.sizes.size(); ++d) {
    if (d) s += ", ";
    if (d < dims.size() && !dims[d].empty()) s += dims[d] + " <= ";
    s += std::to_string(type.sizes[d]);
  }
  return s + "]";
}

int64_t TensorType::numel() const { return numel_of(sizes); }
std::string TensorType::to_string() const { return std::string(dtype_name(dtype)) + sizes_to_string(sizes); }
int64_t Tensor::numel() const { return numel_of(sizes); }

const char* attr_kind_name(const AttrValue& v) {
  static const char* names[] = {"None", "bool", "int", "float", "str", "int[]", "float[]"};
  return names[v.index()];
}

std::string attr_to_string(const AttrValue& v) {
  std::ostringstream os;
  switch (v.index()) {
    case 0: os << "None"; break;
    case 1: os << (std::get<bool>(v) ? "True" : "False"); break;
    case 2: os << std::get<int64_t>(v); break;
    case 3: os << std::get<double>(v); break;
    case 4: os << '"' << std::get<std::string>(v) << '"'; break;
    case 5: os << sizes_to_string(std::get<std::vector<int64_t>>(v)); break;
    case 6: {
      os << '[';
      const auto& f = std::get<std::vector<double>>(v);
      for (size_t i = 0; i < f.size(); ++i) os << (i ? ", " : "") << f[i];
      os << ']';
      break;
    }
  }
  return os.str();
}

void Attributes::set(std::string name, AttrValue value) {
  for (auto& [n, v] : items_) {
    if (n == name) { v = std::move(value); return; }
  }
  items_.emplace_back(std::move(name), std::move(value));
}

const AttrValue* Attributes::find(std::string_view name) const {
  for (const auto& [n, v] : items_) {
    if (n == name) return &v;
  }
  return nullptr;
}

bool Attributes::is_none(std::string_view name) const {
  const AttrValue* v = find(name);
  return v == nullptr || std::holds_alternative<std::monostate>(*v);
}

bool Attributes::get_bool(std::string_view name, bool fallback) const {
  const AttrValue* v = find(name);
  if (v && std::holds_alternative<bool>(*v)) return std::get<bool>(*v);
  return fallback;
}
int64_t Attributes::get_int(std::string_view name, int64_t fallback) const {
  const AttrValue* v = find(name);
  if (v && std::holds_alternative<int64_t>(*v)) return std::get<int64_t>(*v);
  if (v && std::holds_alternative<bool>(*v)) return std::get<bool>(*v) ? 1 : 0;
  return fallback;
}
double Attributes::get_float(std::string_view name, double fallback) const {
  const AttrValue* v = find(name);
  if (v && std::holds_alternative<double>(*v)) return std::get<double>(*v);
  if (v && std::holds_alternative<int64_t>(*v)) return static_cast<double>(std::get<int64_t>(*v));
  return fallback;
}
std::string Attributes::get_string(std::string_view name, std::string fallback) const {
  const AttrValue* v = find(name);
  if (v && std::holds_alternative<std::string>(*v)) return std::get<std::string>(*v);
  return fallback;
}
std::vector<int64_t> Attributes::get_ints(std::string_view name, std::vector<int64_t> fallback) const {
  const AttrValue* v = find(name);
  if (v && std::holds_alternative<std::vector<int64_t>>(*v)) return std::get<std::vector<int64_t>>(*v);
  return fallback;
}
std::vector<double> Attributes::get_floats(std::string_view name, std::vector<double> fallback) const {
  const AttrValue* v = find(name);
  if (v && std::holds_alternative<std::vector<double>>(*v)) return std::get<std::vector<double>>(*v);
  return fallback;
}

std::string Attributes::to_string() const {
  std::string s;
  for (const auto& [n, v] : items_) {
    if (!s.empty()) s += ", ";
    s += n + "=" + attr_to_string(v);
  }
  return s;
}

}  // namespace kiln

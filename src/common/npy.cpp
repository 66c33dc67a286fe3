// .npy reader and writer (see npy.h for the format and the supported dtypes).
#include "kiln/npy.h"

#include "common/file_write.h"

#include <sys/stat.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

namespace kiln::npy {
namespace {

static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");

constexpr char kMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
constexpr size_t kMaxDims = 64;                    // NumPy's own limit (NPY_MAXDIMS in NumPy 2)
constexpr uint64_t kMaxDataBytes = 1ull << 46;     // same ceiling as the program loader

Error bad(const std::string& what) { return Error(ErrorCode::InvalidArgument, what); }

/// A value of the header dict: a string, a bool, a tuple of ints, or something we do not accept.
struct HeaderValue {
  enum Kind { String, Bool, IntTuple, Other } kind = Other;
  std::string s;
  bool b = false;
  std::vector<int64_t> ints;
};

/// Recursive-descent parser for the small subset of Python literals NumPy writes in headers.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : t_(text) {}

  /// Parses `{'key': value, ...}`; fills `out` (key -> value) or returns an error.
  Error parse_dict(std::vector<std::pair<std::string, HeaderValue>>& out) {
    skip_ws();
    if (!eat('{')) return bad("header is not a dict (does not start with '{')");
    for (;;) {
      skip_ws();
      if (eat('}')) break;
      std::string key;
      KILN_RETURN_IF_ERROR(parse_string(key));
      skip_ws();
      if (!eat(':')) return bad("header: expected ':' after key '" + key + "'");
      skip_ws();
      HeaderValue v;
      KILN_RETURN_IF_ERROR(parse_value(v));
      for (const auto& [k, unused] : out) {
        if (k == key) return bad("header: duplicate key '" + key + "'");
      }
      out.emplace_back(std::move(key), std::move(v));
      skip_ws();
      if (eat(',')) continue;
      skip_ws();
      if (eat('}')) break;
      return bad("header: expected ',' or '}' at offset " + std::to_string(pos_));
    }
    skip_ws();
    if (pos_ != t_.size()) return bad("header: unexpected text after the dict");
    return Error::success();
  }

 private:
  void skip_ws() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\t' || t_[pos_] == '\n' || t_[pos_] == '\r')) ++pos_;
  }
  bool eat(char c) {
    if (pos_ < t_.size() && t_[pos_] == c) { ++pos_; return true; }
    return false;
  }
  bool eat_word(std::string_view w) {
    if (t_.substr(pos_, w.size()) == w) { pos_ += w.size(); return true; }
    return false;
  }
  Error parse_string(std::string& out) {
    if (pos_ >= t_.size() || (t_[pos_] != '\'' && t_[pos_] != '"')) {
      return bad("header: expected a quoted string at offset " + std::to_string(pos_));
    }
    const char q = t_[pos_++];
    const size_t start = pos_;
    while (pos_ < t_.size() && t_[pos_] != q) {
      if (t_[pos_] == '\\') return bad("header: escapes in strings are not supported");
      ++pos_;
    }
    if (pos_ >= t_.size()) return bad("header: unterminated string");
    out.assign(t_.substr(start, pos_ - start));
    ++pos_;
    return Error::success();
  }
  Error parse_int(int64_t& out) {
    const size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') {
      v = v * 10 + static_cast<uint64_t>(t_[pos_] - '0');
      if (v > kMaxDataBytes) return bad("header: shape dimension too large");
      ++pos_;
    }
    if (pos_ == start) return bad("header: expected a non-negative integer in 'shape' at offset " + std::to_string(pos_));
    eat('L');  // Python 2 era files: (3L, 4L)
    out = static_cast<int64_t>(v);
    return Error::success();
  }
  Error parse_value(HeaderValue& v) {
    if (pos_ >= t_.size()) return bad("header: missing value");
    const char c = t_[pos_];
    if (c == '\'' || c == '"') {
      v.kind = HeaderValue::String;
      return parse_string(v.s);
    }
    if (eat_word("True")) { v.kind = HeaderValue::Bool; v.b = true; return Error::success(); }
    if (eat_word("False")) { v.kind = HeaderValue::Bool; v.b = false; return Error::success(); }
    if (eat('(')) {
      v.kind = HeaderValue::IntTuple;
      for (;;) {
        skip_ws();
        if (eat(')')) return Error::success();
        if (v.ints.size() >= kMaxDims) return bad("header: shape has more than 64 dimensions");
        int64_t d = 0;
        KILN_RETURN_IF_ERROR(parse_int(d));
        v.ints.push_back(d);
        skip_ws();
        if (eat(',')) continue;
        skip_ws();
        if (eat(')')) return Error::success();
        return bad("header: expected ',' or ')' in 'shape'");
      }
    }
    // Lists (structured dtypes), dicts, numbers...: skip to the next top-level ',' or '}' so
    // that the caller can report which key holds something unsupported.
    v.kind = HeaderValue::Other;
    int depth = 0;
    while (pos_ < t_.size()) {
      const char d = t_[pos_];
      if (d == '[' || d == '(' || d == '{') ++depth;
      if (d == ']' || d == ')' || d == '}') {
        if (depth == 0) break;
        --depth;
      }
      if (d == ',' && depth == 0) break;
      ++pos_;
    }
    return Error::success();
  }

  std::string_view t_;
  size_t pos_ = 0;
};

std::optional<DType> dtype_of_descr(const std::string& d) {
  if (d == "<f4") return DType::Float32;
  if (d == "<f2") return DType::Float16;
  if (d == "<f8") return DType::Float64;
  if (d == "<i8") return DType::Int64;
  if (d == "<i4") return DType::Int32;
  if (d == "|i1" || d == "<i1") return DType::Int8;
  if (d == "|u1" || d == "<u1") return DType::UInt8;
  if (d == "|b1" || d == "<b1") return DType::Bool;
  return std::nullopt;
}

std::string explain_descr(const std::string& d) {
  std::string why = "dtype '" + d + "' is not supported (supported: <f4 float32, <f2 float16, <f8 float64, <i8 int64, "
                    "<i4 int32, |i1 int8, |u1 uint8, |b1 bool)";
  if (!d.empty() && d[0] == '>') why += "; the file is big-endian: save it little-endian, e.g. a.astype(a.dtype.newbyteorder('<'))";
  return why;
}

}  // namespace

Result<std::string> descr_of(DType dtype) {
  switch (dtype) {
    case DType::Float32: return std::string("<f4");
    case DType::Float16: return std::string("<f2");
    case DType::Float64: return std::string("<f8");
    case DType::Int64: return std::string("<i8");
    case DType::Int32: return std::string("<i4");
    case DType::Int8: return std::string("|i1");
    case DType::UInt8: return std::string("|u1");
    case DType::Bool: return std::string("|b1");
    case DType::BFloat16: break;
  }
  return bad(std::string("dtype ") + dtype_name(dtype) + " has no .npy equivalent");
}

Result<Array> parse(std::span<const uint8_t> bytes) {
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return bad("not a .npy file (missing the \\x93NUMPY magic)");
  }
  const uint8_t major = bytes[6];
  const uint8_t minor = bytes[7];
  uint64_t header_len = 0;
  uint64_t header_start = 0;
  if (major == 1) {
    header_len = static_cast<uint64_t>(bytes[8]) | (static_cast<uint64_t>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated .npy header");
    header_len = static_cast<uint64_t>(bytes[8]) | (static_cast<uint64_t>(bytes[9]) << 8) |
                 (static_cast<uint64_t>(bytes[10]) << 16) | (static_cast<uint64_t>(bytes[11]) << 24);
    header_start = 12;
  } else {
    return bad(".npy format version " + std::to_string(major) + "." + std::to_string(minor) +
               " is not supported (1.0, 2.0 and 3.0 are)");
  }
  if (header_len > bytes.size() - header_start) return bad("truncated .npy header");
  std::string_view text(reinterpret_cast<const char*>(bytes.data() + header_start), header_len);

  std::vector<std::pair<std::string, HeaderValue>> entries;
  KILN_RETURN_IF_ERROR(HeaderParser(text).parse_dict(entries));
  const HeaderValue* descr = nullptr;
  const HeaderValue* fortran = nullptr;
  const HeaderValue* shape = nullptr;
  for (const auto& [k, v] : entries) {
    if (k == "descr") descr = &v;
    else if (k == "fortran_order") fortran = &v;
    else if (k == "shape") shape = &v;
    else return bad("header has an unexpected key '" + k + "'");
  }
  if (!descr || !fortran || !shape) return bad("header lacks one of 'descr', 'fortran_order', 'shape'");
  if (descr->kind != HeaderValue::String) return bad("structured (record) dtypes are not supported");
  if (fortran->kind != HeaderValue::Bool) return bad("header: 'fortran_order' is not True or False");
  if (shape->kind != HeaderValue::IntTuple) return bad("header: 'shape' is not a tuple of integers");
  auto dtype = dtype_of_descr(descr->s);
  if (!dtype) return bad(explain_descr(descr->s));

  Array out;
  out.dtype = *dtype;
  out.shape = shape->ints;
  uint64_t numel = 1;
  for (int64_t s : out.shape) {
    if (s != 0 && numel > kMaxDataBytes / static_cast<uint64_t>(s)) return bad("shape is too large");
    numel *= static_cast<uint64_t>(s);
  }
  // Fortran order only changes the data layout when at least two dimensions exceed 1.
  int nontrivial = 0;
  for (int64_t s : out.shape) nontrivial += s > 1 ? 1 : 0;
  if (fortran->b && nontrivial > 1) {
    return bad("the array is in Fortran (column-major) order; save a C-contiguous copy, e.g. np.ascontiguousarray(a)");
  }
  const uint64_t nbytes = numel * dtype_size(out.dtype);
  const uint64_t data_start = header_start + header_len;
  const uint64_t have = bytes.size() - data_start;
  if (have != nbytes) {
    return bad("data holds " + std::to_string(have) + " bytes but shape " + sizes_to_string(out.shape) + " of " +
               dtype_name(out.dtype) + " needs " + std::to_string(nbytes) + (have < nbytes ? " (truncated file)" : ""));
  }
  out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(data_start), bytes.end());
  if (out.dtype == DType::Bool) {
    for (uint8_t& b : out.data) b = b != 0 ? 1 : 0;  // a bool byte other than 0/1 means true
  }
  return out;
}

Result<Array> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Error(ErrorCode::NotFound, "cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(::fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fclose(f);
    return Error(ErrorCode::InvalidArgument, "'" + path + "' is not a regular file");
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  const size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  if (got != bytes.size()) return Error(ErrorCode::InvalidArgument, "short read of '" + path + "'");
  auto a = parse(bytes);
  if (!a.ok()) return Error(a.error().code(), "'" + path + "': " + a.error().message());
  return a;
}

Result<std::vector<uint8_t>> encode(const Tensor& tensor) {
  auto descr = descr_of(tensor.dtype);
  if (!descr.ok()) return descr.error();
  std::string header = "{'descr': '" + descr.value() + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < tensor.sizes.size(); ++i) {
    header += std::to_string(tensor.sizes[i]);
    if (tensor.sizes.size() == 1 || i + 1 < tensor.sizes.size()) header += ",";
    if (i + 1 < tensor.sizes.size()) header += " ";
  }
  header += "), }";
  // Pad with spaces so that magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  if (header.size() > 0xFFFF) return bad(".npy header too long");
  const size_t nbytes = tensor.nbytes();
  std::vector<uint8_t> out;
  out.reserve(10 + header.size() + nbytes);
  out.insert(out.end(), kMagic, kMagic + sizeof(kMagic));
  out.push_back(1);
  out.push_back(0);
  out.push_back(static_cast<uint8_t>(header.size() & 0xFF));
  out.push_back(static_cast<uint8_t>(header.size() >> 8));
  out.insert(out.end(), header.begin(), header.end());
  if (nbytes > 0) {
    const auto* p = static_cast<const uint8_t*>(tensor.data);
    out.insert(out.end(), p, p + nbytes);
  }
  return out;
}

Error write_file(const std::string& path, const Tensor& tensor) {
  auto bytes = encode(tensor);
  if (!bytes.ok()) return bytes.error();
  return write_file_replacing(path, bytes->data(), bytes->size());
}

}  // namespace kiln::npy

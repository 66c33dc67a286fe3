// Minimal .npy writer for the mv3 example (float32, C order, little-endian).
//
// Format: NumPy's "NEP 1" / numpy.lib.format version 1.0: the 6-byte magic "\x93NUMPY", the
// version bytes 1 0, a little-endian uint16 header length, an ASCII Python-dict header
// ("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 224, 224), }") padded with spaces
// and ended by '\n' so that the data starts at a multiple of 64 bytes, then the raw data.
// (Written here because the project's shared tools/npy.h did not exist when this example was
// written; replace with it once it does.)
#pragma once

#include <bit>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace kiln_example {

/// Writes `count` float32 values with the given shape to `path` as a .npy file.
/// Returns an empty string on success, otherwise a message naming the path and the problem.
/// The product of `shape` must equal `count` (checked).
inline std::string write_npy_float32(const std::string& path, const std::vector<int64_t>& shape,
                                     const float* data, size_t count) {
  static_assert(std::endian::native == std::endian::little, "the .npy writer assumes a little-endian host");
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel < 0 || static_cast<size_t>(numel) != count) return path + ": shape does not match the element count";

  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
    if (i + 1 < shape.size()) dict += " ";
  }
  dict += "), }";
  // magic(6) + version(2) + header length(2) + dict + padding + '\n' is a multiple of 64.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  if (dict.size() > 65535) return path + ": .npy header too long";

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return path + ": cannot open for writing";
  const unsigned char prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                    static_cast<unsigned char>(dict.size() & 0xff),
                                    static_cast<unsigned char>(dict.size() >> 8)};
  bool ok = std::fwrite(prefix, 1, sizeof(prefix), f) == sizeof(prefix) &&
            std::fwrite(dict.data(), 1, dict.size(), f) == dict.size() &&
            (count == 0 || std::fwrite(data, sizeof(float), count, f) == count);
  ok = (std::fclose(f) == 0) && ok;
  return ok ? std::string() : path + ": write failed";
}

}  // namespace kiln_example

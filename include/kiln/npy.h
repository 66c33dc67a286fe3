// Reading and writing NumPy .npy files (the format of numpy.save / numpy.load) for the kiln CLI.
//
// Format (NumPy's "NEP 1" / numpy/lib/format.py documentation):
//   bytes 0-5   magic "\x93NUMPY"
//   byte  6,7   format version major, minor: 1.0 (header length: uint16 LE), 2.0 and 3.0
//               (uint32 LE; 3.0 only allows UTF-8 in the header, which we treat like 2.0)
//   header      a Python dict literal in ASCII, e.g.
//               {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
//               padded with spaces and ended by '\n'
//   data        numel * itemsize raw bytes in C (row-major) order
//
// Supported element types (descr -> kiln::DType):
//   '<f4' float32, '<f2' float16, '<i8' int64, '<i4' int32, '|i1' int8, '|u1' uint8, '|b1' bool
//   ('<' or '|' accepted for the 1-byte types). Everything else is rejected with a clear
//   InvalidArgument: big-endian ('>'), Fortran order, structured or object dtypes, float64, ...
//   NumPy has no bfloat16; the CLI converts between bfloat16 and float32 itself.
//
// Files are untrusted: every size is checked, a malformed header yields an Error, never a crash.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln::npy {

/// A tensor read from a .npy file: dtype, shape (C order) and its bytes (numel * itemsize).
struct Array {
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  /// A non-owning Tensor view of `data` (valid while this Array lives and is not resized).
  Tensor view() { return Tensor{dtype, shape, data.empty() ? nullptr : data.data()}; }
};

/// The .npy descr string of a dtype: "<f4", "<f2", "<i8", "<i4", "|i1", "|u1", "|b1".
/// InvalidArgument for bfloat16 (NumPy has no such type).
Result<std::string> descr_of(DType dtype);

/// Parses a whole .npy file held in memory. InvalidArgument naming the problem for a bad magic,
/// an unsupported version, a malformed header, an unsupported dtype, Fortran order, or a data
/// size that differs from what the shape needs.
Result<Array> parse(std::span<const uint8_t> bytes);

/// Reads and parses `path`. NotFound when the file cannot be opened, InvalidArgument when it is not
/// a regular file (a directory, ...); parse()'s errors otherwise,
/// with the path prepended to the message.
Result<Array> read_file(const std::string& path);

/// Encodes a contiguous tensor as a version 1.0 .npy file (header padded so that the data starts
/// on a multiple of 64 bytes, as NumPy does). InvalidArgument for bfloat16.
Result<std::vector<uint8_t>> encode(const Tensor& tensor);

/// encode() then writes `path` as kiln::write_file does (complete or not at all: a temporary renamed
/// over it; devices written in place). NotFound / InvalidArgument with the OS error.
Error write_file(const std::string& path, const Tensor& tensor);

}  // namespace kiln::npy

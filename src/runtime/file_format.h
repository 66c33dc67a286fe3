// The fixed header at the start of every .kiln file (see schema/program.fbs for the rest).
#pragma once

#include <cstdint>

namespace kiln {

/// "KILNPRG" followed by a NUL: identifies a Kiln program file.
inline constexpr char kFileMagic[8] = {'K', 'I', 'L', 'N', 'P', 'R', 'G', '\0'};
/// Bumped on any change of the header or schema. Version 2 added symbolic sizes, state and
/// metadata (schema/program.fbs); the loader reads versions kMinFormatVersion..kFormatVersion
/// (a version-1 file has none of the new fields, which FlatBuffers reads as absent).
inline constexpr uint32_t kFormatVersion = 2;
inline constexpr uint32_t kMinFormatVersion = 1;
/// Segments start on multiples of this (so constants can be used in place from a mapping).
inline constexpr uint64_t kSegmentAlignment = 4096;
/// Alignment of each constant inside the constant segment.
inline constexpr uint64_t kConstantAlignment = 64;
/// Limits on every tensor type in a file: the loader rejects (InvalidProgram) and the compiler
/// refuses to write (InvalidArgument) a rank above kMaxTensorRank, or sizes whose product (zero
/// sizes counted as 1, so that [0, 2^62, 2^62] is refused too) times the element size exceeds
/// kMaxTensorBytes (64 TiB: anything larger is treated as hostile).
inline constexpr int64_t kMaxTensorRank = 16;
inline constexpr uint64_t kMaxTensorBytes = 1ull << 46;

/// 64-byte little-endian header.
struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_size;        ///< sizeof(FileHeader)
  uint64_t flatbuffer_offset;  ///< = header_size
  uint64_t flatbuffer_size;
  uint64_t segments_offset;    ///< first segment (page-aligned), = file size when none
  uint64_t file_size;          ///< total bytes; a shorter file is truncated
  uint64_t reserved[2];
};
static_assert(sizeof(FileHeader) == 64);

}  // namespace kiln

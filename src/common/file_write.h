// Writing output files without losing the old one (program files, .npy outputs).
#pragma once

#include <cstddef>
#include <string>

#include "kiln/error.h"

namespace kiln {

/// Writes `n` bytes at `data` to `path` so that a failure loses nothing and readers are safe:
/// - `path` missing or a regular file (or a symlink to one): the bytes go to a temporary file
///   beside the target (".kiln-XXXXXX.tmp", mode 0644) that is renamed over it only once every byte
///   is written and the file is closed. A process that has the old file memory-mapped keeps the
///   old (unlinked) bytes instead of seeing the file truncated under it (SIGBUS); a full disk, a
///   file size limit (EFBIG) or any write error leaves the old file as it was and no temporary.
/// - `path` an existing non-regular file (a character device such as /dev/null, a FIFO): written
///   in place; it is never replaced by a regular file.
/// Errors: InvalidArgument naming the path and the system's reason (strerror), e.g. "No space
/// left on device"; NotFound when the folder does not exist.
Error write_file_replacing(const std::string& path, const void* data, size_t n);

}  // namespace kiln

// See file_write.h.
#include "common/file_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace kiln {

namespace {

/// Writes all n bytes to fd (retrying short writes and EINTR); false with errno set on failure.
bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

Error io_error(const std::string& what, const std::string& path, int err) {
  return Error(err == ENOENT ? ErrorCode::NotFound : ErrorCode::InvalidArgument,
               what + " '" + path + "': " + std::strerror(err));
}

}  // namespace

Error write_file_replacing(const std::string& path, const void* data, size_t n) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  struct stat st {};
  std::string target = path;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return Error(ErrorCode::InvalidArgument, "cannot write '" + path + "': it is a directory");
    if (!S_ISREG(st.st_mode)) {  // a device or a FIFO: write into it, never replace it
      const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) return io_error("cannot open", path, errno);
      const bool ok = write_all(fd, bytes, n);
      const int err = errno;
      if (::close(fd) != 0 && ok) return io_error("cannot write", path, errno);
      if (!ok) return io_error("cannot write", path, err);
      return {};
    }
    char resolved[PATH_MAX];  // a symlink to a regular file: replace the file it names, keep the link
    if (::realpath(path.c_str(), resolved) != nullptr) target = resolved;
  }
  const size_t slash = target.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : target.substr(0, slash));
  std::string tmp = (dir == "/" ? "" : dir) + "/.kiln-XXXXXX.tmp";
  const int fd = ::mkstemps(tmp.data(), 4);
  if (fd < 0) return io_error("cannot create a file in the folder of", path, errno);
  bool ok = write_all(fd, bytes, n) && ::fchmod(fd, 0644) == 0;
  int err = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && ::rename(tmp.c_str(), target.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    return io_error("cannot write", path, err);
  }
  return {};
}

}  // namespace kiln

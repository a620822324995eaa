#include "core/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace kvtier {

const char* FileKindName(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "an unknown kind of file";
}

std::string NotARegularFileMessage(const std::string& path, mode_t mode) {
  return path + " is " + FileKindName(mode) + ", not a regular file; not opened";
}

Result<int> OpenRegularFile(const std::string& path, int flags, mode_t mode) {
  const bool direct = (flags & O_DIRECT) != 0;
  const int fd = ::open(path.c_str(), (flags & ~O_DIRECT) | O_NONBLOCK | O_CLOEXEC, mode);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(path + " does not exist");
    if (err == EISDIR) return Status::InvalidArgument(NotARegularFileMessage(path, S_IFDIR));
    // O_WRONLY on a FIFO without a reader, or a device without its driver.
    if (err == ENXIO || err == ENODEV) {
      struct stat st;
      if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
        return Status::InvalidArgument(NotARegularFileMessage(path, st.st_mode));
      }
    }
    return Status::FromErrno(err, "open " + path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "fstat " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(NotARegularFileMessage(path, st.st_mode));
  }
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) {
    const int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "fcntl(F_GETFL) " + path);
  }
  fl &= ~O_NONBLOCK;
  if (direct) fl |= O_DIRECT;
  if (::fcntl(fd, F_SETFL, fl) != 0) {
    const int err = errno;
    ::close(fd);
    if (direct && err == EINVAL) {
      return Status::InvalidArgument(path +
                                     ": the filesystem refuses O_DIRECT; put the G3 directory on "
                                     "ext4, xfs, btrfs or tmpfs (Linux >= 6.6)");
    }
    return Status::FromErrno(err, "fcntl(F_SETFL) " + path);
  }
  return fd;
}

}  // namespace kvtier

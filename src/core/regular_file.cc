#include "core/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

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

Result<std::unique_ptr<RegularFileStream>> RegularFileStream::Open(const std::string& path) {
  KVTIER_ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, O_RDONLY));
  return std::make_unique<RegularFileStream>(fd, path);
}

RegularFileStream::RegularFileStream(int fd, std::string path) : std::istream(nullptr) {
  buf_.fd = fd;
  buf_.path = std::move(path);
  buf_.owner = this;
  rdbuf(&buf_);
}

RegularFileStream::~RegularFileStream() {
  if (buf_.fd >= 0) ::close(buf_.fd);
}

RegularFileStream::FdBuf::int_type RegularFileStream::FdBuf::underflow() {
  if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
  if (!error.ok()) return traits_type::eof();
  ssize_t n;
  do {
    n = ::read(fd, data, sizeof(data));
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    error = Status::FromErrno(errno, "reading " + path);
    // Parsers that read through rdbuf() see the end; the stream's state says it was no end.
    owner->setstate(std::ios::badbit);
    return traits_type::eof();
  }
  if (n == 0) return traits_type::eof();
  setg(data, data, data + n);
  return traits_type::to_int_type(*gptr());
}

RegularFileStream::FdBuf::pos_type RegularFileStream::FdBuf::seekoff(
    off_type off, std::ios_base::seekdir dir, std::ios_base::openmode which) {
  if ((which & std::ios_base::in) == 0) return pos_type(off_type(-1));
  int whence = SEEK_SET;
  if (dir == std::ios_base::cur) {
    whence = SEEK_CUR;
    off -= egptr() - gptr();  // the kernel's offset is past what is buffered
  } else if (dir == std::ios_base::end) {
    whence = SEEK_END;
  }
  const off_t at = ::lseek(fd, static_cast<off_t>(off), whence);
  if (at < 0) return pos_type(off_type(-1));
  setg(data, data, data);
  return pos_type(static_cast<off_type>(at));
}

RegularFileStream::FdBuf::pos_type RegularFileStream::FdBuf::seekpos(
    pos_type pos, std::ios_base::openmode which) {
  return seekoff(off_type(pos), std::ios_base::beg, which);
}

}  // namespace kvtier

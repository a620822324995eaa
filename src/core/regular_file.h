// Opening paths that a user or another process controls (G3 slot files, the LOCK file, the
// snapshot, G4 objects on a shared filesystem, config files) so that nothing but a regular file
// is ever read or written.
//
// Why: open(2) of a FIFO for reading blocks until a writer appears, which may be never (a FIFO
// swapped in under a G4 object name held the engine's load forever); reading a character device
// such as /dev/zero never ends; O_DIRECT on a FIFO fails with EINVAL, which used to be reported
// as "the filesystem refuses O_DIRECT". So the path is opened with O_NONBLOCK (open(2) of a FIFO
// then returns at once), fstat(2) on the opened descriptor says what it is (no window between a
// check of the path and the open), anything but a regular file is refused by name, and only then
// are the caller's flags (O_DIRECT, blocking I/O) set with fcntl(F_SETFL).
#pragma once

#include <sys/types.h>

#include <istream>
#include <memory>
#include <streambuf>
#include <string>

#include "kvtier/status.h"

namespace kvtier {

// Opens `path` with `flags` (O_RDONLY, O_RDWR, O_WRONLY, with O_CREAT, O_EXCL, O_TRUNC,
// O_DIRECT as wanted; O_CLOEXEC is always added) and `mode` for a file it creates. Returns the
// descriptor, in blocking mode, or:
//   NotFound         the path does not exist (and O_CREAT was not given)
//   InvalidArgument  the path is not a regular file (the message says what it is: "a FIFO",
//                    "a directory", "a character device", ...), or the filesystem refuses
//                    O_DIRECT (the message says so)
//   NoSpace/IOError  any other failure of open, fstat or fcntl, with the errno text
Result<int> OpenRegularFile(const std::string& path, int flags, mode_t mode = 0600);

// "a regular file", "a directory", "a FIFO", "a character device", "a block device", "a socket",
// "a symbolic link", or "an unknown kind of file", for st_mode.
const char* FileKindName(mode_t mode);

// The message OpenRegularFile gives for a path that is `mode`'s kind and not a regular file.
std::string NotARegularFileMessage(const std::string& path, mode_t mode);

// A std::istream over a file descriptor, for parsers that read a stream (traces): the input
// files a user names are opened with OpenRegularFile (std::ifstream opens a directory, blocks on
// a FIFO, and its filebuf throws std::ios_base::failure when read(2) fails, past the parser).
// Seekable (seekg), so a format can be sniffed and the file read again from the start. A failed
// read(2) ends the stream with badbit set; read_error() then says why. Not thread-safe.
class RegularFileStream : public std::istream {
 public:
  // Opens `path` for reading with OpenRegularFile; its errors unchanged.
  static Result<std::unique_ptr<RegularFileStream>> Open(const std::string& path);
  // Takes ownership of `fd` (closed by the destructor); `path` names it in read_error().
  RegularFileStream(int fd, std::string path);
  ~RegularFileStream() override;
  RegularFileStream(const RegularFileStream&) = delete;
  RegularFileStream& operator=(const RegularFileStream&) = delete;

  // Ok, or IOError naming the path and errno of the read that failed.
  const Status& read_error() const { return buf_.error; }

 private:
  struct FdBuf : std::streambuf {
    int fd = -1;
    std::string path;
    Status error;
    RegularFileStream* owner = nullptr;
    char data[1 << 16];
    int_type underflow() override;
    pos_type seekoff(off_type off, std::ios_base::seekdir dir,
                     std::ios_base::openmode which) override;
    pos_type seekpos(pos_type pos, std::ios_base::openmode which) override;
  };
  FdBuf buf_;
};

}  // namespace kvtier

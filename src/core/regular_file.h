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

}  // namespace kvtier

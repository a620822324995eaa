// Sole ownership of a file descriptor: closed when the owner goes away, moved and never copied.
// -1 means "no descriptor". Not thread-safe (like any value); the descriptor itself may be used
// from several threads as the kernel allows.
#pragma once

#include <unistd.h>

namespace kvtier {

class UniqueFd {
 public:
  // Holds no descriptor.
  UniqueFd() = default;
  // Takes ownership of `fd` (-1 for none).
  explicit UniqueFd(int fd) : fd_(fd) {}
  // Closes the descriptor, if one is held.
  ~UniqueFd() { reset(); }

  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  // The descriptor, still owned by this object; -1 when none.
  int get() const { return fd_; }
  // Gives up ownership without closing: returns the descriptor (-1 when none); this object then
  // holds none.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes the held descriptor (unless it is `fd` itself) and takes ownership of `fd`. close(2)
  // is not retried on EINTR: on Linux the descriptor is released even then, and a retry could
  // close a descriptor another thread has just been given.
  void reset(int fd = -1) {
    if (fd_ >= 0 && fd_ != fd) ::close(fd_);
    fd_ = fd;
  }
  // True when a descriptor is held.
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace kvtier

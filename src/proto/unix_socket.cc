#include "proto/unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

namespace kvtier::proto {
namespace {

using Clock = std::chrono::steady_clock;

// Descriptors one recvmsg can take in; a peer sending more has the surplus closed by the kernel
// (MSG_CTRUNC), the ones that fit but are not the frame's first are closed here.
constexpr size_t kMaxFdsPerRecv = 8;

std::string ErrnoText(int err) { return std::strerror(err); }

std::string OctalMode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0%03o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// The poll timeout for `deadline`: -1 for none, else the milliseconds left rounded up (so a
// wait never ends just before the deadline and spins), 0 once it passed.
int PollTimeoutMs(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  const auto now = Clock::now();
  if (now >= deadline) return 0;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<int64_t>(left, INT_MAX));
}

// True when `fd` became ready for `events` (or reports an error or hang-up, which the next call
// on it returns), false when `deadline` passed first. IOError when poll fails.
Result<bool> WaitReady(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int timeout = PollTimeoutMs(deadline);
    const int r = ::poll(&p, 1, timeout);
    if (r > 0) return true;
    if (r == 0) {
      if (timeout == 0 || Clock::now() >= deadline) return false;
      continue;  // woke early (the rounding of the clocks): wait the rest
    }
    if (errno == EINTR) continue;
    return Status::FromErrno(errno, "poll on socket");
  }
}

// sun_path for `path`, or InvalidArgument when it does not fit (with its NUL).
Result<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty()) return Status::InvalidArgument("the socket path is empty");
  if (path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path " + path + " is " + std::to_string(path.size()) +
                                   " bytes; a Unix socket path holds at most " +
                                   std::to_string(sizeof(addr.sun_path) - 1) +
                                   ": choose a shorter path");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Every directory above `dir` (its real path) must be one that no other user can change: owned
// by root or the effective uid, and writable by group or others only with the sticky bit (as
// /tmp), so nobody else can rename or replace what lies below it.
Status CheckAncestors(const std::string& dir) {
  char real[PATH_MAX];
  const std::string parent = ParentDir(dir);
  if (::realpath(parent.c_str(), real) == nullptr) {
    return Status::FromErrno(errno, "cannot resolve the directories above " + dir);
  }
  const uid_t euid = ::geteuid();
  std::string at = real;
  for (;;) {
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0) return Status::FromErrno(errno, "stat of " + at);
    const bool owner_ok = st.st_uid == 0 || st.st_uid == euid;
    const bool others_write = (st.st_mode & 022) != 0;
    if (!owner_ok || (others_write && (st.st_mode & S_ISVTX) == 0)) {
      return Status::FailedPrecondition(
          "directory " + at + " above the socket directory " + dir + " is owned by uid " +
          std::to_string(st.st_uid) + " with mode " + OctalMode(st.st_mode) +
          ": another user could replace the socket directory; choose a socket path under "
          "directories owned by root or uid " +
          std::to_string(euid) + " (writable by others only when sticky, as /tmp)");
    }
    if (at == "/") break;
    at = ParentDir(at);
  }
  return Status::Ok();
}

// Creates `dir` (0700, or 0750 with `group`) when missing; then requires it to be a real
// directory (not a symlink) owned by the effective uid, with no permission for others and,
// without `group`, none for its group either; with `group`, its group must be that gid and
// may read and search it, never write it. The directories above it are checked too.
Status EnsurePrivateDir(const std::string& dir, std::optional<gid_t> group) {
  KVTIER_RETURN_IF_ERROR(CheckAncestors(dir));
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return Status::FromErrno(errno, "stat of socket directory " + dir);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return Status::FromErrno(errno, "cannot create socket directory " + dir);
    }
    if (::lstat(dir.c_str(), &st) != 0) {
      return Status::FromErrno(errno, "stat of socket directory " + dir);
    }
    if (group && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid()) {
      if (::chown(dir.c_str(), static_cast<uid_t>(-1), *group) != 0 ||
          ::chmod(dir.c_str(), 0750) != 0 || ::lstat(dir.c_str(), &st) != 0) {
        return Status::FromErrno(
            errno, "cannot give socket directory " + dir + " to group " + std::to_string(*group));
      }
    }
  }
  const uid_t euid = ::geteuid();
  if (S_ISLNK(st.st_mode)) {
    return Status::FailedPrecondition("socket directory " + dir +
                                      " is a symbolic link: kvtier serve follows none (whoever "
                                      "owns the link could point it elsewhere later); use the "
                                      "real directory's path");
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::FailedPrecondition("socket directory " + dir +
                                      " is not a directory: choose a socket path whose parent "
                                      "is a directory of uid " +
                                      std::to_string(euid));
  }
  if (st.st_uid != euid) {
    return Status::FailedPrecondition(
        "socket directory " + dir + " is owned by uid " + std::to_string(st.st_uid) +
        ", not by uid " + std::to_string(euid) + " that runs kvtier serve: chown " +
        std::to_string(euid) + " " + dir + ", or choose a socket path in a directory of its own");
  }
  if (!group && (st.st_mode & 077) != 0) {
    return Status::FailedPrecondition("socket directory " + dir + " has mode " +
                                      OctalMode(st.st_mode) +
                                      "; only its owner may have access: chmod 700 " + dir);
  }
  if (group && ((st.st_mode & 027) != 0 || st.st_gid != *group)) {
    return Status::FailedPrecondition(
        "socket directory " + dir + " has mode " + OctalMode(st.st_mode) + " and group " +
        std::to_string(st.st_gid) + "; with service.allowed_gids its group must be " +
        std::to_string(*group) + ", which may read and search it, nobody else: chgrp " +
        std::to_string(*group) + " " + dir + " && chmod 750 " + dir);
  }
  return Status::Ok();
}

// Removes a socket file at `path` that nobody accepts on. Ok when `path` is now free.
Status ClearStaleSocket(const std::string& path, const sockaddr_un& addr) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::FromErrno(errno, "stat of socket path " + path);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return Status::FailedPrecondition(path +
                                      " exists and is not a socket: remove it or choose another "
                                      "socket path");
  }
  // Non-blocking, so a live daemon with a full backlog (EAGAIN) cannot hold the probe.
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!probe) return Status::FromErrno(errno, "socket");
  int r;
  do {
    r = ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (r != 0 && errno == EINTR);
  if (r == 0 || errno == EAGAIN || errno == EINPROGRESS) {
    return Status::AlreadyExists("another kvtier serve listens on " + path);
  }
  if (errno == ENOENT) return Status::Ok();  // removed meanwhile
  if (errno != ECONNREFUSED) return Status::FromErrno(errno, "probe of existing socket " + path);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno(errno, "cannot remove stale socket " + path);
  }
  return Status::Ok();
}

}  // namespace

Result<UniqueFd> ListenUnix(const std::string& path, std::optional<gid_t> group) {
  KVTIER_ASSIGN_OR_RETURN(const sockaddr_un addr, UnixAddress(path));
  if (path.back() == '/') {
    return Status::InvalidArgument("socket path " + path + " ends in '/': it must name a file");
  }
  KVTIER_RETURN_IF_ERROR(EnsurePrivateDir(ParentDir(path), group));
  KVTIER_RETURN_IF_ERROR(ClearStaleSocket(path, addr));

  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return Status::FromErrno(errno, "socket");
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EADDRINUSE) {
      return Status::AlreadyExists("another kvtier serve listens on " + path);
    }
    return Status::FromErrno(errno, "bind " + path);
  }
  // From here the file is ours: remove it again when the socket cannot be set up.
  if ((group && ::chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0) ||
      ::chmod(path.c_str(), group ? 0660 : 0600) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return Status::FromErrno(err, group ? "chgrp and chmod 0660 " + path : "chmod 0600 " + path);
  }
  if (::listen(fd.get(), 128) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return Status::FromErrno(err, "listen on " + path);
  }
  return fd;
}

namespace {
// Room for a whole long prompt (a 131,072-token Lookup is 512 KiB) in one send: fewer
// sleep/wake rounds between the two processes. The kernel caps it at net.core.[wr]mem_max;
// a smaller buffer only costs time.
void WidenBuffers(int fd) {
  const int bytes = 2 << 20;
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}
}  // namespace

Result<UniqueFd> AcceptUnix(int listen_fd, int timeout_ms) {
  const Clock::time_point deadline = timeout_ms < 0
                                         ? Clock::time_point::max()
                                         : Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    KVTIER_ASSIGN_OR_RETURN(const bool ready, WaitReady(listen_fd, POLLIN, deadline));
    if (!ready) {
      return Status::TimedOut("no connection within " + std::to_string(timeout_ms) + " ms");
    }
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      WidenBuffers(fd);
      return UniqueFd(fd);
    }
    // Gone again (the peer withdrew, another thread took it) or interrupted: wait on.
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
      continue;
    }
    return Status::FromErrno(errno, "accept");
  }
}

Result<UniqueFd> ConnectUnix(const std::string& path) {
  KVTIER_ASSIGN_OR_RETURN(const sockaddr_un addr, UnixAddress(path));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Status::FromErrno(errno, "socket");
  WidenBuffers(fd.get());
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
    return fd;
  }
  int err = errno;
  if (err == EINTR) {
    // The connection goes on in the kernel; its outcome is SO_ERROR once writable.
    for (;;) {
      pollfd p{fd.get(), POLLOUT, 0};
      if (::poll(&p, 1, -1) >= 0) break;
      if (errno != EINTR) return Status::FromErrno(errno, "poll on connect to " + path);
    }
    socklen_t len = sizeof(err);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == 0) return fd;
  }
  if (err == ENOENT || err == ECONNREFUSED || err == ENOTDIR) {
    return Status::Unavailable("cannot connect to " + path + ": " + ErrnoText(err) +
                               ": is kvtier serve running?");
  }
  return Status::FromErrno(err, "connect to " + path);
}

Status SendFrame(int fd, uint16_t type, uint64_t seq, std::span<const uint8_t> payload, int pass_fd,
                 Clock::time_point deadline) {
  auto what = [&] {
    return "send of frame type " + std::to_string(type) + " seq " + std::to_string(seq);
  };
  if (payload.size() > kMaxPayloadBytes) {
    return Status::InvalidArgument(what() + ": payload of " + std::to_string(payload.size()) +
                                   " bytes exceeds the limit " + std::to_string(kMaxPayloadBytes));
  }
  FrameHeader h;
  h.type = type;
  h.seq = seq;
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  uint8_t header[kFrameHeaderBytes];
  EncodeHeader(h, header);

  const size_t total = kFrameHeaderBytes + payload.size();
  size_t sent = 0;
  bool fd_pending = pass_fd >= 0;
  while (sent < total) {
    iovec iov[2];
    int n = 0;
    if (sent < kFrameHeaderBytes) {
      iov[n++] = {header + sent, kFrameHeaderBytes - sent};
      if (!payload.empty()) iov[n++] = {const_cast<uint8_t*>(payload.data()), payload.size()};
    } else {
      const size_t off = sent - kFrameHeaderBytes;
      iov[n++] = {const_cast<uint8_t*>(payload.data()) + off, payload.size() - off};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (fd_pending) {
      std::memset(control, 0, sizeof(control));
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    // MSG_DONTWAIT: never block in sendmsg, whatever the descriptor's mode; poll waits instead,
    // bounded by the deadline.
    const ssize_t r = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      sent += static_cast<size_t>(r);
      fd_pending = false;  // the descriptor went with the first byte sent
      continue;
    }
    if (r == 0) return Status::IOError(what() + ": sendmsg wrote nothing");
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EPIPE || err == ECONNRESET) {
      return Status::Unavailable(what() + ": peer closed (" + ErrnoText(err) + ")");
    }
    if (err != EAGAIN && err != EWOULDBLOCK) return Status::FromErrno(err, what());
    KVTIER_ASSIGN_OR_RETURN(const bool ready, WaitReady(fd, POLLOUT, deadline));
    if (!ready) {
      std::string msg = what() + ": the peer did not read; " + std::to_string(sent) + " of " +
                        std::to_string(total) + " bytes sent by the deadline";
      msg += sent == 0 ? " (nothing sent: the stream is still usable)"
                       : " (a partial frame was sent: the stream is unusable, close it)";
      return Status::TimedOut(std::move(msg));
    }
  }
  return Status::Ok();
}

namespace {

// Keeps the first descriptor of `msg`'s SCM_RIGHTS in *kept (when it holds none yet) and closes
// every other one.
void TakeDescriptors(msghdr* msg, UniqueFd* kept) {
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (!*kept) {
        kept->reset(received);
      } else {
        ::close(received);
      }
    }
  }
}

// Reads exactly `n` bytes of the current frame into `buf`. `frame_read`: bytes of this frame
// read before (for messages), advanced by what this call reads.
Status RecvExact(int fd, uint8_t* buf, size_t n, Clock::time_point deadline, UniqueFd* passed,
                 size_t* frame_read) {
  size_t got = 0;
  while (got < n) {
    iovec iov{buf + got, n - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerRecv)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r > 0) {
      TakeDescriptors(&msg, passed);
      got += static_cast<size_t>(r);
      *frame_read += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      if (*frame_read == 0) return Status::Unavailable("receive of a frame: peer closed");
      return Status::Unavailable("receive of a frame: peer closed after " +
                                 std::to_string(*frame_read) + " bytes of a frame");
    }
    const int err = errno;
    if (err == EINTR) continue;
    if (err == ECONNRESET) {
      return Status::Unavailable("receive of a frame: peer closed (" + ErrnoText(err) + ")");
    }
    if (err != EAGAIN && err != EWOULDBLOCK) return Status::FromErrno(err, "receive of a frame");
    KVTIER_ASSIGN_OR_RETURN(const bool ready, WaitReady(fd, POLLIN, deadline));
    if (!ready) {
      if (*frame_read == 0) {
        return Status::TimedOut(
            "receive of a frame: nothing arrived by the deadline (the stream is still usable)");
      }
      return Status::TimedOut("receive of a frame: only " + std::to_string(*frame_read) +
                              " bytes of a frame arrived by the deadline: the stream is unusable, "
                              "close it");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<Frame> RecvFrame(int fd, Clock::time_point deadline, uint32_t max_payload) {
  Frame frame;
  size_t frame_read = 0;
  uint8_t header[kFrameHeaderBytes];
  KVTIER_RETURN_IF_ERROR(
      RecvExact(fd, header, kFrameHeaderBytes, deadline, &frame.fd, &frame_read));
  KVTIER_ASSIGN_OR_RETURN(frame.header, DecodeHeader(header));
  if (frame.header.payload_bytes > max_payload) {
    return Status::InvalidArgument("a frame of type " + std::to_string(frame.header.type) +
                                   " announces " + std::to_string(frame.header.payload_bytes) +
                                   " payload bytes; at most " + std::to_string(max_payload) +
                                   " are read here");
  }
  frame.payload.resize(frame.header.payload_bytes);
  if (!frame.payload.empty()) {
    KVTIER_RETURN_IF_ERROR(RecvExact(fd, frame.payload.data(), frame.payload.size(), deadline,
                                     &frame.fd, &frame_read));
  }
  return frame;
}

Result<PeerCred> GetPeerCred(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno(errno, "SO_PEERCRED");
  }
  PeerCred out{cred.pid, cred.uid, cred.gid, {}};
  // The supplementary groups as the kernel saw them at connect (Linux 4.13+); a kernel without
  // SO_PEERGROUPS leaves the primary gid alone to decide.
  std::vector<gid_t> groups(64);
  for (int tries = 0; tries < 4; ++tries) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      out.groups = std::move(groups);
      break;
    }
    if (errno != ERANGE) break;
    groups.resize(bytes / sizeof(gid_t) + 1);
  }
  return out;
}

Status AuthorizePeer(const PeerCred& cred, std::span<const gid_t> allowed_gids) {
  const uid_t euid = ::geteuid();
  if (cred.uid == euid) return Status::Ok();
  auto allowed = [&](gid_t g) {
    return std::find(allowed_gids.begin(), allowed_gids.end(), g) != allowed_gids.end();
  };
  if (allowed(cred.gid) || std::any_of(cred.groups.begin(), cred.groups.end(), allowed)) {
    return Status::Ok();
  }
  return Status::FailedPrecondition(
      "peer pid " + std::to_string(cred.pid) + " uid " + std::to_string(cred.uid) + " gid " +
      std::to_string(cred.gid) + " is not allowed: run the engine as uid " + std::to_string(euid) +
      " or add one of its groups to service.allowed_gids");
}

Status VerifyDaemon(int fd, uid_t expected_uid, const std::string& path) {
  KVTIER_ASSIGN_OR_RETURN(const PeerCred cred, GetPeerCred(fd));
  if (cred.uid == expected_uid) return Status::Ok();
  return Status::FailedPrecondition(
      "the process listening on " + path + " (pid " + std::to_string(cred.pid) + ") runs as uid " +
      std::to_string(cred.uid) + ", not uid " + std::to_string(expected_uid) +
      " as kvtier serve must (service.daemon_uid): nothing was sent to it; check who owns the "
      "socket's directory, or set service.daemon_uid to the daemon's uid");
}

}  // namespace kvtier::proto

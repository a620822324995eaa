// The transport of kvtier serve: a per-host daemon listens on a Unix stream socket and engine
// processes on the same host connect to it. Each message is one frame (proto/wire.h) and may
// carry one file descriptor (SCM_RIGHTS), e.g. a memfd holding KV blocks.
//
// Who may connect is decided twice: the filesystem (the socket's directory is 0700 and owned by
// the daemon's uid, the socket 0600, unless an operator opens them up on purpose) and the
// daemon itself (GetPeerCred + AuthorizePeer on each accepted connection).
//
// Every wait is bounded: sends and receives take a deadline and use poll, so a peer that stops
// reading or writing can never hold the other side. SIGPIPE is never raised (MSG_NOSIGNAL).
//
// Frames on one descriptor must not be sent or received by two threads at once (a frame is
// written and read with several system calls); each function itself keeps no state.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/unique_fd.h"
#include "kvtier/status.h"
#include "proto/wire.h"

namespace kvtier::proto {

// One received frame. `fd`: the descriptor passed with the frame, if any (none: -1); it is
// close-on-exec and now owned by the receiver.
struct Frame {
  FrameHeader header;
  std::vector<uint8_t> payload;
  UniqueFd fd;
};

// Creates a listening socket at `path` (SOCK_STREAM, SOCK_CLOEXEC, backlog 128). The listening
// descriptor is non-blocking (AcceptUnix waits with poll); accepted connections are blocking.
//   - Every directory above the parent must be owned by root or the effective uid and writable
//     by others only when sticky (as /tmp); otherwise FailedPrecondition naming it.
//   - The parent directory is created when missing (0700; with `group`, 0750 and that group;
//     only the last component, not its parents), and must be a directory, not a symlink,
//     owned by the effective uid, with no permission for others and, without `group`, none for
//     its group; with `group`, its group must be `group` and may not write it. Otherwise
//     FailedPrecondition, saying what to change.
//   - An existing socket file at `path` that nobody accepts on (connect gets ECONNREFUSED: a
//     daemon that died) is removed. One that answers gives AlreadyExists ("another kvtier serve
//     listens on PATH"); the probe connection it made is closed at once, so the live daemon
//     accepts one connection that ends without a frame. Anything but a socket at `path` is left
//     alone: FailedPrecondition.
//   - The socket file is chmod 0600 after bind (0660 and `group` with `group`); the directory
//     keeps others out meanwhile.
// InvalidArgument for an empty path, one ending in '/', or one longer than sun_path holds;
// IOError for a failing system call (with its errno text).
Result<UniqueFd> ListenUnix(const std::string& path, std::optional<gid_t> group = std::nullopt);

// Waits up to `timeout_ms` (negative: without limit) for a connection on `listen_fd` (poll),
// then accepts it with accept4(SOCK_CLOEXEC). TimedOut when none came in time; IOError when
// poll or accept4 fails (EMFILE included: the caller decides whether to wait and retry).
Result<UniqueFd> AcceptUnix(int listen_fd, int timeout_ms);

// Connects to the daemon listening at `path`. The returned descriptor is blocking and
// close-on-exec. Blocks while the daemon's backlog is full. Unavailable (naming the path and
// the errno text, asking "is kvtier serve running?") when the file is missing or nobody listens
// on it; InvalidArgument for a path longer than sun_path; IOError otherwise (EACCES included).
Result<UniqueFd> ConnectUnix(const std::string& path);

// Writes one frame (header + `payload`) completely: sendmsg with MSG_NOSIGNAL, retrying EINTR
// and partial writes. When `pass_fd` >= 0 it goes with the frame's first byte (SCM_RIGHTS); the
// caller keeps its own copy of it (the receiver gets a duplicate). Waits with poll(POLLOUT)
// whenever the socket buffer is full, never past `deadline`. Returns Ok, or:
//   InvalidArgument  payload larger than kMaxPayloadBytes (nothing sent)
//   Unavailable      the peer closed the connection (EPIPE, ECONNRESET: "peer closed")
//   TimedOut         no progress possible before `deadline` (a peer that does not read). When
//                    part of the frame was written the stream is unusable (the peer would
//                    read a torn frame): close it. The message says which.
//   IOError          any other failure of sendmsg or poll (EBADF for a bad pass_fd included)
Status SendFrame(
    int fd, uint16_t type, uint64_t seq, std::span<const uint8_t> payload, int pass_fd = -1,
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());

// Reads one frame: poll + recvmsg(MSG_CMSG_CLOEXEC), exactly the frame's bytes (never a byte of
// the next frame). The first descriptor passed during the frame is kept in Frame::fd; any others
// are closed. The payload is allocated only after the header validated (so at most
// kMaxPayloadBytes, and at most `max_payload`). Returns the frame, or:
//   TimedOut         `deadline` passed. When nothing of a frame had arrived the stream is still
//                    usable; when part of one had, it is not (close it). The message says which.
//   Unavailable      end of stream before a complete frame ("peer closed"), or ECONNRESET
//   InvalidArgument  a bad header (DecodeHeader's message) or a payload over `max_payload`;
//                    the stream is unusable
//   IOError          any other failure of recvmsg or poll
Result<Frame> RecvFrame(int fd, std::chrono::steady_clock::time_point deadline,
                        uint32_t max_payload = kMaxPayloadBytes);

// The process at the other end of a connected Unix socket, as the kernel saw it at connect().
struct PeerCred {
  pid_t pid = 0;  // 0 when the peer's pid has no number in this process's pid namespace
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups (SO_PEERGROUPS); empty when not known
};

// The peer's credentials (SO_PEERCRED). IOError when `fd` is not a connected Unix socket.
Result<PeerCred> GetPeerCred(int fd);

// Ok when the peer runs as the daemon's own effective uid, or its primary gid or one of its
// supplementary groups is one of `allowed_gids`. Otherwise FailedPrecondition: "peer pid P uid
// U gid G is not allowed: run the engine as uid X or add one of its groups to
// service.allowed_gids".
Status AuthorizePeer(const PeerCred& cred, std::span<const gid_t> allowed_gids);

// The engine's side: Ok when the process at the other end of `fd` (connected to `path`) runs
// as `expected_uid`; otherwise FailedPrecondition naming the pid and uid found. Call it before
// sending anything: a listener of another uid on the path (a socket directory that another
// user could swap) must hear nothing of the engine. IOError when `fd` is not a Unix socket.
Status VerifyDaemon(int fd, uid_t expected_uid, const std::string& path);

}  // namespace kvtier::proto

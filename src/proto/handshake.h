// The opening of every connection an engine makes to kvtier serve: connect to the socket, send
// Hello, read the daemon's reply (its status, then HelloReply, and for a data connection the
// G2 memfd). Shared by AttachedManager's call, data and events connections and by
// ServiceLookup's lookup connections.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "core/unique_fd.h"
#include "kvtier/status.h"
#include "proto/protocol.h"

namespace kvtier::proto {

struct Handshake {
  UniqueFd fd;  // the connection, ready for the role's frames
  HelloReply reply;
  UniqueFd passed;  // the descriptor sent with the reply (a data connection's G2), if any
};

// Connects to `socket_path`, checks that the listener runs as `daemon_uid` (VerifyDaemon:
// before anything is sent; the engine's ServiceClientOptions::daemon_uid), and exchanges Hello with
// `seq`, all before `deadline`. Errors:
//   - a listener of another uid: FailedPrecondition with `*refused` set (nothing was sent);
//   - transport (ConnectUnix, SendFrame, RecvFrame): their statuses (Unavailable, TimedOut, ...);
//     `*refused` is left false;
//   - the daemon's refusal: the status it answered (FailedPrecondition for a peer it does not
//     allow or an instance name another live process holds, ResourceExhausted when it holds no
//     room for this engine, ...), with `*refused` set; an Unavailable answer (try again) or a
//     connection refused for want of room (seq 0) leaves it false;
//   - a reply that is not a kReply of `seq` or does not decode: InvalidArgument.
Result<Handshake> OpenConnection(const std::string& socket_path, uid_t daemon_uid,
                                 const Hello& hello, uint64_t seq,
                                 std::chrono::steady_clock::time_point deadline,
                                 bool* refused = nullptr);

}  // namespace kvtier::proto

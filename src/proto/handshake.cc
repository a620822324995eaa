#include "proto/handshake.h"

#include "proto/unix_socket.h"
#include "proto/wire.h"

namespace kvtier::proto {

Result<Handshake> OpenConnection(const std::string& socket_path, uid_t daemon_uid,
                                 const Hello& hello, uint64_t seq,
                                 std::chrono::steady_clock::time_point deadline, bool* refused) {
  if (refused != nullptr) *refused = false;
  Handshake out;
  KVTIER_ASSIGN_OR_RETURN(out.fd, ConnectUnix(socket_path));
  if (Status daemon = VerifyDaemon(out.fd.get(), daemon_uid, socket_path); !daemon.ok()) {
    if (refused != nullptr) *refused = true;
    return daemon;
  }
  WireWriter w;
  EncodeHello(&w, hello);
  KVTIER_RETURN_IF_ERROR(
      SendFrame(out.fd.get(), static_cast<uint16_t>(MsgType::kHello), seq, w.data(), -1, deadline));
  KVTIER_ASSIGN_OR_RETURN(Frame reply, RecvFrame(out.fd.get(), deadline));
  // Seq 0: the daemon refused this peer before reading its Hello (credentials, no room).
  if (reply.header.type != static_cast<uint16_t>(MsgType::kReply) ||
      (reply.header.seq != seq && reply.header.seq != 0)) {
    return Status::InvalidArgument("kvtier serve answered Hello out of step (type " +
                                   std::to_string(reply.header.type) + ", seq " +
                                   std::to_string(reply.header.seq) + ")");
  }
  WireReader r(reply.payload);
  Status status;
  KVTIER_RETURN_IF_ERROR(DecodeStatus(&r, &status));
  if (!status.ok()) {
    // Unavailable (try again: a pool closing, the last life of this instance ending) and no
    // room for a connection (seq 0: service.max_connections, no thread) are a moment's, not
    // a refusal of this engine.
    const bool moment = status.code() == StatusCode::kUnavailable ||
                        (status.code() == StatusCode::kResourceExhausted && reply.header.seq == 0);
    if (refused != nullptr) *refused = !moment;
    return status;
  }
  if (reply.header.seq != seq) {
    return Status::InvalidArgument("kvtier serve answered Hello with seq 0 and no refusal");
  }
  KVTIER_RETURN_IF_ERROR(DecodeHelloReply(&r, &out.reply));
  out.passed = std::move(reply.fd);
  return out;
}

}  // namespace kvtier::proto

#include "service/handshake.h"

#include "service/unix_socket.h"
#include "service/wire.h"

namespace kvtier::service {

Result<Handshake> OpenConnection(const std::string& socket_path, const Hello& hello, uint64_t seq,
                                 std::chrono::steady_clock::time_point deadline, bool* refused) {
  if (refused != nullptr) *refused = false;
  Handshake out;
  KVTIER_ASSIGN_OR_RETURN(out.fd, ConnectUnix(socket_path));
  WireWriter w;
  EncodeHello(&w, hello);
  KVTIER_RETURN_IF_ERROR(
      SendFrame(out.fd.get(), static_cast<uint16_t>(MsgType::kHello), seq, w.data(), -1, deadline));
  KVTIER_ASSIGN_OR_RETURN(Frame reply, RecvFrame(out.fd.get(), deadline));
  if (reply.header.type != static_cast<uint16_t>(MsgType::kReply) || reply.header.seq != seq) {
    return Status::InvalidArgument("kvtier serve answered Hello out of step (type " +
                                   std::to_string(reply.header.type) + ", seq " +
                                   std::to_string(reply.header.seq) + ")");
  }
  WireReader r(reply.payload);
  Status status;
  KVTIER_RETURN_IF_ERROR(DecodeStatus(&r, &status));
  if (!status.ok()) {
    if (refused != nullptr) *refused = true;
    return status;
  }
  KVTIER_RETURN_IF_ERROR(DecodeHelloReply(&r, &out.reply));
  out.passed = std::move(reply.fd);
  return out;
}

}  // namespace kvtier::service

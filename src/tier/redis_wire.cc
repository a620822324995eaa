#include "tier/redis_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>

#include "core/host_port.h"
#include "tier/piece_cursor.h"

namespace kvtier {
namespace {

constexpr size_t kReadBufferBytes = 256 << 10;
constexpr size_t kMaxLineBytes = 64 << 10;  // status and error lines; longer is a protocol error
constexpr int kMaxIov = 512;
// The most iovecs one readv of a scattered payload takes (the kernel refuses more than
// IOV_MAX); a payload over more pieces is received by several reads.
#ifdef IOV_MAX
constexpr int kMaxRecvIov = IOV_MAX < 1024 ? IOV_MAX : 1024;
#else
constexpr int kMaxRecvIov = 1024;
#endif

constexpr std::array<uint16_t, 256> MakeCrcTable() {
  std::array<uint16_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
    t[i] = crc;
  }
  return t;
}
constexpr std::array<uint16_t, 256> kCrcTable = MakeCrcTable();

// Milliseconds left to `deadline`, rounded up (a poll of 0 ms would spin), or 0 when passed.
int MillisLeft(RemoteDeadline deadline) {
  const auto left = deadline - RemoteClock::now();
  if (left <= RemoteClock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

timeval ToTimeval(std::chrono::milliseconds ms) {
  if (ms.count() < 1) ms = std::chrono::milliseconds(1);  // 0 would mean "no timeout"
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

std::string ContextError(redisContext* c) {
  if (c == nullptr) return "cannot allocate a hiredis context";
  std::string err = c->errstr;
  if (err.empty()) err = "error " + std::to_string(c->err);
  return err;
}

std::string ReplyText(const redisReply* r) {
  if (r == nullptr) return "no reply";
  if (r->str != nullptr) return std::string(r->str, r->len);
  return "reply type " + std::to_string(r->type);
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace

Result<RedisEndpoint> ParseRedisEndpoint(std::string_view text) {
  KVTIER_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(text, "redis endpoint"));
  return RedisEndpoint{std::move(hp.host), hp.port};
}

uint16_t RedisCrc16(std::string_view data) {
  uint16_t crc = 0;
  for (unsigned char c : data) {
    crc = static_cast<uint16_t>((crc << 8) ^ kCrcTable[((crc >> 8) ^ c) & 0xff]);
  }
  return crc;
}

uint16_t RedisHashSlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return static_cast<uint16_t>(RedisCrc16(key) % kRedisClusterSlots);
}

std::string EncodeRedisCommand(std::initializer_list<std::string_view> args) {
  std::string out = "*" + std::to_string(args.size()) + "\r\n";
  for (std::string_view a : args) {
    out += "$" + std::to_string(a.size()) + "\r\n";
    out += a;
    out += "\r\n";
  }
  return out;
}

std::string EncodeRedisCommandWithValue(std::string_view verb, std::string_view key,
                                        uint64_t value_bytes) {
  std::string out = "*3\r\n$" + std::to_string(verb.size()) + "\r\n";
  out += verb;
  out += "\r\n$" + std::to_string(key.size()) + "\r\n";
  out += key;
  out += "\r\n$" + std::to_string(value_bytes) + "\r\n";
  return out;
}

// ---------------------------------------------------------------------------------------------
// RedisConnection

RedisConnection::RedisConnection(RedisEndpoint endpoint, redisContext* context)
    : endpoint_(std::move(endpoint)), context_(context) {}

RedisConnection::~RedisConnection() {
  if (context_ != nullptr) redisFree(context_);
}

Result<std::unique_ptr<RedisConnection>> RedisConnection::Connect(const RedisEndpoint& endpoint,
                                                                  const std::string& username,
                                                                  const std::string& password,
                                                                  std::chrono::milliseconds timeout,
                                                                  RemoteDeadline deadline) {
  const std::string who = "redis " + endpoint.ToString();
  const int left = MillisLeft(deadline);
  if (left == 0) return Status::TimedOut(who + ": deadline passed before connecting");
  const auto connect_ms = std::min(timeout, std::chrono::milliseconds(left));
  redisContext* c =
      redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, ToTimeval(connect_ms));
  if (c == nullptr || c->err != 0) {
    std::string err = ContextError(c);
    if (c != nullptr) redisFree(c);
    return Status::Unavailable(who + ": cannot connect: " + err);
  }
  std::unique_ptr<RedisConnection> conn(new RedisConnection(endpoint, c));
  if (!password.empty()) {
    const int left_now = MillisLeft(deadline);
    if (left_now == 0) return Status::TimedOut(who + ": deadline passed before AUTH");
    redisSetTimeout(c, ToTimeval(std::chrono::milliseconds(left_now)));
    std::vector<const char*> argv = {"AUTH"};
    std::vector<size_t> lens = {4};
    if (!username.empty()) {
      argv.push_back(username.data());
      lens.push_back(username.size());
    }
    argv.push_back(password.data());
    lens.push_back(password.size());
    ReplyPtr reply(static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (reply == nullptr) {
      return Status::Unavailable(who + ": AUTH failed: " + ContextError(c));
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      return Status::Unavailable(who + ": AUTH refused: " + ReplyText(reply.get()) +
                                 " (check the username/password)");
    }
  }
  return conn;
}

Result<std::vector<RedisConnection::SlotRange>> RedisConnection::ClusterSlots(
    RemoteDeadline deadline) {
  const std::string who = "redis " + endpoint_.ToString();
  if (pipeline_mode_) return Status::Internal(who + ": CLUSTER SLOTS on a pipeline connection");
  const int left = MillisLeft(deadline);
  if (left == 0) return Status::TimedOut(who + ": deadline passed before CLUSTER SLOTS");
  redisSetTimeout(context_, ToTimeval(std::chrono::milliseconds(left)));
  ReplyPtr reply(static_cast<redisReply*>(redisCommand(context_, "CLUSTER SLOTS")));
  if (reply == nullptr && RemoteClock::now() >= deadline) {
    // hiredis reports its socket timeout as EAGAIN ("Resource temporarily unavailable").
    return Status::TimedOut(who + ": CLUSTER SLOTS got no answer by the deadline");
  }
  if (reply == nullptr) {
    return Status::Unavailable(who + ": CLUSTER SLOTS failed: " + ContextError(context_));
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    return Status::IOError(who + ": CLUSTER SLOTS refused: " + ReplyText(reply.get()));
  }
  if (reply->type != REDIS_REPLY_ARRAY) {
    return Status::IOError(who + ": CLUSTER SLOTS: unexpected reply type " +
                           std::to_string(reply->type));
  }
  std::vector<SlotRange> out;
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* r = reply->element[i];
    // [first, last, [host, port, id, ...], replicas...]
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER ||
        r->element[2]->type != REDIS_REPLY_ARRAY || r->element[2]->elements < 2 ||
        r->element[2]->element[0]->type != REDIS_REPLY_STRING ||
        r->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
      return Status::IOError(who + ": CLUSTER SLOTS: malformed entry " + std::to_string(i));
    }
    const long long first = r->element[0]->integer, last = r->element[1]->integer;
    const long long port = r->element[2]->element[1]->integer;
    if (first < 0 || last < first || last >= kRedisClusterSlots || port < 1 || port > 65535) {
      return Status::IOError(who + ": CLUSTER SLOTS: bad range " + std::to_string(first) + "-" +
                             std::to_string(last) + " port " + std::to_string(port));
    }
    SlotRange range;
    range.first = static_cast<uint32_t>(first);
    range.last = static_cast<uint32_t>(last);
    range.master.host = ReplyText(r->element[2]->element[0]);
    if (range.master.host.empty() || range.master.host == "?") range.master.host = endpoint_.host;
    range.master.port = static_cast<uint16_t>(port);
    out.push_back(std::move(range));
  }
  return out;
}

bool RedisConnection::IdleHealthy() {
  if (rpos_ != rlen_) return false;
  char c;
  const ssize_t n = recv(context_->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

Status RedisConnection::EnterPipelineMode() {
  if (pipeline_mode_) return Status::Ok();
  const int flags = fcntl(context_->fd, F_GETFL);
  if (flags < 0 || fcntl(context_->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return Status::FromErrno(errno, "redis " + endpoint_.ToString() + ": fcntl O_NONBLOCK");
  }
  rbuf_.reset(new uint8_t[kReadBufferBytes]);
  rpos_ = rlen_ = 0;
  pipeline_mode_ = true;
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// RedisPipeline

namespace {

uint64_t CommandBytes(const WireCommand& c) {
  return c.head.size() + (c.has_value ? c.value.size() + 2 : 0);
}

bool WouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

// Copies `n` payload bytes into `pieces` from `at` on, across piece boundaries, and moves `at`
// past them. REQUIRES: n <= the room left in the pieces.
void CopyToPieces(std::span<const std::span<uint8_t>> pieces, PieceCursor& at, const uint8_t* src,
                  uint64_t n) {
  while (n > 0) {
    const std::span<uint8_t> piece = pieces[at.index];
    const uint64_t take = std::min<uint64_t>(n, piece.size() - at.offset);
    if (take > 0) std::memcpy(piece.data() + at.offset, src, take);
    src += take;
    n -= take;
    at.offset += take;
    if (at.offset == piece.size()) {  // filled, or empty: on to the next
      ++at.index;
      at.offset = 0;
    }
  }
}

// Tells cmd.on_landed (when set) of the `n` bytes just stored at body offset `offset`: in dest,
// or in the pieces from `at` on (the cursor before it moved past them).
void Landed(const WireCommand& cmd, const PieceCursor& at, uint64_t offset, uint64_t n) {
  if (cmd.on_landed == nullptr || n == 0) return;
  if (cmd.pieces.empty()) {
    (*cmd.on_landed)(offset, std::span<const uint8_t>(cmd.dest.data() + offset, n));
    return;
  }
  size_t index = at.index;
  uint64_t skip = at.offset;
  while (n > 0 && index < cmd.pieces.size()) {
    const std::span<uint8_t> piece = cmd.pieces[index];
    const uint64_t take = std::min<uint64_t>(n, piece.size() - skip);
    if (take > 0) (*cmd.on_landed)(offset, std::span<const uint8_t>(piece.data() + skip, take));
    offset += take;
    n -= take;
    ++index;
    skip = 0;
  }
}

// One readv of at most `want` bytes from `fd` into `pieces` from `at` on, over at most
// kMaxRecvIov pieces (never a syscall per piece: pieces can be small and many). Returns what
// readv returns; the caller advances `at`. REQUIRES: want > 0 and want <= the room left.
ssize_t ReceiveIntoPieces(int fd, std::span<const std::span<uint8_t>> pieces, PieceCursor at,
                          uint64_t want) {
  iovec iov[kMaxRecvIov];
  return readv(fd, iov, at.ToIovecs(pieces, want, iov));
}

}  // namespace

// Progress of one lane: how far its commands are sent and its replies parsed.
struct RedisPipeline::LaneState {
  size_t send_cmd = 0;  // first command not fully sent
  size_t send_off = 0;  // bytes of it already sent
  // Inside a bulk reply: the payload's length, how much of it was consumed, then CRLF.
  bool in_body = false;
  bool body_too_large = false;
  uint64_t body_len = 0, body_done = 0;
  PieceCursor piece;  // a scattered payload: where byte body_done goes
  uint32_t crlf_left = 0;
  bool Finished(const Lane& lane) const {
    return !lane.failure.ok() || lane.replies.size() == lane.commands.size();
  }
};

size_t RedisPipeline::SendLimit(const Lane& lane, const PipelineWindow& window) {
  const size_t first = lane.replies.size();
  const size_t by_count = std::min(lane.commands.size(), first + window.commands);
  uint64_t bytes = 0;
  for (size_t i = first; i < by_count; ++i) {
    const WireCommand& c = lane.commands[i];
    bytes += CommandBytes(c) + c.Capacity();
    if (bytes > window.bytes && i > first) return i;
  }
  return by_count;
}

bool RedisPipeline::SendSome(Lane& lane, LaneState& st, const PipelineWindow& window) {
  static const char kCrlf[2] = {'\r', '\n'};
  RedisConnection* conn = lane.conn;
  bool moved = false;
  for (;;) {
    const size_t limit = SendLimit(lane, window);
    if (st.send_cmd >= limit) return moved;
    iovec iov[kMaxIov];
    int n = 0;
    size_t skip = st.send_off;
    for (size_t i = st.send_cmd; i < limit && n + 3 <= kMaxIov; ++i) {
      const WireCommand& c = lane.commands[i];
      const std::pair<const void*, size_t> parts[3] = {
          {c.head.data(), c.head.size()},
          {c.value.data(), c.has_value ? c.value.size() : 0},
          {kCrlf, c.has_value ? 2 : 0}};
      for (const auto& [p, len] : parts) {
        if (len == 0) continue;
        if (skip >= len) {
          skip -= len;
          continue;
        }
        iov[n].iov_base = const_cast<char*>(static_cast<const char*>(p) + skip);
        iov[n].iov_len = len - skip;
        skip = 0;
        ++n;
      }
    }
    if (n == 0) return moved;
    const ssize_t w = writev(conn->context_->fd, iov, n);
    if (w < 0) {
      if (WouldBlock(errno)) return moved;
      lane.failure = Status::Unavailable("redis " + conn->endpoint_.ToString() +
                                         ": send failed: " + std::strerror(errno));
      return moved;
    }
    moved = true;
    uint64_t left = static_cast<uint64_t>(w);
    while (left > 0) {
      const uint64_t rest = CommandBytes(lane.commands[st.send_cmd]) - st.send_off;
      if (left >= rest) {
        left -= rest;
        ++st.send_cmd;
        st.send_off = 0;
      } else {
        st.send_off += left;
        left = 0;
      }
    }
  }
}

bool RedisPipeline::ParseBuffered(Lane& lane, LaneState& st) {
  RedisConnection* conn = lane.conn;
  auto protocol_error = [&](const std::string& what) {
    lane.failure =
        Status::IOError("redis " + conn->endpoint_.ToString() + ": protocol error: " + what);
    return false;
  };
  while (lane.replies.size() < lane.commands.size()) {
    const uint8_t* buf = conn->rbuf_.get();
    if (st.in_body) {
      WireCommand& cmd = lane.commands[lane.replies.size()];
      const uint64_t avail = conn->rlen_ - conn->rpos_;
      if (st.body_done < st.body_len) {
        const uint64_t take = std::min(avail, st.body_len - st.body_done);
        if (take == 0) return true;
        if (st.body_too_large) {
          // drained, never stored
        } else if (cmd.pieces.empty()) {
          std::memcpy(cmd.dest.data() + st.body_done, buf + conn->rpos_, take);
          Landed(cmd, st.piece, st.body_done, take);
        } else {
          const PieceCursor from = st.piece;
          CopyToPieces(cmd.pieces, st.piece, buf + conn->rpos_, take);
          Landed(cmd, from, st.body_done, take);
        }
        st.body_done += take;
        conn->rpos_ += take;
        continue;
      }
      while (st.crlf_left > 0 && conn->rpos_ < conn->rlen_) {
        const char want = st.crlf_left == 2 ? '\r' : '\n';
        if (buf[conn->rpos_] != want) return protocol_error("bulk reply not ended by CRLF");
        ++conn->rpos_;
        --st.crlf_left;
      }
      if (st.crlf_left > 0) return true;
      WireReply r;
      r.kind = st.body_too_large ? WireReply::Kind::kBulkTooLarge : WireReply::Kind::kBulk;
      r.length = st.body_len;
      lane.replies.push_back(std::move(r));
      st.in_body = false;
      continue;
    }
    const uint8_t* start = buf + conn->rpos_;
    const uint8_t* end = buf + conn->rlen_;
    const uint8_t* cr = nullptr;
    for (const uint8_t* p = start; p + 1 < end; ++p) {
      if (p[0] == '\r' && p[1] == '\n') {
        cr = p;
        break;
      }
    }
    if (cr == nullptr) {
      if (static_cast<size_t>(end - start) > kMaxLineBytes) {
        return protocol_error("reply line longer than " + std::to_string(kMaxLineBytes));
      }
      return true;  // need more bytes
    }
    const char type = static_cast<char>(start[0]);
    const std::string_view line(reinterpret_cast<const char*>(start) + 1,
                                static_cast<size_t>(cr - start) - 1);
    conn->rpos_ += static_cast<size_t>(cr - start) + 2;
    WireReply r;
    switch (type) {
      case '+':
        r.kind = WireReply::Kind::kStatus;
        r.text = std::string(line);
        break;
      case '-':
        r.kind = WireReply::Kind::kError;
        r.text = std::string(line);
        break;
      case ':': {
        r.kind = WireReply::Kind::kInteger;
        const auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), r.integer);
        if (ec != std::errc() || p != line.data() + line.size()) {
          return protocol_error("bad integer reply '" + std::string(line) + "'");
        }
        break;
      }
      case '$': {
        int64_t len = 0;
        const auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), len);
        if (ec != std::errc() || p != line.data() + line.size() || len < -1) {
          return protocol_error("bad bulk length '" + std::string(line) + "'");
        }
        if (len == -1) {
          r.kind = WireReply::Kind::kNil;
          break;
        }
        // The length is checked against the capacity before a byte is stored.
        st.in_body = true;
        st.body_len = static_cast<uint64_t>(len);
        st.body_done = 0;
        st.piece = PieceCursor{};
        st.crlf_left = 2;
        st.body_too_large = st.body_len > lane.commands[lane.replies.size()].Capacity();
        continue;
      }
      default:
        return protocol_error(std::string("unexpected reply type '") + type + "'");
    }
    lane.replies.push_back(std::move(r));
  }
  if (conn->rpos_ < conn->rlen_) return protocol_error("more replies than commands");
  return true;
}

bool RedisPipeline::ReceiveSome(Lane& lane, LaneState& st) {
  RedisConnection* conn = lane.conn;
  bool moved = false;
  while (lane.failure.ok() && lane.replies.size() < lane.commands.size()) {
    if (conn->rpos_ == conn->rlen_) conn->rpos_ = conn->rlen_ = 0;
    ssize_t n;
    const bool direct = st.in_body && !st.body_too_large && conn->rpos_ == conn->rlen_ &&
                        st.body_done < st.body_len;
    if (direct) {
      // The payload goes straight from the socket into the caller's dest or pieces.
      WireCommand& cmd = lane.commands[lane.replies.size()];
      const PieceCursor from = st.piece;
      if (cmd.pieces.empty()) {
        n = recv(conn->context_->fd, cmd.dest.data() + st.body_done, st.body_len - st.body_done, 0);
      } else {
        n = ReceiveIntoPieces(conn->context_->fd, cmd.pieces, st.piece, st.body_len - st.body_done);
        if (n > 0) st.piece.Advance(cmd.pieces, static_cast<uint64_t>(n));
      }
      if (n > 0) {
        Landed(cmd, from, st.body_done, static_cast<uint64_t>(n));
        st.body_done += static_cast<uint64_t>(n);
      }
    } else {
      if (conn->rpos_ > 0 && conn->rlen_ == kReadBufferBytes) {
        std::memmove(conn->rbuf_.get(), conn->rbuf_.get() + conn->rpos_, conn->rlen_ - conn->rpos_);
        conn->rlen_ -= conn->rpos_;
        conn->rpos_ = 0;
      }
      n = recv(conn->context_->fd, conn->rbuf_.get() + conn->rlen_, kReadBufferBytes - conn->rlen_,
               0);
      if (n > 0) conn->rlen_ += static_cast<size_t>(n);
    }
    if (n == 0) {
      lane.failure = Status::Unavailable("redis " + conn->endpoint_.ToString() +
                                         ": connection closed by the server");
      return moved;
    }
    if (n < 0) {
      if (WouldBlock(errno)) return moved;
      lane.failure = Status::Unavailable("redis " + conn->endpoint_.ToString() +
                                         ": receive failed: " + std::strerror(errno));
      return moved;
    }
    moved = true;
    if (!ParseBuffered(lane, st)) return moved;
  }
  return moved;
}

void RedisPipeline::Run(std::span<Lane> lanes, PipelineWindow window, RemoteDeadline deadline) {
  window.commands = std::max<uint32_t>(window.commands, 1);
  std::vector<LaneState> states(lanes.size());
  for (Lane& lane : lanes) {
    lane.replies.clear();
    lane.replies.reserve(lane.commands.size());
    lane.failure = Status::Ok();
    if (Status s = lane.conn->EnterPipelineMode(); !s.ok()) lane.failure = s;
    if (lane.conn->rpos_ != lane.conn->rlen_) {
      lane.failure = Status::IOError("redis " + lane.conn->endpoint_.ToString() +
                                     ": unexpected bytes before the first reply");
    }
  }
  std::vector<pollfd> fds;
  std::vector<size_t> fd_lane;
  for (;;) {
    bool any_moved = false, all_done = true;
    for (size_t i = 0; i < lanes.size(); ++i) {
      if (states[i].Finished(lanes[i])) continue;
      if (SendSome(lanes[i], states[i], window)) any_moved = true;
      if (lanes[i].failure.ok() && ReceiveSome(lanes[i], states[i])) any_moved = true;
      if (!states[i].Finished(lanes[i])) all_done = false;
    }
    if (all_done) return;
    const int left = MillisLeft(deadline);
    if (left == 0) break;
    if (any_moved) continue;  // try again before sleeping: the socket may take more now
    fds.clear();
    fd_lane.clear();
    for (size_t i = 0; i < lanes.size(); ++i) {
      if (states[i].Finished(lanes[i])) continue;
      const size_t limit = SendLimit(lanes[i], window);
      short events = POLLIN;
      if (states[i].send_cmd < limit) events |= POLLOUT;
      fds.push_back(pollfd{lanes[i].conn->context_->fd, events, 0});
      fd_lane.push_back(i);
    }
    const int r = poll(fds.data(), fds.size(), left);
    if (r < 0 && errno != EINTR) {
      for (size_t k = 0; k < fd_lane.size(); ++k) {
        lanes[fd_lane[k]].failure = Status::FromErrno(errno, "redis pipeline: poll");
      }
      return;
    }
  }
  for (size_t i = 0; i < lanes.size(); ++i) {
    if (states[i].Finished(lanes[i])) continue;
    lanes[i].failure = Status::TimedOut(
        "redis " + lanes[i].conn->endpoint_.ToString() + ": deadline passed with " +
        std::to_string(lanes[i].commands.size() - lanes[i].replies.size()) + " of " +
        std::to_string(lanes[i].commands.size()) + " replies outstanding");
  }
}

}  // namespace kvtier

// The Redis wire layer of the G4 Redis backend: endpoints, cluster hash slots, one connection,
// and a driver that runs pipelined commands over several connections at once.
//
// hiredis (Debian 12: 0.14.1, synchronous API, no SSL, no cluster) opens each connection
// (connect with a timeout, AUTH) and runs the rare control commands (CLUSTER SLOTS) through
// its reply parser. The data path then drives the socket itself, non-blocking, because
// hiredis 0.14 cannot do what it needs:
//   - redisAppendCommandArgv copies every value twice into its output buffer, and
//     redisBufferWrite shifts the rest of that buffer down after each partial write, which is
//     quadratic for a pipeline of 64 x 2 MiB values. Here the value is written with writev
//     straight from the caller's memory (no copy at all).
//   - its reader copies a bulk reply twice (into its buffer, then into a reply object); here
//     the payload of a GET is received straight into the caller's dest (or scattered over the
//     caller's pieces by readv), after its length was checked against that capacity (a larger
//     object is drained, never copied).
//   - redisSetTimeout bounds each syscall, not the call: a server that trickles bytes could
//     hold a call past its deadline. Here every wait is a poll bounded by the deadline.
// The bytes on the wire are the same RESP commands hiredis would send.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "tier/remote_store.h"

struct redisContext;

namespace kvtier {

struct RedisEndpoint {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// Parses "host:port" (host: a name or IPv4 address, or "[v6addr]"). InvalidArgument naming
// `text` and what is wrong ("missing :port", "port must be 1..65535", "empty host").
Result<RedisEndpoint> ParseRedisEndpoint(std::string_view text);

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the Redis Cluster key hash.
uint16_t RedisCrc16(std::string_view data);
constexpr uint32_t kRedisClusterSlots = 16384;
// The cluster slot of `key`: CRC16 of the key, or of its hash tag (the text between the first
// '{' and the next '}', when that is not empty), modulo 16384.
uint16_t RedisHashSlot(std::string_view key);

// One parsed reply of the data path.
struct WireReply {
  enum class Kind : uint8_t { kStatus, kError, kInteger, kBulk, kNil, kBulkTooLarge };
  Kind kind = Kind::kNil;
  std::string text;     // kStatus, kError: the line (for an error, the server's message)
  int64_t integer = 0;  // kInteger
  uint64_t length = 0;  // kBulk: bytes stored into the command's dest; kBulkTooLarge: size
};

// One command of a pipeline: `head` is the RESP text of the command; when `value` is set,
// head ends with the value's "$<len>\r\n" and the value and "\r\n" follow (sent from the
// caller's memory). A bulk reply lands in `dest` (or, when `pieces` is set, scattered over the
// pieces in order, received with one readv per socket read) when it fits in Capacity();
// otherwise it is drained and reported as kBulkTooLarge, dest and pieces untouched.
struct WireCommand {
  std::string head;
  std::span<const uint8_t> value;
  bool has_value = false;
  std::span<uint8_t> dest;
  // The scatter destination (RemoteGet::pieces), used instead of dest when not empty, and the
  // pieces' total size. Set both with ScatterInto; the pieces must outlive the pipeline run.
  std::span<const std::span<uint8_t>> pieces = {};
  uint64_t pieces_bytes = 0;
  // RemoteGet::on_landed: told of each range of a stored bulk reply as it lands (not owned).
  const std::function<void(uint64_t, std::span<const uint8_t>)>* on_landed = nullptr;

  void ScatterInto(std::span<const std::span<uint8_t>> into) {
    pieces = into;
    pieces_bytes = 0;
    for (const std::span<uint8_t>& p : into) pieces_bytes += p.size();
  }
  // The most bytes a bulk reply may have to be stored.
  uint64_t Capacity() const { return pieces.empty() ? dest.size() : pieces_bytes; }
};

// Encodes a command of plain arguments as RESP (no value part).
std::string EncodeRedisCommand(std::initializer_list<std::string_view> args);
// Encodes `verb key` followed by the header of a value argument of `value_bytes`, for a
// WireCommand with has_value (e.g. SET key <value>).
std::string EncodeRedisCommandWithValue(std::string_view verb, std::string_view key,
                                        uint64_t value_bytes);

// A connection to one Redis server. Not thread-safe: one user at a time (the pool hands it
// out).
class RedisConnection {
 public:
  // Connects within min(connect_timeout, time left to deadline) and authenticates (AUTH
  // [user] password) when `password` is not empty. Unavailable with hiredis' reason when the
  // server cannot be reached or refuses AUTH (the server's message included), TimedOut when
  // the deadline passed first.
  static Result<std::unique_ptr<RedisConnection>> Connect(const RedisEndpoint& endpoint,
                                                          const std::string& username,
                                                          const std::string& password,
                                                          std::chrono::milliseconds timeout,
                                                          RemoteDeadline deadline);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // CLUSTER SLOTS through hiredis, bounded by `deadline`: each slot range with the "host:port"
  // of its master (an empty host in the reply means this connection's host). Unavailable /
  // TimedOut / IOError (with the server's message) on failure.
  struct SlotRange {
    uint32_t first = 0, last = 0;
    RedisEndpoint master;
  };
  Result<std::vector<SlotRange>> ClusterSlots(RemoteDeadline deadline);

  const RedisEndpoint& endpoint() const { return endpoint_; }

  // For a connection taken from a pool: true when nothing is waiting on it. False when the
  // server closed it while idle (restarted, idle timeout) or sent bytes nobody asked for;
  // such a connection must be discarded. One non-blocking peek, no wait.
  bool IdleHealthy();

 private:
  friend class RedisPipeline;
  RedisConnection(RedisEndpoint endpoint, redisContext* context);
  // Switches the socket to non-blocking for the data path (idempotent).
  Status EnterPipelineMode();

  RedisEndpoint endpoint_;
  redisContext* context_;
  bool pipeline_mode_ = false;
  // Receive buffer of the data path: bytes [rpos_, rlen_) are received but not yet parsed.
  std::unique_ptr<uint8_t[]> rbuf_;
  size_t rpos_ = 0, rlen_ = 0;
};

// The most a lane keeps in flight: commands sent whose reply has not been read in full.
struct PipelineWindow {
  uint32_t commands = 64;
  // Bytes of the commands in flight plus their replies' destinations. The first command in
  // flight is always allowed, whatever its size. Large values are what this bounds: Redis
  // copies each reply into an output buffer, and 64 pipelined 2 MiB GETs make it allocate (and
  // fault in) 128 MiB of fresh buffers, about 5x slower than one at a time (docs/pd.md).
  // RedisStoreOptions (max_pipeline, max_pipeline_bytes) sets both; these are its defaults.
  uint64_t bytes = 4ull << 20;
};

// Runs lanes of pipelined commands, one lane per connection, all lanes at once from the
// calling thread (non-blocking sockets, one poll over all of them), within `window` per lane.
// Returns when every lane has all its replies or has failed, and never later than the
// deadline (plus one poll granularity).
class RedisPipeline {
 public:
  struct Lane {
    RedisConnection* conn = nullptr;
    std::span<WireCommand> commands;
    std::vector<WireReply> replies;  // filled in order; replies.size() <= commands.size()
    // Not ok when the lane stopped early: TimedOut (deadline), Unavailable (connection lost or
    // refused), IOError (protocol violation). The connection must then be discarded.
    Status failure;
  };
  static void Run(std::span<Lane> lanes, PipelineWindow window, RemoteDeadline deadline);

 private:
  struct LaneState;
  // Each moves a lane forward without blocking: returns whether any byte moved; sets
  // lane.failure when the lane cannot go on.
  static bool SendSome(Lane& lane, LaneState& st, const PipelineWindow& window);
  // One past the last command of `lane` that `window` lets be sent now.
  static size_t SendLimit(const Lane& lane, const PipelineWindow& window);
  static bool ReceiveSome(Lane& lane, LaneState& st);
  // Parses what the receive buffer holds; returns false with lane.failure set on a protocol
  // violation.
  static bool ParseBuffered(Lane& lane, LaneState& st);
};

}  // namespace kvtier

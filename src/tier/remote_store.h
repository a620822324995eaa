// RemoteStore: G4, storage shared by many workers on existing distributed engines (Redis,
// Redis Cluster, a shared filesystem). One object per block, holding the block exactly as it
// is stored at rest (block_format.h: the header, then the payload) — the same bytes as a G2
// slot, so a put reads straight from a slot and a get lands straight in one.
//
// A store moves opaque bytes; it does not verify them. The caller (the transfer engine) runs
// VerifyBlock on everything it gets, so a corrupt, torn, foreign or stale object is a miss,
// never served.
//
// Failure model: every call takes a deadline and returns by it. A server that is down, slow
// or failing makes calls fail fast (Unavailable / TimedOut per item), never throw, never hang;
// a circuit breaker stops calling a dead server and probes until it is back. A store can be
// opened while its server is down: it starts with its breaker open.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

using RemoteClock = std::chrono::steady_clock;
using RemoteDeadline = RemoteClock::time_point;

// The object name of a block: "kvt1:" + 16 hex digits of the namespace id + ":" + 32 hex
// digits of the key. The namespace is part of the name, so tenants (models, layouts, salts,
// adapters) never see each other's blocks; no hash tag, so blocks spread over a cluster.
std::string RemoteObjectName(uint64_t namespace_id, const BlockKey& key);

// One object to store: `bytes` is the whole stored block (header + payload).
struct RemotePut {
  std::string name;
  std::span<const uint8_t> bytes;
};

// One object to fetch into `dest`, or scattered over `pieces`; on success `bytes_read` is the
// object's size (<= Capacity()).
struct RemoteGet {
  std::string name;
  std::span<uint8_t> dest;
  uint64_t bytes_read = 0;
  // When not empty, the object lands in these pieces, in order, instead of in dest (dest is
  // ignored); the capacity is their total size. The first pieces[0].size() bytes of the object
  // go to pieces[0], the next pieces[1].size() to pieces[1], and so on, so a caller can receive
  // a block's header into a small buffer and its payload straight into the chunks of an
  // engine's cache, with no intermediate copy. Results as for dest: Ok with bytes_read (an object
  // smaller than the capacity fills the leading pieces; the bytes after it are not written),
  // NotFound, Corruption when the object is larger than the capacity (nothing is copied), or a
  // failure (after which the pieces may hold part of the object, as dest may). Pieces may be empty
  // and may number in the thousands; they must not overlap, and they must stay valid, like
  // dest, until Get returns.
  std::vector<std::span<uint8_t>> pieces = {};
  // When set, told of every range of the object as it lands in dest or the pieces, in order,
  // on the calling thread, while the bytes are still in the CPU's caches (so a caller can hash
  // them without reading them again): `offset` is the range's place in the object. On Ok the
  // ranges cover [0, bytes_read) once; a get that is tried again (a Redis Cluster redirect)
  // starts again at offset 0. Not called for an object larger than the capacity.
  std::function<void(uint64_t offset, std::span<const uint8_t> bytes)> on_landed = {};

  // Bytes this get can receive: dest.size(), or the pieces' total when pieces is not empty.
  uint64_t Capacity() const {
    if (pieces.empty()) return dest.size();
    uint64_t total = 0;
    for (const std::span<uint8_t>& p : pieces) total += p.size();
    return total;
  }
};

// Counters since the store was opened. Monotonic; read without locks.
struct RemoteStoreStats {
  uint64_t puts = 0, put_bytes = 0, put_failures = 0;
  uint64_t gets = 0, get_hits = 0, get_misses = 0, get_bytes = 0, get_failures = 0;
  uint64_t timeouts = 0;            // items that failed with TimedOut
  uint64_t breaker_rejections = 0;  // items refused without a call because the breaker was open
  uint64_t breaker_opens = 0;       // closed -> open transitions
  uint64_t reconnects = 0;          // connections (re)established after the first
  uint64_t redirects = 0;           // Redis Cluster MOVED/ASK followed
  bool breaker_open = false;        // now
};

class RemoteStore {
 public:
  virtual ~RemoteStore() = default;

  // Stores every item (an existing object of that name is replaced). results[i] is Ok, or
  // TimedOut (the deadline passed first), Unavailable (server down or the breaker open),
  // IOError (the server refused, e.g. out of memory, or the protocol failed). Returns by
  // `deadline` (plus at most one socket poll granularity). REQUIRES: results.size() ==
  // items.size(). Thread-safe.
  virtual void Put(std::span<const RemotePut> items, RemoteDeadline deadline,
                   std::span<Status> results) = 0;

  // Fetches every item into its dest, or its pieces when it has any (RemoteGet). results[i]
  // is Ok (bytes_read set), NotFound (no such object: a miss), Corruption (the object is
  // larger than the item's Capacity(): never copied), or TimedOut / Unavailable / IOError as
  // for Put. Same deadline and threading contract as Put.
  virtual void Get(std::span<RemoteGet> items, RemoteDeadline deadline,
                   std::span<Status> results) = 0;

  // Which of `names` exist (for Lookup: no payload moves). Sets present[i] to 1 or 0. Returns
  // Ok, or TimedOut / Unavailable / IOError with every present[i] left 0 (the caller treats
  // that as a miss). REQUIRES: present.size() == names.size().
  virtual Status Contains(std::span<const std::string> names, RemoteDeadline deadline,
                          std::span<uint8_t> present) = 0;

  // Deletes the objects that exist (tools and tests). Ok, or as for Contains.
  virtual Status Remove(std::span<const std::string> names, RemoteDeadline deadline) = 0;

  // "redis://127.0.0.1:6379", "redis-cluster://127.0.0.1:7000,...", "fs:/mnt/kv".
  virtual std::string Describe() const = 0;

  virtual RemoteStoreStats Stats() const = 0;
};

// Circuit breaker shared by the backends. Closed: calls go through; `failure_threshold`
// consecutive failures open it. Open: calls are refused (Unavailable) without touching the
// server for `open_for`, doubling on each failed probe up to `max_open_for`. Then one caller
// at a time is let through as a probe (half-open): success closes the breaker, failure opens
// it again.
struct CircuitBreakerOptions {
  uint32_t failure_threshold = 3;
  std::chrono::milliseconds open_for{200};
  std::chrono::milliseconds max_open_for{5000};
};

struct RedisStoreOptions {
  // "host:port" of the server, or with `cluster`, of one or more seed nodes.
  std::vector<std::string> endpoints;
  // Redis Cluster: hash-slot routing (CRC16 of the name, 16384 slots), MOVED/ASK followed,
  // topology (CLUSTER SLOTS) refreshed on MOVED and when a node is unreachable.
  bool cluster = false;
  std::string username;  // ACL user (empty: the default user)
  std::string password;  // AUTH when not empty
  uint32_t connections_per_node = 4;
  std::chrono::milliseconds connect_timeout{200};
  // A connection's pipeline holds at most this many commands awaiting their replies, and at
  // most this many bytes of commands and expected replies (always at least one command). The
  // byte bound matters for large values: see PipelineWindow (redis_wire.h).
  uint32_t max_pipeline = 64;
  uint64_t max_pipeline_bytes = 4ull << 20;
  CircuitBreakerOptions breaker;
};

// Opens a Redis (or Redis Cluster) store. InvalidArgument (naming the endpoint and what is
// wrong) for a malformed endpoint or empty list; Unavailable only if hiredis itself cannot be
// used. A server that is down is NOT an error: the store opens with its breaker open and
// probes. TLS: not supported by Debian 12's hiredis 0.14 (no hiredis_ssl).
Result<std::unique_ptr<RemoteStore>> OpenRedisStore(const RedisStoreOptions& options);

struct FsStoreOptions {
  std::string dir;  // a directory on a shared filesystem (NFS, Lustre, ...); created if missing
  CircuitBreakerOptions breaker;
};

// Opens a shared-filesystem store: one file per object under `dir` (fanned out by the first
// hex digits of the key), written under a temporary name and renamed into place (atomic
// publish), readable by many processes at once. InvalidArgument when `dir` is empty or not a
// directory; IOError (with errno text) when it cannot be created or written.
Result<std::unique_ptr<RemoteStore>> OpenFsStore(const FsStoreOptions& options);

}  // namespace kvtier

// The embedded manager's settings, typed: one struct per part, each filled once from a Config
// (FromConfig, when the manager is made) and checked (Validate); the manager keeps the structs
// and reads no setting by name afterwards.
//
// The keys behind the fields are registered in manager_config_keys.cc (and, for the policies
// and the event stream, in their modules). Validate checks every field against its key's range
// through CheckConfigValue (core/config_registry.h), so a range is written once, in the key's
// table, and a struct made in code is held to the rules a Config is; then the rules that tie
// fields together. Its InvalidArgument names the key, the value and what is allowed, as
// Config::Set does. FromConfig returns Validate's error.
//
// The defaults are the keys' too: a struct made in code starts from FromConfig(Config()), not
// from its zero-initialized fields.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "index/eviction_policy.h"
#include "kvtier/block_key.h"
#include "kvtier/config.h"
#include "kvtier/status.h"

namespace kvtier {

// hash.algorithm, manager.max_namespaces, manager.idle_request_ttl_ms: how requests are keyed
// and how long the request table keeps an idle entry.
struct RequestOptions {
  HashAlgorithm hash = HashAlgorithm::kSha256;
  uint32_t max_namespaces = 0;  // namespaces whose key hasher is kept
  uint64_t idle_request_ttl_ms = 0;

  static Result<RequestOptions> FromConfig(const Config& config);
  Status Validate() const;
};

// index.shards, gN.policy and each tier's policy settings (gN.credit_lru.*, gN.adaptive.*).
struct IndexOptions {
  struct TierPolicy {
    PolicyKind kind = PolicyKind::kLru;
    PolicyOptions options;
  };
  uint32_t shards = 0;
  TierPolicy g2;
  TierPolicy g3;

  // InvalidArgument naming the key when AdaptiveConfig refuses a value the key's range let
  // through (gN.adaptive.with_hit_density = 0.5).
  static Result<IndexOptions> FromConfig(const Config& config);
  // Also: a policy users cannot choose (belady), and policy settings their struct refuses.
  Status Validate() const;
};

// g2.*: the G2 arena and how the manager shares it.
struct G2Options {
  uint64_t capacity_bytes = 0;
  bool hugepages = false;
  bool lock_memory = false;
  uint32_t prefault_threads = 0;  // 0: all CPUs
  double namespace_share = 0;     // g2_slot_table.h: the G2 namespace share
  uint32_t staging_slots = 0;     // 0: auto (slots / 16, 4..64)

  static Result<G2Options> FromConfig(const Config& config);
  Status Validate() const;
};

// g3.*: the SSD tier and the manager's admission to it.
struct G3Options {
  bool enabled = false;
  std::string dir;
  // Whether g3.dir was given (a file, the environment, Set) rather than the default: a
  // directory the user named must open; the default one may fall back to G2 alone.
  bool dir_set = false;
  std::string dir_origin;  // where g3.dir was given (a file and line, a variable); may be empty
  uint64_t capacity_bytes = 0;
  bool flush_on_close = false;
  uint32_t files = 0;
  uint32_t queue_depth = 0;
  uint64_t write_budget_bytes_per_s = 0;  // 0: none
  uint32_t quarantine_after_errors = 0;
  uint32_t reprobe_interval_ms = 0;
  uint32_t admit_min_seen = 0;
  double admit_max_writes_per_hit = 0;  // 0: first sightings never admitted

  static Result<G3Options> FromConfig(const Config& config);
  Status Validate() const;
};

// transfer.*: the copy workers and the save queue.
struct TransferOptions {
  uint32_t copy_threads = 0;
  std::string load_stores;  // auto, cached, streaming (StreamLoadBytes)
  uint32_t max_queued_saves = 0;
  uint32_t max_defer_ms = 0;  // longest a save waits for a G2 slot

  static Result<TransferOptions> FromConfig(const Config& config);
  Status Validate() const;
};

// g4.*: the networked tier (docs/g4.md).
struct G4Options {
  enum class Backend : uint8_t { kNone, kRedis, kFs };
  Backend backend = Backend::kNone;
  std::vector<std::string> endpoints;  // redis: host:port items (g4.endpoints, split)
  bool cluster = false;
  std::string username;
  std::string password;
  std::string dir;  // fs
  bool write_through = false;
  uint32_t lookup_deadline_ms = 0;
  uint32_t load_deadline_ms = 0;
  uint32_t save_deadline_ms = 0;
  uint32_t threads = 0;
  uint32_t redis_pipeline_kib = 0;
  uint32_t max_queued_saves = 0;
  double load_gbps = 0;               // with recompute_tokens_per_s: offer only what loads faster
  double recompute_tokens_per_s = 0;  // than it recomputes (0: always offer)

  static const char* BackendName(Backend backend);  // "none", "redis", "fs"
  static Result<G4Options> FromConfig(const Config& config);
  // Also: redis needs endpoints, fs needs a dir.
  Status Validate() const;
};

// events.*: the KV event stream on the wire (docs/events.md); off while endpoint is empty.
struct EventOptions {
  std::string endpoint;
  std::string replay_endpoint;
  std::string topic;
  uint32_t queue_events = 0;
  uint32_t replay_batches = 0;
  uint64_t replay_bytes = 0;
  uint32_t data_parallel_rank = 0;

  static Result<EventOptions> FromConfig(const Config& config);
  // Also: a replay endpoint needs the stream's endpoint.
  Status Validate() const;
};

// metrics.*: the Prometheus /metrics endpoint; off while port is 0.
struct MetricsOptions {
  uint32_t port = 0;
  std::string bind;

  static Result<MetricsOptions> FromConfig(const Config& config);
  Status Validate() const;
};

// Every part's settings: what BlockManagerImpl keeps.
struct ManagerSettings {
  RequestOptions requests;
  IndexOptions index;
  G2Options g2;
  G3Options g3;
  TransferOptions transfer;
  G4Options g4;
  EventOptions events;
  MetricsOptions metrics;

  // Each part's FromConfig, in this order; the first error.
  static Result<ManagerSettings> FromConfig(const Config& config);
  // Each part's Validate, in that order; the first error.
  Status Validate() const;
};

}  // namespace kvtier

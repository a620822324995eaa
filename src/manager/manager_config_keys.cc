// The settings the embedded manager reads (hash, index, G2, G3, transfer, the request table,
// G4, /metrics) as config keys; the manager's typed options (manager_settings.h) are filled from
// them. This file registers them with core's registry (core/config_registry.h), with the keys it
// lists from other modules: the eviction policies' (index/policy_config_keys.h, after each
// gN.policy) and the event stream's (events/event_config_keys.h). kvtier serve's (service.*)
// are registered by src/proto (proto/service_config_keys.cc), which the client and the daemon
// both link.
//
// CMakeLists.txt keeps this file linked wherever kvtier_manager is (the anchor
// kvtier_manager_config_keys below): nothing else refers to it, and a static archive drops
// members nothing refers to.
#include "manager/manager_config_keys.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "core/host_port.h"
#include "events/event_config_keys.h"
#include "index/policy_config_keys.h"
#include "index/policy_names.h"

// Linked with --undefined=kvtier_manager_config_keys (CMakeLists.txt): see above.
extern "C" {
extern const int kvtier_manager_config_keys;
const int kvtier_manager_config_keys = 1;
}

namespace kvtier {
namespace {

constexpr uint64_t kKiB = 1ull << 10, kMiB = 1ull << 20;

// index.shards: the index picks a shard by masking a key.
Status CheckPowerOfTwo(std::string_view normalized) {
  const uint64_t v = std::strtoull(std::string(normalized).c_str(), nullptr, 10);
  if ((v & (v - 1)) != 0) return Status::InvalidArgument("not a power of two");
  return Status::Ok();
}

}  // namespace

Status CheckHostPortList(std::string_view value) {
  // Checked here, so that `kvtier config` refuses what the Redis store would refuse; split as
  // the manager splits (SplitEndpoints skips empty items).
  for (const std::string& item : SplitEndpoints(value)) {
    Result<HostPort> hp = ParseHostPort(item, "the endpoint");
    if (!hp.ok()) {
      return Status::InvalidArgument("not a list of host:port (" + hp.status().message() + ")");
    }
  }
  return Status::Ok();
}

ConfigKeyTable ManagerConfigKeys() {
  using T = ConfigType;
  // The product's policies; the keys' screen refuses the lab's by name (index/policy_names.h).
  const std::vector<std::string>& policies = ProductPolicyNames();
  ConfigKeyTable table;
  table.order = 100;
  table.warnings = PolicyConfigWarnings;
  table.keys = {
      {{"hash.algorithm",
        T::kChoice,
        "sha256",
        "block-key hash: sha256 (safe with untrusted prompts) or xxh3-128 (trusted setups only)",
        0,
        0,
        {"sha256", "xxh3-128"}}},
      {{"index.shards",
        T::kUint,
        "64",
        "lock shards of the block index (a power of two)",
        1,
        4096,
        {}},
       CheckPowerOfTwo},
      {{"g2.capacity_bytes",
        T::kBytes,
        "2GiB",
        "host DRAM for the G2 arena",
        4 * kKiB,
        UINT64_MAX,
        {}}},
      {{"g2.policy", T::kChoice, "adaptive", "G2 eviction policy", 0, 0, policies},
       nullptr,
       {},
       ScreenPolicyName},
      {{"g2.hugepages",
        T::kBool,
        "true",
        "advise transparent huge pages for the G2 arena",
        0,
        UINT64_MAX,
        {}}},
      {{"g2.lock_memory",
        T::kBool,
        "true",
        "mlock the G2 arena when permitted",
        0,
        UINT64_MAX,
        {}}},
      {{"g2.prefault_threads",
        T::kUint,
        "0",
        "threads that pre-fault G2 at start (0 = all CPUs)",
        0,
        1024,
        {}}},
      {{"g2.namespace_share",
        T::kDouble,
        "0.5",
        "fraction of G2 split evenly among the namespaces (model, salt, adapter) holding blocks "
        "in it: a namespace within its part is not evicted for another's blocks (0: off)",
        0,
        0,
        {},
        0,
        1}},
      {{"g2.staging_slots",
        T::kUint,
        "0",
        "G2 slots reserved for staging G3/G4 loads (0 = auto: slots/16, 4..64)",
        0,
        4096,
        {}}},
      {{"g3.enabled", T::kBool, "true", "use the local-SSD tier", 0, UINT64_MAX, {}}},
      {{"g3.dir",
        T::kString,
        "./kvtier-data",
        "directory of the G3 slot files",
        0,
        UINT64_MAX,
        {}}},
      {{"g3.capacity_bytes",
        T::kBytes,
        "8GiB",
        "bytes of G3 slot files",
        1 * kMiB,
        UINT64_MAX,
        {}}},
      {{"g3.flush_on_close",
        T::kBool,
        "true",
        "at a clean shutdown, write G2's blocks to G3 so a restart finds them",
        0,
        UINT64_MAX,
        {}}},
      {{"g3.files", T::kUint, "1", "slot files to spread G3 over", 1, 256, {}}},
      {{"g3.queue_depth", T::kUint, "32", "G3 I/Os in flight", 1, 4096, {}}},
      {{"g3.policy", T::kChoice, "adaptive", "G3 eviction policy", 0, 0, policies},
       nullptr,
       {},
       ScreenPolicyName},
      {{"g3.admit_min_seen",
        T::kUint,
        "2",
        "sightings of a block before G3 admits it (1 admits all)",
        1,
        15,
        {}}},
      {{"g3.admit_max_writes_per_hit",
        T::kDouble,
        "8",
        "below admit_min_seen sightings, blocks still go to G3 while a 1-in-16 sample of them "
        "yields a G3 hit per this many writes or better (0: never)",
        0,
        0,
        {},
        0,
        1e6}},
      {{"g3.write_budget_bytes_per_s",
        T::kBytes,
        "0",
        "cap on G3 write bandwidth to spare SSD endurance (0 = none)",
        0,
        UINT64_MAX,
        {}}},
      {{"g3.quarantine_after_errors",
        T::kUint,
        "8",
        "errors in a row that quarantine G3",
        1,
        1000000,
        {}}},
      {{"g3.reprobe_interval_ms",
        T::kUint,
        "10000",
        "wait between probes of a quarantined G3",
        1,
        86400000,
        {}}},
      {{"transfer.copy_threads",
        T::kUint,
        "2",
        "memcpy workers moving blocks G1 <-> G2",
        1,
        256,
        {}}},
      {{"transfer.load_stores",
        T::kChoice,
        "auto",
        "G2 -> G1 loads into a host G1: auto (non-temporal stores for a load at least the size of "
        "the last-level cache), cached, streaming",
        0,
        0,
        {"auto", "cached", "streaming"}}},
      {{"transfer.max_queued_saves",
        T::kUint,
        "1024",
        "saves waiting at most; beyond it a save is dropped and counted",
        1,
        1u << 24,
        {}}},
      {{"transfer.max_defer_ms",
        T::kUint,
        "500",
        "longest a save waits for a G2 slot (holding its G1 blocks) before it is dropped",
        0,
        60000,
        {}}},
      // The connector API's request table (docs/connector.md).
      {{"manager.idle_request_ttl_ms",
        T::kUint,
        "600000",
        "a request entry with nothing in flight and no call for it this long is dropped (a "
        "Lookup the engine never finished); later calls for it are NotFound",
        1,
        604800000,
        {}}},
      {{"manager.max_namespaces",
        T::kUint,
        "1024",
        "(cache_salt, adapter) namespaces whose key hasher is kept; past it the least recently "
        "used one is dropped and made again (the same keys) when a request names it",
        1,
        1u << 20,
        {}}},
      // G4: networked storage shared by workers (docs/g4.md).
      {{"g4.backend",
        T::kChoice,
        "none",
        "G4 backend: none, redis (Redis / Redis Cluster), fs (a shared directory)",
        0,
        0,
        {"none", "redis", "fs"}}},
      {{"g4.endpoints",
        T::kString,
        "",
        "redis: comma-separated host:port of the server or of cluster seed nodes",
        0,
        UINT64_MAX,
        {}},
       CheckHostPortList,
       "comma-separated host:port (e.g. 127.0.0.1:6379,[::1]:6380), or empty (not set)"},
      {{"g4.cluster",
        T::kBool,
        "false",
        "redis: the endpoints are Redis Cluster nodes",
        0,
        UINT64_MAX,
        {}}},
      {{"g4.username", T::kString, "", "redis: ACL user (empty: default)", 0, UINT64_MAX, {}}},
      {{"g4.password", T::kString, "", "redis: AUTH password (empty: none)", 0, UINT64_MAX, {}}},
      {{"g4.dir",
        T::kString,
        "",
        "fs: the shared directory (NFS, Lustre, ...)",
        0,
        UINT64_MAX,
        {}}},
      {{"g4.write_through",
        T::kBool,
        "true",
        "write every committed block to G4 once it is in G2 (false: only blocks leaving the "
        "local tiers go to G4)",
        0,
        UINT64_MAX,
        {}}},
      {{"g4.lookup_deadline_ms",
        T::kUint,
        "20",
        "Lookup waits this long at most for G4 to say what it holds (late: a miss)",
        1,
        60000,
        {}}},
      {{"g4.load_deadline_ms",
        T::kUint,
        "500",
        "a G4 load batch ends by this deadline (late blocks fail and are recomputed)",
        1,
        600000,
        {}}},
      {{"g4.save_deadline_ms",
        T::kUint,
        "2000",
        "a G4 save batch ends by this deadline",
        1,
        600000,
        {}}},
      {{"g4.threads",
        T::kUint,
        "2",
        "threads making G4 calls (one call each at a time)",
        1,
        64,
        {}}},
      {{"g4.redis_pipeline_kib",
        T::kUint,
        "4096",
        "Redis: KiB of commands and replies in flight per connection at most (always one "
        "command); deep pipelines of large values make Redis fault in fresh reply buffers",
        1,
        1u << 20,
        {}}},
      {{"g4.direct_to_g1",
        T::kBool,
        "true",
        "kvtier serve with a Redis G4: attached engines with a host G1 get G4 blocks themselves, "
        "straight into G1 (one copy; false: through the daemon's G2, two)",
        0,
        UINT64_MAX,
        {}}},
      {{"g4.max_queued_saves",
        T::kUint,
        "256",
        "G4 saves waiting at most; beyond it a save is dropped and counted",
        1,
        1u << 20,
        {}}},
      {{"g4.load_gbps",
        T::kDouble,
        "0",
        "expected G4 read bandwidth into this worker, GB/s; with g4.recompute_tokens_per_s, G4 "
        "blocks are offered only where loading one is faster than recomputing it (0: always "
        "offer)",
        0,
        0,
        {},
        0,
        1e6}},
      {{"g4.recompute_tokens_per_s",
        T::kDouble,
        "0",
        "the engine's prefill throughput, tokens/s (0: unknown, G4 blocks always offered)",
        0,
        0,
        {},
        0,
        1e9}},
      // Prometheus /metrics (docs/metrics.md).
      {{"metrics.port",
        T::kUint,
        "0",
        "serve Prometheus /metrics on this TCP port (0: off)",
        0,
        65535,
        {}}},
      {{"metrics.bind",
        T::kString,
        "127.0.0.1",
        "address the /metrics endpoint listens on (0.0.0.0: every interface)",
        0,
        UINT64_MAX,
        {}}},
  };
  // Each tier's policy settings follow its policy.
  for (const char* tier : {"g2", "g3"}) {
    auto after = std::find_if(table.keys.begin(), table.keys.end(), [&](const ConfigKey& k) {
      return k.spec.name == std::string(tier) + ".policy";
    });
    std::vector<ConfigKey> fields = PolicyConfigKeys(tier);
    table.keys.insert(after + 1, fields.begin(), fields.end());
  }
  return table;
}

namespace {

const ConfigKeysRegistration kManagerKeys(ManagerConfigKeys);
const ConfigKeysRegistration kEventKeys(EventConfigKeys);

}  // namespace
}  // namespace kvtier

#include "kvtier/config.h"

#include <fcntl.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/host_port.h"
#include "core/policy_names.h"
#include "core/regular_file.h"

extern char** environ;

namespace kvtier {
namespace {

constexpr uint64_t kKiB = 1ull << 10, kMiB = 1ull << 20, kGiB = 1ull << 30;

std::vector<ConfigFieldSpec> BaseSchema() {
  using T = ConfigType;
  // The product's policies; Set refuses the lab's by name (core/policy_names.h).
  const std::vector<std::string>& policies = ProductPolicyNames();
  return {
      {"hash.algorithm",
       T::kChoice,
       "sha256",
       "block-key hash: sha256 (safe with untrusted prompts) or xxh3-128 (trusted setups only)",
       0,
       0,
       {"sha256", "xxh3-128"}},
      {"index.shards",
       T::kUint,
       "64",
       "lock shards of the block index (a power of two)",
       1,
       4096,
       {}},
      {"g2.capacity_bytes",
       T::kBytes,
       "2GiB",
       "host DRAM for the G2 arena",
       4 * kKiB,
       UINT64_MAX,
       {}},
      {"g2.policy", T::kChoice, "adaptive", "G2 eviction policy", 0, 0, policies},
      {"g2.hugepages",
       T::kBool,
       "true",
       "advise transparent huge pages for the G2 arena",
       0,
       UINT64_MAX,
       {}},
      {"g2.lock_memory", T::kBool, "true", "mlock the G2 arena when permitted", 0, UINT64_MAX, {}},
      {"g2.prefault_threads",
       T::kUint,
       "0",
       "threads that pre-fault G2 at start (0 = all CPUs)",
       0,
       1024,
       {}},
      {"g2.namespace_share",
       T::kDouble,
       "0.5",
       "fraction of G2 split evenly among the namespaces (model, salt, adapter) holding blocks "
       "in it: a namespace within its part is not evicted for another's blocks (0: off)",
       0,
       0,
       {},
       0,
       1},
      {"g2.staging_slots",
       T::kUint,
       "0",
       "G2 slots reserved for staging G3/G4 loads (0 = auto: slots/16, 4..64)",
       0,
       4096,
       {}},
      {"g3.enabled", T::kBool, "true", "use the local-SSD tier", 0, UINT64_MAX, {}},
      {"g3.dir", T::kString, "./kvtier-data", "directory of the G3 slot files", 0, UINT64_MAX, {}},
      {"g3.capacity_bytes", T::kBytes, "8GiB", "bytes of G3 slot files", 1 * kMiB, UINT64_MAX, {}},
      {"g3.flush_on_close",
       T::kBool,
       "true",
       "at a clean shutdown, write G2's blocks to G3 so a restart finds them",
       0,
       UINT64_MAX,
       {}},
      {"g3.files", T::kUint, "1", "slot files to spread G3 over", 1, 256, {}},
      {"g3.queue_depth", T::kUint, "32", "G3 I/Os in flight", 1, 4096, {}},
      {"g3.policy", T::kChoice, "adaptive", "G3 eviction policy", 0, 0, policies},
      {"g3.admit_min_seen",
       T::kUint,
       "2",
       "sightings of a block before G3 admits it (1 admits all)",
       1,
       15,
       {}},
      {"g3.admit_max_writes_per_hit",
       T::kDouble,
       "8",
       "below admit_min_seen sightings, blocks still go to G3 while a 1-in-16 sample of them "
       "yields a G3 hit per this many writes or better (0: never)",
       0,
       0,
       {},
       0,
       1e6},
      {"g3.write_budget_bytes_per_s",
       T::kBytes,
       "0",
       "cap on G3 write bandwidth to spare SSD endurance (0 = none)",
       0,
       UINT64_MAX,
       {}},
      {"g3.quarantine_after_errors",
       T::kUint,
       "8",
       "errors in a row that quarantine G3",
       1,
       1000000,
       {}},
      {"g3.reprobe_interval_ms",
       T::kUint,
       "10000",
       "wait between probes of a quarantined G3",
       1,
       86400000,
       {}},
      {"transfer.copy_threads",
       T::kUint,
       "2",
       "memcpy workers moving blocks G1 <-> G2",
       1,
       256,
       {}},
      {"transfer.load_stores",
       T::kChoice,
       "auto",
       "G2 -> G1 loads into a host G1: auto (non-temporal stores for a load at least the size of "
       "the last-level cache), cached, streaming",
       0,
       0,
       {"auto", "cached", "streaming"}},
      {"transfer.max_queued_saves",
       T::kUint,
       "1024",
       "saves waiting at most; beyond it a save is dropped and counted",
       1,
       1u << 24,
       {}},
      {"transfer.max_defer_ms",
       T::kUint,
       "500",
       "longest a save waits for a G2 slot (holding its G1 blocks) before it is dropped",
       0,
       60000,
       {}},
      // The connector API's request table (docs/connector.md).
      {"manager.idle_request_ttl_ms",
       T::kUint,
       "600000",
       "a request entry with nothing in flight and no call for it this long is dropped (a "
       "Lookup the engine never finished); later calls for it are NotFound",
       1,
       604800000,
       {}},
      {"manager.max_namespaces",
       T::kUint,
       "1024",
       "(cache_salt, adapter) namespaces whose key hasher is kept; past it the least recently "
       "used one is dropped and made again (the same keys) when a request names it",
       1,
       1u << 20,
       {}},
      // G4: networked storage shared by workers (docs/g4.md).
      {"g4.backend",
       T::kChoice,
       "none",
       "G4 backend: none, redis (Redis / Redis Cluster), fs (a shared directory)",
       0,
       0,
       {"none", "redis", "fs"}},
      {"g4.endpoints",
       T::kString,
       "",
       "redis: comma-separated host:port of the server or of cluster seed nodes",
       0,
       UINT64_MAX,
       {}},
      {"g4.cluster",
       T::kBool,
       "false",
       "redis: the endpoints are Redis Cluster nodes",
       0,
       UINT64_MAX,
       {}},
      {"g4.username", T::kString, "", "redis: ACL user (empty: default)", 0, UINT64_MAX, {}},
      {"g4.password", T::kString, "", "redis: AUTH password (empty: none)", 0, UINT64_MAX, {}},
      {"g4.dir", T::kString, "", "fs: the shared directory (NFS, Lustre, ...)", 0, UINT64_MAX, {}},
      {"g4.write_through",
       T::kBool,
       "true",
       "write every committed block to G4 once it is in G2 (false: only blocks leaving the "
       "local tiers go to G4)",
       0,
       UINT64_MAX,
       {}},
      {"g4.lookup_deadline_ms",
       T::kUint,
       "20",
       "Lookup waits this long at most for G4 to say what it holds (late: a miss)",
       1,
       60000,
       {}},
      {"g4.load_deadline_ms",
       T::kUint,
       "500",
       "a G4 load batch ends by this deadline (late blocks fail and are recomputed)",
       1,
       600000,
       {}},
      {"g4.save_deadline_ms",
       T::kUint,
       "2000",
       "a G4 save batch ends by this deadline",
       1,
       600000,
       {}},
      {"g4.threads", T::kUint, "2", "threads making G4 calls (one call each at a time)", 1, 64, {}},
      {"g4.redis_pipeline_kib",
       T::kUint,
       "4096",
       "Redis: KiB of commands and replies in flight per connection at most (always one "
       "command); deep pipelines of large values make Redis fault in fresh reply buffers",
       1,
       1u << 20,
       {}},
      {"g4.direct_to_g1",
       T::kBool,
       "true",
       "kvtier serve with a Redis G4: attached engines with a host G1 get G4 blocks themselves, "
       "straight into G1 (one copy; false: through the daemon's G2, two)",
       0,
       UINT64_MAX,
       {}},
      {"g4.max_queued_saves",
       T::kUint,
       "256",
       "G4 saves waiting at most; beyond it a save is dropped and counted",
       1,
       1u << 20,
       {}},
      {"g4.load_gbps",
       T::kDouble,
       "0",
       "expected G4 read bandwidth into this worker, GB/s; with g4.recompute_tokens_per_s, G4 "
       "blocks are offered only where loading one is faster than recomputing it (0: always "
       "offer)",
       0,
       0,
       {},
       0,
       1e6},
      {"g4.recompute_tokens_per_s",
       T::kDouble,
       "0",
       "the engine's prefill throughput, tokens/s (0: unknown, G4 blocks always offered)",
       0,
       0,
       {},
       0,
       1e9},
      // Prometheus /metrics (docs/metrics.md).
      {"metrics.port",
       T::kUint,
       "0",
       "serve Prometheus /metrics on this TCP port (0: off)",
       0,
       65535,
       {}},
      {"metrics.bind",
       T::kString,
       "127.0.0.1",
       "address the /metrics endpoint listens on (0.0.0.0: every interface)",
       0,
       UINT64_MAX,
       {}},
      // kvtier serve: one kvtier per host that engines attach to (docs/service.md).
      {"service.socket",
       T::kString,
       "",
       "Unix socket of kvtier serve: engines attach to it (empty: embedded, in-process); the "
       "daemon listens on it",
       0,
       UINT64_MAX,
       {}},
      {"service.instance",
       T::kString,
       "",
       "attached engines: the instance name; processes of one engine (vLLM's scheduler and "
       "worker) give the same one (empty: one instance per process)",
       0,
       UINT64_MAX,
       {}},
      {"service.lease_ms",
       T::kUint,
       "5000",
       "longest an attached engine may take to copy a batch of blocks between its G1 and G2",
       10,
       600000,
       {}},
      {"service.call_timeout_ms",
       T::kUint,
       "5000",
       "attached engines: a call kvtier serve has not answered by then is a miss (the daemon "
       "counts as gone until it answers again)",
       10,
       600000,
       {}},
      {"service.reattach_ms",
       T::kUint,
       "1000",
       "attached engines: after the daemon went away, the wait between attempts to attach again",
       1,
       600000,
       {}},
      {"service.max_pools",
       T::kUint,
       "1",
       "the daemon: G2 pools it holds at once (one per model and layout; a tensor-parallel "
       "engine has one per rank); g2.capacity_bytes is the daemon's whole G2, split evenly "
       "among them, and a pool no engine uses gives its share to a new one",
       1,
       64,
       {}},
      {"service.allowed_gids",
       T::kString,
       "",
       "the daemon: comma-separated group ids whose processes (primary or supplementary "
       "group) may attach besides its own uid; the socket's directory and the socket then "
       "belong to the first of them (0750, 0660)",
       0,
       UINT64_MAX,
       {}},
      {"service.daemon_uid",
       T::kString,
       "",
       "attached engines: the uid kvtier serve runs as (empty: the engine's own); an engine "
       "sends nothing to a listener of another uid (SO_PEERCRED)",
       0,
       UINT64_MAX,
       {}},
      {"service.max_connections",
       T::kUint,
       "256",
       "the daemon: connections open at once (each has a thread); past it a new one is refused "
       "and counted, never the daemon's end",
       4,
       65536,
       {}},
      // KV events on the wire in vLLM's format (docs/events.md).
      {"events.endpoint",
       T::kString,
       "",
       "ZMQ PUB address of the KV event stream (tcp://*:5557 binds, tcp://host:5557 connects to "
       "a subscriber that binds; empty: off)",
       0,
       UINT64_MAX,
       {}},
      {"events.replay_endpoint",
       T::kString,
       "",
       "ZMQ ROUTER address (bound) that replays past batches from a sequence number (empty: none)",
       0,
       UINT64_MAX,
       {}},
      {"events.topic", T::kString, "", "topic frame of every event message", 0, UINT64_MAX, {}},
      {"events.queue_events",
       T::kUint,
       "100000",
       "events waiting to be sent at most; beyond it events are dropped and counted",
       1,
       1u << 24,
       {}},
      {"events.replay_batches", T::kUint, "10000", "batches kept for replay", 0, 1u << 20, {}},
      {"events.replay_bytes",
       T::kBytes,
       "256MiB",
       "payload bytes kept for replay at most (the oldest batches go first)",
       4096,
       UINT64_MAX,
       {}},
      {"events.data_parallel_rank",
       T::kUint,
       "0",
       "data_parallel_rank written in every batch (vLLM's)",
       0,
       1u << 16,
       {}},
  };
}

// credit-lru's settings for tier `tier` ("g2"): gN.credit_lru.<field>. The defaults and ranges
// are CreditLruConfig's (src/index/eviction_policy.h; core cannot include index, so
// tests/config_test.cc checks that they agree).
std::vector<ConfigFieldSpec> CreditLruFields(const std::string& tier) {
  constexpr double kMaxCredit = 64, kMaxGhostFactor = 64;
  struct Field {
    const char* name;
    const char* default_value;
    const char* doc;
    double min, max;
  };
  const Field fields[] = {
      {"used_twice", "0.75",
       "credit-lru: credit of a block used twice (x the tier's capacity; higher keeps it longer)",
       -kMaxCredit, kMaxCredit},
      {"used_thrice", "1.5", "credit-lru: credit of a block used three times or more", -kMaxCredit,
       kMaxCredit},
      {"long_follow_up", "-0.5",
       "credit-lru: credit of a run of 16+ blocks stored behind a deep hit (a follow-up turn "
       "that pasted a lot)",
       -kMaxCredit, kMaxCredit},
      {"stale_tail", "-1",
       "credit-lru: credit of a run's last block, never used since (0 when the engine's next "
       "turn reuses a prompt's last full block)",
       -kMaxCredit, kMaxCredit},
      {"ghost_factor", "4",
       "credit-lru: evicted keys whose use counts are remembered, x the tier's capacity (0: none)",
       0, kMaxGhostFactor},
  };
  std::vector<ConfigFieldSpec> out;
  for (const Field& f : fields) {
    out.push_back(ConfigFieldSpec{tier + ".credit_lru." + f.name,
                                  ConfigType::kDouble,
                                  f.default_value,
                                  f.doc,
                                  0,
                                  0,
                                  {},
                                  f.min,
                                  f.max});
  }
  return out;
}

// adaptive's settings for tier `tier`: gN.adaptive.<field>. The defaults and ranges are
// AdaptiveConfig's (src/index/eviction_policy.h; tests/policy_options_test.cc checks that they
// agree). half_life's range is (0, 1024]: the schema's inclusive minimum is 2^-10, and
// AdaptiveConfig::Validate checks again when the manager starts.
std::vector<ConfigFieldSpec> AdaptiveFields(const std::string& tier) {
  return {
      ConfigFieldSpec{tier + ".adaptive.half_life",
                      ConfigType::kDouble,
                      "16",
                      "adaptive: half-life of the shadow caches' scores, in references per "
                      "capacity block (shorter follows phase changes sooner)",
                      0,
                      0,
                      {},
                      1.0 / 1024,
                      1024},
      ConfigFieldSpec{tier + ".adaptive.hysteresis",
                      ConfigType::kDouble,
                      "0.02",
                      "adaptive: relative lead a candidate's score needs over the leader's "
                      "to take over",
                      0,
                      0,
                      {},
                      0,
                      10},
      ConfigFieldSpec{tier + ".adaptive.with_hit_density",
                      ConfigType::kDouble,
                      "0",
                      "adaptive: 1 adds hit-density as a fifth candidate (0 or 1; it did not "
                      "beat credit-lru in the study, docs/policy-study.md 8.8)",
                      0,
                      0,
                      {},
                      0,
                      1},
  };
}

std::vector<ConfigFieldSpec> BuildSchema() {
  std::vector<ConfigFieldSpec> schema = BaseSchema();
  for (const char* tier : {"g2", "g3"}) {
    auto after = std::find_if(schema.begin(), schema.end(), [&](const ConfigFieldSpec& s) {
      return s.name == std::string(tier) + ".policy";
    });
    std::vector<ConfigFieldSpec> fields = CreditLruFields(tier);
    const std::vector<ConfigFieldSpec> adaptive = AdaptiveFields(tier);
    fields.insert(fields.end(), adaptive.begin(), adaptive.end());
    schema.insert(after + 1, fields.begin(), fields.end());
  }
  return schema;
}

// The shortest text that reads back as `v` ("0.75", "-1").
std::string ShortestText(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string EnvName(std::string_view field) {
  std::string env = "KVTIER_";
  for (char c : field) env += c == '.' ? '_' : static_cast<char>(std::toupper(c));
  return env;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(c));
  return out;
}

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  if (text.empty() || text[0] < '0' || text[0] > '9') {
    return Status::InvalidArgument("not a size");
  }
  uint64_t value = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (value > (UINT64_MAX - d) / 10) return Status::InvalidArgument("too large");
    value = value * 10 + d;
  }
  std::string_view suffix = text.substr(i);
  int shift = -1;
  if (suffix.empty() || suffix == "B")
    shift = 0;
  else if (suffix == "K" || suffix == "KiB")
    shift = 10;
  else if (suffix == "M" || suffix == "MiB")
    shift = 20;
  else if (suffix == "G" || suffix == "GiB")
    shift = 30;
  else if (suffix == "T" || suffix == "TiB")
    shift = 40;
  if (shift < 0) return Status::InvalidArgument("unknown suffix '" + std::string(suffix) + "'");
  if (shift > 0 && value > (UINT64_MAX >> shift)) return Status::InvalidArgument("too large");
  return value << shift;
}

namespace {

const ConfigFieldSpec* FindSpec(std::string_view name) {
  for (const ConfigFieldSpec& s : Config::Schema()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string Allowed(const ConfigFieldSpec& spec) {
  if (spec.name == "g4.endpoints") {
    return "comma-separated host:port (e.g. 127.0.0.1:6379,[::1]:6380), or empty (not set)";
  }
  if (spec.name == "events.endpoint" || spec.name == "events.replay_endpoint") {
    return "a ZMQ address: tcp://*:5557 (bind), tcp://HOST:PORT, ipc://PATH, or empty (off)";
  }
  switch (spec.type) {
    case ConfigType::kBytes:
      return "a size in bytes from " + std::to_string(spec.min) +
             (spec.max == UINT64_MAX ? "" : " to " + std::to_string(spec.max)) +
             ", with an optional K, M, G, T suffix (e.g. 4GiB)";
    case ConfigType::kUint:
      return "a whole number from " + std::to_string(spec.min) + " to " + std::to_string(spec.max);
    case ConfigType::kBool:
      return "true or false";
    case ConfigType::kString:
      return "any text";
    case ConfigType::kChoice: {
      std::string s = "one of";
      for (size_t i = 0; i < spec.choices.size(); ++i) s += (i ? ", " : " ") + spec.choices[i];
      return s;
    }
    case ConfigType::kDouble:
      return "a finite number from " + ShortestText(spec.real_min) + " to " +
             ShortestText(spec.real_max) + " (e.g. " + spec.default_value + ", the default)";
  }
  return "";
}

// Normalized text for `value`, or why the field refuses it.
Result<std::string> Normalize(const ConfigFieldSpec& spec, std::string_view value) {
  switch (spec.type) {
    case ConfigType::kBytes:
    case ConfigType::kUint: {
      Result<uint64_t> v = ParseByteSize(value);
      if (!v.ok() || (spec.type == ConfigType::kUint &&
                      value.find_first_not_of("0123456789") != std::string_view::npos)) {
        return Status::InvalidArgument(
            "not " + std::string(spec.type == ConfigType::kUint ? "a whole number" : "a size"));
      }
      if (*v < spec.min || *v > spec.max) return Status::InvalidArgument("out of range");
      if (spec.name == "index.shards" && (*v & (*v - 1)) != 0) {
        return Status::InvalidArgument("not a power of two");
      }
      return std::to_string(*v);
    }
    case ConfigType::kBool: {
      const std::string l = Lower(value);
      if (l == "true" || l == "1" || l == "yes" || l == "on") return std::string("true");
      if (l == "false" || l == "0" || l == "no" || l == "off") return std::string("false");
      return Status::InvalidArgument("not a boolean");
    }
    case ConfigType::kString:
      // Empty is allowed only where the default is empty ("not set", e.g. g4.password).
      if (value.empty() && !spec.default_value.empty()) return Status::InvalidArgument("empty");
      if ((spec.name == "events.endpoint" || spec.name == "events.replay_endpoint") &&
          !value.empty() && !value.starts_with("tcp://") && !value.starts_with("ipc://") &&
          !value.starts_with("inproc://")) {
        return Status::InvalidArgument(
            "not a ZMQ address (tcp://HOST:PORT, tcp://*:PORT, ipc://PATH or inproc://NAME)");
      }
      if (spec.name == "g4.endpoints") {
        // Checked here, so that `kvtier config` refuses what the Redis store would refuse.
        size_t start = 0;
        while (start <= value.size()) {
          size_t comma = value.find(',', start);
          if (comma == std::string_view::npos) comma = value.size();
          std::string_view item = value.substr(start, comma - start);
          while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
          while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
          if (!item.empty()) {  // empty items are skipped, as the manager skips them
            Result<HostPort> hp = ParseHostPort(item, "the endpoint");
            if (!hp.ok()) {
              return Status::InvalidArgument("not a list of host:port (" + hp.status().message() +
                                             ")");
            }
          }
          start = comma + 1;
        }
      }
      return std::string(value);
    case ConfigType::kChoice:
      for (const auto& c : spec.choices) {
        if (c == value) return c;
      }
      return Status::InvalidArgument("not a known choice");
    case ConfigType::kDouble: {
      std::string_view text = value;
      if (!text.empty() && text[0] == '+') text.remove_prefix(1);
      double v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return Status::InvalidArgument(ec == std::errc::result_out_of_range ? "out of range"
                                                                            : "not a number");
      }
      if (!std::isfinite(v)) return Status::InvalidArgument("not a finite number");
      if (v < spec.real_min || v > spec.real_max) return Status::InvalidArgument("out of range");
      return ShortestText(v == 0 ? 0.0 : v);  // -0 reads as 0
    }
  }
  return Status::Internal("unknown field type");
}

}  // namespace

const char* ConfigSourceName(ConfigSource source) {
  switch (source) {
    case ConfigSource::kDefault:
      return "default";
    case ConfigSource::kFile:
      return "file";
    case ConfigSource::kEnvironment:
      return "env";
    case ConfigSource::kOverride:
      return "set";
  }
  return "?";
}

const std::vector<ConfigFieldSpec>& Config::Schema() {
  static const std::vector<ConfigFieldSpec> kSchema = BuildSchema();
  return kSchema;
}

Config::Config() {
  for (const ConfigFieldSpec& spec : Schema()) {
    Result<std::string> v = Normalize(spec, spec.default_value);
    if (!v.ok()) {
      std::fprintf(stderr, "kvtier: built-in default of %s is invalid: %s\n", spec.name.c_str(),
                   v.status().ToString().c_str());
      std::abort();
    }
    values_[spec.name] = Value{*v, ConfigSource::kDefault, ""};
  }
}

Status Config::Set(std::string_view name, std::string_view value, ConfigSource source,
                   std::string_view origin) {
  const std::string where = origin.empty() ? "" : " (from " + std::string(origin) + ")";
  const ConfigFieldSpec* spec = FindSpec(name);
  if (spec == nullptr) {
    std::string known;
    for (const auto& s : Schema()) known += (known.empty() ? "" : ", ") + s.name;
    return Status::InvalidArgument("unknown setting '" + std::string(name) + "'" + where +
                                   "; known settings: " + known);
  }
  if ((spec->name == "g2.policy" || spec->name == "g3.policy") && IsLabPolicyName(value)) {
    // The lab's policies run only where the lab enabled them (`kvtier replay`).
    if (!LabPolicyNamesAccepted()) {
      return Status::InvalidArgument(spec->name + " = '" + std::string(value) + "'" + where + ": " +
                                     LabPolicyRefusal(value));
    }
    values_[spec->name] = Value{std::string(value), source, std::string(origin)};
    return Status::Ok();
  }
  Result<std::string> v = Normalize(*spec, value);
  if (!v.ok()) {
    return Status::InvalidArgument(spec->name + " = '" + std::string(value) + "'" + where + " is " +
                                   v.status().message() + "; allowed: " + Allowed(*spec));
  }
  values_[spec->name] = Value{*v, source, std::string(origin)};
  return Status::Ok();
}

Status Config::LoadFile(const std::string& path) {
  // Read through one descriptor of a regular file: a directory, a FIFO or a device given by
  // mistake is refused by name (a directory used to parse as an empty file, silently).
  Result<int> fd = OpenRegularFile(path, O_RDONLY);
  if (!fd.ok()) {
    if (fd.status().Is(StatusCode::kNotFound)) {
      return Status::NotFound("config file " + path +
                              " cannot be opened: it does not exist; check the path (given by "
                              "--config or KVTIER_CONFIG)");
    }
    return Status(fd.status().code(), "config file: " + fd.status().message() +
                                          "; give --config (or KVTIER_CONFIG) a TOML file");
  }
  std::string text;
  {
    constexpr size_t kMaxConfigBytes = size_t{16} << 20;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(*fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(*fd);
        return Status::FromErrno(err, "reading config file " + path);
      }
      if (n == 0) break;
      text.append(buf, static_cast<size_t>(n));
      if (text.size() > kMaxConfigBytes) {
        ::close(*fd);
        return Status::InvalidArgument("config file " + path + " is larger than " +
                                       std::to_string(kMaxConfigBytes) + " bytes");
      }
    }
    ::close(*fd);
  }
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << "config file " << path << ":" << e.source().begin.line << ":" << e.source().begin.column
        << ": " << e.description();
    return Status::InvalidArgument(msg.str());
  }
  // Applies every value of `table`, whose fields are named `prefix` + key; a sub-table ([g2]
  // credit_lru.stale_tail = 0, or [g2.credit_lru]) extends the prefix.
  std::function<Status(const toml::table&, const std::string&)> apply =
      [&](const toml::table& table, const std::string& prefix) -> Status {
    for (const auto& [key, value] : table) {
      const std::string name = prefix + std::string(key.str());
      if (const toml::table* sub = value.as_table()) {
        KVTIER_RETURN_IF_ERROR(apply(*sub, name + "."));
        continue;
      }
      const std::string origin = path + ":" + std::to_string(value.source().begin.line);
      std::string text;
      const ConfigFieldSpec* spec = FindSpec(name);
      if (auto s = value.value<std::string>()) {
        text = *s;
      } else if (auto f = value.value<double>(); f && value.is_floating_point()) {
        if (spec != nullptr && spec->type != ConfigType::kDouble) {
          return Status::InvalidArgument(name + " = " + ShortestText(*f) + " (from " + origin +
                                         ") is a real number; allowed: " + Allowed(*spec));
        }
        text = ShortestText(*f);  // nan and inf too: Set refuses them by name
      } else if (auto b = value.value<bool>(); b && value.is_boolean()) {
        text = *b ? "true" : "false";
      } else if (auto i = value.value<int64_t>(); i && value.is_integer()) {
        if (spec != nullptr && spec->type == ConfigType::kBool) {
          // TOML has booleans: `enabled = 1` is a mistake (the environment, which has only
          // text, may say 1).
          return Status::InvalidArgument(name + " = " + std::to_string(*i) + " (from " + origin +
                                         ") is an integer; allowed: true or false (unquoted)");
        }
        if (*i < 0 && !(spec != nullptr && spec->type == ConfigType::kDouble)) {
          return Status::InvalidArgument(
              name + " = " + std::to_string(*i) + " (from " + origin +
              ") is negative; allowed: " + (spec != nullptr ? Allowed(*spec) : "?"));
        }
        text = std::to_string(*i);
      } else {
        return Status::InvalidArgument(name + " (from " + origin +
                                       ") must be a string, a number or a boolean");
      }
      KVTIER_RETURN_IF_ERROR(Set(name, text, ConfigSource::kFile, origin));
    }
    return Status::Ok();
  };
  for (const auto& [table_key, node] : root) {
    const toml::table* table = node.as_table();
    if (table == nullptr) {
      return Status::InvalidArgument(
          "config file " + path + ":" + std::to_string(node.source().begin.line) + ": '" +
          std::string(table_key.str()) + "' must be a table such as [g2] holding settings");
    }
    KVTIER_RETURN_IF_ERROR(apply(*table, std::string(table_key.str()) + "."));
  }
  return Status::Ok();
}

namespace {

// KVTIER_* variables that are not settings but that kvtier reads elsewhere, so a user who sets
// one as documented is not refused: the config file's path, logging, the CLI's progress lines,
// the vLLM environment's location and base Python (scripts/setup-vllm.sh), and KVTIER_TEST_*,
// which belong to the test suite. Every other KVTIER_* name is refused (a typo must not pass
// silently); kvtier's own scripts export none that is not a setting.
bool IsReadElsewhere(const std::string& var) {
  static constexpr std::string_view kNames[] = {
      "KVTIER_CONFIG", "KVTIER_LOG_LEVEL", "KVTIER_PROGRESS", "KVTIER_CACHE", "KVTIER_BASE_PYTHON"};
  for (std::string_view n : kNames) {
    if (var == n) return true;
  }
  return var.rfind("KVTIER_TEST_", 0) == 0;
}

}  // namespace

Status Config::LoadEnvironment(const std::vector<std::string>& environ_vars) {
  for (const std::string& kv : environ_vars) {
    if (kv.rfind("KVTIER_", 0) != 0) continue;
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string var = kv.substr(0, eq);
    if (IsReadElsewhere(var)) continue;
    const ConfigFieldSpec* match = nullptr;
    for (const ConfigFieldSpec& s : Schema()) {
      if (EnvName(s.name) == var) match = &s;
    }
    if (match == nullptr) {
      std::string known = "KVTIER_CONFIG, KVTIER_LOG_LEVEL";
      for (const auto& s : Schema()) known += ", " + EnvName(s.name);
      return Status::InvalidArgument("environment variable " + var +
                                     " names no kvtier setting; known: " + known);
    }
    KVTIER_RETURN_IF_ERROR(Set(match->name, kv.substr(eq + 1), ConfigSource::kEnvironment, var));
  }
  return Status::Ok();
}

Status Config::LoadProcessEnvironment() {
  std::vector<std::string> vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) vars.emplace_back(*e);
  return LoadEnvironment(vars);
}

const Config::Value& Config::Find(std::string_view name, ConfigType type) const {
  const ConfigFieldSpec* spec = FindSpec(name);
  auto it = values_.find(name);
  const bool type_ok =
      spec != nullptr &&
      (spec->type == type || (type == ConfigType::kString && spec->type == ConfigType::kChoice));
  if (it == values_.end() || !type_ok) {
    std::fprintf(stderr, "kvtier: internal error: config field '%.*s' read with the wrong type\n",
                 static_cast<int>(name.size()), name.data());
    std::abort();
  }
  return it->second;
}

uint64_t Config::GetBytes(std::string_view name) const {
  return std::strtoull(Find(name, ConfigType::kBytes).text.c_str(), nullptr, 10);
}

uint64_t Config::GetUint(std::string_view name) const {
  return std::strtoull(Find(name, ConfigType::kUint).text.c_str(), nullptr, 10);
}

bool Config::GetBool(std::string_view name) const {
  return Find(name, ConfigType::kBool).text == "true";
}

const std::string& Config::GetString(std::string_view name) const {
  return Find(name, ConfigType::kString).text;
}

double Config::GetDouble(std::string_view name) const {
  return std::strtod(Find(name, ConfigType::kDouble).text.c_str(), nullptr);
}

bool Config::IsSet(std::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    std::fprintf(stderr, "kvtier: internal error: IsSet of unknown config field '%.*s'\n",
                 static_cast<int>(name.size()), name.data());
    std::abort();
  }
  return it->second.source != ConfigSource::kDefault;
}

std::vector<std::string> Config::Warnings() const {
  std::vector<std::string> out;
  for (const char* tier : {"g2", "g3"}) {
    const std::string policy_field = std::string(tier) + ".policy";
    const std::string& policy = GetString(policy_field);
    // adaptive runs credit-lru among its candidates, so both read gN.credit_lru.*; only
    // adaptive reads gN.adaptive.*.
    struct Group {
      const char* prefix;
      bool used;
      const char* users;
    };
    const Group groups[] = {
        {".credit_lru.", policy == "credit-lru" || policy == "adaptive", "credit-lru or adaptive"},
        {".adaptive.", policy == "adaptive", "adaptive"},
    };
    for (const Group& g : groups) {
      if (g.used) continue;
      const std::string prefix = std::string(tier) + g.prefix;
      for (const auto& [name, v] : values_) {
        if (name.rfind(prefix, 0) != 0 || v.source == ConfigSource::kDefault) continue;
        out.push_back(name + " = " + v.text + " (from " +
                      (v.origin.empty() ? ConfigSourceName(v.source) : v.origin) +
                      ") has no effect: " + policy_field + " = " + policy + "; set " +
                      policy_field + " = " + g.users + ", or remove the setting");
      }
    }
  }
  return out;
}

std::vector<ConfigEntry> Config::Entries() const {
  std::vector<ConfigEntry> out;
  for (const ConfigFieldSpec& spec : Schema()) {
    const Value& v = values_.at(spec.name);
    out.push_back(ConfigEntry{&spec, v.text, v.source, v.origin});
  }
  return out;
}

Result<Config> LoadConfig(const std::string& file) {
  Config config;
  std::string path = file;
  if (path.empty()) {
    if (const char* env = std::getenv("KVTIER_CONFIG"); env != nullptr && *env != '\0') path = env;
  }
  if (!path.empty()) KVTIER_RETURN_IF_ERROR(config.LoadFile(path));
  KVTIER_RETURN_IF_ERROR(config.LoadProcessEnvironment());
  return config;
}

}  // namespace kvtier

// The registry of config keys (core/config_registry.h) and the manager's typed settings
// (src/manager/manager_settings.h): the keys are the ones `kvtier config` listed before they
// left core, in the same order; FromConfig fills every part from a Config; Validate refuses a
// bad value in every field, naming its key, and the rules that tie fields together.
#include "manager/manager_settings.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/config_registry.h"
#include "kvtier/config.h"
#include "manager/manager_config_keys.h"

namespace kvtier {
namespace {

ManagerSettings Defaults() {
  Result<ManagerSettings> s = ManagerSettings::FromConfig(Config());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : ManagerSettings();
}

// Every key, in the order core's own table listed them before the modules registered them
// (`kvtier config`, and the "known settings" of an error, list them so).
TEST(ConfigRegistryTest, SchemaListsEveryKeyInItsOrder) {
  std::vector<std::string> want = {"hash.algorithm", "index.shards", "g2.capacity_bytes",
                                   "g2.policy"};
  const char* const credit[] = {"used_twice", "used_thrice", "long_follow_up", "stale_tail",
                                "ghost_factor"};
  const char* const adaptive[] = {"half_life", "hysteresis", "with_hit_density"};
  auto policy_keys = [&](const std::string& tier) {
    for (const char* f : credit) want.push_back(tier + ".credit_lru." + f);
    for (const char* f : adaptive) want.push_back(tier + ".adaptive." + f);
  };
  policy_keys("g2");
  for (const char* k :
       {"g2.hugepages", "g2.lock_memory", "g2.prefault_threads", "g2.namespace_share",
        "g2.staging_slots", "g3.enabled", "g3.dir", "g3.capacity_bytes", "g3.flush_on_close",
        "g3.files", "g3.queue_depth", "g3.policy"}) {
    want.push_back(k);
  }
  policy_keys("g3");
  for (const char* k : {"g3.admit_min_seen",
                        "g3.admit_max_writes_per_hit",
                        "g3.write_budget_bytes_per_s",
                        "g3.quarantine_after_errors",
                        "g3.reprobe_interval_ms",
                        "transfer.copy_threads",
                        "transfer.load_stores",
                        "transfer.max_queued_saves",
                        "transfer.max_defer_ms",
                        "manager.idle_request_ttl_ms",
                        "manager.max_namespaces",
                        "g4.backend",
                        "g4.endpoints",
                        "g4.cluster",
                        "g4.username",
                        "g4.password",
                        "g4.dir",
                        "g4.write_through",
                        "g4.lookup_deadline_ms",
                        "g4.load_deadline_ms",
                        "g4.save_deadline_ms",
                        "g4.threads",
                        "g4.redis_pipeline_kib",
                        "g4.direct_to_g1",
                        "g4.max_queued_saves",
                        "g4.load_gbps",
                        "g4.recompute_tokens_per_s",
                        "metrics.port",
                        "metrics.bind",
                        "service.socket",
                        "service.instance",
                        "service.lease_ms",
                        "service.call_timeout_ms",
                        "service.reattach_ms",
                        "service.max_pools",
                        "service.allowed_gids",
                        "service.daemon_uid",
                        "service.max_connections",
                        "events.endpoint",
                        "events.replay_endpoint",
                        "events.topic",
                        "events.queue_events",
                        "events.replay_batches",
                        "events.replay_bytes",
                        "events.data_parallel_rank"}) {
    want.push_back(k);
  }
  std::vector<std::string> got;
  for (const ConfigFieldSpec& spec : Config::Schema()) got.push_back(spec.name);
  EXPECT_EQ(got, want);
}

TEST(ConfigRegistryTest, CheckConfigValueGivesSetsRefusal) {
  EXPECT_TRUE(CheckConfigValue("g3.queue_depth", "64").ok());
  Status s = CheckConfigValue("g3.queue_depth", "0");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "g3.queue_depth = '0' is out of range; allowed: a whole number from 1 to 4096");
  Config c;
  EXPECT_EQ(c.Set("g3.queue_depth", "0").message(), s.message());
  // A key's own check, after its type's, with its own words for what is allowed.
  Status shards = CheckConfigValue("index.shards", "12");
  EXPECT_NE(shards.message().find("index.shards = '12' is not a power of two"), std::string::npos)
      << shards.message();
  Status endpoints = CheckConfigValue("g4.endpoints", "127.0.0.1:6379,nohost");
  EXPECT_NE(endpoints.message().find("not a list of host:port"), std::string::npos)
      << endpoints.message();
  EXPECT_NE(endpoints.message().find("allowed: comma-separated host:port"), std::string::npos)
      << endpoints.message();
  Status zmq = CheckConfigValue("events.endpoint", "http://localhost:5557");
  EXPECT_NE(zmq.message().find("not a ZMQ address"), std::string::npos) << zmq.message();
  EXPECT_NE(zmq.message().find("allowed: a ZMQ address"), std::string::npos) << zmq.message();
  Status unknown = CheckConfigValue("g2.capacity", "1");
  EXPECT_NE(unknown.message().find("unknown setting 'g2.capacity'"), std::string::npos);
}

// The policy keys take their defaults from the structs they fill (no second copy to drift).
TEST(ConfigRegistryTest, PolicyKeysDefaultToTheirStructs) {
  const Config c;
  const CreditLruConfig credit;
  for (const char* f : CreditLruConfig::kFieldNames) {
    EXPECT_EQ(c.GetDouble(std::string("g3.credit_lru.") + f), *credit.Get(f)) << f;
  }
  const AdaptiveConfig adaptive;
  EXPECT_EQ(c.GetDouble("g2.adaptive.half_life"), adaptive.half_life);
  EXPECT_EQ(c.GetDouble("g2.adaptive.with_hit_density"), adaptive.with_hit_density);
}

// A key registered twice, or after the registry froze (the first Config), is a programmer
// error: the process stops and says which key.
TEST(ConfigRegistryDeathTest, SecondAndLateRegistrationsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ConfigKeyTable twice;
  twice.keys.push_back(ManagerConfigKeys().keys.front());
  EXPECT_DEATH(RegisterConfigKeys(twice), "config key 'hash.algorithm' is registered twice");
  ConfigKeyTable late;
  late.keys.push_back(ConfigKey{{"late.key", ConfigType::kBool, "true", "", 0, 1, {}}});
  (void)Config::Schema();
  EXPECT_DEATH(RegisterConfigKeys(late), "registered after the first Config was made \\(late.key");
}

TEST(ManagerSettingsTest, FromConfigFillsEveryPart) {
  Config c;
  for (const auto& [k, v] : std::vector<std::pair<const char*, const char*>>{
           {"hash.algorithm", "xxh3-128"},
           {"manager.max_namespaces", "7"},
           {"manager.idle_request_ttl_ms", "1234"},
           {"index.shards", "16"},
           {"g2.policy", "credit-lru"},
           {"g3.policy", "lru"},
           {"g2.credit_lru.stale_tail", "0"},
           {"g3.adaptive.hysteresis", "0.5"},
           {"g2.capacity_bytes", "64MiB"},
           {"g2.hugepages", "false"},
           {"g2.namespace_share", "0.25"},
           {"g2.staging_slots", "9"},
           {"g3.enabled", "false"},
           {"g3.dir", "/somewhere"},
           {"g3.queue_depth", "8"},
           {"g3.admit_min_seen", "3"},
           {"g3.admit_max_writes_per_hit", "2.5"},
           {"transfer.copy_threads", "3"},
           {"transfer.load_stores", "streaming"},
           {"transfer.max_defer_ms", "0"},
           {"g4.backend", "redis"},
           {"g4.endpoints", " 127.0.0.1:6379, ,[::1]:6380"},
           {"g4.threads", "5"},
           {"g4.load_gbps", "12.5"},
           {"events.endpoint", "tcp://*:5557"},
           {"events.replay_batches", "0"},
           {"metrics.port", "9090"},
       }) {
    ASSERT_TRUE(c.Set(k, v, ConfigSource::kFile, "kvtier.toml:3").ok()) << k;
  }
  Result<ManagerSettings> made = ManagerSettings::FromConfig(c);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const ManagerSettings& s = *made;
  EXPECT_EQ(s.requests.hash, HashAlgorithm::kXxh3_128);
  EXPECT_EQ(s.requests.max_namespaces, 7u);
  EXPECT_EQ(s.requests.idle_request_ttl_ms, 1234u);
  EXPECT_EQ(s.index.shards, 16u);
  EXPECT_EQ(s.index.g2.kind, PolicyKind::kCreditLru);
  EXPECT_EQ(s.index.g3.kind, PolicyKind::kLru);
  EXPECT_EQ(s.index.g2.options.credit_lru.stale_tail, 0);
  EXPECT_EQ(s.index.g3.options.adaptive.hysteresis, 0.5);
  EXPECT_EQ(s.g2.capacity_bytes, 64ull << 20);
  EXPECT_FALSE(s.g2.hugepages);
  EXPECT_TRUE(s.g2.lock_memory);
  EXPECT_EQ(s.g2.namespace_share, 0.25);
  EXPECT_EQ(s.g2.staging_slots, 9u);
  EXPECT_FALSE(s.g3.enabled);
  EXPECT_EQ(s.g3.dir, "/somewhere");
  EXPECT_TRUE(s.g3.dir_set);
  EXPECT_EQ(s.g3.dir_origin, "kvtier.toml:3");
  EXPECT_EQ(s.g3.queue_depth, 8u);
  EXPECT_EQ(s.g3.admit_min_seen, 3u);
  EXPECT_EQ(s.g3.admit_max_writes_per_hit, 2.5);
  EXPECT_EQ(s.transfer.copy_threads, 3u);
  EXPECT_EQ(s.transfer.load_stores, "streaming");
  EXPECT_EQ(s.transfer.max_defer_ms, 0u);
  EXPECT_EQ(s.g4.backend, G4Options::Backend::kRedis);
  EXPECT_EQ(s.g4.endpoints, (std::vector<std::string>{"127.0.0.1:6379", "[::1]:6380"}));
  EXPECT_EQ(s.g4.threads, 5u);
  EXPECT_EQ(s.g4.load_gbps, 12.5);
  EXPECT_EQ(s.events.endpoint, "tcp://*:5557");
  EXPECT_EQ(s.events.replay_batches, 0u);
  EXPECT_EQ(s.metrics.port, 9090u);
  EXPECT_EQ(s.metrics.bind, "127.0.0.1");
  // The defaults are the keys'.
  const ManagerSettings d = Defaults();
  EXPECT_EQ(d.g3.dir, "./kvtier-data");
  EXPECT_FALSE(d.g3.dir_set);
  EXPECT_EQ(d.g3.queue_depth, 32u);
  EXPECT_EQ(d.index.g2.kind, PolicyKind::kAdaptive);
  EXPECT_EQ(d.g4.backend, G4Options::Backend::kNone);
  EXPECT_TRUE(d.Validate().ok()) << d.Validate().ToString();
}

// One bad value per field, in a struct made in code: Validate refuses it and names the key.
TEST(ManagerSettingsTest, ValidateRefusesABadValueInEveryField) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Bad {
    const char* what;  // the message must hold it
    std::function<void(ManagerSettings&)> spoil;
  };
  const std::vector<Bad> cases = {
      {"hash.algorithm = '?' is not a known choice",
       [](ManagerSettings& s) { s.requests.hash = static_cast<HashAlgorithm>(7); }},
      {"manager.max_namespaces = '0' is out of range",
       [](ManagerSettings& s) { s.requests.max_namespaces = 0; }},
      {"manager.idle_request_ttl_ms = '0' is out of range",
       [](ManagerSettings& s) { s.requests.idle_request_ttl_ms = 0; }},
      {"index.shards = '12' is not a power of two",
       [](ManagerSettings& s) { s.index.shards = 12; }},
      {"index.shards = '8192' is out of range", [](ManagerSettings& s) { s.index.shards = 8192; }},
      // Every kind the product does not offer is the lab's (index/policy_names.h), refused by
      // the keys' screen with where to run it.
      {"g2.policy = 'belady': belady is a lab policy (docs/policy-study.md)",
       [](ManagerSettings& s) { s.index.g2.kind = PolicyKind::kBelady; }},
      {"g3.policy = 's3fifo': s3fifo is a lab policy (docs/policy-study.md)",
       [](ManagerSettings& s) { s.index.g3.kind = PolicyKind::kS3Fifo; }},
      {"g2.credit_lru.used_twice = '65' is out of range",
       [](ManagerSettings& s) { s.index.g2.options.credit_lru.used_twice = 65; }},
      {"g3.credit_lru.ghost_factor = '-1' is out of range",
       [](ManagerSettings& s) { s.index.g3.options.credit_lru.ghost_factor = -1; }},
      {"g2.credit_lru.stale_tail = 'nan' is not a finite number",
       [nan](ManagerSettings& s) { s.index.g2.options.credit_lru.stale_tail = nan; }},
      {"g2.adaptive.half_life = '0' is out of range",
       [](ManagerSettings& s) { s.index.g2.options.adaptive.half_life = 0; }},
      {"g3.adaptive.hysteresis = '11' is out of range",
       [](ManagerSettings& s) { s.index.g3.options.adaptive.hysteresis = 11; }},
      {"g2.adaptive.with_hit_density = 0.5: must be 0 or 1",
       [](ManagerSettings& s) { s.index.g2.options.adaptive.with_hit_density = 0.5; }},
      {"g2.capacity_bytes = '1024' is out of range",
       [](ManagerSettings& s) { s.g2.capacity_bytes = 1024; }},
      {"g2.prefault_threads = '2000' is out of range",
       [](ManagerSettings& s) { s.g2.prefault_threads = 2000; }},
      {"g2.namespace_share = '1.5' is out of range",
       [](ManagerSettings& s) { s.g2.namespace_share = 1.5; }},
      {"g2.namespace_share = 'nan' is not a finite number",
       [nan](ManagerSettings& s) { s.g2.namespace_share = nan; }},
      {"g2.staging_slots = '5000' is out of range",
       [](ManagerSettings& s) { s.g2.staging_slots = 5000; }},
      {"g3.dir = '' is empty", [](ManagerSettings& s) { s.g3.dir = ""; }},
      {"g3.capacity_bytes = '1024' is out of range",
       [](ManagerSettings& s) { s.g3.capacity_bytes = 1024; }},
      {"g3.files = '0' is out of range", [](ManagerSettings& s) { s.g3.files = 0; }},
      {"g3.queue_depth = '0' is out of range", [](ManagerSettings& s) { s.g3.queue_depth = 0; }},
      {"g3.quarantine_after_errors = '0' is out of range",
       [](ManagerSettings& s) { s.g3.quarantine_after_errors = 0; }},
      {"g3.reprobe_interval_ms = '0' is out of range",
       [](ManagerSettings& s) { s.g3.reprobe_interval_ms = 0; }},
      {"g3.admit_min_seen = '16' is out of range",
       [](ManagerSettings& s) { s.g3.admit_min_seen = 16; }},
      {"g3.admit_max_writes_per_hit = '-1' is out of range",
       [](ManagerSettings& s) { s.g3.admit_max_writes_per_hit = -1; }},
      {"transfer.copy_threads = '0' is out of range",
       [](ManagerSettings& s) { s.transfer.copy_threads = 0; }},
      {"transfer.load_stores = 'fast' is not a known choice",
       [](ManagerSettings& s) { s.transfer.load_stores = "fast"; }},
      {"transfer.max_queued_saves = '0' is out of range",
       [](ManagerSettings& s) { s.transfer.max_queued_saves = 0; }},
      {"transfer.max_defer_ms = '60001' is out of range",
       [](ManagerSettings& s) { s.transfer.max_defer_ms = 60001; }},
      {"g4.endpoints = 'nohost' is not a list of host:port",
       [](ManagerSettings& s) { s.g4.endpoints = {"nohost"}; }},
      {"g4.lookup_deadline_ms = '0' is out of range",
       [](ManagerSettings& s) { s.g4.lookup_deadline_ms = 0; }},
      {"g4.load_deadline_ms = '0' is out of range",
       [](ManagerSettings& s) { s.g4.load_deadline_ms = 0; }},
      {"g4.save_deadline_ms = '0' is out of range",
       [](ManagerSettings& s) { s.g4.save_deadline_ms = 0; }},
      {"g4.threads = '65' is out of range", [](ManagerSettings& s) { s.g4.threads = 65; }},
      {"g4.redis_pipeline_kib = '0' is out of range",
       [](ManagerSettings& s) { s.g4.redis_pipeline_kib = 0; }},
      {"g4.max_queued_saves = '0' is out of range",
       [](ManagerSettings& s) { s.g4.max_queued_saves = 0; }},
      {"g4.load_gbps = '-1' is out of range", [](ManagerSettings& s) { s.g4.load_gbps = -1; }},
      {"g4.recompute_tokens_per_s = '2e+09' is out of range",
       [](ManagerSettings& s) { s.g4.recompute_tokens_per_s = 2e9; }},
      {"g4.backend = fs needs g4.dir",
       [](ManagerSettings& s) { s.g4.backend = G4Options::Backend::kFs; }},
      {"g4.backend = redis needs g4.endpoints",
       [](ManagerSettings& s) { s.g4.backend = G4Options::Backend::kRedis; }},
      {"events.endpoint = 'http://x:1' is not a ZMQ address",
       [](ManagerSettings& s) { s.events.endpoint = "http://x:1"; }},
      {"events.replay_endpoint = 'x' is not a ZMQ address",
       [](ManagerSettings& s) { s.events.replay_endpoint = "x"; }},
      {"events.queue_events = '0' is out of range",
       [](ManagerSettings& s) { s.events.queue_events = 0; }},
      {"events.replay_batches = '2097152' is out of range",
       [](ManagerSettings& s) { s.events.replay_batches = 1u << 21; }},
      {"events.replay_bytes = '100' is out of range",
       [](ManagerSettings& s) { s.events.replay_bytes = 100; }},
      {"events.data_parallel_rank = '70000' is out of range",
       [](ManagerSettings& s) { s.events.data_parallel_rank = 70000; }},
      {"events.replay_endpoint is set but events.endpoint is empty",
       [](ManagerSettings& s) { s.events.replay_endpoint = "tcp://*:5558"; }},
      {"metrics.port = '70000' is out of range",
       [](ManagerSettings& s) { s.metrics.port = 70000; }},
      {"metrics.bind = '' is empty", [](ManagerSettings& s) { s.metrics.bind = ""; }},
  };
  for (const Bad& c : cases) {
    ManagerSettings s = Defaults();
    c.spoil(s);
    const Status st = s.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(st.message().find(c.what), std::string::npos)
        << "want: " << c.what << "\n got: " << st.message();
  }
}

// The rules that tie fields together hold for settings read from a Config too.
TEST(ManagerSettingsTest, FromConfigRefusesWhatValidateRefuses) {
  Config fs;
  ASSERT_TRUE(fs.Set("g4.backend", "fs").ok());
  Result<ManagerSettings> no_dir = ManagerSettings::FromConfig(fs);
  ASSERT_FALSE(no_dir.ok());
  EXPECT_NE(no_dir.status().message().find("g4.backend = fs needs g4.dir"), std::string::npos)
      << no_dir.status().message();
  Config replay;
  ASSERT_TRUE(replay.Set("events.replay_endpoint", "tcp://*:5558").ok());
  EXPECT_FALSE(EventOptions::FromConfig(replay).ok());
  Config hit_density;
  ASSERT_TRUE(hit_density.Set("g3.adaptive.with_hit_density", "0.5").ok());
  Result<IndexOptions> index = IndexOptions::FromConfig(hit_density);
  ASSERT_FALSE(index.ok());
  EXPECT_NE(index.status().message().find("g3.adaptive.with_hit_density"), std::string::npos)
      << index.status().message();
}

}  // namespace
}  // namespace kvtier

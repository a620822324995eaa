#include "manager/manager_settings.h"

#include <string>
#include <utility>

#include "core/config_registry.h"
#include "core/host_port.h"

namespace kvtier {
namespace {

// A field against its key's rules (CheckConfigValue): the refusal names the key.
Status CheckUint(std::string_view key, uint64_t value) {
  return CheckConfigValue(key, std::to_string(value));
}
Status CheckReal(std::string_view key, double value) {
  return CheckConfigValue(key, ShortestNumberText(value));
}
Status CheckText(std::string_view key, std::string_view value) {
  return CheckConfigValue(key, value);
}

uint32_t GetUint32(const Config& config, std::string_view key) {
  // Every uint key the manager keeps as 32 bits has a range within them.
  return static_cast<uint32_t>(config.GetUint(key));
}

// The policy settings of tier `tier` ("g2"). InvalidArgument naming the key when AdaptiveConfig
// refuses a value its key's range let through.
Result<PolicyOptions> PolicyOptionsFromConfig(const Config& config, const std::string& tier) {
  PolicyOptions options;
  for (const char* field : CreditLruConfig::kFieldNames) {
    const std::string key = tier + ".credit_lru." + field;
    if (Status s = options.credit_lru.Set(field, config.GetDouble(key)); !s.ok()) {
      return Status::InvalidArgument(key + ": " + s.message());
    }
  }
  for (const char* field : AdaptiveConfig::kFieldNames) {
    const std::string key = tier + ".adaptive." + field;
    if (Status s = options.adaptive.Set(field, config.GetDouble(key)); !s.ok()) {
      return Status::InvalidArgument(key + ": " + s.message());
    }
  }
  return options;
}

}  // namespace

Result<RequestOptions> RequestOptions::FromConfig(const Config& config) {
  RequestOptions o;
  KVTIER_ASSIGN_OR_RETURN(o.hash, ParseHashAlgorithm(config.GetString("hash.algorithm")));
  o.max_namespaces = GetUint32(config, "manager.max_namespaces");
  o.idle_request_ttl_ms = config.GetUint("manager.idle_request_ttl_ms");
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status RequestOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckText("hash.algorithm", HashAlgorithmName(hash)));
  KVTIER_RETURN_IF_ERROR(CheckUint("manager.max_namespaces", max_namespaces));
  return CheckUint("manager.idle_request_ttl_ms", idle_request_ttl_ms);
}

Result<IndexOptions> IndexOptions::FromConfig(const Config& config) {
  IndexOptions o;
  o.shards = GetUint32(config, "index.shards");
  KVTIER_ASSIGN_OR_RETURN(o.g2.kind, ParsePolicyKind(config.GetString("g2.policy")));
  KVTIER_ASSIGN_OR_RETURN(o.g3.kind, ParsePolicyKind(config.GetString("g3.policy")));
  KVTIER_ASSIGN_OR_RETURN(o.g2.options, PolicyOptionsFromConfig(config, "g2"));
  KVTIER_ASSIGN_OR_RETURN(o.g3.options, PolicyOptionsFromConfig(config, "g3"));
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status IndexOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckUint("index.shards", shards));
  for (const auto& [tier, policy] : {std::pair<std::string, const TierPolicy*>{"g2", &g2},
                                     std::pair<std::string, const TierPolicy*>{"g3", &g3}}) {
    KVTIER_RETURN_IF_ERROR(CheckText(tier + ".policy", PolicyKindName(policy->kind)));
    // Each value against its key's range, then the struct's own rules (the key's range may be
    // wider: with_hit_density is 0 or 1).
    for (const char* field : CreditLruConfig::kFieldNames) {
      KVTIER_RETURN_IF_ERROR(
          CheckReal(tier + ".credit_lru." + field, *policy->options.credit_lru.Get(field)));
    }
    const AdaptiveConfig& a = policy->options.adaptive;
    KVTIER_RETURN_IF_ERROR(CheckReal(tier + ".adaptive.half_life", a.half_life));
    KVTIER_RETURN_IF_ERROR(CheckReal(tier + ".adaptive.hysteresis", a.hysteresis));
    KVTIER_RETURN_IF_ERROR(CheckReal(tier + ".adaptive.with_hit_density", a.with_hit_density));
    if (Status s = a.Validate(); !s.ok()) {
      return Status::InvalidArgument(tier + "." + s.message());
    }
  }
  return Status::Ok();
}

Result<G2Options> G2Options::FromConfig(const Config& config) {
  G2Options o;
  o.capacity_bytes = config.GetBytes("g2.capacity_bytes");
  o.hugepages = config.GetBool("g2.hugepages");
  o.lock_memory = config.GetBool("g2.lock_memory");
  o.prefault_threads = GetUint32(config, "g2.prefault_threads");
  o.namespace_share = config.GetDouble("g2.namespace_share");
  o.staging_slots = GetUint32(config, "g2.staging_slots");
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status G2Options::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckUint("g2.capacity_bytes", capacity_bytes));
  KVTIER_RETURN_IF_ERROR(CheckUint("g2.prefault_threads", prefault_threads));
  KVTIER_RETURN_IF_ERROR(CheckReal("g2.namespace_share", namespace_share));
  return CheckUint("g2.staging_slots", staging_slots);
}

Result<G3Options> G3Options::FromConfig(const Config& config) {
  G3Options o;
  o.enabled = config.GetBool("g3.enabled");
  o.dir = config.GetString("g3.dir");
  o.dir_set = config.IsSet("g3.dir");
  for (const ConfigEntry& e : config.Entries()) {
    if (e.spec->name == "g3.dir") o.dir_origin = e.origin;
  }
  o.capacity_bytes = config.GetBytes("g3.capacity_bytes");
  o.flush_on_close = config.GetBool("g3.flush_on_close");
  o.files = GetUint32(config, "g3.files");
  o.queue_depth = GetUint32(config, "g3.queue_depth");
  o.write_budget_bytes_per_s = config.GetBytes("g3.write_budget_bytes_per_s");
  o.quarantine_after_errors = GetUint32(config, "g3.quarantine_after_errors");
  o.reprobe_interval_ms = GetUint32(config, "g3.reprobe_interval_ms");
  o.admit_min_seen = GetUint32(config, "g3.admit_min_seen");
  o.admit_max_writes_per_hit = config.GetDouble("g3.admit_max_writes_per_hit");
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status G3Options::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckText("g3.dir", dir));
  KVTIER_RETURN_IF_ERROR(CheckUint("g3.capacity_bytes", capacity_bytes));
  KVTIER_RETURN_IF_ERROR(CheckUint("g3.files", files));
  KVTIER_RETURN_IF_ERROR(CheckUint("g3.queue_depth", queue_depth));
  KVTIER_RETURN_IF_ERROR(CheckUint("g3.write_budget_bytes_per_s", write_budget_bytes_per_s));
  KVTIER_RETURN_IF_ERROR(CheckUint("g3.quarantine_after_errors", quarantine_after_errors));
  KVTIER_RETURN_IF_ERROR(CheckUint("g3.reprobe_interval_ms", reprobe_interval_ms));
  KVTIER_RETURN_IF_ERROR(CheckUint("g3.admit_min_seen", admit_min_seen));
  return CheckReal("g3.admit_max_writes_per_hit", admit_max_writes_per_hit);
}

Result<TransferOptions> TransferOptions::FromConfig(const Config& config) {
  TransferOptions o;
  o.copy_threads = GetUint32(config, "transfer.copy_threads");
  o.load_stores = config.GetString("transfer.load_stores");
  o.max_queued_saves = GetUint32(config, "transfer.max_queued_saves");
  o.max_defer_ms = GetUint32(config, "transfer.max_defer_ms");
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status TransferOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckUint("transfer.copy_threads", copy_threads));
  KVTIER_RETURN_IF_ERROR(CheckText("transfer.load_stores", load_stores));
  KVTIER_RETURN_IF_ERROR(CheckUint("transfer.max_queued_saves", max_queued_saves));
  return CheckUint("transfer.max_defer_ms", max_defer_ms);
}

const char* G4Options::BackendName(Backend backend) {
  switch (backend) {
    case Backend::kNone:
      return "none";
    case Backend::kRedis:
      return "redis";
    case Backend::kFs:
      return "fs";
  }
  return "?";
}

Result<G4Options> G4Options::FromConfig(const Config& config) {
  G4Options o;
  const std::string& backend = config.GetString("g4.backend");
  for (Backend b : {Backend::kNone, Backend::kRedis, Backend::kFs}) {
    if (backend == BackendName(b)) o.backend = b;
  }
  o.endpoints = SplitEndpoints(config.GetString("g4.endpoints"));
  o.cluster = config.GetBool("g4.cluster");
  o.username = config.GetString("g4.username");
  o.password = config.GetString("g4.password");
  o.dir = config.GetString("g4.dir");
  o.write_through = config.GetBool("g4.write_through");
  o.lookup_deadline_ms = GetUint32(config, "g4.lookup_deadline_ms");
  o.load_deadline_ms = GetUint32(config, "g4.load_deadline_ms");
  o.save_deadline_ms = GetUint32(config, "g4.save_deadline_ms");
  o.threads = GetUint32(config, "g4.threads");
  o.redis_pipeline_kib = GetUint32(config, "g4.redis_pipeline_kib");
  o.max_queued_saves = GetUint32(config, "g4.max_queued_saves");
  o.load_gbps = config.GetDouble("g4.load_gbps");
  o.recompute_tokens_per_s = config.GetDouble("g4.recompute_tokens_per_s");
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status G4Options::Validate() const {
  std::string endpoint_list;
  for (const std::string& e : endpoints) endpoint_list += (endpoint_list.empty() ? "" : ",") + e;
  KVTIER_RETURN_IF_ERROR(CheckText("g4.endpoints", endpoint_list));
  KVTIER_RETURN_IF_ERROR(CheckUint("g4.lookup_deadline_ms", lookup_deadline_ms));
  KVTIER_RETURN_IF_ERROR(CheckUint("g4.load_deadline_ms", load_deadline_ms));
  KVTIER_RETURN_IF_ERROR(CheckUint("g4.save_deadline_ms", save_deadline_ms));
  KVTIER_RETURN_IF_ERROR(CheckUint("g4.threads", threads));
  KVTIER_RETURN_IF_ERROR(CheckUint("g4.redis_pipeline_kib", redis_pipeline_kib));
  KVTIER_RETURN_IF_ERROR(CheckUint("g4.max_queued_saves", max_queued_saves));
  KVTIER_RETURN_IF_ERROR(CheckReal("g4.load_gbps", load_gbps));
  KVTIER_RETURN_IF_ERROR(CheckReal("g4.recompute_tokens_per_s", recompute_tokens_per_s));
  if (backend == Backend::kFs && dir.empty()) {
    return Status::InvalidArgument(
        "g4.backend = fs needs g4.dir, the shared directory (e.g. an NFS mount)");
  }
  if (backend == Backend::kRedis && endpoints.empty()) {
    return Status::InvalidArgument(
        "g4.backend = redis needs g4.endpoints, e.g. 127.0.0.1:6379 (or cluster seed nodes "
        "with g4.cluster = true)");
  }
  return Status::Ok();
}

Result<EventOptions> EventOptions::FromConfig(const Config& config) {
  EventOptions o;
  o.endpoint = config.GetString("events.endpoint");
  o.replay_endpoint = config.GetString("events.replay_endpoint");
  o.topic = config.GetString("events.topic");
  o.queue_events = GetUint32(config, "events.queue_events");
  o.replay_batches = GetUint32(config, "events.replay_batches");
  o.replay_bytes = config.GetBytes("events.replay_bytes");
  o.data_parallel_rank = GetUint32(config, "events.data_parallel_rank");
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status EventOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckText("events.endpoint", endpoint));
  KVTIER_RETURN_IF_ERROR(CheckText("events.replay_endpoint", replay_endpoint));
  KVTIER_RETURN_IF_ERROR(CheckUint("events.queue_events", queue_events));
  KVTIER_RETURN_IF_ERROR(CheckUint("events.replay_batches", replay_batches));
  KVTIER_RETURN_IF_ERROR(CheckUint("events.replay_bytes", replay_bytes));
  KVTIER_RETURN_IF_ERROR(CheckUint("events.data_parallel_rank", data_parallel_rank));
  if (endpoint.empty() && !replay_endpoint.empty()) {
    return Status::InvalidArgument(
        "events.replay_endpoint is set but events.endpoint is empty; set events.endpoint "
        "(the PUB address) too, or clear both");
  }
  return Status::Ok();
}

Result<MetricsOptions> MetricsOptions::FromConfig(const Config& config) {
  MetricsOptions o;
  o.port = GetUint32(config, "metrics.port");
  o.bind = config.GetString("metrics.bind");
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status MetricsOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckUint("metrics.port", port));
  return CheckText("metrics.bind", bind);
}

Result<ManagerSettings> ManagerSettings::FromConfig(const Config& config) {
  ManagerSettings s;
  KVTIER_ASSIGN_OR_RETURN(s.requests, RequestOptions::FromConfig(config));
  KVTIER_ASSIGN_OR_RETURN(s.index, IndexOptions::FromConfig(config));
  KVTIER_ASSIGN_OR_RETURN(s.g2, G2Options::FromConfig(config));
  KVTIER_ASSIGN_OR_RETURN(s.g3, G3Options::FromConfig(config));
  KVTIER_ASSIGN_OR_RETURN(s.transfer, TransferOptions::FromConfig(config));
  KVTIER_ASSIGN_OR_RETURN(s.g4, G4Options::FromConfig(config));
  KVTIER_ASSIGN_OR_RETURN(s.events, EventOptions::FromConfig(config));
  KVTIER_ASSIGN_OR_RETURN(s.metrics, MetricsOptions::FromConfig(config));
  return s;
}

Status ManagerSettings::Validate() const {
  KVTIER_RETURN_IF_ERROR(requests.Validate());
  KVTIER_RETURN_IF_ERROR(index.Validate());
  KVTIER_RETURN_IF_ERROR(g2.Validate());
  KVTIER_RETURN_IF_ERROR(g3.Validate());
  KVTIER_RETURN_IF_ERROR(transfer.Validate());
  KVTIER_RETURN_IF_ERROR(g4.Validate());
  KVTIER_RETURN_IF_ERROR(events.Validate());
  return metrics.Validate();
}

}  // namespace kvtier

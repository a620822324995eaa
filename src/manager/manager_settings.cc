#include "manager/manager_settings.h"

#include <array>
#include <string>
#include <type_traits>
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

// One plain field of an options struct: its key, how to read it from a Config and how to hold
// it to the key's rules. Each struct lists its fields once (the tables below); FromConfig reads
// them with ReadFields and Validate checks them with CheckFields, so a key is named once.
template <typename Options>
struct OptionField {
  std::string_view key;
  void (*read)(const Config& config, std::string_view key, Options& o);
  Status (*check)(std::string_view key, const Options& o);  // null: nothing to check
};

// How a field is read and checked besides what its type says.
enum class FieldRule : uint8_t {
  kPlain,    // by its type; held to its key's rules (a bool has none beyond its type)
  kBytes,    // a uint64_t byte size (GetBytes, not GetUint)
  kAsGiven,  // a string read as given (a user name, a path) that Validate never checked
};

template <typename M>
struct MemberOf;
template <typename O, typename T>
struct MemberOf<T O::*> {
  using Options = O;
  using Type = T;
};

template <auto kMember, FieldRule kRule = FieldRule::kPlain>
constexpr OptionField<typename MemberOf<decltype(kMember)>::Options> Field(std::string_view key) {
  using O = typename MemberOf<decltype(kMember)>::Options;
  using T = typename MemberOf<decltype(kMember)>::Type;
  auto read = [](const Config& config, std::string_view k, O& o) {
    if constexpr (kRule == FieldRule::kBytes) {
      static_assert(std::is_same_v<T, uint64_t>);
      o.*kMember = config.GetBytes(k);
    } else if constexpr (std::is_same_v<T, bool>) {
      o.*kMember = config.GetBool(k);
    } else if constexpr (std::is_same_v<T, uint32_t>) {
      // Every uint key the manager keeps as 32 bits has a range within them.
      o.*kMember = static_cast<uint32_t>(config.GetUint(k));
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      o.*kMember = config.GetUint(k);
    } else if constexpr (std::is_same_v<T, double>) {
      o.*kMember = config.GetDouble(k);
    } else {
      static_assert(std::is_same_v<T, std::string>);
      o.*kMember = config.GetString(k);
    }
  };
  auto check = [](std::string_view k, const O& o) -> Status {
    if constexpr (std::is_same_v<T, double>) {
      return CheckReal(k, o.*kMember);
    } else if constexpr (std::is_same_v<T, std::string>) {
      return CheckText(k, o.*kMember);
    } else {
      return CheckUint(k, o.*kMember);
    }
  };
  constexpr bool kChecked = kRule != FieldRule::kAsGiven && !std::is_same_v<T, bool>;
  return {key, read, kChecked ? +check : nullptr};
}

template <typename Options, size_t N>
void ReadFields(const Config& config, const std::array<OptionField<Options>, N>& fields,
                Options& o) {
  for (const OptionField<Options>& f : fields) f.read(config, f.key, o);
}

template <typename Options, size_t N>
Status CheckFields(const std::array<OptionField<Options>, N>& fields, const Options& o) {
  for (const OptionField<Options>& f : fields) {
    if (f.check != nullptr) KVTIER_RETURN_IF_ERROR(f.check(f.key, o));
  }
  return Status::Ok();
}

// The plain fields of each struct, in the order Validate checks them.
constexpr std::array kRequestFields = {
    Field<&RequestOptions::max_namespaces>("manager.max_namespaces"),
    Field<&RequestOptions::idle_request_ttl_ms>("manager.idle_request_ttl_ms")};
constexpr std::array kG2Fields = {
    Field<&G2Options::capacity_bytes, FieldRule::kBytes>("g2.capacity_bytes"),
    Field<&G2Options::hugepages>("g2.hugepages"),
    Field<&G2Options::lock_memory>("g2.lock_memory"),
    Field<&G2Options::prefault_threads>("g2.prefault_threads"),
    Field<&G2Options::namespace_share>("g2.namespace_share"),
    Field<&G2Options::staging_slots>("g2.staging_slots")};
constexpr std::array kG3Fields = {
    Field<&G3Options::enabled>("g3.enabled"),
    Field<&G3Options::dir>("g3.dir"),
    Field<&G3Options::capacity_bytes, FieldRule::kBytes>("g3.capacity_bytes"),
    Field<&G3Options::flush_on_close>("g3.flush_on_close"),
    Field<&G3Options::files>("g3.files"),
    Field<&G3Options::queue_depth>("g3.queue_depth"),
    Field<&G3Options::write_budget_bytes_per_s, FieldRule::kBytes>("g3.write_budget_bytes_per_s"),
    Field<&G3Options::quarantine_after_errors>("g3.quarantine_after_errors"),
    Field<&G3Options::reprobe_interval_ms>("g3.reprobe_interval_ms"),
    Field<&G3Options::admit_min_seen>("g3.admit_min_seen"),
    Field<&G3Options::admit_max_writes_per_hit>("g3.admit_max_writes_per_hit")};
constexpr std::array kTransferFields = {
    Field<&TransferOptions::copy_threads>("transfer.copy_threads"),
    Field<&TransferOptions::load_stores>("transfer.load_stores"),
    Field<&TransferOptions::max_queued_saves>("transfer.max_queued_saves"),
    Field<&TransferOptions::max_defer_ms>("transfer.max_defer_ms")};
// g4.backend and g4.endpoints are parsed by hand (an enum, a list).
constexpr std::array kG4Fields = {
    Field<&G4Options::cluster>("g4.cluster"),
    Field<&G4Options::username, FieldRule::kAsGiven>("g4.username"),
    Field<&G4Options::password, FieldRule::kAsGiven>("g4.password"),
    Field<&G4Options::dir, FieldRule::kAsGiven>("g4.dir"),
    Field<&G4Options::write_through>("g4.write_through"),
    Field<&G4Options::lookup_deadline_ms>("g4.lookup_deadline_ms"),
    Field<&G4Options::load_deadline_ms>("g4.load_deadline_ms"),
    Field<&G4Options::save_deadline_ms>("g4.save_deadline_ms"),
    Field<&G4Options::threads>("g4.threads"),
    Field<&G4Options::redis_pipeline_kib>("g4.redis_pipeline_kib"),
    Field<&G4Options::max_queued_saves>("g4.max_queued_saves"),
    Field<&G4Options::load_gbps>("g4.load_gbps"),
    Field<&G4Options::recompute_tokens_per_s>("g4.recompute_tokens_per_s")};
constexpr std::array kEventFields = {
    Field<&EventOptions::endpoint>("events.endpoint"),
    Field<&EventOptions::replay_endpoint>("events.replay_endpoint"),
    Field<&EventOptions::topic, FieldRule::kAsGiven>("events.topic"),
    Field<&EventOptions::queue_events>("events.queue_events"),
    Field<&EventOptions::replay_batches>("events.replay_batches"),
    Field<&EventOptions::replay_bytes, FieldRule::kBytes>("events.replay_bytes"),
    Field<&EventOptions::data_parallel_rank>("events.data_parallel_rank")};
constexpr std::array kMetricsFields = {Field<&MetricsOptions::port>("metrics.port"),
                                       Field<&MetricsOptions::bind>("metrics.bind")};

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
  ReadFields(config, kRequestFields, o);
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status RequestOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckText("hash.algorithm", HashAlgorithmName(hash)));
  return CheckFields(kRequestFields, *this);
}

Result<IndexOptions> IndexOptions::FromConfig(const Config& config) {
  IndexOptions o;
  o.shards = static_cast<uint32_t>(config.GetUint("index.shards"));
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
  ReadFields(config, kG2Fields, o);
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status G2Options::Validate() const { return CheckFields(kG2Fields, *this); }

Result<G3Options> G3Options::FromConfig(const Config& config) {
  G3Options o;
  ReadFields(config, kG3Fields, o);
  o.dir_set = config.IsSet("g3.dir");
  for (const ConfigEntry& e : config.Entries()) {
    if (e.spec->name == "g3.dir") o.dir_origin = e.origin;
  }
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status G3Options::Validate() const { return CheckFields(kG3Fields, *this); }

Result<TransferOptions> TransferOptions::FromConfig(const Config& config) {
  TransferOptions o;
  ReadFields(config, kTransferFields, o);
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status TransferOptions::Validate() const { return CheckFields(kTransferFields, *this); }

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
  ReadFields(config, kG4Fields, o);
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status G4Options::Validate() const {
  std::string endpoint_list;
  for (const std::string& e : endpoints) endpoint_list += (endpoint_list.empty() ? "" : ",") + e;
  KVTIER_RETURN_IF_ERROR(CheckText("g4.endpoints", endpoint_list));
  KVTIER_RETURN_IF_ERROR(CheckFields(kG4Fields, *this));
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
  ReadFields(config, kEventFields, o);
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status EventOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckFields(kEventFields, *this));
  if (endpoint.empty() && !replay_endpoint.empty()) {
    return Status::InvalidArgument(
        "events.replay_endpoint is set but events.endpoint is empty; set events.endpoint "
        "(the PUB address) too, or clear both");
  }
  return Status::Ok();
}

Result<MetricsOptions> MetricsOptions::FromConfig(const Config& config) {
  MetricsOptions o;
  ReadFields(config, kMetricsFields, o);
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status MetricsOptions::Validate() const { return CheckFields(kMetricsFields, *this); }

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

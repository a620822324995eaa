#include "index/policy_config_keys.h"

#include <map>

#include "index/eviction_policy.h"
#include "index/policy_names.h"

namespace kvtier {

std::vector<ConfigKey> PolicyConfigKeys(const std::string& tier) {
  const CreditLruConfig credit;
  constexpr double kMaxCredit = CreditLruConfig::kMaxCredit;
  struct Field {
    const char* name;
    const char* doc;
    double min, max;
  };
  const Field credit_fields[] = {
      {"used_twice",
       "credit-lru: credit of a block used twice (x the tier's capacity; higher keeps it longer)",
       -kMaxCredit, kMaxCredit},
      {"used_thrice", "credit-lru: credit of a block used three times or more", -kMaxCredit,
       kMaxCredit},
      {"long_follow_up",
       "credit-lru: credit of a run of 16+ blocks stored behind a deep hit (a follow-up turn "
       "that pasted a lot)",
       -kMaxCredit, kMaxCredit},
      {"stale_tail",
       "credit-lru: credit of a run's last block, never used since (0 when the engine's next "
       "turn reuses a prompt's last full block)",
       -kMaxCredit, kMaxCredit},
      {"ghost_factor",
       "credit-lru: evicted keys whose use counts are remembered, x the tier's capacity (0: none)",
       0, CreditLruConfig::kMaxGhostFactor},
  };
  std::vector<ConfigKey> out;
  for (const Field& f : credit_fields) {
    ConfigKey k;
    k.spec.name = tier + ".credit_lru." + f.name;
    k.spec.type = ConfigType::kDouble;
    k.spec.default_value = ShortestNumberText(*credit.Get(f.name));
    k.spec.doc = f.doc;
    k.spec.real_min = f.min;
    k.spec.real_max = f.max;
    out.push_back(std::move(k));
  }
  // AdaptiveConfig::Validate's ranges. half_life's is (0, 1024]: the key's inclusive minimum is
  // 2^-10, and AdaptiveConfig::Validate checks again when the manager starts.
  const AdaptiveConfig adaptive;
  const struct {
    const char* name;
    double default_value;
    const char* doc;
    double min, max;
  } adaptive_fields[] = {
      {"half_life", adaptive.half_life,
       "adaptive: half-life of the shadow caches' scores, in references per capacity block "
       "(shorter follows phase changes sooner)",
       1.0 / 1024, 1024},
      {"hysteresis", adaptive.hysteresis,
       "adaptive: relative lead a candidate's score needs over the leader's to take over", 0, 10},
      {"with_hit_density", adaptive.with_hit_density,
       "adaptive: 1 adds hit-density as a fifth candidate (0 or 1; it did not beat credit-lru in "
       "the study, docs/policy-study.md 8.8)",
       0, 1},
  };
  for (const auto& f : adaptive_fields) {
    ConfigKey k;
    k.spec.name = tier + ".adaptive." + f.name;
    k.spec.type = ConfigType::kDouble;
    k.spec.default_value = ShortestNumberText(f.default_value);
    k.spec.doc = f.doc;
    k.spec.real_min = f.min;
    k.spec.real_max = f.max;
    out.push_back(std::move(k));
  }
  return out;
}

Result<bool> ScreenPolicyName(std::string_view value) {
  if (!IsLabPolicyName(value)) return false;
  if (LabPolicyNamesAccepted()) return true;
  return Status::InvalidArgument(LabPolicyRefusal(value));
}

std::vector<std::string> PolicyConfigWarnings(const Config& config) {
  // The explicit settings, by name (the order of the lines).
  std::map<std::string, const ConfigEntry*> given;
  const std::vector<ConfigEntry> entries = config.Entries();
  for (const ConfigEntry& e : entries) {
    if (e.source != ConfigSource::kDefault) given[e.spec->name] = &e;
  }
  std::vector<std::string> out;
  for (const char* tier : {"g2", "g3"}) {
    const std::string policy_field = std::string(tier) + ".policy";
    const std::string& policy = config.GetString(policy_field);
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
      for (const auto& [name, e] : given) {
        if (name.rfind(prefix, 0) != 0) continue;
        out.push_back(name + " = " + e->value + " (from " +
                      (e->origin.empty() ? ConfigSourceName(e->source) : e->origin) +
                      ") has no effect: " + policy_field + " = " + policy + "; set " +
                      policy_field + " = " + g.users + ", or remove the setting");
      }
    }
  }
  return out;
}

}  // namespace kvtier

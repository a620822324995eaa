#include "index/eviction_policy.h"

#include <atomic>
#include <charconv>
#include <cmath>
#include <string>

#include "index/adaptive_policy.h"
#include "index/arc_policy.h"
#include "index/credit_lru_policy.h"
#include "index/hit_density_policy.h"
#include "index/lru_policy.h"
#include "index/policy_names.h"
#include "index/w_tinylfu_policy.h"

namespace kvtier {

namespace {

constexpr PolicyKind kAllKinds[] = {PolicyKind::kLru,       PolicyKind::kLineageLru,
                                    PolicyKind::kS3Fifo,    PolicyKind::kBelady,
                                    PolicyKind::kCreditLru, PolicyKind::kArc,
                                    PolicyKind::kWTinyLfu,  PolicyKind::kLeafFirstLru,
                                    PolicyKind::kAdaptive,  PolicyKind::kHitDensity};

// The lab's maker of its policies, when it installed one in this process (SetLabPolicyMaker).
std::atomic<LabPolicyMaker> lab_policy_maker{nullptr};

// The shortest text that reads back as `v` ("0.75", "-1", "nan", "inf").
std::string Shortest(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string FieldList() {
  std::string names;
  for (const char* n : CreditLruConfig::kFieldNames)
    names += (names.empty() ? "" : ", ") + std::string(n);
  return names;
}

// The member named `name`, or nullptr.
template <typename Config>
auto* FieldOf(Config& c, std::string_view name) {
  decltype(&c.used_twice) fields[] = {&c.used_twice, &c.used_thrice, &c.long_follow_up,
                                      &c.stale_tail, &c.ghost_factor};
  static_assert(std::size(fields) == std::size(CreditLruConfig::kFieldNames));
  for (size_t i = 0; i < std::size(fields); ++i) {
    if (name == CreditLruConfig::kFieldNames[i]) return fields[i];
  }
  return static_cast<decltype(&c.used_twice)>(nullptr);
}

}  // namespace

Status CreditLruConfig::Validate() const {
  for (const char* name : kFieldNames) {
    const double value = *FieldOf(*this, name);
    const bool ghost = std::string_view(name) == "ghost_factor";
    const double lo = ghost ? 0 : -kMaxCredit, hi = ghost ? kMaxGhostFactor : kMaxCredit;
    if (std::isfinite(value) && value >= lo && value <= hi) continue;
    return Status::InvalidArgument("credit_lru." + std::string(name) + " = " + Shortest(value) +
                                   ": must be a finite number in [" + Shortest(lo) + ", " +
                                   Shortest(hi) + "]");
  }
  return Status::Ok();
}

Result<double> CreditLruConfig::Get(std::string_view name) const {
  if (const double* field = FieldOf(*this, name)) return *field;
  return Status::InvalidArgument("credit_lru has no setting '" + std::string(name) +
                                 "'; its settings: " + FieldList());
}

Status CreditLruConfig::Set(std::string_view name, double value) {
  double* field = FieldOf(*this, name);
  if (field == nullptr) {
    return Status::InvalidArgument("credit_lru has no setting '" + std::string(name) +
                                   "'; its settings: " + FieldList());
  }
  *field = value;
  return Status::Ok();
}

Status AdaptiveConfig::Validate() const {
  if (!(std::isfinite(half_life) && half_life > 0 && half_life <= 1024)) {
    return Status::InvalidArgument("adaptive.half_life = " + Shortest(half_life) +
                                   ": must be a number in (0, 1024]");
  }
  if (!(std::isfinite(hysteresis) && hysteresis >= 0 && hysteresis <= 10)) {
    return Status::InvalidArgument("adaptive.hysteresis = " + Shortest(hysteresis) +
                                   ": must be a number in [0, 10]");
  }
  if (with_hit_density != 0 && with_hit_density != 1) {
    return Status::InvalidArgument("adaptive.with_hit_density = " + Shortest(with_hit_density) +
                                   ": must be 0 or 1");
  }
  return Status::Ok();
}

Status AdaptiveConfig::Set(std::string_view name, double value) {
  AdaptiveConfig next = *this;
  if (name == "half_life") {
    next.half_life = value;
  } else if (name == "hysteresis") {
    next.hysteresis = value;
  } else if (name == "with_hit_density") {
    next.with_hit_density = value;
  } else {
    return Status::InvalidArgument("adaptive has no setting '" + std::string(name) +
                                   "'; its settings: half_life, hysteresis, with_hit_density");
  }
  KVTIER_RETURN_IF_ERROR(next.Validate());
  *this = next;
  return Status::Ok();
}

Status HitDensityConfig::Validate() const {
  struct Range {
    const char* name;
    double value, lo, hi;
    bool lo_open, hi_open, integer;
  };
  const Range ranges[] = {
      {"ghost_factor", ghost_factor, 0, 64, false, false, false},
      {"decay", decay, 0, 1, false, true, false},
      {"refresh", refresh, 0, 64, true, false, false},
      {"max_age", max_age, 0, 1024, true, false, false},
      {"samples", samples, 1, 1024, false, false, true},
      {"features", features, 0, kAllFeatures, false, false, true},
  };
  static_assert(std::size(ranges) == std::size(kFieldNames));
  for (const Range& r : ranges) {
    const bool ok = std::isfinite(r.value) && (r.lo_open ? r.value > r.lo : r.value >= r.lo) &&
                    (r.hi_open ? r.value < r.hi : r.value <= r.hi) &&
                    (!r.integer || r.value == std::floor(r.value));
    if (ok) continue;
    return Status::InvalidArgument(
        "hit_density." + std::string(r.name) + " = " + Shortest(r.value) + ": must be " +
        (r.integer ? "an integer" : "a number") + " in " + (r.lo_open ? "(" : "[") +
        Shortest(r.lo) + ", " + Shortest(r.hi) + (r.hi_open ? ")" : "]"));
  }
  return Status::Ok();
}

Status HitDensityConfig::Set(std::string_view name, double value) {
  HitDensityConfig next = *this;
  double* fields[] = {&next.ghost_factor, &next.decay,   &next.refresh,
                      &next.max_age,      &next.samples, &next.features};
  static_assert(std::size(fields) == std::size(kFieldNames));
  std::string names;
  for (size_t i = 0; i < std::size(fields); ++i) {
    if (name == kFieldNames[i]) {
      *fields[i] = value;
      KVTIER_RETURN_IF_ERROR(next.Validate());
      *this = next;
      return Status::Ok();
    }
    names += (i == 0 ? "" : ", ") + std::string(kFieldNames[i]);
  }
  return Status::InvalidArgument("hit_density has no setting '" + std::string(name) +
                                 "'; its settings: " + names);
}

const char* PolicyKindName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kLru:
      return "lru";
    case PolicyKind::kLineageLru:
      return "lineage-lru";
    case PolicyKind::kS3Fifo:
      return "s3fifo";
    case PolicyKind::kBelady:
      return "belady";
    case PolicyKind::kCreditLru:
      return "credit-lru";
    case PolicyKind::kArc:
      return "arc";
    case PolicyKind::kWTinyLfu:
      return "w-tinylfu";
    case PolicyKind::kLeafFirstLru:
      return "leaf-first-lru";
    case PolicyKind::kAdaptive:
      return "adaptive";
    case PolicyKind::kHitDensity:
      return "hit-density";
  }
  return "unknown";
}

Result<PolicyKind> ParsePolicyKind(std::string_view name) {
  std::string accepted;
  for (PolicyKind kind : kAllKinds) {
    if (name == PolicyKindName(kind)) return kind;
    if (!accepted.empty()) accepted += ", ";
    accepted += PolicyKindName(kind);
  }
  return Status::InvalidArgument("unknown eviction policy '" + std::string(name) +
                                 "'; accepted: " + accepted);
}

bool IsLabPolicy(PolicyKind kind) { return IsLabPolicyName(PolicyKindName(kind)); }

Status LabPolicyRefused(PolicyKind kind) {
  return Status::InvalidArgument(LabPolicyRefusal(PolicyKindName(kind)));
}

void SetLabPolicyMaker(LabPolicyMaker maker) { lab_policy_maker.store(maker); }

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(PolicyKind kind,
                                                           size_t capacity_blocks) {
  return MakeEvictionPolicy(kind, capacity_blocks, PolicyOptions());
}

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(PolicyKind kind, size_t capacity_blocks,
                                                           const PolicyOptions& options) {
  switch (kind) {
    case PolicyKind::kLru:
      return std::unique_ptr<EvictionPolicy>(std::make_unique<LruPolicy>());
    case PolicyKind::kLineageLru:
    case PolicyKind::kS3Fifo:
    case PolicyKind::kLeafFirstLru: {
      const LabPolicyMaker maker = lab_policy_maker.load();
      if (maker == nullptr) return LabPolicyRefused(kind);
      return maker(kind, capacity_blocks, options);
    }
    case PolicyKind::kCreditLru: {
      auto policy = CreditLruPolicy::Create(capacity_blocks, options.credit_lru);
      if (!policy.ok()) return policy.status();
      return std::unique_ptr<EvictionPolicy>(std::move(policy).value());
    }
    case PolicyKind::kArc:
      return std::unique_ptr<EvictionPolicy>(std::make_unique<ArcPolicy>(capacity_blocks));
    case PolicyKind::kWTinyLfu:
      return std::unique_ptr<EvictionPolicy>(std::make_unique<WTinyLfuPolicy>(capacity_blocks));
    case PolicyKind::kAdaptive: {
      auto policy = AdaptivePolicy::Create(capacity_blocks, options);
      if (!policy.ok()) return policy.status();
      return std::unique_ptr<EvictionPolicy>(std::move(policy).value());
    }
    case PolicyKind::kHitDensity: {
      auto policy = HitDensityPolicy::Create(capacity_blocks, options.hit_density);
      if (!policy.ok()) return policy.status();
      return std::unique_ptr<EvictionPolicy>(std::move(policy).value());
    }
    case PolicyKind::kBelady:
      return Status::InvalidArgument(
          "eviction policy 'belady' needs the future reference string: use MakeBeladyPolicy");
  }
  return Status::InvalidArgument("unknown eviction policy kind " +
                                 std::to_string(static_cast<int>(kind)));
}

}  // namespace kvtier

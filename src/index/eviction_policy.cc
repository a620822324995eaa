#include "index/eviction_policy.h"

#include <string>

#include "index/belady_policy.h"
#include "index/credit_lru_policy.h"
#include "index/lineage_lru_policy.h"
#include "index/lru_policy.h"
#include "index/s3fifo_policy.h"

namespace kvtier {

namespace {

constexpr PolicyKind kAllKinds[] = {PolicyKind::kLru, PolicyKind::kLineageLru, PolicyKind::kS3Fifo,
                                    PolicyKind::kBelady, PolicyKind::kCreditLru};

}  // namespace

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

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(PolicyKind kind,
                                                           size_t capacity_blocks) {
  switch (kind) {
    case PolicyKind::kLru:
      return std::unique_ptr<EvictionPolicy>(std::make_unique<LruPolicy>());
    case PolicyKind::kLineageLru:
      return std::unique_ptr<EvictionPolicy>(std::make_unique<LineageLruPolicy>());
    case PolicyKind::kS3Fifo:
      return std::unique_ptr<EvictionPolicy>(std::make_unique<S3FifoPolicy>(capacity_blocks));
    case PolicyKind::kCreditLru:
      return std::unique_ptr<EvictionPolicy>(std::make_unique<CreditLruPolicy>(capacity_blocks));
    case PolicyKind::kBelady:
      return Status::InvalidArgument(
          "eviction policy 'belady' needs the future reference string: use MakeBeladyPolicy");
  }
  return Status::InvalidArgument("unknown eviction policy kind " +
                                 std::to_string(static_cast<int>(kind)));
}

std::unique_ptr<EvictionPolicy> MakeBeladyPolicy(std::span<const BlockKey> references) {
  return std::make_unique<BeladyPolicy>(references);
}

}  // namespace kvtier

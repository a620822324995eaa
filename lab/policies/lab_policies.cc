#include "policies/lab_policies.h"

#include <string>

#include "index/policy_names.h"
#include "policies/lineage_lru_policy.h"
#include "policies/s3fifo_policy.h"

namespace kvtier {

namespace {

// The lab's kinds only: the maker MakeEvictionPolicy calls for them (never back into it).
Result<std::unique_ptr<EvictionPolicy>> MakeLabOnly(PolicyKind kind, size_t capacity_blocks,
                                                    const PolicyOptions& options) {
  switch (kind) {
    case PolicyKind::kLineageLru:
      return std::unique_ptr<EvictionPolicy>(std::make_unique<LineageLruPolicy>());
    case PolicyKind::kLeafFirstLru:
      return std::unique_ptr<EvictionPolicy>(std::make_unique<LineageLruPolicy>(true));
    case PolicyKind::kS3Fifo:
      return std::unique_ptr<EvictionPolicy>(std::make_unique<S3FifoPolicy>(capacity_blocks));
    default:
      return Status::InvalidArgument(std::string("eviction policy '") + PolicyKindName(kind) +
                                     "' is not one of the lab's online policies");
  }
}

}  // namespace

Result<std::unique_ptr<EvictionPolicy>> MakeLabEvictionPolicy(PolicyKind kind,
                                                              size_t capacity_blocks,
                                                              const PolicyOptions& options) {
  if (IsLabPolicy(kind) && kind != PolicyKind::kBelady) {
    return MakeLabOnly(kind, capacity_blocks, options);
  }
  return MakeEvictionPolicy(kind, capacity_blocks, options);
}

void EnableLabPolicies() {
  SetLabPolicyMaker(&MakeLabOnly);
  SetLabPolicyNamesAccepted(true);
}

}  // namespace kvtier

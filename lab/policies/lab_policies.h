// The lab's eviction policies: the ones that did not earn a place in the product
// (docs/policies.md, "Which policies the product offers"): lineage-lru and leaf-first-lru
// (LineageLruPolicy), s3fifo (S3FifoPolicy). Belady's oracle is the lab's too
// (sim/belady_policy.h), built from the future reference string.
//
// The product's MakeEvictionPolicy refuses these kinds by name; a lab command builds them here,
// or enables them process-wide so that the product's own code (BlockIndex, hence the real
// manager of `kvtier replay`) builds them too.
#pragma once

#include <cstddef>
#include <memory>

#include "index/eviction_policy.h"
#include "kvtier/status.h"

namespace kvtier {

// Any online policy, the lab's included: lab kinds are built here, the product's by
// MakeEvictionPolicy. InvalidArgument for kBelady (use MakeBeladyPolicy) and for options the
// kind's member refuses (as MakeEvictionPolicy).
Result<std::unique_ptr<EvictionPolicy>> MakeLabEvictionPolicy(
    PolicyKind kind, size_t capacity_blocks, const PolicyOptions& options = PolicyOptions());

// Lets this process's product code run the lab's policies: MakeEvictionPolicy builds them
// (SetLabPolicyMaker) and Config accepts their names in g2.policy / g3.policy
// (SetLabPolicyNamesAccepted). For lab commands and tests only (`kvtier replay` calls it through
// ReplayConfig when asked for a lab policy); the product never calls it. Idempotent, thread-safe.
void EnableLabPolicies();

}  // namespace kvtier

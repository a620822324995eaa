// The eviction policies by name, split into the product's and the lab's (docs/policies.md,
// "Which policies the product offers"; docs/architecture.md, "The product and the lab").
//
// The product offers the policies that earned it in the study (docs/policy-study.md): the
// default `adaptive` and the candidates it runs at run time (credit-lru, w-tinylfu, arc, lru;
// hit-density with gN.adaptive.with_hit_density). The others live in the lab (lab/policies,
// library kvtier_lab), where `kvtier sim` and `kvtier replay` still run them; the config
// (gN.policy) and the manager refuse them, naming where to use them.
//
// The index owns the names: the gN.policy keys take their choices and their screen from here
// (manager_config_keys.cc, policy_config_keys.h; core's Config knows no key nor policy by
// name), and src/index/eviction_policy.h classifies each PolicyKind through these lists;
// tests/index/eviction_policy_test.cc checks that every kind is in exactly one of them.
//
// Thread safety: the lists are constants; the lab switch is an atomic flag.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

// The policies a deployment may set in g2.policy / g3.policy, the default first: "adaptive",
// "credit-lru", "lru", "arc", "w-tinylfu", "hit-density".
const std::vector<std::string>& ProductPolicyNames();

// The lab's policies: "lineage-lru", "leaf-first-lru", "s3fifo", and "belady" (the offline
// oracle, which no online tier can run).
const std::vector<std::string>& LabPolicyNames();

// True when `name` is one of LabPolicyNames().
bool IsLabPolicyName(std::string_view name);

// Why the product refuses `name` (one of LabPolicyNames()): "<name> is a lab policy
// (docs/policy-study.md): use it with kvtier sim / replay; the product offers: adaptive, ...".
std::string LabPolicyRefusal(std::string_view name);

// Process-wide: whether Config accepts the lab's names for g2.policy / g3.policy. False unless
// the lab turns it on (EnableLabPolicies in lab/policies/lab_policies.h, called by `kvtier
// replay`); the product never does, so libkvtier.so, the engine and `kvtier serve` refuse them.
void SetLabPolicyNamesAccepted(bool accepted);
bool LabPolicyNamesAccepted();

}  // namespace kvtier

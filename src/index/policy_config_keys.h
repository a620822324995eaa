// The eviction policies' settings as config keys: gN.credit_lru.<field> and gN.adaptive.<field>
// for a tier gN. The index owns them: each key's default and range are those of the struct it
// fills (CreditLruConfig, AdaptiveConfig in eviction_policy.h), so the two cannot drift apart.
// The manager lists them right after the tier's gN.policy (src/manager/manager_config_keys.cc).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/config_registry.h"
#include "kvtier/config.h"
#include "kvtier/status.h"

namespace kvtier {

// The credit_lru.* then adaptive.* keys of tier `tier` ("g2", "g3"), in field order.
std::vector<ConfigKey> PolicyConfigKeys(const std::string& tier);

// The screen of the gN.policy keys (ConfigKey::screen): a lab policy (index/policy_names.h) is
// refused with LabPolicyRefusal's message, or taken as given where the lab accepts its names
// (LabPolicyNamesAccepted: `kvtier replay`); any other name is left to the key's choices, the
// product's policies.
Result<bool> ScreenPolicyName(std::string_view value);

// Policy settings given (by a file, the environment or Set) that have no effect under the
// tier's gN.policy, one line each: credit_lru.* unless the policy is credit-lru or adaptive
// (which runs credit-lru among its candidates), adaptive.* unless it is adaptive.
std::vector<std::string> PolicyConfigWarnings(const Config& config);

}  // namespace kvtier

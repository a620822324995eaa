#include "index/policy_names.h"

#include <algorithm>
#include <atomic>

namespace kvtier {

namespace {

std::atomic<bool> lab_names_accepted{false};

}  // namespace

const std::vector<std::string>& ProductPolicyNames() {
  static const std::vector<std::string> kNames = {"adaptive", "credit-lru", "lru",
                                                  "arc",      "w-tinylfu",  "hit-density"};
  return kNames;
}

const std::vector<std::string>& LabPolicyNames() {
  static const std::vector<std::string> kNames = {"lineage-lru", "leaf-first-lru", "s3fifo",
                                                  "belady"};
  return kNames;
}

bool IsLabPolicyName(std::string_view name) {
  const std::vector<std::string>& lab = LabPolicyNames();
  return std::find(lab.begin(), lab.end(), name) != lab.end();
}

std::string LabPolicyRefusal(std::string_view name) {
  std::string offered;
  for (const std::string& n : ProductPolicyNames()) offered += (offered.empty() ? "" : ", ") + n;
  return std::string(name) +
         " is a lab policy (docs/policy-study.md): use it with kvtier sim / replay; the product "
         "offers: " +
         offered;
}

void SetLabPolicyNamesAccepted(bool accepted) {
  lab_names_accepted.store(accepted, std::memory_order_relaxed);
}

bool LabPolicyNamesAccepted() { return lab_names_accepted.load(std::memory_order_relaxed); }

}  // namespace kvtier

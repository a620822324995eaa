#include "tier/disk_admission.h"

#include <algorithm>

namespace kvtier {

Status DiskAdmission::Config::Validate() const {
  AdmissionFilter::Config f;
  f.min_seen = min_seen;
  f.expected_keys = expected_keys;
  return f.Validate();
}

Result<std::unique_ptr<DiskAdmission>> DiskAdmission::Create(const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  AdmissionFilter::Config f;
  f.min_seen = config.min_seen;
  f.expected_keys = config.expected_keys;
  KVTIER_ASSIGN_OR_RETURN(auto filter, AdmissionFilter::Create(f));
  return std::unique_ptr<DiskAdmission>(new DiskAdmission(config, std::move(filter)));
}

DiskAdmission::DiskAdmission(const Config& config, std::unique_ptr<AdmissionFilter> filter)
    : config_(config),
      burst_(static_cast<double>(config.burst_bytes != 0 ? config.burst_bytes
                                                         : config.write_budget_bytes_per_s)),
      filter_(std::move(filter)) {
  MutexLock lock(&mu_);
  tokens_ = burst_;
  last_refill_ = Clock::now();
}

DiskAdmission::Decision DiskAdmission::Admit(const BlockKey& key, uint64_t bytes,
                                             Clock::time_point now) {
  if (!filter_->RecordAndCheck(key)) {
    not_seen_enough_.fetch_add(1, std::memory_order_relaxed);
    return Decision::kNotSeenEnough;
  }
  if (config_.write_budget_bytes_per_s != 0) {
    MutexLock lock(&mu_);
    if (now > last_refill_) {
      const double seconds = std::chrono::duration<double>(now - last_refill_).count();
      tokens_ = std::min(burst_, tokens_ + seconds * config_.write_budget_bytes_per_s);
      last_refill_ = now;
    }
    if (tokens_ <= 0) {
      over_budget_.fetch_add(1, std::memory_order_relaxed);
      return Decision::kOverBudget;
    }
    tokens_ -= static_cast<double>(bytes);
  }
  admitted_.fetch_add(1, std::memory_order_relaxed);
  return Decision::kAdmit;
}

DiskAdmission::Counts DiskAdmission::counts() const {
  return Counts{admitted_.load(std::memory_order_relaxed),
                not_seen_enough_.load(std::memory_order_relaxed),
                over_budget_.load(std::memory_order_relaxed)};
}

}  // namespace kvtier

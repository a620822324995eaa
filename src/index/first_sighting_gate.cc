#include "index/first_sighting_gate.h"

#include <cmath>
#include <string>

namespace kvtier {

Status FirstSightingGate::Config::Validate() const {
  if (!(std::isfinite(max_writes_per_hit) && max_writes_per_hit > 0 && max_writes_per_hit <= 1e6)) {
    return Status::InvalidArgument(
        "first-sighting gate: max_writes_per_hit = " + std::to_string(max_writes_per_hit) +
        ": must be a number in (0, 1e6]");
  }
  if (probe_one_in < 1 || probe_one_in > 1024) {
    return Status::InvalidArgument("first-sighting gate: probe_one_in = " +
                                   std::to_string(probe_one_in) + ": must be in 1..1024");
  }
  if (window < 2 * min_resolved || window < 2) {
    return Status::InvalidArgument("first-sighting gate: window = " + std::to_string(window) +
                                   ": must be at least 2 x min_resolved and at least 2");
  }
  if (horizon < 1) return Status::InvalidArgument("first-sighting gate: horizon must be >= 1");
  return Status::Ok();
}

Result<std::unique_ptr<FirstSightingGate>> FirstSightingGate::Create(const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<FirstSightingGate>(new FirstSightingGate(config));
}

bool FirstSightingGate::OpenLocked() const {
  if (total_resolved_ < config_.min_resolved) return true;
  return resolved_writes_ <= config_.max_writes_per_hit * resolved_hits_;
}

void FirstSightingGate::ResolveLocked(uint32_t hits) {
  resolved_writes_ += 1;
  resolved_hits_ += hits;
  ++total_resolved_;
  if (resolved_writes_ >= static_cast<double>(config_.window)) {
    resolved_writes_ /= 2;
    resolved_hits_ /= 2;
  }
}

bool FirstSightingGate::Admit(const BlockKey& key) {
  MutexLock lock(&mu_);
  ++decisions_;
  // Probes that reached the horizon resolve with the hits they had.
  while (!probe_order_.empty() && decisions_ - probe_order_.front().second >= config_.horizon) {
    if (auto it = probes_.find(probe_order_.front().first); it != probes_.end()) {
      ResolveLocked(it->second);
      probes_.erase(it);
    }
    probe_order_.pop_front();
  }
  if (IsProbe(key)) {
    if (probes_.try_emplace(key, 0).second) probe_order_.emplace_back(key, decisions_);
    ++admitted_;
    return true;
  }
  const bool open = OpenLocked();
  ++(open ? admitted_ : refused_);
  return open;
}

void FirstSightingGate::OnHit(const BlockKey& key) {
  MutexLock lock(&mu_);
  if (auto it = probes_.find(key); it != probes_.end()) ++it->second;
}

void FirstSightingGate::OnRemoved(const BlockKey& key) {
  MutexLock lock(&mu_);
  if (auto it = probes_.find(key); it != probes_.end()) {
    ResolveLocked(it->second);
    probes_.erase(it);
  }
}

FirstSightingGate::Counts FirstSightingGate::counts() const {
  MutexLock lock(&mu_);
  return Counts{resolved_writes_, resolved_hits_, probes_.size(),
                OpenLocked(),     admitted_,      refused_};
}

}  // namespace kvtier

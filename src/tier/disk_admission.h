// DiskAdmission: the gate in front of G3 writes. A block is admitted when the admission filter
// has seen it at least `min_seen` times (one-off prompts do not wear the SSD) and, when a write
// budget is set, the budget has bytes left (a token bucket refilled at
// write_budget_bytes_per_s, so the SSD's endurance is spent at a chosen rate).
//
// The bucket may go into debt by one block: a block larger than the burst is still admitted
// when the bucket is not in debt, and the debt is paid back by refill before the next admit, so
// the long-run rate never exceeds the budget whatever the block size.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "core/mutex.h"
#include "index/admission_filter.h"
#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

class DiskAdmission {
 public:
  using Clock = std::chrono::steady_clock;

  struct Config {
    uint32_t min_seen = 2;                  // sightings before admission; 1 admits every block
    uint64_t expected_keys = 1u << 20;      // distinct keys the filter tells apart (memory bound)
    uint64_t write_budget_bytes_per_s = 0;  // 0 = no budget
    uint64_t burst_bytes = 0;               // bucket size; 0 = one second of budget

    // Ok, or InvalidArgument naming the field (min_seen in 1..15, expected_keys in 1..2^32).
    Status Validate() const;
  };

  enum class Decision : uint8_t { kAdmit = 0, kNotSeenEnough, kOverBudget };

  struct Counts {
    uint64_t admitted = 0;
    uint64_t not_seen_enough = 0;
    uint64_t over_budget = 0;
  };

  // InvalidArgument when config does not validate.
  static Result<std::unique_ptr<DiskAdmission>> Create(const Config& config);

  // Records one sighting of `key` and decides whether a write of `bytes` for it goes to G3.
  // Budget is only spent on admitted blocks. Thread-safe.
  Decision Admit(const BlockKey& key, uint64_t bytes, Clock::time_point now = Clock::now())
      EXCLUDES(mu_);

  Counts counts() const;

 private:
  DiskAdmission(const Config& config, std::unique_ptr<AdmissionFilter> filter);

  const Config config_;
  const double burst_;
  std::unique_ptr<AdmissionFilter> filter_;
  Mutex mu_;
  double tokens_ GUARDED_BY(mu_) = 0;
  Clock::time_point last_refill_ GUARDED_BY(mu_);
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> not_seen_enough_{0};
  std::atomic<uint64_t> over_budget_{0};
};

}  // namespace kvtier

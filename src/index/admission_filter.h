// AdmissionFilter: admits a block into a lower tier (G3, G4) only once it has been seen at
// least `min_seen` times, so one-off prompts do not wear the SSD or fill shared storage.
//
// Counts live in a count-min sketch of 4-bit counters (TinyLFU-style) whose counts are halved
// every `sample_size` records, so memory is fixed and old popularity fades. A count may be
// overestimated by a collision, never underestimated between two halvings.
//
// Block keys are uniformly random already, so each of the 4 rows indexes its counters with its
// own 32-bit slice of the 128-bit key: no hashing, and the rows are independent. Updates are
// conservative (only the counters at the current minimum grow), which keeps collisions from
// inflating the popular rows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/mutex.h"
#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

class AdmissionFilter {
 public:
  struct Config {
    uint32_t min_seen = 2;  // 1 admits everything; at most 15
    // Distinct keys the filter should tell apart, 1..2^32. The sketch takes 2 bytes per key,
    // rounded up to a power of two (2 MiB for the default).
    uint64_t expected_keys = 1u << 20;
    uint64_t sample_size = 0;  // records between halvings; 0 = 10 x expected_keys

    // Ok, or InvalidArgument naming the field, its value and the allowed range.
    Status Validate() const;
  };

  // InvalidArgument when config does not validate.
  static Result<std::unique_ptr<AdmissionFilter>> Create(const Config& config);

  // Records one sighting of `key` and returns whether it has now been seen at least min_seen
  // times. Thread-safe.
  bool RecordAndCheck(const BlockKey& key);

  // The current estimate of how often `key` was seen (0..15). Thread-safe.
  uint32_t Estimate(const BlockKey& key) const;

  // The configured admission threshold.
  uint32_t min_seen() const { return config_.min_seen; }

 private:
  static constexpr int kRows = 4;
  static constexpr uint32_t kMaxCount = 15;  // a 4-bit counter saturates here

  explicit AdmissionFilter(const Config& config);

  // The index, in table_'s counter space, of `key`'s counter in `row`.
  uint64_t CounterIndex(const BlockKey& key, int row) const;
  uint32_t CountAt(uint64_t index) const REQUIRES(mu_);
  uint32_t EstimateLocked(const BlockKey& key) const REQUIRES(mu_);
  // Halves every counter, rounding down.
  void Age() REQUIRES(mu_);

  const Config config_;
  const uint64_t sample_size_;  // records between halvings (config's 0 resolved)
  const uint32_t row_bits_;     // log2 of the row width: the key bits each row consumes
  mutable Mutex mu_;
  // kRows rows of 2^row_bits_ four-bit counters, row after row, 16 counters per word.
  std::vector<uint64_t> table_ GUARDED_BY(mu_);
  uint64_t records_ GUARDED_BY(mu_) = 0;  // since the last halving
};

}  // namespace kvtier

#include "index/admission_filter.h"

#include <algorithm>
#include <bit>
#include <string>

namespace kvtier {

namespace {

constexpr uint64_t kMaxExpectedKeys = uint64_t{1} << 32;
constexpr int kCountersPerWord = 16;
// Clears the bit that a right shift moves into the top of each 4-bit counter.
constexpr uint64_t kHalvingMask = 0x7777777777777777ull;

uint32_t RowBits(uint64_t expected_keys) {
  return static_cast<uint32_t>(std::bit_width(std::bit_ceil(expected_keys)) - 1);
}

}  // namespace

Status AdmissionFilter::Config::Validate() const {
  if (min_seen < 1 || min_seen > kMaxCount) {
    return Status::InvalidArgument("AdmissionFilter min_seen = " + std::to_string(min_seen) +
                                   ": must be in 1..15");
  }
  if (expected_keys < 1 || expected_keys > kMaxExpectedKeys) {
    return Status::InvalidArgument("AdmissionFilter expected_keys = " +
                                   std::to_string(expected_keys) + ": must be in 1..2^32");
  }
  if (sample_size != 0 && sample_size < expected_keys) {
    return Status::InvalidArgument("AdmissionFilter sample_size = " + std::to_string(sample_size) +
                                   ": must be 0 (10 x expected_keys) or at least expected_keys (" +
                                   std::to_string(expected_keys) + ")");
  }
  return Status::Ok();
}

Result<std::unique_ptr<AdmissionFilter>> AdmissionFilter::Create(const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<AdmissionFilter>(new AdmissionFilter(config));
}

AdmissionFilter::AdmissionFilter(const Config& config)
    : config_(config),
      sample_size_(config.sample_size != 0 ? config.sample_size : 10 * config.expected_keys),
      row_bits_(RowBits(config.expected_keys)) {
  const uint64_t counters = uint64_t{kRows} << row_bits_;
  MutexLock lock(&mu_);
  table_.assign((counters + kCountersPerWord - 1) / kCountersPerWord, 0);
}

uint64_t AdmissionFilter::CounterIndex(const BlockKey& key, int row) const {
  // Row r reads key bits [32r, 32r + row_bits_): disjoint slices, hence independent rows.
  const uint64_t word = row < 2 ? key.lo : key.hi;
  const uint64_t slice = (row % 2 == 0) ? word : (word >> 32);
  const uint64_t column = slice & ((uint64_t{1} << row_bits_) - 1);
  return (uint64_t(row) << row_bits_) + column;
}

uint32_t AdmissionFilter::CountAt(uint64_t index) const {
  return static_cast<uint32_t>(table_[index / kCountersPerWord] >>
                               (4 * (index % kCountersPerWord))) &
         kMaxCount;
}

uint32_t AdmissionFilter::EstimateLocked(const BlockKey& key) const {
  uint32_t estimate = kMaxCount;
  for (int row = 0; row < kRows; ++row) {
    estimate = std::min(estimate, CountAt(CounterIndex(key, row)));
  }
  return estimate;
}

void AdmissionFilter::Age() {
  for (uint64_t& word : table_) word = (word >> 1) & kHalvingMask;
}

bool AdmissionFilter::RecordAndCheck(const BlockKey& key) {
  uint64_t index[kRows];
  for (int row = 0; row < kRows; ++row) index[row] = CounterIndex(key, row);

  MutexLock lock(&mu_);
  uint32_t count[kRows];
  uint32_t least = kMaxCount;
  for (int row = 0; row < kRows; ++row) {
    count[row] = CountAt(index[row]);
    least = std::min(least, count[row]);
  }
  if (least < kMaxCount) {
    for (int row = 0; row < kRows; ++row) {
      if (count[row] == least) {
        table_[index[row] / kCountersPerWord] += uint64_t{1}
                                                 << (4 * (index[row] % kCountersPerWord));
      }
    }
    ++least;
  }
  // The answer counts this sighting even when it triggers the halving below, so min_seen = 1
  // admits every key.
  const bool admit = least >= config_.min_seen;
  if (++records_ >= sample_size_) {
    Age();
    records_ = 0;
  }
  return admit;
}

uint32_t AdmissionFilter::Estimate(const BlockKey& key) const {
  MutexLock lock(&mu_);
  return EstimateLocked(key);
}

}  // namespace kvtier

#include "index/w_tinylfu_policy.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>

namespace kvtier {

namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

constexpr uint64_t kSeeds[] = {0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull,
                               0xd6e8feb86659fd93ull};

}  // namespace

FrequencySketch::FrequencySketch(uint64_t expected_keys, uint64_t sample_size)
    : mask_(std::bit_ceil(std::max<uint64_t>(expected_keys, 16) * 4) - 1),
      door_mask_(
          std::bit_ceil(
              (sample_size != 0 ? sample_size : 10 * std::max<uint64_t>(expected_keys, 16)) * 8) -
          1),
      sample_size_(sample_size != 0 ? sample_size : 10 * std::max<uint64_t>(expected_keys, 16)),
      counters_(kRows * (mask_ + 1), 0),
      door_((door_mask_ + 1) / 64, 0) {}

uint64_t FrequencySketch::Hash(const BlockKey& key, int row) const {
  return Mix(key.hi ^ Mix(key.lo + kSeeds[row]));
}

bool FrequencySketch::DoorkeeperHas(const BlockKey& key) const {
  for (int i = 0; i < 2; ++i) {
    const uint64_t bit = Hash(key, i + 2) & door_mask_;
    if ((door_[bit >> 6] & (1ull << (bit & 63))) == 0) return false;
  }
  return true;
}

void FrequencySketch::Record(const BlockKey& key) {
  if (!DoorkeeperHas(key)) {
    for (int i = 0; i < 2; ++i) {
      const uint64_t bit = Hash(key, i + 2) & door_mask_;
      door_[bit >> 6] |= 1ull << (bit & 63);
    }
  } else {
    // Conservative update: raise only the counters at the current minimum.
    uint8_t* cells[kRows];
    uint8_t lo = kMaxCount;
    for (int r = 0; r < kRows; ++r) {
      cells[r] = &counters_[r * (mask_ + 1) + (Hash(key, r) & mask_)];
      lo = std::min(lo, *cells[r]);
    }
    if (lo < kMaxCount) {
      for (uint8_t* c : cells) {
        if (*c == lo) ++*c;
      }
    }
  }
  if (++records_ >= sample_size_) Age();
}

uint32_t FrequencySketch::Estimate(const BlockKey& key) const {
  uint8_t lo = kMaxCount;
  for (int r = 0; r < kRows; ++r) {
    lo = std::min(lo, counters_[r * (mask_ + 1) + (Hash(key, r) & mask_)]);
  }
  return lo + (DoorkeeperHas(key) ? 1u : 0u);
}

void FrequencySketch::Age() {
  for (uint8_t& c : counters_) c >>= 1;
  std::fill(door_.begin(), door_.end(), 0);
  records_ = 0;
}

WTinyLfuPolicy::WTinyLfuPolicy(size_t capacity_blocks)
    : window_cap_(std::max<size_t>(1, static_cast<size_t>(std::llround(
                                          kWindowShare * static_cast<double>(capacity_blocks))))),
      protected_cap_(static_cast<size_t>(
          kProtectedShare *
          static_cast<double>(capacity_blocks > window_cap_ ? capacity_blocks - window_cap_ : 0))),
      sketch_(std::max<size_t>(capacity_blocks, 1)) {}

std::list<BlockKey>& WTinyLfuPolicy::ListOf(Segment s) {
  switch (s) {
    case Segment::kWindow:
      return window_;
    case Segment::kProbation:
      return probation_;
    case Segment::kProtected:
      return protected_;
  }
  return window_;
}

void WTinyLfuPolicy::MoveTo(Entry& e, Segment to) {
  std::list<BlockKey>& dest = ListOf(to);
  dest.splice(dest.begin(), ListOf(e.segment), e.pos);
  e.pos = dest.begin();
  e.segment = to;
}

void WTinyLfuPolicy::OnInsert(const BlockKey& key, const BlockKey& /*parent*/) {
  sketch_.Record(key);
  auto [it, inserted] = where_.try_emplace(key);
  assert(inserted && "WTinyLfuPolicy::OnInsert: key is tracked already");
  if (!inserted) return;
  window_.push_front(key);
  it->second = Entry{Segment::kWindow, window_.begin()};
  while (window_.size() > window_cap_) {
    MoveTo(where_.find(window_.back())->second, Segment::kProbation);
  }
}

void WTinyLfuPolicy::OnAccess(const BlockKey& key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  sketch_.Record(key);
  Entry& e = it->second;
  if (e.segment == Segment::kWindow) {
    MoveTo(e, Segment::kWindow);
    return;
  }
  MoveTo(e, Segment::kProtected);
  while (protected_.size() > protected_cap_) {
    MoveTo(where_.find(protected_.back())->second, Segment::kProbation);
  }
}

void WTinyLfuPolicy::OnRemove(const BlockKey& key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  ListOf(it->second.segment).erase(it->second.pos);
  where_.erase(it);
}

std::optional<BlockKey> WTinyLfuPolicy::LruEvictable(const std::list<BlockKey>& list,
                                                     const EvictablePredicate& evictable) {
  for (auto it = list.rbegin(); it != list.rend(); ++it) {
    if (evictable(*it)) return *it;
  }
  return std::nullopt;
}

std::optional<BlockKey> WTinyLfuPolicy::Victim(const EvictablePredicate& evictable) {
  // Each segment is searched at most once, so `evictable` is asked at most once per key.
  const bool contest = window_.size() >= window_cap_;
  const std::optional<BlockKey> candidate =
      contest ? LruEvictable(window_, evictable) : std::nullopt;
  std::optional<BlockKey> main = LruEvictable(probation_, evictable);
  if (!main) main = LruEvictable(protected_, evictable);
  if (candidate && main) {
    if (sketch_.Estimate(*candidate) > sketch_.Estimate(*main)) {
      MoveTo(where_.find(*candidate)->second, Segment::kProbation);
      return main;
    }
    return candidate;
  }
  if (candidate) return candidate;
  if (main) return main;
  return contest ? std::nullopt : LruEvictable(window_, evictable);
}

}  // namespace kvtier

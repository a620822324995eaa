#include "policies/s3fifo_policy.h"

#include <algorithm>
#include <cassert>

namespace kvtier {

S3FifoPolicy::S3FifoPolicy(size_t capacity_blocks)
    : small_target_(std::max<size_t>(1, capacity_blocks / 10)),
      ghost_capacity_(std::max<size_t>(1, capacity_blocks)) {}

S3FifoPolicy::Queue S3FifoPolicy::QueueOf(const BlockKey& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? Queue::kNone : it->second.queue;
}

uint8_t S3FifoPolicy::Frequency(const BlockKey& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second.freq;
}

void S3FifoPolicy::MoveToHead(Entry& entry, Queue to) {
  KeyList& dst = ListOf(to);
  // splice keeps entry.pos valid and allocates nothing.
  dst.splice(dst.begin(), ListOf(entry.queue), entry.pos);
  entry.queue = to;
}

void S3FifoPolicy::RememberInGhost(const BlockKey& key) {
  if (ghost_index_.contains(key)) return;
  ghost_.push_front(key);
  ghost_index_.emplace(key, ghost_.begin());
  while (ghost_.size() > ghost_capacity_) {
    ghost_index_.erase(ghost_.back());
    ghost_.pop_back();
  }
}

void S3FifoPolicy::OnInsert(const BlockKey& key, const BlockKey& /*parent*/) {
  auto [it, inserted] = entries_.try_emplace(key);
  assert(inserted && "S3FifoPolicy::OnInsert: key is tracked already");
  if (!inserted) {  // Release builds: treat a double insert as an access rather than corrupt.
    OnAccess(key);
    return;
  }
  Entry& entry = it->second;
  entry.queue = Queue::kSmall;
  if (auto ghost = ghost_index_.find(key); ghost != ghost_index_.end()) {
    // Seen again soon after small dropped it: it has proven reuse, skip the probation.
    ghost_.erase(ghost->second);
    ghost_index_.erase(ghost);
    entry.queue = Queue::kMain;
  }
  KeyList& list = ListOf(entry.queue);
  list.push_front(key);
  entry.pos = list.begin();
}

void S3FifoPolicy::OnAccess(const BlockKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  uint8_t& freq = it->second.freq;
  if (freq < kMaxFreq) ++freq;
}

void S3FifoPolicy::OnRemove(const BlockKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  const Queue queue = it->second.queue;
  ListOf(queue).erase(it->second.pos);
  entries_.erase(it);
  // Only blocks that never left probation are remembered: if they come back while still in
  // ghost, their reuse distance was just a little longer than small could cover.
  if (queue == Queue::kSmall) RememberInGhost(key);
}

std::optional<BlockKey> S3FifoPolicy::SearchSmall(const EvictablePredicate& evictable) {
  size_t refused = 0;
  // Refused blocks go back to the head, so once `refused` covers all of small every block left
  // there has been asked.
  while (refused < small_.size()) {
    const BlockKey key = small_.back();
    Entry& entry = entries_.find(key)->second;
    if (entry.freq > 0) {
      entry.freq = 0;
      MoveToHead(entry, Queue::kMain);
      continue;
    }
    if (evictable(key)) return key;
    entry.refused_in = search_;
    MoveToHead(entry, Queue::kSmall);
    ++refused;
  }
  return std::nullopt;
}

std::optional<BlockKey> S3FifoPolicy::SearchMain(const EvictablePredicate& evictable) {
  // Stops after one full lap in which no counter went down: every block then has counter 0 and
  // has been refused. Counters only go down here, so that happens within kMaxFreq + 1 laps.
  size_t idle_steps = 0;
  while (idle_steps < main_.size()) {
    const BlockKey key = main_.back();
    Entry& entry = entries_.find(key)->second;
    if (entry.freq > 0) {
      --entry.freq;
      idle_steps = 0;
    } else {
      if (entry.refused_in != search_ && evictable(key)) return key;
      entry.refused_in = search_;
      ++idle_steps;
    }
    MoveToHead(entry, Queue::kMain);
  }
  return std::nullopt;
}

std::optional<BlockKey> S3FifoPolicy::Victim(const EvictablePredicate& evictable) {
  ++search_;
  if (small_.size() >= small_target_ || main_.empty()) {
    if (auto victim = SearchSmall(evictable)) return victim;
    return SearchMain(evictable);
  }
  if (auto victim = SearchMain(evictable)) return victim;
  for (auto it = small_.rbegin(); it != small_.rend(); ++it) {
    if (evictable(*it)) return *it;
  }
  return std::nullopt;
}

}  // namespace kvtier

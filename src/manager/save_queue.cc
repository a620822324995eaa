#include "manager/save_queue.h"

#include <utility>

namespace kvtier {

void SaveQueue::Configure(size_t max_deferred, std::chrono::milliseconds max_defer) {
  max_deferred_ = max_deferred;
  max_defer_ = max_defer;
}

void SaveQueue::Defer(DeferredSave save) {
  save.deadline = std::chrono::steady_clock::now() + max_defer_;
  deferred_.push_back(std::move(save));
}

std::deque<DeferredSave> SaveQueue::TakeDeferred() {
  std::deque<DeferredSave> taken;
  taken.swap(deferred_);
  return taken;
}

std::vector<PendingSave> SaveQueue::TakeQueued(uint32_t instance,
                                               const std::unordered_set<uint32_t>& gone) {
  std::vector<PendingSave> taken;
  if (instance == kAll) {
    taken.swap(queued_);
  } else {
    std::vector<PendingSave> others;
    for (PendingSave& p : queued_) {
      (p.instance == instance || gone.count(p.instance) != 0 ? taken : others)
          .push_back(std::move(p));
    }
    queued_.swap(others);
  }
  outstanding_ += taken.size();
  return taken;
}

bool SaveQueue::End(const BlockKey& key) {
  claimed_.erase(key);
  if (outstanding_ > 0) --outstanding_;
  return outstanding_ == 0;
}

size_t SaveQueue::Waiting(uint32_t instance) const {
  size_t n = 0;
  for (const DeferredSave& d : deferred_) n += d.instance == instance;
  for (const PendingSave& p : queued_) n += p.instance == instance;
  return n;
}

std::vector<DeferredSave> SaveQueue::DropDeferred(
    const std::function<bool(const DeferredSave&)>& drop) {
  std::vector<DeferredSave> dropped;
  for (auto d = deferred_.begin(); d != deferred_.end();) {
    if (!drop(*d)) {
      ++d;
      continue;
    }
    claimed_.erase(d->key);
    dropped.push_back(std::move(*d));
    d = deferred_.erase(d);
  }
  return dropped;
}

std::vector<PendingSave> SaveQueue::DropQueued(
    const std::function<bool(const PendingSave&)>& drop) {
  std::vector<PendingSave> dropped;
  for (auto q = queued_.begin(); q != queued_.end();) {
    if (!drop(*q)) {
      ++q;
      continue;
    }
    claimed_.erase(q->key);
    dropped.push_back(std::move(*q));
    q = queued_.erase(q);
  }
  return dropped;
}

}  // namespace kvtier

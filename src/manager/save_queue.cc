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

namespace {

// Moves the saves `drop` chooses out of `from` (keeping the others' order), unclaiming them.
template <typename Save, typename Container>
std::vector<Save> TakeOut(Container* from, std::unordered_set<BlockKey, BlockKeyHash>* claimed,
                          const std::function<bool(const Save&)>& drop) {
  std::vector<Save> taken;
  for (auto it = from->begin(); it != from->end();) {
    if (!drop(*it)) {
      ++it;
      continue;
    }
    claimed->erase(it->key);
    taken.push_back(std::move(*it));
    it = from->erase(it);
  }
  return taken;
}

}  // namespace

std::vector<DeferredSave> SaveQueue::DropDeferred(
    const std::function<bool(const DeferredSave&)>& drop) {
  return TakeOut<DeferredSave>(&deferred_, &claimed_, drop);
}

std::vector<PendingSave> SaveQueue::DropQueued(
    const std::function<bool(const PendingSave&)>& drop) {
  return TakeOut<PendingSave>(&queued_, &claimed_, drop);
}

}  // namespace kvtier

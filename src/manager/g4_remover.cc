#include "manager/g4_remover.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/log.h"
#include "tier/cond_wait.h"

namespace kvtier {

G4Remover::G4Remover(RemoteStore* store, const Options& options,
                     std::function<bool(const BlockKey&)> still_bad)
    : store_(store),
      options_{options.deadline, std::max<size_t>(options.max_queued, 1),
               std::max<size_t>(options.max_batch, 1)},
      still_bad_(std::move(still_bad)),
      thread_([this] { Loop(); }) {}

G4Remover::~G4Remover() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void G4Remover::Enqueue(std::string name, const BlockKey& key) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || queue_.size() >= options_.max_queued) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queue_.push_back(Item{std::move(name), key});
  }
  cv_.notify_one();
}

void G4Remover::Loop() {
  for (;;) {
    std::vector<Item> batch;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) CondWait(&cv_, &mu_);
      if (stopping_) return;
      while (!queue_.empty() && batch.size() < options_.max_batch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    std::vector<std::string> names;
    names.reserve(batch.size());
    for (Item& item : batch) {
      if (!still_bad_ || still_bad_(item.key)) names.push_back(std::move(item.name));
    }
    if (names.empty()) continue;
    const Status s = store_->Remove(names, RemoteClock::now() + options_.deadline);
    if (s.ok()) {
      removed_.fetch_add(names.size(), std::memory_order_relaxed);
    } else {
      failed_.fetch_add(names.size(), std::memory_order_relaxed);
      KVTIER_LOG(kDebug) << "G4: removing " << names.size()
                         << " corrupt objects failed: " << s.ToString();
    }
  }
}

}  // namespace kvtier

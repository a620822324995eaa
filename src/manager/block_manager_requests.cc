// BlockManagerImpl, the request table and engine instances: request entries, their
// idle sweep and retirement, Finished, and taking over or forgetting an instance.
#include <algorithm>
#include <chrono>
#include <string>

#include "core/log.h"
#include "manager/block_manager_impl.h"

namespace kvtier {

namespace {

// Idle request entries one Lookup drops at most (the sweep's bound per call).
constexpr int kSweepBatch = 64;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Scheduler side

void BlockManagerImpl::RetireIfDone(Request& r) {
  if (!r.finished || !r.Idle()) return;
  if (r.kept_for_saves) {
    if (!gone_instances_.count(r.instance)) saves_done_.emplace_back(r.instance, r.id);
    r.kept_for_saves = false;
  }
  if (!r.load_unreported && !r.retiring) requests_.Erase(r);
}

void BlockManagerImpl::SweepIdleRequests(std::chrono::steady_clock::time_point now) {
  const size_t expired = requests_.SweepIdle(now, kSweepBatch);
  if (expired != 0) c_.expired_requests.fetch_add(expired, std::memory_order_relaxed);
}

bool BlockManagerImpl::DrainingSaves(const std::string& id) const {
  const Request* r = requests_.Find(id);
  return r != nullptr && r->save_drains > 0;
}

void BlockManagerImpl::EndSave(const std::string& request_id, const BlockKey& key) {
  MutexLock lock(&mu_);
  const bool none_left = saves_.End(key);
  ReleaseSaveHolds(request_id, 1);
  if (none_left) saves_cv_.notify_all();
}

bool BlockManagerImpl::RequestFinished(const std::string& request_id) {
  MutexLock lock(&mu_);
  Request* found = requests_.Find(request_id);
  if (found == nullptr) return false;
  Request& r = *found;
  r.finished = true;
  // About saves only: a load in flight keeps the entry (and its pins) until it ends, and
  // loads_done tells the engine when (see the contract).
  r.kept_for_saves = r.saves_in_flight > 0;
  const bool kept = r.kept_for_saves;
  RetireIfDone(r);
  return kept;
}

// ---------------------------------------------------------------------------------------------
// Worker side

FinishedRequests BlockManagerImpl::Finished(uint32_t instance) {
  {
    bool deferred;
    {
      MutexLock lock(&mu_);
      deferred = saves_.HasDeferred();
    }
    if (deferred) {
      Status s = StartSave(instance);
      if (!s.ok()) KVTIER_LOG(kWarn) << "Finished: " << s.ToString();
    }
  }
  FinishedRequests f;
  MutexLock lock(&mu_);
  // Finished requests the last call listed in loads_done: their step has passed.
  // A plain loop, not erase_if with a lambda: the thread-safety analysis cannot see that a
  // lambda runs under mu_.
  size_t kept = 0;
  for (size_t i = 0; i < retiring_.size(); ++i) {
    if (!Matches(retiring_[i].first, instance)) {
      if (kept != i) retiring_[kept] = std::move(retiring_[i]);
      ++kept;
      continue;
    }
    Request* r = requests_.Find(retiring_[i].second);
    if (r != nullptr && r->retiring) {
      r->retiring = false;
      RetireIfDone(*r);
    }
  }
  retiring_.resize(kept);
  TakeIdsOf(&saves_done_, instance, &f.saves_done);
  loads_.TakeDone(instance, &f.loads_done);
  for (const std::string& id : f.loads_done) {
    Request* r = requests_.Find(id);
    if (r == nullptr || !r->load_unreported) continue;
    r->load_unreported = false;
    r->retiring = true;
    retiring_.emplace_back(r->instance, id);
  }
  return f;
}

void BlockManagerImpl::AdoptInstance(uint32_t instance) {
  MutexLock lock(&mu_);
  gone_instances_.erase(instance);
}

size_t BlockManagerImpl::InstanceRequests(uint32_t instance) {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, r] : requests_.entries()) n += Matches(r.instance, instance);
  return n;
}

size_t BlockManagerImpl::ForgetInstance(uint32_t instance) {
  std::vector<std::string> ids;
  {
    MutexLock lock(&mu_);
    gone_instances_.insert(instance);
    // Deferred saves of the engine would wait for a slot only to copy from a G1 that is gone.
    for (const DeferredSave& d : saves_.DropDeferred(
             [instance](const DeferredSave& d) { return d.instance == instance; })) {
      ReleaseSaveHolds(d.request_id, 1);
      c_.dropped_saves.fetch_add(1, std::memory_order_relaxed);
    }
    for (const auto& [id, r] : requests_.entries()) {
      if (r.instance == instance) ids.push_back(id);
    }
  }
  // What was bound but not started runs now and fails in the copy backend (the engine's copies
  // cannot run), releasing pins and slots on the usual failure path.
  Status s = StartLoad(instance);
  if (!s.ok()) KVTIER_LOG(kWarn) << "ForgetInstance(" << instance << "): " << s.ToString();
  s = StartSave(instance);
  if (!s.ok()) KVTIER_LOG(kWarn) << "ForgetInstance(" << instance << "): " << s.ToString();
  for (const std::string& id : ids) (void)RequestFinished(id);
  {
    MutexLock lock(&mu_);
    std::vector<std::string> unused;
    TakeIdsOf(&saves_done_, instance, &unused);
    loads_.TakeDone(instance, &unused);
  }
  return ids.size();
}

}  // namespace kvtier

#include "daemon/remote_g1_backend.h"

#include <algorithm>

#include "core/log.h"
#include "tier/cond_wait.h"

namespace kvtier::daemon {

RemoteG1Backend::RemoteG1Backend(SendCopy send, std::chrono::milliseconds lease,
                                 uint32_t num_layers)
    : send_(std::move(send)), lease_(lease), num_layers_(num_layers) {
  watchdog_ = std::thread([this] { Watchdog(); });
}

RemoteG1Backend::~RemoteG1Backend() {
  std::vector<std::shared_ptr<Batch>> open;
  std::map<uint64_t, FetchBatch> fetches;
  {
    MutexLock lock(&mu_);
    stop_ = true;
    fetches.swap(open_fetches_);
    for (auto& [id, b] : open_) {
      for (Part& p : b->parts) {
        if (!p.ended) EndPart(b.get(), &p, Status::Unavailable("kvtier serve is shutting down"));
      }
      open.push_back(b);
    }
  }
  cv_.notify_all();
  answer_cv_.notify_all();
  for (auto& b : open) Deliver(b);
  for (auto& [id, f] : fetches) EndFetch(f, Status::Unavailable("kvtier serve is shutting down"));
  watchdog_.join();
}

bool RemoteG1Backend::CanFetch(uint32_t g1_block) const {
  const uint32_t instance = g1_block >> proto::kInstanceShift;
  MutexLock lock(&mu_);
  for (;;) {
    auto it = awaited_.find(instance);
    if (it == awaited_.end() || stop_) break;
    const auto until = it->second;
    if (std::chrono::steady_clock::now() >= until) break;
    CondWaitFor(&answer_cv_, &mu_, until - std::chrono::steady_clock::now());
  }
  return fetchers_.count(instance) != 0;
}

void RemoteG1Backend::AwaitFetcherAnswer(uint32_t instance) {
  MutexLock lock(&mu_);
  awaited_[instance] = std::chrono::steady_clock::now() + kFetcherAnswerWait;
}

void RemoteG1Backend::SetFetcher(uint32_t instance, bool fetches) {
  MutexLock lock(&mu_);
  if (fetches) {
    fetchers_.insert(instance);
  } else {
    fetchers_.erase(instance);
  }
  awaited_.erase(instance);
  answer_cv_.notify_all();
}

void RemoteG1Backend::EndFetch(const FetchBatch& b, const Status& status) {
  for (size_t item : b.items) (*b.on_item)(item, status);
}

Status RemoteG1Backend::Fetch(std::vector<G4Fetch> items,
                              std::chrono::steady_clock::time_point deadline,
                              FetchCallback on_item) {
  if (items.empty()) return Status::InvalidArgument("a fetch of no items");
  auto callback = std::make_shared<FetchCallback>(std::move(on_item));
  // One frame per instance, in first-seen order.
  std::vector<proto::FetchCall> calls;
  std::vector<FetchBatch> batches;
  const int64_t deadline_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
  for (size_t i = 0; i < items.size(); ++i) {
    const uint32_t instance = items[i].g1_block >> proto::kInstanceShift;
    size_t k = 0;
    while (k < batches.size() && batches[k].instance != instance) ++k;
    if (k == batches.size()) {
      batches.push_back(FetchBatch{instance, deadline, {}, callback});
      calls.emplace_back();
      calls.back().deadline_ns = deadline_ns;
    }
    items[i].g1_block &= proto::kMaxG1Blocks - 1;
    calls[k].items.push_back(std::move(items[i]));
    batches[k].items.push_back(i);
  }
  for (size_t k = 0; k < calls.size(); ++k) {
    Status sent = Status::Unavailable("engine instance " + std::to_string(batches[k].instance) +
                                      " does not fetch from G4 (any more)");
    uint64_t id = 0;
    {
      MutexLock lock(&mu_);
      if (fetchers_.count(batches[k].instance) != 0 && send_fetch_) {
        id = next_batch_++;
        open_fetches_[id] = batches[k];
        ++stats_.fetch_batches;
      }
    }
    if (id != 0) {
      calls[k].batch = id;
      sent = send_fetch_(batches[k].instance, calls[k]);
      if (sent.ok()) continue;
      MutexLock lock(&mu_);
      // The frame was never queued, so no answer can come; unless the instance's connection
      // ended meanwhile and FailInstance took the batch already.
      if (open_fetches_.erase(id) == 0) continue;
    }
    EndFetch(batches[k], sent);
  }
  return Status::Ok();
}

void RemoteG1Backend::OnFetchDone(uint32_t instance, const proto::FetchDone& done) {
  FetchBatch b;
  {
    MutexLock lock(&mu_);
    auto it = open_fetches_.find(done.batch);
    if (it == open_fetches_.end() || it->second.instance != instance) {
      ++stats_.stray_reports;
      return;
    }
    b = std::move(it->second);
    open_fetches_.erase(it);
  }
  if (done.statuses.size() != b.items.size()) {
    EndFetch(b,
             Status::IOError("the engine answered a fetch of " + std::to_string(b.items.size()) +
                             " blocks with " + std::to_string(done.statuses.size()) + " statuses"));
    return;
  }
  for (size_t k = 0; k < b.items.size(); ++k) (*b.on_item)(b.items[k], done.statuses[k]);
}

std::string RemoteG1Backend::Describe() const {
  return "attached engines' G1 over kvtier serve data connections (lease " +
         std::to_string(lease_.count()) + " ms)";
}

Status RemoteG1Backend::RegisterG1(const G1Memory& g1) { return g1.Validate(); }

Status RemoteG1Backend::RegisterHost(uint8_t* base, uint64_t bytes) {
  if (base == nullptr || bytes == 0) {
    return Status::InvalidArgument("RemoteG1Backend::RegisterHost: null or empty range");
  }
  if (host_base_ != nullptr) return Status::FailedPrecondition("host memory registered twice");
  host_base_ = base;
  host_bytes_ = bytes;
  return Status::Ok();
}

Status RemoteG1Backend::Submit(CopyDirection dir, std::span<const DeviceBlockCopy> copies,
                               LayerCallback on_layer, DoneCallback on_done, bool) {
  if (host_base_ == nullptr) return Status::FailedPrecondition("no G2 arena registered");
  if (copies.empty()) return Status::InvalidArgument("a batch of no copies");
  // One kCopy per instance the batch touches, in first-seen order.
  std::vector<proto::CopyCall> calls;
  std::vector<uint32_t> instances;
  for (const DeviceBlockCopy& c : copies) {
    const uint64_t offset = static_cast<uint64_t>(c.host - host_base_);
    if (c.host < host_base_ || offset >= host_bytes_) {
      return Status::InvalidArgument("a copy's host pointer is outside the G2 arena");
    }
    const uint32_t instance = c.g1_block >> proto::kInstanceShift;
    auto it = std::find(instances.begin(), instances.end(), instance);
    size_t k = static_cast<size_t>(it - instances.begin());
    if (it == instances.end()) {
      instances.push_back(instance);
      calls.emplace_back();
    }
    calls[k].copies.emplace_back(c.g1_block & (proto::kMaxG1Blocks - 1), offset);
  }
  auto batch = std::make_shared<Batch>();
  batch->dir = dir;
  batch->deadline = std::chrono::steady_clock::now() + lease_;
  batch->on_layer = std::move(on_layer);
  batch->on_done = std::move(on_done);
  for (uint32_t instance : instances) batch->parts.push_back(Part{instance, 0, false});
  {
    MutexLock lock(&mu_);
    batch->id = next_batch_++;
    open_[batch->id] = batch;
    ++stats_.batches;
  }
  for (size_t k = 0; k < calls.size(); ++k) {
    calls[k].batch = batch->id;
    calls[k].dir = dir == CopyDirection::kHostToDevice ? 1 : 0;
    calls[k].deadline_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(batch->deadline.time_since_epoch())
            .count();
    Status sent = send_(instances[k], calls[k]);
    if (!sent.ok()) {
      MutexLock lock(&mu_);
      EndPart(batch.get(), &batch->parts[k], sent);
    }
  }
  Deliver(batch);
  return Status::Ok();
}

void RemoteG1Backend::EndPart(Batch* batch, Part* part, const Status& status) {
  if (part->ended) return;
  part->ended = true;
  if (status.ok()) {
    part->layers_done = num_layers_;
  } else {
    ++stats_.failed_parts;
    if (batch->status.ok()) batch->status = status;
  }
}

bool RemoteG1Backend::Ended(const Batch& b) {
  return std::all_of(b.parts.begin(), b.parts.end(), [](const Part& p) { return p.ended; });
}

uint32_t RemoteG1Backend::ReadyLayers(const Batch& b) const {
  if (!b.status.ok()) return b.reported;  // after a failure no further layer is reported
  uint32_t ready = num_layers_;
  for (const Part& p : b.parts) ready = std::min(ready, p.layers_done);
  return ready;
}

void RemoteG1Backend::Deliver(const std::shared_ptr<Batch>& batch) {
  MutexLock callbacks(&batch->callback_mu);
  for (;;) {
    uint32_t layer = 0;
    bool run_layer = false, run_done = false;
    Status status;
    {
      MutexLock lock(&mu_);
      if (batch->done_called) return;
      if (batch->reported < ReadyLayers(*batch)) {
        layer = batch->reported++;
        run_layer = true;
      } else if (Ended(*batch)) {
        batch->done_called = true;
        run_done = true;
        status = batch->status;
        open_.erase(batch->id);
      } else {
        return;
      }
    }
    if (run_layer && batch->on_layer) batch->on_layer(layer);
    if (run_done) {
      if (batch->on_done) batch->on_done(status);
      cv_.notify_all();
      return;
    }
  }
}

std::pair<std::shared_ptr<RemoteG1Backend::Batch>, RemoteG1Backend::Part*>
RemoteG1Backend::FindPart(uint64_t batch_id, uint32_t instance) {
  auto it = open_.find(batch_id);
  if (it == open_.end()) return {nullptr, nullptr};
  Part* part = nullptr;
  for (Part& p : it->second->parts) {
    if (p.instance == instance) part = &p;
  }
  return {it->second, part};
}

void RemoteG1Backend::OnLayer(uint32_t instance, uint64_t batch_id, uint32_t layer) {
  std::shared_ptr<Batch> batch;
  {
    MutexLock lock(&mu_);
    auto [found, part] = FindPart(batch_id, instance);
    if (part == nullptr || part->ended || layer != part->layers_done || layer >= num_layers_) {
      ++stats_.stray_reports;
      return;
    }
    part->layers_done = layer + 1;
    batch = std::move(found);
  }
  Deliver(batch);
}

void RemoteG1Backend::OnDone(uint32_t instance, uint64_t batch_id, const Status& status) {
  std::shared_ptr<Batch> batch;
  {
    MutexLock lock(&mu_);
    auto [found, part] = FindPart(batch_id, instance);
    if (part == nullptr || part->ended) {
      ++stats_.stray_reports;
      return;
    }
    // An engine that says Ok must have reported every layer of a load.
    Status end = status;
    if (end.ok() && found->dir == CopyDirection::kHostToDevice &&
        part->layers_done != num_layers_) {
      end = Status::IOError("the engine reported a load done after " +
                            std::to_string(part->layers_done) + " of " +
                            std::to_string(num_layers_) + " layers");
    }
    EndPart(found.get(), part, end);
    batch = std::move(found);
  }
  Deliver(batch);
}

void RemoteG1Backend::FailInstance(uint32_t instance, const Status& why) {
  std::vector<std::shared_ptr<Batch>> touched;
  std::vector<FetchBatch> fetches;
  {
    MutexLock lock(&mu_);
    fetchers_.erase(instance);
    awaited_.erase(instance);
    answer_cv_.notify_all();
    for (auto it = open_fetches_.begin(); it != open_fetches_.end();) {
      if (it->second.instance == instance) {
        fetches.push_back(std::move(it->second));
        it = open_fetches_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& [id, b] : open_) {
      for (Part& p : b->parts) {
        if (p.instance == instance && !p.ended) {
          EndPart(b.get(), &p, why);
          touched.push_back(b);
        }
      }
    }
  }
  for (auto& b : touched) Deliver(b);
  for (const FetchBatch& f : fetches) EndFetch(f, why);
}

void RemoteG1Backend::Watchdog() {
  MutexLock lock(&mu_);
  while (!stop_) {
    CondWaitFor(&cv_, &mu_,
                std::min<std::chrono::milliseconds>(lease_ / 4 + std::chrono::milliseconds(1),
                                                    std::chrono::milliseconds(50)));
    if (stop_) break;
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<Batch>> expired;
    for (auto& [id, b] : open_) {
      // Loads only: see the header for why a live engine's save is never failed at its deadline.
      if (b->dir != CopyDirection::kHostToDevice || now < b->deadline || b->done_called) continue;
      bool any = false;
      for (Part& p : b->parts) {
        if (!p.ended) {
          EndPart(b.get(), &p,
                  Status::TimedOut("the engine did not finish a load within its lease of " +
                                   std::to_string(lease_.count()) + " ms"));
          any = true;
        }
      }
      if (any) {
        ++stats_.lease_expired;
        expired.push_back(b);
      }
    }
    // A fetch the engine has not answered a lease after its deadline: its Redis calls end by
    // the deadline, so the engine is stuck; its items fail (the transfer engine ended their
    // moves at the deadline already).
    std::vector<FetchBatch> stale;
    for (auto it = open_fetches_.begin(); it != open_fetches_.end();) {
      if (now >= it->second.deadline + lease_) {
        stale.push_back(std::move(it->second));
        it = open_fetches_.erase(it);
        ++stats_.fetch_expired;
      } else {
        ++it;
      }
    }
    if (expired.empty() && stale.empty()) continue;
    mu_.Unlock();  // Deliver and the fetch callbacks run without mu_
    for (auto& b : expired) Deliver(b);
    for (const FetchBatch& f : stale) {
      EndFetch(f, Status::TimedOut("the engine did not answer a G4 fetch within its deadline"));
    }
    mu_.Lock();
  }
}

Result<uint8_t*> RemoteG1Backend::AllocateDevice(uint64_t) {
  return Status::Unavailable("kvtier serve has no device memory of its own");
}
Status RemoteG1Backend::CopyToDevice(uint8_t*, const uint8_t*, uint64_t) {
  return Status::Unavailable("kvtier serve has no device memory of its own");
}
Status RemoteG1Backend::CopyFromDevice(uint8_t*, const uint8_t*, uint64_t) {
  return Status::Unavailable("kvtier serve has no device memory of its own");
}
Result<DeviceCopyBackend::PlainCopyTime> RemoteG1Backend::TimePlainCopy(CopyDirection, uint8_t*,
                                                                        uint8_t*, uint64_t,
                                                                        uint32_t) {
  return Status::Unavailable("kvtier serve has no device memory of its own");
}

RemoteG1Backend::Stats RemoteG1Backend::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kvtier::daemon

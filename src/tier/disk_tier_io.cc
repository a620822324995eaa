// DiskTier's I/O thread: batched submission, completions, verification, errors, quarantine,
// probes and health checks. Everything here runs on that one thread; the slot table is touched
// only under mu_ and never across I/O.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/log.h"
#include "tier/disk_tier.h"
#include "tier/disk_tier_internal.h"

namespace kvtier {

namespace {

using Clock = std::chrono::steady_clock;

int MillisUntil(Clock::time_point t, Clock::time_point now) {
  if (t <= now) return 0;
  return static_cast<int>(
      std::min<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(t - now).count(), 1000));
}

}  // namespace

void DiskTier::IoLoop() {
  next_health_check_ = Clock::now() + std::chrono::milliseconds(config_.health_check_interval_ms);
  while (true) {
    const bool stopping = TakeIncoming();
    RunControls();
    RunTimers();
    StartTasks();
    if (stopping && backlog_.empty() && in_flight_count_ == 0 && probe_tasks_left_ == 0) break;

    const auto now = Clock::now();
    int timeout = MillisUntil(next_health_check_, now);
    if (quarantined() && probe_tasks_left_ == 0)
      timeout = std::min(timeout, MillisUntil(next_probe_, now));
    if (in_flight_count_ > 0) {
      // Wake in time to notice an I/O stuck past io_timeout_ms.
      timeout =
          std::min<int>(timeout, static_cast<int>(std::min<uint32_t>(config_.io_timeout_ms, 1000)));
    }
    io_thread_sleeping_.store(true);
    {
      MutexLock lock(&queue_mu_);
      if (!incoming_.empty() || !controls_.empty() || (stopping_ && !stopping)) timeout = 0;
    }
    completions_.clear();
    auto polled = io_->Poll(timeout, &completions_);
    io_thread_sleeping_.store(false);
    if (!polled.ok()) {
      EnterQuarantine("the I/O engine failed: " + polled.status().message());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    for (const IoCompletion& c : completions_) Complete(c);
    bool all_ok = !finished_.empty();
    for (const auto& f : finished_) all_ok = all_ok && f.second == 0;
    if (all_ok) {
      // Refill the device before the slow part (verification, callbacks), so that it does
      // not idle while this thread checksums what arrived. Not after an error: that may
      // quarantine the tier, and then nothing more should reach the device.
      TakeIncoming();
      StartTasks();
      completions_.clear();
      if (io_->Poll(0, &completions_).ok()) {
        for (const IoCompletion& c : completions_) Complete(c);
      }
    }
    for (auto& [task, err] : finished_) Finish(task, err);
    finished_.clear();
  }
  // Nothing is in flight; answer whoever still waits on a control.
  std::vector<Control*> left;
  {
    MutexLock lock(&queue_mu_);
    left.assign(controls_.begin(), controls_.end());
    controls_.clear();
  }
  left.insert(left.end(), probe_waiters_.begin(), probe_waiters_.end());
  left.insert(left.end(), pending_registers_.begin(), pending_registers_.end());
  probe_waiters_.clear();
  pending_registers_.clear();
  for (Control* c : left) CompleteControl(c, Status::Unavailable("G3 is closed"));
}

bool DiskTier::TakeIncoming() {
  MutexLock lock(&queue_mu_);
  for (Task& t : incoming_) backlog_.push_back(t);
  incoming_.clear();
  return stopping_;
}

void DiskTier::CompleteControl(Control* control, Status result) {
  {
    MutexLock lock(&queue_mu_);
    control->result = std::move(result);
    control->done = true;
  }
  control_cv_.notify_all();
}

void DiskTier::RunControls() {
  std::deque<Control*> fresh;
  {
    MutexLock lock(&queue_mu_);
    fresh.swap(controls_);
  }
  for (Control* c : fresh) {
    switch (c->kind) {
      case ControlKind::kHealth:
        CompleteControl(c, HealthCheck());
        break;
      case ControlKind::kProbe:
        probe_waiters_.push_back(c);
        if (probe_tasks_left_ == 0) StartProbe();
        break;
      case ControlKind::kRegister:
        pending_registers_.push_back(c);
        break;
    }
  }
  // Registration waits for the ring to drain; StartTasks holds new I/O back meanwhile.
  if (!pending_registers_.empty() && in_flight_count_ == 0) {
    for (Control* c : pending_registers_) {
      Status s = io_->RegisterBuffers(c->regions);
      counters_->buffers_registered = io_->buffers_registered();
      CompleteControl(c, std::move(s));
    }
    pending_registers_.clear();
  }
}

void DiskTier::StartTasks() {
  while (!backlog_.empty() && !free_task_ids_.empty() && pending_registers_.empty()) {
    Task t = backlog_.front();
    backlog_.pop_front();
    const bool probe = t.kind == TaskKind::kProbeWrite || t.kind == TaskKind::kProbeRead;
    if (!probe) queued_.fetch_sub(1, std::memory_order_relaxed);
    if (!probe && quarantined()) {
      Reject(t, Status::Unavailable("G3 is quarantined"));
      continue;
    }
    const uint32_t id = free_task_ids_.back();
    free_task_ids_.pop_back();
    t.active = true;
    t.stuck_reported = false;
    t.started = Clock::now();
    in_flight_[id] = t;
    ++in_flight_count_;
    io_->Queue(IoRequest{t.kind == TaskKind::kWrite || t.kind == TaskKind::kProbeWrite
                             ? IoKind::kWrite
                             : IoKind::kRead,
                         t.file, t.offset + t.done, t.buffer + t.done, t.len - t.done, id});
  }
}

void DiskTier::Complete(const IoCompletion& c) {
  Task& t = in_flight_[c.tag];
  if (c.result > 0 && t.done + static_cast<uint32_t>(c.result) < t.len) {
    // Partial transfer: resume where it stopped (the kernel may split large I/O).
    t.done += static_cast<uint32_t>(c.result);
    Bump(counters_->short_transfers);
    io_->Queue(IoRequest{t.kind == TaskKind::kWrite || t.kind == TaskKind::kProbeWrite
                             ? IoKind::kWrite
                             : IoKind::kRead,
                         t.file, t.offset + t.done, t.buffer + t.done, t.len - t.done, c.tag});
    return;
  }
  int err = 0;
  if (c.result < 0) {
    err = -c.result;
  } else if (t.done + static_cast<uint32_t>(c.result) < t.len) {
    err = kStoppedShort;
  }
  t.active = false;
  free_task_ids_.push_back(static_cast<uint32_t>(c.tag));
  --in_flight_count_;
  finished_.emplace_back(t, err);
}

void DiskTier::Finish(Task& task, int err) {
  switch (task.kind) {
    case TaskKind::kWrite:
      FinishWrite(task, err);
      break;
    case TaskKind::kRead:
      FinishRead(task, err);
      break;
    case TaskKind::kProbeWrite:
    case TaskKind::kProbeRead:
      FinishProbe(task, err);
      break;
  }
}

void DiskTier::FinishWrite(Task& t, int err) {
  if (err != 0) {
    ReleaseWriteSlot(t.slot);
    Bump(counters_->write_errors);
    NoteError(err, "write of slot " + std::to_string(t.slot));
    Deliver(t.sink, t.cookie, DiskIoStatus(err, "G3 write of slot " + std::to_string(t.slot)));
    return;
  }
  {
    MutexLock lock(&mu_);
    slots_[t.slot].state = SlotState::kValid;
    ++valid_blocks_;
  }
  Bump(counters_->writes_completed);
  Bump(counters_->bytes_written, t.len);
  NoteSuccess();
  Deliver(t.sink, t.cookie, Status::Ok(), t.slot, t.generation);
}

void DiskTier::FinishRead(Task& t, int err) {
  if (err != 0) {
    // Nothing arrived at the end of the file: the slot's data is gone (file truncated).
    if (EndRead(t.slot, t.generation, /*drop=*/err == kStoppedShort)) {
      Bump(counters_->slots_dropped);
    }
    Bump(counters_->read_errors);
    NoteError(err, "read of slot " + std::to_string(t.slot));
    Deliver(t.sink, t.cookie, DiskIoStatus(err, "G3 read of slot " + std::to_string(t.slot)));
    return;
  }
  ExpectedBlock e;
  e.layout_fingerprint = config_.layout_fingerprint;
  e.namespace_id = t.namespace_id;
  e.key = t.key;
  e.tokens = t.expected_tokens;
  e.payload_bytes = geometry_.payload_bytes;
  e.header_bytes = geometry_.header_bytes();
  e.check_generation = true;
  e.write_generation = t.generation;
  e.check_slot = true;
  e.slot_index = t.slot;
  const BlockCheck check = VerifyBlock({t.buffer, t.len}, e);
  if (check == BlockCheck::kOk) {
    EndRead(t.slot, t.generation, /*drop=*/false);
    Bump(counters_->reads_served);
    Bump(counters_->bytes_read, t.len);
    NoteSuccess();
    Deliver(t.sink, t.cookie, Status::Ok(), t.slot, t.generation);
    return;
  }
  Bump(counters_->verify_failures);
  Bump(counters_->verify_by_check[static_cast<size_t>(check)]);
  if (EndRead(t.slot, t.generation, /*drop=*/true)) Bump(counters_->slots_dropped);
  // A different namespace or token list is the caller asking for another block, not the device
  // failing; everything else counts towards quarantine.
  if (check != BlockCheck::kWrongTokens && check != BlockCheck::kWrongNamespace) {
    NoteError(0, std::string("block in slot ") + std::to_string(t.slot) + " failed verification (" +
                     BlockCheckName(check) + ")");
  }
  Deliver(t.sink, t.cookie,
          Status::Corruption("G3 block " + t.key.ToHex() + " in slot " + std::to_string(t.slot) +
                             " failed verification (" + BlockCheckName(check) +
                             "); not served, slot freed"));
}

void DiskTier::NoteError(int err, const std::string& what) {
  if (err == EIO) {
    Bump(counters_->eio_errors);
  } else if (err == ENOSPC || err == EDQUOT) {
    Bump(counters_->enospc_errors);
  } else if (err != 0) {
    Bump(counters_->other_errors);
  }
  ++consecutive_errors_;
  counters_->consecutive_errors.store(consecutive_errors_, std::memory_order_relaxed);
  if (consecutive_errors_ >= config_.quarantine_after_errors && !quarantined()) {
    std::string last = what;
    if (err != 0) last += ": " + DiskIoStatus(err, "").message().substr(2);
    EnterQuarantine(std::to_string(consecutive_errors_) + " error(s) in a row, the last: " + last);
  }
}

void DiskTier::NoteSuccess() {
  consecutive_errors_ = 0;
  counters_->consecutive_errors.store(0, std::memory_order_relaxed);
}

void DiskTier::EnterQuarantine(const std::string& reason) {
  if (quarantined()) return;
  {
    MutexLock lock(&mu_);
    quarantine_reason_ = reason;
  }
  quarantined_.store(true, std::memory_order_release);
  Bump(counters_->quarantines);
  next_probe_ = Clock::now() + std::chrono::milliseconds(config_.reprobe_interval_ms);
  KVTIER_LOG(kWarn) << "G3 tier in " << config_.dir << " quarantined: " << reason
                    << "; reads and writes fail fast, re-probe every "
                    << config_.reprobe_interval_ms << " ms";
  FailBacklog(Status::Unavailable("G3 is quarantined: " + reason));
}

void DiskTier::FailBacklog(const Status& status) {
  std::deque<Task> keep;
  for (Task& t : backlog_) {
    if (t.kind == TaskKind::kProbeWrite || t.kind == TaskKind::kProbeRead) {
      keep.push_back(t);
      continue;
    }
    queued_.fetch_sub(1, std::memory_order_relaxed);
    Reject(t, status);
  }
  backlog_.swap(keep);
}

void DiskTier::RunTimers() {
  const auto now = Clock::now();
  if (now >= next_health_check_) {
    next_health_check_ = now + std::chrono::milliseconds(config_.health_check_interval_ms);
    Status s = HealthCheck();
    (void)s;  // HealthCheck quarantines on failure
  }
  const auto limit = std::chrono::milliseconds(config_.io_timeout_ms);
  for (Task& t : in_flight_) {
    if (t.active && !t.stuck_reported && now - t.started > limit) {
      t.stuck_reported = true;
      Bump(counters_->stuck_ios);
      EnterQuarantine("an I/O to slot " + std::to_string(t.slot) + " has not completed in " +
                      std::to_string(config_.io_timeout_ms) + " ms");
    }
  }
  if (quarantined() && probe_tasks_left_ == 0 && now >= next_probe_) StartProbe();
}

Status DiskTier::HealthCheck() {
  auto health = files_->Health();
  if (!health.ok()) {
    EnterQuarantine(health.status().message());
    return health.status();
  }
  Status result;
  for (uint32_t f = 0; f < health->size(); ++f) {
    const FileHealth& h = (*health)[f];
    if (h.deleted) {
      result = Status::FailedPrecondition(files_->FilePath(f) + " was deleted underneath the tier");
      break;
    }
    if (h.size < geometry_.file_bytes()) {
      // Blocks past the new end are gone: make them unreachable now rather than at each read.
      uint64_t lost = 0;
      {
        MutexLock lock(&mu_);
        for (uint32_t slot = f; slot < slots_.size(); slot += geometry_.num_files) {
          Slot& s = slots_[slot];
          if (s.state != SlotState::kValid) continue;
          if (geometry_.OffsetOf(slot) + geometry_.slot_stride <= h.size) continue;
          by_key_.erase(s.key);
          --valid_blocks_;
          ++lost;
          if (s.readers == 0) {
            s.state = SlotState::kFree;
            free_.push_back(slot);
          } else {
            s.state = SlotState::kDoomed;
          }
        }
      }
      Bump(counters_->blocks_lost_to_truncation, lost);
      Bump(counters_->slots_dropped, lost);
      result = Status::FailedPrecondition(files_->FilePath(f) + " was truncated to " +
                                          std::to_string(h.size) + " bytes underneath the tier (" +
                                          std::to_string(lost) + " block(s) lost)");
      break;
    }
  }
  if (!result.ok()) EnterQuarantine(result.message());
  return result;
}

void DiskTier::StartProbe() {
  Bump(counters_->probes);
  ++probe_round_;
  probe_failed_ = false;
  probe_failure_.clear();
  // Repair first what can be repaired: a truncated file gets its full size back.
  auto health = files_->Health();
  Status repair = health.status();
  for (uint32_t f = 0; repair.ok() && f < health->size(); ++f) {
    if ((*health)[f].deleted || (*health)[f].size < geometry_.file_bytes()) {
      repair = files_->Restore(f);
    }
  }
  if (!repair.ok()) {
    probe_failed_ = true;
    probe_failure_ = repair.message();
    FinishProbeRound();
    return;
  }
  probe_tasks_left_ = geometry_.num_files;
  for (uint32_t f = 0; f < geometry_.num_files; ++f) {
    uint8_t* page = probe_pages_ + uint64_t{2 * f} * kSuperblockBytes;
    for (size_t i = 0; i < kSuperblockBytes / 8; ++i) {
      const uint64_t word = (probe_round_ << 32) ^ (uint64_t{f} << 20) ^ i ^ 0x5a5a5a5a5a5a5a5aull;
      std::memcpy(page + i * 8, &word, 8);
    }
    Task t;
    t.kind = TaskKind::kProbeWrite;
    t.file = f;
    t.offset = kProbeOffset;
    t.buffer = page;
    t.len = kSuperblockBytes;
    backlog_.push_front(t);
  }
}

void DiskTier::FinishProbe(Task& t, int err) {
  if (err == 0 && t.kind == TaskKind::kProbeWrite) {
    Task read = t;
    read.kind = TaskKind::kProbeRead;
    read.buffer = t.buffer + kSuperblockBytes;
    read.done = 0;
    std::memset(read.buffer, 0, kSuperblockBytes);
    backlog_.push_front(read);
    return;
  }
  if (err != 0) {
    probe_failed_ = true;
    probe_failure_ = DiskIoStatus(err, files_->FilePath(t.file) + " probe").message();
  } else if (std::memcmp(t.buffer, t.buffer - kSuperblockBytes, kSuperblockBytes) != 0) {
    probe_failed_ = true;
    probe_failure_ = files_->FilePath(t.file) + " probe page read back different bytes";
  }
  if (--probe_tasks_left_ == 0) FinishProbeRound();
}

void DiskTier::FinishProbeRound() {
  Status result;
  if (probe_failed_) {
    result = Status::IOError("G3 probe failed: " + probe_failure_);
    if (!quarantined()) {
      EnterQuarantine(result.message());
    } else {
      KVTIER_LOG(kWarn) << result.message() << "; still quarantined";
    }
    next_probe_ = Clock::now() + std::chrono::milliseconds(config_.reprobe_interval_ms);
  } else {
    Bump(counters_->probes_ok);
    if (quarantined()) {
      NoteSuccess();
      {
        MutexLock lock(&mu_);
        quarantine_reason_.clear();
      }
      quarantined_.store(false, std::memory_order_release);
      KVTIER_LOG(kInfo) << "G3 tier in " << config_.dir << " passed its probe; back in service";
    }
  }
  for (Control* c : probe_waiters_) CompleteControl(c, result);
  probe_waiters_.clear();
}

void DiskTier::Reject(Task& t, Status status) {
  if (t.kind == TaskKind::kWrite) {
    ReleaseWriteSlot(t.slot);
    Bump(counters_->writes_rejected);
  } else {
    EndRead(t.slot, t.generation, /*drop=*/false);
    Bump(counters_->reads_rejected);
  }
  Deliver(t.sink, t.cookie, std::move(status));
}

}  // namespace kvtier

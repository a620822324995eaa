// DiskTier: configuration, open and recovery, the request API and close. The I/O thread is in
// disk_tier_io.cc.
#include "tier/disk_tier.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "core/log.h"
#include "tier/cond_wait.h"
#include "tier/disk_tier_internal.h"

namespace kvtier {

namespace {

bool Aligned(const uint8_t* p) { return (reinterpret_cast<uintptr_t>(p) & 4095) == 0; }

Status RangeError(const char* field, uint64_t value, const char* allowed) {
  return Status::InvalidArgument(std::string("DiskTier::Config.") + field + " = " +
                                 std::to_string(value) + ": must be " + allowed);
}

}  // namespace

// ---- DiskOpWaiter ----

void DiskOpWaiter::OnDiskOpDone(const DiskOpResult& result) {
  // Notify under the lock: the waiter may destroy this object as soon as it sees the result.
  MutexLock lock(&mu_);
  results_.push_back(result);
  cv_.notify_all();
}

std::vector<DiskOpResult> DiskOpWaiter::Take(size_t count) {
  MutexLock lock(&mu_);
  while (results_.size() < count) CondWait(&cv_, &mu_);
  std::vector<DiskOpResult> out(results_.begin(), results_.begin() + count);
  results_.erase(results_.begin(), results_.begin() + count);
  return out;
}

// ---- Config ----

Status DiskTier::Config::Validate() const {
  if (dir.empty()) return Status::InvalidArgument("DiskTier::Config.dir is empty");
  if (payload_bytes < 1 || payload_bytes > KvLayout::kMaxBlockBytes) {
    return RangeError("payload_bytes", payload_bytes, "in 1..2^30");
  }
  if (num_files < 1 || num_files > kMaxSlotFiles) {
    return RangeError("num_files", num_files, "in 1..256");
  }
  if (queue_depth < 1 || queue_depth > 4096) {
    return RangeError("queue_depth", queue_depth, "in 1..4096");
  }
  if (max_queued < queue_depth) {
    return RangeError("max_queued", max_queued, ">= queue_depth");
  }
  if (quarantine_after_errors < 1) return RangeError("quarantine_after_errors", 0, ">= 1");
  if (reprobe_interval_ms < 1) return RangeError("reprobe_interval_ms", 0, ">= 1");
  if (health_check_interval_ms < 1) return RangeError("health_check_interval_ms", 0, ">= 1");
  if (io_timeout_ms < 1) return RangeError("io_timeout_ms", 0, ">= 1");
  KVTIER_RETURN_IF_ERROR(admission.Validate());
  return DiskGeometry::For(capacity_bytes, payload_bytes, header_bytes, num_files,
                           layout_fingerprint)
      .status();
}

// ---- open, recovery, close ----

DiskTier::DiskTier(const Config& config, const DiskGeometry& geometry)
    : config_(config), geometry_(geometry), counters_(std::make_unique<Counters>()) {
  MutexLock lock(&mu_);
  slots_.resize(geometry.num_slots());
}

DiskTier::~DiskTier() {
  Status s = Close();
  if (!s.ok()) {
    KVTIER_LOG(kWarn) << "closing G3 tier in " << config_.dir << ": " << s.ToString();
  }
}

Result<DiskTier::Opened> DiskTier::Open(const Config& config, const OpenOptions& options) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  KVTIER_ASSIGN_OR_RETURN(
      DiskGeometry geometry,
      DiskGeometry::For(config.capacity_bytes, config.payload_bytes, config.header_bytes,
                        config.num_files, config.layout_fingerprint));
  std::unique_ptr<DiskTier> tier(new DiskTier(config, geometry));
  KVTIER_ASSIGN_OR_RETURN(tier->admission_, DiskAdmission::Create(config.admission));
  DiskFileSet::Options file_options;
  file_options.dir = config.dir;
  file_options.geometry = geometry;
  file_options.preallocate = config.preallocate;
  file_options.reformat_on_mismatch = config.reformat_on_mismatch;
  KVTIER_ASSIGN_OR_RETURN(tier->files_, DiskFileSet::Open(file_options));
  KVTIER_ASSIGN_OR_RETURN(tier->io_,
                          CreateDiskIo(config.io_backend, tier->files_->fds(), config.queue_depth));
  if (options.wrap_io) tier->io_ = options.wrap_io(std::move(tier->io_));
  tier->reformat_reason_ = tier->files_->reformat_reason();
  tier->sparse_files_ = tier->files_->sparse();
  tier->io_backend_name_ = tier->io_->name();

  Opened opened;
  KVTIER_RETURN_IF_ERROR(tier->Recover(&opened.recovered, options.recovery_progress));

  if (!options.buffers.empty()) {
    std::vector<iovec> regions;
    for (const DiskBufferRegion& r : options.buffers) regions.push_back(iovec{r.base, r.bytes});
    Status s = tier->io_->RegisterBuffers(regions);
    if (!s.ok()) {
      KVTIER_LOG(kWarn) << "G3 I/O goes on with unregistered buffers: " << s.message();
    }
    tier->counters_->buffers_registered = tier->io_->buffers_registered();
  }

  const uint32_t depth = tier->io_->queue_depth();
  tier->in_flight_.resize(depth);
  for (uint32_t i = depth; i > 0; --i) tier->free_task_ids_.push_back(i - 1);
  const size_t probe_bytes = size_t{2} * kSuperblockBytes * geometry.num_files;
  tier->probe_pages_ = static_cast<uint8_t*>(std::aligned_alloc(4096, probe_bytes));
  std::memset(tier->probe_pages_, 0, probe_bytes);
  tier->opened_ = true;
  tier->io_thread_ = std::thread([t = tier.get()] { t->IoLoop(); });
  opened.tier = std::move(tier);
  return opened;
}

Status DiskTier::Recover(std::vector<RecoveredBlock>* recovered, const ScanProgress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<RecoveredBlock> blocks;
  uint64_t next_generation = 1;
  const std::string snapshot_path = files_->SnapshotPath();
  // Files whose slots the header scan reads: all of them without a usable snapshot; with one,
  // those that are no longer what the snapshot saw (replaced, truncated and extended, written
  // to) or that it found damaged.
  std::vector<bool> scan(geometry_.num_files, files_->reused());
  if (files_->reused()) {
    auto snapshot = ReadSnapshot(snapshot_path, geometry_.num_slots());
    if (snapshot.ok() && snapshot->tier_id == files_->tier_id() &&
        snapshot->geometry_hash == geometry_.Hash() &&
        snapshot->files.size() == geometry_.num_files) {
      const std::vector<FileIdentity>& now = files_->identities_at_open();
      for (uint32_t f = 0; f < geometry_.num_files; ++f) {
        scan[f] = f >= now.size() || snapshot->files[f] != now[f];
        if (scan[f]) {
          KVTIER_LOG(kWarn) << files_->FilePath(f)
                            << " is not the file the snapshot saw (replaced, resized, or written "
                               "to since); its slots are scanned, not trusted";
          ++counters_->files_rescanned;
        }
      }
      for (RecoveredBlock& b : snapshot->blocks) {
        if (!scan[geometry_.FileOf(b.slot)]) blocks.push_back(std::move(b));
      }
      next_generation = snapshot->next_generation;
      counters_->recovered_from_snapshot = true;
    } else if (snapshot.ok()) {
      KVTIER_LOG(kWarn) << "ignoring " << snapshot_path
                        << ": written for another formatting of the directory; scanning";
    } else if (!snapshot.status().Is(StatusCode::kNotFound)) {
      KVTIER_LOG(kWarn) << "ignoring " << snapshot_path << " (" << snapshot.status().message()
                        << "); scanning";
    }
  }
  // Used at most once: gone before anything is written, so a crash later cannot reuse it.
  KVTIER_RETURN_IF_ERROR(RemoveSnapshot(snapshot_path));
  if (std::find(scan.begin(), scan.end(), true) != scan.end()) {
    KVTIER_ASSIGN_OR_RETURN(ScanReport report, ScanSlots(io_.get(), geometry_,
                                                         /*verify_payload=*/false, scan, progress));
    // A key the snapshot vouches for (in an unchanged file) and that the scan also found (an
    // older copy left in a changed file): the newest generation wins, as within a scan.
    std::unordered_map<BlockKey, size_t, BlockKeyHash> at;
    for (size_t i = 0; i < blocks.size(); ++i) at.emplace(blocks[i].key, i);
    for (RecoveredBlock& b : report.blocks) {
      auto [it, inserted] = at.try_emplace(b.key, blocks.size());
      if (inserted) {
        blocks.push_back(std::move(b));
      } else if (blocks[it->second].generation < b.generation) {
        blocks[it->second] = std::move(b);
      }
    }
    next_generation = std::max(next_generation, report.max_generation + 1);
    counters_->scan_corrupt = report.corrupt;
    counters_->scan_duplicates = report.duplicates;
    counters_->scan_read_errors = report.read_errors;
    if (report.corrupt + report.read_errors > 0) {
      KVTIER_LOG(kWarn) << "G3 scan of " << config_.dir << ": " << report.corrupt
                        << " slot(s) did not verify, " << report.read_errors
                        << " could not be read; they are free again"
                        << (report.problems.empty() ? "" : " (first: " + report.problems[0] + ")");
    }
  }
  {
    MutexLock lock(&mu_);
    std::vector<bool> used(slots_.size(), false);
    for (const RecoveredBlock& b : blocks) {
      Slot& s = slots_[b.slot];
      s.state = SlotState::kValid;
      s.generation = b.generation;
      s.key = b.key;
      s.parent = b.parent;
      s.namespace_id = b.namespace_id;
      s.tokens = b.tokens;
      by_key_[b.key] = b.slot;
      used[b.slot] = true;
      next_generation = std::max(next_generation, b.generation + 1);
    }
    valid_blocks_ = blocks.size();
    next_generation_ = next_generation;
    free_.clear();
    for (uint32_t i = geometry_.num_slots(); i > 0; --i) {
      if (!used[i - 1]) free_.push_back(i - 1);  // lowest slot first
    }
  }
  counters_->recovered_blocks = blocks.size();
  counters_->recovery_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (files_->reused()) {
    KVTIER_LOG(kInfo) << "G3 " << config_.dir << ": recovered " << blocks.size() << " block(s) "
                      << (!counters_->recovered_from_snapshot ? "by a scan"
                          : counters_->files_rescanned > 0
                              ? "from the snapshot and a scan of the files it could not vouch for"
                              : "from the snapshot")
                      << " in " << counters_->recovery_ms << " ms";
  }
  *recovered = std::move(blocks);
  return Status::Ok();
}

Status DiskTier::Close() {
  std::call_once(close_once_, [this] {
    {
      MutexLock lock(&queue_mu_);
      stopping_ = true;
    }
    if (io_thread_.joinable()) {
      io_->Wake();
      io_thread_.join();
    }
    if (opened_ && config_.snapshot_on_close) {
      Snapshot snapshot;
      snapshot.tier_id = files_->tier_id();
      snapshot.geometry_hash = geometry_.Hash();
      {
        MutexLock lock(&mu_);
        snapshot.next_generation = next_generation_;
        for (uint32_t i = 0; i < slots_.size(); ++i) {
          const Slot& s = slots_[i];
          if (s.state != SlotState::kValid) continue;
          snapshot.blocks.push_back(
              RecoveredBlock{s.key, s.parent, s.namespace_id, i, s.generation, s.tokens});
        }
      }
      // The data first: a snapshot must never list blocks that a power loss could take back.
      close_status_ = files_->Sync();
      // Then what each file is now, so a restart can tell whether it is still that file. A
      // preallocated file holding less than its size was truncated and extended while the tier
      // ran (its slots may be zeros): recorded as damaged, so a restart scans it.
      if (close_status_.ok()) {
        Result<std::vector<FileIdentity>> ids = files_->Identities();
        if (ids.ok()) {
          snapshot.files = std::move(*ids);
          for (FileIdentity& f : snapshot.files) {
            if (!sparse_files_ && f.allocated_bytes < f.size) f = FileIdentity{};
          }
        } else {
          close_status_ = ids.status();
        }
      }
      if (close_status_.ok()) close_status_ = WriteSnapshot(files_->SnapshotPath(), snapshot);
    }
    io_.reset();
    files_.reset();
    std::free(probe_pages_);
    probe_pages_ = nullptr;
  });
  return close_status_;
}

// ---- requests ----

void DiskTier::Deliver(DiskCompletionSink* sink, uint64_t cookie, Status status, uint32_t slot,
                       uint64_t generation) {
  if (sink != nullptr)
    sink->OnDiskOpDone(DiskOpResult{cookie, std::move(status), slot, generation});
}

DiskTier::Task DiskTier::SlotTask(TaskKind kind, uint32_t slot, uint64_t generation,
                                  uint8_t* buffer, const BlockKey& key, DiskCompletionSink* sink,
                                  uint64_t cookie) const {
  Task t;
  t.kind = kind;
  t.slot = slot;
  t.generation = generation;
  t.file = geometry_.FileOf(slot);
  t.offset = geometry_.OffsetOf(slot);
  t.buffer = buffer;
  t.len = static_cast<uint32_t>(geometry_.slot_stride);
  t.key = key;
  t.sink = sink;
  t.cookie = cookie;
  return t;
}

void DiskTier::SubmitWrites(std::span<const DiskWriteRequest> requests) {
  // One allocation per batch, not per block. Not thread_local: a sink may submit from inside
  // a callback delivered by this very call.
  std::vector<Task> tasks;
  tasks.reserve(requests.size());
  for (const DiskWriteRequest& r : requests) {
    Status reject;
    uint32_t slot = 0;
    uint64_t generation = 0;
    if (r.buffer == nullptr || !Aligned(r.buffer)) {
      reject = Status::InvalidArgument("write buffer must be 4 KiB aligned");
    } else if (BlockHeaderBytesFor(r.tokens.size()) != geometry_.header_bytes()) {
      reject = Status::InvalidArgument(
          "a block of " + std::to_string(r.tokens.size()) + " tokens has a " +
          std::to_string(BlockHeaderBytesFor(r.tokens.size())) + "-byte header; this tier's " +
          "slots have a " + std::to_string(geometry_.header_bytes()) + "-byte header area");
    } else if (quarantined()) {
      reject = Status::Unavailable("G3 is quarantined");
    } else {
      MutexLock lock(&mu_);
      if (by_key_.contains(r.key)) {
        reject = Status::AlreadyExists("block " + r.key.ToHex() + " is already in G3");
      } else if (free_.empty()) {
        reject = Status::ResourceExhausted("G3 has no free slot");
      } else {
        slot = free_.back();
        free_.pop_back();
        generation = next_generation_++;
        Slot& s = slots_[slot];
        s.state = SlotState::kWriting;
        s.generation = generation;
        s.key = r.key;
        s.parent = r.parent;
        s.namespace_id = r.namespace_id;
        s.tokens.assign(r.tokens.begin(), r.tokens.end());
        by_key_[r.key] = slot;
      }
    }
    if (reject.ok()) {
      BlockHeaderFields fields;
      fields.layout_fingerprint = config_.layout_fingerprint;
      fields.namespace_id = r.namespace_id;
      fields.key = r.key;
      fields.parent = r.parent;
      fields.write_generation = generation;
      fields.slot_index = slot;
      const uint64_t checksum =
          PayloadChecksum(r.buffer + geometry_.header_bytes(), geometry_.payload_bytes);
      if (r.expected_checksum != 0 && checksum != r.expected_checksum) {
        reject = Status::Corruption(
            "G3 write refused: the block's bytes changed after it was committed (checksum " +
            std::to_string(checksum) + ", committed " + std::to_string(r.expected_checksum) +
            "); an engine wrote into a committed G2 slot");
      } else {
        reject = EncodeBlockHeader(fields, r.tokens, geometry_.payload_bytes, checksum, r.buffer);
      }
      if (!reject.ok()) ReleaseWriteSlot(slot);
    }
    if (!reject.ok()) {
      Bump(counters_->writes_rejected);
      Deliver(r.sink, r.cookie, std::move(reject));
      continue;
    }
    tasks.push_back(
        SlotTask(TaskKind::kWrite, slot, generation, r.buffer, r.key, r.sink, r.cookie));
  }
  Enqueue(&tasks);
}

void DiskTier::SubmitReads(std::span<const DiskReadRequest> requests) {
  // One allocation per batch, not per block. Not thread_local: a sink may submit from inside
  // a callback delivered by this very call.
  std::vector<Task> tasks;
  tasks.reserve(requests.size());
  for (const DiskReadRequest& r : requests) {
    Status reject;
    uint32_t slot = 0;
    uint64_t generation = 0;
    bool miss = false;
    if (r.buffer == nullptr || !Aligned(r.buffer)) {
      reject = Status::InvalidArgument("read buffer must be 4 KiB aligned");
    } else if (quarantined()) {
      reject = Status::Unavailable("G3 is quarantined");
    } else {
      MutexLock lock(&mu_);
      auto it = by_key_.find(r.key);
      if (it == by_key_.end() || slots_[it->second].state != SlotState::kValid) {
        miss = true;
      } else {
        slot = it->second;
        Slot& s = slots_[slot];
        ++s.readers;
        generation = s.generation;
      }
    }
    if (miss) {
      Bump(counters_->read_misses);
      Deliver(r.sink, r.cookie, Status::NotFound("block " + r.key.ToHex() + " is not in G3"));
      continue;
    }
    if (!reject.ok()) {
      Bump(counters_->reads_rejected);
      Deliver(r.sink, r.cookie, std::move(reject));
      continue;
    }
    Task t = SlotTask(TaskKind::kRead, slot, generation, r.buffer, r.key, r.sink, r.cookie);
    t.namespace_id = r.namespace_id;
    t.expected_tokens = r.expected_tokens;
    tasks.push_back(t);
  }
  Enqueue(&tasks);
}

void DiskTier::Enqueue(std::vector<Task>* tasks) {
  if (tasks->empty()) return;
  size_t accepted = 0;
  bool was_empty = false;
  bool closed = false;
  {
    MutexLock lock(&queue_mu_);
    closed = stopping_;
    if (!closed) {
      const uint64_t queued = queued_.load(std::memory_order_relaxed);
      const uint64_t room = config_.max_queued > queued ? config_.max_queued - queued : 0;
      accepted = std::min<uint64_t>(room, tasks->size());
      was_empty = incoming_.empty();
      incoming_.insert(incoming_.end(), tasks->begin(), tasks->begin() + accepted);
      queued_.fetch_add(accepted, std::memory_order_relaxed);
    }
  }
  // The I/O thread re-checks incoming_ after announcing that it sleeps, so a wake-up is needed
  // only when it may already be waiting and nobody before us has woken it.
  if (accepted > 0 && was_empty && io_thread_sleeping_.load()) io_->Wake();
  for (size_t i = accepted; i < tasks->size(); ++i) {
    Reject((*tasks)[i], closed ? Status::Unavailable("G3 is closed")
                               : Status::ResourceExhausted("G3 request queue is full"));
  }
}

void DiskTier::ReleaseWriteSlot(uint32_t slot) {
  MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  auto it = by_key_.find(s.key);
  if (it != by_key_.end() && it->second == slot) by_key_.erase(it);
  s.state = SlotState::kFree;
  free_.push_back(slot);
}

bool DiskTier::EndRead(uint32_t slot, uint64_t generation, bool drop) {
  MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  --s.readers;
  bool dropped = false;
  if (drop && s.state == SlotState::kValid && s.generation == generation) {
    by_key_.erase(s.key);
    s.state = SlotState::kDoomed;
    --valid_blocks_;
    dropped = true;
  }
  if (s.state == SlotState::kDoomed && s.readers == 0) {
    s.state = SlotState::kFree;
    free_.push_back(slot);
  }
  return dropped;
}

Status DiskTier::Remove(const BlockKey& key) {
  MutexLock lock(&mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return Status::NotFound("block " + key.ToHex() + " is not in G3");
  const uint32_t slot = it->second;
  Slot& s = slots_[slot];
  if (s.state == SlotState::kWriting) {
    return Status::FailedPrecondition("block " + key.ToHex() + " is being written");
  }
  by_key_.erase(it);
  --valid_blocks_;
  if (s.readers == 0) {
    s.state = SlotState::kFree;
    free_.push_back(slot);
  } else {
    s.state = SlotState::kDoomed;
  }
  return Status::Ok();
}

bool DiskTier::Contains(const BlockKey& key) const {
  MutexLock lock(&mu_);
  auto it = by_key_.find(key);
  return it != by_key_.end() && slots_[it->second].state == SlotState::kValid;
}

DiskAdmission::Decision DiskTier::Admit(const BlockKey& key) {
  return admission_->Admit(key, geometry_.slot_stride);
}

// ---- controls: run on the I/O thread, waited for here ----

Status DiskTier::RunControl(Control* control) {
  {
    MutexLock lock(&queue_mu_);
    if (stopping_) return Status::Unavailable("G3 is closed");
    controls_.push_back(control);
  }
  io_->Wake();
  MutexLock lock(&queue_mu_);
  while (!control->done) CondWait(&control_cv_, &queue_mu_);
  return control->result;
}

Status DiskTier::RegisterBuffers(std::span<const DiskBufferRegion> regions) {
  Control c{ControlKind::kRegister, {}, false, Status::Ok()};
  for (const DiskBufferRegion& r : regions) c.regions.push_back(iovec{r.base, r.bytes});
  Status s = RunControl(&c);
  if (!s.ok()) {
    KVTIER_LOG(kWarn) << "G3 I/O goes on with unregistered buffers: " << s.message();
  }
  return s;
}

Status DiskTier::ProbeNow() {
  Control c{ControlKind::kProbe, {}, false, Status::Ok()};
  return RunControl(&c);
}

Status DiskTier::CheckHealthNow() {
  Control c{ControlKind::kHealth, {}, false, Status::Ok()};
  return RunControl(&c);
}

DiskTierStats DiskTier::stats() const {
  const Counters& c = *counters_;
  DiskTierStats s;
  s.slots = geometry_.num_slots();
  {
    MutexLock lock(&mu_);
    s.free_slots = free_.size();
    s.blocks = valid_blocks_;
    s.quarantine_reason = quarantine_reason_;
  }
  auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s.writes_completed = get(c.writes_completed);
  s.write_errors = get(c.write_errors);
  s.writes_rejected = get(c.writes_rejected);
  s.bytes_written = get(c.bytes_written);
  s.reads_served = get(c.reads_served);
  s.read_misses = get(c.read_misses);
  s.read_errors = get(c.read_errors);
  s.reads_rejected = get(c.reads_rejected);
  s.verify_failures = get(c.verify_failures);
  for (size_t i = 0; i < kNumBlockChecks; ++i)
    s.verify_failures_by_check[i] = get(c.verify_by_check[i]);
  s.slots_dropped = get(c.slots_dropped);
  s.bytes_read = get(c.bytes_read);
  s.eio_errors = get(c.eio_errors);
  s.enospc_errors = get(c.enospc_errors);
  s.other_errors = get(c.other_errors);
  s.short_transfers = get(c.short_transfers);
  s.stuck_ios = get(c.stuck_ios);
  s.consecutive_errors = get(c.consecutive_errors);
  s.quarantined = quarantined();
  s.quarantines = get(c.quarantines);
  s.probes = get(c.probes);
  s.probes_ok = get(c.probes_ok);
  s.blocks_lost_to_truncation = get(c.blocks_lost_to_truncation);
  const DiskAdmission::Counts a = admission_->counts();
  s.admitted = a.admitted;
  s.not_admitted_unseen = a.not_seen_enough;
  s.not_admitted_budget = a.over_budget;
  s.recovered_from_snapshot = c.recovered_from_snapshot;
  s.recovered_blocks = c.recovered_blocks;
  s.scan_corrupt = c.scan_corrupt;
  s.scan_duplicates = c.scan_duplicates;
  s.scan_read_errors = c.scan_read_errors;
  s.files_rescanned = c.files_rescanned;
  s.recovery_ms = c.recovery_ms;
  s.reformatted = !reformat_reason_.empty();
  s.sparse_files = sparse_files_;
  s.buffers_registered = c.buffers_registered.load();
  s.io_backend = io_backend_name_;
  return s;
}

}  // namespace kvtier

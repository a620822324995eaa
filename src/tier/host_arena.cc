#include "tier/host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "core/log.h"
#include "core/parallel.h"

namespace kvtier {
namespace {

constexpr uint64_t kHugePage = 2ull << 20;
constexpr uint64_t kPage = 4096;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Status HostArena::Config::Validate() const {
  if (slot_bytes == 0) {
    return Status::InvalidArgument("G2 slot_bytes = 0; a slot must hold at least one byte");
  }
  const uint64_t stride = RoundUp(slot_bytes, kSlotAlignment);
  if (capacity_bytes < stride) {
    return Status::InvalidArgument("G2 capacity_bytes = " + std::to_string(capacity_bytes) +
                                   " holds no slot of " + std::to_string(stride) +
                                   " bytes; give at least one slot's worth");
  }
  if (capacity_bytes / stride >= (1ull << 32) - 1) {
    return Status::InvalidArgument("G2 capacity_bytes = " + std::to_string(capacity_bytes) +
                                   " makes 2^32 or more slots; use larger slots or less memory");
  }
  return Status::Ok();
}

Result<std::unique_ptr<HostArena>> HostArena::Create(const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<HostArena> arena(new HostArena());
  arena->config_ = config;
  arena->slot_stride_ = RoundUp(config.slot_bytes, kSlotAlignment);
  arena->num_slots_ = static_cast<uint32_t>(config.capacity_bytes / arena->slot_stride_);
  const uint64_t used = uint64_t{arena->num_slots_} * arena->slot_stride_;
  arena->mapped_bytes_ = RoundUp(used, kHugePage);

  auto t0 = std::chrono::steady_clock::now();
  // Over-map by one huge page so the arena can start on a 2 MiB boundary (THP needs it).
  const uint64_t reserve = arena->mapped_bytes_ + kHugePage;
  void* raw = mmap(nullptr, reserve, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) {
      return Status::NoSpace("G2: cannot map " + std::to_string(reserve) +
                             " bytes: out of memory or address space; lower the G2 "
                             "capacity_bytes or raise `ulimit -v`");
    }
    return Status::FromErrno(err, "G2: mmap of " + std::to_string(reserve) + " bytes failed");
  }
  auto addr = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(addr, kHugePage);
  if (aligned > addr) munmap(raw, aligned - addr);
  const uintptr_t end = aligned + arena->mapped_bytes_;
  const uintptr_t raw_end = addr + reserve;
  if (raw_end > end) munmap(reinterpret_cast<void*>(end), raw_end - end);
  arena->base_ = reinterpret_cast<uint8_t*>(aligned);
  if (config.shared) {
    // kvtier serve's G2: a sealed memfd mapped over the aligned range, so attached engines can
    // map the same pages (Attach). Shared memory gets huge pages only where the kernel's
    // transparent_hugepage/shmem_enabled allows it (advise, always).
    int fd = memfd_create("kvtier-g2", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    const int err = errno;
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(arena->mapped_bytes_)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        mmap(arena->base_, arena->mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
             0) == MAP_FAILED) {
      const int e = fd < 0 ? err : errno;
      if (fd >= 0) close(fd);
      munmap(arena->base_, arena->mapped_bytes_);
      arena->base_ = nullptr;
      return Status::FromErrno(e, "G2: a shared arena of " + std::to_string(arena->mapped_bytes_) +
                                      " bytes (memfd) could not be made");
    }
    arena->shared_fd_ = fd;
    arena->startup_.shared = true;
  }
  if (config.hugepages) {
    arena->startup_.hugepages_advised =
        madvise(arena->base_, arena->mapped_bytes_, MADV_HUGEPAGE) == 0;
  }
  arena->startup_.map_ms = MsSince(t0);

  // Parallel first touch: one write per 4 KiB page (the kernel zero-fills a whole huge page on
  // the first write into it, so this also works when THP backs the range).
  const unsigned threads = config.prefault_threads ? config.prefault_threads : OnlineCpus();
  arena->startup_.threads = threads;
  t0 = std::chrono::steady_clock::now();
  uint8_t* base = arena->base_;
  const uint64_t pages = arena->mapped_bytes_ / kPage;
  ParallelRanges(threads, pages, [base](unsigned, size_t b, size_t e) {
    for (size_t p = b; p < e; ++p) *reinterpret_cast<volatile uint8_t*>(base + p * kPage) = 0;
  });
  arena->startup_.prefault_ms = MsSince(t0);

  if (config.lock_memory) {
    t0 = std::chrono::steady_clock::now();
    if (mlock(arena->base_, arena->mapped_bytes_) == 0) {
      arena->startup_.locked = true;
    } else {
      const int err = errno;
      KVTIER_LOG(kWarn) << "G2: mlock of " << arena->mapped_bytes_ << " bytes refused ("
                        << std::strerror(err)
                        << "); running unlocked: the arena may be swapped out. Raise "
                           "`ulimit -l` (RLIMIT_MEMLOCK) to lock it.";
    }
    arena->startup_.lock_ms = MsSince(t0);
  }

  {
    MutexLock lock(&arena->mu_);
    arena->free_.resize(arena->num_slots_);
    // Stack order: slot 0 is handed out first.
    for (uint32_t i = 0; i < arena->num_slots_; ++i) arena->free_[i] = arena->num_slots_ - 1 - i;
    arena->allocated_.assign(arena->num_slots_, 0);
  }
  KVTIER_LOG(kInfo) << "G2 arena: " << arena->num_slots_ << " slots x " << arena->slot_stride_
                    << " B = " << (arena->mapped_bytes_ >> 20) << " MiB ready in "
                    << arena->startup_.total_ms() << " ms (pre-fault "
                    << arena->startup_.prefault_ms << " ms on " << threads << " threads"
                    << (arena->startup_.hugepages_advised ? ", huge pages advised" : "")
                    << (arena->startup_.locked ? ", locked" : ", not locked") << ")";
  return arena;
}

HostArena::~HostArena() {
  if (base_ != nullptr) {
    if (startup_.locked) munlock(base_, mapped_bytes_);
    munmap(base_, mapped_bytes_);
  }
  if (shared_fd_ >= 0) close(shared_fd_);
}

Result<std::unique_ptr<HostArena>> HostArena::Attach(int fd, const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<HostArena> arena(new HostArena());
  arena->config_ = config;
  arena->attached_ = true;
  arena->slot_stride_ = RoundUp(config.slot_bytes, kSlotAlignment);
  arena->num_slots_ = static_cast<uint32_t>(config.capacity_bytes / arena->slot_stride_);
  arena->mapped_bytes_ = RoundUp(uint64_t{arena->num_slots_} * arena->slot_stride_, kHugePage);
  struct stat st {};
  if (fstat(fd, &st) != 0) return Status::FromErrno(errno, "G2 attach: fstat of the descriptor");
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != arena->mapped_bytes_) {
    return Status::InvalidArgument("G2 attach: the descriptor holds " + std::to_string(st.st_size) +
                                   " bytes, but " + std::to_string(config.capacity_bytes) +
                                   " bytes of " + std::to_string(config.slot_bytes) +
                                   "-byte slots map " + std::to_string(arena->mapped_bytes_) +
                                   ": not the daemon's arena, or a daemon of another version");
  }
  void* raw =
      mmap(nullptr, arena->mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (raw == MAP_FAILED) return Status::FromErrno(errno, "G2 attach: mmap of the shared arena");
  arena->base_ = static_cast<uint8_t*>(raw);
  arena->shared_fd_ = dup(fd);
  arena->startup_.shared = true;
  if (config.lock_memory && mlock(arena->base_, arena->mapped_bytes_) == 0) {
    arena->startup_.locked = true;
  }
  return arena;
}

std::optional<uint32_t> HostArena::Allocate() {
  MutexLock lock(&mu_);
  if (free_.empty()) return std::nullopt;
  const uint32_t slot = free_.back();
  free_.pop_back();
  allocated_[slot] = 1;
  return slot;
}

Status HostArena::Release(uint32_t slot) {
  if (attached_) {
    return Status::FailedPrecondition("an attached G2 arena's slots are the daemon's to lend");
  }
  MutexLock lock(&mu_);
  if (slot >= num_slots_) {
    return Status::FailedPrecondition("G2: release of slot " + std::to_string(slot) +
                                      ", but the arena has " + std::to_string(num_slots_));
  }
  if (!allocated_[slot]) {
    return Status::FailedPrecondition("G2: release of slot " + std::to_string(slot) +
                                      ", which is not allocated (double release?)");
  }
  allocated_[slot] = 0;
  free_.push_back(slot);
  return Status::Ok();
}

uint32_t HostArena::free_slots() const {
  MutexLock lock(&mu_);
  return static_cast<uint32_t>(free_.size());
}

}  // namespace kvtier

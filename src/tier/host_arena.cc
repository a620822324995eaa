#include "tier/host_arena.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/log.h"
#include "core/parallel.h"

namespace kvtier {
namespace {

constexpr uint64_t kHugePage = 2ull << 20;
constexpr uint64_t kPage = 4096;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// The word in brackets of /sys/kernel/mm/transparent_hugepage/shmem_enabled ("never",
// "advise", ...); empty when it cannot be read.
std::string ShmemThpSetting() {
  std::string all;
  if (FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r")) {
    char buf[256];
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    all.assign(buf, n);
  }
  const size_t a = all.find('['), b = all.find(']');
  return a != std::string::npos && b != std::string::npos && b > a ? all.substr(a + 1, b - a - 1)
                                                                   : std::string();
}

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << 26)  // log2(2 MiB) << MFD_HUGE_SHIFT, as in <linux/memfd.h>
#endif

// `bytes` (a multiple of 2 MiB) of private anonymous memory with protection `prot`, starting on
// a 2 MiB boundary (THP needs it). NoSpace when the memory or address space is short, IOError
// for other mmap failures.
Result<uint8_t*> ReserveAligned(uint64_t bytes, int prot) {
  // Over-map by one huge page, then trim the unaligned head and the tail.
  const uint64_t reserve = bytes + kHugePage;
  void* raw = mmap(nullptr, reserve, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) {
      return Status::NoSpace("G2: cannot map " + std::to_string(reserve) +
                             " bytes: out of memory or address space; lower the G2 "
                             "capacity_bytes or raise `ulimit -v`");
    }
    return Status::FromErrno(err, "G2: mmap of " + std::to_string(reserve) + " bytes failed");
  }
  const auto addr = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(addr, kHugePage);
  if (aligned > addr) munmap(raw, aligned - addr);
  const uintptr_t end = aligned + bytes;
  const uintptr_t raw_end = addr + reserve;
  if (raw_end > end) munmap(reinterpret_cast<void*>(end), raw_end - end);
  return reinterpret_cast<uint8_t*>(aligned);
}

// The first `bytes` (a multiple of 2 MiB) of `fd` mapped read-write MAP_SHARED | `extra_flags`
// on a 2 MiB boundary. NoSpace when memory, address space or (hugetlbfs) reserved huge pages
// are short; IOError for other mmap failures. Nothing stays mapped on failure.
Result<uint8_t*> MapFdAligned(int fd, uint64_t bytes, int extra_flags) {
  KVTIER_ASSIGN_OR_RETURN(uint8_t * at, ReserveAligned(bytes, PROT_NONE));
  void* p = mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | extra_flags, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    munmap(at, bytes);
    const std::string what = "G2: mmap of " + std::to_string(bytes) + " bytes of fd " +
                             std::to_string(fd) + " (MAP_SHARED) failed";
    if (err == ENOMEM) {
      return Status::NoSpace(what +
                             ": out of memory, address space or (hugetlbfs) reserved huge pages");
    }
    return Status::FromErrno(err, what);
  }
  return at;
}

struct Memfd {
  int fd = -1;
  uint8_t* base = nullptr;
};

// A new memfd "kvtier-g2" of `bytes` (a multiple of 2 MiB), hugetlbfs-backed with 2 MiB pages
// when `hugetlb`, sealed against resizing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) and mapped
// by MapFdAligned. IOError/NoSpace naming the step that failed; nothing is left open or mapped
// on failure.
Result<Memfd> CreateSealedMemfd(uint64_t bytes, bool hugetlb) {
  unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  if (hugetlb) flags |= MFD_HUGETLB | MFD_HUGE_2MB;
  const char* kind = hugetlb ? "hugetlbfs memfd" : "memfd";
  Memfd m;
  m.fd = memfd_create("kvtier-g2", flags);
  if (m.fd < 0) return Status::FromErrno(errno, std::string("G2: memfd_create of a ") + kind);
  auto fail = [&m](Status s) {
    close(m.fd);
    return s;
  };
  if (ftruncate(m.fd, static_cast<off_t>(bytes)) != 0) {
    return fail(Status::FromErrno(errno, std::string("G2: ftruncate of a ") + kind + " to " +
                                             std::to_string(bytes) + " bytes"));
  }
  if (fcntl(m.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail(Status::FromErrno(errno, std::string("G2: sealing a ") + kind));
  }
  // No MAP_NORESERVE: a hugetlbfs mapping then reserves its huge pages here and fails now with
  // ENOMEM when there are too few, instead of SIGBUS in the pre-fault.
  auto base = MapFdAligned(m.fd, bytes, 0);
  if (!base.ok()) return fail(base.status());
  m.base = *base;
  return m;
}

// mlocks [base, base + bytes) into stats (locked, lock_ms); without permission logs a warning
// and leaves the range unlocked.
void LockOrWarn(uint8_t* base, uint64_t bytes, HostArena::StartupStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  if (mlock(base, bytes) == 0) {
    stats->locked = true;
  } else {
    const int err = errno;
    KVTIER_LOG(kWarn) << "G2: mlock of " << bytes << " bytes refused (" << std::strerror(err)
                      << "); running unlocked: the arena may be swapped out. Raise "
                         "`ulimit -l` (RLIMIT_MEMLOCK) to lock it.";
  }
  stats->lock_ms = MsSince(t0);
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

void HostArena::ComputeGeometry() {
  slot_stride_ = RoundUp(config_.slot_bytes, kSlotAlignment);
  num_slots_ = static_cast<uint32_t>(config_.capacity_bytes / slot_stride_);
  mapped_bytes_ = RoundUp(uint64_t{num_slots_} * slot_stride_, kHugePage);
}

Status HostArena::MapSharedMemfd() {
  startup_.shared = true;
  if (config_.hugepages) {
    auto huge = CreateSealedMemfd(mapped_bytes_, /*hugetlb=*/true);
    if (huge.ok()) {
      fd_ = huge->fd;
      base_ = huge->base;
      startup_.hugetlb = true;
      return Status::Ok();
    }
    // MADV_HUGEPAGE gives a memfd huge pages only when shmem THP allows it: with
    // shmem_enabled = never (a common default) the arena is on 4 KiB pages, and a 512 MiB load
    // from it ran ~10% slower than from 2 MiB pages (docs/pd.md, issue 40).
    const std::string shmem = ShmemThpSetting();
    const bool shmem_thp = shmem != "never" && shmem != "deny" && !shmem.empty();
    KVTIER_LOG(kInfo) << "G2: no hugetlbfs memfd for the shared arena (" << huge.status().ToString()
                      << "); using a normal memfd with MADV_HUGEPAGE"
                      << (shmem_thp ? ""
                                    : ", which gets no huge pages while "
                                      "/sys/kernel/mm/transparent_hugepage/shmem_enabled is " +
                                          (shmem.empty() ? std::string("unreadable") : shmem) +
                                          " (advise would allow them)")
                      << ". Reserve 2 MiB pages (vm.nr_hugepages) to get a hugetlbfs one.";
  }
  KVTIER_ASSIGN_OR_RETURN(Memfd m, CreateSealedMemfd(mapped_bytes_, /*hugetlb=*/false));
  fd_ = m.fd;
  base_ = m.base;
  if (config_.hugepages) {
    startup_.hugepages_advised = madvise(base_, mapped_bytes_, MADV_HUGEPAGE) == 0;
  }
  return Status::Ok();
}

Result<std::unique_ptr<HostArena>> HostArena::Create(const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<HostArena> arena(new HostArena());
  arena->config_ = config;
  arena->ComputeGeometry();

  auto t0 = std::chrono::steady_clock::now();
  if (config.shared) {
    // MapSharedMemfd leaves nothing open or mapped when it fails.
    KVTIER_RETURN_IF_ERROR(arena->MapSharedMemfd());
  } else {
    KVTIER_ASSIGN_OR_RETURN(arena->base_,
                            ReserveAligned(arena->mapped_bytes_, PROT_READ | PROT_WRITE));
    if (config.hugepages) {
      arena->startup_.hugepages_advised =
          madvise(arena->base_, arena->mapped_bytes_, MADV_HUGEPAGE) == 0;
    }
  }
  arena->startup_.map_ms = MsSince(t0);

  // Parallel first touch: one write per 4 KiB page (the kernel zero-fills a whole huge page on
  // the first write into it, so this also works when THP or hugetlbfs backs the range). For a
  // memfd the writes allocate its pages, so an attacher's MAP_POPULATE only maps them.
  const unsigned threads = config.prefault_threads ? config.prefault_threads : OnlineCpus();
  arena->startup_.threads = threads;
  t0 = std::chrono::steady_clock::now();
  uint8_t* base = arena->base_;
  const uint64_t pages = arena->mapped_bytes_ / kPage;
  ParallelRanges(threads, pages, [base](unsigned, size_t b, size_t e) {
    for (size_t p = b; p < e; ++p) *reinterpret_cast<volatile uint8_t*>(base + p * kPage) = 0;
  });
  arena->startup_.prefault_ms = MsSince(t0);

  if (config.lock_memory) LockOrWarn(arena->base_, arena->mapped_bytes_, &arena->startup_);

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
                    << (arena->startup_.hugetlb  ? ", shared hugetlbfs memfd"
                        : arena->startup_.shared ? ", shared memfd"
                                                 : "")
                    << (arena->startup_.hugepages_advised ? ", huge pages advised" : "")
                    << (arena->startup_.locked ? ", locked" : ", not locked") << ")";
  return arena;
}

Result<std::unique_ptr<HostArena>> HostArena::Attach(int fd, const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  if (fd < 0) {
    return Status::InvalidArgument("G2 attach: fd " + std::to_string(fd) +
                                   " is not a file descriptor");
  }
  std::unique_ptr<HostArena> arena(new HostArena());
  arena->config_ = config;
  arena->config_.shared = true;
  arena->attached_ = true;
  arena->ComputeGeometry();
  arena->startup_.shared = true;

  const auto t0 = std::chrono::steady_clock::now();
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return Status::FromErrno(errno, "G2 attach: fstat of fd " + std::to_string(fd));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("G2 attach: fd " + std::to_string(fd) +
                                   " is not a regular file (a memfd is one); it cannot be a "
                                   "G2 arena");
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) != arena->mapped_bytes_) {
    return Status::InvalidArgument(
        "G2 attach: fd " + std::to_string(fd) + " holds " + std::to_string(st.st_size) +
        " bytes, but a G2 of capacity_bytes = " + std::to_string(config.capacity_bytes) +
        " and slot_bytes = " + std::to_string(config.slot_bytes) + " maps " +
        std::to_string(arena->mapped_bytes_) +
        " bytes; the fd is not that arena, or the two processes disagree on its config");
  }
  // A peer that could shrink the file under this mapping would crash this process (SIGBUS on
  // the next copy): only a memfd sealed against shrinking (as Create makes it) is mapped.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return Status::InvalidArgument("G2 attach: fd " + std::to_string(fd) +
                                   " is not sealed against shrinking (F_SEAL_SHRINK); only a "
                                   "kvtier serve arena (a sealed memfd) can be attached");
  }
  arena->fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (arena->fd_ < 0) {
    return Status::FromErrno(errno, "G2 attach: dup of fd " + std::to_string(fd));
  }
  struct statfs fs {};
  arena->startup_.hugetlb = fstatfs(arena->fd_, &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC;
  // On failure the arena's destructor closes the dup.
  KVTIER_ASSIGN_OR_RETURN(arena->base_,
                          MapFdAligned(arena->fd_, arena->mapped_bytes_, MAP_POPULATE));
  if (config.hugepages && !arena->startup_.hugetlb) {
    arena->startup_.hugepages_advised =
        madvise(arena->base_, arena->mapped_bytes_, MADV_HUGEPAGE) == 0;
  }
  arena->startup_.map_ms = MsSince(t0);
  if (config.lock_memory) LockOrWarn(arena->base_, arena->mapped_bytes_, &arena->startup_);
  KVTIER_LOG(kInfo) << "G2 arena attached: " << arena->num_slots_ << " slots x "
                    << arena->slot_stride_ << " B = " << (arena->mapped_bytes_ >> 20)
                    << " MiB mapped in " << arena->startup_.total_ms() << " ms ("
                    << (arena->startup_.hugetlb ? "hugetlbfs memfd" : "memfd")
                    << (arena->startup_.locked ? ", locked" : ", not locked") << ")";
  return arena;
}

HostArena::~HostArena() {
  if (base_ != nullptr) {
    if (startup_.locked) munlock(base_, mapped_bytes_);
    munmap(base_, mapped_bytes_);
  }
  if (fd_ >= 0) close(fd_);
}

std::optional<uint32_t> HostArena::Allocate() {
  if (attached_) return std::nullopt;  // the owner's free list is the only one
  MutexLock lock(&mu_);
  if (free_.empty()) return std::nullopt;
  const uint32_t slot = free_.back();
  free_.pop_back();
  allocated_[slot] = 1;
  return slot;
}

Status HostArena::Release(uint32_t slot) {
  if (attached_) {
    return Status::FailedPrecondition("G2: release of slot " + std::to_string(slot) +
                                      " on an attached arena: an attached arena's slots are the "
                                      "daemon's to lend");
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

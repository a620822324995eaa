// HostArena: the G2 tier's memory. One mapping cut into fixed-size slots.
//
// Invariants: the mapping never grows or moves after Create()/Attach(); every slot starts at a
// multiple of kSlotAlignment (4 KiB, so O_DIRECT I/O can target a slot directly) and is
// slot_stride() bytes from the next; a slot is either free (in free_) or allocated, never both.
//
// Start-up pre-faults the whole mapping in parallel (MADV_HUGEPAGE first, so the kernel can
// back it with 2 MiB pages), then mlocks it when the process may; without permission it logs
// a warning and runs unlocked. A pre-faulted, locked arena is what cudaHostRegister and
// io_uring buffer registration want, and it keeps page faults off the transfer path.
//
// Shared arenas (Config::shared): the memory is a sealed memfd mapped MAP_SHARED, so another
// process (an engine attached to `kvtier serve`) can map the same bytes with Attach() on the fd
// it received. The owner keeps the free list; an attached arena only reads and writes the slots
// the owner lends it. The fd's size is sealed (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), so no
// holder of it can truncate the memory under another's mapping.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/mutex.h"
#include "kvtier/status.h"

namespace kvtier {

class HostArena {
 public:
  static constexpr uint64_t kSlotAlignment = 4096;

  struct Config {
    uint64_t capacity_bytes = 0;    // upper bound on the mapping; slots = capacity / stride
    uint64_t slot_bytes = 0;        // usable bytes per slot; the stride rounds this up to 4 KiB
    uint32_t prefault_threads = 0;  // 0 = one per online CPU
    bool hugepages = true;          // madvise(MADV_HUGEPAGE) before pre-faulting
    bool lock_memory = true;        // mlock after pre-faulting, when permitted
    // The memory is a sealed memfd ("kvtier-g2") mapped MAP_SHARED, exported by shared_fd().
    // With `hugepages`, a hugetlbfs memfd (2 MiB pages) is tried first; when that cannot be had
    // (no huge pages reserved, an old kernel) the arena logs why and uses a normal memfd with
    // MADV_HUGEPAGE. false: private anonymous memory, as before.
    bool shared = false;

    // Ok, or InvalidArgument naming the field: slot_bytes >= 1; capacity holds >= 1 slot and
    // < 2^32 slots.
    Status Validate() const;
  };

  struct StartupStats {
    double map_ms = 0;       // mmap + madvise
    double prefault_ms = 0;  // parallel first touch
    double lock_ms = 0;      // mlock (0 when not attempted)
    uint32_t threads = 0;
    bool hugepages_advised = false;
    bool locked = false;
    bool shared = false;   // the memory is a memfd (Config::shared, or an attached arena)
    bool hugetlb = false;  // the memfd is hugetlbfs-backed (2 MiB pages, reserved up front)
    double total_ms() const { return map_ms + prefault_ms + lock_ms; }
  };

  // Maps, pre-faults and (if permitted) locks the arena. InvalidArgument for a bad config;
  // NoSpace/IOError when the memory cannot be mapped; with config.shared, IOError also when the
  // memfd cannot be created, sized or sealed (see Config::shared).
  static Result<std::unique_ptr<HostArena>> Create(const Config& config);

  // Maps a shared arena another process created, from its memfd `fd` (e.g. received over a Unix
  // socket: nothing about it is trusted). InvalidArgument for a bad config, a negative fd, or an
  // fd that is not a regular file whose size is exactly the mapped size `config` implies (the
  // message names both sizes); IOError when fstat/dup/mmap fail; NoSpace when the address space
  // is short. The mapping is MAP_SHARED | MAP_POPULATE, 2 MiB-aligned, mlocked when
  // config.lock_memory and permitted (else a warning); config.prefault_threads and
  // config.shared are ignored. The arena owns a dup of `fd` (close-on-exec); the caller keeps
  // and closes its own. The result has no free list: Allocate() is always nullopt and Release()
  // FailedPrecondition; SlotData()/base()/num_slots()/slot_stride() are as for the owner.
  static Result<std::unique_ptr<HostArena>> Attach(int fd, const Config& config);

  // Unmaps the memory (munlock first when locked), then closes the memfd, if any.
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  uint32_t num_slots() const { return num_slots_; }
  uint64_t slot_bytes() const { return config_.slot_bytes; }
  uint64_t slot_stride() const { return slot_stride_; }
  // The whole mapping, for buffer registration (io_uring, cudaHostRegister).
  uint8_t* base() const { return base_; }
  uint64_t mapped_bytes() const { return mapped_bytes_; }
  const StartupStats& startup() const { return startup_; }
  // The memfd behind a shared or attached arena, owned by the arena (valid until it is
  // destroyed; dup it to keep it longer); -1 for a private arena.
  int shared_fd() const { return fd_; }
  // True for an arena made by Attach(): it maps another's slots and lends none.
  bool attached() const { return attached_; }

  // A free slot, or nullopt when all are allocated (always, for an attached arena). O(1).
  // Thread-safe.
  std::optional<uint32_t> Allocate() EXCLUDES(mu_);
  // Returns `slot` to the free list. FailedPrecondition (and no change) when the slot is out of
  // range or not allocated, so a double release cannot corrupt the free list; FailedPrecondition
  // always for an attached arena. Thread-safe.
  Status Release(uint32_t slot) EXCLUDES(mu_);
  // Slots on the free list now (0 for an attached arena). Thread-safe.
  uint32_t free_slots() const EXCLUDES(mu_);

  // Start of `slot`'s bytes. REQUIRES: slot < num_slots().
  uint8_t* SlotData(uint32_t slot) const { return base_ + uint64_t{slot} * slot_stride_; }

 private:
  HostArena() = default;
  // Sets slot_stride_, num_slots_ and mapped_bytes_ from config_. REQUIRES: config_ is valid.
  void ComputeGeometry();
  // Maps a memfd of mapped_bytes_ into base_, hugetlbfs first when config_.hugepages (falling
  // back, logged, to a normal memfd). Sets fd_, startup_.shared/hugetlb/hugepages_advised.
  Status MapSharedMemfd();

  Config config_;
  int fd_ = -1;            // the memfd (shared or attached arena), else -1
  bool attached_ = false;  // made by Attach()
  uint8_t* base_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  uint64_t slot_stride_ = 0;
  uint32_t num_slots_ = 0;
  StartupStats startup_;

  mutable Mutex mu_;
  std::vector<uint32_t> free_ GUARDED_BY(mu_);      // stack of free slots
  std::vector<uint8_t> allocated_ GUARDED_BY(mu_);  // 1 while a slot is allocated
};

}  // namespace kvtier

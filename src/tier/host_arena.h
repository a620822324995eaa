// HostArena: the G2 tier's memory. One anonymous mapping cut into fixed-size slots.
//
// Invariants: the mapping never grows or moves after Create(); every slot starts at a multiple
// of kSlotAlignment (4 KiB, so O_DIRECT I/O can target a slot directly) and is slot_stride()
// bytes from the next; a slot is either free (in free_) or allocated, never both.
//
// Start-up pre-faults the whole mapping in parallel (MADV_HUGEPAGE first, so the kernel can
// back it with 2 MiB pages), then mlocks it when the process may; without permission it logs
// a warning and runs unlocked. A pre-faulted, locked arena is what cudaHostRegister and
// io_uring buffer registration want, and it keeps page faults off the transfer path.
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
    // kvtier serve: the memory is a sealed memfd (shared_fd()) that other processes map with
    // Attach, so attached engines copy G1 <-> G2 in their own process.
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
    bool shared = false;
    double total_ms() const { return map_ms + prefault_ms + lock_ms; }
  };

  // Maps, pre-faults and (if permitted) locks the arena. InvalidArgument for a bad config;
  // NoSpace/IOError when the memory cannot be mapped.
  static Result<std::unique_ptr<HostArena>> Create(const Config& config);
  // Maps a shared arena another process made (its shared_fd(), received over a socket: never
  // trusted): InvalidArgument unless the descriptor's size is what `config` (capacity_bytes,
  // slot_bytes) maps. MAP_POPULATE, mlock when permitted; the descriptor is dup()ed. An
  // attached arena lends no slots: Allocate() returns nullopt, Release() FailedPrecondition.
  static Result<std::unique_ptr<HostArena>> Attach(int fd, const Config& config);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  uint32_t num_slots() const { return num_slots_; }
  uint64_t slot_bytes() const { return config_.slot_bytes; }
  uint64_t slot_stride() const { return slot_stride_; }
  // The whole mapping, for buffer registration (io_uring, cudaHostRegister).
  uint8_t* base() const { return base_; }
  // The memfd of a shared arena (Config::shared, or Attach), owned by the arena; -1 otherwise.
  int shared_fd() const { return shared_fd_; }
  bool attached() const { return attached_; }
  uint64_t mapped_bytes() const { return mapped_bytes_; }
  const StartupStats& startup() const { return startup_; }

  // A free slot, or nullopt when all are allocated. O(1). Thread-safe.
  std::optional<uint32_t> Allocate() EXCLUDES(mu_);
  // Returns `slot` to the free list. FailedPrecondition (and no change) when the slot is out of
  // range or not allocated, so a double release cannot corrupt the free list. Thread-safe.
  Status Release(uint32_t slot) EXCLUDES(mu_);
  uint32_t free_slots() const EXCLUDES(mu_);

  // Start of `slot`'s bytes. REQUIRES: slot < num_slots().
  uint8_t* SlotData(uint32_t slot) const { return base_ + uint64_t{slot} * slot_stride_; }

 private:
  HostArena() = default;

  Config config_;
  uint8_t* base_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  uint64_t slot_stride_ = 0;
  uint32_t num_slots_ = 0;
  int shared_fd_ = -1;
  bool attached_ = false;
  StartupStats startup_;

  mutable Mutex mu_;
  std::vector<uint32_t> free_ GUARDED_BY(mu_);      // stack of free slots
  std::vector<uint8_t> allocated_ GUARDED_BY(mu_);  // 1 while a slot is allocated
};

}  // namespace kvtier

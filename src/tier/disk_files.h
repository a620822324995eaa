// DiskFileSet: the directory and slot files of a disk tier (G3).
//
// Directory contents:
//   LOCK           flock()ed exclusively by the process using the tier, so two processes never
//                  write the same slots (inspect takes it shared when it can)
//   g3-NNNN.kvt    slot files, 0600, preallocated (fallocate) to their full size
//   snapshot.kvt   the slot table written at clean shutdown (see disk_recovery.h)
//
// A slot file is [superblock 4 KiB | probe page 4 KiB | slot 0 | slot 1 | ...]; every slot is
// slot_stride bytes (a stored block, header + payload, rounded up to 4 KiB; the header area is
// the at-rest header of the layout's blocks, 4 KiB up to 1320 tokens per block, so directories
// of earlier versions have the same geometry). Slot s lives in
// file s % num_files, at kFirstSlotOffset + (s / num_files) * slot_stride, so consecutive slots
// are spread over the files (and the devices under them). The superblock records the geometry;
// a directory whose superblocks do not match the configured geometry is reformatted (all its
// blocks dropped) or refused, by configuration. The probe page is what a quarantined tier writes
// and reads back to decide whether the device works again.
//
// Preallocation: fallocate(2) reserves the space so a full filesystem cannot fail a write
// later. Where the filesystem refuses (EOPNOTSUPP: some network and FUSE filesystems), the file
// is sized with ftruncate instead (sparse), with a warning: writes may then meet ENOSPC, which
// the tier treats as an I/O error (counted, and quarantine after repeated failures).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

inline constexpr uint64_t kSuperblockBytes = 4096;
inline constexpr uint64_t kProbeOffset = 4096;
inline constexpr uint64_t kFirstSlotOffset = 8192;
inline constexpr uint32_t kSlotFileFormatVersion = 1;
inline constexpr uint32_t kMaxSlotFiles = 256;

struct DiskGeometry {
  uint64_t payload_bytes = 0;
  uint64_t slot_stride = 0;  // header_bytes() + round_up(payload_bytes, 4096)
  uint32_t num_files = 1;
  uint32_t slots_per_file = 0;
  uint64_t layout_fingerprint = 0;

  uint32_t num_slots() const { return num_files * slots_per_file; }
  // The header area in front of each slot's payload (BlockHeaderBytes of the layout).
  uint64_t header_bytes() const { return slot_stride - (payload_bytes + 4095) / 4096 * 4096; }
  uint64_t file_bytes() const { return kFirstSlotOffset + uint64_t{slots_per_file} * slot_stride; }
  uint32_t FileOf(uint32_t slot) const { return slot % num_files; }
  uint64_t OffsetOf(uint32_t slot) const {
    return kFirstSlotOffset + uint64_t{slot / num_files} * slot_stride;
  }
  // A stable hash of all fields, recorded in snapshots.
  uint64_t Hash() const;
  std::string ToString() const;
  friend bool operator==(const DiskGeometry&, const DiskGeometry&) = default;

  // The geometry for `capacity_bytes` of slot files holding blocks of `payload_bytes` behind
  // a `header_bytes` header area (a multiple of 4 KiB in 4 KiB..kMaxBlockHeaderBytes).
  // InvalidArgument for another header area, when not even one slot per file fits, or when
  // there would be >= 2^31 slots.
  static Result<DiskGeometry> For(uint64_t capacity_bytes, uint64_t payload_bytes,
                                  uint64_t header_bytes, uint32_t num_files,
                                  uint64_t layout_fingerprint);
};

// What a slot file is, as fstat(2) says. The restart snapshot records it for every file, and a
// restart trusts the snapshot's slots of a file only while the file is still the same one,
// untouched: a file replaced, truncated and extended (its slots now zeros), or written to by
// anyone since the snapshot differs in inode, size, allocation or change time, and is scanned.
struct FileIdentity {
  uint64_t inode = 0;
  uint64_t size = 0;
  uint64_t allocated_bytes = 0;  // st_blocks x 512
  int64_t ctime_ns = 0;
  friend bool operator==(const FileIdentity&, const FileIdentity&) = default;
};

struct FileHealth {
  bool deleted = false;  // unlinked underneath the open file
  uint64_t size = 0;     // current size in bytes
};

class DiskFileSet {
 public:
  struct Options {
    std::string dir;
    DiskGeometry geometry;
    bool preallocate = true;           // false: always sparse (ftruncate)
    bool reformat_on_mismatch = true;  // false: FailedPrecondition instead
  };

  // Creates the directory (0700) and files (0600) as needed, takes the lock, and checks or
  // writes the superblocks. Returns:
  //   FailedPrecondition  another process holds the directory, or a geometry mismatch when
  //                       reformat_on_mismatch is false
  //   NoSpace             the filesystem cannot hold the files (message: needed vs free)
  //   InvalidArgument     the filesystem refuses O_DIRECT
  //   IOError             any other system-call failure, naming the call and the path
  static Result<std::unique_ptr<DiskFileSet>> Open(const Options& options);

  // Opens an existing directory read-only (O_DIRECT) for inspection: geometry from the
  // superblocks, lock taken shared when free (`locked_by_other()` says when not). NotFound
  // when there are no slot files; Corruption when the superblocks are unreadable or disagree.
  static Result<std::unique_ptr<DiskFileSet>> OpenReadOnly(const std::string& dir);

  ~DiskFileSet();
  DiskFileSet(const DiskFileSet&) = delete;
  DiskFileSet& operator=(const DiskFileSet&) = delete;

  const std::string& dir() const { return dir_; }
  const DiskGeometry& geometry() const { return geometry_; }
  const std::vector<int>& fds() const { return fds_; }
  // Random id of this formatting of the directory; snapshots carry it.
  uint64_t tier_id() const { return tier_id_; }
  // True when the files existed with this geometry: their slots may hold blocks to recover.
  bool reused() const { return reused_; }
  // Why the files were reformatted; empty when they were not.
  const std::string& reformat_reason() const { return reformat_reason_; }
  // True when at least one file is sparse (fallocate refused or disabled).
  bool sparse() const { return sparse_; }
  bool locked_by_other() const { return locked_by_other_; }

  std::string FilePath(uint32_t file) const;
  std::string SnapshotPath() const;

  // fdatasync of every file: what was written is on stable storage. IOError naming the file.
  Status Sync() const;
  // fstat of every file. IOError when fstat itself fails.
  Result<std::vector<FileHealth>> Health() const;
  // Every file's identity now. IOError when fstat fails.
  Result<std::vector<FileIdentity>> Identities() const;
  // Every file's identity when Open found it, before anything (preallocation included) touched
  // it; empty when the files were created (not reused).
  const std::vector<FileIdentity>& identities_at_open() const { return identities_at_open_; }
  // Gives `file` its full size again after it was truncated, and rewrites its superblock when
  // the truncation reached it. FailedPrecondition when the file was deleted.
  Status Restore(uint32_t file);

 private:
  DiskFileSet() = default;
  Status Reserve(uint32_t file);
  Status WriteSuperblock(uint32_t file);

  std::string dir_;
  DiskGeometry geometry_;
  std::vector<int> fds_;
  int lock_fd_ = -1;
  uint64_t tier_id_ = 0;
  bool reused_ = false;
  bool sparse_ = false;
  bool preallocate_ = true;
  bool locked_by_other_ = false;
  std::string reformat_reason_;
  std::vector<FileIdentity> identities_at_open_;
};

}  // namespace kvtier

#include "tier/disk_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/log.h"
#include "core/regular_file.h"
#include "tier/block_format.h"

namespace kvtier {

namespace {

// A header area some block size has: a multiple of 4 KiB in 4 KiB..kMaxBlockHeaderBytes.
bool IsHeaderArea(uint64_t bytes) {
  return bytes >= kBlockHeaderBytes && bytes <= kMaxBlockHeaderBytes && bytes % 4096 == 0;
}

// "KVTG3SB1" read as a little-endian integer.
constexpr uint64_t kSuperblockMagic = 0x314253334754564bull;

struct Superblock {
  uint64_t magic;
  uint32_t version;
  uint32_t file_index;
  uint32_t num_files;
  uint32_t slots_per_file;
  uint64_t payload_bytes;
  uint64_t slot_stride;
  uint64_t layout_fingerprint;
  uint64_t tier_id;
  uint64_t created_unix_ns;
  uint8_t reserved[kSuperblockBytes - 72];
  uint64_t checksum;  // XXH3-64 of the bytes before it
};
static_assert(sizeof(Superblock) == kSuperblockBytes, "the superblock is one 4 KiB page");

uint64_t SuperblockChecksum(const Superblock& sb) {
  return XXH3_64bits(&sb, offsetof(Superblock, checksum));
}

struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes)
      : data(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes))), size(bytes) {
    std::memset(data, 0, bytes);
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uint8_t* data;
  size_t size;
};

std::string FileName(uint32_t file) {
  char name[32];
  std::snprintf(name, sizeof(name), "g3-%04u.kvt", file);
  return name;
}

bool IsSlotFileName(const std::string& name) {
  return name.size() == 11 && name.rfind("g3-", 0) == 0 && name.substr(7) == ".kvt";
}

uint64_t FreeBytes(const std::string& dir) {
  struct statvfs vfs;
  if (statvfs(dir.c_str(), &vfs) != 0) return 0;
  return uint64_t{vfs.f_bavail} * vfs.f_frsize;
}

uint64_t RandomId() {
  uint64_t id = 0;
  if (getrandom(&id, sizeof(id), 0) != sizeof(id) || id == 0) {
    id = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
         (uint64_t{static_cast<uint32_t>(getpid())} << 32) ^ 1;
  }
  return id;
}

// Reads and checks file `index`'s superblock. Corruption (with the reason) when it does not hold
// a valid one.
Result<Superblock> ReadSuperblock(int fd, const std::string& path) {
  AlignedBuffer buf(kSuperblockBytes);
  const ssize_t n = pread(fd, buf.data, kSuperblockBytes, 0);
  if (n < 0) return Status::FromErrno(errno, "reading the superblock of " + path);
  if (static_cast<uint64_t>(n) < kSuperblockBytes) {
    return Status::Corruption(path + ": file too short for a superblock");
  }
  Superblock sb;
  std::memcpy(&sb, buf.data, sizeof(sb));
  if (sb.magic != kSuperblockMagic) return Status::Corruption(path + ": not a kvtier slot file");
  if (SuperblockChecksum(sb) != sb.checksum) {
    return Status::Corruption(path + ": superblock checksum mismatch");
  }
  if (sb.version != kSlotFileFormatVersion) {
    return Status::Corruption(path + ": slot file format version " + std::to_string(sb.version) +
                              ", this build uses " + std::to_string(kSlotFileFormatVersion));
  }
  return sb;
}

DiskGeometry GeometryOf(const Superblock& sb) {
  DiskGeometry g;
  g.payload_bytes = sb.payload_bytes;
  g.slot_stride = sb.slot_stride;
  g.num_files = sb.num_files;
  g.slots_per_file = sb.slots_per_file;
  g.layout_fingerprint = sb.layout_fingerprint;
  return g;
}

// Opens a slot file with O_DIRECT; only a regular file is ever opened (core/regular_file.h), so
// a FIFO or a device named like a slot file is refused by what it is, never blamed on O_DIRECT.
// -1 with *status set on failure: InvalidArgument for a non-regular file or a filesystem that
// refuses O_DIRECT.
int OpenDirect(const std::string& path, int flags, Status* status) {
  Result<int> fd = OpenRegularFile(path, flags | O_DIRECT);
  if (!fd.ok()) {
    *status = fd.status();
    return -1;
  }
  return *fd;
}

}  // namespace

uint64_t DiskGeometry::Hash() const {
  const uint64_t fields[] = {payload_bytes, slot_stride, num_files, slots_per_file,
                             layout_fingerprint};
  return XXH3_64bits(fields, sizeof(fields));
}

std::string DiskGeometry::ToString() const {
  return std::to_string(num_slots()) + " slots of " + std::to_string(payload_bytes) +
         " payload bytes (stride " + std::to_string(slot_stride) + ") in " +
         std::to_string(num_files) + " file(s), layout " + std::to_string(layout_fingerprint);
}

Result<DiskGeometry> DiskGeometry::For(uint64_t capacity_bytes, uint64_t payload_bytes,
                                       uint64_t header_bytes, uint32_t num_files,
                                       uint64_t layout_fingerprint) {
  if (num_files < 1 || num_files > kMaxSlotFiles) {
    return Status::InvalidArgument("num_files " + std::to_string(num_files) + " outside 1.." +
                                   std::to_string(kMaxSlotFiles));
  }
  if (!IsHeaderArea(header_bytes)) {
    return Status::InvalidArgument("header area of " + std::to_string(header_bytes) +
                                   " bytes: must be a multiple of 4096 in 4096.." +
                                   std::to_string(kMaxBlockHeaderBytes));
  }
  DiskGeometry g;
  g.payload_bytes = payload_bytes;
  g.slot_stride = header_bytes + (payload_bytes + 4095) / 4096 * 4096;
  g.num_files = num_files;
  g.layout_fingerprint = layout_fingerprint;
  const uint64_t per_file = capacity_bytes / num_files;
  const uint64_t slots =
      per_file > kFirstSlotOffset ? (per_file - kFirstSlotOffset) / g.slot_stride : 0;
  if (slots < 1) {
    return Status::InvalidArgument("capacity_bytes " + std::to_string(capacity_bytes) +
                                   " holds no slot of " + std::to_string(g.slot_stride) +
                                   " bytes in each of " + std::to_string(num_files) + " file(s)");
  }
  if (slots * num_files >= (1ull << 31)) {
    return Status::InvalidArgument("capacity_bytes " + std::to_string(capacity_bytes) +
                                   " makes 2^31 or more slots; use larger blocks");
  }
  g.slots_per_file = static_cast<uint32_t>(slots);
  return g;
}

DiskFileSet::~DiskFileSet() {
  for (int fd : fds_) close(fd);
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
}

std::string DiskFileSet::FilePath(uint32_t file) const { return dir_ + "/" + FileName(file); }
std::string DiskFileSet::SnapshotPath() const { return dir_ + "/snapshot.kvt"; }

Status DiskFileSet::Reserve(uint32_t file) {
  const int fd = fds_[file];
  const uint64_t size = geometry_.file_bytes();
  if (preallocate_) {
    if (fallocate(fd, 0, 0, static_cast<off_t>(size)) == 0) return Status::Ok();
    const int err = errno;
    if (err == ENOSPC) {
      return Status::NoSpace("cannot reserve " + std::to_string(size) + " bytes for " +
                             FilePath(file) + ": the filesystem has " +
                             std::to_string(FreeBytes(dir_)) +
                             " bytes free; lower the G3 capacity or free space");
    }
    if (err != EOPNOTSUPP && err != ENOSYS)
      return Status::FromErrno(err, "fallocate " + FilePath(file));
    KVTIER_LOG(kWarn) << "the filesystem under " << dir_
                      << " does not support fallocate; G3 files are sparse, so space is not "
                         "reserved and writes may fail with ENOSPC later (counted; the tier "
                         "quarantines itself after repeated failures)";
  }
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::FromErrno(errno, "fstat " + FilePath(file));
  if (static_cast<uint64_t>(st.st_size) < size && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return Status::FromErrno(errno, "ftruncate " + FilePath(file));
  }
  sparse_ = true;
  return Status::Ok();
}

Status DiskFileSet::WriteSuperblock(uint32_t file) {
  AlignedBuffer buf(kFirstSlotOffset);  // superblock + a zeroed probe page
  Superblock sb;
  std::memset(&sb, 0, sizeof(sb));
  sb.magic = kSuperblockMagic;
  sb.version = kSlotFileFormatVersion;
  sb.file_index = file;
  sb.num_files = geometry_.num_files;
  sb.slots_per_file = geometry_.slots_per_file;
  sb.payload_bytes = geometry_.payload_bytes;
  sb.slot_stride = geometry_.slot_stride;
  sb.layout_fingerprint = geometry_.layout_fingerprint;
  sb.tier_id = tier_id_;
  sb.created_unix_ns = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch() /
                                             std::chrono::nanoseconds(1));
  sb.checksum = SuperblockChecksum(sb);
  std::memcpy(buf.data, &sb, sizeof(sb));
  const ssize_t n = pwrite(fds_[file], buf.data, buf.size, 0);
  if (n < 0) return Status::FromErrno(errno, "writing the superblock of " + FilePath(file));
  if (static_cast<size_t>(n) != buf.size) {
    return Status::IOError("short write of the superblock of " + FilePath(file));
  }
  if (fdatasync(fds_[file]) != 0) return Status::FromErrno(errno, "fdatasync " + FilePath(file));
  return Status::Ok();
}

Result<std::unique_ptr<DiskFileSet>> DiskFileSet::Open(const Options& options) {
  std::unique_ptr<DiskFileSet> set(new DiskFileSet());
  set->dir_ = options.dir;
  set->geometry_ = options.geometry;
  set->preallocate_ = options.preallocate;
  const std::string& dir = set->dir_;

  std::error_code ec;
  const bool existed = std::filesystem::exists(dir, ec);
  if (!existed) {
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::IOError("cannot create " + dir + ": " + ec.message());
    chmod(dir.c_str(), 0700);
  } else if (!std::filesystem::is_directory(dir, ec)) {
    return Status::InvalidArgument(dir + " exists and is not a directory");
  }

  Result<int> lock_fd = OpenRegularFile(dir + "/LOCK", O_RDWR | O_CREAT);
  if (!lock_fd.ok()) return lock_fd.status();
  set->lock_fd_ = *lock_fd;
  if (flock(set->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return Status::FailedPrecondition(dir + " is in use by another kvtier process (it holds " +
                                        dir + "/LOCK)");
    }
    return Status::FromErrno(errno, "flock " + dir + "/LOCK");
  }

  // Existing files: reuse them when every superblock matches the configured geometry.
  const DiskGeometry& g = set->geometry_;
  std::string mismatch;
  bool any_file = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (IsSlotFileName(entry.path().filename().string())) any_file = true;
  }
  if (any_file) {
    uint64_t tier_id = 0;
    for (uint32_t i = 0; i < g.num_files && mismatch.empty(); ++i) {
      Status st;
      const int fd = OpenDirect(set->FilePath(i), O_RDWR, &st);
      if (fd < 0) {
        if (st.code() == StatusCode::kInvalidArgument) return st;
        mismatch = st.message();
        break;
      }
      set->fds_.push_back(fd);
      auto sb = ReadSuperblock(fd, set->FilePath(i));
      if (!sb.ok()) {
        mismatch = sb.status().message();
      } else if (GeometryOf(*sb) != g || sb->file_index != i) {
        mismatch = set->FilePath(i) + " holds " + GeometryOf(*sb).ToString() + "; configured " +
                   g.ToString();
      } else if (i > 0 && sb->tier_id != tier_id) {
        mismatch = set->FilePath(i) + " belongs to another formatting of " + dir;
      }
      if (sb.ok()) tier_id = sb->tier_id;
    }
    if (mismatch.empty() && std::filesystem::exists(set->FilePath(g.num_files), ec)) {
      mismatch = "extra slot file " + set->FilePath(g.num_files);
    }
    if (mismatch.empty()) {
      set->tier_id_ = tier_id;
      set->reused_ = true;
      // As found, before Reserve (fallocate changes allocation and change time).
      KVTIER_ASSIGN_OR_RETURN(set->identities_at_open_, set->Identities());
      for (uint32_t i = 0; i < g.num_files; ++i) {
        // Idempotent; also restores a file that was truncated while the tier was down.
        KVTIER_RETURN_IF_ERROR(set->Reserve(i));
      }
      return set;
    }
    if (!options.reformat_on_mismatch) {
      return Status::FailedPrecondition(dir + " holds another G3 geometry (" + mismatch +
                                        "); use another directory or allow reformatting");
    }
    KVTIER_LOG(kWarn) << "reformatting " << dir << ", its blocks are dropped: " << mismatch;
    set->reformat_reason_ = mismatch;
    for (int fd : set->fds_) close(fd);
    set->fds_.clear();
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      if (IsSlotFileName(entry.path().filename().string())) std::filesystem::remove(entry, ec);
    }
    std::filesystem::remove(set->SnapshotPath(), ec);
  }

  set->tier_id_ = RandomId();
  Status failure;
  for (uint32_t i = 0; i < g.num_files && failure.ok(); ++i) {
    Status st;
    const int fd = OpenDirect(set->FilePath(i), O_RDWR | O_CREAT | O_EXCL, &st);
    if (fd < 0) {
      failure = st;
      break;
    }
    set->fds_.push_back(fd);
    failure = set->Reserve(i);
    if (failure.ok()) failure = set->WriteSuperblock(i);
  }
  if (!failure.ok()) {
    // Leave no half-built tier behind to hold the space.
    for (uint32_t i = 0; i < set->fds_.size(); ++i) unlink(set->FilePath(i).c_str());
    return failure;
  }
  return set;
}

Result<std::unique_ptr<DiskFileSet>> DiskFileSet::OpenReadOnly(const std::string& dir) {
  std::unique_ptr<DiskFileSet> set(new DiskFileSet());
  set->dir_ = dir;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return Status::NotFound(dir + " is not a directory");
  // No LOCK file: no tier ever ran here (or it was removed); inspect without the lock.
  Result<int> lock_fd = OpenRegularFile(dir + "/LOCK", O_RDONLY);
  if (lock_fd.ok()) {
    set->lock_fd_ = *lock_fd;
    if (flock(set->lock_fd_, LOCK_SH | LOCK_NB) != 0) set->locked_by_other_ = true;
  } else if (!lock_fd.status().Is(StatusCode::kNotFound)) {
    return lock_fd.status();
  }
  if (!std::filesystem::exists(set->FilePath(0), ec)) {
    return Status::NotFound("no G3 slot files in " + dir);
  }
  Status st;
  const int fd0 = OpenDirect(set->FilePath(0), O_RDONLY, &st);
  if (fd0 < 0) return st;
  set->fds_.push_back(fd0);
  KVTIER_ASSIGN_OR_RETURN(Superblock sb0, ReadSuperblock(fd0, set->FilePath(0)));
  set->geometry_ = GeometryOf(sb0);
  set->tier_id_ = sb0.tier_id;
  const DiskGeometry& g = set->geometry_;
  if (g.num_files < 1 || g.num_files > kMaxSlotFiles || g.slots_per_file < 1 ||
      g.slot_stride % 4096 != 0 || g.slot_stride <= g.payload_bytes ||
      !IsHeaderArea(g.header_bytes()) || g.payload_bytes > KvLayout::kMaxBlockBytes) {
    return Status::Corruption(set->FilePath(0) +
                              ": superblock geometry out of range: " + g.ToString());
  }
  for (uint32_t i = 1; i < g.num_files; ++i) {
    const int fd = OpenDirect(set->FilePath(i), O_RDONLY, &st);
    if (fd < 0 && st.Is(StatusCode::kNotFound)) {
      return Status::Corruption("missing slot file " + set->FilePath(i) + " (the superblock of " +
                                set->FilePath(0) + " names " + std::to_string(g.num_files) +
                                " files)");
    }
    if (fd < 0) return st;
    set->fds_.push_back(fd);
    KVTIER_ASSIGN_OR_RETURN(Superblock sb, ReadSuperblock(fd, set->FilePath(i)));
    if (GeometryOf(sb) != g || sb.tier_id != sb0.tier_id || sb.file_index != i) {
      return Status::Corruption(set->FilePath(i) + " does not belong with " + set->FilePath(0));
    }
  }
  set->reused_ = true;
  return set;
}

Status DiskFileSet::Sync() const {
  for (uint32_t i = 0; i < fds_.size(); ++i) {
    if (fdatasync(fds_[i]) != 0) return Status::FromErrno(errno, "fdatasync " + FilePath(i));
  }
  return Status::Ok();
}

Result<std::vector<FileHealth>> DiskFileSet::Health() const {
  std::vector<FileHealth> out;
  for (uint32_t i = 0; i < fds_.size(); ++i) {
    struct stat st;
    if (fstat(fds_[i], &st) != 0) return Status::FromErrno(errno, "fstat " + FilePath(i));
    out.push_back(FileHealth{st.st_nlink == 0, static_cast<uint64_t>(st.st_size)});
  }
  return out;
}

Result<std::vector<FileIdentity>> DiskFileSet::Identities() const {
  std::vector<FileIdentity> out;
  for (uint32_t i = 0; i < fds_.size(); ++i) {
    struct stat st;
    if (fstat(fds_[i], &st) != 0) return Status::FromErrno(errno, "fstat " + FilePath(i));
    out.push_back(
        FileIdentity{static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
                     static_cast<uint64_t>(st.st_blocks) * 512,
                     static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec});
  }
  return out;
}

Status DiskFileSet::Restore(uint32_t file) {
  struct stat st;
  if (fstat(fds_[file], &st) != 0) return Status::FromErrno(errno, "fstat " + FilePath(file));
  if (st.st_nlink == 0) {
    return Status::FailedPrecondition(FilePath(file) +
                                      " was deleted; restart to recreate the G3 files");
  }
  KVTIER_RETURN_IF_ERROR(Reserve(file));
  if (static_cast<uint64_t>(st.st_size) < kFirstSlotOffset) return WriteSuperblock(file);
  return Status::Ok();
}

}  // namespace kvtier

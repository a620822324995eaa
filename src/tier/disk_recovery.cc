#include "tier/disk_recovery.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unordered_map>
#include <unordered_set>

#include "core/regular_file.h"

namespace kvtier {

namespace {

constexpr size_t kMaxProblems = 16;

// ---- scan ----

struct ScanBuffer {
  uint8_t* data = nullptr;
  uint32_t slot = 0;
};

void NoteProblem(ScanReport* report, uint32_t slot, const std::string& what) {
  if (report->problems.size() < kMaxProblems) {
    report->problems.push_back("slot " + std::to_string(slot) + ": " + what);
  }
}

// ---- snapshot ----

// "KVTSNAP1" read as a little-endian integer.
constexpr uint64_t kSnapshotMagic = 0x3150414e5354564bull;
// Version 2 added the file records (FileIdentity of each slot file). A version 1 snapshot is
// refused (the tier scans, once).
constexpr uint32_t kSnapshotVersion = 2;

// Layout: header, file_count file records, entry_count entries (each followed by its token
// ids), then the XXH3-64 of everything before it.
struct SnapshotHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t file_count;
  uint64_t tier_id;
  uint64_t geometry_hash;
  uint64_t next_generation;
  uint64_t entry_count;
};
static_assert(sizeof(SnapshotHeader) == 48);

struct SnapshotFile {
  uint64_t inode;
  uint64_t size;
  uint64_t allocated_bytes;
  int64_t ctime_ns;
};
static_assert(sizeof(SnapshotFile) == 32);

struct SnapshotEntry {
  uint32_t slot;
  uint32_t token_count;
  uint64_t generation;
  uint64_t key_hi, key_lo;
  uint64_t parent_hi, parent_lo;
  uint64_t namespace_id;
  // followed by token_count uint32 token ids
};
static_assert(sizeof(SnapshotEntry) == 56);

void Append(std::string* out, const void* p, size_t n) {
  if (n > 0) out->append(static_cast<const char*>(p), n);
}

Status SyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + dir);
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return Status::FromErrno(err, "fsync " + dir);
  return Status::Ok();
}

std::string DirOf(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

Result<ScanReport> ScanSlots(DiskIo* io, const DiskGeometry& g, bool verify_payload,
                             const std::vector<bool>& files, const ScanProgress& progress) {
  ScanReport report;
  const uint32_t depth = io->queue_depth();
  const uint64_t read_bytes = verify_payload ? g.slot_stride : g.header_bytes();
  auto* pool = static_cast<uint8_t*>(std::aligned_alloc(4096, depth * read_bytes));
  if (pool == nullptr) return Status::NoSpace("no memory for scan buffers");
  std::vector<ScanBuffer> buffers(depth);
  std::vector<uint32_t> idle;
  for (uint32_t i = 0; i < depth; ++i) {
    buffers[i].data = pool + uint64_t{i} * read_bytes;
    idle.push_back(i);
  }
  std::unordered_map<BlockKey, size_t, BlockKeyHash> by_key;
  std::vector<IoCompletion> done;
  DecodedBlockHeader header;
  std::string why;  // DecodeBlockHeader's, for the report (one buffer for the whole scan)
  uint32_t next = 0;
  uint32_t in_flight = 0;
  uint64_t reported = 0;  // slots_scanned at the last progress call
  Status failure;

  auto examine = [&](uint32_t slot, const uint8_t* data, uint64_t got) {
    ++report.slots_scanned;
    why.clear();
    BlockCheck check = DecodeBlockHeader({data, got}, &header, &why);
    if (check == BlockCheck::kEmpty) {
      ++report.empty;
      return;
    }
    if (check == BlockCheck::kOk) {
      if (header.fields.slot_index != slot) {
        check = BlockCheck::kWrongSlot;
      } else if (header.fields.layout_fingerprint != g.layout_fingerprint ||
                 header.header_bytes != g.header_bytes()) {
        check = BlockCheck::kWrongLayout;
      } else if (header.payload_bytes != g.payload_bytes) {
        check = BlockCheck::kWrongPayloadLength;
      } else if (verify_payload) {
        ExpectedBlock e;
        e.layout_fingerprint = g.layout_fingerprint;
        e.namespace_id = header.fields.namespace_id;
        e.key = header.fields.key;
        e.payload_bytes = g.payload_bytes;
        e.header_bytes = g.header_bytes();
        check = VerifyBlock({data, got}, e);
      }
    }
    if (check != BlockCheck::kOk) {
      ++report.corrupt;
      ++report.by_check[static_cast<size_t>(check)];
      NoteProblem(&report, slot,
                  check == BlockCheck::kBadHeader && !why.empty()
                      ? std::string(BlockCheckName(check)) + " (" + why + ")"
                      : std::string(BlockCheckName(check)));
      return;
    }
    report.max_generation = std::max(report.max_generation, header.fields.write_generation);
    ++report.by_version[header.format_version];
    RecoveredBlock b;
    b.key = header.fields.key;
    b.parent = header.fields.parent;
    b.namespace_id = header.fields.namespace_id;
    b.slot = slot;
    b.generation = header.fields.write_generation;
    b.tokens.assign(header.tokens.begin(), header.tokens.begin() + header.token_count);
    auto [it, inserted] = by_key.try_emplace(b.key, report.blocks.size());
    if (inserted) {
      report.blocks.push_back(std::move(b));
    } else {
      ++report.duplicates;
      if (report.blocks[it->second].generation < b.generation) {
        report.blocks[it->second] = std::move(b);
      }
    }
  };

  // The next slot to read, past those of files not asked for.
  auto skip = [&] {
    while (next < g.num_slots() && !files.empty() && !files[g.FileOf(next)]) ++next;
  };
  skip();
  while (next < g.num_slots() || in_flight > 0) {
    while (next < g.num_slots() && !idle.empty()) {
      const uint32_t b = idle.back();
      idle.pop_back();
      buffers[b].slot = next;
      io->Queue(IoRequest{IoKind::kRead, g.FileOf(next), g.OffsetOf(next), buffers[b].data,
                          static_cast<uint32_t>(read_bytes), b});
      ++next;
      ++in_flight;
      skip();
    }
    done.clear();
    auto polled = io->Poll(-1, &done);
    if (!polled.ok()) {
      failure = polled.status();
      break;
    }
    for (const IoCompletion& c : done) {
      const uint32_t b = static_cast<uint32_t>(c.tag);
      --in_flight;
      idle.push_back(b);
      if (c.result < 0 || static_cast<uint64_t>(c.result) < read_bytes) {
        ++report.slots_scanned;
        ++report.read_errors;
        NoteProblem(&report, buffers[b].slot,
                    c.result < 0 ? std::string("read error: ") + std::strerror(-c.result)
                                 : "short read of " + std::to_string(c.result) + " bytes");
        continue;
      }
      examine(buffers[b].slot, buffers[b].data, read_bytes);
    }
    if (progress && report.slots_scanned - reported >= 4096) {
      reported = report.slots_scanned;
      progress(reported, g.num_slots());
    }
  }
  if (progress) progress(report.slots_scanned, g.num_slots());
  std::free(pool);
  if (!failure.ok()) return failure;
  return report;
}

Status WriteSnapshot(const std::string& path, const Snapshot& snapshot) {
  std::string out;
  SnapshotHeader h{};
  h.magic = kSnapshotMagic;
  h.version = kSnapshotVersion;
  h.tier_id = snapshot.tier_id;
  h.geometry_hash = snapshot.geometry_hash;
  h.next_generation = snapshot.next_generation;
  h.file_count = static_cast<uint32_t>(snapshot.files.size());
  h.entry_count = snapshot.blocks.size();
  Append(&out, &h, sizeof(h));
  for (const FileIdentity& f : snapshot.files) {
    const SnapshotFile r{f.inode, f.size, f.allocated_bytes, f.ctime_ns};
    Append(&out, &r, sizeof(r));
  }
  for (const RecoveredBlock& b : snapshot.blocks) {
    SnapshotEntry e{};
    e.slot = b.slot;
    e.token_count = static_cast<uint32_t>(b.tokens.size());
    e.generation = b.generation;
    e.key_hi = b.key.hi;
    e.key_lo = b.key.lo;
    e.parent_hi = b.parent.hi;
    e.parent_lo = b.parent.lo;
    e.namespace_id = b.namespace_id;
    Append(&out, &e, sizeof(e));
    Append(&out, b.tokens.data(), b.tokens.size() * sizeof(TokenId));
  }
  const uint64_t sum = XXH3_64bits(out.data(), out.size());
  Append(&out, &sum, sizeof(sum));

  // A fresh file: whatever was left under the temporary name (a crashed writer's file, or
  // something else entirely, such as a FIFO that would block the open) is removed first.
  const std::string tmp = path + ".tmp";
  if (unlink(tmp.c_str()) != 0 && errno != ENOENT) return Status::FromErrno(errno, "unlink " + tmp);
  Result<int> opened = OpenRegularFile(tmp, O_WRONLY | O_CREAT | O_EXCL);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  size_t written = 0;
  while (written < out.size()) {
    const ssize_t n = write(fd, out.data() + written, out.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return Status::FromErrno(err, "write " + tmp);
    }
    written += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    const int err = errno;
    close(fd);
    unlink(tmp.c_str());
    return Status::FromErrno(err, "fsync " + tmp);
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return Status::FromErrno(err, "rename " + tmp);
  }
  return SyncDir(DirOf(path));
}

Result<Snapshot> ReadSnapshot(const std::string& path, uint32_t num_slots) {
  Result<int> opened = OpenRegularFile(path, O_RDONLY);
  if (!opened.ok()) {
    if (opened.status().Is(StatusCode::kNotFound))
      return Status::NotFound("no snapshot at " + path);
    // Not a regular file (a FIFO would block a plain open forever): not a snapshot.
    if (opened.status().Is(StatusCode::kInvalidArgument)) {
      return Status::Corruption(opened.status().message());
    }
    return opened.status();
  }
  const int fd = *opened;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return Status::FromErrno(err, "fstat " + path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t max_size = sizeof(SnapshotHeader) + 8 + kMaxSlotFiles * sizeof(SnapshotFile) +
                            uint64_t{num_slots} * (sizeof(SnapshotEntry) +
                                                   KvLayout::kMaxTokensPerBlock * sizeof(TokenId));
  if (size < sizeof(SnapshotHeader) + 8 || size > max_size) {
    close(fd);
    return Status::Corruption(path + ": size " + std::to_string(size) + " out of range");
  }
  std::string data(size, '\0');
  size_t got = 0;
  while (got < size) {
    const ssize_t n = read(fd, data.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      close(fd);
      return Status::FromErrno(err, "read " + path);
    }
    got += static_cast<size_t>(n);
  }
  close(fd);

  uint64_t sum;
  std::memcpy(&sum, data.data() + size - 8, 8);
  if (XXH3_64bits(data.data(), size - 8) != sum) {
    return Status::Corruption(path + ": checksum mismatch");
  }
  SnapshotHeader h;
  std::memcpy(&h, data.data(), sizeof(h));
  if (h.magic != kSnapshotMagic || h.version != kSnapshotVersion) {
    return Status::Corruption(path + ": not a snapshot of this version");
  }
  if (h.entry_count > num_slots) {
    return Status::Corruption(path + ": " + std::to_string(h.entry_count) + " entries for " +
                              std::to_string(num_slots) + " slots");
  }
  if (h.file_count > kMaxSlotFiles) {
    return Status::Corruption(path + ": " + std::to_string(h.file_count) +
                              " file records (at most " + std::to_string(kMaxSlotFiles) + ")");
  }
  Snapshot s;
  s.tier_id = h.tier_id;
  s.geometry_hash = h.geometry_hash;
  s.next_generation = h.next_generation;
  size_t pos = sizeof(h);
  const size_t end = size - 8;
  if (end - pos < uint64_t{h.file_count} * sizeof(SnapshotFile)) {
    return Status::Corruption(path + ": truncated file records");
  }
  for (uint32_t i = 0; i < h.file_count; ++i) {
    SnapshotFile r;
    std::memcpy(&r, data.data() + pos, sizeof(r));
    pos += sizeof(r);
    s.files.push_back(FileIdentity{r.inode, r.size, r.allocated_bytes, r.ctime_ns});
  }
  s.blocks.reserve(h.entry_count);
  std::vector<bool> seen_slot(num_slots, false);
  std::unordered_set<BlockKey, BlockKeyHash> seen_key;
  for (uint64_t i = 0; i < h.entry_count; ++i) {
    if (end - pos < sizeof(SnapshotEntry)) return Status::Corruption(path + ": truncated entry");
    SnapshotEntry e;
    std::memcpy(&e, data.data() + pos, sizeof(e));
    pos += sizeof(e);
    if (e.slot >= num_slots || seen_slot[e.slot]) {
      return Status::Corruption(path + ": bad or repeated slot " + std::to_string(e.slot));
    }
    if (e.token_count > KvLayout::kMaxTokensPerBlock ||
        end - pos < uint64_t{e.token_count} * sizeof(TokenId)) {
      return Status::Corruption(path + ": bad token count " + std::to_string(e.token_count));
    }
    RecoveredBlock b;
    b.slot = e.slot;
    b.generation = e.generation;
    b.key = BlockKey{e.key_hi, e.key_lo};
    b.parent = BlockKey{e.parent_hi, e.parent_lo};
    b.namespace_id = e.namespace_id;
    if (!seen_key.insert(b.key).second) {
      return Status::Corruption(path + ": key " + b.key.ToHex() + " listed twice");
    }
    b.tokens.resize(e.token_count);
    if (e.token_count > 0) {
      std::memcpy(b.tokens.data(), data.data() + pos, e.token_count * sizeof(TokenId));
    }
    pos += e.token_count * sizeof(TokenId);
    seen_slot[e.slot] = true;
    s.blocks.push_back(std::move(b));
  }
  if (pos != end) return Status::Corruption(path + ": trailing bytes");
  return s;
}

Status RemoveSnapshot(const std::string& path) {
  if (unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::FromErrno(errno, "unlink " + path);
  }
  return SyncDir(DirOf(path));
}

}  // namespace kvtier

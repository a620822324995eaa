// FsStore: the shared-filesystem G4 backend (OpenFsStore in remote_store.h).
//
// Layout: dir/<2 hex>/<object name>. The two hex digits are the first two of the block key for
// names RemoteObjectName makes (uniform, so 256 directories of similar size), and an FNV-1a
// byte of the name for any other name. Object names never start with '.', temporary files
// always do, so a reader can never open a half-written file by name.
//
// Publication is atomic: a put writes ".tmp.<name>.<pid>.<tid>.<n>" in the object's own
// directory (same filesystem, so rename is atomic on POSIX filesystems and on NFS), closes it
// (NFS reports deferred write errors at close), then renames it over the name. A reader opens
// the name and holds that inode, so a concurrent replace never tears what it reads. Nothing is
// fsync'ed: a crash can leave a torn object or a stale temporary file. Torn objects fail
// VerifyBlock at the caller (a miss); stale temporaries are never opened (their names differ)
// and are removed by OpenFsStore when older than kStaleTempAge.
//
// Deadlines: checked before every item; an item that has started runs to the end of its
// syscalls, because a blocking read/write on a local or network filesystem cannot be cancelled
// (a hard-mounted NFS server that stops answering can hold one call past the deadline; mount
// with "soft,timeo=" to bound that). Items left when the deadline passes fail with TimedOut
// without touching the filesystem. A call held past its deadline does not hold the engine: the
// transfer engine's watchdog ends the load at its deadline and discards the call's late result
// (transfer_engine.h). Objects are opened with O_NONBLOCK and checked with fstat (only a
// regular file is read; core/regular_file.h), so a FIFO or a device put under an object name
// is refused at once instead of blocking open(2) or never ending a read.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "core/log.h"
#include "core/regular_file.h"
#include "tier/circuit_breaker.h"
#include "tier/piece_cursor.h"
#include "tier/remote_store.h"

namespace kvtier {

namespace {

// Temporary files older than this are a crashed writer's; OpenFsStore removes them.
constexpr auto kStaleTempAge = std::chrono::minutes(10);
constexpr size_t kMaxNameBytes = 200;
constexpr char kHex[] = "0123456789abcdef";
// The most pieces one preadv takes (the kernel refuses more than IOV_MAX).
constexpr int kMaxReadIov = 1024;

bool IsHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// The fan-out directory of `name` (see the file comment).
std::string FanOut(const std::string& name) {
  // "kvt1:" + 16 hex + ":" + 32 hex: the key starts at 22.
  if (name.size() == 54 && name.compare(0, 5, "kvt1:") == 0 && name[21] == ':' && IsHex(name[22]) &&
      IsHex(name[23])) {
    return name.substr(22, 2);
  }
  uint32_t h = 2166136261u;
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  const uint8_t b = static_cast<uint8_t>(h ^ (h >> 8) ^ (h >> 16) ^ (h >> 24));
  return std::string{kHex[b >> 4], kHex[b & 0xf]};
}

// InvalidArgument unless `name` can be a file name of this store.
Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameBytes || name[0] == '.' ||
      name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
    return Status::InvalidArgument("fs store: object name '" + name + "' is not usable (1.." +
                                   std::to_string(kMaxNameBytes) +
                                   " bytes, no '/', not starting with '.')");
  }
  return Status::Ok();
}

// Errors that say the filesystem (not one object) is in trouble; they trip the breaker.
Status Errno(int err, const std::string& what) {
  return Status::IOError(what + ": " + std::strerror(err));
}

// Reads `size` bytes of `fd` from offset 0 into `pieces`, in order, with preadv of at most
// kMaxReadIov pieces each. Returns the bytes read: fewer than `size` when the file ended first
// (truncated underneath). REQUIRES: size <= the pieces' total.
Result<uint64_t> ReadIntoPieces(int fd, std::span<const std::span<uint8_t>> pieces, uint64_t size,
                                const std::string& path) {
  uint64_t done = 0;
  PieceCursor at;  // where byte `done` goes
  while (done < size) {
    iovec iov[kMaxReadIov];
    const ssize_t r =
        ::preadv(fd, iov, at.ToIovecs(pieces, size - done, iov), static_cast<off_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno(errno, "fs store: read " + path);
    }
    if (r == 0) break;  // shorter than fstat said (truncated underneath): verification decides
    done += static_cast<uint64_t>(r);
    at.Advance(pieces, static_cast<uint64_t>(r));
  }
  return done;
}

Status WriteAll(int fd, const uint8_t* data, uint64_t n, const std::string& path) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, data + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno(errno, "fs store: write " + path);
    }
    if (w == 0) return Status::IOError("fs store: write " + path + " wrote nothing");
    done += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

class FsStore final : public RemoteStore {
 public:
  FsStore(std::string dir, const CircuitBreakerOptions& breaker)
      : dir_(std::move(dir)), breaker_(breaker) {}

  void Put(std::span<const RemotePut> items, RemoteDeadline deadline,
           std::span<Status> results) override {
    for (size_t i = 0; i < items.size(); ++i) {
      bool probe = false;
      Status s = Admit(deadline, &probe);
      if (s.ok()) {
        s = PutOne(items[i]);
        Record(s, probe);
      }
      puts_.fetch_add(1, std::memory_order_relaxed);
      if (s.ok()) {
        put_bytes_.fetch_add(items[i].bytes.size(), std::memory_order_relaxed);
      } else {
        put_failures_.fetch_add(1, std::memory_order_relaxed);
      }
      results[i] = std::move(s);
    }
  }

  void Get(std::span<RemoteGet> items, RemoteDeadline deadline,
           std::span<Status> results) override {
    for (size_t i = 0; i < items.size(); ++i) {
      items[i].bytes_read = 0;
      bool probe = false;
      Status s = Admit(deadline, &probe);
      if (s.ok()) {
        s = GetOne(items[i]);
        Record(s, probe);
      }
      gets_.fetch_add(1, std::memory_order_relaxed);
      if (s.ok()) {
        get_hits_.fetch_add(1, std::memory_order_relaxed);
        get_bytes_.fetch_add(items[i].bytes_read, std::memory_order_relaxed);
      } else if (s.Is(StatusCode::kNotFound)) {
        get_misses_.fetch_add(1, std::memory_order_relaxed);
      } else {
        get_failures_.fetch_add(1, std::memory_order_relaxed);
      }
      results[i] = std::move(s);
    }
  }

  Status Contains(std::span<const std::string> names, RemoteDeadline deadline,
                  std::span<uint8_t> present) override {
    std::fill(present.begin(), present.end(), uint8_t{0});
    bool probe = false;
    KVTIER_RETURN_IF_ERROR(Admit(deadline, &probe));
    std::vector<uint8_t> found(names.size(), 0);
    for (size_t i = 0; i < names.size(); ++i) {
      if (RemoteClock::now() >= deadline) {
        timeouts_.fetch_add(1, std::memory_order_relaxed);
        Record(Status::Ok(), probe);  // the filesystem answered; we ran out of time
        return Status::TimedOut("fs store: Contains passed its deadline after " +
                                std::to_string(i) + " of " + std::to_string(names.size()));
      }
      Status name_ok = CheckName(names[i]);
      if (!name_ok.ok()) {
        Record(Status::Ok(), probe);
        return name_ok;
      }
      struct stat st;
      if (::stat(PathOf(names[i]).c_str(), &st) == 0) {
        found[i] = S_ISREG(st.st_mode) ? 1 : 0;
      } else if (errno != ENOENT) {
        Status s = Errno(errno, "fs store: stat " + PathOf(names[i]));
        Record(s, probe);
        return s;
      }
    }
    Record(Status::Ok(), probe);
    std::copy(found.begin(), found.end(), present.begin());
    return Status::Ok();
  }

  Status Remove(std::span<const std::string> names, RemoteDeadline deadline) override {
    bool probe = false;
    KVTIER_RETURN_IF_ERROR(Admit(deadline, &probe));
    for (const std::string& name : names) {
      if (RemoteClock::now() >= deadline) {
        timeouts_.fetch_add(1, std::memory_order_relaxed);
        Record(Status::Ok(), probe);
        return Status::TimedOut("fs store: Remove passed its deadline");
      }
      Status name_ok = CheckName(name);
      if (!name_ok.ok()) {
        Record(Status::Ok(), probe);
        return name_ok;
      }
      if (::unlink(PathOf(name).c_str()) != 0 && errno != ENOENT) {
        Status s = Errno(errno, "fs store: unlink " + PathOf(name));
        Record(s, probe);
        return s;
      }
    }
    Record(Status::Ok(), probe);
    return Status::Ok();
  }

  std::string Describe() const override { return "fs:" + dir_; }

  RemoteStoreStats Stats() const override {
    RemoteStoreStats s;
    s.puts = puts_.load(std::memory_order_relaxed);
    s.put_bytes = put_bytes_.load(std::memory_order_relaxed);
    s.put_failures = put_failures_.load(std::memory_order_relaxed);
    s.gets = gets_.load(std::memory_order_relaxed);
    s.get_hits = get_hits_.load(std::memory_order_relaxed);
    s.get_misses = get_misses_.load(std::memory_order_relaxed);
    s.get_bytes = get_bytes_.load(std::memory_order_relaxed);
    s.get_failures = get_failures_.load(std::memory_order_relaxed);
    s.timeouts = timeouts_.load(std::memory_order_relaxed);
    s.breaker_rejections = rejections_.load(std::memory_order_relaxed);
    s.breaker_opens = breaker_.opens();
    s.breaker_open = breaker_.IsOpen();
    return s;
  }

  // Creates the fan-out directories, checks that the directory takes writes, removes stale
  // temporary files.
  // KV is private (a prompt can be read back from its KV): directories are 0700 and objects
  // 0600, and directories an older kvtier made 0755 are closed again when they are this uid's.
  Status Init() {
    if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) {
      return Errno(errno, "fs store: cannot create directory " + dir_);
    }
    struct stat st;
    if (::stat(dir_.c_str(), &st) != 0) return Errno(errno, "fs store: stat " + dir_);
    if (!S_ISDIR(st.st_mode)) {
      return Status::InvalidArgument("fs store: " + dir_ +
                                     " is not a directory; give g4.dir a directory");
    }
    if (st.st_uid == ::geteuid() && (st.st_mode & 077) != 0) ::chmod(dir_.c_str(), 0700);
    for (int b = 0; b < 256; ++b) {
      const std::string sub = dir_ + "/" + kHex[b >> 4] + kHex[b & 0xf];
      if (::mkdir(sub.c_str(), 0700) != 0 && errno != EEXIST) {
        return Errno(errno, "fs store: cannot create directory " + sub);
      }
      struct stat sst;
      if (::lstat(sub.c_str(), &sst) == 0 && sst.st_uid == ::geteuid() && (sst.st_mode & 077)) {
        ::chmod(sub.c_str(), 0700);
      }
    }
    // A directory that refuses writes is refused now, not at the first put.
    const std::string probe = dir_ + "/" + TempName("probe");
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return Errno(errno, "fs store: cannot write in " + dir_);
    ::close(fd);
    ::unlink(probe.c_str());
    RemoveStaleTemps();
    return Status::Ok();
  }

 private:
  std::string PathOf(const std::string& name) const {
    return dir_ + "/" + FanOut(name) + "/" + name;
  }
  std::string TempName(const std::string& name) {
    return ".tmp." + name + "." + std::to_string(::getpid()) + "." +
           std::to_string(static_cast<long>(::syscall(SYS_gettid))) + "." +
           std::to_string(temp_counter_.fetch_add(1, std::memory_order_relaxed));
  }

  // Ok when a call may go ahead; TimedOut past the deadline; Unavailable while the breaker is
  // open.
  Status Admit(RemoteDeadline deadline, bool* probe) {
    if (RemoteClock::now() >= deadline) {
      timeouts_.fetch_add(1, std::memory_order_relaxed);
      return Status::TimedOut("fs store " + dir_ + ": the deadline passed before the call");
    }
    const CircuitBreaker::Decision d = breaker_.Admit();
    *probe = d == CircuitBreaker::Decision::kProbe;
    if (d == CircuitBreaker::Decision::kReject) {
      rejections_.fetch_add(1, std::memory_order_relaxed);
      return Status::Unavailable("fs store " + dir_ +
                                 ": circuit breaker open after repeated I/O errors");
    }
    return Status::Ok();
  }
  // Feeds the breaker: a miss or a corrupt object is the filesystem working.
  void Record(const Status& s, bool probe) {
    if (s.ok() || s.Is(StatusCode::kNotFound) || s.Is(StatusCode::kCorruption) ||
        s.Is(StatusCode::kInvalidArgument)) {
      breaker_.OnSuccess(probe);
    } else {
      breaker_.OnFailure(probe);
    }
  }

  Status PutOne(const RemotePut& item) {
    KVTIER_RETURN_IF_ERROR(CheckName(item.name));
    const std::string sub = dir_ + "/" + FanOut(item.name);
    const std::string tmp = sub + "/" + TempName(item.name);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ENOENT) {
      // The fan-out directory was removed underneath (an operator cleaning up): recreate it.
      if (::mkdir(sub.c_str(), 0700) == 0 || errno == EEXIST) {
        fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      }
    }
    if (fd < 0) return Errno(errno, "fs store: create " + tmp);
    Status s = WriteAll(fd, item.bytes.data(), item.bytes.size(), tmp);
    if (::close(fd) != 0 && s.ok()) s = Errno(errno, "fs store: close " + tmp);
    if (s.ok() && ::rename(tmp.c_str(), PathOf(item.name).c_str()) != 0) {
      s = Errno(errno, "fs store: rename into " + PathOf(item.name));
    }
    if (!s.ok()) ::unlink(tmp.c_str());
    return s;
  }

  Status GetOne(RemoteGet& item) {
    KVTIER_RETURN_IF_ERROR(CheckName(item.name));
    const std::string path = PathOf(item.name);
    // Only a regular file is read: a FIFO put under the name (between a Contains and this
    // Get) would block a plain open() forever, a device would never end (regular_file.h).
    Result<int> opened = OpenRegularFile(path, O_RDONLY);
    if (!opened.ok()) {
      if (opened.status().Is(StatusCode::kNotFound)) {
        return Status::NotFound("fs store: no object " + item.name);
      }
      if (opened.status().Is(StatusCode::kInvalidArgument)) {
        // Someone else's doing, not the filesystem failing: a bad object, like a corrupt one.
        return Status::Corruption("fs store: " + opened.status().message());
      }
      return Status::IOError("fs store: " + opened.status().message());
    }
    const int fd = *opened;
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return Errno(err, "fs store: fstat " + path);
    }
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    const uint64_t capacity = item.Capacity();
    if (size > capacity) {
      ::close(fd);
      return Status::Corruption("fs store: object " + path + " holds " + std::to_string(size) +
                                " bytes, more than the " + std::to_string(capacity) + "-byte " +
                                (item.pieces.empty() ? "destination" : "pieces") + "; not read");
    }
    // A contiguous dest is read as one piece. At most `size` bytes are read (<= capacity), even
    // if the file grew after the fstat.
    const std::span<uint8_t> whole[1] = {item.dest};
    Result<uint64_t> done =
        ReadIntoPieces(fd,
                       item.pieces.empty() ? std::span<const std::span<uint8_t>>(whole)
                                           : std::span<const std::span<uint8_t>>(item.pieces),
                       size, path);
    ::close(fd);
    KVTIER_RETURN_IF_ERROR(done.status());
    item.bytes_read = *done;
    if (item.on_landed) {
      // After the read, in order (a file's bytes are not hot the way a socket's are).
      uint64_t offset = 0;
      for (const std::span<uint8_t>& p : item.pieces.empty()
                                             ? std::span<const std::span<uint8_t>>(whole)
                                             : std::span<const std::span<uint8_t>>(item.pieces)) {
        if (offset >= item.bytes_read) break;
        const uint64_t take = std::min<uint64_t>(p.size(), item.bytes_read - offset);
        if (take > 0) item.on_landed(offset, std::span<const uint8_t>(p.data(), take));
        offset += take;
      }
    }
    return Status::Ok();
  }

  void RemoveStaleTemps() {
    const auto now = std::chrono::system_clock::now();
    for (int b = 0; b < 256; ++b) {
      const std::string sub = dir_ + "/" + kHex[b >> 4] + kHex[b & 0xf];
      DIR* d = ::opendir(sub.c_str());
      if (d == nullptr) continue;
      while (dirent* e = ::readdir(d)) {
        if (std::strncmp(e->d_name, ".tmp.", 5) != 0) continue;
        const std::string path = sub + "/" + e->d_name;
        struct stat st;
        if (::stat(path.c_str(), &st) != 0) continue;
        const auto mtime = std::chrono::system_clock::from_time_t(st.st_mtime);
        if (now - mtime > kStaleTempAge) ::unlink(path.c_str());
      }
      ::closedir(d);
    }
  }

  const std::string dir_;
  CircuitBreaker breaker_;
  std::atomic<uint64_t> temp_counter_{0};
  std::atomic<uint64_t> puts_{0}, put_bytes_{0}, put_failures_{0};
  std::atomic<uint64_t> gets_{0}, get_hits_{0}, get_misses_{0}, get_bytes_{0}, get_failures_{0};
  std::atomic<uint64_t> timeouts_{0}, rejections_{0};
};

}  // namespace

Result<std::unique_ptr<RemoteStore>> OpenFsStore(const FsStoreOptions& options) {
  if (options.dir.empty()) {
    return Status::InvalidArgument("fs store: the directory is empty; set g4.dir");
  }
  KVTIER_RETURN_IF_ERROR(CircuitBreaker::Validate(options.breaker));
  auto store = std::make_unique<FsStore>(options.dir, options.breaker);
  KVTIER_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<RemoteStore>(std::move(store));
}

}  // namespace kvtier

// The io_uring and thread-pool backends of DiskIo.
#include "tier/disk_io.h"

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include "core/log.h"
#include "core/mutex.h"
#include "tier/cond_wait.h"

namespace kvtier {

const char* IoBackendName(IoBackend backend) {
  switch (backend) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kUring:
      return "io_uring";
    case IoBackend::kThreads:
      return "threads";
  }
  return "unknown";
}

Result<IoBackend> ParseIoBackend(std::string_view name) {
  if (name == "auto") return IoBackend::kAuto;
  if (name == "io_uring" || name == "uring") return IoBackend::kUring;
  if (name == "threads") return IoBackend::kThreads;
  return Status::InvalidArgument("unknown I/O backend '" + std::string(name) +
                                 "'; use auto, io_uring or threads");
}

namespace {

// The kernel caps one registered buffer at 1 GiB; larger regions are registered in chunks.
constexpr uint64_t kMaxRegisteredChunk = 1ull << 30;
constexpr uint64_t kWakeTag = ~0ull;

class UringIo final : public DiskIo {
 public:
  static Result<std::unique_ptr<DiskIo>> Create(std::vector<int> fds, uint32_t queue_depth) {
    std::unique_ptr<UringIo> io(new UringIo(std::move(fds), queue_depth));
    // One extra entry for the armed eventfd read that Wake() completes.
    const int rc = io_uring_queue_init(queue_depth + 1, &io->ring_, 0);
    if (rc < 0) {
      return Status::Unavailable(std::string("io_uring_queue_init failed: ") + std::strerror(-rc) +
                                 " (io_uring disabled by sysctl or a seccomp profile?)");
    }
    io->ring_ready_ = true;
    io->wake_fd_ = eventfd(0, EFD_CLOEXEC);
    if (io->wake_fd_ < 0) return Status::FromErrno(errno, "eventfd");
    return std::unique_ptr<DiskIo>(std::move(io));
  }

  ~UringIo() override {
    if (ring_ready_) io_uring_queue_exit(&ring_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  uint32_t queue_depth() const override { return queue_depth_; }

  void Queue(const IoRequest& r) override {
    io_uring_sqe* sqe = GetSqe();
    const int fd = fds_[r.file];
    const int buf_index = FindRegistered(r.buf, r.len);
    if (r.kind == IoKind::kRead) {
      if (buf_index >= 0) {
        io_uring_prep_read_fixed(sqe, fd, r.buf, r.len, r.offset, buf_index);
      } else {
        io_uring_prep_read(sqe, fd, r.buf, r.len, r.offset);
      }
    } else {
      if (buf_index >= 0) {
        io_uring_prep_write_fixed(sqe, fd, r.buf, r.len, r.offset, buf_index);
      } else {
        io_uring_prep_write(sqe, fd, r.buf, r.len, r.offset);
      }
    }
    io_uring_sqe_set_data64(sqe, r.tag);
  }

  Result<size_t> Poll(int timeout_ms, std::vector<IoCompletion>* out) override {
    if (!wake_armed_) {
      io_uring_sqe* sqe = GetSqe();
      io_uring_prep_read(sqe, wake_fd_, &wake_value_, sizeof(wake_value_), 0);
      io_uring_sqe_set_data64(sqe, kWakeTag);
      wake_armed_ = true;
    }
    int rc;
    io_uring_cqe* cqe = nullptr;
    if (timeout_ms == 0) {
      rc = io_uring_submit(&ring_);
    } else if (timeout_ms < 0) {
      rc = io_uring_submit_and_wait(&ring_, 1);
    } else {
      __kernel_timespec ts{};
      ts.tv_sec = timeout_ms / 1000;
      ts.tv_nsec = static_cast<long long>(timeout_ms % 1000) * 1000000;
      rc = io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
    }
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      return Status::IOError(std::string("io_uring_enter: ") + std::strerror(-rc));
    }
    size_t n = 0;
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      const uint64_t tag = io_uring_cqe_get_data64(cqe);
      if (tag == kWakeTag) {
        wake_armed_ = false;
        continue;
      }
      out->push_back(IoCompletion{tag, cqe->res});
      ++n;
    }
    io_uring_cq_advance(&ring_, seen);
    return n;
  }

  void Wake() override {
    const uint64_t one = 1;
    // A full eventfd counter (EAGAIN) still wakes; nothing to do on error.
    [[maybe_unused]] ssize_t w = write(wake_fd_, &one, sizeof(one));
  }

  Status RegisterBuffers(std::span<const iovec> regions) override {
    if (!registered_.empty()) {
      io_uring_unregister_buffers(&ring_);
      registered_.clear();
    }
    std::vector<iovec> chunks;
    for (const iovec& r : regions) {
      auto* base = static_cast<uint8_t*>(r.iov_base);
      for (uint64_t off = 0; off < r.iov_len; off += kMaxRegisteredChunk) {
        const uint64_t len = std::min<uint64_t>(kMaxRegisteredChunk, r.iov_len - off);
        chunks.push_back(iovec{base + off, len});
      }
    }
    if (chunks.empty()) return Status::Ok();
    const int rc = io_uring_register_buffers(&ring_, chunks.data(), chunks.size());
    if (rc < 0) {
      std::string msg = std::string("io_uring_register_buffers: ") + std::strerror(-rc);
      if (rc == -ENOMEM || rc == -EPERM) {
        msg += " (registered buffers are locked memory: raise RLIMIT_MEMLOCK, `ulimit -l`)";
      }
      return Status::Unavailable(msg);
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      auto* b = static_cast<uint8_t*>(chunks[i].iov_base);
      registered_.push_back(Region{b, b + chunks[i].iov_len, static_cast<int>(i)});
    }
    std::sort(registered_.begin(), registered_.end(),
              [](const Region& a, const Region& b) { return a.begin < b.begin; });
    return Status::Ok();
  }

  bool buffers_registered() const override { return !registered_.empty(); }
  std::string name() const override { return "io_uring"; }

 private:
  struct Region {
    uint8_t* begin;
    uint8_t* end;
    int index;
  };

  UringIo(std::vector<int> fds, uint32_t queue_depth)
      : fds_(std::move(fds)), queue_depth_(queue_depth) {}

  io_uring_sqe* GetSqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {  // only if the caller exceeded queue_depth(); flush and retry
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  // The registered buffer holding [buf, buf + len), or -1.
  int FindRegistered(uint8_t* buf, uint32_t len) const {
    if (registered_.empty()) return -1;
    auto it = std::upper_bound(registered_.begin(), registered_.end(), buf,
                               [](uint8_t* p, const Region& r) { return p < r.begin; });
    if (it == registered_.begin()) return -1;
    --it;
    return (buf >= it->begin && buf + len <= it->end) ? it->index : -1;
  }

  std::vector<int> fds_;
  uint32_t queue_depth_;
  io_uring ring_{};
  bool ring_ready_ = false;
  int wake_fd_ = -1;
  bool wake_armed_ = false;
  uint64_t wake_value_ = 0;
  std::vector<Region> registered_;
};

// pread/pwrite on a few threads: the fallback where io_uring is unavailable.
class ThreadPoolIo final : public DiskIo {
 public:
  ThreadPoolIo(std::vector<int> fds, uint32_t queue_depth)
      : fds_(std::move(fds)), queue_depth_(queue_depth) {
    const uint32_t threads = std::clamp<uint32_t>(queue_depth, 1, 16);
    for (uint32_t i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  ~ThreadPoolIo() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    jobs_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  uint32_t queue_depth() const override { return queue_depth_; }

  void Queue(const IoRequest& r) override {
    {
      MutexLock lock(&mu_);
      jobs_.push_back(r);
    }
    jobs_cv_.notify_one();
  }

  Result<size_t> Poll(int timeout_ms, std::vector<IoCompletion>* out) override {
    MutexLock lock(&mu_);
    if (timeout_ms != 0) {
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
      while (done_.empty() && !woken_) {
        if (timeout_ms < 0) {
          CondWait(&done_cv_, &mu_);
        } else {
          const auto now = std::chrono::steady_clock::now();
          if (now >= deadline) break;
          CondWaitFor(&done_cv_, &mu_, deadline - now);
        }
      }
    }
    woken_ = false;
    const size_t n = done_.size();
    out->insert(out->end(), done_.begin(), done_.end());
    done_.clear();
    return n;
  }

  void Wake() override {
    {
      MutexLock lock(&mu_);
      woken_ = true;
    }
    done_cv_.notify_all();
  }

  Status RegisterBuffers(std::span<const iovec>) override {
    return Status::Unavailable("the threads I/O backend does not register buffers");
  }
  bool buffers_registered() const override { return false; }
  std::string name() const override { return "threads"; }

 private:
  void WorkerLoop() {
    while (true) {
      IoRequest r;
      {
        MutexLock lock(&mu_);
        while (jobs_.empty() && !stopping_) CondWait(&jobs_cv_, &mu_);
        if (jobs_.empty()) return;
        r = jobs_.front();
        jobs_.pop_front();
      }
      const int fd = fds_[r.file];
      const ssize_t n = r.kind == IoKind::kRead
                            ? pread(fd, r.buf, r.len, static_cast<off_t>(r.offset))
                            : pwrite(fd, r.buf, r.len, static_cast<off_t>(r.offset));
      const int32_t res = n < 0 ? -errno : static_cast<int32_t>(n);
      {
        MutexLock lock(&mu_);
        done_.push_back(IoCompletion{r.tag, res});
      }
      done_cv_.notify_all();
    }
  }

  const std::vector<int> fds_;
  const uint32_t queue_depth_;
  Mutex mu_;
  std::condition_variable jobs_cv_;
  std::condition_variable done_cv_;
  std::deque<IoRequest> jobs_ GUARDED_BY(mu_);
  std::vector<IoCompletion> done_ GUARDED_BY(mu_);
  bool woken_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace

Result<std::unique_ptr<DiskIo>> CreateDiskIo(IoBackend backend, std::vector<int> fds,
                                             uint32_t queue_depth) {
  if (queue_depth < 1 || queue_depth > 4096) {
    return Status::InvalidArgument("queue depth " + std::to_string(queue_depth) +
                                   " outside 1..4096");
  }
  if (backend == IoBackend::kThreads) {
    return std::unique_ptr<DiskIo>(new ThreadPoolIo(std::move(fds), queue_depth));
  }
  auto uring = UringIo::Create(fds, queue_depth);
  if (uring.ok() || backend == IoBackend::kUring) return uring;
  KVTIER_LOG(kWarn) << "io_uring unavailable (" << uring.status().message()
                    << "); disk I/O falls back to a thread pool of pread/pwrite";
  return std::unique_ptr<DiskIo>(new ThreadPoolIo(std::move(fds), queue_depth));
}

}  // namespace kvtier

// DiskIo: the asynchronous block I/O engine under the disk tier, and the seam where tests inject
// faults (FaultInjectingIo wraps any DiskIo).
//
// One thread drives a DiskIo: it Queue()s requests and Poll()s for completions. Only Wake() and
// the factory are thread-safe. Requests are positional reads and writes on the files given at
// creation; with O_DIRECT files, buffers, offsets and lengths must be 4 KiB aligned.
//
// Two backends: io_uring (the default: batched submission, one io_uring_enter per Poll however
// many requests were queued, registered buffers) and a small thread pool doing pread/pwrite,
// for machines where io_uring is disabled (kernel.io_uring_disabled, container seccomp
// profiles). kAuto picks io_uring and falls back to threads with a logged warning.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

enum class IoKind : uint8_t { kRead = 0, kWrite = 1 };

struct IoRequest {
  IoKind kind = IoKind::kRead;
  uint32_t file = 0;    // index into the fds given at creation
  uint64_t offset = 0;  // byte offset in the file
  uint8_t* buf = nullptr;
  uint32_t len = 0;  // bytes
  uint64_t tag = 0;  // returned unchanged in the completion
};

struct IoCompletion {
  uint64_t tag = 0;
  int32_t result = 0;  // bytes transferred (may be short), or -errno
};

enum class IoBackend : uint8_t { kAuto = 0, kUring = 1, kThreads = 2 };
const char* IoBackendName(IoBackend backend);  // "auto", "io_uring", "threads"
Result<IoBackend> ParseIoBackend(std::string_view name);

class DiskIo {
 public:
  virtual ~DiskIo() = default;

  // Most requests in flight at once (queued and not yet completed). The caller keeps below it.
  virtual uint32_t queue_depth() const = 0;
  // Queues one request; it starts at the next Poll() at the latest. REQUIRES: fewer than
  // queue_depth() requests in flight; the buffer stays untouched until its completion.
  virtual void Queue(const IoRequest& request) = 0;
  // Starts everything queued, then waits until at least one completion is ready, Wake() is
  // called, or `timeout_ms` passes (0 = do not wait), and appends the ready completions to
  // `out`. Returns how many were appended; IOError only when the engine itself failed.
  virtual Result<size_t> Poll(int timeout_ms, std::vector<IoCompletion>* out) = 0;
  // Makes the current or next Poll() return promptly. Thread-safe; cheap when called often.
  virtual void Wake() = 0;
  // Registers memory that buffers of later requests will come from, so the kernel need not
  // map them per I/O. Ok when registered; Unavailable (with the reason) when the kernel or the
  // backend refuses, in which case I/O goes on unregistered. REQUIRES: nothing in flight.
  virtual Status RegisterBuffers(std::span<const iovec> regions) = 0;
  virtual bool buffers_registered() const = 0;
  // "io_uring" or "threads", plus the wrapper's name when wrapped.
  virtual std::string name() const = 0;
};

// Creates the engine over `fds` (owned by the caller, open for the whole life of the engine).
// InvalidArgument for queue_depth outside 1..4096; Unavailable when kUring is asked for and
// io_uring cannot be set up.
Result<std::unique_ptr<DiskIo>> CreateDiskIo(IoBackend backend, std::vector<int> fds,
                                             uint32_t queue_depth);

}  // namespace kvtier

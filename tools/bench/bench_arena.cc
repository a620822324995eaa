// kvtier bench arena: G2 arena start-up (map, huge-page advice, parallel pre-fault, mlock)
// against the floor for the same bytes: a plain mmap touched page by page on the same threads.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "bench/bench_timer.h"
#include "cli/commands.h"
#include "cli/json_writer.h"
#include "core/parallel.h"
#include "tier/host_arena.h"

namespace kvtier::cli {
namespace {

Result<double> PlainFirstTouchMs(uint64_t bytes, unsigned threads) {
  Stopwatch w;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap");
  auto* base = static_cast<uint8_t*>(p);
  ParallelRanges(threads, bytes / 4096, [base](unsigned, size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) *reinterpret_cast<volatile uint8_t*>(base + i * 4096) = 0;
  });
  const double ms = w.Millis();
  munmap(p, bytes);
  return ms;
}

}  // namespace

int RunBenchArena(const CliArgs& args) {
  if (args.Has("help")) {
    std::printf(
        "usage: kvtier bench arena [--bytes N] [--threads T] [--reps R] [--json]\n"
        "  arena_startup_ms: HostArena::Create (map + MADV_HUGEPAGE + parallel pre-fault + "
        "mlock)\n  first_touch_ms: mmap + parallel first touch of the same bytes, same threads.\n"
        "  --bytes (2GiB)  --threads (online CPUs)  --reps (3, best of)\n");
    return 0;
  }
  if (Status s = args.CheckKnown({"json", "help", "bytes", "threads", "reps"}); !s.ok()) {
    return UsageError(s);
  }
  auto bytes = args.GetUint("bytes", 2ull << 30);
  auto threads = args.GetUint("threads", OnlineCpus());
  auto reps = args.GetUint("reps", 3);
  if (!bytes.ok()) return UsageError(bytes.status());
  if (!threads.ok()) return UsageError(threads.status());
  if (!reps.ok()) return UsageError(reps.status());
  if (*bytes < (2u << 20)) return UsageError(Status::InvalidArgument("--bytes must be >= 2MiB"));
  if (*threads < 1 || *threads > 1024)
    return UsageError(Status::InvalidArgument("--threads must be in 1..1024"));
  if (*reps < 1 || *reps > 100)
    return UsageError(Status::InvalidArgument("--reps must be in 1..100"));
  const uint64_t size = *bytes / (2u << 20) * (2u << 20);

  double touch_ms = 1e30, arena_ms = 1e30;
  HostArena::StartupStats stats;
  for (uint64_t r = 0; r < *reps; ++r) {
    auto t = PlainFirstTouchMs(size, static_cast<unsigned>(*threads));
    if (!t.ok()) return Failure(t.status());
    touch_ms = std::min(touch_ms, *t);
    HostArena::Config cfg;
    cfg.capacity_bytes = size;
    cfg.slot_bytes = 2u << 20;
    cfg.prefault_threads = static_cast<uint32_t>(*threads);
    Stopwatch w;
    auto arena = HostArena::Create(cfg);
    const double ms = w.Millis();
    if (!arena.ok()) return Failure(arena.status());
    if (ms < arena_ms) {
      arena_ms = ms;
      stats = (*arena)->startup();
    }
  }
  if (args.Has("json")) {
    JsonObject o;
    o.Add("bytes", size)
        .Add("threads", static_cast<uint64_t>(*threads))
        .Add("arena_startup_ms", arena_ms)
        .Add("first_touch_ms", touch_ms)
        .Add("ratio", arena_ms / touch_ms)
        .Add("prefault_ms", stats.prefault_ms)
        .Add("lock_ms", stats.lock_ms)
        .Add("hugepages_advised", stats.hugepages_advised)
        .Add("locked", stats.locked);
    std::printf("%s\n", o.Str().c_str());
  } else {
    std::printf("bench arena: %.2f GiB on %llu threads, best of %llu\n",
                static_cast<double>(size) / (1 << 30), static_cast<unsigned long long>(*threads),
                static_cast<unsigned long long>(*reps));
    std::printf("  arena start-up    %9.1f ms  (pre-fault %.1f, mlock %.1f; %s, %s)\n", arena_ms,
                stats.prefault_ms, stats.lock_ms,
                stats.hugepages_advised ? "huge pages advised" : "no huge pages",
                stats.locked ? "locked" : "not locked");
    std::printf("  plain first touch %9.1f ms\n  ratio             %9.3f\n", touch_ms,
                arena_ms / touch_ms);
  }
  return 0;
}

}  // namespace kvtier::cli

// kvtier bench manager: the BlockManager's paths end to end, through the connector API, each
// against the raw limit measured in the same run: loads from G2 against memcpy of the same
// bytes on the same number of threads, loads from G3 against the disk tier's own random reads
// of the same blocks, and Commit latency while demotions keep the disk busy.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_timer.h"
#include "cli/commands.h"
#include "cli/json_writer.h"
#include "cli/metrics_settings.h"
#include "cli/progress.h"
#include "core/parallel.h"
#include "kvtier/connector.h"
#include "metrics/metrics.h"
#include "tier/disk_tier.h"
#include "tier/host_arena.h"

namespace kvtier::cli {
namespace {

struct Args {
  uint32_t prompts = 8;
  uint32_t prompt_blocks = 32;
  uint32_t threads = 2;
  double commit_seconds = 2;
  uint32_t commit_interval_us = 200;
  std::string dir;  // the bench's own directory, under --dir (RunBenchManager)
};

// Emulated G1 in host memory (layer-separate), pre-faulted.
struct G1Emulation {
  std::unique_ptr<HostArena> mem;
  G1Memory g1;
};

Result<G1Emulation> MakeG1(const KvLayout& layout, uint32_t blocks) {
  G1Emulation e;
  HostArena::Config c;
  c.slot_bytes = layout.BlockBytes() * blocks;
  c.capacity_bytes = (c.slot_bytes + 4095) / 4096 * 4096;
  c.lock_memory = false;
  KVTIER_ASSIGN_OR_RETURN(e.mem, HostArena::Create(c));
  e.g1.layout = layout;
  e.g1.num_blocks = blocks;
  for (uint32_t r = 0; r < layout.num_layers * layout.num_planes; ++r) {
    e.g1.regions.push_back(
        {e.mem->base() + uint64_t{r} * blocks * layout.ChunkBytes(), layout.ChunkBytes()});
  }
  for (uint64_t i = 0; i < c.slot_bytes; i += 4096)
    e.mem->base()[i] = static_cast<uint8_t>(i >> 12);
  return e;
}

std::vector<TokenId> BenchPrompt(uint32_t id, size_t tokens) {
  std::vector<TokenId> t(tokens);
  uint64_t x = 0x9e3779b97f4a7c15ull * (id + 1);
  for (auto& v : t) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<TokenId>(x % 128000);
  }
  return t;
}

Config BenchConfig(const std::string& dir, const KvLayout& layout, uint64_t g2_blocks,
                   uint64_t g3_blocks, uint32_t threads, uint32_t min_seen) {
  Config c;
  const uint64_t slot = 4096 + layout.BlockBytes();
  (void)c.Set("g2.capacity_bytes", std::to_string(g2_blocks * slot));
  (void)c.Set("g3.dir", dir);
  (void)c.Set("g3.capacity_bytes", std::to_string(g3_blocks * slot + (8 << 20)));
  (void)c.Set("g3.admit_min_seen", std::to_string(min_seen));
  (void)c.Set("transfer.copy_threads", std::to_string(threads));
  (void)c.Set("transfer.max_queued_saves", "100000");
  return c;
}

// Runs prompts [first, first+count) through Lookup + PrepareLoad (into G1 blocks from 0 on),
// then one StartLoad and every WaitLayer. Returns the bytes loaded and the seconds from
// StartLoad until the last layer landed.
struct LoadRun {
  uint64_t bytes = 0;
  double seconds = 0;
  std::array<uint32_t, kNumTiers> by_tier{};
};

Result<LoadRun> LoadPrompts(BlockManager& m, const std::string& tag, uint32_t first, uint32_t count,
                            uint32_t prompt_blocks) {
  const KvLayout& l = m.layout();
  const size_t tokens = size_t{prompt_blocks} * l.tokens_per_block + 1;
  LoadRun run;
  uint32_t next_g1 = 0;
  std::vector<std::string> ids;
  for (uint32_t p = first; p < first + count; ++p) {
    const std::string id = tag + std::to_string(p);
    const auto prompt = BenchPrompt(p, tokens);
    KVTIER_ASSIGN_OR_RETURN(LookupResult lr, m.Lookup({id, prompt, "", "", {}}, 0));
    for (TierId t = 0; t < kNumTiers; ++t) run.by_tier[t] += lr.blocks_by_tier[t];
    std::vector<uint32_t> g1(prompt_blocks + 1);
    std::iota(g1.begin(), g1.end(), next_g1);
    next_g1 += prompt_blocks + 1;
    KVTIER_ASSIGN_OR_RETURN(uint32_t planned, m.PrepareLoad(id, g1, lr.num_tokens));
    run.bytes += uint64_t{planned / l.tokens_per_block} * l.BlockBytes();
    ids.push_back(id);
  }
  Stopwatch w;
  KVTIER_RETURN_IF_ERROR(m.StartLoad());
  for (uint32_t layer = 0; layer < l.num_layers; ++layer)
    KVTIER_RETURN_IF_ERROR(m.WaitLayer(layer));
  run.seconds = w.Seconds();
  for (const auto& id : ids) {
    (void)m.LoadedTokens(id);
    (void)m.RequestFinished(id);
  }
  return run;
}

// Commits prompts [first, first+count) as freshly computed (no load) and saves them.
Status SavePrompts(BlockManager& m, const std::string& tag, uint32_t first, uint32_t count,
                   uint32_t prompt_blocks, double* commit_seconds) {
  const KvLayout& l = m.layout();
  const size_t tokens = size_t{prompt_blocks} * l.tokens_per_block + 1;
  Stopwatch w;
  for (uint32_t p = first; p < first + count; ++p) {
    const std::string id = tag + std::to_string(p);
    const auto prompt = BenchPrompt(p, tokens);
    KVTIER_ASSIGN_OR_RETURN(LookupResult lr, m.Lookup({id, prompt, "", "", {}}, 0));
    (void)lr;
    std::vector<uint32_t> g1(prompt_blocks + 1);
    std::iota(g1.begin(), g1.end(), 0u);
    KVTIER_RETURN_IF_ERROR(m.PrepareLoad(id, g1, 0).status());
    KVTIER_RETURN_IF_ERROR(m.Commit(id, prompt, g1));
    (void)m.RequestFinished(id);
  }
  if (commit_seconds) *commit_seconds = w.Seconds();
  return Status::Ok();
}

// CPU time this thread has used, in microseconds.
double ThreadCpuMicros() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

double MemcpyGbps(uint8_t* dst, const uint8_t* src, uint64_t bytes, unsigned threads) {
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    Stopwatch w;
    ParallelRanges(threads, bytes >> 20, [&](unsigned, size_t b, size_t e) {
      std::memcpy(dst + (b << 20), src + (b << 20), (e - b) << 20);
    });
    best = std::min(best, w.Seconds());
  }
  return static_cast<double>(bytes) / best / 1e9;
}

// The disk tier's raw random-read bandwidth on `blocks` blocks of this layout, in `dir`.
Result<double> RawDiskReadGbps(const std::string& dir, const KvLayout& layout, HostArena* buffers,
                               uint32_t blocks) {
  DiskTier::Config dc;
  dc.dir = dir;
  dc.payload_bytes = layout.BlockBytes();
  dc.layout_fingerprint = layout.Fingerprint();
  dc.capacity_bytes = uint64_t{blocks} * buffers->slot_stride() + (8 << 20);
  dc.snapshot_on_close = false;
  DiskTier::OpenOptions oo;
  oo.buffers.push_back({buffers->base(), buffers->mapped_bytes()});
  KVTIER_ASSIGN_OR_RETURN(DiskTier::Opened opened, DiskTier::Open(dc, oo));
  DiskTier& disk = *opened.tier;
  const uint32_t n = std::min(blocks, std::min(disk.num_slots(), buffers->num_slots()));
  std::vector<TokenId> tokens(layout.tokens_per_block, 7);
  DiskOpWaiter waiter;
  std::vector<DiskWriteRequest> writes(n);
  for (uint32_t i = 0; i < n; ++i) {
    writes[i].key = BlockKey{i + 1ull, 0xbe9c};
    writes[i].parent = BlockKey{i + 0ull, 0xbe9c};
    writes[i].tokens = tokens;
    writes[i].buffer = buffers->SlotData(i);
    writes[i].sink = &waiter;
    writes[i].cookie = i;
  }
  disk.SubmitWrites(writes);
  for (const auto& r : waiter.Take(n)) KVTIER_RETURN_IF_ERROR(r.status);
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::reverse(order.begin(), order.end());
  std::vector<DiskReadRequest> reads(n);
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t i = order[k];
    reads[k].key = writes[i].key;
    reads[k].buffer = buffers->SlotData(k);
    reads[k].sink = &waiter;
    reads[k].cookie = k;
  }
  Stopwatch w;
  disk.SubmitReads(reads);
  for (const auto& r : waiter.Take(n)) KVTIER_RETURN_IF_ERROR(r.status);
  const double s = w.Seconds();
  (void)disk.Close();
  return static_cast<double>(n) * layout.BlockBytes() / s / 1e9;
}

// ---- --metrics-compare: the cost of the /metrics endpoint (docs/metrics.md) ----

// GET /metrics from 127.0.0.1:port (blocking, 2 s limit); true on a 200 answer.
bool Scrape(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  std::string resp;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const char req[] = "GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n";
    if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(req) - 1)) {
      char buf[65536];
      ssize_t n;
      // EINTR is retried: the manager's io_uring task work interrupts a read with SO_RCVTIMEO.
      while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
        if (n > 0) resp.append(buf, static_cast<size_t>(n));
      }
    }
  }
  close(fd);
  return resp.rfind("HTTP/1.1 200", 0) == 0;
}

// A free loopback port (bound then released), for the metrics-on runs.
Result<uint16_t> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    return Status::Unavailable("no free loopback port for the metrics-on runs");
  }
  close(fd);
  return ntohs(a.sin_port);
}

struct PhaseRun {
  double lookup_per_s = 0;
  double load_gbps_g2 = 0;
  uint64_t scrapes = 0;
};

// One manager (G2 only), metrics on `port` (0: off), scraped every 100 ms while on: saves the
// prompts, then lookups for 0.5 s and three loads of every prompt from G2 (the best one), as
// the main run measures them.
Result<PhaseRun> LookupAndG2Load(const Args& a, const KvLayout& layout, const G1Memory& g1,
                                 uint16_t port) {
  const uint32_t blocks = a.prompts * a.prompt_blocks;
  ManagerOptions o;
  o.layout = layout;
  o.model_id = "bench-model";
  o.config = BenchConfig(a.dir + "/g3", layout, blocks + blocks / 8 + 4, 0, a.threads, 2);
  KVTIER_RETURN_IF_ERROR(o.config.Set("g3.enabled", "false"));
  KVTIER_RETURN_IF_ERROR(o.config.Set("metrics.port", std::to_string(port)));
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockManager> m, BlockManager::Create(o));
  KVTIER_RETURN_IF_ERROR(m->RegisterDeviceMemory(g1));
  KVTIER_RETURN_IF_ERROR(SavePrompts(*m, "s", 0, a.prompts, a.prompt_blocks, nullptr));
  KVTIER_RETURN_IF_ERROR(m->StartSave());
  m->WaitForSaves();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> scrapes{0};
  std::thread scraper;
  if (port != 0) {
    scraper = std::thread([&] {
      while (!stop.load()) {
        if (Scrape(port)) scrapes.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  const size_t tokens = size_t{a.prompt_blocks} * layout.tokens_per_block + 1;
  std::vector<std::vector<TokenId>> ps;
  for (uint32_t p = 0; p < a.prompts; ++p) ps.push_back(BenchPrompt(p, tokens));
  PhaseRun run;
  uint64_t lookups = 0;
  Stopwatch lw;
  Status failed;
  while (lw.Seconds() < 0.5 && failed.ok()) {
    for (uint32_t p = 0; p < a.prompts; ++p) {
      const std::string id = "l" + std::to_string(lookups++);
      auto r = m->Lookup({id, ps[p], "", "", {}}, 0);
      if (!r.ok()) failed = r.status();
      (void)m->RequestFinished(id);
    }
  }
  run.lookup_per_s = static_cast<double>(lookups) / lw.Seconds();
  // Three loads of every prompt from G2 (the blocks stay in G2); the best one.
  for (int i = 0; i < 3 && failed.ok(); ++i) {
    auto load = LoadPrompts(*m, "g2-" + std::to_string(i) + "-", 0, a.prompts, a.prompt_blocks);
    if (!load.ok()) {
      failed = load.status();
      break;
    }
    run.load_gbps_g2 =
        std::max(run.load_gbps_g2, static_cast<double>(load->bytes) / load->seconds / 1e9);
  }
  stop = true;
  if (scraper.joinable()) scraper.join();
  KVTIER_RETURN_IF_ERROR(failed);
  run.scrapes = scrapes.load();
  return run;
}

// What metrics add to one timed operation when on: two clock reads and one histogram
// observation (ScopedLatency), in ns of the recording thread's CPU time (wall time on a shared
// machine counts other processes' turns); best of 3 rounds of 2M, from 2 threads at once on the
// same histogram (its cache lines contended, worse than a manager's threads ever contend them).
double RecordingCostNs() {
  Histogram h;
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    constexpr int kOps = 2000000;
    std::vector<std::thread> threads;
    std::vector<double> ns(2);
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&h, &ns, t] {
        const double cpu0 = ThreadCpuMicros();
        for (int i = 0; i < kOps; ++i) {
          const ScopedLatency timed(&h);
        }
        ns[t] = (ThreadCpuMicros() - cpu0) * 1e3 / kOps;
      });
    }
    for (auto& th : threads) th.join();
    best = std::min(best, *std::min_element(ns.begin(), ns.end()));
  }
  return best;
}

// Metrics off vs on (scraped at 10 Hz), interleaved, `reps` times each; best of each.
int RunMetricsCompare(const Args& a, uint32_t reps, bool json) {
  const KvLayout layout;
  auto g1e = MakeG1(layout, a.prompts * a.prompt_blocks + a.prompts);
  if (!g1e.ok()) return Failure(g1e.status());
  auto port = FreePort();
  if (!port.ok()) return Failure(port.status());
  PhaseRun off, on;
  Progress progress("bench manager --metrics-compare", 2 * reps, "runs");
  for (uint32_t r = 0; r < reps; ++r) {
    for (const bool metrics : {false, true}) {
      auto run = LookupAndG2Load(a, layout, g1e->g1, metrics ? *port : 0);
      if (!run.ok()) return Failure(run.status());
      PhaseRun& best = metrics ? on : off;
      best.lookup_per_s = std::max(best.lookup_per_s, run->lookup_per_s);
      best.load_gbps_g2 = std::max(best.load_gbps_g2, run->load_gbps_g2);
      best.scrapes += run->scrapes;
      progress.Update(2 * r + (metrics ? 2 : 1));
    }
  }
  progress.Finish();
  const uint64_t bytes = uint64_t{a.prompts} * a.prompt_blocks * layout.BlockBytes();
  const double memcpy_gbps = MemcpyGbps(g1e->mem->base(), g1e->mem->base() + bytes / 2,
                                        bytes / 2 / (1 << 20) * (1 << 20), a.threads);
  std::error_code ec;
  std::filesystem::remove_all(a.dir, ec);
  if (on.scrapes == 0) {
    return Failure(Status::Internal("the metrics-on runs were never scraped"));
  }
  const double lookup_ratio = on.lookup_per_s / off.lookup_per_s;
  // The bound that noise cannot blur: the recording cost against the time of one operation.
  const double record_ns = RecordingCostNs();
  const double lookup_ns = 1e9 / off.lookup_per_s;
  const double block_load_ns = 1e9 * layout.BlockBytes() / (off.load_gbps_g2 * 1e9);
  const double load_ratio = on.load_gbps_g2 / off.load_gbps_g2;
  if (json) {
    JsonObject out;
    out.Add("reps", uint64_t{reps})
        .Add("lookup_per_s_metrics_off", off.lookup_per_s)
        .Add("lookup_per_s_metrics_on", on.lookup_per_s)
        .Add("lookup_ratio_on_off", lookup_ratio)
        .Add("load_gbps_g2_metrics_off", off.load_gbps_g2)
        .Add("load_gbps_g2_metrics_on", on.load_gbps_g2)
        .Add("load_g2_ratio_on_off", load_ratio)
        .Add("memcpy_gbps", memcpy_gbps)
        .Add("load_g2_ratio_to_memcpy_off", off.load_gbps_g2 / memcpy_gbps)
        .Add("load_g2_ratio_to_memcpy_on", on.load_gbps_g2 / memcpy_gbps)
        .Add("scrapes", on.scrapes)
        .Add("record_ns", record_ns)
        .Add("lookup_ns", lookup_ns)
        .Add("record_share_of_lookup", record_ns / lookup_ns)
        .Add("record_share_of_block_load", record_ns / block_load_ns)
        .Add("within_2_percent", lookup_ratio >= 0.98 && load_ratio >= 0.98)
        .Add("record_bound_within_2_percent",
             record_ns / lookup_ns < 0.02 && record_ns / block_load_ns < 0.02);
    std::printf("%s\n", out.Str().c_str());
  } else {
    std::printf(
        "bench manager --metrics-compare: best of %u, metrics off vs on (scraped at 10 Hz, "
        "%llu scrapes)\n",
        reps, static_cast<unsigned long long>(on.scrapes));
    std::printf("  lookup       off %10.0f /s     on %10.0f /s     on/off %.3f\n", off.lookup_per_s,
                on.lookup_per_s, lookup_ratio);
    std::printf(
        "  load G2->G1  off %10.2f GB/s   on %10.2f GB/s   on/off %.3f   (memcpy %.2f GB/s)\n",
        off.load_gbps_g2, on.load_gbps_g2, load_ratio, memcpy_gbps);
    std::printf(
        "  recording    %.1f ns per timed operation = %.4f of a lookup, %.6f of a block "
        "load\n",
        record_ns, record_ns / lookup_ns, record_ns / block_load_ns);
  }
  return 0;
}

void PrintUsage() {
  std::printf(
      "usage: kvtier bench manager [--prompts N] [--prompt-blocks B] [--threads T] [--dir D]\n"
      "                            [--commit-seconds S] [--commit-interval-us I] [--json]\n"
      "  Through the connector API, with 2 MiB blocks (Llama-3-8B): saves of N prompts of B\n"
      "  blocks, lookups, loads from G2 (vs memcpy of the same bytes on T threads), loads from G3\n"
      "  staged through G2 (vs the disk tier's own random reads in D), and the latency of\n"
      "  one-block Commits, one every I us for S seconds, while their demotions saturate the "
      "disk.\n"
      "  Defaults: N 8, B 32, T 2, S 2, I 200, D ./kvtier-data (the bench works in\n"
      "  D/bench-manager-<pid> and removes it).\n"
      "  --metrics-compare [--reps R]: instead, lookups and G2 loads with the /metrics endpoint\n"
      "  off vs on (scraped at 10 Hz), interleaved, best of R (default 3) each, and on/off.\n");
}

}  // namespace

int RunBenchManager(const CliArgs& cli) {
  if (cli.Has("help")) {
    PrintUsage();
    return 0;
  }
  if (Status s =
          cli.CheckKnown({"help", "json", "prompts", "prompt-blocks", "threads", "commit-seconds",
                          "commit-interval-us", "dir", "metrics-compare", "reps"});
      !s.ok()) {
    return UsageError(s);
  }
  Args a;
  auto prompts = cli.GetUint("prompts", a.prompts);
  auto pblocks = cli.GetUint("prompt-blocks", a.prompt_blocks);
  auto threads = cli.GetUint("threads", a.threads);
  auto commit_seconds = cli.GetDouble("commit-seconds", a.commit_seconds);
  auto commits = cli.GetUint("commit-interval-us", a.commit_interval_us);
  if (!commit_seconds.ok()) return UsageError(commit_seconds.status());
  for (auto* r : {&prompts, &pblocks, &threads, &commits}) {
    if (!r->ok()) return UsageError(r->status());
  }
  if (*prompts < 1 || *prompts > 64 || *pblocks < 1 || *pblocks > 256 || *threads < 1 ||
      *threads > 64 || *commits > 1000000 || *commit_seconds < 0.1 || *commit_seconds > 600) {
    return UsageError(Status::InvalidArgument(
        "--prompts 1..64, --prompt-blocks 1..256, --threads 1..64, --commit-interval-us "
        "0..1000000, --commit-seconds 0.1..600"));
  }
  a.prompts = static_cast<uint32_t>(*prompts);
  a.prompt_blocks = static_cast<uint32_t>(*pblocks);
  a.threads = static_cast<uint32_t>(*threads);
  a.commit_interval_us = static_cast<uint32_t>(*commits);
  a.commit_seconds = *commit_seconds;
  // The bench works in a directory of its own under --dir and removes only that (and --dir when
  // it created it): --dir used to be removed whole, so `--dir ~` would have emptied a home.
  const std::string parent = cli.GetString("dir", "./kvtier-data");
  std::error_code ec;
  const bool parent_existed = std::filesystem::exists(parent, ec);
  if (parent_existed && !std::filesystem::is_directory(parent, ec)) {
    return UsageError(Status::InvalidArgument("--dir " + parent +
                                              " exists and is not a directory; give a "
                                              "directory to work in"));
  }
  a.dir = parent + "/bench-manager-" + std::to_string(getpid());
  std::filesystem::create_directories(a.dir, ec);
  if (ec) {
    return UsageError(Status::InvalidArgument("--dir: cannot create " + a.dir + ": " +
                                              ec.message() + "; give a writable directory"));
  }
  struct Cleanup {
    std::string dir, parent;  // parent: removed too (when empty) if the bench created it
    ~Cleanup() {
      std::error_code e;
      std::filesystem::remove_all(dir, e);
      if (!parent.empty()) std::filesystem::remove(parent, e);
    }
  } cleanup{a.dir, parent_existed ? "" : parent};
  if (cli.Has("metrics-compare")) {
    auto reps = cli.GetUint("reps", 3);
    if (!reps.ok()) return UsageError(reps.status());
    if (*reps < 1 || *reps > 20) return UsageError(Status::InvalidArgument("--reps 1..20"));
    return RunMetricsCompare(a, static_cast<uint32_t>(*reps), cli.Has("json"));
  }

  const KvLayout layout;  // 2 MiB blocks
  const uint32_t blocks = a.prompts * a.prompt_blocks;
  auto g1e = MakeG1(layout, blocks + a.prompts);
  if (!g1e.ok()) return Failure(g1e.status());

  ManagerOptions o;
  o.layout = layout;
  o.model_id = "bench-model";
  // G2 holds the prompts once; G3 holds them plus the filler that pushes them out of G2.
  o.config = BenchConfig(a.dir + "/g3", layout, blocks + blocks / 8 + 4, 3 * blocks, a.threads, 2);
  // KVTIER_METRICS_PORT: /metrics while the benchmark runs (docs/metrics.md).
  auto metrics = MetricsSettings();
  if (!metrics.ok()) return UsageError(metrics.status());
  for (const auto& [k, v] : *metrics) {
    if (Status s = o.config.Set(k, v); !s.ok()) return UsageError(s);
  }
  Progress progress("bench manager", 5, "phases");
  auto mgr = BlockManager::Create(o);
  if (!mgr.ok()) return Failure(mgr.status());
  BlockManager& m = **mgr;
  if (Status s = m.RegisterDeviceMemory(g1e->g1); !s.ok()) return Failure(s);

  // 1. Saves: commit every prompt (computed from scratch), then one StartSave.
  if (Status s = SavePrompts(m, "s", 0, a.prompts, a.prompt_blocks, nullptr); !s.ok())
    return Failure(s);
  Stopwatch save_watch;
  if (Status s = m.StartSave(); !s.ok()) return Failure(s);
  m.WaitForSaves();
  const double save_s = save_watch.Seconds();
  const uint64_t saved = m.Stats().saved_blocks;
  const double save_gbps = static_cast<double>(saved) * layout.BlockBytes() / save_s / 1e9;
  progress.Update(1);

  // 2. Lookups of stored prompts (new request ids: every lookup hashes its prompt).
  const size_t tokens = size_t{a.prompt_blocks} * layout.tokens_per_block + 1;
  std::vector<std::vector<TokenId>> ps;
  for (uint32_t p = 0; p < a.prompts; ++p) ps.push_back(BenchPrompt(p, tokens));
  uint64_t lookups = 0;
  Stopwatch lw;
  while (lw.Seconds() < 0.5) {
    for (uint32_t p = 0; p < a.prompts; ++p) {
      const std::string id = "l" + std::to_string(lookups++);
      auto r = m.Lookup({id, ps[p], "", "", {}}, 0);
      if (!r.ok()) return Failure(r.status());
      (void)m.RequestFinished(id);
    }
  }
  const double lookup_per_s = static_cast<double>(lookups) / lw.Seconds();
  progress.Update(2);

  // 3. Loads from G2, against memcpy of the same bytes on the same threads.
  auto g2load = LoadPrompts(m, "g2-", 0, a.prompts, a.prompt_blocks);
  if (!g2load.ok()) return Failure(g2load.status());
  const double load_gbps_g2 = static_cast<double>(g2load->bytes) / g2load->seconds / 1e9;
  const double memcpy_gbps = MemcpyGbps(g1e->mem->base(), g1e->mem->base() + g2load->bytes / 2,
                                        g2load->bytes / 2 / (1 << 20) * (1 << 20), a.threads);

  // 4. Loads from G3: this manager shuts down (its G2 is written to G3, the shutdown flush) and
  //    a new one on the same G3 directory recovers it and starts with an empty G2; loading the
  //    prompts then reads each from G3, staged through a G2 slot. (Filler prompts that pushed
  //    them out of G2 made the count depend on the eviction policy: it keeps the twice-seen
  //    prompts over once-seen filler when it can.)
  mgr->reset();
  auto mgr_g3 = BlockManager::Create(o);
  if (!mgr_g3.ok()) return Failure(mgr_g3.status());
  if (Status s = (*mgr_g3)->RegisterDeviceMemory(g1e->g1); !s.ok()) return Failure(s);
  auto g3load = LoadPrompts(**mgr_g3, "g3-", 0, a.prompts, a.prompt_blocks);
  if (!g3load.ok()) return Failure(g3load.status());
  const double load_gbps_g3 = static_cast<double>(g3load->bytes) / g3load->seconds / 1e9;
  progress.Update(3);
  mgr_g3->reset();

  // The disk tier's own random reads of as many blocks, in the same directory tree.
  HostArena::Config bc;
  bc.slot_bytes = 4096 + layout.BlockBytes();
  bc.capacity_bytes = uint64_t{std::max<uint32_t>(g3load->by_tier[kTierG3], 16)} *
                      ((bc.slot_bytes + 4095) / 4096 * 4096);
  auto buffers = HostArena::Create(bc);
  if (!buffers.ok()) return Failure(buffers.status());
  auto raw = RawDiskReadGbps(a.dir + "/raw", layout, buffers->get(),
                             std::max<uint32_t>(g3load->by_tier[kTierG3], 16));
  if (!raw.ok()) return Failure(raw.status());
  buffers->reset();

  // 5. Commit latency while the disk is busy with demotions: a small G2 whose every victim is
  //    admitted to G3, and requests that each complete one more block per Commit.
  ManagerOptions o5 = o;
  o5.config = BenchConfig(a.dir + "/g3-commit", layout, 64, 4 * 64, a.threads, 1);
  for (const auto& [k, v] : *metrics) (void)o5.config.Set(k, v);
  progress.Update(4);
  auto m5 = BlockManager::Create(o5);
  if (!m5.ok()) return Failure(m5.status());
  if (Status s = (*m5)->RegisterDeviceMemory(g1e->g1); !s.ok()) return Failure(s);
  std::vector<double> lat, cpu;    // wall and on-CPU microseconds per Commit
  std::vector<double> start_save;  // wall microseconds per StartSave (called after each Commit)
  std::vector<double> both;        // Commit + StartSave: the engine's save path in one step
  const uint32_t per_request = 16;
  // Commits come every `commit_interval_us` (a decode step completing a block), faster than the
  // disk can take their demotions: the disk stays saturated and the surplus saves are dropped.
  const auto interval = std::chrono::microseconds(a.commit_interval_us);
  auto next = std::chrono::steady_clock::now();
  Stopwatch phase;
  uint64_t c = 0;
  while (phase.Seconds() < a.commit_seconds) {
    const std::string id = "c" + std::to_string(c);
    const auto prompt = BenchPrompt(500000 + static_cast<uint32_t>(c),
                                    size_t{per_request} * layout.tokens_per_block + 1);
    std::vector<uint32_t> g1(per_request + 1);
    std::iota(g1.begin(), g1.end(), 0u);
    auto lr = (*m5)->Lookup({id, std::span<const TokenId>(prompt).subspan(0, 1), "", "", {}}, 0);
    if (!lr.ok()) return Failure(lr.status());
    (void)(*m5)->PrepareLoad(id, g1, 0);
    for (uint32_t b = 1; b <= per_request; ++b, ++c) {
      next += interval;
      std::this_thread::sleep_until(next);
      const double cpu0 = ThreadCpuMicros();
      Stopwatch cw;
      Status s = (*m5)->Commit(
          id, std::span<const TokenId>(prompt).subspan(0, size_t{b} * layout.tokens_per_block), g1);
      lat.push_back(cw.Micros());
      cpu.push_back(ThreadCpuMicros() - cpu0);
      if (!s.ok()) return Failure(s);
      Stopwatch sw;
      (void)(*m5)->StartSave();
      start_save.push_back(sw.Micros());
      both.push_back(lat.back() + start_save.back());
    }
    // The next request reuses these G1 blocks: wait until no save reads them.
    if ((*m5)->RequestFinished(id)) {
      (*m5)->WaitForSaves();
      (void)(*m5)->Finished();
      next = std::chrono::steady_clock::now();
    }
  }
  const double commit_phase_s = phase.Seconds();
  (*m5)->WaitForSaves();
  const ManagerStats s5 = (*m5)->Stats();
  m5->reset();
  std::sort(lat.begin(), lat.end());
  std::sort(cpu.begin(), cpu.end());
  const double commit_cpu_p99 = cpu[std::min(cpu.size() - 1, cpu.size() * 99 / 100)];
  const double commit_p50 = lat[lat.size() / 2];
  const double commit_p99 = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  std::sort(start_save.begin(), start_save.end());
  const double start_save_p99 =
      start_save[std::min(start_save.size() - 1, start_save.size() * 99 / 100)];
  std::sort(both.begin(), both.end());
  const double step_save_p99 = both[std::min(both.size() - 1, both.size() * 99 / 100)];
  double commit_sum = 0;
  for (double v : lat) commit_sum += v;
  const double commit_per_s = static_cast<double>(lat.size()) / (commit_sum / 1e6);
  const double demote_gbps =
      static_cast<double>(s5.demoted_blocks) * layout.BlockBytes() / commit_phase_s / 1e9;
  std::filesystem::remove_all(a.dir, ec);
  progress.Update(5);
  progress.Finish();

  if (cli.Has("json")) {
    JsonObject out;
    out.Add("lookup_per_s", lookup_per_s)
        .Add("lookup_tokens", uint64_t{tokens})
        .Add("commit_per_s", commit_per_s)
        .Add("commit_p50_us", commit_p50)
        .Add("commit_p99_us", commit_p99)
        .Add("commit_cpu_p99_us", commit_cpu_p99)
        .Add("start_save_p99_us", start_save_p99)
        .Add("commit_and_start_save_p99_us", step_save_p99)
        .Add("commits", uint64_t{lat.size()})
        .Add("commit_demotions", s5.demoted_blocks)
        .Add("commit_demote_gbps", demote_gbps)
        .Add("commit_saved", s5.saved_blocks)
        .Add("commit_dropped", s5.dropped_saves)
        .Add("commit_demotion_failures", s5.demotion_failures)
        .Add("commit_not_admitted", s5.demotions_not_admitted)
        .Add("load_gbps_g2", load_gbps_g2)
        .Add("memcpy_gbps", memcpy_gbps)
        .Add("load_g2_ratio", load_gbps_g2 / memcpy_gbps)
        .Add("load_gbps_g3", load_gbps_g3)
        .Add("disk_read_gbps", *raw)
        .Add("load_g3_ratio", load_gbps_g3 / *raw)
        .Add("load_g3_blocks", uint64_t{g3load->by_tier[kTierG3]})
        .Add("save_gbps", save_gbps)
        .Add("threads", a.threads)
        .Add("block_bytes", layout.BlockBytes());
    std::printf("%s\n", out.Str().c_str());
  } else {
    std::printf("bench manager: %u prompts x %u blocks of %s, %u copy threads\n", a.prompts,
                a.prompt_blocks, layout.ToString().c_str(), a.threads);
    std::printf("  lookup          %10.0f /s   (%zu-token prompts, hash + match)\n", lookup_per_s,
                tokens);
    std::printf("  save G1->G2     %10.2f GB/s\n", save_gbps);
    std::printf("  load G2->G1     %10.2f GB/s   memcpy %.2f GB/s   ratio %.3f\n", load_gbps_g2,
                memcpy_gbps, load_gbps_g2 / memcpy_gbps);
    std::printf(
        "  load G3->G1     %10.2f GB/s   disk tier reads %.2f GB/s   ratio %.3f  (%u blocks from "
        "G3)\n",
        load_gbps_g3, *raw, load_gbps_g3 / *raw, g3load->by_tier[kTierG3]);
    std::printf(
        "  commit          %10.0f /s   p50 %.1f us   p99 %.1f us   (%zu commits; meanwhile %llu "
        "demotions, %.2f GB/s to G3; %llu saves dropped)\n",
        commit_per_s, commit_p50, commit_p99, lat.size(),
        static_cast<unsigned long long>(s5.demoted_blocks), demote_gbps,
        static_cast<unsigned long long>(s5.dropped_saves));
    std::printf("  start save      p99 %.1f us   (the StartSave after each commit)\n",
                start_save_p99);
  }
  return 0;
}

}  // namespace kvtier::cli

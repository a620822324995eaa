// kvtier bench disk: G3 throughput against the raw device, in the same run.
//
// Writes enough blocks to cover --total-bytes (2 GiB) through a DiskTier (O_DIRECT, io_uring,
// buffers in a registered G2 arena, --qd in flight), then reads them all back in random order,
// each read verified. Then, when fio is installed, runs fio on the same directory with the same
// block size, queue depth and bytes (randwrite, then randread; O_DIRECT, io_uring engine) and
// reports the ratios. The fio command is printed and written down in bench/README.md.
//
// Like with like: with --hugepages on (the default) both sides use 2 MiB-page buffers. The bench
// raises vm.nr_hugepages for the run by what fio (--iomem=shmhuge: iodepth x bs) and the G2
// arena (a hugetlbfs memfd) need, and puts the old value back on every exit, signals included.
// When the pages cannot be had (not root, or the kernel finds too few) fio runs on 4 KiB pages
// and the output says so (fio_buffers, fio_buffers_reason).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <fstream>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_timer.h"
#include "bench/hugepage_reservation.h"
#include "cli/commands.h"
#include "cli/json_writer.h"
#include "cli/progress.h"
#include "core/mutex.h"
#include "tier/cond_wait.h"
#include "tier/disk_tier.h"
#include "tier/host_arena.h"

namespace kvtier::cli {
namespace {

void PrintUsage() {
  std::printf(
      "usage: kvtier bench disk [--dir D] [--block-bytes N] [--qd Q] [--total-bytes T]\n"
      "                         [--rounds R] [--backend B] [--no-fio] [--keep] [--json]\n"
      "  Writes T bytes of N-byte blocks through the G3 tier, then reads them back in random\n"
      "  order (O_DIRECT: from the device, not the page cache), and runs fio with the same\n"
      "  block size, queue depth and bytes when fio is installed: both sides written once\n"
      "  first (unmeasured), then R rounds of write + random read, alternating with fio;\n"
      "  the best round of each is reported.\n"
      "  --dir D (./kvtier-data; the bench works in D/bench-<pid> and removes it)\n"
      "  --block-bytes N (2MiB)  --qd Q (32)  --total-bytes T (2GiB)  --rounds R (3)\n"
      "  --backend auto|io_uring|threads (auto)\n"
      "  --hugepages on|off (on): 2 MiB-page buffers on both sides: G2 on a hugetlbfs memfd\n"
      "  and fio with --iomem=shmhuge, vm.nr_hugepages raised for the run and restored after\n"
      "  (as root; otherwise G2 on transparent huge pages and fio on 4 KiB pages, reported in\n"
      "  fio_buffers). A 2 MiB I/O from 4 KiB pages needs many more DMA segments and is split\n"
      "  by the block layer, so fio on 4 KiB pages is not the device's limit. off: G2 on 4 KiB\n"
      "  pages, fio on 4 KiB pages\n");
}

// Collects results; WaitSome returns whatever arrived (at least one).
class Collector final : public DiskCompletionSink {
 public:
  void OnDiskOpDone(const DiskOpResult& r) override {
    MutexLock lock(&mu_);  // notify under the lock: the waiter may be about to return
    done_.push_back(r);
    cv_.notify_one();
  }
  std::vector<DiskOpResult> WaitSome() {
    MutexLock lock(&mu_);
    while (done_.empty()) CondWait(&cv_, &mu_);
    std::vector<DiskOpResult> out;
    out.swap(done_);
    return out;
  }

 private:
  Mutex mu_;
  std::condition_variable cv_;
  std::vector<DiskOpResult> done_ GUARDED_BY(mu_);
};

BlockKey BenchKey(uint64_t i) {
  return BlockKey{0xbe9c4d15c0ffee00ull ^ i, i * 0x9e3779b97f4a7c15ull};
}

struct PhaseResult {
  double seconds = 0;
  uint64_t failures = 0;
  std::string first_error;
};

// Runs `n` requests with up to `window` outstanding; buffers cycle through the arena's slots.
// Whatever can be started is handed to `submit` as one batch of (request index, buffer index)
// pairs, so the tier sees batches, as it does from the transfer engine.
template <typename Submit>
PhaseResult RunPhase(uint64_t n, uint32_t window, Collector* collector, Submit submit) {
  PhaseResult out;
  Stopwatch sw;
  uint64_t next = 0, done = 0;
  std::vector<uint32_t> idle(window);
  std::iota(idle.begin(), idle.end(), 0);
  std::vector<std::pair<uint64_t, uint32_t>> batch;
  while (done < n) {
    batch.clear();
    while (next < n && !idle.empty()) {
      batch.emplace_back(next++, idle.back());
      idle.pop_back();
    }
    if (!batch.empty()) submit(batch);
    for (const DiskOpResult& r : collector->WaitSome()) {
      ++done;
      idle.push_back(static_cast<uint32_t>(r.cookie));
      if (!r.status.ok()) {
        if (out.failures++ == 0) out.first_error = r.status.ToString();
      }
    }
  }
  out.seconds = sw.Seconds();
  return out;
}

// Extracts jobs[0].<section>.bw_bytes from fio's JSON output ("<section>" : { ... "bw_bytes" :
// N ...}); -1 when absent. The section name also appears as a value ("rw" : "write"), so only
// a key followed by an object counts.
double FioBandwidth(const std::string& json, const std::string& section) {
  const std::string key = "\"" + section + "\"";
  for (size_t s = json.find(key); s != std::string::npos; s = json.find(key, s + 1)) {
    size_t p = json.find_first_not_of(" \t\r\n", s + key.size());
    if (p == std::string::npos || json[p] != ':') continue;
    p = json.find_first_not_of(" \t\r\n", p + 1);
    if (p == std::string::npos || json[p] != '{') continue;
    const size_t b = json.find("\"bw_bytes\"", p);
    if (b == std::string::npos) return -1;
    const size_t colon = json.find(':', b);
    if (colon == std::string::npos) return -1;
    return std::strtod(json.c_str() + colon + 1, nullptr);
  }
  return -1;
}

bool FioInstalled() { return std::system("command -v fio >/dev/null 2>&1") == 0; }

// Runs one fio job; returns bytes/s, or -1 with `error` set.
double RunFio(const std::string& command, const std::string& section, std::string* error) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    *error = "popen failed";
    return -1;
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  const size_t brace = out.find('{');
  const double bw = brace == std::string::npos ? -1 : FioBandwidth(out.substr(brace), section);
  if (rc != 0 || bw <= 0) {
    *error = "fio failed (exit " + std::to_string(rc) + "): " + out.substr(0, 400);
    return -1;
  }
  return bw;
}

std::string JsonArray(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%s%.4f", i ? ", " : "", v[i]);
    out += buf;
  }
  return out + "]";
}

}  // namespace

int RunBenchDisk(const CliArgs& args) {
  if (args.Has("help")) {
    PrintUsage();
    return 0;
  }
  if (Status s = args.CheckKnown({"json", "help", "dir", "block-bytes", "qd", "total-bytes",
                                  "rounds", "backend", "no-fio", "keep", "hugepages"});
      !s.ok()) {
    return UsageError(s);
  }
  auto block_bytes = args.GetUint("block-bytes", 2ull << 20);
  auto qd = args.GetUint("qd", 32);
  auto total = args.GetUint("total-bytes", 2ull << 30);
  auto rounds = args.GetUint("rounds", 3);
  auto backend = ParseIoBackend(args.GetString("backend", "auto"));
  for (const auto* r : {&block_bytes, &qd, &total, &rounds}) {
    if (!r->ok()) return UsageError(r->status());
  }
  if (!backend.ok()) return UsageError(backend.status());
  const std::string hugepages = args.GetString("hugepages", "on");
  if (hugepages != "on" && hugepages != "off") {
    return UsageError(Status::InvalidArgument("--hugepages must be on or off"));
  }
  if (*block_bytes < 4096 || *block_bytes > KvLayout::kMaxBlockBytes || *block_bytes % 4096 != 0) {
    return UsageError(Status::InvalidArgument(
        "--block-bytes must be a multiple of 4096 in 4KiB..1GiB (fio needs aligned O_DIRECT I/O)"));
  }
  if (*qd < 1 || *qd > 1024) return UsageError(Status::InvalidArgument("--qd must be in 1..1024"));
  if (*rounds < 1 || *rounds > 100) {
    return UsageError(Status::InvalidArgument("--rounds must be in 1..100"));
  }
  const bool json = args.Has("json");
  const uint64_t blocks = std::max<uint64_t>(1, (*total + *block_bytes - 1) / *block_bytes);
  const uint32_t depth = static_cast<uint32_t>(*qd);
  const std::string parent = args.GetString("dir", "./kvtier-data");
  const std::string base = parent + "/bench-" + std::to_string(getpid());
  std::error_code ec;
  const bool parent_existed = std::filesystem::exists(parent, ec);
  if (parent_existed && !std::filesystem::is_directory(parent, ec)) {
    return UsageError(Status::InvalidArgument("--dir " + parent +
                                              " exists and is not a directory; give a "
                                              "directory to work in"));
  }
  std::filesystem::create_directories(base, ec);
  if (ec) {
    return UsageError(Status::InvalidArgument("--dir: cannot create " + base + ": " + ec.message() +
                                              "; give a writable directory"));
  }
  struct Cleanup {
    std::string dir;
    std::string parent;  // removed too (when empty) if the bench created it
    bool keep;
    ~Cleanup() {
      std::error_code e;
      if (keep) return;
      std::filesystem::remove_all(dir, e);
      if (!parent.empty()) std::filesystem::remove(parent, e);
    }
  } cleanup{base, parent_existed ? "" : parent, args.Has("keep")};

  const bool want_fio = !args.Has("no-fio");
  const bool have_fio = want_fio && FioInstalled();

  // G2 buffers: twice the queue depth, so the ring stays full while completed buffers are
  // turned around.
  const uint64_t stride = (kBlockHeaderBytes + *block_bytes + 4095) / 4096 * 4096;
  const uint32_t window = static_cast<uint32_t>(std::min<uint64_t>(2 * depth, blocks));

  // Huge pages for both sides (declared before the arena: restored after it is unmapped).
  // fio's buffers are iodepth x bs bytes plus alignment, one shm segment rounded up to whole
  // pages (fio 3.33 at 32 x 2 MiB took 34 pages: 4 pages of slack); the arena is window x
  // stride rounded up to 2 MiB, plus one page.
  constexpr uint64_t kHuge = 2ull << 20;
  HugepageReservation reservation;
  bool huge_reserved = false;
  std::string fio_buffers = "4k";
  std::string fio_buffers_reason;
  uint64_t hugepages_needed = 0;
  uint64_t fio_pages = 0;
  if (hugepages == "off") {
    fio_buffers_reason = "--hugepages off: fio and G2 on 4 KiB pages";
  } else if (const long long kb = MeminfoField("Hugepagesize"); kb != 2048) {
    fio_buffers_reason =
        (kb < 0 ? std::string("no hugetlb support in this kernel")
                : "the default huge page size is " + std::to_string(kb) + " kB, not 2048") +
        "; no huge pages reserved, fio on 4 KiB pages";
  } else {
    fio_pages = have_fio ? (uint64_t{depth} * *block_bytes + kHuge - 1) / kHuge + 4 : 0;
    const uint64_t arena_pages = (uint64_t{window} * stride + kHuge - 1) / kHuge + 1;
    hugepages_needed = fio_pages + arena_pages;
    std::string why;
    huge_reserved = reservation.Reserve(hugepages_needed, &why);
    if (huge_reserved) {
      fio_buffers = "hugepages";
      fio_buffers_reason = std::to_string(hugepages_needed) + " x 2 MiB pages needed (fio " +
                           std::to_string(fio_pages) + ", G2 " + std::to_string(arena_pages) +
                           "); " + reservation.reason();
    } else {
      fio_buffers_reason =
          "no huge pages for fio: " + why + "; fio on 4 KiB pages, G2 on transparent huge pages";
    }
    if (!json) std::printf("huge pages: %s\n", fio_buffers_reason.c_str());
  }

  DiskTier::Config config;
  config.dir = base + "/g3";
  config.payload_bytes = *block_bytes;
  config.layout_fingerprint = 0xbe4c4d15c;
  config.queue_depth = depth;
  config.max_queued = 4 * depth;
  config.io_backend = *backend;
  config.snapshot_on_close = false;
  config.admission.min_seen = 1;
  config.capacity_bytes = kFirstSlotOffset + blocks * stride;
  HostArena::Config arena_config;
  arena_config.slot_bytes = stride;
  arena_config.capacity_bytes = uint64_t{window} * stride;
  arena_config.hugepages = hugepages == "on";
  // With reserved pages, a hugetlbfs memfd (as the service's shared G2 has it); else private
  // memory with MADV_HUGEPAGE (transparent huge pages when the kernel has them).
  arena_config.shared = huge_reserved;
  auto arena = HostArena::Create(arena_config);
  if (!arena.ok()) return Failure(arena.status());
  const std::string arena_buffers = (*arena)->startup().hugetlb             ? "hugetlbfs"
                                    : (*arena)->startup().hugepages_advised ? "thp-advised"
                                                                            : "4k";
  std::mt19937_64 rng(42);
  for (uint32_t b = 0; b < window; ++b) {
    auto* p = reinterpret_cast<uint64_t*>((*arena)->SlotData(b) + kBlockHeaderBytes);
    for (uint64_t i = 0; i < *block_bytes / 8; ++i) p[i] = rng();
  }
  DiskTier::OpenOptions options;
  options.buffers.push_back(DiskBufferRegion{(*arena)->base(), (*arena)->mapped_bytes()});
  auto opened = DiskTier::Open(config, options);
  if (!opened.ok()) return Failure(opened.status());
  DiskTier* tier = opened->tier.get();

  std::vector<uint64_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const std::vector<TokenId> tokens(16, 7);
  Collector collector;
  struct {
    std::vector<DiskWriteRequest> write;
    std::vector<DiskReadRequest> read;
  } requests;

  const std::string fio_file = base + "/fio.dat";
  // --fixedbufs=1: registered buffers, when the tier registered the arena (it cannot under a
  // small RLIMIT_MEMLOCK, and neither can fio then). Not --registerfiles or --sqthread_poll: the
  // tier uses neither.
  const bool fixed_bufs = tier->stats().buffers_registered;
  auto fio_command = [&](bool huge) {
    return "fio --name=kvtier-g3 --filename=" + fio_file +
           " --size=" + std::to_string(blocks * *block_bytes) +
           " --bs=" + std::to_string(*block_bytes) + " --iodepth=" + std::to_string(depth) +
           " --direct=1 --ioengine=io_uring" + (fixed_bufs ? " --fixedbufs=1" : "") +
           (huge ? " --iomem=shmhuge --hugepage-size=2m" : "") +
           " --numjobs=1 --output-format=json";
  };
  std::string fio_common = fio_command(fio_buffers == "hugepages");
  // One fio run; with huge pages, the pool is topped up first if others took pages out of it,
  // and a run that failed is retried once after topping up again.
  auto run_fio = [&](const std::string& command, const std::string& section, std::string* error) {
    const bool huge = fio_buffers == "hugepages";
    if (huge) (void)reservation.EnsureFree(fio_pages);
    double bw = RunFio(command, section, error);
    if (bw < 0 && huge && reservation.EnsureFree(fio_pages)) {
      error->clear();
      bw = RunFio(command, section, error);
    }
    return bw;
  };

  double best_write = 0, best_read = 0, best_fio_write = 0, best_fio_read = 0;
  uint64_t failures = 0;
  std::string first_error, fio_error;
  auto note = [&](const PhaseResult& p) {
    failures += p.failures;
    if (first_error.empty()) first_error = p.first_error;
  };
  auto write_all = [&] {
    return RunPhase(blocks, window, &collector, [&](const auto& batch) {
      requests.write.clear();
      for (const auto& [i, b] : batch) {
        uint8_t* buf = (*arena)->SlotData(b);
        std::memcpy(buf + kBlockHeaderBytes, &i, sizeof(i));  // every block's bytes differ
        DiskWriteRequest r;
        r.key = BenchKey(i);
        r.tokens = tokens;
        r.buffer = buf;
        r.sink = &collector;
        r.cookie = b;
        requests.write.push_back(r);
      }
      tier->SubmitWrites(requests.write);
    });
  };
  // Removing in random order leaves the free slots in random order, so the measured writes
  // land at random offsets, as fio's randwrite does (and as a tier that evicts does).
  auto remove_all = [&] {
    for (uint64_t i : order) (void)tier->Remove(BenchKey(i));
  };
  // Precondition both: every slot and every fio block written once, unmeasured, so that
  // neither side measures the first write into freshly allocated (unwritten) extents.
  note(write_all());
  remove_all();
  if (have_fio) {
    std::string error;
    if (run_fio(fio_common + " --rw=write", "write", &error) < 0) {
      if (fio_buffers == "hugepages") {
        // fio could not use the huge pages (shm limits, an old fio): 4 KiB pages, said so.
        fio_buffers = "4k";
        fio_buffers_reason =
            "fio with --iomem=shmhuge failed (" + error.substr(0, 200) + "); fio on 4 KiB pages";
        fio_common = fio_command(false);
        error.clear();
        if (RunFio(fio_common + " --rw=write", "write", &error) < 0) fio_error = error;
      } else {
        fio_error = error;
      }
    }
  }
  const std::string fio_write_cmd = fio_common + " --rw=randwrite";
  const std::string fio_read_cmd = fio_common + " --rw=randread";
  std::vector<double> round_write, round_read, round_fio_write, round_fio_read;
  Progress progress("bench disk", *rounds, "rounds");
  auto fio_write = [&] {
    if (!have_fio || !fio_error.empty()) return;
    const double bw = run_fio(fio_write_cmd, "write", &fio_error);
    if (bw > 0) best_fio_write = std::max(best_fio_write, bw / 1e9);
    if (bw > 0) round_fio_write.push_back(bw / 1e9);
  };
  auto fio_read = [&] {
    if (!have_fio || !fio_error.empty()) return;
    const double bw = run_fio(fio_read_cmd, "read", &fio_error);
    if (bw > 0) best_fio_read = std::max(best_fio_read, bw / 1e9);
    if (bw > 0) round_fio_read.push_back(bw / 1e9);
  };
  auto read_all = [&] {
    std::shuffle(order.begin(), order.end(), rng);
    return RunPhase(blocks, window, &collector, [&](const auto& batch) {
      requests.read.clear();
      for (const auto& [i, b] : batch) {
        DiskReadRequest r;
        r.key = BenchKey(order[i]);
        r.expected_tokens = tokens;
        r.buffer = (*arena)->SlotData(b);
        r.sink = &collector;
        r.cookie = b;
        requests.read.push_back(r);
      }
      tier->SubmitReads(requests.read);
    });
  };
  for (uint64_t round = 0; round < *rounds; ++round) {
    // fio and kvtier alternate so that both see the same state of a shared, noisy machine, and
    // the order flips every round (fio first in even rounds, kvtier first in odd ones): the
    // virtual disk absorbs writes into a host cache and pays for them during whatever comes
    // next, so a fixed order would always charge one side for the other's writes.
    const bool fio_first = round % 2 == 0;
    PhaseResult w, rd;
    if (fio_first) fio_write();
    w = write_all();
    if (!fio_first) fio_write();
    if (fio_first) fio_read();
    rd = read_all();
    if (!fio_first) fio_read();
    remove_all();
    note(w);
    note(rd);
    round_write.push_back(static_cast<double>(blocks * *block_bytes) / w.seconds / 1e9);
    round_read.push_back(static_cast<double>(blocks * *block_bytes) / rd.seconds / 1e9);
    best_write = std::max(best_write, round_write.back());
    best_read = std::max(best_read, round_read.back());
    progress.Update(round + 1);
  }
  progress.Finish();
  const DiskTierStats stats = tier->stats();
  (void)tier->Close();
  opened->tier.reset();
  arena->reset();
  reservation.Restore();  // the pages go back as soon as nothing holds them
  if (failures > 0) {
    std::fprintf(stderr, "kvtier bench disk: %llu request(s) failed, first: %s\n",
                 static_cast<unsigned long long>(failures), first_error.c_str());
    return 1;
  }
  const bool fio_ran = best_fio_write > 0 && best_fio_read > 0;
  const std::string fio_state = !want_fio   ? "skipped"
                                : !have_fio ? "not installed"
                                : fio_ran   ? "ran"
                                            : "failed";
  const double write_ratio = fio_ran ? best_write / best_fio_write : 0;
  const double read_ratio = fio_ran ? best_read / best_fio_read : 0;
  if (json) {
    JsonObject o;
    o.Add("write_gbps", best_write);
    o.Add("read_gbps", best_read);
    o.Add("block_bytes", *block_bytes);
    o.Add("qd", depth);
    o.Add("blocks", blocks);
    o.Add("total_bytes", blocks * *block_bytes);
    o.Add("rounds", *rounds);
    o.Add("io_backend", stats.io_backend);
    o.Add("registered_buffers", stats.buffers_registered);
    o.Add("hugepages", hugepages == "on");
    o.Add("verify_failures", stats.verify_failures);
    o.Add("fio", fio_state);
    if (fio_ran) {
      o.Add("fio_write_gbps", best_fio_write);
      o.Add("fio_read_gbps", best_fio_read);
      o.Add("write_vs_fio", write_ratio);
      o.Add("read_vs_fio", read_ratio);
    }
    o.Add("fio_buffers", fio_buffers);
    o.Add("fio_buffers_reason", fio_buffers_reason);
    o.Add("g2_buffers", arena_buffers);
    o.Add("hugepages_needed", hugepages_needed);
    o.Add("hugepages_topups", reservation.topups());
    if (have_fio) {
      o.Add("fio_write_command", fio_write_cmd);
      o.Add("fio_read_command", fio_read_cmd);
    }
    if (!fio_error.empty()) o.Add("fio_error", fio_error);
    o.Raw("round_write_gbps", JsonArray(round_write));
    o.Raw("round_read_gbps", JsonArray(round_read));
    o.Raw("round_fio_write_gbps", JsonArray(round_fio_write));
    o.Raw("round_fio_read_gbps", JsonArray(round_fio_read));
    std::printf("%s\n", o.Str().c_str());
    return 0;
  }
  std::printf(
      "G3 bench: %llu blocks of %llu bytes (%.2f GiB), queue depth %u, %s%s%s, best of %llu\n",
      static_cast<unsigned long long>(blocks), static_cast<unsigned long long>(*block_bytes),
      static_cast<double>(blocks * *block_bytes) / (1ull << 30), depth, stats.io_backend.c_str(),
      stats.buffers_registered ? " with registered buffers" : "",
      arena_buffers == "hugetlbfs"     ? " on hugetlbfs pages"
      : arena_buffers == "thp-advised" ? " on transparent huge pages"
                                       : " on 4 KiB pages",
      static_cast<unsigned long long>(*rounds));
  std::printf("  write (random slots, one I/O per block)      %7.3f GB/s", best_write);
  if (fio_ran) std::printf("   fio randwrite %7.3f GB/s   ratio %.2f", best_fio_write, write_ratio);
  std::printf("\n  read  (random order, every block verified)   %7.3f GB/s", best_read);
  if (fio_ran) std::printf("   fio randread  %7.3f GB/s   ratio %.2f", best_fio_read, read_ratio);
  std::printf("\n");
  if (have_fio) {
    std::printf("  fio buffers: %s (%s)\n",
                fio_buffers == "hugepages" ? "2 MiB huge pages" : "4 KiB pages",
                fio_buffers_reason.c_str());
  }
  if (fio_ran) {
    std::printf("  fio: %s --rw=randwrite|randread\n", fio_common.c_str());
  } else {
    std::printf("  fio %s%s%s\n", fio_state.c_str(), fio_error.empty() ? "" : ": ",
                fio_error.c_str());
  }
  return 0;
}

}  // namespace kvtier::cli

// kvtier bench handoff: the P/D handoff (docs/pd.md) of one prefilled prompt, from a producer
// engine's G1 to a consumer engine's G1, through kvtier, against the raw limit of the same path
// measured in the same run:
//
//   one host:     producer and consumer attached to one `kvtier serve`; the consumer's load is a
//                 copy from the shared G2 mapping into its G1. Limit: memcpy of the same bytes.
//   across hosts: each engine attached to its own daemon; the daemons share only a Redis G4
//                 (write-through). The consumer fetches the objects itself, straight into its
//                 G1 (g4.direct_to_g1, the default). A second consumer on a third daemon with
//                 g4.direct_to_g1 = false loads the same prompt G4 -> its daemon's G2 -> its G1,
//                 for comparison. Limit: redis-benchmark GET of the same value size, as many
//                 clients as G4 has threads (the best of pipeline 1 and 2).
//
// The daemons run in this process on their own threads (as `bench service`); the engines are
// attached BlockManagers with host G1s in vLLM's arrangement (one region per layer and plane).
// Every loaded block is checked byte for byte. The bar: each handoff <= 1.2 x its limit.
//
// Every repetition's time is kept and printed (min / median / max), and each ratio is given
// best/best and median/median: on a shared VM one run's best moves by 30% (issue 40). memcpy
// is measured between the repetitions, not once. The one-host load is traced phase by phase
// (proto/load_trace.h), and run twice per repetition, in turns: with the configured
// transfer.load_stores (auto: non-temporal stores for a load larger than the last-level
// cache) and with cached stores (kvtier's copy before issue 40), to show what the stores cost.
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_timer.h"
#include "bench/redis_benchmark.h"
#include "cli/commands.h"
#include "cli/embedded_redis.h"
#include "cli/json_writer.h"
#include "daemon/server.h"
#include "kvtier/connector.h"
#include "proto/load_trace.h"
#include "transfer/block_copy.h"

namespace kvtier::cli {
namespace {

// Llama-3-8B's KV in bf16: 32 layers x {K,V} x 8 KV heads x 128 x 16 tokens = 2 MiB a block.
KvLayout HandoffLayout() {
  KvLayout l;
  l.num_layers = 32;
  l.num_planes = 2;
  l.num_kv_heads = 8;
  l.head_dim = 128;
  l.tokens_per_block = 16;
  l.dtype = DType::kBf16;
  l.g1_arrangement = G1Arrangement::kLayerSeparate;
  return l;
}

// What pages a buffer asks for: none (as malloc: transparent huge pages only when
// /sys/kernel/mm/transparent_hugepage/enabled is `always`), MADV_HUGEPAGE, MADV_NOHUGEPAGE.
enum class Pages { kDefault, kHuge, kSmall };

Result<Pages> ParsePages(const std::string& flag, const std::string& v) {
  if (v == "default") return Pages::kDefault;
  if (v == "huge") return Pages::kHuge;
  if (v == "small") return Pages::kSmall;
  return Status::InvalidArgument("--" + flag + " default|huge|small, not '" + v + "'");
}

// An anonymous mapping laid out as malloc lays out a large allocation (its data 16 bytes into a
// page: the skew CopyLarge handles), 2 MiB-aligned so that it can get huge pages, advised as
// `pages` asks, then written (pre-faulted).
class Buffer {
 public:
  Buffer(uint64_t bytes, Pages pages, uint8_t fill) : bytes_(bytes) {
    constexpr uint64_t kHuge = uint64_t{2} << 20;
    mapped_ = bytes + 2 * kHuge;
    void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("bench handoff: mmap");
      std::abort();
    }
    base_ = static_cast<uint8_t*>(p);
    uint8_t* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base_) + kHuge - 1) &
                                                  ~uintptr_t{kHuge - 1});
    if (pages != Pages::kDefault) {
      (void)::madvise(aligned, bytes + kHuge,
                      pages == Pages::kHuge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    }
    data_ = aligned + 16;
    std::memset(data_, fill, bytes);
  }
  ~Buffer() { ::munmap(base_, mapped_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() const { return data_; }
  uint64_t size() const { return bytes_; }

 private:
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t mapped_ = 0;
  uint64_t bytes_ = 0;
};

// An engine's G1: one region per (layer, plane), each `blocks` chunks long, pre-faulted.
struct HostG1 {
  std::vector<std::unique_ptr<Buffer>> regions;
  G1Memory memory;

  HostG1(const KvLayout& l, uint32_t blocks, Pages pages) {
    memory.layout = l;
    memory.num_blocks = blocks;
    for (uint32_t r = 0; r < l.num_layers * l.num_planes; ++r) {
      regions.push_back(std::make_unique<Buffer>(uint64_t{blocks} * l.ChunkBytes(), pages, 0));
      memory.regions.push_back(G1Region{regions.back()->data(), l.ChunkBytes()});
    }
  }
  // Block b's chunks hold a pattern of (seed, b, region): a block landing in the wrong place,
  // or another prompt's, is caught.
  void Fill(uint32_t seed, uint32_t blocks) {
    for (size_t r = 0; r < regions.size(); ++r) {
      for (uint32_t b = 0; b < blocks; ++b) Pattern(seed, b, r, Chunk(r, b));
    }
  }
  bool Holds(uint32_t seed, uint32_t blocks) const {
    std::vector<uint8_t> want(memory.layout.ChunkBytes());
    for (size_t r = 0; r < regions.size(); ++r) {
      for (uint32_t b = 0; b < blocks; ++b) {
        Pattern(seed, b, r, want.data());
        if (std::memcmp(want.data(), regions[r]->data() + uint64_t{b} * want.size(), want.size()))
          return false;
      }
    }
    return true;
  }
  void Clear() {
    for (auto& r : regions) std::memset(r->data(), 0, r->size());
  }

 private:
  uint8_t* Chunk(size_t r, uint32_t b) {
    return regions[r]->data() + uint64_t{b} * memory.layout.ChunkBytes();
  }
  void Pattern(uint32_t seed, uint32_t b, size_t r, uint8_t* dst) const {
    uint64_t x = (uint64_t{seed} << 40) ^ (uint64_t{b} << 20) ^ r ^ 0x9e3779b97f4a7c15ull;
    const uint64_t n = memory.layout.ChunkBytes() / 8;
    for (uint64_t i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      std::memcpy(dst + i * 8, &x, 8);
    }
  }
};

std::vector<TokenId> Prompt(uint32_t seed, uint32_t tokens) {
  std::vector<TokenId> p(tokens);
  for (uint32_t i = 0; i < tokens; ++i) p[i] = seed * 100003u + i * 7u + 1u;
  return p;
}

Result<std::unique_ptr<BlockManager>> Attach(const KvLayout& l, const std::string& socket,
                                             const std::string& name, G1Memory* g1,
                                             const std::string& load_stores = "auto") {
  ManagerOptions mo;
  mo.layout = l;
  mo.model_id = "bench-handoff";
  KVTIER_RETURN_IF_ERROR(mo.config.Set("transfer.load_stores", load_stores));
  (void)mo.config.Set("service.socket", socket);
  (void)mo.config.Set("service.instance", name);
  (void)mo.config.Set("service.call_timeout_ms", "60000");
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockManager> m, BlockManager::Create(mo));
  KVTIER_RETURN_IF_ERROR(m->RegisterDeviceMemory(*g1));
  return m;
}

// The producer's prefill: `blocks` computed blocks (+1 token) committed and saved; returns when
// the saves are done (G2; a G4 write-through may still be on its way).
Status Produce(BlockManager& p, HostG1& g1, const std::string& id, uint32_t seed, uint32_t blocks) {
  const uint32_t bs = g1.memory.layout.tokens_per_block;
  const std::vector<TokenId> prompt = Prompt(seed, blocks * bs + 1);
  RequestSpec spec;
  spec.request_id = id;
  spec.prompt = prompt;
  KVTIER_RETURN_IF_ERROR(p.Lookup(spec, 0).status());
  std::vector<uint32_t> ids(blocks + 1);
  for (uint32_t b = 0; b <= blocks; ++b) ids[b] = b;
  KVTIER_RETURN_IF_ERROR(p.PrepareLoad(id, ids, 0).status());
  g1.Fill(seed, blocks);
  KVTIER_RETURN_IF_ERROR(p.Commit(id, prompt, ids));
  KVTIER_RETURN_IF_ERROR(p.StartSave());
  p.WaitForRequestSaves(id);
  (void)p.RequestFinished(id);
  (void)p.Finished();
  return Status::Ok();
}

// Where a traced one-host load spent its time (proto/load_trace.h), in seconds.
struct Phases {
  bool traced = false;
  double to_daemon_copy = 0;  // StartLoad -> the daemon queued the first kCopy
  double to_engine_copy = 0;  // -> the engine's data thread began it
  double copy = 0;            // the engine's ScatterLayer time, all layers
  double report = 0;          // its kCopyLayer sends, all layers
  double tail = 0;            // the last layer copied -> the last WaitLayer returned
  double report_lag = 0;      // the daemon read layer l's kCopyLayer after it was copied: mean
  double wait_lag = 0;        // WaitLayer(l) returned after layer l was copied: mean
  uint32_t batches = 0;       // kCopy load batches
};

struct Handoff {
  double seconds = 0;  // the consumer's StartLoad until its last layer landed
  uint32_t loaded_blocks = 0;
  uint32_t found_blocks = 0;
  bool bytes_ok = false;
  std::string tier;           // where the blocks were found
  uint64_t minor_faults = 0;  // the whole process's, during the load (getrusage)
  Phases phases;
};

uint64_t MinorFaults() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_minflt);
}

// The consumer's side: looks the prompt up until `blocks` blocks are found in `tier` (at most
// `wait_s`: a write-through may still be landing), then loads them into its G1 and checks them.
// With `trace`, the load's phases are traced (an attached load from G2).
Result<Handoff> Consume(BlockManager& d, HostG1& g1, const std::string& id, uint32_t seed,
                        uint32_t blocks, TierId tier, double wait_s,
                        proto::LoadTrace* trace = nullptr) {
  const uint32_t bs = g1.memory.layout.tokens_per_block;
  const uint32_t layers = g1.memory.layout.num_layers;
  const std::vector<TokenId> prompt = Prompt(seed, blocks * bs + 1);
  RequestSpec spec;
  spec.prompt = prompt;
  Handoff h;
  h.tier = TierName(tier);
  Stopwatch waited;
  LookupResult found;
  for (uint32_t attempt = 0;; ++attempt) {
    spec.request_id = id + "-" + std::to_string(attempt);
    KVTIER_ASSIGN_OR_RETURN(found, d.Lookup(spec, 0));
    if (found.blocks_by_tier[tier] >= blocks || waited.Seconds() > wait_s) break;
    (void)d.RequestFinished(spec.request_id);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  h.found_blocks = found.blocks_by_tier[tier];
  if (h.found_blocks < blocks) {
    (void)d.RequestFinished(spec.request_id);
    return Status::Unavailable("the consumer found " + std::to_string(h.found_blocks) + " of " +
                               std::to_string(blocks) + " blocks in " + h.tier + " after " +
                               std::to_string(wait_s) + " s");
  }
  std::vector<uint32_t> ids(blocks + 1);
  for (uint32_t b = 0; b <= blocks; ++b) ids[b] = b;
  g1.Clear();
  KVTIER_RETURN_IF_ERROR(d.PrepareLoad(spec.request_id, ids, found.num_tokens).status());
  std::vector<int64_t> waited_ns(layers, 0);
  if (trace) {
    trace->Reset();
    proto::g_load_trace.store(trace);
  }
  const uint64_t faults0 = MinorFaults();
  const int64_t t0 = proto::LoadTrace::NowNs();
  Stopwatch sw;
  KVTIER_RETURN_IF_ERROR(d.StartLoad());
  Status first = Status::Ok();
  for (uint32_t layer = 0; layer < layers; ++layer) {
    Status s = d.WaitLayer(layer);
    waited_ns[layer] = proto::LoadTrace::NowNs();
    if (!s.ok() && first.ok()) first = s;
  }
  h.seconds = sw.Seconds();
  h.minor_faults = MinorFaults() - faults0;
  if (trace) {
    proto::g_load_trace.store(nullptr);
    Phases& p = h.phases;
    auto s = [](int64_t ns) { return ns / 1e9; };
    p.traced = trace->first_copy_received_ns.load() != 0;
    p.to_daemon_copy = s(trace->first_copy_queued_ns.load() - t0);
    p.to_engine_copy = s(trace->first_copy_received_ns.load() - trace->first_copy_queued_ns.load());
    p.copy = s(trace->copy_ns.load());
    p.report = s(trace->report_ns.load());
    p.batches = trace->batches.load();
    int64_t last = 0;
    double lag = 0, report_lag = 0;
    const uint32_t n = std::min(layers, proto::LoadTrace::kMaxLayers);
    for (uint32_t l = 0; l < n; ++l) {
      const int64_t copied = trace->layer_copied_ns[l].load();
      last = std::max(last, copied);
      lag += s(std::max<int64_t>(0, waited_ns[l] - copied));
      report_lag += s(std::max<int64_t>(0, trace->layer_reported_ns[l].load() - copied));
    }
    p.tail = s(waited_ns[layers - 1] - last);
    p.wait_lag = n ? lag / n : 0;
    p.report_lag = n ? report_lag / n : 0;
  }
  h.loaded_blocks = d.LoadedTokens(spec.request_id) / bs;
  (void)d.RequestFinished(spec.request_id);
  (void)d.Finished();
  KVTIER_RETURN_IF_ERROR(first);
  h.bytes_ok = h.loaded_blocks == blocks && g1.Holds(seed, blocks);
  return h;
}

// A path's times, one per repetition, in seconds.
struct Samples {
  std::vector<double> v;
  void Add(double x) { v.push_back(x); }
  bool empty() const { return v.empty(); }
  std::vector<double> Sorted() const {
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    return s;
  }
  double Min() const { return v.empty() ? 0 : Sorted().front(); }
  double Max() const { return v.empty() ? 0 : Sorted().back(); }
  double Median() const {
    if (v.empty()) return 0;
    const std::vector<double> s = Sorted();
    const size_t n = s.size();
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  }
  std::string Json(double scale = 1) const {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%s%.6g", i ? ", " : "", v[i] * scale);
      out += buf;
    }
    return out + "]";
  }
  // "min / median / max ms" and each repetition's ms in order.
  std::string Text() const {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "%7.2f / %7.2f / %7.2f ms", Min() * 1e3, Median() * 1e3,
                  Max() * 1e3);
    return buf;
  }
  std::string Each() const {
    std::string out;
    for (double x : v) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), " %.1f", x * 1e3);
      out += buf;
    }
    return out;
  }
};

// Each traced load's phases, per repetition.
struct PhaseSamples {
  Samples to_daemon_copy, to_engine_copy, copy, report, tail, report_lag, wait_lag, minor_faults,
      batches;
  void Add(const Handoff& h) {
    to_daemon_copy.Add(h.phases.to_daemon_copy);
    to_engine_copy.Add(h.phases.to_engine_copy);
    copy.Add(h.phases.copy);
    report.Add(h.phases.report);
    tail.Add(h.phases.tail);
    report_lag.Add(h.phases.report_lag);
    wait_lag.Add(h.phases.wait_lag);
    minor_faults.Add(static_cast<double>(h.minor_faults));
    batches.Add(h.phases.batches);
  }
  std::string Json() const {
    JsonObject j;
    j.Raw("to_daemon_copy_ms", to_daemon_copy.Json(1e3))
        .Raw("to_engine_copy_ms", to_engine_copy.Json(1e3))
        .Raw("engine_copy_ms", copy.Json(1e3))
        .Raw("copy_layer_reports_ms", report.Json(1e3))
        .Raw("last_copy_to_last_wait_ms", tail.Json(1e3))
        .Raw("copy_layer_report_lag_ms", report_lag.Json(1e3))
        .Raw("wait_layer_lag_ms", wait_lag.Json(1e3))
        .Raw("minor_faults", minor_faults.Json())
        .Raw("kcopy_batches", batches.Json());
    return j.Str();
  }
  std::string Text(uint64_t bytes, uint32_t layers) const {
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "StartLoad -> daemon queues kCopy %.2f ms -> engine starts it %.2f ms; engine "
                  "copy %.2f ms (%.2f GB/s, %.3f ms a layer, %.0f kCopy batch(es)); kCopyLayer "
                  "sends %.2f ms; the daemon reads layer l's report %.2f ms and WaitLayer(l) "
                  "returns %.2f ms after layer l is copied; last "
                  "copy -> last WaitLayer %.2f ms; minor faults %.0f",
                  to_daemon_copy.Median() * 1e3, to_engine_copy.Median() * 1e3, copy.Median() * 1e3,
                  copy.Median() > 0 ? bytes / copy.Median() / 1e9 : 0, copy.Median() * 1e3 / layers,
                  batches.Median(), report.Median() * 1e3, report_lag.Median() * 1e3,
                  wait_lag.Median() * 1e3, tail.Median() * 1e3, minor_faults.Median());
    return buf;
  }
};

// Huge-page state (/proc/self/smaps): of the mapping that holds `p`, or (p null) of every
// mapping whose name holds `name`, its size and the part on huge pages, in KiB.
struct MappingPages {
  uint64_t kib = 0, huge_kib = 0, mappings = 0;
};

MappingPages SmapsPages(const void* p, const std::string& name) {
  MappingPages out;
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool in = false;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    const size_t dash = line.find('-'), space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2) {
      in = p ? lo <= at && at < hi : line.find(name) != std::string::npos;
      if (in) out.mappings++;
      continue;
    }
    if (!in) continue;
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    fields >> key >> kib;
    if (key == "Size:") out.kib += kib;
    if (key == "AnonHugePages:" || key == "ShmemPmdMapped:" || key == "FilePmdMapped:" ||
        key == "Shared_Hugetlb:" || key == "Private_Hugetlb:") {
      out.huge_kib += kib;
    }
  }
  return out;
}

// The word in brackets of a /sys/kernel/mm/transparent_hugepage file ("madvise", "never").
std::string ThpSetting(const std::string& file) {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/" + file);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t a = all.find('['), b = all.find(']');
  return a != std::string::npos && b != std::string::npos && b > a ? all.substr(a + 1, b - a - 1)
                                                                   : "?";
}

// The limit of the one-host path: memcpy of `bytes` between two pre-faulted buffers, measured
// once per Sample() call (between the repetitions), so that it sees the same noise.
class MemcpyLimit {
 public:
  MemcpyLimit(uint64_t bytes, Pages pages) : a_(bytes, pages, 1), b_(bytes, pages, 2) {}
  void Sample() {
    Stopwatch sw;
    std::memcpy(b_.data(), a_.data(), a_.size());
    samples.Add(sw.Seconds());
    if (b_.data()[a_.size() / 2] != 1) std::abort();  // the copy happened (not optimised away)
  }
  MappingPages PageState() const { return SmapsPages(a_.data(), ""); }
  Samples samples;

 private:
  Buffer a_, b_;
};

Result<std::unique_ptr<daemon::Server>> StartDaemon(const std::string& socket,
                                                    const std::string& g2_bytes,
                                                    const std::string& g4_endpoint,
                                                    bool direct_to_g1 = true) {
  daemon::ServeOptions so;
  so.socket_path = socket;
  (void)so.config.Set("g2.capacity_bytes", g2_bytes);
  (void)so.config.Set("g2.lock_memory", "false");
  (void)so.config.Set("g3.enabled", "false");
  if (!g4_endpoint.empty()) {
    KVTIER_RETURN_IF_ERROR(so.config.Set("g4.backend", "redis"));
    KVTIER_RETURN_IF_ERROR(so.config.Set("g4.endpoints", g4_endpoint));
    KVTIER_RETURN_IF_ERROR(so.config.Set("g4.write_through", "true"));
    KVTIER_RETURN_IF_ERROR(so.config.Set("g4.load_deadline_ms", "60000"));
    KVTIER_RETURN_IF_ERROR(so.config.Set("g4.save_deadline_ms", "60000"));
    KVTIER_RETURN_IF_ERROR(so.config.Set("g4.direct_to_g1", direct_to_g1 ? "true" : "false"));
  }
  return daemon::Server::Start(so);
}

void PrintUsage() {
  std::puts(
      "usage: kvtier bench handoff [--tokens N] [--reps R] [--no-g4] [--redis HOST:PORT]\n"
      "                            [--load-stores auto|cached|streaming]\n"
      "                            [--memcpy-pages default|huge|small] [--g1-pages ...] [--json]\n"
      "  The P/D handoff of one prefilled N-token prompt (default 4096; Llama-3-8B bf16 KV,\n"
      "  16-token blocks of 2 MiB) from a producer engine to a consumer engine, R times\n"
      "  (default 3; each time printed, with min / median / max):\n"
      "    one host: both attached to one kvtier serve; the consumer loads from the shared G2,\n"
      "      traced phase by phase, in turns with a second consumer whose transfer.load_stores\n"
      "      is cached (streaming when --load-stores cached). Limit: memcpy of the same bytes,\n"
      "      measured between the repetitions.\n"
      "    across hosts: each attached to its own daemon, the daemons sharing a Redis G4\n"
      "      (write-through; an embedded redis-server unless --redis); the consumer fetches\n"
      "      the objects straight into its G1, and a second one on a daemon with\n"
      "      g4.direct_to_g1 = false loads them through its daemon's G2. Limit:\n"
      "      redis-benchmark GET at the block size with g4.threads clients.\n"
      "  Every loaded block is checked byte for byte. Prints each handoff / its limit, best /\n"
      "  best and median / median (the issue's bar: <= 1.2x). --no-g4 measures the one-host\n"
      "  path only. --memcpy-pages / --g1-pages: madvise the memcpy buffers / the engines' G1\n"
      "  regions for huge pages (huge), against them (small), or not at all (default, as\n"
      "  malloc).");
}

// One path's line: min / median / max, GB/s at the best, and its ratios to a limit.
void PrintPath(const char* name, const Samples& s, uint64_t bytes, const Samples* limit) {
  std::printf("  %-34s %s  %6.2f GB/s best", name, s.Text().c_str(), bytes / s.Min() / 1e9);
  if (limit != nullptr && !limit->empty() && !s.empty()) {
    std::printf("   ratio %.2fx best/best, %.2fx median/median", s.Min() / limit->Min(),
                s.Median() / limit->Median());
  }
  std::printf("\n    each rep (ms):%s\n", s.Each().c_str());
}

}  // namespace

int RunBenchHandoff(const CliArgs& args) {
  if (args.Has("help")) {
    PrintUsage();
    return 0;
  }
  Status known = args.CheckKnown({"tokens", "reps", "no-g4", "redis", "json", "help", "load-stores",
                                  "memcpy-pages", "g1-pages"});
  if (!known.ok()) return UsageError(known);
  Result<uint64_t> tokens = args.GetUint("tokens", 4096);
  Result<uint64_t> reps = args.GetUint("reps", 3);
  if (!tokens.ok()) return UsageError(tokens.status());
  if (!reps.ok()) return UsageError(reps.status());
  const KvLayout l = HandoffLayout();
  if (*tokens < l.tokens_per_block || *tokens > 65536 || *reps == 0 || *reps > 100) {
    return UsageError(
        Status::InvalidArgument("--tokens 16..65536 (2 MiB of KV per 16 tokens), --reps 1..100"));
  }
  const std::string stores = args.GetString("load-stores", "auto");
  if (stores != "auto" && stores != "cached" && stores != "streaming") {
    return UsageError(
        Status::InvalidArgument("--load-stores auto|cached|streaming, not '" + stores + "'"));
  }
  const std::string other_stores = stores == "cached" ? "streaming" : "cached";
  Result<Pages> memcpy_pages =
      ParsePages("memcpy-pages", args.GetString("memcpy-pages", "default"));
  Result<Pages> g1_pages = ParsePages("g1-pages", args.GetString("g1-pages", "default"));
  if (!memcpy_pages.ok()) return UsageError(memcpy_pages.status());
  if (!g1_pages.ok()) return UsageError(g1_pages.status());
  const uint32_t blocks = static_cast<uint32_t>(*tokens / l.tokens_per_block);
  const uint64_t bytes = uint64_t{blocks} * l.BlockBytes();
  // G2 holds every repetition's prompt (each rep is a new prompt: nothing is served from an
  // earlier one), plus room for staging.
  const std::string g2_bytes =
      std::to_string((uint64_t{blocks} * (*reps + 1) + 64) * (l.BlockBytes() + 8192));
  const std::string dir = "/tmp/kvtier-bench-handoff-" + std::to_string(::getpid());
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "bench handoff: %s\n", s.ToString().c_str());
    return 1;
  };

  if (::mkdir(dir.c_str(), 0700) != 0) {
    return fail(Status::FromErrno(errno, "mkdir " + dir));
  }
  // Beside the limit, in turns with it: the same memcpy between buffers on 2 MiB pages
  // (MADV_HUGEPAGE), the limit of a machine whose THP setting (`always`) gives them to
  // std::vectors. The shared G2 is on 4 KiB pages unless shmem THP or hugetlbfs allows more.
  MemcpyLimit limit(bytes, *memcpy_pages), huge_limit(bytes, Pages::kHuge);
  auto sample_limits = [&] {
    limit.Sample();
    huge_limit.Sample();
  };
  sample_limits();
  sample_limits();
  HostG1 g1p(l, blocks + 1, *g1_pages), g1d(l, blocks + 1, *g1_pages);

  // kvtier's own G2 -> G1 load in one process (embedded manager, the same layout and G1): what
  // the attached handoff adds to it is the daemon's part (kCopy frames, one WaitLayer call per
  // layer) and the engine's copy thread.
  Samples embedded;
  bool all_ok = true;
  {
    ManagerOptions mo;
    mo.layout = l;
    mo.model_id = "bench-handoff";
    (void)mo.config.Set("g2.capacity_bytes", g2_bytes);
    (void)mo.config.Set("g2.lock_memory", "false");
    (void)mo.config.Set("g3.enabled", "false");
    (void)mo.config.Set("transfer.load_stores", stores);
    Result<std::unique_ptr<BlockManager>> m = BlockManager::Create(mo);
    if (!m.ok()) return fail(m.status());
    Status registered = (*m)->RegisterDeviceMemory(g1p.memory);
    if (!registered.ok()) return fail(registered);
    for (uint32_t r = 0; r < *reps; ++r) {
      Status made = Produce(**m, g1p, "p" + std::to_string(r), 300 + r, blocks);
      if (!made.ok()) return fail(made);
      Result<Handoff> h = Consume(**m, g1p, "d" + std::to_string(r), 300 + r, blocks, kTierG2, 5);
      if (!h.ok()) return fail(h.status());
      all_ok = all_ok && h->bytes_ok;
      embedded.Add(h->seconds);
      sample_limits();
    }
  }

  // One host: the consumer with the configured stores and one with the other stores load the
  // same prompt, in turns (which goes first alternates), each load traced.
  Samples one_host, one_host_other;
  PhaseSamples phases, phases_other;
  MappingPages g2_pages, g1_page_state;
  proto::LoadTrace trace;
  {
    auto daemon = StartDaemon(dir + "/host/kvtier.sock", g2_bytes, "");
    if (!daemon.ok()) return fail(daemon.status());
    auto p = Attach(l, dir + "/host/kvtier.sock", "prefill", &g1p.memory);
    if (!p.ok()) return fail(p.status());
    auto d = Attach(l, dir + "/host/kvtier.sock", "decode", &g1d.memory, stores);
    if (!d.ok()) return fail(d.status());
    auto o =
        Attach(l, dir + "/host/kvtier.sock", "decode-" + other_stores, &g1d.memory, other_stores);
    if (!o.ok()) return fail(o.status());
    for (uint32_t r = 0; r < *reps; ++r) {
      Status made = Produce(**p, g1p, "p" + std::to_string(r), 100 + r, blocks);
      if (!made.ok()) return fail(made);
      for (uint32_t k = 0; k < 2; ++k) {
        const bool mine = (k + r) % 2 == 0;
        Result<Handoff> h =
            mine ? Consume(**d, g1d, "d" + std::to_string(r), 100 + r, blocks, kTierG2, 5, &trace)
                 : Consume(**o, g1d, "o" + std::to_string(r), 100 + r, blocks, kTierG2, 5, &trace);
        if (!h.ok()) return fail(h.status());
        all_ok = all_ok && h->bytes_ok;
        (mine ? one_host : one_host_other).Add(h->seconds);
        (mine ? phases : phases_other).Add(*h);
      }
      sample_limits();
    }
    g2_pages = SmapsPages(nullptr, "memfd:kvtier-g2");
    g1_page_state = SmapsPages(g1d.regions[0]->data(), "");
    p->reset();
    d->reset();
    o->reset();
    (*daemon)->Stop();
  }

  // Across hosts.
  const bool with_g4 = !args.Has("no-g4");
  Samples g4, via_g2, rb;   // rb: redis-benchmark GET, as the seconds it would take for `bytes`
  bool direct_seen = true;  // every direct load fetched straight into G1
  double rb_get_gbps = 0;
  std::string rb_cmd, rb_error;
  uint32_t g4_threads = 0;
  if (with_g4) {
    EmbeddedRedis embedded_redis;
    std::string endpoint = args.GetString("redis", "");
    if (endpoint.empty()) {
      Status started = embedded_redis.Start();
      if (!started.ok()) return fail(started);
      endpoint = embedded_redis.endpoint();
    }
    auto a = StartDaemon(dir + "/a/kvtier.sock", g2_bytes, endpoint);
    if (!a.ok()) return fail(a.status());
    auto b = StartDaemon(dir + "/b/kvtier.sock", g2_bytes, endpoint);
    if (!b.ok()) return fail(b.status());
    auto c = StartDaemon(dir + "/c/kvtier.sock", g2_bytes, endpoint, /*direct_to_g1=*/false);
    if (!c.ok()) return fail(c.status());
    Config defaults;
    g4_threads = static_cast<uint32_t>(defaults.GetUint("g4.threads"));
    auto p = Attach(l, dir + "/a/kvtier.sock", "prefill", &g1p.memory);
    if (!p.ok()) return fail(p.status());
    auto d = Attach(l, dir + "/b/kvtier.sock", "decode", &g1d.memory, stores);
    if (!d.ok()) return fail(d.status());
    HostG1 g1v(l, blocks + 1, *g1_pages);
    auto v = Attach(l, dir + "/c/kvtier.sock", "decode-via-g2", &g1v.memory, stores);
    if (!v.ok()) return fail(v.status());
    // The limit is measured between repetitions, on the same server in the same state, so
    // that both sides see the same noise: redis-benchmark GET with pipeline 1 and 2 (deeper
    // pipelines of 2 MiB values are slower), the best of all its runs.
    std::string base;
    if (RedisBenchmarkInstalled()) {
      const size_t colon = endpoint.rfind(':');
      base = "redis-benchmark -h " + endpoint.substr(0, colon) + " -p " +
             endpoint.substr(colon + 1) + " -c " + std::to_string(g4_threads) + " -d " +
             std::to_string(l.BlockBytes());
    } else {
      rb_error = "redis-benchmark is not installed (scripts/install-deps.sh installs it)";
    }
    for (uint32_t r = 0; r < *reps; ++r) {
      Status made = Produce(**p, g1p, "p" + std::to_string(r), 200 + r, blocks);
      if (!made.ok()) return fail(made);
      // Both consumers load the same prompt, in turns (which goes first alternates).
      const ManagerStats before = (**d).Stats();
      for (uint32_t k = 0; k < 2; ++k) {
        const bool direct = (k + r) % 2 == 0;
        Result<Handoff> h =
            direct ? Consume(**d, g1d, "d" + std::to_string(r), 200 + r, blocks, kTierG4, 60)
                   : Consume(**v, g1v, "v" + std::to_string(r), 200 + r, blocks, kTierG4, 60);
        if (!h.ok()) return fail(h.status());
        all_ok = all_ok && h->bytes_ok;
        (direct ? g4 : via_g2).Add(h->seconds);
      }
      // The direct consumer's daemon got nothing into its G2: the blocks went to G1 at once.
      const ManagerStats after = (**d).Stats();
      constexpr size_t kG4ToG2 = 6, kG4ToG1 = 7;
      direct_seen = direct_seen && after.bytes_by_path[kG4ToG2] == before.bytes_by_path[kG4ToG2] &&
                    after.bytes_by_path[kG4ToG1] - before.bytes_by_path[kG4ToG1] == bytes;
      if (base.empty()) continue;
      for (uint32_t pipeline : {1u, 2u}) {
        std::string cmd;
        // SET first: redis-benchmark's GET reads the key its SET wrote (an absent key would
        // answer nil, and the GET would move no value at all).
        if (RedisBenchmark(base, "set", 1, 16, &cmd, &rb_error) < 0) break;
        const double rps =
            RedisBenchmark(base, "get", pipeline, std::max<uint64_t>(blocks, 64), &cmd, &rb_error);
        if (rps <= 0) continue;
        const double gbps = rps * l.BlockBytes() / 1e9;
        rb.Add(bytes / (gbps * 1e9));
        if (gbps > rb_get_gbps) {
          rb_get_gbps = gbps;
          rb_cmd = cmd;
        }
      }
    }
    p->reset();
    d->reset();
    v->reset();
    (*a)->Stop();
    (*b)->Stop();
    (*c)->Stop();
  }
  ::rmdir((dir + "/host").c_str());
  ::rmdir((dir + "/a").c_str());
  ::rmdir((dir + "/b").c_str());
  ::rmdir((dir + "/c").c_str());
  ::rmdir(dir.c_str());

  const Samples& mc = limit.samples;
  const Samples& mc_huge = huge_limit.samples;
  const MappingPages memcpy_page_state = limit.PageState();
  const MappingPages memcpy_huge_page_state = huge_limit.PageState();
  const double memcpy_s = mc.Min();
  const double g2_ratio = one_host.Min() / memcpy_s;
  const double rb_s = rb_get_gbps > 0 ? bytes / (rb_get_gbps * 1e9) : 0;
  const double g4_ratio = with_g4 && rb_s > 0 ? g4.Min() / rb_s : 0;
  const double via_g2_ratio = with_g4 && rb_s > 0 ? via_g2.Min() / rb_s : 0;
  auto median_ratio = [](const Samples& a, const Samples& b) {
    return !a.empty() && !b.empty() ? a.Median() / b.Median() : 0;
  };
  const std::string thp = ThpSetting("enabled"), thp_shmem = ThpSetting("shmem_enabled");
  const uint64_t stream_from = StreamLoadBytes(stores);
  const std::string stores_used = stream_from == UINT64_MAX ? "cached"
                                  : bytes >= stream_from    ? "streaming"
                                                            : "cached";
  if (args.Has("json")) {
    JsonObject j;
    j.Add("tokens", blocks * l.tokens_per_block)
        .Add("blocks", blocks)
        .Add("block_bytes", l.BlockBytes())
        .Add("bytes", bytes)
        .Add("reps", *reps)
        .Add("bytes_ok", all_ok)
        .Add("g2_handoff_s", one_host.Min())
        .Add("g2_handoff_gbps", bytes / one_host.Min() / 1e9)
        .Add("memcpy_s", memcpy_s)
        .Add("memcpy_gbps", bytes / memcpy_s / 1e9)
        .Add("g2_handoff_vs_memcpy", g2_ratio)
        .Add("embedded_g2_load_s", embedded.Min())
        .Add("embedded_g2_load_vs_memcpy", embedded.Min() / memcpy_s)
        // The spread (issue 40): every repetition, min / median / max, median ratios.
        .Raw("memcpy_samples_s", mc.Json())
        .Add("memcpy_median_s", mc.Median())
        .Add("memcpy_max_s", mc.Max())
        .Raw("g2_handoff_samples_s", one_host.Json())
        .Add("g2_handoff_median_s", one_host.Median())
        .Add("g2_handoff_max_s", one_host.Max())
        .Add("g2_handoff_vs_memcpy_median", median_ratio(one_host, mc))
        .Add("load_stores", stores)
        .Add("load_stores_used", stores_used)
        .Raw("g2_handoff_phases", phases.Json())
        .Add("other_load_stores", other_stores)
        .Raw("g2_handoff_other_stores_samples_s", one_host_other.Json())
        .Add("g2_handoff_other_stores_s", one_host_other.Min())
        .Add("g2_handoff_other_stores_median_s", one_host_other.Median())
        .Add("g2_handoff_other_stores_vs_memcpy", one_host_other.Min() / memcpy_s)
        .Add("g2_handoff_other_stores_vs_memcpy_median", median_ratio(one_host_other, mc))
        .Raw("g2_handoff_other_stores_phases", phases_other.Json())
        .Raw("embedded_g2_load_samples_s", embedded.Json())
        .Add("embedded_g2_load_median_s", embedded.Median())
        .Add("embedded_g2_load_max_s", embedded.Max())
        .Add("embedded_g2_load_vs_memcpy_median", median_ratio(embedded, mc))
        .Add("thp_enabled", thp)
        .Add("thp_shmem_enabled", thp_shmem)
        .Add("memcpy_kib", memcpy_page_state.kib)
        .Add("memcpy_huge_kib", memcpy_page_state.huge_kib)
        .Raw("memcpy_2m_pages_samples_s", mc_huge.Json())
        .Add("memcpy_2m_pages_median_s", mc_huge.Median())
        .Add("memcpy_2m_pages_huge_kib", memcpy_huge_page_state.huge_kib)
        .Add("g2_handoff_vs_memcpy_2m_pages_median", median_ratio(one_host, mc_huge))
        .Add("g1_region_kib", g1_page_state.kib)
        .Add("g1_region_huge_kib", g1_page_state.huge_kib)
        .Add("g2_memfd_kib", g2_pages.kib)
        .Add("g2_memfd_huge_kib", g2_pages.huge_kib);
    if (with_g4) {
      j.Add("g4_handoff_s", g4.Min())
          .Add("g4_handoff_gbps", bytes / g4.Min() / 1e9)
          .Add("g4_threads", g4_threads)
          .Add("redis_benchmark_get_gbps", rb_get_gbps)
          .Add("redis_benchmark_command", rb_cmd)
          .Add("redis_benchmark_error", rb_error)
          .Add("g4_handoff_vs_redis_benchmark_get", g4_ratio)
          .Add("g4_handoff_direct_to_g1", direct_seen)
          .Add("g4_via_g2_handoff_s", via_g2.Min())
          .Add("g4_via_g2_vs_redis_benchmark_get", via_g2_ratio)
          .Raw("g4_handoff_samples_s", g4.Json())
          .Add("g4_handoff_median_s", g4.Median())
          .Add("g4_handoff_max_s", g4.Max())
          .Raw("g4_via_g2_samples_s", via_g2.Json())
          .Add("g4_via_g2_median_s", via_g2.Median())
          .Add("g4_via_g2_max_s", via_g2.Max())
          .Raw("redis_benchmark_get_samples_s", rb.Json())
          .Add("redis_benchmark_get_median_s", rb.Median())
          .Add("g4_handoff_vs_redis_benchmark_get_median", median_ratio(g4, rb))
          .Add("g4_via_g2_vs_redis_benchmark_get_median", median_ratio(via_g2, rb));
    }
    std::printf("%s\n", j.Str().c_str());
  } else {
    std::printf(
        "P/D handoff of a %u-token prompt (%u blocks of %.1f MiB, %.0f MiB), %llu reps; "
        "min / median / max\n",
        blocks * l.tokens_per_block, blocks, l.BlockBytes() / 1048576.0, bytes / 1048576.0,
        (unsigned long long)*reps);
    PrintPath("memcpy (limit, between reps)", mc, bytes, nullptr);
    const std::string huge_name =
        "memcpy on 2 MiB pages (" + std::to_string(memcpy_huge_page_state.huge_kib >> 10) + " MiB)";
    PrintPath(huge_name.c_str(), mc_huge, bytes, nullptr);
    const std::string mine = "one host (shared G2), " + stores_used;
    PrintPath(mine.c_str(), one_host, bytes, &mc);
    std::printf("    vs memcpy on 2 MiB pages: %.2fx best/best, %.2fx median/median\n",
                one_host.Min() / mc_huge.Min(), median_ratio(one_host, mc_huge));
    std::printf("    phases (median): %s\n", phases.Text(bytes, l.num_layers).c_str());
    const std::string other = "one host, load_stores " + other_stores;
    PrintPath(other.c_str(), one_host_other, bytes, &mc);
    std::printf("    vs memcpy on 2 MiB pages: %.2fx best/best, %.2fx median/median\n",
                one_host_other.Min() / mc_huge.Min(), median_ratio(one_host_other, mc_huge));
    std::printf("    phases (median): %s\n", phases_other.Text(bytes, l.num_layers).c_str());
    PrintPath("(embedded G2 -> G1 load)", embedded, bytes, &mc);
    if (with_g4) {
      if (rb_get_gbps > 0) {
        PrintPath("redis-benchmark GET (limit)", rb, bytes, nullptr);
        PrintPath("across hosts (G4)", g4, bytes, &rb);
        std::printf("    (the consumer fetched every block straight into its G1: %s)\n",
                    direct_seen ? "yes" : "NO");
        PrintPath("across hosts via G2", via_g2, bytes, &rb);
        std::printf("    (%s)\n", rb_cmd.c_str());
      } else {
        PrintPath("across hosts (G4)", g4, bytes, nullptr);
        std::printf("    no limit measured: %s\n", rb_error.c_str());
      }
    }
    std::printf(
        "  pages: THP enabled [%s], shmem_enabled [%s]; huge: memcpy buffers %llu of %llu KiB, "
        "a G1 region %llu of %llu KiB, G2 memfd mappings %llu of %llu KiB\n",
        thp.c_str(), thp_shmem.c_str(), (unsigned long long)memcpy_page_state.huge_kib,
        (unsigned long long)memcpy_page_state.kib, (unsigned long long)g1_page_state.huge_kib,
        (unsigned long long)g1_page_state.kib, (unsigned long long)g2_pages.huge_kib,
        (unsigned long long)g2_pages.kib);
    std::printf("  every loaded block byte-exact: %s\n", all_ok ? "yes" : "NO");
  }
  return all_ok && direct_seen ? 0 : 1;
}

}  // namespace kvtier::cli

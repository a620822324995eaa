#include "replay/multi_worker.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <list>
#include <memory>
#include <numeric>
#include <unordered_map>

#include "replay/replay_host_g1.h"
#include "sim/jsonl_line.h"

namespace kvtier::cli {

namespace {

// A worker's G1 prefix cache, at the index level: which block keys the engine's GPU memory
// holds. LRU; a request's blocks are touched last block first, so that its first blocks (the
// shared prefix) are the most recent and its tail goes first, as vLLM frees a request's blocks
// in reverse order. Every change is reported as a G1 KvEvent.
class SimulatedG1 {
 public:
  explicit SimulatedG1(uint64_t capacity) : capacity_(capacity) {}

  // How many of `keys`' leading blocks it holds.
  uint32_t PrefixLength(std::span<const BlockKey> keys) const {
    uint32_t n = 0;
    while (n < keys.size() && map_.count(keys[n]) != 0) ++n;
    return n;
  }
  // Touches (inserts) every key; appends the stores and evictions to `events`.
  void Touch(std::span<const BlockKey> keys, std::vector<KvEvent>* events) {
    for (size_t i = keys.size(); i-- > 0;) {
      const BlockKey& k = keys[i];
      auto it = map_.find(k);
      if (it != map_.end()) {
        lru_.splice(lru_.end(), lru_, it->second);
        continue;
      }
      lru_.push_back(k);
      map_.emplace(k, std::prev(lru_.end()));
      events->push_back(Event(KvEvent::Kind::kStored, k));
      while (map_.size() > capacity_) {
        events->push_back(Event(KvEvent::Kind::kRemoved, lru_.front()));
        map_.erase(lru_.front());
        lru_.pop_front();
      }
    }
  }
  void Clear() {
    map_.clear();
    lru_.clear();
  }

 private:
  static KvEvent Event(KvEvent::Kind kind, const BlockKey& key) {
    KvEvent e;
    e.kind = kind;
    e.key = key;
    e.tier = kTierG1;
    return e;
  }
  uint64_t capacity_;
  std::list<BlockKey> lru_;  // least recent first
  std::unordered_map<BlockKey, std::list<BlockKey>::iterator, BlockKeyHash> map_;
};

struct Worker {
  std::unique_ptr<BlockManager> manager;
  std::unique_ptr<HostG1> g1_area;  // the engine's block table for one request at a time
  std::unique_ptr<SimulatedG1> g1;
  std::array<uint64_t, kNumTiers> manager_hits_before{};
  double free_at_s = 0;  // when its last queued prefill ends
};

}  // namespace

const char* RouterKindName(RouterKind kind) {
  switch (kind) {
    case RouterKind::kRoundRobin:
      return "round-robin";
    case RouterKind::kLeastLoaded:
      return "least-loaded";
    case RouterKind::kGpuPrefix:
      return "gpu-prefix";
    case RouterKind::kGpuAware:
      return "gpu-aware";
    case RouterKind::kKvtier:
      return "kvtier";
  }
  return "?";
}

Result<RouterKind> ParseRouterKind(const std::string& name) {
  for (RouterKind k : kAllRouters) {
    if (name == RouterKindName(k)) return k;
  }
  return Status::InvalidArgument(
      "--router '" + name +
      "': use round-robin, least-loaded, gpu-prefix, gpu-aware, kvtier or all");
}

double MultiWorkerResult::load_imbalance() const {
  if (workers.empty()) return 0;
  double total = 0, busiest = 0;
  for (const WorkerFigures& w : workers) {
    total += w.work_s;
    busiest = std::max(busiest, w.work_s);
  }
  return total > 0 ? busiest / (total / workers.size()) : 0;
}

Result<std::vector<double>> ReadArrivalSeconds(const std::string& path, const ReplayTrace& trace) {
  // Load() read it a moment ago; opened the same way, so a path swapped for a FIFO meanwhile
  // cannot hold the replay.
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<RegularFileStream> stream, OpenTraceFile(path));
  std::istream& in = *stream;
  std::vector<double> out;
  out.reserve(trace.requests());
  std::string line;
  double last = 0;
  for (uint64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // The parsers validated the line; a top-level "timestamp" is the only one (request ids are
    // not scanned: the key is searched outside strings).
    double t = last;
    bool in_string = false;
    for (size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (in_string) {
        if (c == '\\') {
          ++i;
        } else if (c == '"') {
          in_string = false;
        }
        continue;
      }
      if (c != '"') continue;
      if (line.compare(i, 11, "\"timestamp\"") != 0) {
        in_string = true;
        continue;
      }
      size_t j = line.find(':', i + 11);
      if (j == std::string::npos) break;
      const char* begin = line.c_str() + j + 1;
      char* end = nullptr;
      const double v = std::strtod(begin, &end);
      if (end == begin || !std::isfinite(v) || v < 0) {
        return Status::InvalidArgument("trace " + path + " line " + std::to_string(n) +
                                       ": \"timestamp\" is not a non-negative number");
      }
      t = v / 1000.0;
      break;
    }
    out.push_back(t);
    last = t;
  }
  if (!stream->read_error().ok()) return stream->read_error();
  if (out.size() != trace.requests()) {
    return Status::InvalidArgument("trace " + path + " has " + std::to_string(out.size()) +
                                   " request lines but " + std::to_string(trace.requests()) +
                                   " requests were parsed; was it changed meanwhile?");
  }
  return out;
}

Result<MultiWorkerResult> RunMultiWorkerReplay(const ReplayTrace& trace,
                                               const MultiWorkerOptions& mo) {
  const ReplayOptions& o = mo.replay;
  if (mo.workers < 1 || mo.workers > 64) {
    return Status::InvalidArgument("workers = " + std::to_string(mo.workers) + ": use 1..64");
  }
  if (mo.g1_blocks == 0) return Status::InvalidArgument("g1_blocks must be at least 1");
  if (mo.arrival_s.size() != trace.requests()) {
    return Status::InvalidArgument("arrival_s has " + std::to_string(mo.arrival_s.size()) +
                                   " times for " + std::to_string(trace.requests()) + " requests");
  }
  for (double a : mo.arrival_s) {
    if (!std::isfinite(a) || a < 0) {
      return Status::InvalidArgument("arrival_s holds " + std::to_string(a) +
                                     ": times must be finite and >= 0");
    }
  }
  for (const auto& [request, worker] : mo.clear_g1_at) {
    if (worker >= mo.workers) {
      return Status::InvalidArgument("clear_g1_at names worker " + std::to_string(worker) + " of " +
                                     std::to_string(mo.workers));
    }
  }
  KVTIER_RETURN_IF_ERROR(o.cost.Validate());
  if (o.g2_blocks == 0) return Status::InvalidArgument("G2 needs at least one slot");
  if (o.g3_blocks > 0 && o.g3_dir.empty()) {
    return Status::InvalidArgument("a G3 replay needs a directory for its slot files");
  }
  const uint32_t tpb = trace.tokens_per_block();
  KVTIER_ASSIGN_OR_RETURN(const ReplaySizing z, SizeReplay(trace, o));
  const KvLayout& layout = z.layout;
  const size_t requests = z.requests;
  const uint64_t g1_need = z.g1_blocks;
  const uint64_t g4_staging = z.g4_staging;

  // The kvtier router (and gpu-aware, the same fed with G1 events only): the cost model's
  // figures for the real model's blocks.
  std::unique_ptr<KvRouter> router;
  if (mo.router == RouterKind::kKvtier || mo.router == RouterKind::kGpuAware) {
    RouterOptions ro;
    ro.tokens_per_block = tpb;
    ro.block_bytes = uint64_t{tpb} * o.cost.kv_bytes_per_token;
    ro.prefill_tokens_per_s = o.cost.prefill_tokens_per_s;
    ro.load_gbps[kTierG1] = 0;
    for (TierId t = kTierG2; t < kNumTiers; ++t) ro.load_gbps[t] = o.cost.load_bytes_per_s[t] / 1e9;
    KVTIER_ASSIGN_OR_RETURN(router, KvRouter::Create(ro));
  }
  std::atomic<uint64_t> router_events{0};

  std::vector<Worker> workers(mo.workers);
  for (uint32_t w = 0; w < mo.workers; ++w) {
    ReplayOptions wo = o;
    if (o.g3_blocks > 0) wo.g3_dir = o.g3_dir + "/worker-" + std::to_string(w);
    if (o.g3_blocks > 0) {
      std::error_code ec;
      std::filesystem::create_directories(wo.g3_dir, ec);
      if (ec) return Status::IOError("cannot create " + wo.g3_dir + ": " + ec.message());
    }
    KVTIER_ASSIGN_OR_RETURN(Config config, ReplayConfig(wo, layout, g4_staging));
    ManagerOptions opts;
    opts.layout = layout;
    opts.model_id = mo.model_id;
    opts.config = config;
    Worker& wk = workers[w];
    KVTIER_ASSIGN_OR_RETURN(wk.manager, BlockManager::Create(opts));
    if (!o.g4_backend.empty() && !wk.manager->Stats().g4_enabled) {
      return Status::Unavailable("G4 (" + o.g4_backend + ") could not be opened for worker " +
                                 std::to_string(w) + " (the manager's warning above says why)");
    }
    wk.g1_area = std::make_unique<HostG1>(layout, static_cast<uint32_t>(g1_need));
    KVTIER_RETURN_IF_ERROR(wk.manager->RegisterDeviceMemory(wk.g1_area->memory()));
    wk.g1 = std::make_unique<SimulatedG1>(mo.g1_blocks);
    if (router) KVTIER_RETURN_IF_ERROR(router->AddWorker(w));
    if (mo.router == RouterKind::kKvtier) {
      KvRouter* rt = router.get();
      wk.manager->SubscribeEvents([rt, w, &router_events](std::span<const KvEvent> events) {
        // Called on the manager's copy threads; Apply only takes the router's mutex.
        if (rt->Apply(w, events).ok()) router_events += events.size();
      });
    }
  }
  KVTIER_ASSIGN_OR_RETURN(
      BlockHasher hasher,
      BlockHasher::Create(KeyNamespace{mo.model_id, layout.Fingerprint(), "", ""}, tpb));

  // Arrival order (stable for equal times).
  std::vector<size_t> order(requests);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return mo.arrival_s[a] < mo.arrival_s[b]; });

  MultiWorkerResult res;
  res.router = mo.router;
  res.workers.resize(mo.workers);
  res.routed.assign(requests, 0);
  res.ttft_s.reserve(requests);
  res.wait_s.reserve(requests);
  const uint64_t block_bytes = layout.BlockBytes();
  std::vector<uint8_t> content(block_bytes);
  std::vector<TokenId> prompt;
  std::vector<uint32_t> g1_ids(g1_need);
  std::iota(g1_ids.begin(), g1_ids.end(), 0u);
  std::vector<KvEvent> g1_events;
  uint64_t verify_counter = 0;

  // Ties of an estimate go to the shorter queue, then the least work so far, then the lower id.
  auto less_loaded = [&](uint32_t a, uint32_t b, double now) {
    const double qa = std::max(0.0, workers[a].free_at_s - now);
    const double qb = std::max(0.0, workers[b].free_at_s - now);
    if (qa != qb) return qa < qb;
    if (res.workers[a].work_s != res.workers[b].work_s) {
      return res.workers[a].work_s < res.workers[b].work_s;
    }
    return a < b;
  };

  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < requests; ++i) {
    const size_t r = order[i];
    const double now = mo.arrival_s[r];
    for (const auto& [at, w] : mo.clear_g1_at) {
      if (at != i) continue;
      workers[w].g1->Clear();
      if (router) KVTIER_RETURN_IF_ERROR(router->ClearWorker(w, 1u << kTierG1));
    }
    trace.Prompt(r, &prompt);
    const std::string id = trace.RequestId(r);
    const std::vector<BlockKey> keys = hasher.KeysFor(prompt);
    const uint64_t cost_tokens = trace.cost_tokens(r);

    // ---- route ----
    uint32_t chosen = 0;
    switch (mo.router) {
      case RouterKind::kRoundRobin:
        chosen = static_cast<uint32_t>(i % mo.workers);
        break;
      case RouterKind::kLeastLoaded:
        for (uint32_t w = 1; w < mo.workers; ++w) {
          if (less_loaded(w, chosen, now)) chosen = w;
        }
        break;
      case RouterKind::kGpuPrefix: {
        uint32_t best = workers[0].g1->PrefixLength(keys);
        for (uint32_t w = 1; w < mo.workers; ++w) {
          const uint32_t n = workers[w].g1->PrefixLength(keys);
          if (n > best || (n == best && less_loaded(w, chosen, now))) {
            best = n;
            chosen = w;
          }
        }
        break;
      }
      case RouterKind::kGpuAware:
      case RouterKind::kKvtier: {
        for (uint32_t w = 0; w < mo.workers; ++w) {
          KVTIER_RETURN_IF_ERROR(
              router->SetWorkerQueue(w, std::max(0.0, workers[w].free_at_s - now)));
        }
        // The router's estimate in the cost model's prompt tokens (Mooncake's input_length,
        // which may end inside the last keyed block).
        KVTIER_ASSIGN_OR_RETURN(RouteDecision d,
                                router->Route(keys, static_cast<uint32_t>(cost_tokens)));
        chosen = d.worker;
        for (const RouteCandidate& c : d.candidates) {
          if (c.ttft_s == d.candidates[chosen].ttft_s && less_loaded(c.worker, chosen, now)) {
            chosen = c.worker;
          }
        }
        break;
      }
    }
    res.routed[r] = chosen;
    Worker& wk = workers[chosen];
    BlockManager& m = *wk.manager;

    // ---- serve: G1 prefix, then what the manager loads past it ----
    const uint32_t g1_used = static_cast<uint32_t>((prompt.size() + tpb - 1) / tpb);
    const std::span<const uint32_t> blocks(g1_ids.data(), g1_used);
    // The engine computes a prompt's last token, so G1 never supplies the block holding it.
    const uint32_t g1_hit = std::min<uint32_t>(wk.g1->PrefixLength(keys),
                                               static_cast<uint32_t>((prompt.size() - 1) / tpb));
    for (uint32_t b = 0; b < g1_hit; ++b) {
      FillBlockContent(keys[b], 0, content.data(), block_bytes);
      wk.g1_area->Scatter(blocks[b], content.data());
    }
    KVTIER_ASSIGN_OR_RETURN(LookupResult lr, m.Lookup({id, prompt, "", "", {}}, g1_hit * tpb));
    KVTIER_ASSIGN_OR_RETURN(uint32_t planned, m.PrepareLoad(id, blocks, lr.num_tokens));
    KVTIER_RETURN_IF_ERROR(m.StartLoad());
    for (uint32_t l = 0; l < layout.num_layers; ++l) (void)m.WaitLayer(l);
    const uint32_t loaded = m.LoadedTokens(id) / tpb;
    if (loaded * tpb < lr.num_tokens || planned < lr.num_tokens) ++res.short_loads;
    for (uint32_t b = g1_hit; b < g1_hit + loaded; ++b) {
      if (o.verify_every == 0 || verify_counter++ % o.verify_every != 0) continue;
      FillBlockContent(keys[b], 0, content.data(), block_bytes);
      ++res.verified_blocks;
      if (!wk.g1_area->Equals(blocks[b], content.data())) ++res.mismatched_blocks;
    }
    for (uint32_t b = g1_hit + loaded; b < keys.size(); ++b) {
      FillBlockContent(keys[b], 0, content.data(), block_bytes);
      wk.g1_area->Scatter(blocks[b], content.data());
    }
    KVTIER_RETURN_IF_ERROR(m.Commit(id, prompt, blocks));
    KVTIER_RETURN_IF_ERROR(m.StartSave());
    const bool held = m.RequestFinished(id);
    m.WaitForSaves();
    if (held) {
      bool done = false;
      for (int tries = 0; tries < 1000 && !done; ++tries) {
        for (const std::string& f : m.Finished().saves_done) done = done || f == id;
        if (!done) m.WaitForSaves();
      }
      if (!done) return Status::Internal("request " + id + " never reported its saves done");
    } else {
      (void)m.Finished();
    }
    for (uint32_t b = 0; b < g1_used; ++b) wk.g1_area->Poison(b);
    // The request's blocks are in G1 now (the engine keeps them in its prefix cache).
    g1_events.clear();
    wk.g1->Touch(keys, &g1_events);
    if (router && !g1_events.empty()) {
      KVTIER_RETURN_IF_ERROR(router->Apply(chosen, g1_events));
      router_events += g1_events.size();
    }

    // ---- figures and simulated time ----
    const ManagerStats s = m.Stats();
    std::array<uint64_t, kNumTiers> mine{};
    mine[kTierG1] = g1_hit;
    for (TierId t = kTierG2; t < kNumTiers; ++t) {
      mine[t] = s.hit_blocks[t] - wk.manager_hits_before[t];
    }
    wk.manager_hits_before = s.hit_blocks;
    const uint64_t loaded_tokens =
        std::min<uint64_t>(uint64_t{g1_hit + loaded} * tpb, cost_tokens - 1);
    const double service =
        o.cost.LoadSeconds(mine, tpb) + o.cost.ComputeSeconds(cost_tokens - loaded_tokens);
    const double begin = std::max(now, wk.free_at_s);
    wk.free_at_s = begin + service;
    res.wait_s.push_back(begin - now);
    res.ttft_s.push_back(begin - now + service);
    WorkerFigures& wf = res.workers[chosen];
    ++wf.requests;
    wf.work_s += service;
    for (TierId t = 0; t < kNumTiers; ++t) {
      wf.hit_blocks[t] += mine[t];
      res.hit_blocks[t] += mine[t];
    }
    res.prompt_blocks += trace.prompt_blocks(r);
    res.prompt_tokens += cost_tokens;
    res.prefill_tokens_saved += loaded_tokens;
  }
  for (Worker& w : workers) w.manager->WaitForSaves();
  res.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  res.requests = requests;
  res.router_events = router_events.load();
  // The managers (and their callbacks into the router) go before the router.
  workers.clear();
  return res;
}

}  // namespace kvtier::cli

// kvtier bench copy: the memcpy backend's gather/scatter between an emulated G1 in the engine's
// arrangement and G2 slots, against plain memcpy of the same bytes on the same threads.
// --shared: G2 is a shared (memfd) arena, and the same run also copies blocks through a second
// mapping of it made with HostArena::Attach (the path of an engine attached to `kvtier serve`),
// against memcpy between two private buffers (the raw limit).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_timer.h"
#include "cli/commands.h"
#include "cli/json_writer.h"
#include "cli/layout_flags.h"
#include "core/parallel.h"
#include "kvtier/g1_memory.h"
#include "tier/host_arena.h"
#include "transfer/block_copy.h"

namespace kvtier::cli {
namespace {

struct Best {
  double offload_s = 1e30, onboard_s = 1e30, memcpy_out_s = 1e30, memcpy_in_s = 1e30;
  // --shared only: memcpy G1 -> a private buffer and back; gather/scatter through the attached
  // mapping of G2.
  double private_out_s = 1e30, private_in_s = 1e30, shared_save_s = 1e30, shared_load_s = 1e30;
};

void PrintUsage() {
  std::printf(
      "usage: kvtier bench copy [--device host|cuda] [--blocks N] [--max-threads T] [--reps R]\n"
      "                         [--shared] [--json] [layout]\n"
      "  --device cuda: the CUDA backend (see kvtier bench copy --device cuda --help).\n"
      "  Moves N blocks G1 -> G2 (offload) and G2 -> G1 (onboard) with 1..T threads, and copies\n"
      "  the same bytes with plain memcpy on the same threads, in the same run. Best of R.\n"
      "  --blocks N (512)  --max-threads T (2)  --reps R (5; 3 with --shared)\n"
      "  --shared: G2 is a shared arena (a sealed memfd, as `kvtier serve` exports it; offload\n"
      "    and onboard then go through the daemon's own mapping), and the run also gathers\n"
      "    (save) and scatters (load) the blocks through a second mapping of it made with\n"
      "    HostArena::Attach on its fd, the path of an attached engine, and copies the same\n"
      "    bytes with memcpy between two private pre-faulted buffers, the raw limit. Prints each\n"
      "    path's GB/s and its ratio to that memcpy (the faster direction); JSON adds\n"
      "    shared_save_gbps, shared_load_gbps, memcpy_private_gbps,\n"
      "    shared_ratio_to_memcpy_save and shared_ratio_to_memcpy_load.\n%s",
      LayoutFlagsHelp());
}

}  // namespace

int RunBenchCopy(const CliArgs& args) {
  const std::string device = args.GetString("device", "host");
  if (device == "cuda") return RunBenchCopyCuda(args);
  if (device != "host") {
    return UsageError(Status::InvalidArgument("--device " + device +
                                              " is not known; use host (default) or cuda"));
  }
  if (args.Has("help")) {
    PrintUsage();
    return 0;
  }
  std::vector<std::string> known = {"json", "help",   "blocks", "max-threads",
                                    "reps", "device", "shared"};
  known.insert(known.end(), LayoutFlagNames().begin(), LayoutFlagNames().end());
  if (Status s = args.CheckKnown(known); !s.ok()) return UsageError(s);
  auto layout = LayoutFromFlags(args);
  if (!layout.ok()) return UsageError(layout.status());
  auto blocks = args.GetUint("blocks", 512);
  auto max_threads = args.GetUint("max-threads", 2);
  // --shared times twice the copies per rep; 3 reps keep its default run near 10 s on 2 cores.
  auto reps = args.GetUint("reps", args.Has("shared") ? 3 : 5);
  if (!blocks.ok()) return UsageError(blocks.status());
  if (!max_threads.ok()) return UsageError(max_threads.status());
  if (!reps.ok()) return UsageError(reps.status());
  if (*blocks < 1 || *blocks > (1u << 20)) {
    return UsageError(Status::InvalidArgument("--blocks must be in 1..1048576"));
  }
  if (*max_threads < 1 || *max_threads > 256) {
    return UsageError(Status::InvalidArgument("--max-threads must be in 1..256"));
  }
  if (*reps < 1 || *reps > 1000)
    return UsageError(Status::InvalidArgument("--reps must be in 1..1000"));
  const bool json = args.Has("json");
  const bool shared = args.Has("shared");
  const uint32_t n = static_cast<uint32_t>(*blocks);
  const uint64_t block_bytes = layout->BlockBytes();

  // Emulated G1: one pre-faulted buffer of n blocks, cut into regions by the arrangement.
  HostArena::Config g1_cfg;
  g1_cfg.slot_bytes = block_bytes * n;
  g1_cfg.capacity_bytes = (block_bytes * n + 4095) / 4096 * 4096;
  g1_cfg.lock_memory = false;
  auto g1_mem = HostArena::Create(g1_cfg);
  if (!g1_mem.ok()) return Failure(g1_mem.status());
  G1Memory g1;
  g1.layout = *layout;
  g1.num_blocks = n;
  uint8_t* g1_base = (*g1_mem)->base();
  if (layout->g1_arrangement == G1Arrangement::kLayerSeparate) {
    const uint64_t chunk = layout->ChunkBytes();
    for (uint32_t r = 0; r < layout->num_layers * layout->num_planes; ++r) {
      g1.regions.push_back(G1Region{g1_base + uint64_t{r} * n * chunk, chunk});
    }
  } else {
    g1.regions.push_back(G1Region{g1_base, block_bytes});
  }
  if (Status s = g1.Validate(); !s.ok()) return Failure(s);

  HostArena::Config g2_cfg;
  g2_cfg.slot_bytes = block_bytes;
  g2_cfg.capacity_bytes = ((block_bytes + 4095) / 4096 * 4096) * n;
  g2_cfg.shared = shared;
  auto g2 = HostArena::Create(g2_cfg);
  if (!g2.ok()) return Failure(g2.status());
  // --shared: G2's second mapping, as an attached engine maps it (MAP_POPULATE, locked like the
  // owner's), and a private pre-faulted buffer as large as G1 for the raw memcpy limit.
  std::unique_ptr<HostArena> view, priv;
  if (shared) {
    auto v = HostArena::Attach((*g2)->shared_fd(), g2_cfg);
    if (!v.ok()) return Failure(v.status());
    view = std::move(v).value();
    auto p = HostArena::Create(g1_cfg);
    if (!p.ok()) return Failure(p.status());
    priv = std::move(p).value();
  }
  std::vector<uint32_t> slots;
  for (uint32_t i = 0; i < n; ++i) slots.push_back(*(*g2)->Allocate());
  for (uint64_t i = 0; i < block_bytes * n; i += 64) g1_base[i] = static_cast<uint8_t>(i >> 6);

  HostArena* arena = g2->get();
  std::vector<Best> best(*max_threads + 1);
  for (uint64_t rep = 0; rep < *reps; ++rep) {
    for (unsigned t = 1; t <= *max_threads; ++t) {
      Best& b = best[t];
      // Interleave the four measurements so that noise from other tenants hits all alike.
      Stopwatch w1;
      ParallelRanges(t, n, [&](unsigned, size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i)
          GatherBlock(g1, static_cast<uint32_t>(i), arena->SlotData(slots[i]));
      });
      b.offload_s = std::min(b.offload_s, w1.Seconds());
      Stopwatch w2;
      ParallelRanges(t, n, [&](unsigned, size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i)
          std::memcpy(arena->SlotData(slots[i]), g1_base + i * block_bytes, block_bytes);
      });
      b.memcpy_out_s = std::min(b.memcpy_out_s, w2.Seconds());
      Stopwatch w3;
      ParallelRanges(t, n, [&](unsigned, size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i)
          ScatterBlock(g1, arena->SlotData(slots[i]), static_cast<uint32_t>(i));
      });
      b.onboard_s = std::min(b.onboard_s, w3.Seconds());
      Stopwatch w4;
      ParallelRanges(t, n, [&](unsigned, size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i)
          std::memcpy(g1_base + i * block_bytes, arena->SlotData(slots[i]), block_bytes);
      });
      b.memcpy_in_s = std::min(b.memcpy_in_s, w4.Seconds());
      if (!shared) continue;
      uint8_t* priv_base = priv->base();
      HostArena* v = view.get();
      Stopwatch w5;
      ParallelRanges(t, n, [&](unsigned, size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i)
          std::memcpy(priv_base + i * block_bytes, g1_base + i * block_bytes, block_bytes);
      });
      b.private_out_s = std::min(b.private_out_s, w5.Seconds());
      Stopwatch w6;
      ParallelRanges(t, n, [&](unsigned, size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i)
          GatherBlock(g1, static_cast<uint32_t>(i), v->SlotData(slots[i]));
      });
      b.shared_save_s = std::min(b.shared_save_s, w6.Seconds());
      Stopwatch w7;
      ParallelRanges(t, n, [&](unsigned, size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i)
          std::memcpy(g1_base + i * block_bytes, priv_base + i * block_bytes, block_bytes);
      });
      b.private_in_s = std::min(b.private_in_s, w7.Seconds());
      Stopwatch w8;
      ParallelRanges(t, n, [&](unsigned, size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i)
          ScatterBlock(g1, v->SlotData(slots[i]), static_cast<uint32_t>(i));
      });
      b.shared_load_s = std::min(b.shared_load_s, w8.Seconds());
    }
  }
  if (shared) {
    // The two mappings must be one memory, or the figures above measure nothing shared.
    for (uint32_t i : {0u, n - 1}) {
      if (std::memcmp(view->SlotData(slots[i]), arena->SlotData(slots[i]), block_bytes) != 0) {
        return Failure(Status::Internal("bench copy --shared: slot " + std::to_string(slots[i]) +
                                        " differs between G2's two mappings"));
      }
    }
  }

  const double total = static_cast<double>(block_bytes) * n;
  auto gbps = [total](double s) { return total / s / 1e9; };
  unsigned best_t = 1;
  for (unsigned t = 1; t <= *max_threads; ++t) {
    if (gbps(best[t].offload_s) + gbps(best[t].onboard_s) >
        gbps(best[best_t].offload_s) + gbps(best[best_t].onboard_s)) {
      best_t = t;
    }
  }
  auto memcpy_gbps = [&](unsigned t) {
    // The faster direction of plain memcpy: the stricter reference.
    return std::max(gbps(best[t].memcpy_out_s), gbps(best[t].memcpy_in_s));
  };
  // --shared: the same, between two private buffers; and the thread count with the best sum of
  // save and load through the attached mapping.
  auto private_gbps = [&](unsigned t) {
    return std::max(gbps(best[t].private_out_s), gbps(best[t].private_in_s));
  };
  unsigned shared_t = 1;
  for (unsigned t = 1; t <= *max_threads; ++t) {
    if (gbps(best[t].shared_save_s) + gbps(best[t].shared_load_s) >
        gbps(best[shared_t].shared_save_s) + gbps(best[shared_t].shared_load_s)) {
      shared_t = t;
    }
  }
  if (json) {
    JsonObject per_threads;
    std::string arr = "[";
    for (unsigned t = 1; t <= *max_threads; ++t) {
      JsonObject o;
      o.Add("threads", t)
          .Add("offload_gbps", gbps(best[t].offload_s))
          .Add("onboard_gbps", gbps(best[t].onboard_s))
          .Add("memcpy_gbps", memcpy_gbps(t))
          .Add("memcpy_g1_to_g2_gbps", gbps(best[t].memcpy_out_s))
          .Add("memcpy_g2_to_g1_gbps", gbps(best[t].memcpy_in_s));
      if (shared) {
        o.Add("shared_save_gbps", gbps(best[t].shared_save_s))
            .Add("shared_load_gbps", gbps(best[t].shared_load_s))
            .Add("memcpy_private_gbps", private_gbps(t))
            .Add("shared_ratio_to_memcpy_save", gbps(best[t].shared_save_s) / private_gbps(t))
            .Add("shared_ratio_to_memcpy_load", gbps(best[t].shared_load_s) / private_gbps(t));
      }
      arr += (t > 1 ? ", " : "") + o.Str();
    }
    arr += "]";
    JsonObject out;
    out.Add("offload_gbps", gbps(best[best_t].offload_s))
        .Add("onboard_gbps", gbps(best[best_t].onboard_s))
        .Add("memcpy_gbps", memcpy_gbps(best_t))
        .Add("offload_ratio", gbps(best[best_t].offload_s) / memcpy_gbps(best_t))
        .Add("onboard_ratio", gbps(best[best_t].onboard_s) / memcpy_gbps(best_t))
        .Add("threads", best_t)
        .Add("block_bytes", block_bytes)
        .Add("blocks", uint64_t{n})
        .Add("layout", layout->ToString())
        .Add("shared", shared);
    if (shared) {
      const unsigned t = shared_t;
      out.Add("shared_hugetlb", (*g2)->startup().hugetlb)
          .Add("shared_save_gbps", gbps(best[t].shared_save_s))
          .Add("shared_load_gbps", gbps(best[t].shared_load_s))
          .Add("memcpy_private_gbps", private_gbps(t))
          .Add("memcpy_private_out_gbps", gbps(best[t].private_out_s))
          .Add("memcpy_private_in_gbps", gbps(best[t].private_in_s))
          .Add("shared_ratio_to_memcpy_save", gbps(best[t].shared_save_s) / private_gbps(t))
          .Add("shared_ratio_to_memcpy_load", gbps(best[t].shared_load_s) / private_gbps(t))
          .Add("shared_threads", t);
    }
    out.Raw("by_threads", arr);
    std::printf("%s\n", out.Str().c_str());
    return 0;
  }
  std::printf("bench copy: %u blocks of %s, best of %llu\n", n, layout->ToString().c_str(),
              static_cast<unsigned long long>(*reps));
  std::printf("%8s %14s %14s %14s %9s %9s\n", "threads", "offload GB/s", "onboard GB/s",
              "memcpy GB/s", "off/mcp", "on/mcp");
  for (unsigned t = 1; t <= *max_threads; ++t) {
    std::printf("%8u %14.2f %14.2f %14.2f %9.3f %9.3f%s\n", t, gbps(best[t].offload_s),
                gbps(best[t].onboard_s), memcpy_gbps(t), gbps(best[t].offload_s) / memcpy_gbps(t),
                gbps(best[t].onboard_s) / memcpy_gbps(t), t == best_t ? "  <- best" : "");
  }
  if (!shared) return 0;
  std::printf(
      "shared G2 (%s memfd): save/load through a second mapping (HostArena::Attach) vs memcpy "
      "between two private buffers\n",
      (*g2)->startup().hugetlb ? "hugetlbfs" : "normal");
  std::printf("%8s %14s %14s %14s %9s %9s\n", "threads", "save GB/s", "load GB/s", "memcpy GB/s",
              "save/mcp", "load/mcp");
  for (unsigned t = 1; t <= *max_threads; ++t) {
    std::printf("%8u %14.2f %14.2f %14.2f %9.3f %9.3f%s\n", t, gbps(best[t].shared_save_s),
                gbps(best[t].shared_load_s), private_gbps(t),
                gbps(best[t].shared_save_s) / private_gbps(t),
                gbps(best[t].shared_load_s) / private_gbps(t), t == shared_t ? "  <- best" : "");
  }
  return 0;
}

}  // namespace kvtier::cli

// kvtier bench copy --device cuda: the CUDA backend's saves (device -> host) and loads (host ->
// device) of blocks scattered over a device G1 and a pinned G2 arena, against a plain
// cudaMemcpyAsync of one large pinned buffer in the same run.
//
// Exit codes: 0 measured; 1 the work failed (a CUDA error, or a copied byte differs); 2 usage
// error; 3 (kExitUnavailable) the CUDA backend cannot be used here: this build has none, or the
// machine has no usable GPU driver/device. With --json, stdout always holds one JSON object.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_timer.h"
#include "cli/commands.h"
#include "cli/json_writer.h"
#include "cli/layout_flags.h"
#include "kvtier/g1_memory.h"
#include "tier/host_arena.h"
#include "transfer/block_copy.h"
#include "transfer/device_backend.h"
#include "transfer/device_copy_plan.h"
#include "transfer/transfer_engine.h"

namespace kvtier::cli {
namespace {

struct MethodResult {
  std::string method;
  std::string device;
  double d2h_s = 1e30, h2d_s = 1e30;
  double d2h_submit_s = 1e30, h2d_submit_s = 1e30;  // host time in Submit (plan + enqueue)
  uint64_t mismatched_bytes = 0;
};

struct BatchTime {
  double total_s = 0;   // from Submit until the done callback
  double submit_s = 0;  // until Submit returned
};

// One batch through the backend, timed from Submit until its done callback.
Result<BatchTime> TimedBatch(DeviceCopyBackend* backend, CopyDirection dir,
                             const std::vector<DeviceBlockCopy>& copies) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status result;
  Stopwatch w;
  Status s = backend->Submit(
      dir, copies, nullptr,
      [&](const Status& st) {
        std::lock_guard<std::mutex> lock(mu);
        result = st;
        done = true;
        cv.notify_all();
      },
      /*wait_for_room=*/true);
  const double submit_s = w.Seconds();
  if (!s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_for(lock, std::chrono::seconds(120), [&] { return done; })) {
    return Status::TimedOut(std::string("CUDA ") + CopyDirectionName(dir) +
                            " batch did not finish in 120 s");
  }
  const double seconds = w.Seconds();
  if (!result.ok()) return result;
  return BatchTime{seconds, submit_s};
}

void PrintUsage() {
  std::printf(
      "usage: kvtier bench copy --device cuda [--blocks N] [--reps R] [--method M] [--json]\n"
      "                         [--unit-bytes B] [--kernel-threads T] [--kernel-blocks K]\n"
      "                         [--launch-bytes L] [layout]\n"
      "  Saves (device -> host) and loads (host -> device) N blocks scattered over a device G1\n"
      "  of 2N blocks and a pinned G2 arena, through the CUDA backend; and, in the same run, a\n"
      "  plain cudaMemcpyAsync of the same bytes as one pinned buffer. Best of R. Every copied\n"
      "  byte is checked. Exit 3 when no CUDA backend or usable GPU is available.\n"
      "  --blocks N (512)  --reps R (5)  --method all|kernel|batch|memcpy (all: kernel, and\n"
      "  batch where CUDA >= 12.8; the top-level figures are the kernel's, the default)\n"
      "  --unit-bytes (65536)  --kernel-threads (256)  --kernel-blocks (1024)\n"
      "  --launch-bytes (8388608: one launch and event per 8 MiB of layers at least; 0: one\n"
      "  per layer)  --spin-us (0: completion threads poll a batch's event this long before\n"
      "  sleeping on it)\n%s",
      LayoutFlagsHelp());
}

// Runs one method end to end: its own backend (pins the arena, unpins on exit).
Status RunMethod(DeviceCopyBackend::Config cfg, const G1Memory& g1, HostArena* arena,
                 const std::vector<DeviceBlockCopy>& copies, const std::vector<uint8_t>& mirror,
                 const G1Memory& mirror_g1, uint64_t reps, MethodResult* out) {
  auto backend = CreateCudaBackend(cfg);
  if (!backend.ok()) return backend.status();
  DeviceCopyBackend* b = backend->get();
  out->method = DeviceCopyMethodName(b->method());
  out->device = b->Describe();
  KVTIER_RETURN_IF_ERROR(b->RegisterG1(g1));
  KVTIER_RETURN_IF_ERROR(b->RegisterHost(arena->base(), arena->mapped_bytes()));
  const KvLayout& l = g1.layout;
  std::vector<uint8_t> expect(l.BlockBytes());
  for (uint64_t r = 0; r < reps; ++r) {
    // Saves, then check every G2 payload against the gather of the host mirror.
    for (const auto& c : copies) std::memset(c.host, 0, l.BlockBytes());
    auto d2h = TimedBatch(b, CopyDirection::kDeviceToHost, copies);
    if (!d2h.ok()) return d2h.status();
    out->d2h_s = std::min(out->d2h_s, d2h->total_s);
    out->d2h_submit_s = std::min(out->d2h_submit_s, d2h->submit_s);
    for (const auto& c : copies) {
      GatherBlock(mirror_g1, c.g1_block, expect.data());
      if (std::memcmp(c.host, expect.data(), expect.size()) == 0) continue;
      for (uint64_t i = 0; i < expect.size(); ++i) out->mismatched_bytes += c.host[i] != expect[i];
    }
    // Loads of the same bytes into the same blocks; checked once, after the last rep.
    auto h2d = TimedBatch(b, CopyDirection::kHostToDevice, copies);
    if (!h2d.ok()) return h2d.status();
    out->h2d_s = std::min(out->h2d_s, h2d->total_s);
    out->h2d_submit_s = std::min(out->h2d_submit_s, h2d->submit_s);
  }
  std::vector<uint8_t> back(mirror.size());
  KVTIER_RETURN_IF_ERROR(b->CopyFromDevice(back.data(), g1.regions[0].base, back.size()));
  if (std::memcmp(back.data(), mirror.data(), back.size()) != 0) {
    for (uint64_t i = 0; i < back.size(); ++i) out->mismatched_bytes += back[i] != mirror[i];
  }
  return Status::Ok();
}

}  // namespace

int RunBenchCopyCuda(const CliArgs& args) {
  if (args.Has("help")) {
    PrintUsage();
    return 0;
  }
  std::vector<std::string> known = {"json",          "help",         "device",     "blocks",
                                    "reps",          "method",       "unit-bytes", "kernel-threads",
                                    "kernel-blocks", "launch-bytes", "spin-us"};
  known.insert(known.end(), LayoutFlagNames().begin(), LayoutFlagNames().end());
  if (Status s = args.CheckKnown(known); !s.ok()) return UsageError(s);
  auto layout = LayoutFromFlags(args);
  if (!layout.ok()) return UsageError(layout.status());
  auto blocks = args.GetUint("blocks", 512);
  auto reps = args.GetUint("reps", 5);
  auto unit = args.GetUint("unit-bytes", kDefaultCopyUnitBytes);
  auto threads = args.GetUint("kernel-threads", 256);
  auto grid = args.GetUint("kernel-blocks", 1024);
  auto launch = args.GetUint("launch-bytes", kDefaultMinLaunchBytes);
  for (const auto* r : {&blocks, &reps, &unit, &threads, &grid, &launch}) {
    if (!r->ok()) return UsageError(r->status());
  }
  if (*blocks < 1 || *blocks > (1u << 20)) {
    return UsageError(Status::InvalidArgument("--blocks must be in 1..1048576"));
  }
  if (*reps < 1 || *reps > 1000) {
    return UsageError(Status::InvalidArgument("--reps must be in 1..1000"));
  }
  const std::string method_name = args.GetString("method", "all");
  std::vector<DeviceCopyBackend::Method> methods;
  if (method_name == "all") {
    methods = {DeviceCopyBackend::Method::kKernel, DeviceCopyBackend::Method::kMemcpyBatch};
  } else {
    auto m = ParseDeviceCopyMethod(method_name);
    if (!m.ok()) {
      return UsageError(Status::InvalidArgument("--method: " + m.status().message() + ", or all"));
    }
    methods = {*m};
  }
  DeviceCopyBackend::Config cfg;
  cfg.max_unit_bytes = *unit;
  cfg.kernel_threads = static_cast<uint32_t>(std::min<uint64_t>(*threads, 1u << 20));
  cfg.kernel_max_blocks = static_cast<uint32_t>(std::min<uint64_t>(*grid, 1u << 30));
  cfg.min_launch_bytes = *launch;
  auto spin = args.GetUint("spin-us", 0);
  if (!spin.ok()) return UsageError(spin.status());
  if (*spin > 1000000) return UsageError(Status::InvalidArgument("--spin-us must be <= 1000000"));
  cfg.completion_spin_us = static_cast<uint32_t>(*spin);
  if (Status s = cfg.Validate(); !s.ok()) return UsageError(s);
  const bool json = args.Has("json");

  Status probe = ProbeCuda();
  if (!probe.ok()) {
    if (json) {
      JsonObject o;
      o.Add("available", false).Add("error", probe.message()).Add("exit_code", kExitUnavailable);
      std::printf("%s\n", o.Str().c_str());
    }
    std::fprintf(stderr, "kvtier: %s\n", probe.message().c_str());
    return kExitUnavailable;
  }

  const uint32_t n = static_cast<uint32_t>(*blocks);
  const uint32_t g1_blocks = 2 * n;  // the batch's blocks are scattered over twice as many
  const uint64_t block_bytes = layout->BlockBytes();
  auto helper = CreateCudaBackend(cfg);
  if (!helper.ok()) return Failure(helper.status());
  auto dev = (*helper)->AllocateDevice(block_bytes * g1_blocks);
  if (!dev.ok()) return Failure(dev.status());
  struct FreeOnExit {
    DeviceCopyBackend* b;
    uint8_t* p;
    ~FreeOnExit() { b->FreeDevice(p); }
  } free_on_exit{helper->get(), *dev};

  // G1: regions in the engine's arrangement over one device allocation; a host mirror with
  // the same offsets holds what the device must hold.
  G1Memory g1;
  g1.layout = *layout;
  g1.num_blocks = g1_blocks;
  g1.on_device = true;
  std::vector<uint8_t> mirror(block_bytes * g1_blocks);
  G1Memory mirror_g1 = g1;
  mirror_g1.on_device = false;
  if (layout->g1_arrangement == G1Arrangement::kLayerSeparate) {
    const uint64_t region = layout->ChunkBytes() * g1_blocks;
    for (uint32_t r = 0; r < layout->num_layers * layout->num_planes; ++r) {
      g1.regions.push_back(G1Region{*dev + r * region, layout->ChunkBytes()});
      mirror_g1.regions.push_back(G1Region{mirror.data() + r * region, layout->ChunkBytes()});
    }
  } else {
    g1.regions.push_back(G1Region{*dev, block_bytes});
    mirror_g1.regions.push_back(G1Region{mirror.data(), block_bytes});
  }
  for (uint64_t i = 0; i < mirror.size(); ++i) {
    mirror[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  }
  if (Status s = (*helper)->CopyToDevice(*dev, mirror.data(), mirror.size()); !s.ok()) {
    return Failure(s);
  }

  // G2: slots shaped as the manager's ([header area | payload]), in shuffled order.
  HostArena::Config ac;
  ac.slot_bytes = G2PayloadOffset(*layout) + block_bytes;
  ac.capacity_bytes = (ac.slot_bytes + 4095) / 4096 * 4096 * n;
  ac.lock_memory = false;  // cudaHostRegister pins it
  auto arena = HostArena::Create(ac);
  if (!arena.ok()) return Failure(arena.status());
  std::mt19937_64 rng(42);
  std::vector<uint32_t> g1_order(g1_blocks), slots(n);
  for (uint32_t i = 0; i < g1_blocks; ++i) g1_order[i] = i;
  for (uint32_t i = 0; i < n; ++i) slots[i] = i;
  std::shuffle(g1_order.begin(), g1_order.end(), rng);
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<DeviceBlockCopy> copies;
  for (uint32_t i = 0; i < n; ++i) {
    copies.push_back({g1_order[i], (*arena)->SlotData(slots[i]) + G2PayloadOffset(*layout)});
  }

  std::vector<MethodResult> results;
  std::vector<std::string> skipped;
  for (auto m : methods) {
    DeviceCopyBackend::Config mc = cfg;
    mc.method = m;
    MethodResult r;
    Status s = RunMethod(mc, g1, arena->get(), copies, mirror, mirror_g1, *reps, &r);
    if (s.Is(StatusCode::kUnavailable) && method_name == "all") {
      skipped.push_back(std::string(DeviceCopyMethodName(m)) + ": " + s.message());
      continue;
    }
    if (!s.ok()) return Failure(s);
    results.push_back(r);
  }

  // The raw limit: one plain cudaMemcpyAsync of the same bytes, device <-> the pinned arena.
  const uint64_t total = block_bytes * n;
  auto reg = CreateCudaBackend(cfg);
  if (!reg.ok()) return Failure(reg.status());
  if (Status s = (*reg)->RegisterHost((*arena)->base(), (*arena)->mapped_bytes()); !s.ok()) {
    return Failure(s);
  }
  auto plain_d2h = (*reg)->TimePlainCopy(CopyDirection::kDeviceToHost, *dev, (*arena)->base(),
                                         total, static_cast<uint32_t>(*reps));
  auto plain_h2d = (*reg)->TimePlainCopy(CopyDirection::kHostToDevice, *dev, (*arena)->base(),
                                         total, static_cast<uint32_t>(*reps));
  if (!plain_d2h.ok()) return Failure(plain_d2h.status());
  if (!plain_h2d.ok()) return Failure(plain_h2d.status());
  reg->reset();

  // The host's share of a batch: planning alone (the CPU work of Submit before any CUDA call).
  double plan_s = 1e30;
  uint64_t plan_units = 0;
  {
    const HostWindow window{(*arena)->base(), (*arena)->mapped_bytes(),
                            reinterpret_cast<uint64_t>((*arena)->base())};
    DeviceCopyPlan plan;
    for (uint64_t r = 0; r < *reps; ++r) {
      Stopwatch w;
      if (Status s = BuildDeviceCopyPlan(g1, window, CopyDirection::kHostToDevice, copies,
                                         cfg.max_unit_bytes, &plan);
          !s.ok()) {
        return Failure(s);
      }
      plan_s = std::min(plan_s, w.Seconds());
    }
    plan_units = plan.units.size();
  }

  auto gbps = [total](double s) { return static_cast<double>(total) / s / 1e9; };
  const double memcpy_d2h = gbps(plain_d2h->device_s), memcpy_h2d = gbps(plain_h2d->device_s);
  // The same copies timed as the backend's batches are (host wall time until the wait ends).
  const double memcpy_wall_d2h = gbps(plain_d2h->wall_s), memcpy_wall_h2d = gbps(plain_h2d->wall_s);
  const double memcpy_best = std::max(memcpy_d2h, memcpy_h2d);  // the stricter reference
  uint64_t mismatches = 0;
  for (const auto& r : results) mismatches += r.mismatched_bytes;
  const MethodResult& top = results.front();  // the first asked for: kernel for "all"

  if (json) {
    JsonObject per;
    for (const auto& r : results) {
      JsonObject o;
      o.Add("d2h_gbps", gbps(r.d2h_s))
          .Add("h2d_gbps", gbps(r.h2d_s))
          .Add("d2h_ratio", gbps(r.d2h_s) / memcpy_best)
          .Add("h2d_ratio", gbps(r.h2d_s) / memcpy_best)
          .Add("d2h_vs_memcpy_wall", gbps(r.d2h_s) / memcpy_wall_d2h)
          .Add("h2d_vs_memcpy_wall", gbps(r.h2d_s) / memcpy_wall_h2d)
          .Add("d2h_us", r.d2h_s * 1e6)
          .Add("h2d_us", r.h2d_s * 1e6)
          .Add("d2h_submit_us", r.d2h_submit_s * 1e6)
          .Add("h2d_submit_us", r.h2d_submit_s * 1e6)
          .Add("mismatched_bytes", r.mismatched_bytes);
      per.Raw(r.method, o.Str());
    }
    std::string skipped_json = "[";
    for (size_t i = 0; i < skipped.size(); ++i) {
      skipped_json += (i ? ", " : "") + JsonObject::Quote(skipped[i]);
    }
    skipped_json += "]";
    JsonObject out;
    out.Add("available", true)
        .Add("device", top.device)
        .Add("method", top.method)
        .Add("d2h_gbps", gbps(top.d2h_s))
        .Add("h2d_gbps", gbps(top.h2d_s))
        .Add("cuda_memcpy_gbps", memcpy_best)
        .Add("cuda_memcpy_d2h_gbps", memcpy_d2h)
        .Add("cuda_memcpy_h2d_gbps", memcpy_h2d)
        .Add("cuda_memcpy_wall_d2h_gbps", memcpy_wall_d2h)
        .Add("cuda_memcpy_wall_h2d_gbps", memcpy_wall_h2d)
        .Add("cuda_memcpy_d2h_us", plain_d2h->device_s * 1e6)
        .Add("cuda_memcpy_wall_d2h_us", plain_d2h->wall_s * 1e6)
        .Add("plan_us", plan_s * 1e6)
        .Add("units", plan_units)
        .Add("d2h_ratio", gbps(top.d2h_s) / memcpy_best)
        .Add("h2d_ratio", gbps(top.h2d_s) / memcpy_best)
        .Add("d2h_vs_memcpy_d2h", gbps(top.d2h_s) / memcpy_d2h)
        .Add("h2d_vs_memcpy_h2d", gbps(top.h2d_s) / memcpy_h2d)
        .Add("mismatched_bytes", mismatches)
        .Add("block_bytes", block_bytes)
        .Add("blocks", uint64_t{n})
        .Add("g1_blocks", uint64_t{g1_blocks})
        .Add("unit_bytes", cfg.max_unit_bytes)
        .Add("kernel_threads", cfg.kernel_threads)
        .Add("kernel_blocks", cfg.kernel_max_blocks)
        .Add("launch_bytes", cfg.min_launch_bytes)
        .Add("spin_us", uint64_t{cfg.completion_spin_us})
        .Add("reps", *reps)
        .Add("layout", layout->ToString())
        .Raw("methods", per.Str())
        .Raw("skipped_methods", skipped_json);
    std::printf("%s\n", out.Str().c_str());
  } else {
    std::printf("bench copy --device cuda: %s\n", top.device.c_str());
    std::printf("  %u blocks of %s scattered over %u G1 blocks, best of %llu\n", n,
                layout->ToString().c_str(), g1_blocks, static_cast<unsigned long long>(*reps));
    std::printf(
        "  plain cudaMemcpyAsync of %.0f MiB pinned: d2h %.2f GB/s, h2d %.2f GB/s "
        "(host wall time until synchronized: %.2f, %.2f)\n",
        static_cast<double>(total) / (1 << 20), memcpy_d2h, memcpy_h2d, memcpy_wall_d2h,
        memcpy_wall_h2d);
    std::printf("  planning %llu copy units on the host: %.1f us\n",
                static_cast<unsigned long long>(plan_units), plan_s * 1e6);
    std::printf("  %-8s %10s %10s %9s %9s %12s %12s %12s\n", "method", "d2h GB/s", "h2d GB/s",
                "d2h/mcp", "h2d/mcp", "submit d2h", "submit h2d", "bad bytes");
    for (const auto& r : results) {
      std::printf("  %-8s %10.2f %10.2f %9.3f %9.3f %9.1f us %9.1f us %12llu\n", r.method.c_str(),
                  gbps(r.d2h_s), gbps(r.h2d_s), gbps(r.d2h_s) / memcpy_best,
                  gbps(r.h2d_s) / memcpy_best, r.d2h_submit_s * 1e6, r.h2d_submit_s * 1e6,
                  static_cast<unsigned long long>(r.mismatched_bytes));
    }
    for (const auto& s : skipped) std::printf("  skipped %s\n", s.c_str());
  }
  if (mismatches != 0) {
    std::fprintf(stderr, "kvtier: %llu copied bytes differ from what the device held\n",
                 static_cast<unsigned long long>(mismatches));
    return 1;
  }
  return 0;
}

}  // namespace kvtier::cli

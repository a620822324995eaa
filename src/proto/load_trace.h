// Where an attached engine's G2 -> G1 load spends its time (issue 40, docs/pd.md): timestamps
// taken by the daemon and by the engine's data thread, read by `kvtier bench handoff`, which
// runs both in one process. Off unless a LoadTrace is installed: then each event costs one
// relaxed atomic load. Only load batches (kCopy, G2 -> G1) are traced.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace kvtier::proto {

struct LoadTrace {
  static constexpr uint32_t kMaxLayers = 128;
  // steady_clock nanoseconds; 0 = not seen since Reset().
  std::atomic<int64_t> first_copy_queued_ns{0};    // the daemon queued the first kCopy
  std::atomic<int64_t> first_copy_received_ns{0};  // the engine's data thread began it
  std::atomic<uint32_t> batches{0};                // kCopy load batches the engine ran
  std::atomic<int64_t> copy_ns{0};                 // the engine's ScatterLayer time, summed
  std::atomic<int64_t> report_ns{0};               // its kCopyLayer sends, summed
  // The last time layer l's copy ended on the engine (of any batch), and the daemon read its
  // kCopyLayer report.
  std::array<std::atomic<int64_t>, kMaxLayers> layer_copied_ns{};
  std::array<std::atomic<int64_t>, kMaxLayers> layer_reported_ns{};

  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void Reset() {
    first_copy_queued_ns = 0;
    first_copy_received_ns = 0;
    batches = 0;
    copy_ns = 0;
    report_ns = 0;
    for (auto& t : layer_copied_ns) t = 0;
    for (auto& t : layer_reported_ns) t = 0;
  }
  static void SetFirst(std::atomic<int64_t>& slot, int64_t t) {
    int64_t zero = 0;
    slot.compare_exchange_strong(zero, t, std::memory_order_relaxed);
  }
  static void SetMax(std::atomic<int64_t>& slot, int64_t t) {
    int64_t seen = slot.load(std::memory_order_relaxed);
    while (seen < t && !slot.compare_exchange_weak(seen, t, std::memory_order_relaxed)) {
    }
  }
};

// The trace events go to (nullptr: none). Set by the bench around the loads it traces.
inline std::atomic<LoadTrace*> g_load_trace{nullptr};

inline LoadTrace* ActiveLoadTrace() { return g_load_trace.load(std::memory_order_relaxed); }

}  // namespace kvtier::proto

// The cost model `kvtier replay` estimates time-to-first-token with. The replay moves scaled-down
// blocks through the real tiers (that proves the bytes arrive); the time a real deployment would
// take is computed from the blocks each tier supplied and the real model's sizes:
//
//   TTFT(kvtier)    = sum over tiers t of (blocks from t x real block bytes) / bandwidth(t)
//                     + (prompt tokens - loaded tokens) / prefill tokens per second
//   TTFT(recompute) = prompt tokens / prefill tokens per second
//
// Loads and compute are added, not overlapped (the engine computes layer 0 of the suffix while
// later layers load, so the truth lies between the sum and the max: the sum is the conservative
// side). Prefill is taken as linear in tokens (attention's quadratic term is folded into the
// rate). Queueing, scheduling and decode are not modelled. Defaults and their sources are in
// docs/replay.md.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/tier.h"

namespace kvtier::cli {

struct CostModel {
  // Prefill throughput of the engine (tokens/s): Llama-3-8B-class on one H200, BF16.
  double prefill_tokens_per_s = 20000;
  // KV bytes per token of the real model: Llama-3-8B = 32 layers x 2 (K, V) x 8 KV heads x 128
  // x 2 bytes (fp16/bf16) = 131,072.
  uint64_t kv_bytes_per_token = 131072;
  // Load bandwidth into G1 from each tier (bytes/s), indexed by TierId: G2 = host DRAM over
  // PCIe Gen5 x16 (~50 GB/s effective), G3 = one NVMe SSD (~6 GB/s reads; its staging hop
  // through G2 overlaps), G4 = networked store (~1.25 GB/s: 10 GbE line rate; --g4-gbps).
  std::array<double, kNumTiers> load_bytes_per_s{0, 50e9, 6e9, 1.25e9};

  // InvalidArgument naming the first field that is not finite and positive.
  Status Validate() const;

  // Seconds to load `blocks_by_tier` blocks of `tokens_per_block` tokens each (real model).
  double LoadSeconds(const std::array<uint64_t, kNumTiers>& blocks_by_tier,
                     uint32_t tokens_per_block) const;
  // Seconds to prefill `tokens` tokens.
  double ComputeSeconds(uint64_t tokens) const;
};

// Percentile `p` (0..100) of `values` by nearest rank on a sorted copy; 0 for an empty vector.
double Percentile(std::vector<double> values, double p);

}  // namespace kvtier::cli

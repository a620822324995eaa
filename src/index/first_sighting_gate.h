// FirstSightingGate: decides, from G3's measured hit yield, whether blocks seen fewer times than
// g3.admit_min_seen still go to G3 (issue 17, docs/policy-study.md section 8.6).
//
// A fixed threshold is wrong somewhere: admitting every G2 victim writes 250 blocks per G3 hit
// where one-off prompts stream through, while admitting only second sightings loses a fifth of
// the hits where most reuse is a block's first reuse (a chat's next turn). So the gate measures
// what first sightings yield. A deterministic sample of them (1 in `probe_one_in`, chosen by
// key bits, so the same key is always a probe or never) is always written, and each probe's G3
// hits are counted for `horizon` first-sighting decisions after its write (or until it leaves
// G3, whichever is first); then the probe is *resolved*. Judging only resolved probes, all of
// the same age, is what makes the estimate fair: counting hits as they come undercounts young
// probes, and judging probes at eviction counts mostly the unused ones (the G3 policy evicts
// those first). While resolved probes yielded at least one hit per `max_writes_per_hit`
// writes, every first sighting is admitted; otherwise only the probes are, and the rest wait
// for their next sighting as before. Until `min_resolved` probes have resolved it admits (G3 is
// still filling). Resolved counts are halved every `window` resolutions, so the gate follows a
// workload that changes.
//
// Thread-safe: one mutex, held for a hash-set operation per call.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <utility>

#include "core/mutex.h"
#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

class FirstSightingGate {
 public:
  struct Config {
    // A first sighting is admitted while probes yield a G3 hit per this many writes or better.
    // (0, 1e6].
    double max_writes_per_hit = 8;
    uint32_t probe_one_in = 16;  // 1 in N first sightings is a probe: 1..1024
    uint64_t window = 4096;      // resolved probes between halvings: >= 2 x min_resolved
    uint64_t min_resolved = 64;  // admit everything until this many have resolved
    // First-sighting decisions (Admit calls) a probe's hits are counted for: >= 1. The manager
    // uses G3's slot count, the time G3 takes to turn over when every victim is written.
    uint64_t horizon = 1u << 16;

    // Ok, or InvalidArgument naming the field, its value and the accepted range.
    Status Validate() const;
  };

  struct Counts {
    double resolved_writes = 0;  // probes that left G3 (decayed)
    double resolved_hits = 0;    // their G3 hits (decayed)
    uint64_t live_probes = 0;    // probes in G3 now
    bool open = true;            // first sightings admitted now
    uint64_t admitted = 0;       // first sightings admitted (probes included)
    uint64_t refused = 0;        // first sightings refused
  };

  // InvalidArgument when config does not validate.
  static Result<std::unique_ptr<FirstSightingGate>> Create(const Config& config);

  // A block seen fewer than min_seen times is about to leave G2: true when it goes to G3. A
  // probe is always admitted and remembered.
  bool Admit(const BlockKey& key) EXCLUDES(mu_);
  // A G3 load of `key` succeeded: counts a hit when `key` is a remembered probe.
  void OnHit(const BlockKey& key) EXCLUDES(mu_);
  // `key` left G3 (evicted or removed): when it is a probe, its yield is resolved.
  void OnRemoved(const BlockKey& key) EXCLUDES(mu_);

  Counts counts() const EXCLUDES(mu_);

 private:
  explicit FirstSightingGate(const Config& config) : config_(config) {}
  bool IsProbe(const BlockKey& key) const { return key.lo % config_.probe_one_in == 0; }
  bool OpenLocked() const REQUIRES(mu_);
  // Adds a probe's outcome to the resolved counts (and decays them).
  void ResolveLocked(uint32_t hits) REQUIRES(mu_);

  const Config config_;
  mutable Mutex mu_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> probes_ GUARDED_BY(mu_);  // -> hits
  // Probes in write order, with the decision count at their write; may hold resolved keys.
  std::deque<std::pair<BlockKey, uint64_t>> probe_order_ GUARDED_BY(mu_);
  uint64_t decisions_ GUARDED_BY(mu_) = 0;  // Admit calls so far
  double resolved_writes_ GUARDED_BY(mu_) = 0;
  double resolved_hits_ GUARDED_BY(mu_) = 0;
  uint64_t total_resolved_ GUARDED_BY(mu_) = 0;
  uint64_t admitted_ GUARDED_BY(mu_) = 0;
  uint64_t refused_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

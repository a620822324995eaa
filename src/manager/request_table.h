// RequestTable: the manager's per-request state, by request id, with the order of last
// activity that the idle sweep walks. One job: keep the entries and their activity order
// consistent; what a request's fields mean for loads and saves is the Impl's.
//
// Lock: none of its own. Like LevelDB's VersionSet under DBImpl's mutex, the table is guarded
// by BlockManagerImpl::mu_ (the Impl declares it GUARDED_BY(mu_), so every call needs mu_
// held): the request entries change together with the pending loads and saves that mu_
// guards, in one critical section.
//
// Invariants:
//  - entries_ and by_activity_ hold the same ids, each once; an entry's `by_activity` is its
//    place in by_activity_, and its `id` is its key.
//  - by_activity_ is in order of last activity (RequestState::last_active): Activate and Touch
//    move an entry to the back, so the idle sweep finds expired entries at the front and stops
//    at the first one that is not.
//  - A pointer from Find or Activate stays valid until that entry is erased (unordered_map
//    keeps its elements in place across inserts and other erases).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/tier.h"

namespace kvtier {

class BlockHasher;
class TransferJob;

// One request the manager tracks (its Lookup made the entry).
struct RequestState {
  std::string id;
  uint32_t instance = 0;                      // the engine it belongs to
  std::shared_ptr<const BlockHasher> hasher;  // of its namespace (kept if the cache drops it)
  uint64_t namespace_id = 0;
  std::vector<TokenId> tokens;           // the prompt, then what Commit reported
  std::vector<BlockKey> keys;            // keys of the full blocks of `tokens`
  std::vector<std::string> block_extra;  // RequestSpec::block_extra of the last Lookup
  uint8_t load_tiers = kAllTiers;        // RequestSpec::load_tiers / store_tiers
  uint8_t store_tiers = kAllTiers;
  uint32_t lookup_start = 0;   // first block kvtier may supply (num_computed_tokens / tpb)
  uint32_t lookup_blocks = 0;  // blocks the last Lookup offered
  uint32_t load_first = 0;     // PrepareLoad: first block loaded
  uint32_t load_planned = 0;   // PrepareLoad: blocks planned
  uint32_t loaded_blocks = 0;  // intact prefix after the load ended
  bool load_in_flight = false;
  std::shared_ptr<TransferJob> load_job;  // the batch carrying this request's loads
  uint32_t committed_blocks = 0;
  uint32_t saves_in_flight = 0;  // save holds: its G1 blocks may still be read
  bool finished = false;         // RequestFinished was called
  bool kept_for_saves = false;   // RequestFinished returned true: saves_done will list it
  // Finished while its load was in flight, the load has ended, and Finished() has not listed
  // it in loads_done yet (retiring: listed by the last call; erased at the next one).
  bool load_unreported = false;
  bool retiring = false;
  uint32_t save_drains = 0;  // WaitForRequestSaves calls in progress: no save of it starts
  std::chrono::steady_clock::time_point last_active{};
  std::list<std::string>::iterator by_activity;  // its place in the table's activity order
  // G4: the last Lookup found blocks [g4_first, g4_first + g4_blocks) in G4, past the local
  // prefix; asked at g4_asked_at; g4_whole: every block asked about was there (a repeated
  // Lookup reuses a whole answer for kG4LookupReuse, a partial one for less).
  uint32_t g4_first = 0;
  uint32_t g4_blocks = 0;
  std::chrono::steady_clock::time_point g4_asked_at{};
  bool g4_whole = false;

  // No load in flight and no save hold: nothing of the engine's G1 is in use for it.
  bool Idle() const { return !load_in_flight && saves_in_flight == 0; }
};

class RequestTable {
 public:
  using Entries = std::unordered_map<std::string, RequestState>;

  RequestTable() = default;
  RequestTable(const RequestTable&) = delete;
  RequestTable& operator=(const RequestTable&) = delete;

  // Entries idle this long are dropped by SweepIdle (manager.idle_request_ttl_ms). Set once,
  // before the first call.
  void set_idle_ttl(std::chrono::milliseconds ttl) { idle_ttl_ = ttl; }

  // The entry of `id`, or null.
  RequestState* Find(const std::string& id);
  const RequestState* Find(const std::string& id) const;
  // The entry of `id`, made (empty but for its id; *made = true) when there is none; marked
  // active now either way.
  RequestState& Activate(const std::string& id, bool* made);
  // Marks `r` active now (the idle sweep leaves it alone for the TTL more).
  void Touch(RequestState& r);
  // Erases `r`; pointers to it dangle after.
  void Erase(RequestState& r);

  // Looks at up to `max` of the least recently active entries, stopping at the first one
  // active within the TTL: an idle one (RequestState::Idle) is erased, one with work in
  // flight is touched (looked at again a TTL later). Returns how many it erased.
  size_t SweepIdle(std::chrono::steady_clock::time_point now, int max);

  size_t size() const { return entries_.size(); }
  // Every entry, for reading (e.g. an instance's requests). Not to be erased through.
  const Entries& entries() const { return entries_; }

 private:
  Entries entries_;
  std::list<std::string> by_activity_;  // least recently active first
  std::chrono::milliseconds idle_ttl_{600000};
};

}  // namespace kvtier

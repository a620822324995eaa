// G2SlotTable: what each G2 slot of the embedded manager holds (key, parent, namespace, tokens,
// the saving request's store_tiers, the commit checksum), for the paths that write a slot's
// block on (demotion to G3, G4 writes, the kStored event), and the G2 namespace share
// (g2.namespace_share) that eviction consults. BlockManagerImpl owns one; it allocates, evicts
// and frees the slots themselves (the arena and the index), and records here what they hold.
//
// The namespace share: G2 slots are counted per namespace (model, salt, adapter), and a block
// of a namespace holding no more than its guaranteed share (share x slots / namespaces holding
// blocks) is not evicted for another namespace's block, so one tenant's burst cannot empty G2
// of the others. A namespace's own blocks, and blocks of namespaces over their share, are
// evicted as the policy picks.
//
// Invariants:
//  - One record per G2 slot (num_slots, fixed at construction); each slot's tokens are
//    tokens_per_block entries, zero-padded past the block's own.
//  - A slot's namespace for the share is its record's namespace_id from Set until Free
//    (0 after Free: the slot holds no block); the rest of the record stays until the next Set.
//  - ns_slots_[ns] is the number of slots whose namespace is ns, for every ns != 0; no entry
//    counts 0, so ns_slots_.size() is the number of namespaces holding G2 slots.
//
// Locks: meta_mu_ guards the records, ns_mu_ the namespace counts. Both are leaves: the caller
// may hold its own locks (the manager's mu_ when it frees a slot; the index's shard locks
// around EvictableFor, BlockIndex::EvictOne's filter), and neither is held while taking any
// other lock (Set takes them one after the other).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "kvtier/block_key.h"
#include "kvtier/tier.h"

namespace kvtier {

class G2SlotTable {
 public:
  // What a G2 slot holds, for its demotion to G3 (the header needs parent, namespace, tokens).
  struct Meta {
    BlockKey key;
    BlockKey parent;
    uint64_t namespace_id = 0;
    uint8_t store_tiers = kAllTiers;  // the saving request's RequestSpec::store_tiers
    // kvtier serve (shared G2): the payload's checksum when the engine's save of it landed,
    // so a slot an engine wrote into after its commit is never persisted to G3 or G4
    // (BlockTransfer::expected_checksum). 0: not taken (embedded, or filled from G3/G4).
    uint64_t commit_checksum = 0;
  };
  // What a write of the slot's block to G3 or G4 needs from its record (CopyForWrite).
  struct WriteRecord {
    uint64_t namespace_id = 0;
    uint64_t commit_checksum = 0;
    std::vector<TokenId> tokens;  // tokens_per_block of them
  };

  // `namespace_share`: g2.namespace_share; <= 0 turns the share off (EvictableFor is always
  // true). REQUIRES: tokens_per_block >= 1.
  G2SlotTable(uint32_t num_slots, uint32_t tokens_per_block, double namespace_share);
  G2SlotTable(const G2SlotTable&) = delete;
  G2SlotTable& operator=(const G2SlotTable&) = delete;

  // Records that `slot` now holds the block `meta` names, with its `tokens` (at most
  // tokens_per_block are kept), and counts the slot for meta.namespace_id.
  // REQUIRES: slot < num_slots().
  void Set(uint32_t slot, const Meta& meta, std::span<const TokenId> tokens)
      EXCLUDES(meta_mu_, ns_mu_);
  // The slot holds no block any more: its namespace gives the slot back. A slot out of range
  // is ignored.
  void Free(uint32_t slot) EXCLUDES(ns_mu_);
  // kvtier serve: the checksum of the payload the engine's save left in `slot`.
  // REQUIRES: slot < num_slots().
  void SetCommitChecksum(uint32_t slot, uint64_t checksum) EXCLUDES(meta_mu_);

  // The store_tiers of the block `slot` holds. REQUIRES: slot < num_slots().
  uint8_t StoreTiers(uint32_t slot) const EXCLUDES(meta_mu_);
  // The slot's namespace, commit checksum and tokens, copied under one lock.
  // REQUIRES: slot < num_slots().
  WriteRecord CopyForWrite(uint32_t slot) const EXCLUDES(meta_mu_);

  // Whether the block in `slot` may be evicted for a block of namespace `ns` (see the share,
  // above). True when the share is off, for ns 0 (no namespace: every victim allowed), for a
  // free slot or one out of range, and for a block of `ns` itself.
  bool EvictableFor(uint64_t ns, uint32_t slot) const EXCLUDES(ns_mu_);
  // True when g2.namespace_share is on (eviction must ask EvictableFor).
  bool share_on() const { return share_ > 0; }
  // Slots counted for namespace `ns` now (0 when none).
  uint32_t SlotsOf(uint64_t ns) const EXCLUDES(ns_mu_);
  // Namespaces holding at least one slot now.
  size_t Namespaces() const EXCLUDES(ns_mu_);
  uint32_t num_slots() const { return num_slots_; }

 private:
  // Counts `slot` for `ns` (0: for none), uncounting its previous namespace.
  void AssignNamespace(uint32_t slot, uint64_t ns) EXCLUDES(ns_mu_);

  const uint32_t num_slots_;
  const uint32_t tpb_;
  const double share_;

  mutable Mutex meta_mu_;
  std::vector<Meta> meta_ GUARDED_BY(meta_mu_);       // per slot
  std::vector<TokenId> tokens_ GUARDED_BY(meta_mu_);  // tpb_ per slot

  mutable Mutex ns_mu_;
  std::vector<uint64_t> slot_ns_ GUARDED_BY(ns_mu_);  // per slot; 0 = none
  std::unordered_map<uint64_t, uint32_t> ns_slots_ GUARDED_BY(ns_mu_);
};

}  // namespace kvtier

// KV events: every store and removal of a block in every tier, the feed a KV-aware router uses
// to send a request to the worker that already holds its prefix (vLLM's BlockStored /
// BlockRemoved events carry the same facts).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/tier.h"

namespace kvtier {

struct KvEvent {
  enum class Kind : uint8_t {
    kStored = 0,   // the tier holds the block now
    kRemoved = 1,  // the tier no longer holds it (evicted, demoted away, found corrupt)
  };
  Kind kind = Kind::kStored;
  BlockKey key;
  BlockKey parent;  // the block's lineage parent; the namespace root for a first block
  TierId tier = kTierG2;
  uint64_t time_ns = 0;  // CLOCK_REALTIME nanoseconds when kvtier made the change

  // kStored only (zero/empty on kRemoved), so that a consumer can compute its own hashes
  // (docs/events.md). The manager fills them for every store in every tier: the tokens come
  // from the G2 slot's record or from the G3/G4 block header, which has always held them.
  uint32_t block_size = 0;         // tokens per block (the layout's tokens_per_block)
  bool parent_is_root = false;     // a prompt's first block: `parent` is the namespace root
  std::vector<TokenId> token_ids;  // the block's own tokens; empty when unknown
  std::string lora_name;           // the adapter (LoRA) id of its namespace; empty: base model
  std::string cache_salt;          // the tenant salt of its namespace; empty: none
  // False when lora_name and cache_salt are unknown (a block G3 recovered at start-up whose
  // namespace no request of this process has used yet; the header keeps only its hash).
  bool namespace_known = true;
};

const char* KvEventKindName(KvEvent::Kind kind);  // "stored", "removed"

// Receives events in the order the changes were made to each block. Called on the thread that
// made the change; must be quick and must not call back into the BlockManager.
using KvEventCallback = std::function<void(std::span<const KvEvent> events)>;

}  // namespace kvtier

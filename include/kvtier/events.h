// KV events: every store and removal of a block in every tier, the feed a KV-aware router uses
// to send a request to the worker that already holds its prefix (vLLM's BlockStored /
// BlockRemoved events carry the same facts).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

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
};

const char* KvEventKindName(KvEvent::Kind kind);  // "stored", "removed"

// Receives events in the order the changes were made to each block. Called on the thread that
// made the change; must be quick and must not call back into the BlockManager.
using KvEventCallback = std::function<void(std::span<const KvEvent> events)>;

}  // namespace kvtier

// vLLM's KV-event wire format (vllm/distributed/kv_events.py), encoded with msgpack-c++.
//
// A payload is one msgspec-encoded KVEventBatch: an array [ts, events, data_parallel_rank]
// (EventBatch is array_like), ts a float64 of seconds since the epoch. Each event is a map
// (KVCacheEvent is tag=True, not array_like) whose first key is "type" ("BlockStored",
// "BlockRemoved", "AllBlocksCleared"), then the fields in class order; fields with a default
// are left out while they hold it (omit_defaults), fields without one are always there (nil
// for None). The bytes equal what msgspec.msgpack.Encoder() makes of the same objects
// (tests/python/test_events_vllm.py checks that against vLLM's own classes).
//
// docs/events.md maps kvtier's tiers to medium/locality and says what each field holds.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kvtier/events.h"

namespace kvtier {

// One entry of a batch: a kvtier event, or AllBlocksCleared (the publisher's own).
struct WireEvent {
  enum class Type : uint8_t { kBlock = 0, kAllBlocksCleared = 1 };
  Type type = Type::kBlock;
  KvEvent event;  // kBlock only
};

// vLLM's medium for a tier: G1 "GPU", G2 "CPU", G3 and G4 "STORAGE".
const char* WireMedium(TierId tier);
// vLLM's locality relative to the publisher: G4 "REMOTE" (shared storage), the others "LOCAL".
const char* WireLocality(TierId tier);
// The ownership field: "kvtier:G2" etc. (the same as the Python connector's events).
const char* WireOwnership(TierId tier);

// Encodes `events` as one KVEventBatch payload. Consecutive stores of one chain (same tier and
// namespace, each the parent's child, tokens known) become one BlockStored with several
// block_hashes, as vLLM emits a request's blocks; consecutive removals from one tier become
// one BlockRemoved. `ts_seconds`: the batch time. Never fails.
std::string EncodeEventBatch(double ts_seconds, std::span<const WireEvent> events,
                             int64_t data_parallel_rank);

// kvtier's 128-bit key as vLLM's ExternalBlockHash bytes: the digest's 16 bytes in order
// (BlockKey::ToHex order).
std::string WireKeyBytes(const BlockKey& key);

}  // namespace kvtier

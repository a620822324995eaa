#include "events/event_wire.h"

#include <msgpack/pack.hpp>
#include <msgpack/sbuffer.hpp>

#include <cstring>
#include <vector>

namespace kvtier {

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackStr(Packer& p, const char* s) {
  const uint32_t n = static_cast<uint32_t>(std::strlen(s));
  p.pack_str(n);
  p.pack_str_body(s, n);
}

void PackStr(Packer& p, const std::string& s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackKey(Packer& p, const BlockKey& key) {
  const std::string b = WireKeyBytes(key);
  p.pack_bin(static_cast<uint32_t>(b.size()));
  p.pack_bin_body(b.data(), static_cast<uint32_t>(b.size()));
}

// vLLM's per-block extra keys: the LoRA name when the namespace has one, then the cache salt
// on a prompt's first block only (vLLM salts the first block; kvtier salts the namespace root,
// which only the first block hashes directly). Empty: nil.
std::vector<std::string> ExtraKeys(const KvEvent& e) {
  std::vector<std::string> keys;
  if (!e.lora_name.empty()) keys.push_back(e.lora_name);
  if (e.parent_is_root && !e.cache_salt.empty()) keys.push_back(e.cache_salt);
  return keys;
}

bool Chains(const KvEvent& first, const KvEvent& prev, const KvEvent& next) {
  return next.kind == KvEvent::Kind::kStored && next.tier == first.tier &&
         next.parent == prev.key && !next.parent_is_root && next.block_size == first.block_size &&
         next.token_ids.size() == next.block_size && !first.token_ids.empty() &&
         first.token_ids.size() == first.block_size &&
         next.namespace_known == first.namespace_known && next.lora_name == first.lora_name &&
         next.cache_salt == first.cache_salt;
}

// The two fields every store and removal starts with: its type, then the run's keys.
void PackTypeAndHashes(Packer& p, const char* type, std::span<const WireEvent> run) {
  PackStr(p, "type");
  PackStr(p, type);
  PackStr(p, "block_hashes");
  p.pack_array(static_cast<uint32_t>(run.size()));
  for (const WireEvent& w : run) PackKey(p, w.event.key);
}

// Events [begin, end) of one chain: BlockStored (field order of vLLM's class).
void PackStored(Packer& p, std::span<const WireEvent> run) {
  const KvEvent& first = run.front().event;
  std::vector<std::vector<std::string>> extra;
  bool any_extra = false;
  for (const WireEvent& w : run) {
    extra.push_back(ExtraKeys(w.event));
    any_extra |= !extra.back().empty();
  }
  // type, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
  // [extra_keys], locality, ownership.
  p.pack_map(any_extra ? 11 : 10);
  PackTypeAndHashes(p, "BlockStored", run);
  PackStr(p, "parent_block_hash");
  if (first.parent_is_root) {
    p.pack_nil();
  } else {
    PackKey(p, first.parent);
  }
  PackStr(p, "token_ids");
  size_t n = 0;
  for (const WireEvent& w : run) n += w.event.token_ids.size();
  p.pack_array(static_cast<uint32_t>(n));
  for (const WireEvent& w : run) {
    for (TokenId t : w.event.token_ids) p.pack_uint32(t);
  }
  PackStr(p, "block_size");
  p.pack_uint32(first.block_size);
  PackStr(p, "lora_id");
  p.pack_nil();
  PackStr(p, "medium");
  PackStr(p, WireMedium(first.tier));
  PackStr(p, "lora_name");
  if (first.lora_name.empty()) {
    p.pack_nil();
  } else {
    PackStr(p, first.lora_name);
  }
  if (any_extra) {
    PackStr(p, "extra_keys");
    p.pack_array(static_cast<uint32_t>(extra.size()));
    for (const auto& keys : extra) {
      if (keys.empty()) {
        p.pack_nil();
        continue;
      }
      p.pack_array(static_cast<uint32_t>(keys.size()));
      for (const std::string& k : keys) PackStr(p, k);
    }
  }
  PackStr(p, "locality");
  PackStr(p, WireLocality(first.tier));
  PackStr(p, "ownership");
  PackStr(p, WireOwnership(first.tier));
}

void PackRemoved(Packer& p, std::span<const WireEvent> run) {
  const TierId tier = run.front().event.tier;
  // type, block_hashes, medium, locality, ownership.
  p.pack_map(5);
  PackTypeAndHashes(p, "BlockRemoved", run);
  PackStr(p, "medium");
  PackStr(p, WireMedium(tier));
  PackStr(p, "locality");
  PackStr(p, WireLocality(tier));
  PackStr(p, "ownership");
  PackStr(p, WireOwnership(tier));
}

}  // namespace

const char* WireMedium(TierId tier) {
  switch (tier) {
    case kTierG1:
      return "GPU";
    case kTierG2:
      return "CPU";
    default:
      return "STORAGE";
  }
}

const char* WireLocality(TierId tier) { return tier == kTierG4 ? "REMOTE" : "LOCAL"; }

const char* WireOwnership(TierId tier) {
  switch (tier) {
    case kTierG1:
      return "kvtier:G1";
    case kTierG2:
      return "kvtier:G2";
    case kTierG3:
      return "kvtier:G3";
    default:
      return "kvtier:G4";
  }
}

std::string WireKeyBytes(const BlockKey& key) {
  std::string b(16, '\0');
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<char>(key.hi >> (56 - 8 * i));
    b[8 + i] = static_cast<char>(key.lo >> (56 - 8 * i));
  }
  return b;
}

std::string EncodeEventBatch(double ts_seconds, std::span<const WireEvent> events,
                             int64_t data_parallel_rank) {
  // Runs first, so the events array knows its length.
  std::vector<std::span<const WireEvent>> runs;
  size_t i = 0;
  while (i < events.size()) {
    size_t j = i + 1;
    const WireEvent& w = events[i];
    if (w.type == WireEvent::Type::kBlock) {
      const KvEvent& first = w.event;
      if (first.kind == KvEvent::Kind::kStored) {
        while (j < events.size() && events[j].type == WireEvent::Type::kBlock &&
               Chains(first, events[j - 1].event, events[j].event)) {
          ++j;
        }
      } else {
        while (j < events.size() && events[j].type == WireEvent::Type::kBlock &&
               events[j].event.kind == KvEvent::Kind::kRemoved &&
               events[j].event.tier == first.tier) {
          ++j;
        }
      }
    }
    runs.push_back(events.subspan(i, j - i));
    i = j;
  }

  msgpack::sbuffer buf(256 + 64 * events.size());
  Packer p(buf);
  p.pack_array(3);
  p.pack_double(ts_seconds);
  p.pack_array(static_cast<uint32_t>(runs.size()));
  for (const auto& run : runs) {
    if (run.front().type == WireEvent::Type::kAllBlocksCleared) {
      p.pack_map(1);
      PackStr(p, "type");
      PackStr(p, "AllBlocksCleared");
    } else if (run.front().event.kind == KvEvent::Kind::kStored) {
      PackStored(p, run);
    } else {
      PackRemoved(p, run);
    }
  }
  p.pack_int64(data_parallel_rank);
  return std::string(buf.data(), buf.size());
}

}  // namespace kvtier

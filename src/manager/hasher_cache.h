// HasherCache: the key hasher of each namespace (cache_salt, adapter) of one model and layout
// that requests named lately, at most `capacity` of them (manager.max_namespaces).
//
// Why bounded: salts come from API clients (up to 4 KiB each on vLLM's channel) and kvtier serve
// outlives every engine, so keeping every namespace ever named grows with each new salt. A
// hasher is cheap to make again (one hash of its namespace) and makes the same keys: dropping
// one costs a hash, never a hit. What is lost with it: the names of its namespace for the KV
// events of its blocks stored later (namespace_known = false, as for blocks G3 recovered), until
// a request names it again.
//
// Invariants: lru_ holds one entry per kept namespace, the most recently used first; by_name_
// has an entry per element of lru_, keyed by views of the strings that element owns (a list
// node never moves); by_root_ maps the first half of an entry's root key (the namespace id of
// its blocks) to it, unless another kept namespace with the same first half came later.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/mutex.h"
#include "kvtier/block_key.h"

namespace kvtier {

class HasherCache {
 public:
  // REQUIRES: capacity >= 1.
  HasherCache(std::string model_id, uint64_t layout_fingerprint, uint32_t tokens_per_block,
              HashAlgorithm algorithm, size_t capacity);
  HasherCache(const HasherCache&) = delete;
  HasherCache& operator=(const HasherCache&) = delete;

  // The hasher of (salt, adapter): the kept one, now the most recently used, or a new one (the
  // least recently used is dropped when `capacity` are kept). Shared: whoever holds it (a
  // request) keeps using it after it is dropped here. InvalidArgument as BlockHasher::Create.
  Result<std::shared_ptr<const BlockHasher>> Get(const std::string& salt,
                                                 const std::string& adapter) EXCLUDES(mu_);
  // (adapter, salt) of the kept namespace whose root key's first half is `namespace_id`;
  // nullopt when none is kept (never named, or dropped since). Does not count as a use.
  std::optional<std::pair<std::string, std::string>> Names(uint64_t namespace_id) const
      EXCLUDES(mu_);
  size_t size() const EXCLUDES(mu_);
  // Namespaces dropped for room so far.
  uint64_t evictions() const EXCLUDES(mu_);

 private:
  struct Entry {
    std::string salt;
    std::string adapter;
    std::shared_ptr<const BlockHasher> hasher;
  };
  using Lru = std::list<Entry>;
  struct Name {
    std::string_view salt;
    std::string_view adapter;
    friend bool operator==(const Name&, const Name&) = default;
  };
  struct NameHash {
    size_t operator()(const Name& n) const;
  };

  const std::string model_id_;
  const uint64_t layout_fingerprint_;
  const uint32_t tokens_per_block_;
  const HashAlgorithm algorithm_;
  const size_t capacity_;

  mutable Mutex mu_;
  Lru lru_ GUARDED_BY(mu_);
  std::unordered_map<Name, Lru::iterator, NameHash> by_name_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, Lru::iterator> by_root_ GUARDED_BY(mu_);
  uint64_t evictions_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

// kvtier bench index: hashing a long prompt's blocks, and hashing + matching them in an index
// that holds them all (the scheduler-side Lookup path, without the manager around it).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_timer.h"
#include "cli/commands.h"
#include "cli/json_writer.h"
#include "index/block_index.h"
#include "kvtier/block_key.h"

namespace kvtier::cli {
namespace {

// One policy's cost on the index's hot path: a multi-turn workload (each turn re-sends its
// conversation's context plus new blocks) through a G2 tier of `capacity` blocks, as the manager
// drives it: Match, Touch of the hit blocks, and Insert of the missed ones after EvictOne while
// the tier is full. Returns ns per block referenced (best of `reps`) and the hit ratio.
struct PolicyChurn {
  double ns_per_block = 0;
  double hit_ratio = 0;
  uint64_t blocks = 0;
};

Result<PolicyChurn> RunPolicyChurn(PolicyKind kind, uint64_t capacity, uint64_t reps) {
  // The references: 4 x capacity conversations of up to 8 turns, each turn adding 1-8 blocks,
  // the next turn arriving after a few others (xorshift-driven, the same for every policy).
  std::vector<std::vector<BlockKey>> requests;
  {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    auto next = [&x] {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      return x;
    };
    struct Chat {
      std::vector<BlockKey> context;
      uint32_t turns_left;
    };
    std::vector<Chat> live;
    uint64_t key_id = 1;
    const uint64_t total_blocks = 20 * capacity;
    uint64_t emitted = 0;
    while (emitted < total_blocks) {
      if (live.size() < 64 || next() % 4 == 0) live.push_back({{}, 1 + uint32_t(next() % 8)});
      const size_t pick = next() % live.size();
      Chat& c = live[pick];
      const uint64_t add = 1 + next() % 8;
      for (uint64_t i = 0; i < add; ++i) c.context.push_back(BlockKey{key_id++, next()});
      requests.push_back(c.context);
      emitted += c.context.size();
      if (--c.turns_left == 0) {
        live[pick] = std::move(live.back());
        live.pop_back();
      }
    }
  }
  const BlockKey root{0, 0x5eed};
  PolicyChurn best;
  best.ns_per_block = 1e30;
  for (uint64_t r = 0; r < reps; ++r) {
    BlockIndex::Config cfg;
    cfg.tiers[kTierG2].policy = kind;
    cfg.tiers[kTierG2].capacity_blocks = capacity;
    auto index = BlockIndex::Create(cfg);
    if (!index.ok()) return index.status();
    uint64_t hits = 0, refs = 0;
    Stopwatch w;
    for (const std::vector<BlockKey>& keys : requests) {
      const MatchResult m = (*index)->Match(keys, uint8_t{1} << kTierG2);
      const size_t hit = m.num_blocks();
      (*index)->Touch(std::span<const BlockKey>(keys.data(), hit));
      for (size_t i = hit; i < keys.size(); ++i) {
        if ((*index)->Get(keys[i]).has_value()) continue;  // cached past a gap: not re-inserted
        while ((*index)->TierCount(kTierG2) >= capacity) {
          if (!(*index)->EvictOne(kTierG2).has_value()) break;
        }
        const Status s = (*index)->Insert(keys[i], i == 0 ? root : keys[i - 1], kTierG2, 0);
        if (!s.ok()) return s;
      }
      hits += hit;
      refs += keys.size();
    }
    const double ns = w.Micros() * 1000.0 / static_cast<double>(refs);
    if (ns < best.ns_per_block) best.ns_per_block = ns;
    best.hit_ratio = static_cast<double>(hits) / static_cast<double>(refs);
    best.blocks = refs;
  }
  return best;
}

}  // namespace

int RunBenchIndex(const CliArgs& args) {
  if (args.Has("help")) {
    std::printf(
        "usage: kvtier bench index [--tokens N] [--tokens-per-block B] [--hash sha256|xxh3-128]\n"
        "                          [--reps R] [--json]\n"
        "  hash_only_us: keys of the prompt's full blocks; lookup_us: keys + Match in an index\n"
        "  holding all of them. Best of R (20). Defaults: 131072 tokens, 16 per block, sha256.\n"
        "  --policies P1,P2,... [--capacity C]: also each eviction policy's cost on the index's\n"
        "  hot path: a multi-turn workload (20 x C block references) through a G2 of C blocks\n"
        "  (default 16384), as the manager drives it (Match, Touch, EvictOne, Insert); ns per\n"
        "  block referenced (best of 3), and that over hash + match's ns per block. The\n"
        "  product's policies: adaptive, credit-lru, lru, arc, w-tinylfu, hit-density (the\n"
        "  lab's are refused: docs/policies.md).\n");
    return 0;
  }
  if (Status s = args.CheckKnown(
          {"json", "help", "tokens", "tokens-per-block", "hash", "reps", "policies", "capacity"});
      !s.ok()) {
    return UsageError(s);
  }
  std::vector<PolicyKind> policies;
  if (args.Has("policies")) {
    const std::string list = args.GetString("policies", "");
    size_t start = 0;
    while (start <= list.size()) {
      const size_t comma = std::min(list.find(',', start), list.size());
      auto kind = ParsePolicyKind(list.substr(start, comma - start));
      if (!kind.ok()) return UsageError(kind.status());
      if (*kind == PolicyKind::kBelady) {
        return UsageError(Status::InvalidArgument(
            "--policies: belady needs the future and is not a hot-path policy; drop it"));
      }
      if (IsLabPolicy(*kind)) {
        return UsageError(
            Status::InvalidArgument("--policies: " + LabPolicyRefused(*kind).message()));
      }
      policies.push_back(*kind);
      start = comma + 1;
    }
  }
  auto capacity = args.GetUint("capacity", 16384);
  if (!capacity.ok()) return UsageError(capacity.status());
  if (*capacity < 16 || *capacity > (1u << 22)) {
    return UsageError(Status::InvalidArgument("--capacity must be in 16..4194304 blocks"));
  }
  auto tokens = args.GetUint("tokens", 131072);
  auto tpb = args.GetUint("tokens-per-block", 16);
  auto reps = args.GetUint("reps", 20);
  auto algo = ParseHashAlgorithm(args.GetString("hash", "sha256"));
  if (!tokens.ok()) return UsageError(tokens.status());
  if (!tpb.ok()) return UsageError(tpb.status());
  if (!reps.ok()) return UsageError(reps.status());
  if (!algo.ok()) return UsageError(algo.status());
  if (*tokens < 1 || *tokens > (1u << 26)) {
    return UsageError(Status::InvalidArgument("--tokens must be in 1..67108864"));
  }
  if (*reps < 1 || *reps > 10000)
    return UsageError(Status::InvalidArgument("--reps must be in 1..10000"));

  KeyNamespace ns{"bench-model", 0x1234, "", ""};
  auto hasher = BlockHasher::Create(ns, static_cast<uint32_t>(*tpb), *algo);
  if (!hasher.ok()) return UsageError(hasher.status());
  std::vector<TokenId> prompt(*tokens);
  uint64_t x = 88172645463325252ull;  // xorshift: a fixed, varied token stream
  for (auto& t : prompt) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t = static_cast<TokenId>(x % 128256);
  }

  BlockIndex::Config cfg;
  auto index = BlockIndex::Create(cfg);
  if (!index.ok()) return Failure(index.status());
  const std::vector<BlockKey> keys = hasher->KeysFor(prompt);
  BlockKey parent = hasher->root();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (Status s = (*index)->Insert(keys[i], parent, kTierG2, static_cast<uint32_t>(i)); !s.ok()) {
      return Failure(s);
    }
    parent = keys[i];
  }

  double hash_us = 1e30, lookup_us = 1e30, match_us = 1e30;
  size_t matched = 0;
  std::vector<BlockKey> scratch;
  for (uint64_t r = 0; r < *reps; ++r) {
    {
      Stopwatch w;
      scratch.clear();
      hasher->AppendKeys(prompt, hasher->root(), &scratch);
      hash_us = std::min(hash_us, w.Micros());
    }
    {
      Stopwatch w;
      scratch.clear();
      hasher->AppendKeys(prompt, hasher->root(), &scratch);
      MatchResult m = (*index)->Match(scratch);
      lookup_us = std::min(lookup_us, w.Micros());
      matched = m.num_blocks();
    }
    {
      Stopwatch w;
      MatchResult m = (*index)->Match(keys);
      match_us = std::min(match_us, w.Micros());
      matched = std::min(matched, m.num_blocks());
    }
  }
  if (matched != keys.size()) {
    return Failure(Status::Internal("index matched " + std::to_string(matched) + " of " +
                                    std::to_string(keys.size()) + " blocks it holds"));
  }
  std::vector<PolicyChurn> churn;
  for (PolicyKind kind : policies) {
    auto c = RunPolicyChurn(kind, *capacity, 3);
    if (!c.ok()) return Failure(c.status());
    churn.push_back(*c);
  }
  const double lookup_ns_per_block = lookup_us * 1000.0 / static_cast<double>(keys.size());
  if (args.Has("json")) {
    JsonObject o;
    if (!policies.empty()) {
      JsonObject per;
      for (size_t i = 0; i < policies.size(); ++i) {
        JsonObject p;
        p.Add("ns_per_block", churn[i].ns_per_block)
            .Add("over_lookup_ns_per_block", churn[i].ns_per_block / lookup_ns_per_block)
            .Add("hit_ratio", churn[i].hit_ratio)
            .Add("blocks", churn[i].blocks);
        per.Raw(PolicyKindName(policies[i]), p.Str());
      }
      o.Add("capacity_blocks", *capacity).Raw("policies", per.Str());
    }
    o.Add("lookup_ns_per_block", lookup_ns_per_block);
    o.Add("tokens", *tokens)
        .Add("blocks", uint64_t{keys.size()})
        .Add("hash", HashAlgorithmName(*algo))
        .Add("hash_only_us", hash_us)
        .Add("lookup_us", lookup_us)
        .Add("match_only_us", match_us)
        .Add("lookup_over_hash", lookup_us / hash_us);
    std::printf("%s\n", o.Str().c_str());
  } else {
    std::printf("bench index: %llu tokens, %zu blocks of %llu, %s, best of %llu\n",
                static_cast<unsigned long long>(*tokens), keys.size(),
                static_cast<unsigned long long>(*tpb), HashAlgorithmName(*algo),
                static_cast<unsigned long long>(*reps));
    std::printf(
        "  hash only       %10.1f us\n  hash + match    %10.1f us  (%.3f x hash)\n"
        "  match only      %10.1f us\n",
        hash_us, lookup_us, lookup_us / hash_us, match_us);
    if (!policies.empty()) {
      std::printf("policies on the hot path: G2 of %llu blocks, multi-turn references\n",
                  static_cast<unsigned long long>(*capacity));
      for (size_t i = 0; i < policies.size(); ++i) {
        std::printf("  %-16s %8.1f ns/block  (%.2f x hash + match's %.1f ns/block), hit %.4f\n",
                    PolicyKindName(policies[i]), churn[i].ns_per_block,
                    churn[i].ns_per_block / lookup_ns_per_block, lookup_ns_per_block,
                    churn[i].hit_ratio);
      }
    }
  }
  return 0;
}

}  // namespace kvtier::cli

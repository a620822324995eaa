// kvtier bench index: hashing a long prompt's blocks, and hashing + matching them in an index
// that holds them all (the scheduler-side Lookup path, without the manager around it).
#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench/bench_timer.h"
#include "cli/commands.h"
#include "cli/json_writer.h"
#include "index/block_index.h"
#include "kvtier/block_key.h"

namespace kvtier::cli {

int RunBenchIndex(const CliArgs& args) {
  if (args.Has("help")) {
    std::printf(
        "usage: kvtier bench index [--tokens N] [--tokens-per-block B] [--hash sha256|xxh3-128]\n"
        "                          [--reps R] [--json]\n"
        "  hash_only_us: keys of the prompt's full blocks; lookup_us: keys + Match in an index\n"
        "  holding all of them. Best of R (20). Defaults: 131072 tokens, 16 per block, sha256.\n");
    return 0;
  }
  if (Status s = args.CheckKnown({"json", "help", "tokens", "tokens-per-block", "hash", "reps"});
      !s.ok()) {
    return UsageError(s);
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
  if (args.Has("json")) {
    JsonObject o;
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
  }
  return 0;
}

}  // namespace kvtier::cli

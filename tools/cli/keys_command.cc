// kvtier keys: prints the block keys of a token sequence, one hex key per full block. For
// operators checking that two processes or machines agree on keys, and for the tests.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/layout_flags.h"
#include "kvtier/block_key.h"

namespace kvtier::cli {

int RunKeys(const CliArgs& args) {
  if (args.Has("help")) {
    std::printf(
        "usage: kvtier keys --model ID --tokens T1,T2,... [--salt S] [--adapter A]\n"
        "                   [--hash sha256|xxh3-128] [layout flags]\n"
        "  Prints the root key, then one key per full block (partial tail blocks have none).\n%s",
        LayoutFlagsHelp());
    return 0;
  }
  std::vector<std::string> known = {"help", "json", "model", "tokens", "salt", "adapter", "hash"};
  known.insert(known.end(), LayoutFlagNames().begin(), LayoutFlagNames().end());
  if (Status s = args.CheckKnown(known); !s.ok()) return UsageError(s);
  if (!args.Has("model")) return UsageError(Status::InvalidArgument("--model ID is required"));
  auto layout = LayoutFromFlags(args);
  if (!layout.ok()) return UsageError(layout.status());
  auto algo = ParseHashAlgorithm(args.GetString("hash", "sha256"));
  if (!algo.ok()) return UsageError(algo.status());

  std::vector<TokenId> tokens;
  const std::string list = args.GetString("tokens", "");
  size_t pos = 0;
  while (pos < list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    const std::string word = list.substr(pos, comma - pos);
    char* end = nullptr;
    const unsigned long long v = std::strtoull(word.c_str(), &end, 10);
    if (word.empty() || *end != '\0' || v > UINT32_MAX) {
      return UsageError(
          Status::InvalidArgument("--tokens: '" + word + "' is not a token id (0..4294967295)"));
    }
    tokens.push_back(static_cast<TokenId>(v));
    pos = comma + 1;
  }

  KeyNamespace ns{args.GetString("model", ""), layout->Fingerprint(), args.GetString("salt", ""),
                  args.GetString("adapter", "")};
  auto hasher = BlockHasher::Create(ns, layout->tokens_per_block, *algo);
  if (!hasher.ok()) return UsageError(hasher.status());
  std::printf("root %s\n", hasher->root().ToHex().c_str());
  const std::vector<BlockKey> keys = hasher->KeysFor(tokens);
  for (size_t i = 0; i < keys.size(); ++i) std::printf("%zu %s\n", i, keys[i].ToHex().c_str());
  return 0;
}

}  // namespace kvtier::cli

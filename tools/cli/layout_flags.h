// The --layers/--planes/--kv-heads/--head-dim/--tokens-per-block/--dtype/--arrangement flags
// shared by the commands that need a KV layout.
#pragma once

#include <string>
#include <vector>

#include "cli/cli_args.h"
#include "kvtier/layout.h"

namespace kvtier::cli {

// Names of the layout flags, for CliArgs::CheckKnown.
const std::vector<std::string>& LayoutFlagNames();
// The layout the flags describe, starting from KvLayout's defaults (Llama-3-8B: 32 layers, K+V,
// 8 KV heads, head_dim 128, 16 tokens, fp16 = 2 MiB per block). InvalidArgument when a flag is
// malformed or the layout does not validate.
Result<KvLayout> LayoutFromFlags(const CliArgs& args);
// Help text lines for the layout flags.
const char* LayoutFlagsHelp();

}  // namespace kvtier::cli

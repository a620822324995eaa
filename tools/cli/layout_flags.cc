#include "cli/layout_flags.h"

namespace kvtier::cli {

const std::vector<std::string>& LayoutFlagNames() {
  static const std::vector<std::string> kNames = {
      "layers", "planes", "kv-heads", "head-dim", "tokens-per-block", "dtype", "arrangement"};
  return kNames;
}

namespace {

Result<uint32_t> GetU32(const CliArgs& args, const char* flag, uint32_t fallback) {
  KVTIER_ASSIGN_OR_RETURN(uint64_t v, args.GetUint(flag, fallback));
  if (v > UINT32_MAX) {
    return Status::InvalidArgument(std::string("--") + flag + " = " + std::to_string(v) +
                                   " is too large");
  }
  return static_cast<uint32_t>(v);
}

}  // namespace

Result<KvLayout> LayoutFromFlags(const CliArgs& args) {
  KvLayout l;
  KVTIER_ASSIGN_OR_RETURN(l.num_layers, GetU32(args, "layers", l.num_layers));
  KVTIER_ASSIGN_OR_RETURN(l.num_planes, GetU32(args, "planes", l.num_planes));
  KVTIER_ASSIGN_OR_RETURN(l.num_kv_heads, GetU32(args, "kv-heads", l.num_kv_heads));
  KVTIER_ASSIGN_OR_RETURN(l.head_dim, GetU32(args, "head-dim", l.head_dim));
  KVTIER_ASSIGN_OR_RETURN(l.tokens_per_block, GetU32(args, "tokens-per-block", l.tokens_per_block));
  if (args.Has("dtype")) {
    KVTIER_ASSIGN_OR_RETURN(l.dtype, ParseDType(args.GetString("dtype", "")));
  }
  if (args.Has("arrangement")) {
    KVTIER_ASSIGN_OR_RETURN(l.g1_arrangement,
                            ParseG1Arrangement(args.GetString("arrangement", "")));
  }
  KVTIER_RETURN_IF_ERROR(l.Validate());
  return l;
}

const char* LayoutFlagsHelp() {
  return "  layout flags (default: Llama-3-8B, 2 MiB per block):\n"
         "    --layers N (32)  --planes 1|2 (2)  --kv-heads N (8)  --head-dim N (128)\n"
         "    --tokens-per-block N (16)  --dtype fp32|fp16|bf16|fp8 (fp16)\n"
         "    --arrangement layer-separate|block-contiguous (layer-separate)\n";
}

}  // namespace kvtier::cli

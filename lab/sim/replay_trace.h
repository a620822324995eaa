// The request traces `kvtier replay` feeds to the BlockManager: a Mooncake trace (prefix-chained
// ids of 512-token blocks) or a kvtier token trace (explicit token ids), both seen two ways:
//  - as prompts of token ids, which the replay hands to the connector API like an engine would;
//  - as a block-id Trace (lab/sim/policy_sim.h), so the simulator, Belady's oracle and the
//    unbounded cache run on exactly the same reuse.
// docs/replay.md defines both formats.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "sim/policy_sim.h"

namespace kvtier::cli {

class ReplayTrace {
 public:
  enum class Format { kMooncake, kTokens };

  // Mooncake: each hash id becomes tokens_per_block token ids, a pure function of (id, position)
  // (MooncakeToken), so equal ids at equal positions give equal tokens and the chained keys
  // reproduce the trace's prefix sharing. One tail token (a function of the request index)
  // follows the blocks: the connector always computes a prompt's last token, and without the
  // tail a request's last block could never load. REQUIRES: tokens_per_block is in
  // 1..KvLayout::kMaxTokensPerBlock.
  static ReplayTrace FromMooncake(Trace trace, uint32_t tokens_per_block);

  // Parses the kvtier token format: one JSON object per line with "tokens": [ids < 2^32]
  // (required, at least one), optional "request_id" (string) and "timestamp" (number >= 0);
  // other keys are skipped. Blank lines are skipped. InvalidArgument("trace line N, column C:
  // ...") for the first bad line. The block-id view keys each request's full blocks with a
  // fixed namespace and numbers distinct keys in order of first appearance.
  static Result<ReplayTrace> ParseTokens(std::istream& in, uint32_t tokens_per_block);

  // Reads `path` in `format` ("mooncake", "kvtier", or "auto": a first record with "hash_ids"
  // is Mooncake, otherwise kvtier). NotFound / IOError when unreadable; InvalidArgument naming
  // the file and line when malformed.
  static Result<ReplayTrace> Load(const std::string& path, const std::string& format,
                                  uint32_t tokens_per_block);

  Format format() const { return format_; }
  uint32_t tokens_per_block() const { return tpb_; }
  size_t requests() const { return blocks_.requests(); }
  // The block-id view (one entry per full block of each prompt).
  const Trace& blocks() const { return blocks_; }
  // Full blocks of request r's prompt.
  uint64_t prompt_blocks(size_t r) const { return blocks_.end(r) - blocks_.begin(r); }
  // Request r's prompt as the replay sends it to the manager.
  void Prompt(size_t r, std::vector<TokenId>* out) const;
  // Prompt tokens of request r for the cost model: Mooncake's input_length when the trace gives
  // one consistent with its blocks ((n-1) x tpb < len <= n x tpb), else the prompt's length.
  uint64_t cost_tokens(size_t r) const;
  // The id a request is sent under ("request_id", or "r<index>").
  std::string RequestId(size_t r) const;

 private:
  Format format_ = Format::kMooncake;
  uint32_t tpb_ = 512;
  Trace blocks_;
  // kTokens only: request r's tokens are tokens_[token_ends_[r-1] .. token_ends_[r]).
  std::vector<TokenId> tokens_;
  std::vector<uint64_t> token_ends_;
  std::vector<std::string> ids_;  // kTokens: "request_id" or empty
};

// Token `position` of the block with Mooncake hash id `hash_id`: deterministic, spread over a
// 128K vocabulary.
TokenId MooncakeToken(uint64_t hash_id, uint32_t position);

}  // namespace kvtier::cli

// The engine's side of a replay: a host-memory G1 (tools/replay/replay_runner.cc and
// multi_worker.cc use it).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvtier/connector.h"

namespace kvtier::cli {

// The engine's side of the replay: a host-memory G1 of a fixed number of blocks in the
// layer-separate arrangement (one region per (layer, plane), as vLLM keeps its KV cache).
class HostG1 {
 public:
  HostG1(const KvLayout& layout, uint32_t blocks) : layout_(layout) {
    mem_.assign(layout.BlockBytes() * blocks, 0);
    g1_.layout = layout;
    g1_.num_blocks = blocks;
    const uint64_t chunk = layout.ChunkBytes();
    for (uint32_t r = 0; r < layout.num_layers * layout.num_planes; ++r) {
      g1_.regions.push_back({mem_.data() + r * chunk * blocks, chunk});
    }
  }
  const G1Memory& memory() const { return g1_; }

  // Writes the canonical bytes `in` into G1 block `block`.
  void Scatter(uint32_t block, const uint8_t* in) {
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (uint32_t p = 0; p < layout_.num_planes; ++p) {
        std::memcpy(g1_.Chunk(block, l, p), in + layout_.ChunkOffset(l, p), layout_.ChunkBytes());
      }
    }
  }
  // True when G1 block `block` holds exactly the canonical bytes `expect`.
  bool Equals(uint32_t block, const uint8_t* expect) const {
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (uint32_t p = 0; p < layout_.num_planes; ++p) {
        if (std::memcmp(g1_.Chunk(block, l, p), expect + layout_.ChunkOffset(l, p),
                        layout_.ChunkBytes()) != 0) {
          return false;
        }
      }
    }
    return true;
  }
  // Poisons a block the engine freed: a save still reading it would store these bytes.
  void Poison(uint32_t block) {
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (uint32_t p = 0; p < layout_.num_planes; ++p)
        std::memset(g1_.Chunk(block, l, p), 0xee, layout_.ChunkBytes());
    }
  }

 private:
  KvLayout layout_;
  std::vector<uint8_t> mem_;
  G1Memory g1_;
};

}  // namespace kvtier::cli

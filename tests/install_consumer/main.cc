// Drives kvtier through the connector API from outside the project: a host-memory G1, a 64 MiB
// G2 and no G3. Request "a" computes a prompt and saves its full blocks to G2; request "b" with
// the same prompt loads them back into other G1 blocks, and every byte is checked. Prints
// "install_consumer: OK ..." and returns 0, or prints what differed and returns 1.
#include <kvtier/connector.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

int failures = 0;

#define CHECK(cond, ...)                                            \
  do {                                                              \
    if (!(cond)) {                                                  \
      std::fprintf(stderr, "install_consumer: FAILED %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                            \
      std::fprintf(stderr, "\n");                                   \
      ++failures;                                                   \
    }                                                               \
  } while (0)

#define CHECK_OK(expr)                           \
  do {                                           \
    const ::kvtier::Status s_ = (expr);          \
    CHECK(s_.ok(), "%s", s_.ToString().c_str()); \
  } while (0)

uint64_t Mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  return x ^ (x >> 33);
}

// The canonical bytes of the block named `key` (what "computing" it yields).
std::vector<uint8_t> KeyContent(const kvtier::BlockKey& key, uint64_t bytes) {
  std::vector<uint8_t> out(bytes);
  uint64_t x = key.hi ^ Mix(key.lo);
  for (uint64_t off = 0; off < bytes; off += 8) {
    x = Mix(x + off);
    std::memcpy(out.data() + off, &x, std::min<uint64_t>(8, bytes - off));
  }
  return out;
}

// The engine's KV memory: one region per (layer, plane), block b's chunk at base + b * chunk.
class HostG1 {
 public:
  HostG1(const kvtier::KvLayout& layout, uint32_t num_blocks)
      : layout_(layout), mem_(layout.BlockBytes() * num_blocks, 0) {
    g1_.layout = layout;
    g1_.num_blocks = num_blocks;
    const uint64_t chunk = layout.ChunkBytes();
    for (uint32_t r = 0; r < layout.num_layers * layout.num_planes; ++r) {
      g1_.regions.push_back({mem_.data() + r * chunk * num_blocks, chunk});
    }
  }
  const kvtier::G1Memory& memory() const { return g1_; }

  void Write(uint32_t block, const std::vector<uint8_t>& bytes) {
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (uint32_t p = 0; p < layout_.num_planes; ++p) {
        std::memcpy(g1_.Chunk(block, l, p), bytes.data() + layout_.ChunkOffset(l, p),
                    layout_.ChunkBytes());
      }
    }
  }
  std::vector<uint8_t> Read(uint32_t block) const {
    std::vector<uint8_t> out(layout_.BlockBytes());
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (uint32_t p = 0; p < layout_.num_planes; ++p) {
        std::memcpy(out.data() + layout_.ChunkOffset(l, p), g1_.Chunk(block, l, p),
                    layout_.ChunkBytes());
      }
    }
    return out;
  }

 private:
  kvtier::KvLayout layout_;
  std::vector<uint8_t> mem_;
  kvtier::G1Memory g1_;
};

}  // namespace

int main() {
  kvtier::KvLayout layout;
  layout.num_layers = 4;
  layout.num_kv_heads = 2;
  layout.head_dim = 32;
  layout.tokens_per_block = 16;  // 4 x 2 x 16 x 2 x 32 x 2 B = 16 KiB per block
  const uint32_t tpb = layout.tokens_per_block;

  kvtier::ManagerOptions options;
  options.layout = layout;
  options.model_id = "install-consumer-model";
  CHECK_OK(options.config.Set("g2.capacity_bytes", "64MiB"));
  CHECK_OK(options.config.Set("g2.lock_memory", "false"));
  CHECK_OK(options.config.Set("g2.prefault_threads", "1"));
  CHECK_OK(options.config.Set("g3.enabled", "false"));
  CHECK(!options.config.Set("g2.no_such_setting", "1").ok(), "an unknown setting was accepted");
  auto created = kvtier::BlockManager::Create(options);
  if (!created.ok()) {
    std::fprintf(stderr, "install_consumer: FAILED BlockManager::Create: %s\n",
                 created.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<kvtier::BlockManager> manager = std::move(created).value();

  HostG1 g1(layout, 16);
  CHECK_OK(manager->RegisterDeviceMemory(g1.memory()));

  // 5 full blocks and a 3-token tail.
  std::vector<kvtier::TokenId> prompt(5 * tpb + 3);
  for (size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<kvtier::TokenId>(Mix(i) % 50000);
  const uint32_t full_blocks = static_cast<uint32_t>(prompt.size() / tpb);
  auto hasher = kvtier::BlockHasher::Create(
      {options.model_id, layout.Fingerprint(), /*cache_salt=*/"", /*adapter_id=*/""}, tpb);
  CHECK(hasher.ok(), "%s", hasher.status().ToString().c_str());
  if (!hasher.ok()) return 1;
  const std::vector<kvtier::BlockKey> keys = hasher->KeysFor(prompt);
  CHECK(keys.size() == full_blocks, "%zu keys", keys.size());

  // Request "a": nothing cached; compute every block into G1 blocks 0..5, commit, save.
  const std::vector<uint32_t> blocks_a = {0, 1, 2, 3, 4, 5};
  auto la = manager->Lookup({"a", prompt, "", "", {}}, 0);
  CHECK(la.ok() && la->num_tokens == 0, "first lookup: %s, %u tokens",
        la.status().ToString().c_str(), la.ok() ? la->num_tokens : 0);
  auto pa = manager->PrepareLoad("a", blocks_a, 0);
  CHECK(pa.ok() && *pa == 0, "first PrepareLoad: %s", pa.status().ToString().c_str());
  CHECK_OK(manager->StartLoad());
  for (uint32_t i = 0; i < full_blocks; ++i) {
    g1.Write(blocks_a[i], KeyContent(keys[i], layout.BlockBytes()));
  }
  CHECK_OK(manager->Commit("a", prompt, blocks_a));
  CHECK_OK(manager->StartSave());
  const bool kept = manager->RequestFinished("a");
  manager->WaitForSaves();
  if (kept) {
    const kvtier::FinishedRequests finished = manager->Finished();
    CHECK(finished.saves_done.size() == 1 && finished.saves_done[0] == "a",
          "Finished() lists %zu saved requests", finished.saves_done.size());
  }
  // The engine frees a's G1 blocks: poison them, so nothing can be served from them.
  for (uint32_t b : blocks_a) g1.Write(b, std::vector<uint8_t>(layout.BlockBytes(), 0xee));
  kvtier::ManagerStats stats = manager->Stats();
  CHECK(stats.saved_blocks == full_blocks, "saved %llu blocks",
        static_cast<unsigned long long>(stats.saved_blocks));

  // Request "b", same prompt: its full blocks load from G2 into G1 blocks 8..13.
  const std::vector<uint32_t> blocks_b = {8, 9, 10, 11, 12, 13};
  auto lb = manager->Lookup({"b", prompt, "", "", {}}, 0);
  CHECK(lb.ok() && lb->num_tokens == full_blocks * tpb, "second lookup: %s, %u tokens",
        lb.status().ToString().c_str(), lb.ok() ? lb->num_tokens : 0);
  auto pb = manager->PrepareLoad("b", blocks_b, lb.ok() ? lb->num_tokens : 0);
  CHECK(pb.ok() && *pb == full_blocks * tpb, "second PrepareLoad: %s, %u tokens",
        pb.status().ToString().c_str(), pb.ok() ? *pb : 0);
  CHECK_OK(manager->StartLoad());
  for (uint32_t l = 0; l < layout.num_layers; ++l) CHECK_OK(manager->WaitLayer(l));
  const uint32_t loaded = manager->LoadedTokens("b");
  CHECK(loaded == full_blocks * tpb, "loaded %u tokens", loaded);
  uint64_t bytes_checked = 0;
  for (uint32_t i = 0; i < loaded / tpb; ++i) {
    const std::vector<uint8_t> got = g1.Read(blocks_b[i]);
    CHECK(got == KeyContent(keys[i], layout.BlockBytes()), "block %u (key %s) differs", i,
          keys[i].ToHex().c_str());
    bytes_checked += got.size();
  }
  CHECK_OK(manager->Commit("b", prompt, blocks_b));
  CHECK_OK(manager->StartSave());
  manager->RequestFinished("b");
  manager->WaitForSaves();
  stats = manager->Stats();
  CHECK(stats.hit_blocks[kvtier::kTierG2] == full_blocks, "%llu G2 hits",
        static_cast<unsigned long long>(stats.hit_blocks[kvtier::kTierG2]));
  CHECK(stats.saved_blocks == full_blocks, "loaded blocks were saved again (%llu saved)",
        static_cast<unsigned long long>(stats.saved_blocks));
  CHECK(stats.pinned_blocks == 0, "%llu pins left",
        static_cast<unsigned long long>(stats.pinned_blocks));

  if (failures != 0) {
    std::fprintf(stderr, "install_consumer: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf(
      "install_consumer: OK: %u blocks of %s saved G1 -> G2 and loaded back G2 -> G1 into "
      "other blocks, %llu bytes byte-exact\n",
      full_blocks, layout.ToString().c_str(), static_cast<unsigned long long>(bytes_checked));
  return 0;
}

// The G2 namespace share (g2.namespace_share): one tenant's burst cannot evict what another
// tenant holds within its share of G2. Embedded manager, host G1, G2 only.
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/connector.h"

namespace kvtier {
namespace {

constexpr uint32_t kTpb = 16;

KvLayout SmallLayout() {
  return KvLayout{.num_layers = 1,
                  .num_planes = 1,
                  .num_kv_heads = 1,
                  .head_dim = 64,
                  .tokens_per_block = kTpb,
                  .dtype = DType::kFp16,
                  .g1_arrangement = G1Arrangement::kBlockContiguous};
}

class Tenant {
 public:
  Tenant(BlockManager* m, std::string salt) : m_(m), salt_(std::move(salt)) {}
  // Saves `blocks` blocks of prompt `seed` (G1 blocks 0..blocks), waiting for the saves.
  void Save(uint32_t seed, uint32_t blocks) {
    const std::vector<TokenId> prompt = Prompt(seed, blocks);
    RequestSpec spec;
    spec.request_id = salt_ + "-" + std::to_string(seed) + "-" + std::to_string(n_++);
    spec.prompt = prompt;
    spec.cache_salt = salt_;
    ASSERT_TRUE(m_->Lookup(spec, 0).ok());
    std::vector<uint32_t> ids(blocks + 1);
    for (uint32_t i = 0; i <= blocks; ++i) ids[i] = i;
    ASSERT_TRUE(m_->PrepareLoad(spec.request_id, ids, 0).ok());
    ASSERT_TRUE(m_->Commit(spec.request_id, prompt, ids).ok());
    ASSERT_TRUE(m_->StartSave().ok());
    m_->WaitForSaves();
    (void)m_->RequestFinished(spec.request_id);
    (void)m_->Finished();
  }
  // Blocks of prompt `seed` that a Lookup finds.
  uint32_t Found(uint32_t seed, uint32_t blocks) {
    const std::vector<TokenId> prompt = Prompt(seed, blocks);
    RequestSpec spec;
    spec.request_id = salt_ + "-q" + std::to_string(n_++);
    spec.prompt = prompt;
    spec.cache_salt = salt_;
    auto r = m_->Lookup(spec, 0);
    EXPECT_TRUE(r.ok());
    (void)m_->RequestFinished(spec.request_id);
    return r.ok() ? r->num_tokens / kTpb : 0;
  }

 private:
  static std::vector<TokenId> Prompt(uint32_t seed, uint32_t blocks) {
    std::vector<TokenId> p(blocks * kTpb + 1);
    for (size_t i = 0; i < p.size(); ++i) p[i] = seed * 7919u + static_cast<TokenId>(i) + 1;
    return p;
  }
  BlockManager* m_;
  std::string salt_;
  uint32_t n_ = 0;
};

// Returns how many of tenant A's 6 blocks survive tenant B's burst of 20 prompts of 8 blocks
// through a G2 of 32 slots, with g2.namespace_share = `share`.
uint32_t SurvivorsAfterBurst(const std::string& share) {
  const KvLayout layout = SmallLayout();
  ManagerOptions o;
  o.layout = layout;
  o.model_id = "ns-share-test";
  EXPECT_TRUE(o.config.Set("g2.capacity_bytes", std::to_string(32 * 8192)).ok());
  EXPECT_TRUE(o.config.Set("g3.enabled", "false").ok());
  EXPECT_TRUE(o.config.Set("g2.lock_memory", "false").ok());
  EXPECT_TRUE(o.config.Set("g2.policy", "lru").ok());
  EXPECT_TRUE(o.config.Set("g2.namespace_share", share).ok());
  auto m = BlockManager::Create(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return 0;
  std::vector<uint8_t> g1_bytes(64 * layout.BlockBytes(), 3);
  G1Memory g1;
  g1.layout = layout;
  g1.num_blocks = 64;
  g1.regions = {G1Region{g1_bytes.data(), layout.BlockBytes()}};
  EXPECT_TRUE((*m)->RegisterDeviceMemory(g1).ok());
  EXPECT_GE((*m)->Stats().g2_slots, 32u);
  Tenant a(m->get(), "tenant-a"), b(m->get(), "tenant-b");
  a.Save(1, 6);
  EXPECT_EQ(a.Found(1, 6), 6u);
  for (uint32_t p = 0; p < 20; ++p) b.Save(100 + p, 8);
  // B still gets G2: its last prompt is there.
  EXPECT_EQ(b.Found(119, 8), 8u);
  return a.Found(1, 6);
}

TEST(NamespaceShare, BurstOfOneTenantLeavesTheOthersShare) {
  EXPECT_EQ(SurvivorsAfterBurst("0.5"), 6u) << "tenant B's burst evicted tenant A's share";
}

TEST(NamespaceShare, WithoutTheShareTheBurstEvictsEverything) {
  // The control: LRU alone evicts A's older blocks for B's newer ones.
  EXPECT_EQ(SurvivorsAfterBurst("0"), 0u);
}

}  // namespace
}  // namespace kvtier

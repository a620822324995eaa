// Identity in kvtier serve (issue 40): two engines attached to one daemon that differ in one
// field of their identity alone share nothing, through G2, through G3 after a restart of the
// daemon, and through a filesystem G4 from another daemon; engines that should share (DP
// replicas of one model, a restart of one engine) do. Model ids are as long as the vLLM
// connector makes them (a 100-character model path, then |w<weights>|<device>|tpRofN|ppPofQ),
// so a key that keeps only a prefix of the id is caught. Real `kvtier serve` processes.
#include <functional>
#include <optional>

#include "service_test_util.h"

namespace kvtier {
namespace {

using namespace service_test;  // NOLINT: the helpers of every service test

constexpr uint32_t kPromptTokens = 128;  // whole blocks at every block size varied here

// What makes an engine's KV its own: the engine's model id and layout, and per request the
// salt, the adapter and the blocks' extra keys.
struct Identity {
  std::string model_path = "/srv/models/organisation-name/Meta-Llama-3.1-8B-Instruct-" +
                           std::string(40, 'x') + "/snapshots/main";
  std::string weights = "0123456789abcdef";
  std::string device = "cpu";
  uint32_t tp_rank = 0, tp_size = 2, pp_rank = 0, pp_size = 1;
  KvLayout layout = TestLayout();
  std::string salt, adapter;
  std::vector<std::string> extra;

  // As python/kvtier/vllm/connector.py builds it.
  std::string ModelId() const {
    return model_path + "|w" + weights + "|" + device + "|tp" + std::to_string(tp_rank) + "of" +
           std::to_string(tp_size) + "|pp" + std::to_string(pp_rank) + "of" +
           std::to_string(pp_size);
  }
};

struct Variant {
  const char* name;
  std::function<void(Identity*)> change;
};

// Each changes one field; an engine with it must share nothing with the base identity.
std::vector<Variant> Apart() {
  return {
      {"model", [](Identity* i) { i->model_path += "-2"; }},
      {"weights", [](Identity* i) { i->weights = "fedcba9876543210"; }},
      {"device", [](Identity* i) { i->device = "cuda"; }},
      {"tp_rank", [](Identity* i) { i->tp_rank = 1; }},
      {"pp_rank", [](Identity* i) { i->pp_rank = 1, i->pp_size = 2; }},
      {"dtype", [](Identity* i) { i->layout.dtype = DType::kBf16; }},  // same bytes per block
      {"block_size", [](Identity* i) { i->layout.tokens_per_block = 32; }},
      {"kv_heads", [](Identity* i) { i->layout.num_kv_heads = 4; }},
      {"head_dim", [](Identity* i) { i->layout.head_dim = 32; }},
      {"layers", [](Identity* i) { i->layout.num_layers = 8; }},
      {"planes", [](Identity* i) { i->layout.num_planes = 1; }},
      {"cache_salt", [](Identity* i) { i->salt = "tenant-b"; }},
      {"adapter", [](Identity* i) { i->adapter = "lora-7"; }},
      {"extra_keys", [](Identity* i) { i->extra = {"image-hash-1"}; }},
  };
}

struct Attached {
  Identity id;
  std::vector<uint8_t> g1_bytes;
  G1Memory g1;
  std::unique_ptr<BlockManager> manager;
};

Result<Attached> Attach(const std::string& socket, const std::string& instance,
                        const Identity& id) {
  Attached e;
  e.id = id;
  const uint32_t blocks = 32;
  e.g1 = ContiguousG1(id.layout, blocks, e.g1_bytes);
  ManagerOptions o;
  o.layout = id.layout;
  o.model_id = id.ModelId();
  EXPECT_TRUE(o.config.Set("service.socket", socket).ok());
  EXPECT_TRUE(o.config.Set("service.instance", instance).ok());
  EXPECT_TRUE(o.config.Set("service.reattach_ms", "100").ok());
  EXPECT_TRUE(o.config.Set("service.call_timeout_ms", "3000").ok());
  KVTIER_ASSIGN_OR_RETURN(e.manager, BlockManager::Create(o));
  if (!e.manager->attached()) return Status::Unavailable("not attached to " + socket);
  KVTIER_RETURN_IF_ERROR(e.manager->RegisterDeviceMemory(e.g1));
  return e;
}

RequestSpec Spec(const Attached& e, const std::string& rid, const std::vector<TokenId>& prompt) {
  RequestSpec spec;
  spec.request_id = rid;
  spec.prompt = prompt;
  spec.cache_salt = e.id.salt;
  spec.adapter_id = e.id.adapter;
  spec.block_extra = e.id.extra;
  return spec;
}

// Computes and saves prompt `seed` (kPromptTokens + 1 tokens) and waits for its saves.
void Save(Attached& e, const std::string& rid, uint32_t seed) {
  const KvLayout& l = e.id.layout;
  const uint32_t blocks = kPromptTokens / l.tokens_per_block;
  const std::vector<TokenId> prompt = Prompt(seed, kPromptTokens + 1);
  ASSERT_TRUE(e.manager->Lookup(Spec(e, rid, prompt), 0).ok());
  std::vector<uint32_t> ids;
  for (uint32_t b = 0; b <= blocks; ++b) ids.push_back(b);
  ASSERT_TRUE(e.manager->PrepareLoad(rid, ids, 0).ok());
  for (uint32_t b = 0; b < blocks; ++b) {
    FillBlock(e.g1_bytes.data() + uint64_t{b} * l.BlockBytes(), l.BlockBytes(), seed, b);
  }
  ASSERT_TRUE(e.manager->Commit(rid, prompt, ids).ok());
  ASSERT_TRUE(e.manager->StartSave().ok());
  if (e.manager->RequestFinished(rid)) {
    bool done = false;
    for (const auto t0 = Clock::now(); !done && Clock::now() - t0 < std::chrono::seconds(10);) {
      for (const std::string& s : e.manager->Finished().saves_done) done = done || s == rid;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(done) << "the saves of " << rid << " did not end within 10 s";
  }
  e.manager->WaitForSaves();
}

// Looks prompt `seed` up and loads what is found; returns the tokens loaded, and whether every
// loaded block holds the bytes the saver computed (`bytes_ok`).
uint32_t Load(Attached& e, const std::string& rid, uint32_t seed, bool* bytes_ok,
              LookupResult* seen = nullptr) {
  const KvLayout& l = e.id.layout;
  const uint32_t blocks = kPromptTokens / l.tokens_per_block;
  const std::vector<TokenId> prompt = Prompt(seed, kPromptTokens + 1);
  *bytes_ok = true;
  auto found = e.manager->Lookup(Spec(e, rid, prompt), 0);
  EXPECT_TRUE(found.ok()) << found.status().ToString();
  if (!found.ok()) return 0;
  if (seen != nullptr) *seen = *found;
  std::vector<uint32_t> ids;
  for (uint32_t b = 0; b <= blocks; ++b) ids.push_back(b);
  std::fill(e.g1_bytes.begin(), e.g1_bytes.end(), 0);
  EXPECT_TRUE(e.manager->PrepareLoad(rid, ids, found->num_tokens).ok());
  EXPECT_TRUE(e.manager->StartLoad().ok());
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) (void)e.manager->WaitLayer(layer);
  const uint32_t loaded = e.manager->LoadedTokens(rid);
  for (uint32_t b = 0; b < loaded / l.tokens_per_block; ++b) {
    *bytes_ok = *bytes_ok &&
                BlockIs(e.g1_bytes.data() + uint64_t{b} * l.BlockBytes(), l.BlockBytes(), seed, b);
  }
  (void)e.manager->RequestFinished(rid);
  (void)e.manager->Finished();
  return loaded;
}

std::vector<std::pair<std::string, std::string>> DaemonEnv(const std::string& g4_dir) {
  return {{"KVTIER_SERVICE_MAX_POOLS", "4"},
          {"KVTIER_G2_CAPACITY_BYTES", "16MiB"},
          {"KVTIER_G4_BACKEND", "fs"},
          {"KVTIER_G4_DIR", g4_dir},
          {"KVTIER_G4_WRITE_THROUGH", "true"}};
}

class ServiceIdentityApart : public ::testing::TestWithParam<Variant> {};

// The base engine saves a prompt; an engine differing in the one field finds nothing of it:
// in G2 (one daemon), in G3 (the daemon restarted on its G3), in G4 (another host's daemon,
// with its own G3, over the same G4). The base engine's own lookups hit each time, so the
// test sees the blocks are there.
TEST_P(ServiceIdentityApart, SharesNothingInAnyTier) {
  const Variant& v = GetParam();
  const std::string dir = TempDir(std::string("identity-") + v.name);
  const std::string socket = dir + "/sock/kvtier.sock";
  Identity base;
  Identity other = base;
  v.change(&other);
  bool bytes_ok = false;
  LookupResult seen;
  {
    Daemon daemon(socket);
    ASSERT_NO_FATAL_FAILURE(daemon.Start(1000, dir + "/g3", "", DaemonEnv(dir + "/g4")));
    Result<Attached> a = Attach(socket, "engine-a", base);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    Result<Attached> b = Attach(socket, "engine-b", other);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_NO_FATAL_FAILURE(Save(*a, "a-save", 7));
    EXPECT_EQ(Load(*b, "b-g2", 7, &bytes_ok, &seen), 0u)
        << v.name << ": an engine differing in it alone loaded the other's KV from G2 (G2 "
        << seen.blocks_by_tier[kTierG2] << " blocks)";
    EXPECT_EQ(Load(*a, "a-g2", 7, &bytes_ok), kPromptTokens) << "the saver's own G2 lookup";
    EXPECT_TRUE(bytes_ok);
    a = Status::Unavailable("detached");
    b = Status::Unavailable("detached");
    EXPECT_EQ(daemon.Kill(SIGTERM), 0);  // G2 flushed to G3
  }
  {
    Daemon daemon(socket);
    ASSERT_NO_FATAL_FAILURE(daemon.Start(1000, dir + "/g3", "", DaemonEnv(dir + "/g4")));
    Result<Attached> b = Attach(socket, "engine-b", other);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(Load(*b, "b-g3", 7, &bytes_ok, &seen), 0u)
        << v.name << ": loaded the other's KV after a restart (G3 " << seen.blocks_by_tier[kTierG3]
        << ", G4 " << seen.blocks_by_tier[kTierG4] << " blocks)";
    Result<Attached> a = Attach(socket, "engine-a", base);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(Load(*a, "a-g3", 7, &bytes_ok, &seen), kPromptTokens)
        << "the saver's own lookup after a restart";
    EXPECT_EQ(seen.blocks_by_tier[kTierG3], kPromptTokens / base.layout.tokens_per_block);
    EXPECT_TRUE(bytes_ok);
  }
  {
    // Another host: its own G3 (empty), the same G4.
    Daemon daemon(socket);
    ASSERT_NO_FATAL_FAILURE(daemon.Start(1000, dir + "/g3-other", "", DaemonEnv(dir + "/g4")));
    Result<Attached> b = Attach(socket, "engine-b", other);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(Load(*b, "b-g4", 7, &bytes_ok, &seen), 0u)
        << v.name << ": loaded the other's KV from G4 (" << seen.blocks_by_tier[kTierG4]
        << " blocks)";
    Result<Attached> a = Attach(socket, "engine-a", base);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(Load(*a, "a-g4", 7, &bytes_ok, &seen), kPromptTokens) << "the saver's own G4 lookup";
    EXPECT_EQ(seen.blocks_by_tier[kTierG4], kPromptTokens / base.layout.tokens_per_block);
    EXPECT_TRUE(bytes_ok);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryField, ServiceIdentityApart, ::testing::ValuesIn(Apart()),
                         [](const ::testing::TestParamInfo<Variant>& p) {
                           return std::string(p.param.name);
                         });

// What should share does: a DP replica (same identity, another instance, another process's
// worth of connections) loads the first one's blocks from G2, byte for byte; a restart of the
// engine (same identity, same instance name) loads them again.
TEST(ServiceIdentity, ReplicasAndRestartsShare) {
  const std::string dir = TempDir("identity-share");
  const std::string socket = dir + "/sock/kvtier.sock";
  Daemon daemon(socket);
  ASSERT_NO_FATAL_FAILURE(daemon.Start(1000, dir + "/g3", "", DaemonEnv(dir + "/g4")));
  Identity id;
  Result<Attached> a = Attach(socket, "replica-0", id);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  Result<Attached> b = Attach(socket, "replica-1", id);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_NO_FATAL_FAILURE(Save(*a, "a-save", 9));
  bool bytes_ok = false;
  LookupResult seen;
  EXPECT_EQ(Load(*b, "b-load", 9, &bytes_ok, &seen), kPromptTokens);
  EXPECT_EQ(seen.blocks_by_tier[kTierG2], kPromptTokens / id.layout.tokens_per_block);
  EXPECT_TRUE(bytes_ok);
  a = Status::Unavailable("engine stopped");
  Result<Attached> again = Status::Unavailable("not yet");
  for (const auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(10);) {
    again = Attach(socket, "replica-0", id);
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(Load(*again, "a-again", 9, &bytes_ok), kPromptTokens);
  EXPECT_TRUE(bytes_ok);
}

}  // namespace
}  // namespace kvtier

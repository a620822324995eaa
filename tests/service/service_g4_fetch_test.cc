// G4 loads straight into an attached engine's G1 (docs/service.md, "G4 loads straight into
// G1"): two real `kvtier serve` processes sharing only a real redis-server, as two hosts of a
// P/D deployment do. The producer's engine saves through its daemon (write-through to Redis);
// the consumer's engine fetches the objects itself into its G1's chunks (kFetch), verified
// there. Also: the path through the daemon's G2 (g4.direct_to_g1 = false) as the control, a
// corrupt object, a paused server (the fetch's deadline) and a killed one.
#include <algorithm>

#include "client/g1_fetcher.h"
#include "core/host_port.h"
#include "redis_test_util.h"
#include "service_test_util.h"
#include "tier/block_format.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace {

using namespace service_test;  // NOLINT: the helpers of every service test
using testing::RedisCommand;
using testing::RedisServer;

constexpr size_t kG4ToG2 = 6, kG4ToG1 = 7;  // ManagerStats::bytes_by_path

// TestLayout() in vLLM's arrangement: one region per layer and plane, so a block's payload
// lands in 8 separate chunks of G1.
KvLayout SplitLayout() {
  KvLayout l = TestLayout();
  l.g1_arrangement = G1Arrangement::kLayerSeparate;
  return l;
}

// An attached engine whose G1 is one region per layer and plane.
struct SplitEngine {
  std::vector<std::vector<uint8_t>> regions;
  G1Memory g1;
  std::unique_ptr<BlockManager> manager;

  // Block `b`'s canonical payload, gathered from the regions.
  std::vector<uint8_t> Block(uint32_t b) const {
    std::vector<uint8_t> out;
    const KvLayout& l = g1.layout;
    for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
      for (uint32_t plane = 0; plane < l.num_planes; ++plane) {
        const uint8_t* c = g1.Chunk(b, layer, plane);
        out.insert(out.end(), c, c + l.ChunkBytes());
      }
    }
    return out;
  }
  void SetBlock(uint32_t b, const std::vector<uint8_t>& bytes) {
    const KvLayout& l = g1.layout;
    const uint8_t* p = bytes.data();
    for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
      for (uint32_t plane = 0; plane < l.num_planes; ++plane) {
        std::memcpy(g1.Chunk(b, layer, plane), p, l.ChunkBytes());
        p += l.ChunkBytes();
      }
    }
  }
};

std::unique_ptr<SplitEngine> MakeSplitEngine(const std::string& socket, const std::string& name,
                                             uint32_t blocks = 32) {
  auto e = std::make_unique<SplitEngine>();
  const KvLayout l = SplitLayout();
  e->g1.layout = l;
  e->g1.num_blocks = blocks;
  for (uint32_t r = 0; r < l.num_layers * l.num_planes; ++r) {
    // Odd offsets into each region: G1 chunks are not page- or cache-line-aligned in general.
    e->regions.emplace_back(uint64_t{blocks} * l.ChunkBytes() + 64, 0);
    e->g1.regions.push_back(G1Region{e->regions.back().data() + 16, l.ChunkBytes()});
  }
  ManagerOptions o;
  o.layout = l;
  o.model_id = "g4-fetch-test";
  EXPECT_TRUE(o.config.Set("service.socket", socket).ok());
  EXPECT_TRUE(o.config.Set("service.instance", name).ok());
  EXPECT_TRUE(o.config.Set("service.reattach_ms", "100").ok());
  EXPECT_TRUE(o.config.Set("service.call_timeout_ms", "5000").ok());
  Result<std::unique_ptr<BlockManager>> m = BlockManager::Create(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return nullptr;
  e->manager = std::move(*m);
  Status s = e->manager->RegisterDeviceMemory(e->g1);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return e;
}

std::vector<std::pair<std::string, std::string>> RedisG4Env(const RedisServer& redis,
                                                            bool direct = true) {
  return {{"KVTIER_G4_BACKEND", "redis"},
          {"KVTIER_G4_ENDPOINTS", redis.endpoint()},
          {"KVTIER_G4_WRITE_THROUGH", "true"},
          {"KVTIER_G4_LOAD_DEADLINE_MS", "1500"},
          {"KVTIER_G4_DIRECT_TO_G1", direct ? "true" : "false"}};
}

// The producer computes prompt `seed` (`blocks` full blocks + 1 token) and saves it; returns
// when its saves ended (G2; the G4 writes follow).
void Produce(SplitEngine& e, const std::string& id, uint32_t seed, uint32_t blocks) {
  const KvLayout& l = e.g1.layout;
  std::vector<TokenId> prompt;
  std::vector<uint32_t> ids;
  ASSERT_NO_FATAL_FAILURE(LookUpAndPrepare(*e.manager, l, id, seed, blocks, 0, &prompt, &ids));
  for (uint32_t b = 0; b < blocks; ++b) {
    std::vector<uint8_t> bytes(l.BlockBytes());
    FillBlock(bytes.data(), bytes.size(), seed, b);
    e.SetBlock(b, bytes);
  }
  ASSERT_TRUE(e.manager->Commit(id, prompt, ids).ok());
  ASSERT_TRUE(e.manager->StartSave().ok());
  e.manager->WaitForRequestSaves(id);
  (void)e.manager->RequestFinished(id);
  (void)e.manager->Finished();
}

struct Consumed {
  uint32_t found_g4 = 0;       // blocks the Lookup found in G4
  uint32_t loaded = 0;         // blocks loaded intact (LoadedTokens)
  bool bytes_ok = false;       // every loaded block holds the producer's bytes
  Status wait_status;          // the first WaitLayer failure
  double load_seconds = 0;     // StartLoad until the last WaitLayer returned
  double prepare_seconds = 0;  // PrepareLoad
};

// The consumer looks prompt `seed` up until `want_g4` blocks are in G4 (write-through may still
// be landing; at most 10 s), then loads them into its G1 blocks from `first`.
Consumed Consume(SplitEngine& e, const std::string& id, uint32_t seed, uint32_t blocks,
                 uint32_t want_g4, const std::function<void()>& before_load = nullptr,
                 uint32_t first = 0) {
  const KvLayout& l = e.g1.layout;
  const std::vector<TokenId> prompt = Prompt(seed, blocks * l.tokens_per_block + 1);
  RequestSpec spec;
  spec.prompt = prompt;
  Consumed c;
  LookupResult found;
  const auto t0 = Clock::now();
  for (uint32_t attempt = 0;; ++attempt) {
    spec.request_id = id + "-" + std::to_string(attempt);
    Result<LookupResult> r = e.manager->Lookup(spec, 0);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return c;
    found = *r;
    if (found.blocks_by_tier[kTierG4] >= want_g4 || Clock::now() - t0 > std::chrono::seconds(10))
      break;
    (void)e.manager->RequestFinished(spec.request_id);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  c.found_g4 = found.blocks_by_tier[kTierG4];
  std::vector<uint32_t> ids;
  for (uint32_t b = 0; b <= blocks; ++b) ids.push_back(first + b);
  for (uint32_t b = 0; b < blocks; ++b) {
    e.SetBlock(first + b, std::vector<uint8_t>(l.BlockBytes(), 0));
  }
  const auto prepare = Clock::now();
  EXPECT_TRUE(e.manager->PrepareLoad(spec.request_id, ids, found.num_tokens).ok());
  c.prepare_seconds = std::chrono::duration<double>(Clock::now() - prepare).count();
  if (before_load) before_load();
  const auto start = Clock::now();
  EXPECT_TRUE(e.manager->StartLoad().ok());
  c.wait_status = Status::Ok();
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    Status s = e.manager->WaitLayer(layer);
    if (!s.ok() && c.wait_status.ok()) c.wait_status = s;
  }
  c.load_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  c.loaded = e.manager->LoadedTokens(spec.request_id) / l.tokens_per_block;
  c.bytes_ok = true;
  for (uint32_t b = 0; b < c.loaded; ++b) {
    std::vector<uint8_t> want(l.BlockBytes());
    FillBlock(want.data(), want.size(), seed, b);
    if (e.Block(first + b) != want) c.bytes_ok = false;
  }
  (void)e.manager->RequestFinished(spec.request_id);
  (void)e.manager->Finished();
  return c;
}

// Two daemons sharing one Redis, a producer on one and a consumer on each of the others.
class G4FetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVTIER_REQUIRE_REDIS();
    ASSERT_TRUE(redis_.Start()) << redis_.error();
    dir_ = TempDir("g4fetch");
    producer_daemon_ = std::make_unique<Daemon>(dir_ + "/p/kvtier.sock");
    consumer_daemon_ = std::make_unique<Daemon>(dir_ + "/d/kvtier.sock");
    ASSERT_NO_FATAL_FAILURE(producer_daemon_->Start(2000, "", "", RedisG4Env(redis_)));
    ASSERT_NO_FATAL_FAILURE(consumer_daemon_->Start(2000, "", "", RedisG4Env(redis_)));
    producer_ = MakeSplitEngine(dir_ + "/p/kvtier.sock", "prefill");
    consumer_ = MakeSplitEngine(dir_ + "/d/kvtier.sock", "decode");
    ASSERT_NE(producer_, nullptr);
    ASSERT_NE(consumer_, nullptr);
  }
  // A consumer that answers the daemon's G4 offer (kG4Ready) `delay_ms` late.
  std::unique_ptr<SplitEngine> LateAnsweringConsumer(int delay_ms, const std::string& name) {
    EXPECT_EQ(setenv("KVTIER_TEST_ATTACHED_G4_READY_DELAY_MS", std::to_string(delay_ms).c_str(), 1),
              0);
    std::unique_ptr<SplitEngine> e = MakeSplitEngine(dir_ + "/d/kvtier.sock", name);
    unsetenv("KVTIER_TEST_ATTACHED_G4_READY_DELAY_MS");
    return e;
  }
  void TearDown() override {
    consumer_.reset();
    producer_.reset();
    consumer_daemon_.reset();
    producer_daemon_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  RedisServer redis_;
  std::string dir_;
  std::unique_ptr<Daemon> producer_daemon_, consumer_daemon_;
  std::unique_ptr<SplitEngine> producer_, consumer_;
};

TEST_F(G4FetchTest, ConsumerFetchesStraightIntoItsG1ByteExact) {
  ASSERT_NO_FATAL_FAILURE(Produce(*producer_, "p1", 11, 6));
  const ManagerStats before = consumer_->manager->Stats();
  const Consumed c = Consume(*consumer_, "d1", 11, 6, 6);
  EXPECT_EQ(c.found_g4, 6u);
  EXPECT_TRUE(c.wait_status.ok()) << c.wait_status.ToString();
  EXPECT_EQ(c.loaded, 6u);
  EXPECT_TRUE(c.bytes_ok);
  const ManagerStats after = consumer_->manager->Stats();
  const uint64_t bytes = 6 * SplitLayout().BlockBytes();
  // Straight into G1: nothing went through the consumer's daemon's G2.
  EXPECT_EQ(after.bytes_by_path[kG4ToG1] - before.bytes_by_path[kG4ToG1], bytes);
  EXPECT_EQ(after.bytes_by_path[kG4ToG2], before.bytes_by_path[kG4ToG2]);
  EXPECT_EQ(after.hit_blocks[kTierG4] - before.hit_blocks[kTierG4], 6u);
  EXPECT_EQ(after.g4_load_failures, before.g4_load_failures);

  // A second prompt into other G1 blocks, with the first one's blocks left in place.
  ASSERT_NO_FATAL_FAILURE(Produce(*producer_, "p2", 12, 5));
  const Consumed c2 = Consume(*consumer_, "d2", 12, 5, 5, nullptr, /*first=*/10);
  EXPECT_EQ(c2.loaded, 5u);
  EXPECT_TRUE(c2.bytes_ok);
}

// An engine whose first load is planned before the daemon has its answer to the G4 offer
// (kG4Ready; here the answer comes 600 ms late): the daemon waits for it (at most
// RemoteG1Backend::kFetcherAnswerWait), so even that load fetches straight into G1. Without the
// wait it went through the daemon's G2 (once in CI under TSan, with no delay at all).
TEST_F(G4FetchTest, FirstLoadAfterAttachWaitsForTheEnginesAnswer) {
  ASSERT_NO_FATAL_FAILURE(Produce(*producer_, "p1", 61, 6));
  std::unique_ptr<SplitEngine> e = LateAnsweringConsumer(600, "decode-late");
  ASSERT_NE(e, nullptr);
  const ManagerStats before = e->manager->Stats();
  const auto t0 = Clock::now();
  const Consumed c = Consume(*e, "late1", 61, 6, 6);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(c.loaded, 6u);
  EXPECT_TRUE(c.bytes_ok);
  const ManagerStats after = e->manager->Stats();
  EXPECT_EQ(after.bytes_by_path[kG4ToG1] - before.bytes_by_path[kG4ToG1],
            6 * SplitLayout().BlockBytes());
  EXPECT_EQ(after.bytes_by_path[kG4ToG2], before.bytes_by_path[kG4ToG2]);
  EXPECT_LT(took, 5.0);
  e.reset();
}

// An engine that answers later than the bound: the daemon plans its first load without waiting
// longer than the bound, through its G2 (the copy into G1 then waits for the engine's data
// connection, busy until it answers), byte-exact; later loads fetch straight into G1.
TEST_F(G4FetchTest, AnAnswerPastTheBoundSendsTheFirstLoadThroughG2) {
  ASSERT_NO_FATAL_FAILURE(Produce(*producer_, "p1", 71, 6));
  ASSERT_NO_FATAL_FAILURE(Produce(*producer_, "p2", 72, 6));
  std::unique_ptr<SplitEngine> e = LateAnsweringConsumer(3500, "decode-later");
  ASSERT_NE(e, nullptr);
  const ManagerStats before = e->manager->Stats();
  const auto t0 = Clock::now();
  const Consumed c = Consume(*e, "later1", 71, 6, 6);
  // Whether the copy into G1 still made the load's deadline depends on the machine; what
  // arrived is exact.
  EXPECT_TRUE(c.bytes_ok);
  EXPECT_LT(c.prepare_seconds, 3.0) << "PrepareLoad waited for the answer past the bound";
  EXPECT_GT(c.prepare_seconds, 0.5) << "PrepareLoad did not wait for the answer at all";
  const ManagerStats after = e->manager->Stats();
  EXPECT_GE(after.bytes_by_path[kG4ToG2] - before.bytes_by_path[kG4ToG2],
            6 * SplitLayout().BlockBytes());
  // Once the answer has come, the next load fetches straight into G1.
  std::this_thread::sleep_until(t0 + std::chrono::milliseconds(3800));
  const ManagerStats mid = e->manager->Stats();
  const Consumed c2 = Consume(*e, "later2", 72, 6, 6, nullptr, /*first=*/10);
  EXPECT_EQ(c2.loaded, 6u);
  EXPECT_TRUE(c2.bytes_ok);
  EXPECT_EQ(e->manager->Stats().bytes_by_path[kG4ToG1] - mid.bytes_by_path[kG4ToG1],
            6 * SplitLayout().BlockBytes());
  e.reset();
}

TEST_F(G4FetchTest, ThroughTheDaemonsG2WhenDirectIsOff) {
  Daemon via(dir_ + "/v/kvtier.sock");
  ASSERT_NO_FATAL_FAILURE(via.Start(2000, "", "", RedisG4Env(redis_, /*direct=*/false)));
  std::unique_ptr<SplitEngine> e = MakeSplitEngine(dir_ + "/v/kvtier.sock", "decode-via-g2");
  ASSERT_NE(e, nullptr);
  ASSERT_NO_FATAL_FAILURE(Produce(*producer_, "p1", 21, 4));
  const ManagerStats before = e->manager->Stats();
  const Consumed c = Consume(*e, "v1", 21, 4, 4);
  EXPECT_EQ(c.loaded, 4u);
  EXPECT_TRUE(c.bytes_ok);
  const ManagerStats after = e->manager->Stats();
  // The control: the objects landed in the daemon's G2 first.
  EXPECT_GE(after.bytes_by_path[kG4ToG2] - before.bytes_by_path[kG4ToG2],
            4 * SplitLayout().BlockBytes());
  e.reset();
}

TEST_F(G4FetchTest, CorruptObjectIsNeverServedAndIsRemoved) {
  ASSERT_NO_FATAL_FAILURE(Produce(*producer_, "p1", 31, 6));
  // Wait for the write-through, then damage one object's payload at rest.
  std::vector<std::string> keys;
  for (const auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(10);) {
    const testing::RedisReply r = RedisCommand(redis_.port(), {"KEYS", "kvt1:*"});
    ASSERT_TRUE(r.ok) << r.text;
    keys.clear();
    std::stringstream lines(r.text);
    for (std::string k; std::getline(lines, k);) {
      if (!k.empty()) keys.push_back(k);
    }
    if (keys.size() >= 6) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(keys.size(), 6u);
  std::sort(keys.begin(), keys.end());
  const std::string victim = keys[2];
  const testing::RedisReply len = RedisCommand(redis_.port(), {"STRLEN", victim});
  ASSERT_TRUE(len.ok) << len.text;
  const uint64_t size = std::stoull(len.text);
  ASSERT_GT(size, SplitLayout().BlockBytes());
  ASSERT_FALSE(
      RedisCommand(redis_.port(), {"SETRANGE", victim, std::to_string(size - 100), "garbage"})
          .IsError());

  const ManagerStats before = consumer_->manager->Stats();
  const Consumed c = Consume(*consumer_, "d1", 31, 6, 6);
  EXPECT_EQ(c.found_g4, 6u);
  // The damaged block and everything after it are recomputed; what loaded is exact.
  EXPECT_LT(c.loaded, 6u);
  EXPECT_TRUE(c.bytes_ok);
  const ManagerStats after = consumer_->manager->Stats();
  EXPECT_EQ(after.g4_corrupt_blocks - before.g4_corrupt_blocks, 1u);
  // The consumer's daemon deletes the object, and never offers it again meanwhile.
  bool removed = false;
  for (const auto t0 = Clock::now(); !removed && Clock::now() - t0 < std::chrono::seconds(10);) {
    removed = RedisCommand(redis_.port(), {"EXISTS", victim}).text == "0";
    if (!removed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(removed) << victim << " is still in Redis";
  const Consumed again = Consume(*consumer_, "d2", 31, 6, 0);
  EXPECT_EQ(again.found_g4, c.loaded);
  EXPECT_TRUE(again.bytes_ok);
}

TEST_F(G4FetchTest, PausedServerEndsTheLoadAtItsDeadline) {
  ASSERT_NO_FATAL_FAILURE(Produce(*producer_, "p1", 41, 6));
  // The Lookup finds the blocks; the server then stops answering before the load.
  const Consumed c = Consume(*consumer_, "d1", 41, 6, 6, [&] { redis_.Pause(); });
  redis_.Resume();
  EXPECT_EQ(c.found_g4, 6u);
  EXPECT_EQ(c.loaded, 0u);
  EXPECT_FALSE(c.wait_status.ok());
  // g4.load_deadline_ms is 1500: the engine heard of it then, not at a longer time-out.
  EXPECT_LT(c.load_seconds, 4.0);
  EXPECT_GT(consumer_->manager->Stats().g4_load_failures, 0u);
  // The server is back: the same prompt loads whole.
  const Consumed again = Consume(*consumer_, "d2", 41, 6, 6);
  EXPECT_EQ(again.loaded, 6u);
  EXPECT_TRUE(again.bytes_ok);
}

TEST_F(G4FetchTest, KilledServerIsAMissNotAHang) {
  ASSERT_NO_FATAL_FAILURE(Produce(*producer_, "p1", 51, 6));
  const Consumed c = Consume(*consumer_, "d1", 51, 6, 6, [&] { redis_.Kill(); });
  EXPECT_EQ(c.found_g4, 6u);
  EXPECT_EQ(c.loaded, 0u);
  EXPECT_FALSE(c.wait_status.ok());
  EXPECT_LT(c.load_seconds, 4.0);
}

// The engine's side alone: what it refuses of a daemon's fetch before touching G1.
TEST(G1FetcherTest, RefusesBlocksOutsideItsG1AndDeviceMemory) {
  KVTIER_REQUIRE_REDIS();
  RedisServer redis;
  ASSERT_TRUE(redis.Start()) << redis.error();
  std::unique_ptr<SplitEngine> e = std::make_unique<SplitEngine>();
  const KvLayout l = SplitLayout();
  e->g1.layout = l;
  e->g1.num_blocks = 4;
  for (uint32_t r = 0; r < l.num_layers * l.num_planes; ++r) {
    e->regions.emplace_back(4 * l.ChunkBytes(), 0);
    e->g1.regions.push_back(G1Region{e->regions.back().data(), l.ChunkBytes()});
  }
  proto::G4Config config;
  config.endpoints = redis.endpoint();
  config.connections = 1;
  client::CopyGate gate;
  std::vector<proto::FetchDone> reports;
  Result<std::unique_ptr<client::G1Fetcher>> f = client::G1Fetcher::Create(
      config, e->g1, &gate, [&](const proto::FetchDone& d) { reports.push_back(d); });
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  proto::FetchCall call;
  call.batch = 9;
  call.deadline_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         (Clock::now() + std::chrono::seconds(5)).time_since_epoch())
                         .count();
  G4Fetch outside;
  outside.g1_block = 4;  // the G1 holds blocks 0..3
  outside.name = "kvt1:none";
  outside.tokens.assign(l.tokens_per_block, 1);
  G4Fetch short_tokens = outside;
  short_tokens.g1_block = 1;
  short_tokens.tokens.resize(3);
  G4Fetch missing = outside;
  missing.g1_block = 2;
  call.items = {outside, short_tokens, missing};
  const std::vector<std::vector<uint8_t>> before = e->regions;
  const proto::FetchDone done = (*f)->Run(call);
  EXPECT_EQ(done.batch, 9u);
  ASSERT_EQ(done.statuses.size(), 3u);
  EXPECT_TRUE(done.statuses[0].Is(StatusCode::kInvalidArgument)) << done.statuses[0].ToString();
  EXPECT_NE(done.statuses[0].message().find("G1 block 4"), std::string::npos);
  EXPECT_TRUE(done.statuses[1].Is(StatusCode::kInvalidArgument)) << done.statuses[1].ToString();
  EXPECT_TRUE(done.statuses[2].Is(StatusCode::kNotFound)) << done.statuses[2].ToString();
  EXPECT_EQ(e->regions, before);  // nothing written
  // Past its deadline, nothing is asked.
  call.deadline_ns = 1;
  call.items = {missing};
  const proto::FetchDone late = (*f)->Run(call);
  ASSERT_EQ(late.statuses.size(), 1u);
  EXPECT_TRUE(late.statuses[0].Is(StatusCode::kTimedOut)) << late.statuses[0].ToString();
  f->reset();

  // A device G1: a socket cannot receive into it.
  G1Memory device = e->g1;
  device.on_device = true;
  Result<std::unique_ptr<client::G1Fetcher>> refused =
      client::G1Fetcher::Create(config, device, &gate, [](const proto::FetchDone&) {});
  EXPECT_TRUE(refused.status().Is(StatusCode::kInvalidArgument)) << refused.status().ToString();
}

// An object whose header names the key the fetch asks for, but whose stored tokens are not the
// fetch's (what a key collision would look like: another prompt's block under this key): the
// engine verifies the tokens it was sent against the header, so the object is refused
// (Corruption), though its key, namespace, layout and payload checksum are all right. The same
// object fetched with its own tokens lands byte-exact (the control).
TEST(G1FetcherTest, RefusesAnObjectWhoseStoredTokensAreNotTheFetchs) {
  KVTIER_REQUIRE_REDIS();
  RedisServer redis;
  ASSERT_TRUE(redis.Start()) << redis.error();
  const KvLayout l = SplitLayout();
  std::unique_ptr<SplitEngine> e = std::make_unique<SplitEngine>();
  e->g1.layout = l;
  e->g1.num_blocks = 2;
  for (uint32_t r = 0; r < l.num_layers * l.num_planes; ++r) {
    e->regions.emplace_back(2 * l.ChunkBytes(), 0);
    e->g1.regions.push_back(G1Region{e->regions.back().data(), l.ChunkBytes()});
  }

  // The object, written as the daemon's G4 writes do: header, then the payload.
  const std::vector<TokenId> stored = Prompt(61, l.tokens_per_block);
  std::vector<TokenId> asked = stored;
  asked[3] += 1;  // the fetch's tokens: one differs
  BlockHeaderFields f;
  f.layout_fingerprint = l.Fingerprint();
  f.namespace_id = 0x5eed;
  f.key = BlockKey{0x1234, 0x5678};
  f.parent = BlockKey{0x9abc, 0xdef0};
  const uint64_t header_bytes = BlockHeaderBytes(l);
  std::vector<uint8_t> object(header_bytes + l.BlockBytes());
  FillBlock(object.data() + header_bytes, l.BlockBytes(), 61, 0);
  ASSERT_TRUE(EncodeBlockHeader(f, stored, l.BlockBytes(),
                                PayloadChecksum(object.data() + header_bytes, l.BlockBytes()),
                                object.data())
                  .ok());
  RedisStoreOptions ro;
  ro.endpoints = SplitEndpoints(redis.endpoint());
  Result<std::unique_ptr<RemoteStore>> store = OpenRedisStore(ro);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const RemotePut put{"kvt1:forged", object};
  Status put_status;
  (*store)->Put({&put, 1}, Clock::now() + std::chrono::seconds(5), {&put_status, 1});
  ASSERT_TRUE(put_status.ok()) << put_status.ToString();

  proto::G4Config config;
  config.endpoints = redis.endpoint();
  config.connections = 1;
  client::CopyGate gate;
  Result<std::unique_ptr<client::G1Fetcher>> fetcher =
      client::G1Fetcher::Create(config, e->g1, &gate, [](const proto::FetchDone&) {});
  ASSERT_TRUE(fetcher.ok()) << fetcher.status().ToString();
  proto::FetchCall call;
  call.batch = 1;
  call.deadline_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         (Clock::now() + std::chrono::seconds(5)).time_since_epoch())
                         .count();
  G4Fetch item;
  item.g1_block = 0;
  item.name = put.name;
  item.namespace_id = f.namespace_id;
  item.key = f.key;
  item.tokens = asked;
  call.items = {item};
  proto::FetchDone done = (*fetcher)->Run(call);
  ASSERT_EQ(done.statuses.size(), 1u);
  EXPECT_TRUE(done.statuses[0].Is(StatusCode::kCorruption))
      << "an object whose stored tokens differ from the fetch's was served: "
      << done.statuses[0].ToString();
  EXPECT_NE(done.statuses[0].message().find("wrong-tokens"), std::string::npos)
      << done.statuses[0].ToString();

  item.g1_block = 1;
  item.tokens = stored;
  call.items = {item};
  done = (*fetcher)->Run(call);
  ASSERT_EQ(done.statuses.size(), 1u);
  EXPECT_TRUE(done.statuses[0].ok()) << done.statuses[0].ToString();
  EXPECT_TRUE(BlockIs(e->Block(1).data(), l.BlockBytes(), 61, 0));
}

}  // namespace
}  // namespace kvtier

// The Redis backend against a real 3-node Redis Cluster started by the test: routing by hash
// slot, MOVED and ASK followed while a slot migrates, and a node killed.
#include <gtest/gtest.h>

#include <random>

#include "redis_test_util.h"
#include "tier/redis_wire.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;
using testing::RedisCluster;

std::vector<uint8_t> Pattern(uint64_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::string Name(uint64_t i) { return "kvt-cluster:" + std::to_string(i); }

RemoteDeadline In(milliseconds ms) { return RemoteClock::now() + ms; }

RedisStoreOptions ClusterOpts(const std::vector<std::string>& seeds) {
  RedisStoreOptions o;
  o.endpoints = seeds;
  o.cluster = true;
  o.breaker.failure_threshold = 2;
  o.breaker.open_for = milliseconds(200);
  o.breaker.max_open_for = milliseconds(1000);
  return o;
}

class RedisClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVTIER_REQUIRE_REDIS();
    cluster_ = std::make_unique<RedisCluster>(3);
    ASSERT_TRUE(cluster_->Start()) << cluster_->error();
  }

  std::unique_ptr<RemoteStore> Open(const std::vector<std::string>& seeds) {
    auto s = OpenRedisStore(ClusterOpts(seeds));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  // Puts Name(0..n) with 4 KiB values; returns the values.
  std::vector<std::vector<uint8_t>> PutMany(RemoteStore* store, int n) {
    std::vector<std::vector<uint8_t>> values;
    std::vector<RemotePut> puts;
    for (int i = 0; i < n; ++i) values.push_back(Pattern(i, 4096));
    for (int i = 0; i < n; ++i) puts.push_back({Name(i), values[i]});
    std::vector<Status> r(n);
    store->Put(puts, In(milliseconds(5000)), r);
    for (const Status& s : r) EXPECT_TRUE(s.ok()) << s.ToString();
    return values;
  }

  std::unique_ptr<RedisCluster> cluster_;
};

TEST_F(RedisClusterTest, ValuesSpreadOverEveryNodeAndRoundTrip) {
  auto store = Open({cluster_->node(1).endpoint()});  // one seed finds the rest
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Describe(), "redis-cluster://" + cluster_->node(1).endpoint());
  for (const std::string& k :
       std::vector<std::string>{"kvt1:0000000000000001:00ff", "a", "{tag}x", Name(7)}) {
    EXPECT_EQ(static_cast<int>(RedisHashSlot(k)), cluster_->KeySlot(k)) << k;
  }
  constexpr int kN = 300;
  auto values = PutMany(store.get(), kN);
  long long total = 0;
  for (int n = 0; n < 3; ++n) {
    const long long size = cluster_->node(n).DbSize();
    EXPECT_GT(size, 50) << "node " << n << " got too few of " << kN;
    total += size;
  }
  EXPECT_EQ(total, kN);
  std::vector<std::vector<uint8_t>> bufs(kN, std::vector<uint8_t>(4096));
  std::vector<RemoteGet> gets;
  for (int i = 0; i < kN; ++i) gets.push_back({Name(i), bufs[i], 0});
  std::vector<Status> r(kN);
  store->Get(gets, In(milliseconds(5000)), r);
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(r[i].ok()) << r[i].ToString();
    EXPECT_EQ(bufs[i], values[i]) << i;
  }
  EXPECT_EQ(store->Stats().redirects, 0u);  // the map was right: no MOVED
  std::vector<std::string> names;
  for (int i = 0; i < kN; ++i) names.push_back(Name(i));
  ASSERT_TRUE(store->Remove(names, In(milliseconds(5000))).ok());
  for (int n = 0; n < 3; ++n) EXPECT_EQ(cluster_->node(n).DbSize(), 0);
}

// Moves the slot of one key from its node to another, as `redis-cli --cluster reshard` does
// (SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE), checking ASK mid-way and MOVED after.
TEST_F(RedisClusterTest, FollowsAskDuringAndMovedAfterASlotMigration) {
  auto store = Open(cluster_->endpoints());
  ASSERT_NE(store, nullptr);
  const std::string key = Name(42);
  const int slot = RedisHashSlot(key);
  const int from = cluster_->NodeOfSlot(slot);
  ASSERT_GE(from, 0);
  const int to = (from + 1) % 3;
  const std::vector<uint8_t> value = Pattern(42, 10000);
  std::vector<RemotePut> put = {{key, value}};
  std::vector<Status> r(1);
  store->Put(put, In(milliseconds(2000)), r);
  ASSERT_TRUE(r[0].ok()) << r[0].ToString();
  ASSERT_EQ(cluster_->node(from).DbSize(), 1);

  auto& src = cluster_->node(from);
  auto& dst = cluster_->node(to);
  const std::string src_id = src.Command({"CLUSTER", "MYID"}).text;
  const std::string dst_id = dst.Command({"CLUSTER", "MYID"}).text;
  const std::string s = std::to_string(slot);
  ASSERT_EQ(dst.Command({"CLUSTER", "SETSLOT", s, "IMPORTING", src_id}).text, "OK");
  ASSERT_EQ(src.Command({"CLUSTER", "SETSLOT", s, "MIGRATING", dst_id}).text, "OK");
  testing::RedisReply m =
      src.Command({"MIGRATE", "127.0.0.1", std::to_string(dst.port()), key, "0", "5000"});
  ASSERT_EQ(m.text, "OK") << m.text;
  ASSERT_EQ(dst.DbSize(), 1);

  // Mid-migration: the source answers ASK for the key it no longer has.
  std::vector<uint8_t> buf(value.size());
  std::vector<RemoteGet> get = {{key, buf, 0}};
  store->Get(get, In(milliseconds(2000)), r);
  ASSERT_TRUE(r[0].ok()) << r[0].ToString();
  EXPECT_EQ(buf, value);
  EXPECT_EQ(store->Stats().redirects, 1u);

  for (int n = 0; n < 3; ++n) {
    ASSERT_EQ(cluster_->node(n).Command({"CLUSTER", "SETSLOT", s, "NODE", dst_id}).text, "OK");
  }
  // After: the store's map still says `from`, which answers MOVED; the store follows it,
  // learns the new owner and asks it directly from then on.
  std::fill(buf.begin(), buf.end(), 0);
  store->Get(get, In(milliseconds(2000)), r);
  ASSERT_TRUE(r[0].ok()) << r[0].ToString();
  EXPECT_EQ(buf, value);
  EXPECT_EQ(store->Stats().redirects, 2u);
  store->Get(get, In(milliseconds(2000)), r);
  ASSERT_TRUE(r[0].ok()) << r[0].ToString();
  EXPECT_EQ(store->Stats().redirects, 2u);
}

TEST_F(RedisClusterTest, KilledNodeFailsFastTheOthersStillServe) {
  auto store = Open(cluster_->endpoints());
  ASSERT_NE(store, nullptr);
  constexpr int kN = 120;
  auto values = PutMany(store.get(), kN);
  constexpr int kDead = 2;
  cluster_->Kill(kDead);
  std::vector<int> owner(kN);
  for (int i = 0; i < kN; ++i) owner[i] = cluster_->NodeOfSlot(RedisHashSlot(Name(i)));
  // Long enough that the live nodes' 90 gets end well inside it on a loaded machine: the
  // breaker's rejections (below) are the mechanism this test checks; the time is a bound.
  constexpr auto kBudget = milliseconds(2000);
  for (int round = 0; round < 4; ++round) {
    const uint64_t rejections_before = store->Stats().breaker_rejections;
    std::vector<std::vector<uint8_t>> bufs(kN, std::vector<uint8_t>(4096));
    std::vector<RemoteGet> gets;
    for (int i = 0; i < kN; ++i) gets.push_back({Name(i), bufs[i], 0});
    std::vector<Status> r(kN);
    const auto t0 = RemoteClock::now();
    store->Get(gets, In(kBudget), r);
    const auto took = RemoteClock::now() - t0;
    EXPECT_LT(took, kBudget + milliseconds(2000)) << "round " << round << " (slack for load)";
    int served = 0, failed = 0;
    for (int i = 0; i < kN; ++i) {
      ASSERT_GE(owner[i], 0);
      if (owner[i] == kDead) {
        EXPECT_TRUE(r[i].Is(StatusCode::kUnavailable) || r[i].Is(StatusCode::kTimedOut))
            << r[i].ToString();
        ++failed;
      } else {
        ASSERT_TRUE(r[i].ok()) << "round " << round << ": " << r[i].ToString();
        EXPECT_EQ(bufs[i], values[i]);
        ++served;
      }
    }
    EXPECT_GT(served, 0);
    EXPECT_GT(failed, 0);
    if (round >= 2) {
      // By now the dead node's breaker is open: its keys are refused without a call (the
      // mechanism: rejections grow; the round does not wait for its deadline).
      EXPECT_GT(store->Stats().breaker_rejections, rejections_before) << "round " << round;
      EXPECT_LT(took, kBudget) << "round " << round;
    }
  }
  const RemoteStoreStats st = store->Stats();
  EXPECT_GE(st.breaker_opens, 1u);
  EXPECT_GE(st.breaker_rejections, 1u);
}

// A half-done migration on real servers: the owner is MIGRATING the slot and lacks the key, so
// it answers ASK; the target was never told it is IMPORTING, so it answers MOVED back to the
// owner. The store follows a bounded number of redirects and fails the call with "too many
// redirects" by its attempt limit, not by looping until the deadline.
TEST_F(RedisClusterTest, RedirectsThatNeverEndAreCutOffByTheAttemptLimit) {
  auto store = Open(cluster_->endpoints());
  ASSERT_NE(store, nullptr);
  const std::string key = Name(7);
  const int slot = RedisHashSlot(key);
  const int from = cluster_->NodeOfSlot(slot);
  ASSERT_GE(from, 0);
  auto& src = cluster_->node(from);
  auto& dst = cluster_->node((from + 1) % 3);
  const std::string dst_id = dst.Command({"CLUSTER", "MYID"}).text;
  ASSERT_EQ(src.Command({"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", dst_id}).text,
            "OK");
  std::vector<uint8_t> buf(100);
  std::vector<RemoteGet> get = {{key, buf, 0}};
  std::vector<Status> r(1);
  const auto t0 = RemoteClock::now();
  store->Get(get, In(milliseconds(20000)), r);
  const auto took = RemoteClock::now() - t0;
  EXPECT_FALSE(r[0].ok());
  EXPECT_NE(r[0].message().find("too many redirects"), std::string::npos) << r[0].ToString();
  // The attempt limit (6 passes over the pending items) bounds the redirects followed.
  EXPECT_GE(store->Stats().redirects, 2u);
  EXPECT_LE(store->Stats().redirects, 6u) << "the store kept following redirects";
  EXPECT_LT(took, milliseconds(10000)) << "the store kept following redirects toward the deadline";
}

TEST(RedisClusterSeedTest, NoSeedAnsweringIsUnavailableNotAHang) {
  KVTIER_REQUIRE_REDIS();
  testing::RedisServer server;  // only to find a port with nothing listening
  ASSERT_TRUE(server.Start()) << server.error();
  server.Stop();
  auto store = OpenRedisStore(ClusterOpts({server.endpoint()}));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::vector<uint8_t> v(100, 1);
  std::vector<RemotePut> put = {{"k", v}};
  std::vector<Status> r(1);
  const auto t0 = RemoteClock::now();
  (*store)->Put(put, In(milliseconds(300)), r);
  EXPECT_LT(RemoteClock::now() - t0, milliseconds(300 + 2000));  // slack for a loaded machine
  EXPECT_TRUE(r[0].Is(StatusCode::kUnavailable)) << r[0].ToString();
  EXPECT_TRUE((*store)->Stats().breaker_open);
}

// CLUSTER SLOTS refused: the seed is a plain (non-cluster) redis-server, which answers
// "ERR This instance has cluster support disabled". The store still opens (a seed may be fixed
// later), and every call fails at once, saying why the topology is unknown.
TEST(RedisClusterSeedTest, ASeedThatRefusesClusterSlotsIsAFailureNamingWhy) {
  KVTIER_REQUIRE_REDIS();
  testing::RedisServer plain;
  ASSERT_TRUE(plain.Start()) << plain.error();
  auto store = OpenRedisStore(ClusterOpts({plain.endpoint()}));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::vector<uint8_t> v(100, 1);
  std::vector<RemotePut> put = {{"k", v}};
  std::vector<Status> r(1);
  (*store)->Put(put, In(milliseconds(500)), r);
  EXPECT_TRUE(r[0].Is(StatusCode::kUnavailable)) << r[0].ToString();
  EXPECT_NE(r[0].message().find("CLUSTER SLOTS refused: ERR This instance has cluster support "
                                "disabled"),
            std::string::npos)
      << r[0].ToString();
  auto probe = testing::RedisCommand(plain.port(), {"DBSIZE"});
  ASSERT_TRUE(probe.ok) << probe.text;
  EXPECT_EQ(probe.text, "0") << "nothing was written to a node that is not in a cluster";
}

// CLUSTER SLOTS timed out: the seed accepts the connection and answers nothing (paused). The
// refresh gives up by its deadline, and calls fail at once, saying the seed did not answer.
TEST(RedisClusterSeedTest, ASeedThatNeverAnswersClusterSlotsTimesOutByTheDeadline) {
  KVTIER_REQUIRE_REDIS();
  testing::RedisServer seed;
  ASSERT_TRUE(seed.Start()) << seed.error();
  seed.Pause();
  RedisStoreOptions o = ClusterOpts({seed.endpoint()});
  o.connect_timeout = milliseconds(300);  // the deadline of the refresh at open
  const auto t0 = RemoteClock::now();
  auto store = OpenRedisStore(o);
  const auto took = RemoteClock::now() - t0;
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_LT(took, milliseconds(300 + 2000)) << "the open waited past its refresh deadline";
  const std::vector<uint8_t> v(100, 1);
  std::vector<RemotePut> put = {{"k", v}};
  std::vector<Status> r(1);
  (*store)->Put(put, In(milliseconds(400)), r);
  seed.Resume();
  EXPECT_FALSE(r[0].ok());
  EXPECT_NE(r[0].message().find("CLUSTER SLOTS got no answer by the deadline"), std::string::npos)
      << r[0].ToString();
}

}  // namespace
}  // namespace kvtier

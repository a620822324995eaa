// The test helpers themselves: real servers start on free ports, answer, stop, pause, restart,
// and a 3-node cluster forms and loses a node.
#include "redis_test_util.h"

#include <gtest/gtest.h>

namespace kvtier::testing {
namespace {

using std::chrono::milliseconds;

TEST(RedisTestUtilTest, StartCommandStopRestart) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  EXPECT_NE(server.port(), 6379);
  EXPECT_EQ(server.Command({"SET", "k", "v"}).text, "OK");
  EXPECT_EQ(server.Command({"GET", "k"}).text, "v");
  EXPECT_EQ(server.Command({"GET", "nope"}).text, "(nil)");
  EXPECT_EQ(server.DbSize(), 1);
  EXPECT_TRUE(server.Command({"NOSUCHCOMMAND"}).IsError());
  const uint16_t port = server.port();
  server.Kill();
  EXPECT_FALSE(server.running());
  EXPECT_FALSE(server.Command({"PING"}, milliseconds(200)).ok);
  ASSERT_TRUE(server.Restart()) << server.error();
  EXPECT_EQ(server.port(), port);
  EXPECT_EQ(server.DbSize(), 0);  // no persistence
  server.Stop();
  EXPECT_FALSE(server.running());
}

TEST(RedisTestUtilTest, PausedServerAnswersNothingUntilResumed) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  server.Pause();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(server.Command({"PING"}, milliseconds(200)).ok);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1000));
  server.Resume();
  EXPECT_EQ(server.Command({"PING"}).text, "PONG");
}

TEST(RedisTestUtilTest, PasswordAndMaxmemory) {
  KVTIER_REQUIRE_REDIS();
  RedisServerOptions o;
  o.password = "s3cret";
  o.maxmemory = "2mb";
  RedisServer server(o);
  ASSERT_TRUE(server.Start()) << server.error();
  EXPECT_EQ(server.Command({"PING"}).text, "PONG");
  RedisReply r = RedisCommand(server.port(), {"PING"});
  EXPECT_TRUE(r.IsError()) << r.text;  // NOAUTH
  EXPECT_NE(r.text.find("NOAUTH"), std::string::npos) << r.text;
  r = server.Command({"CONFIG", "GET", "maxmemory-policy"});
  EXPECT_NE(r.text.find("noeviction"), std::string::npos) << r.text;
}

TEST(RedisTestUtilTest, ClusterFormsAndSurvivesANodeLoss) {
  KVTIER_REQUIRE_REDIS();
  RedisCluster cluster(3);
  ASSERT_TRUE(cluster.Start()) << cluster.error();
  ASSERT_EQ(cluster.endpoints().size(), 3u);
  EXPECT_EQ(cluster.KeySlot("foo"), 12182);  // the Redis Cluster spec's example
  const int owner = cluster.NodeOfSlot(12182);
  ASSERT_GE(owner, 0);
  EXPECT_EQ(cluster.node(owner).Command({"SET", "foo", "bar"}).text, "OK");
  const int other = (owner + 1) % 3;
  RedisReply r = cluster.node(other).Command({"GET", "foo"});
  EXPECT_EQ(r.text.rfind("-MOVED 12182 ", 0), 0u) << r.text;
  cluster.Kill(other);
  EXPECT_EQ(cluster.node(owner).Command({"GET", "foo"}).text, "bar");
}

}  // namespace
}  // namespace kvtier::testing

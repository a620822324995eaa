// The BlockManager's /metrics (src/manager/manager_metrics): real managers, a real HTTP
// exchange on 127.0.0.1. The histograms count exactly the operations done; a second manager
// asking for a port in use fails Create clearly; metrics off serves nothing.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>
#include <type_traits>

#include <gtest/gtest.h>

#include "manager/manager_metrics.h"
#include "manager_test_util.h"
#include "metrics/prometheus_text.h"
#include "stats_test_util.h"

namespace kvtier {
namespace {

using testing::MiniEngine;
using testing::SmallConfig;
using testing::TempDirectory;
using testing::TestLayout;

uint16_t FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof(a);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

// GET /metrics; the body, or "" when nothing answered.
std::string Scrape(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  std::string resp;
  // EINTR is retried: under ASan, a read right after a manager's teardown failed with EINTR in
  // a quarter of runs (a socket read with SO_RCVTIMEO is not restarted; io_uring task work
  // queued on this thread is the likely interrupter).
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  if (rc != 0 && errno == EINTR) {
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    if (poll(&p, 1, 5000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0) {
      rc = err == 0 ? 0 : -1;
    }
  }
  if (rc == 0) {
    const std::string req = "GET /metrics HTTP/1.1\r\n\r\n";
    (void)!send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    char buf[65536];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      resp.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// "name{labels}" -> value, from the text format.
std::map<std::string, double> Parse(const std::string& text) {
  std::map<std::string, double> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

std::unique_ptr<BlockManager> Manager(const std::string& dir, uint16_t port) {
  ManagerOptions o = testing::TestManagerOptions(SmallConfig(dir, 16, 64));
  EXPECT_TRUE(o.config.Set("metrics.port", std::to_string(port)).ok());
  auto m = BlockManager::Create(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<TokenId> Prompt(uint32_t seed, uint32_t blocks) {
  std::vector<TokenId> p(blocks * TestLayout().tokens_per_block + 1);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<TokenId>((seed * 7919 + i) % 30000);
  return p;
}

TEST(ManagerMetrics, HistogramCountsEqualTheOperationsDone) {
  TempDirectory dir;
  const uint16_t port = FreePort();
  auto m = Manager(dir.path(), port);
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  // 20 prompts of 6 blocks through a G2 of 16: loads from G2 and G3, demotions to G3.
  for (uint32_t r = 0; r < 40; ++r) engine.Run("r" + std::to_string(r), Prompt(r % 20, 6));
  const ManagerStats s = m->Stats();
  auto v = Parse(Scrape(port));
  ASSERT_FALSE(v.empty()) << "nothing answered on port " << port;
  EXPECT_EQ(v["kvtier_lookups_total"], s.lookups);
  EXPECT_EQ(v["kvtier_lookup_seconds_count"], s.lookups);
  EXPECT_EQ(v["kvtier_commit_seconds_count"], 40);
  EXPECT_EQ(v["kvtier_save_seconds_count"], s.saved_blocks);
  EXPECT_EQ(v["kvtier_saved_blocks_total"], s.saved_blocks);
  EXPECT_GT(s.hit_blocks[kTierG2], 0u);
  EXPECT_GT(s.hit_blocks[kTierG3], 0u);
  EXPECT_EQ(v["kvtier_load_seconds_count{tier=\"g2\"}"], s.hit_blocks[kTierG2]);
  EXPECT_EQ(v["kvtier_load_seconds_count{tier=\"g3\"}"], s.hit_blocks[kTierG3]);
  EXPECT_EQ(v["kvtier_hit_blocks_total{tier=\"g3\"}"], s.hit_blocks[kTierG3]);
  EXPECT_EQ(v["kvtier_io_seconds_count{tier=\"g3\",op=\"write\"}"], s.demoted_blocks);
  EXPECT_GE(v["kvtier_io_seconds_count{tier=\"g3\",op=\"read\"}"], s.hit_blocks[kTierG3]);
  EXPECT_EQ(v["kvtier_blocks{tier=\"g2\"}"], s.g2_blocks);
  EXPECT_EQ(v["kvtier_slots{tier=\"g3\"}"], s.g3_slots);
  EXPECT_EQ(v["kvtier_pinned_blocks"], 0);
  EXPECT_EQ(v["kvtier_transfer_bytes_total{path=\"g2_to_g1\"}"], s.bytes_by_path[1]);
}

// Every field of the stats table that names a family is in /metrics with its value, its labels
// and its help, and nothing else comes from the table: a row added to
// kvtier/manager_stats_fields.h is exported without another line.
TEST(ManagerMetrics, EveryStatsTableFieldIsInTheTextWithItsValue) {
  const ManagerStats s = testing::DistinctStats();
  MetricsRegistry registry;
  registry.AddCollector([&](MetricSink& sink) { AddManagerStats(s, 4096, sink); });
  const std::string text = RenderPrometheusText(registry.Snapshot());
  std::map<std::string, double> v = Parse(text);
  const char* kTier[kNumTiers] = {"g1", "g2", "g3", "g4"};
  size_t expected = 0;
  ForEachStatField(
      [&](const StatField& f, const auto& value) {
        if (*f.metric == '\0') return;
        const std::string family =
            std::string(f.metric) + (f.kind == StatKind::kCounter ? "_total" : "");
        EXPECT_NE(text.find("# HELP " + family + " " + f.help + "\n"), std::string::npos) << f.name;
        using V = std::remove_cvref_t<decltype(value)>;
        if constexpr (std::is_same_v<V, StatPerTier>) {
          for (TierId t : {kTierG2, kTierG3, kTierG4}) {
            const std::string key = family + "{tier=\"" + kTier[t] + "\"}";
            EXPECT_EQ(v[key], value[t]) << f.name << ": " << key;
            ++expected;
          }
        } else if constexpr (std::is_same_v<V, StatPerPath>) {
          for (size_t p = 0; p < kNumTransferPaths; ++p) {
            const std::string key = family + "{path=\"" + kTier[kTransferPaths[p].from] + "_to_" +
                                    kTier[kTransferPaths[p].to] + "\"}";
            EXPECT_EQ(v[key], value[p]) << f.name << ": " << key;
            ++expected;
          }
        } else {
          const std::string key =
              family + (*f.label ? std::string("{tier=\"") + f.label + "\"}" : "");
          EXPECT_EQ(v[key], static_cast<double>(value)) << f.name << ": " << key;
          ++expected;
        }
      },
      s);
  // The table's samples and the two derived ones (kvtier_stored_bytes for G2 and G3).
  EXPECT_EQ(Parse(text).size(), expected + 2) << text;
  EXPECT_EQ(v["kvtier_stored_bytes{tier=\"g3\"}"], 4096.0 * s.g3_blocks);
}

TEST(ManagerMetrics, SecondManagerOnTheSamePortFailsClearly) {
  TempDirectory dir1, dir2;
  const uint16_t port = FreePort();
  auto first = Manager(dir1.path(), port);
  ASSERT_NE(first, nullptr);
  ManagerOptions o = testing::TestManagerOptions(SmallConfig(dir2.path(), 16, 64));
  ASSERT_TRUE(o.config.Set("metrics.port", std::to_string(port)).ok());
  auto second = BlockManager::Create(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().ToString().find("in use"), std::string::npos)
      << second.status().ToString();
  // The first one still serves.
  EXPECT_FALSE(Scrape(port).empty());
  // And the port is free again once the first is gone (a restart can take it at once).
  first.reset();
  auto again = Manager(dir1.path(), port);
  ASSERT_NE(again, nullptr);
  EXPECT_FALSE(Scrape(port).empty());
}

TEST(ManagerMetrics, OffByDefaultAndBadBindIsRefused) {
  TempDirectory dir;
  ManagerOptions o = testing::TestManagerOptions(SmallConfig(dir.path(), 16, 64));
  EXPECT_EQ(o.config.GetUint("metrics.port"), 0u);
  ASSERT_TRUE(o.config.Set("metrics.port", "1").ok());
  ASSERT_TRUE(o.config.Set("metrics.bind", "not-an-ip").ok());
  auto m = BlockManager::Create(o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().ToString().find("metrics.bind"), std::string::npos);
  EXPECT_FALSE(o.config.Set("metrics.port", "65536").ok());
}

}  // namespace
}  // namespace kvtier

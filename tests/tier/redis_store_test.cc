// The Redis backend of G4 against real redis-server processes started by each test on free
// loopback ports: round trips, misses, AUTH, pipelining, server down / killed / paused /
// out of memory, concurrency, endpoint parsing and the cluster hash.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include "redis_test_util.h"
#include "scatter_test_util.h"
#include "tier/redis_wire.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;
using testing::CyclingLayout;
using testing::ExpectEachLandedAndToldOnce;
using testing::ExpectLanded;
using testing::ExpectNothingLanded;
using testing::ExpectPass;
using testing::ExpectToldOnce;
using testing::GetScattered;
using testing::kKvBlock;
using testing::KvBlockLayout;
using testing::LandedRange;
using testing::PrepareScattered;
using testing::Receive;
using testing::RedisServer;
using testing::RedisServerOptions;
using testing::ScatterResult;
using testing::UnevenLayout;

constexpr uint64_t kMiB = 1 << 20;

// Bytes derived from (seed, i), so any served byte can be checked independently.
std::vector<uint8_t> Pattern(uint64_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return v;
}

std::string Name(uint64_t i) { return "kvt-test:" + std::to_string(i); }

RemoteDeadline In(milliseconds ms) { return RemoteClock::now() + ms; }

RedisStoreOptions Opts(const std::string& endpoint) {
  RedisStoreOptions o;
  o.endpoints = {endpoint};
  o.breaker.failure_threshold = 2;
  o.breaker.open_for = milliseconds(100);
  o.breaker.max_open_for = milliseconds(400);
  return o;
}

std::unique_ptr<RemoteStore> MustOpen(const RedisStoreOptions& o) {
  auto s = OpenRedisStore(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

// Puts `values` under Name(first + i); returns the per-item statuses.
std::vector<Status> PutAll(RemoteStore* store, uint64_t first,
                           const std::vector<std::vector<uint8_t>>& values,
                           milliseconds budget = milliseconds(5000)) {
  std::vector<RemotePut> puts;
  for (size_t i = 0; i < values.size(); ++i) puts.push_back({Name(first + i), values[i]});
  std::vector<Status> results(puts.size());
  store->Put(puts, In(budget), results);
  return results;
}

// Gets Name(first + i) into buffers of `dest_bytes`; checks nothing.
struct GetResult {
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<RemoteGet> gets;
  std::vector<Status> results;
};
GetResult GetAll(RemoteStore* store, uint64_t first, size_t count, size_t dest_bytes,
                 milliseconds budget = milliseconds(5000)) {
  GetResult r;
  r.bufs.assign(count, std::vector<uint8_t>(dest_bytes, 0xAB));
  for (size_t i = 0; i < count; ++i) r.gets.push_back({Name(first + i), r.bufs[i], 0});
  r.results.resize(count);
  store->Get(r.gets, In(budget), r.results);
  return r;
}

bool IsFailureCode(const Status& s) {
  return s.Is(StatusCode::kUnavailable) || s.Is(StatusCode::kIOError) ||
         s.Is(StatusCode::kTimedOut);
}

TEST(RedisHashTest, Crc16AndSlotsMatchTheClusterSpec) {
  EXPECT_EQ(RedisCrc16("123456789"), 0x31C3);  // the spec's check value
  EXPECT_EQ(RedisHashSlot("foo"), 12182);
  EXPECT_EQ(RedisHashSlot("{user1000}.following"), RedisHashSlot("{user1000}.followers"));
  EXPECT_EQ(RedisHashSlot("{user1000}.following"), RedisHashSlot("user1000"));
  EXPECT_EQ(RedisHashSlot("foo{}{bar}"), RedisHashSlot("foo{}{bar}"));  // empty tag: whole key
  EXPECT_NE(RedisHashSlot("foo{}{bar}"), RedisHashSlot("bar"));
  EXPECT_EQ(RedisHashSlot("foo{{bar}}zap"), RedisHashSlot("{bar"));
}

TEST(RedisStoreTest, MalformedEndpointsAreInvalidArgumentNamingThem) {
  for (const char* bad :
       {"localhost", "h:notaport", "", ":6379", "h:0", "h:70000", "h:", "[::1]"}) {
    RedisStoreOptions o;
    o.endpoints = {bad};
    auto s = OpenRedisStore(o);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(s.status().Is(StatusCode::kInvalidArgument)) << s.status().ToString();
    if (*bad != '\0') {
      EXPECT_NE(s.status().message().find(bad), std::string::npos) << s.status().ToString();
    }
  }
  RedisStoreOptions none;
  auto s = OpenRedisStore(none);
  EXPECT_TRUE(s.status().Is(StatusCode::kInvalidArgument)) << s.status().ToString();
  RedisStoreOptions two;
  two.endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  EXPECT_TRUE(OpenRedisStore(two).status().Is(StatusCode::kInvalidArgument));
  RedisStoreOptions bad_breaker;
  bad_breaker.endpoints = {"127.0.0.1:1"};
  bad_breaker.breaker.failure_threshold = 0;
  EXPECT_TRUE(OpenRedisStore(bad_breaker).status().Is(StatusCode::kInvalidArgument));
}

TEST(RedisStoreTest, RoundTripIsByteExactIncludingTwoMiBValues) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto store = MustOpen(Opts(server.endpoint()));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Describe(), "redis://" + server.endpoint());
  const std::vector<std::vector<uint8_t>> values = {Pattern(1, 2 * kMiB), Pattern(2, 1),
                                                    Pattern(3, 4096 + 17), Pattern(4, 2 * kMiB)};
  for (const Status& s : PutAll(store.get(), 0, values)) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(server.DbSize(), 4);

  GetResult g = GetAll(store.get(), 0, 5, 2 * kMiB);  // the 5th was never stored
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(g.results[i].ok()) << g.results[i].ToString();
    ASSERT_EQ(g.gets[i].bytes_read, values[i].size());
    EXPECT_EQ(std::memcmp(g.bufs[i].data(), values[i].data(), values[i].size()), 0) << i;
  }
  EXPECT_TRUE(g.results[4].Is(StatusCode::kNotFound)) << g.results[4].ToString();
  EXPECT_EQ(g.gets[4].bytes_read, 0u);

  std::vector<std::string> names = {Name(0), Name(1), Name(9)};
  std::vector<uint8_t> present(3, 7);
  ASSERT_TRUE(store->Contains(names, In(milliseconds(2000)), present).ok());
  EXPECT_EQ(present, (std::vector<uint8_t>{1, 1, 0}));
  ASSERT_TRUE(store->Remove(names, In(milliseconds(2000))).ok());
  ASSERT_TRUE(store->Contains(names, In(milliseconds(2000)), present).ok());
  EXPECT_EQ(present, (std::vector<uint8_t>{0, 0, 0}));
  EXPECT_EQ(server.DbSize(), 2);

  // Replacing an object stores the new bytes.
  const std::vector<std::vector<uint8_t>> v2 = {Pattern(99, 300)};
  ASSERT_TRUE(PutAll(store.get(), 2, v2)[0].ok());
  g = GetAll(store.get(), 2, 1, 4096);
  ASSERT_TRUE(g.results[0].ok());
  EXPECT_EQ(g.gets[0].bytes_read, 300u);
  EXPECT_EQ(std::memcmp(g.bufs[0].data(), v2[0].data(), 300), 0);

  const RemoteStoreStats st = store->Stats();
  EXPECT_EQ(st.puts, 5u);
  EXPECT_EQ(st.put_failures, 0u);
  EXPECT_EQ(st.get_hits, 5u);
  EXPECT_EQ(st.get_misses, 1u);
  EXPECT_EQ(st.put_bytes, 4 * kMiB + 1 + 4096 + 17 + 300);
  EXPECT_FALSE(st.breaker_open);
}

TEST(RedisStoreTest, BatchesLargerThanThePipelineRoundTrip) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  RedisStoreOptions o = Opts(server.endpoint());
  o.max_pipeline = 4;
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  std::vector<std::vector<uint8_t>> values;
  for (int i = 0; i < 61; ++i) values.push_back(Pattern(100 + i, i % 10 == 0 ? 2 * kMiB : 65536));
  for (const Status& s : PutAll(store.get(), 0, values)) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(server.DbSize(), 61);
  GetResult g = GetAll(store.get(), 0, values.size(), 2 * kMiB);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(g.results[i].ok()) << i << ": " << g.results[i].ToString();
    ASSERT_EQ(g.gets[i].bytes_read, values[i].size());
    EXPECT_EQ(std::memcmp(g.bufs[i].data(), values[i].data(), values[i].size()), 0) << i;
  }
}

// The server's used_memory_peak (INFO memory), or -1.
long long UsedMemoryPeak(const RedisServer& server) {
  testing::RedisReply r = server.Command({"INFO", "memory"});
  const std::string key = "used_memory_peak:";
  const size_t at = r.ok ? r.text.find(key) : std::string::npos;
  return at == std::string::npos ? -1 : std::atoll(r.text.c_str() + at + key.size());
}

// Large GETs are bounded by bytes in flight, not only by command count: 16 pipelined 2 MiB GETs
// make Redis build ~32 MiB of output buffers (its peak memory rises by that much), a 4 MiB byte
// window keeps it to about one value. Both ways return every value intact.
TEST(RedisStoreTest, ThePipelineIsBoundedByBytesInFlight) {
  KVTIER_REQUIRE_REDIS();
  std::vector<std::vector<uint8_t>> values;
  for (int i = 0; i < 16; ++i) values.push_back(Pattern(300 + i, 2 * kMiB));
  long long peak_rise[2] = {0, 0};
  const uint64_t window_bytes[2] = {4 * kMiB, 1ull << 30};
  for (int run = 0; run < 2; ++run) {
    RedisServer server;
    ASSERT_TRUE(server.Start()) << server.error();
    RedisStoreOptions o = Opts(server.endpoint());
    o.max_pipeline = 64;
    o.max_pipeline_bytes = window_bytes[run];
    auto store = MustOpen(o);
    ASSERT_NE(store, nullptr);
    for (const Status& s : PutAll(store.get(), 0, values)) ASSERT_TRUE(s.ok()) << s.ToString();
    const long long before = UsedMemoryPeak(server);
    ASSERT_GT(before, 0) << "INFO memory has no used_memory_peak";
    GetResult g = GetAll(store.get(), 0, values.size(), 2 * kMiB);
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(g.results[i].ok()) << i << ": " << g.results[i].ToString();
      ASSERT_EQ(g.gets[i].bytes_read, values[i].size());
      EXPECT_EQ(std::memcmp(g.bufs[i].data(), values[i].data(), values[i].size()), 0) << i;
    }
    peak_rise[run] = UsedMemoryPeak(server) - before;
  }
  EXPECT_LE(peak_rise[0], static_cast<long long>(5 * kMiB)) << "with a 4 MiB window";
  EXPECT_GE(peak_rise[1], static_cast<long long>(8 * kMiB)) << "without a byte window";
}

TEST(RedisStoreTest, APipelineByteWindowOfZeroIsRefused) {
  RedisStoreOptions o;
  o.endpoints = {"127.0.0.1:1"};
  o.max_pipeline_bytes = 0;
  auto s = OpenRedisStore(o);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.status().Is(StatusCode::kInvalidArgument)) << s.status().ToString();
  EXPECT_NE(s.status().message().find("max_pipeline_bytes"), std::string::npos);
}

TEST(RedisStoreTest, DestTooSmallIsCorruptionAndDestUntouched) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto store = MustOpen(Opts(server.endpoint()));
  ASSERT_NE(store, nullptr);
  const std::vector<std::vector<uint8_t>> values = {Pattern(5, 2 * kMiB), Pattern(6, 1000)};
  for (const Status& s : PutAll(store.get(), 0, values)) ASSERT_TRUE(s.ok());
  GetResult g = GetAll(store.get(), 0, 2, 1000);  // the first is 2 MiB: too large
  EXPECT_TRUE(g.results[0].Is(StatusCode::kCorruption)) << g.results[0].ToString();
  EXPECT_NE(g.results[0].message().find("2097152"), std::string::npos);
  EXPECT_EQ(g.gets[0].bytes_read, 0u);
  EXPECT_TRUE(std::all_of(g.bufs[0].begin(), g.bufs[0].end(), [](uint8_t b) { return b == 0xAB; }));
  // The connection stays in sync: the next item in the same pipeline is intact.
  ASSERT_TRUE(g.results[1].ok()) << g.results[1].ToString();
  EXPECT_EQ(std::memcmp(g.bufs[1].data(), values[1].data(), 1000), 0);
}

TEST(RedisStoreTest, AuthRightWrongMissingAndAclUser) {
  KVTIER_REQUIRE_REDIS();
  RedisServerOptions so;
  so.password = "right-pw";
  RedisServer server(so);
  ASSERT_TRUE(server.Start()) << server.error();
  const std::vector<std::vector<uint8_t>> values = {Pattern(7, 100)};

  RedisStoreOptions o = Opts(server.endpoint());
  o.password = "right-pw";
  auto good = MustOpen(o);
  ASSERT_TRUE(PutAll(good.get(), 0, values)[0].ok());

  o.password = "wrong-pw";
  auto wrong = MustOpen(o);  // opens: a refused AUTH is not a reason to fail open
  ASSERT_NE(wrong, nullptr);
  Status s = PutAll(wrong.get(), 0, values)[0];
  EXPECT_TRUE(s.Is(StatusCode::kUnavailable)) << s.ToString();
  EXPECT_NE(s.message().find("WRONGPASS"), std::string::npos) << s.ToString();

  o.password = "";
  auto missing = MustOpen(o);
  s = PutAll(missing.get(), 0, values)[0];
  EXPECT_TRUE(s.Is(StatusCode::kIOError)) << s.ToString();
  EXPECT_NE(s.message().find("NOAUTH"), std::string::npos) << s.ToString();

  ASSERT_EQ(server.Command({"ACL", "SETUSER", "kv", "on", ">kv-pw", "~*", "+@all"}).text, "OK");
  o.username = "kv";
  o.password = "kv-pw";
  auto user = MustOpen(o);
  GetResult g = GetAll(user.get(), 0, 1, 100);
  ASSERT_TRUE(g.results[0].ok()) << g.results[0].ToString();
  EXPECT_EQ(std::memcmp(g.bufs[0].data(), values[0].data(), 100), 0);
}

TEST(RedisStoreTest, ServerDownAtOpenThenStartedIsUsedAfterTheBreakerProbes) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  server.Stop();
  auto store = MustOpen(Opts(server.endpoint()));
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->Stats().breaker_open);
  const std::vector<std::vector<uint8_t>> values = {Pattern(8, 4096)};
  const auto t0 = RemoteClock::now();
  Status s = PutAll(store.get(), 0, values)[0];
  EXPECT_TRUE(s.Is(StatusCode::kUnavailable)) << s.ToString();
  // Refused without a call (the mechanism: a breaker rejection); the time only rules out a
  // connect attempt's wait, with slack for a loaded machine.
  EXPECT_GE(store->Stats().breaker_rejections, 1u);
  EXPECT_LT(RemoteClock::now() - t0, milliseconds(2000));

  ASSERT_TRUE(server.Restart()) << server.error();
  const auto give_up = RemoteClock::now() + milliseconds(3000);
  while (!s.ok() && RemoteClock::now() < give_up) {
    s = PutAll(store.get(), 0, values, milliseconds(500))[0];
    if (!s.ok()) std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(store->Stats().breaker_open);
  GetResult g = GetAll(store.get(), 0, 1, 4096);
  ASSERT_TRUE(g.results[0].ok());
}

TEST(RedisStoreTest, KilledMidRunEveryCallReturnsByItsDeadlineAndRecoversAfterRestart) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  RedisStoreOptions o = Opts(server.endpoint());
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  constexpr auto kBudget = milliseconds(300);
  constexpr auto kSlack = milliseconds(1000);  // per call: generous for a loaded 2-core machine
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0}, ok{0}, failed{0}, late{0}, bad_code{0}, corrupt{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      const std::vector<std::vector<uint8_t>> values = {Pattern(t, 256 << 10),
                                                        Pattern(t + 10, 256 << 10)};
      while (!stop.load()) {
        const auto start = RemoteClock::now();
        std::vector<Status> r = PutAll(store.get(), 10 * t, values, kBudget);
        GetResult g = GetAll(store.get(), 10 * t, 2, 256 << 10, kBudget);
        r.insert(r.end(), g.results.begin(), g.results.end());
        if (RemoteClock::now() - start > 2 * kBudget + 2 * kSlack) late++;
        for (size_t i = 0; i < r.size(); ++i) {
          calls++;
          if (r[i].ok()) {
            ok++;
            if (i >= 2 && std::memcmp(g.bufs[i - 2].data(), values[i - 2].data(),
                                      values[i - 2].size()) != 0) {
              corrupt++;
            }
          } else if (r[i].Is(StatusCode::kNotFound)) {
            // the restarted server lost everything: a miss, not an error
          } else if (IsFailureCode(r[i])) {
            failed++;
          } else {
            bad_code++;
          }
        }
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(300));
  const uint64_t ok_before = ok.load();
  server.Kill();
  std::this_thread::sleep_for(milliseconds(600));
  const uint64_t failed_while_down = failed.load();
  EXPECT_TRUE(store->Stats().breaker_open);
  ASSERT_TRUE(server.Restart()) << server.error();
  const uint64_t ok_at_restart = ok.load();
  const auto give_up = RemoteClock::now() + milliseconds(3000);
  while (ok.load() < ok_at_restart + 20 && RemoteClock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_GT(ok_before, 0u);
  EXPECT_GT(failed_while_down, 0u);
  EXPECT_GE(ok.load(), ok_at_restart + 20) << "did not recover after the restart";
  EXPECT_EQ(late.load(), 0u) << "calls ran past their deadline";
  EXPECT_EQ(bad_code.load(), 0u);
  EXPECT_EQ(corrupt.load(), 0u);
  const RemoteStoreStats st = store->Stats();
  EXPECT_GE(st.breaker_opens, 1u);
  EXPECT_GE(st.breaker_rejections, 1u);
  EXPECT_GE(st.reconnects, 1u);
  EXPECT_FALSE(st.breaker_open);
}

TEST(RedisStoreTest, PausedServerTimesOutWithinTheDeadline) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  RedisStoreOptions o = Opts(server.endpoint());
  o.breaker.failure_threshold = 100;  // let every call reach the paused server
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  const std::vector<std::vector<uint8_t>> small = {Pattern(1, 100)};
  ASSERT_TRUE(PutAll(store.get(), 0, small)[0].ok());
  server.Pause();
  constexpr auto kBudget = milliseconds(200);
  // A get (tiny request, no reply) and a put of 64 MiB (more than the socket buffers take).
  auto t0 = RemoteClock::now();
  GetResult g = GetAll(store.get(), 0, 1, 100, kBudget);
  auto took = RemoteClock::now() - t0;
  EXPECT_TRUE(g.results[0].Is(StatusCode::kTimedOut)) << g.results[0].ToString();
  EXPECT_LT(took, kBudget + milliseconds(2000));  // by the deadline, with slack for a loaded box
  EXPECT_GE(took, kBudget - milliseconds(5));
  std::vector<std::vector<uint8_t>> big(32, Pattern(2, 2 * kMiB));
  t0 = RemoteClock::now();
  std::vector<Status> r = PutAll(store.get(), 100, big, kBudget);
  took = RemoteClock::now() - t0;
  EXPECT_LT(took, kBudget + milliseconds(2000));  // by the deadline, with slack for a loaded box
  for (const Status& s : r) EXPECT_TRUE(s.Is(StatusCode::kTimedOut)) << s.ToString();
  EXPECT_GE(store->Stats().timeouts, 33u);
  server.Resume();
  // The timed-out connections were discarded: the next calls see clean replies.
  g = GetAll(store.get(), 0, 1, 100);
  ASSERT_TRUE(g.results[0].ok()) << g.results[0].ToString();
  EXPECT_EQ(std::memcmp(g.bufs[0].data(), small[0].data(), 100), 0);
}

TEST(RedisStoreTest, OutOfMemoryPutIsIOErrorWithTheServerMessage) {
  KVTIER_REQUIRE_REDIS();
  RedisServerOptions so;
  so.maxmemory = "4mb";
  RedisServer server(so);
  ASSERT_TRUE(server.Start()) << server.error();
  auto store = MustOpen(Opts(server.endpoint()));
  ASSERT_NE(store, nullptr);
  std::vector<std::vector<uint8_t>> values(6, Pattern(3, 2 * kMiB));
  std::vector<Status> r = PutAll(store.get(), 0, values);
  size_t oom = 0;
  for (const Status& s : r) {
    if (s.ok()) continue;
    EXPECT_TRUE(s.Is(StatusCode::kIOError)) << s.ToString();
    EXPECT_NE(s.message().find("OOM"), std::string::npos) << s.ToString();
    ++oom;
  }
  EXPECT_GE(oom, 1u);
  EXPECT_GE(store->Stats().put_failures, 1u);
  // A server that refuses is alive: the breaker stays closed and reads still work.
  EXPECT_FALSE(store->Stats().breaker_open);
  GetResult g = GetAll(store.get(), 0, 1, 2 * kMiB);
  EXPECT_TRUE(g.results[0].ok() || g.results[0].Is(StatusCode::kNotFound))
      << g.results[0].ToString();
}

TEST(RedisStoreTest, ManyThreadsShareOneStore) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  RedisStoreOptions o = Opts(server.endpoint());
  o.connections_per_node = 3;  // fewer connections than threads: the pool is shared
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 10; ++round) {
        std::vector<std::vector<uint8_t>> values;
        for (int i = 0; i < 4; ++i) values.push_back(Pattern(t * 1000 + round * 10 + i, 70000));
        for (const Status& s : PutAll(store.get(), t * 100 + round * 4, values)) {
          if (!s.ok()) errors++;
        }
        GetResult g = GetAll(store.get(), t * 100 + round * 4, 4, 70000);
        for (int i = 0; i < 4; ++i) {
          if (!g.results[i].ok() || std::memcmp(g.bufs[i].data(), values[i].data(), 70000) != 0) {
            errors++;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(server.DbSize(), 8 * 40);
}

TEST(RedisStoreTest, DeadlineAlreadyPassedSendsNothing) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto store = MustOpen(Opts(server.endpoint()));
  ASSERT_NE(store, nullptr);
  const std::vector<uint8_t> v = Pattern(1, 10);
  std::vector<RemotePut> puts = {{Name(0), v}};
  std::vector<Status> r(1);
  store->Put(puts, RemoteClock::now() - milliseconds(1), r);
  EXPECT_TRUE(r[0].Is(StatusCode::kTimedOut)) << r[0].ToString();
  EXPECT_EQ(server.DbSize(), 0);
}

// One connection per node, a paused server holding it: a second call finds the pool busy and
// fails TimedOut by its own deadline, saying so, without opening more connections than allowed
// (and without counting the busy pool against the server's breaker).
TEST(RedisStoreTest, AFullPoolIsTimedOutByTheCallersDeadline) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  RedisStoreOptions o = Opts(server.endpoint());
  o.connections_per_node = 1;
  o.breaker.failure_threshold = 100;  // keep every call going to the server
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(PutAll(store.get(), 0, {Pattern(1, 100)})[0].ok());  // the one connection is open
  server.Pause();
  // A holder: a call that waits on the paused server until its long deadline, holding the one
  // connection. Then calls with short deadlines until one meets the pool held: whichever call
  // takes the connection first holds it, so a holder that lost the race (or ended) is started
  // again; no ordering by sleeps.
  std::atomic<bool> holding{false};
  std::thread holder;
  auto start_holder = [&] {
    if (holder.joinable()) holder.join();
    holding = true;
    holder = std::thread([&] {
      (void)GetAll(store.get(), 0, 1, 100, milliseconds(4000));
      holding = false;
    });
  };
  bool saw_busy = false;
  std::vector<std::string> seen;
  const auto give_up = RemoteClock::now() + milliseconds(30000);
  while (!saw_busy && RemoteClock::now() < give_up) {
    if (!holding) start_holder();
    const auto t0 = RemoteClock::now();
    GetResult g = GetAll(store.get(), 0, 1, 100, milliseconds(300));
    EXPECT_LT(RemoteClock::now() - t0, milliseconds(300 + 2000)) << "by its own deadline";
    EXPECT_FALSE(g.results[0].ok());
    if (seen.size() < 20) seen.push_back(g.results[0].ToString());
    saw_busy = g.results[0].Is(StatusCode::kTimedOut) &&
               g.results[0].message().find("connections of the pool are busy") != std::string::npos;
  }
  server.Resume();
  if (holder.joinable()) holder.join();
  EXPECT_TRUE(saw_busy) << "no call met the pool held by a call on the paused server; calls: "
                        << ::testing::PrintToString(seen);
  EXPECT_TRUE(GetAll(store.get(), 0, 1, 100).results[0].ok()) << "usable again";
}

// ---------------------------------------------------------------------------------------------
// Scatter destinations (RemoteGet::pieces), and what on_landed is told.

// Name(first), Name(first + 1), ...: `count` names.
std::vector<std::string> Names(uint64_t first, size_t count) {
  std::vector<std::string> names;
  for (size_t i = 0; i < count; ++i) names.push_back(Name(first + i));
  return names;
}

// The passes item i of `g` was told of: a range at offset 0 starts one (a get tried again
// starts over).
std::vector<std::span<const LandedRange>> Passes(const ScatterResult& g, size_t i) {
  std::vector<std::span<const LandedRange>> passes;
  const std::vector<LandedRange>& all = g.landed[i];
  for (size_t k = 0, begin = 0; k < all.size(); ++k) {
    if (k + 1 == all.size() || all[k + 1].offset == 0) {
      passes.emplace_back(all.data() + begin, k + 1 - begin);
      begin = k + 1;
    }
  }
  return passes;
}

// Moves the slot of `key` from the node that serves it to the next one, as redis-cli --cluster
// reshard does. Begin: the slot migrating and the key moved (its old node answers ASK). End:
// the slot assigned to the new node on every node (the old node answers MOVED).
class SlotMove {
 public:
  SlotMove(testing::RedisCluster& cluster, const std::string& key)
      : cluster_(cluster), key_(key), slot_(std::to_string(RedisHashSlot(key))) {}

  void Begin() {
    const int from = cluster_.NodeOfSlot(RedisHashSlot(key_));
    ASSERT_GE(from, 0);
    auto& src = cluster_.node(from);
    auto& dst = cluster_.node((from + 1) % 3);
    const std::string src_id = src.Command({"CLUSTER", "MYID"}).text;
    dst_id_ = dst.Command({"CLUSTER", "MYID"}).text;
    ASSERT_EQ(dst.Command({"CLUSTER", "SETSLOT", slot_, "IMPORTING", src_id}).text, "OK");
    ASSERT_EQ(src.Command({"CLUSTER", "SETSLOT", slot_, "MIGRATING", dst_id_}).text, "OK");
    ASSERT_EQ(
        src.Command({"MIGRATE", "127.0.0.1", std::to_string(dst.port()), key_, "0", "5000"}).text,
        "OK");
  }
  void End() {
    for (int n = 0; n < 3; ++n) {
      ASSERT_EQ(cluster_.node(n).Command({"CLUSTER", "SETSLOT", slot_, "NODE", dst_id_}).text,
                "OK");
    }
  }

 private:
  testing::RedisCluster& cluster_;
  const std::string key_, slot_;
  std::string dst_id_;
};

// A fresh redis-server and a store on it (Opts) for each test.
class RedisStoreScatterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVTIER_REQUIRE_REDIS();
    ASSERT_TRUE(server_.Start()) << server_.error();
    ASSERT_NO_FATAL_FAILURE(Open(Opts(server_.endpoint())));
  }

  // Opens the store anew with `o`.
  void Open(const RedisStoreOptions& o) {
    store_ = MustOpen(o);
    ASSERT_NE(store_, nullptr);
  }
  // Replaces the store with one on a fresh 3-node cluster (the server SetUp started stays idle).
  void UseCluster() {
    cluster_ = std::make_unique<testing::RedisCluster>(3);
    ASSERT_TRUE(cluster_->Start()) << cluster_->error();
    RedisStoreOptions o = Opts(cluster_->node(0).endpoint());
    o.cluster = true;
    ASSERT_NO_FATAL_FAILURE(Open(o));
  }
  // Stores values[i] as Name(first + i); each put must succeed.
  void PutValues(const std::vector<std::vector<uint8_t>>& values, uint64_t first = 0) {
    for (const Status& s : PutAll(store_.get(), first, values)) ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ScatterResult Get(uint64_t first, const std::vector<std::vector<size_t>>& layouts,
                    Receive how = Receive::kPieces) {
    return GetScattered(store_.get(), Names(first, layouts.size()), layouts, how);
  }

  RedisServer server_;
  std::unique_ptr<testing::RedisCluster> cluster_;
  std::unique_ptr<RemoteStore> store_;
};

TEST_F(RedisStoreScatterTest, AKvBlockLandsByteExactInUnevenAndInEngineSizedPieces) {
  const std::vector<std::vector<uint8_t>> values = {Pattern(11, kKvBlock)};
  ASSERT_NO_FATAL_FAILURE(PutValues(values));

  for (const auto& layout : {UnevenLayout(kKvBlock), KvBlockLayout()}) {
    SCOPED_TRACE("pieces of " + std::to_string(layout.size()));
    ScatterResult g = Get(0, {layout});
    ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, 0, values[0]));
    EXPECT_TRUE(
        std::equal(g.pieces[0].bufs[0].begin(), g.pieces[0].bufs[0].end(), values[0].begin()))
        << "the header piece";
  }
  // The same object into a contiguous dest, for comparison.
  GetResult c = GetAll(store_.get(), 0, 1, kKvBlock);
  ASSERT_TRUE(c.results[0].ok()) << c.results[0].ToString();
  EXPECT_EQ(c.bufs[0], values[0]);
  EXPECT_EQ(store_->Stats().get_bytes, 3 * kKvBlock);
}

// Several objects in one call (pipelined on one connection), large and small, so payloads
// arrive both straight from the socket and out of the receive buffer, across piece boundaries.
TEST_F(RedisStoreScatterTest, PipelinedObjectsLandByteExactInTheirPieces) {
  RedisStoreOptions o = Opts(server_.endpoint());
  o.connections_per_node = 1;
  ASSERT_NO_FATAL_FAILURE(Open(o));
  const std::vector<size_t> sizes = {kKvBlock, 5000, 1, 0, 70001, kKvBlock, 33};
  std::vector<std::vector<uint8_t>> values;
  std::vector<std::vector<size_t>> layouts;
  for (size_t i = 0; i < sizes.size(); ++i) {
    values.push_back(Pattern(20 + i, sizes[i]));
    if (sizes[i] > 2 * kMiB) {
      layouts.push_back(i == 0 ? KvBlockLayout() : UnevenLayout(sizes[i]));
    } else {
      layouts.push_back(CyclingLayout(sizes[i], {1, 7, 1000}));
    }
  }
  ASSERT_NO_FATAL_FAILURE(PutValues(values));
  ScatterResult g = Get(0, layouts);
  for (size_t i = 0; i < values.size(); ++i) ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, i, values[i]));
}

TEST_F(RedisStoreScatterTest, ObjectLargerThanThePiecesIsCorruptionAndThePiecesUntouched) {
  const std::vector<std::vector<uint8_t>> values = {Pattern(30, kKvBlock + 1), Pattern(31, 4000)};
  ASSERT_NO_FATAL_FAILURE(PutValues(values));
  // One byte short, then (same call, same connection) an object that fits.
  ScatterResult g = Get(0, {KvBlockLayout(), UnevenLayout(4096 + 32768 + 18 + 5)});
  ExpectNothingLanded(g, 0, StatusCode::kCorruption);
  EXPECT_NE(g.results[0].message().find(std::to_string(kKvBlock + 1)), std::string::npos)
      << g.results[0].ToString();
  EXPECT_NE(g.results[0].message().find(std::to_string(kKvBlock)), std::string::npos)
      << g.results[0].ToString();
  ASSERT_TRUE(g.results[1].ok()) << g.results[1].ToString();
  EXPECT_TRUE(g.pieces[1].Joined(4000) == values[1]);
  EXPECT_EQ(store_->Stats().get_failures, 1u);
}

TEST_F(RedisStoreScatterTest, AMissingObjectIsNotFoundAndThePiecesUntouched) {
  ScatterResult g = Get(5, {KvBlockLayout()});
  ExpectNothingLanded(g, 0, StatusCode::kNotFound);
  EXPECT_EQ(store_->Stats().get_misses, 1u);
}

TEST_F(RedisStoreScatterTest, AnObjectSmallerThanThePiecesFillsTheLeadingOnes) {
  const std::vector<std::vector<uint8_t>> values = {Pattern(40, 4096 + 1000),
                                                    Pattern(41, 300 * 1024 + 5)};
  ASSERT_NO_FATAL_FAILURE(PutValues(values));
  ScatterResult g = Get(0, {KvBlockLayout(), KvBlockLayout()});
  for (size_t i = 0; i < values.size(); ++i) ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, i, values[i]));
  // The first: the header piece full, 1000 bytes in the next, the rest untouched.
  EXPECT_TRUE(
      std::equal(g.pieces[0].bufs[0].begin(), g.pieces[0].bufs[0].end(), values[0].begin()));
  EXPECT_EQ(g.pieces[0].bufs[1][999], values[0][4096 + 999]);
  EXPECT_EQ(g.pieces[0].bufs[1][1000], 0xAB);
}

// Many small pieces: 600 of 4 KiB, and 2000 of 1 KiB (more than IOV_MAX, 1024 on Linux, so one
// read cannot cover them all: reading them needs several readv calls, each within the limit).
TEST_F(RedisStoreScatterTest, ThousandsOfSmallPiecesLandByteExact) {
  const std::vector<std::vector<uint8_t>> values = {
      Pattern(50, 600 * 4096), Pattern(51, 2000 * 1024), Pattern(52, 2000 * 1024 - 100)};
  ASSERT_NO_FATAL_FAILURE(PutValues(values));
  const std::vector<std::vector<size_t>> layouts = {std::vector<size_t>(600, 4096),
                                                    std::vector<size_t>(2000, 1024),
                                                    std::vector<size_t>(2100, 1024)};
  // One object at a time (a payload straight from the socket), then all three pipelined.
  for (size_t i = 0; i < values.size(); ++i) {
    SCOPED_TRACE("object " + std::to_string(i) + " alone");
    ASSERT_NO_FATAL_FAILURE(ExpectLanded(Get(i, {layouts[i]}), 0, values[i]));
  }
  ScatterResult g = Get(0, layouts);
  for (size_t i = 0; i < values.size(); ++i) ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, i, values[i]));
}

// Scatter destinations through a Redis Cluster: every node's lane, then an ASK mid-migration
// and a MOVED after it (both retried into the same pieces).
TEST_F(RedisStoreScatterTest, ClusterRoutesAndRedirectsIntoThePieces) {
  ASSERT_NO_FATAL_FAILURE(UseCluster());
  constexpr int kN = 24;
  std::vector<std::vector<uint8_t>> values;
  for (int i = 0; i < kN; ++i) values.push_back(Pattern(60 + i, 4096 + 32768 * (2 + i % 3)));
  ASSERT_NO_FATAL_FAILURE(PutValues(values));
  for (int n = 0; n < 3; ++n) EXPECT_GT(cluster_->node(n).DbSize(), 0) << "node " << n;
  ScatterResult g = Get(0, std::vector<std::vector<size_t>>(kN, KvBlockLayout()));
  for (int i = 0; i < kN; ++i) ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, i, values[i]));

  SlotMove move(*cluster_, Name(0));
  ASSERT_NO_FATAL_FAILURE(move.Begin());
  ASSERT_NO_FATAL_FAILURE(ExpectLanded(Get(0, {UnevenLayout(values[0].size())}), 0, values[0]))
      << "ASK";
  EXPECT_EQ(store_->Stats().redirects, 1u);
  ASSERT_NO_FATAL_FAILURE(move.End());
  ASSERT_NO_FATAL_FAILURE(ExpectLanded(Get(0, {UnevenLayout(values[0].size())}), 0, values[0]))
      << "MOVED";
  EXPECT_EQ(store_->Stats().redirects, 2u);
}

// on_landed: the same store and server as the scatter tests.
class RedisStoreLandedTest : public RedisStoreScatterTest {};

// Objects of 2 MiB + 4 KiB, 5000, 1, 0 (item 3), 70001 and 33 bytes, for one call pipelined on
// one connection: each must be told of its own ranges.
std::vector<std::vector<uint8_t>> PipelinedValues() {
  std::vector<std::vector<uint8_t>> values;
  for (size_t n : {kKvBlock, size_t{5000}, size_t{1}, size_t{0}, size_t{70001}, size_t{33}}) {
    values.push_back(Pattern(70 + values.size(), n));
  }
  return values;
}

TEST_F(RedisStoreLandedTest, EveryRangeOfAContiguousDestIsToldOnceInOrder) {
  RedisStoreOptions o = Opts(server_.endpoint());
  o.connections_per_node = 1;
  ASSERT_NO_FATAL_FAILURE(Open(o));
  const std::vector<std::vector<uint8_t>> values = PipelinedValues();
  ASSERT_NO_FATAL_FAILURE(PutValues(values));
  std::vector<std::vector<size_t>> dests;
  for (const auto& v : values) dests.push_back({v.size() + 100});
  ScatterResult g = Get(0, dests, Receive::kDestLanded);
  ASSERT_NO_FATAL_FAILURE(ExpectEachLandedAndToldOnce(g, values));
  EXPECT_TRUE(g.landed[3].empty()) << "an empty object has no range to tell";
}

TEST_F(RedisStoreLandedTest, EveryRangeOfUnevenAndEngineSizedPiecesIsToldOnceInOrder) {
  const std::vector<std::vector<uint8_t>> block = {Pattern(11, kKvBlock)};
  ASSERT_NO_FATAL_FAILURE(PutValues(block));
  for (const auto& layout : {UnevenLayout(kKvBlock), KvBlockLayout()}) {
    SCOPED_TRACE("pieces of " + std::to_string(layout.size()));
    ASSERT_NO_FATAL_FAILURE(
        ExpectEachLandedAndToldOnce(Get(0, {layout}, Receive::kPiecesLanded), block));
  }

  RedisStoreOptions o = Opts(server_.endpoint());
  o.connections_per_node = 1;
  ASSERT_NO_FATAL_FAILURE(Open(o));
  const std::vector<std::vector<uint8_t>> values = PipelinedValues();
  ASSERT_NO_FATAL_FAILURE(PutValues(values, 10));
  std::vector<std::vector<size_t>> layouts = {KvBlockLayout()};
  for (size_t i = 1; i < values.size(); ++i) {
    layouts.push_back(i == 4 ? UnevenLayout(values[i].size() + 9)
                             : CyclingLayout(values[i].size(), {1, 0, 7, 1000}));
  }
  ScatterResult g = Get(10, layouts, Receive::kPiecesLanded);
  ASSERT_NO_FATAL_FAILURE(ExpectEachLandedAndToldOnce(g, values));
  EXPECT_TRUE(g.landed[3].empty()) << "an empty object has no range to tell";
}

// Nothing is told of an object larger than the capacity (drained, never stored) or of a missing
// one; the object after them in the same pipeline is told of as usual.
TEST_F(RedisStoreLandedTest, NoRangeIsToldOfAnObjectTooLargeOrMissing) {
  const std::vector<std::vector<uint8_t>> big = {Pattern(80, kKvBlock + 1)};
  const std::vector<std::vector<uint8_t>> fits = {Pattern(81, 4000)};
  ASSERT_NO_FATAL_FAILURE(PutValues(big, 0));
  ASSERT_NO_FATAL_FAILURE(PutValues(fits, 2));  // Name(1) stays missing
  ScatterResult g =
      Get(0, {KvBlockLayout(), KvBlockLayout(), UnevenLayout(kKvBlock)}, Receive::kPiecesLanded);
  ExpectNothingLanded(g, 0, StatusCode::kCorruption);
  ExpectNothingLanded(g, 1, StatusCode::kNotFound);
  ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, 2, fits[0]));
  ExpectToldOnce(g, 2, fits[0]);

  g = Get(0, {{kKvBlock}, {kKvBlock}, {kKvBlock}}, Receive::kDestLanded);
  ExpectNothingLanded(g, 0, StatusCode::kCorruption);
  ExpectNothingLanded(g, 1, StatusCode::kNotFound);
  ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, 2, fits[0]));
  ExpectToldOnce(g, 2, fits[0]);
}

// Pieces of 1 to 7 bytes (and empty ones): 300 small objects pipelined, so that many replies
// come in one receive and are copied out of the receive buffer across hundreds of piece
// boundaries; then objects of 2 MiB into such pieces (a readv takes at most 1024 of them), and
// of 8 MiB into a 1-byte piece and one large piece, which the socket delivers over several
// reads, so that reads end inside a piece and the next range starts there.
TEST_F(RedisStoreLandedTest, TinyPiecesAndRangesStartingInsideAPiece) {
  RedisStoreOptions o = Opts(server_.endpoint());
  o.connections_per_node = 1;
  o.max_pipeline = 512;
  ASSERT_NO_FATAL_FAILURE(Open(o));
  const std::vector<size_t> tiny = {1, 2, 0, 3, 4, 5, 6, 7};
  std::vector<std::vector<uint8_t>> values;
  std::vector<std::vector<size_t>> layouts;
  for (size_t i = 0; i < 300; ++i) {
    values.push_back(Pattern(100 + i, 1 + (i * 37) % 400));
    layouts.push_back(CyclingLayout(values.back().size(), tiny));
  }
  values.push_back(Pattern(90, kKvBlock));
  layouts.push_back(CyclingLayout(values.back().size(), tiny));
  values.push_back(Pattern(91, 8 * kMiB + 5));
  layouts.push_back({1, values.back().size() + 10});
  ASSERT_NO_FATAL_FAILURE(PutValues(values));
  ScatterResult g = Get(0, layouts, Receive::kPiecesLanded);
  ASSERT_NO_FATAL_FAILURE(ExpectEachLandedAndToldOnce(g, values));
  const size_t last = values.size() - 1;
  size_t inside = 0;
  for (const LandedRange& r : g.landed[last]) {
    if (!g.pieces[last].StartsAPiece(r.offset)) ++inside;
  }
  EXPECT_GE(inside, 1u) << "no read of the 8 MiB object ended inside its large piece";
}

// A get tried again is told of its ranges again from offset 0: after an ASK and a MOVED (the
// redirect reply carries no bytes, so one pass), and after the connection is lost mid-object
// (the cluster store retries a lost node once): a partial pass, then a whole one.
TEST_F(RedisStoreLandedTest, RangesStartAgainAtZeroWhenAClusterGetIsTriedAgain) {
  ASSERT_NO_FATAL_FAILURE(UseCluster());
  const std::vector<std::vector<uint8_t>> values = {Pattern(95, 4096 + 32768 * 3)};
  ASSERT_NO_FATAL_FAILURE(PutValues(values));
  auto check_passes = [&](const ScatterResult& g, size_t want_passes) {
    ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, 0, values[0]));
    const auto passes = Passes(g, 0);
    ASSERT_EQ(passes.size(), want_passes);
    for (size_t p = 0; p + 1 < passes.size(); ++p) {
      SCOPED_TRACE("pass " + std::to_string(p));
      EXPECT_LT(ExpectPass(passes[p], g.pieces[0], values[0]), values[0].size()) << "partial";
    }
    SCOPED_TRACE("the last pass");
    EXPECT_EQ(ExpectPass(passes.back(), g.pieces[0], values[0]), values[0].size());
  };

  SlotMove move(*cluster_, Name(0));
  ASSERT_NO_FATAL_FAILURE(move.Begin());
  {
    SCOPED_TRACE("ASK");
    check_passes(Get(0, {UnevenLayout(values[0].size())}, Receive::kPiecesLanded), 1);
  }
  EXPECT_EQ(store_->Stats().redirects, 1u);
  ASSERT_NO_FATAL_FAILURE(move.End());
  {
    SCOPED_TRACE("MOVED");
    check_passes(Get(0, {KvBlockLayout()}, Receive::kPiecesLanded), 1);
  }
  EXPECT_EQ(store_->Stats().redirects, 2u);

  // 32 MiB, far more than the socket buffers hold: when the first range is told, the server
  // still holds most of the reply, and the connection closed then loses the rest.
  const std::vector<std::vector<uint8_t>> large = {Pattern(96, 32 * kMiB)};
  ASSERT_NO_FATAL_FAILURE(PutValues(large, 1));
  const int node = cluster_->NodeOfSlot(RedisHashSlot(Name(1)));
  ASSERT_GE(node, 0);
  ScatterResult g =
      PrepareScattered(Names(1, 1), {UnevenLayout(large[0].size())}, Receive::kPiecesLanded);
  bool killed = false;
  g.gets[0].on_landed = [&, record = std::move(g.gets[0].on_landed)](
                            uint64_t offset, std::span<const uint8_t> bytes) {
    record(offset, bytes);
    if (killed) return;
    killed = true;  // the store's connections are normal clients; this command's is skipped
    const testing::RedisReply r =
        cluster_->node(node).Command({"CLIENT", "KILL", "TYPE", "normal"});
    EXPECT_TRUE(r.ok && !r.IsError() && std::atoi(r.text.c_str()) >= 1) << r.text;
  };
  store_->Get(g.gets, In(milliseconds(20000)), g.results);
  ASSERT_TRUE(killed);
  ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, 0, large[0]));
  const auto passes = Passes(g, 0);
  ASSERT_EQ(passes.size(), 2u) << "the lost connection's pass, then the retry's";
  {
    SCOPED_TRACE("the pass cut short");
    EXPECT_LT(ExpectPass(passes[0], g.pieces[0], large[0]), large[0].size());
  }
  SCOPED_TRACE("the retry");
  EXPECT_EQ(ExpectPass(passes[1], g.pieces[0], large[0]), large[0].size());
}

}  // namespace
}  // namespace kvtier

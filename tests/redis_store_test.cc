// The Redis backend of G4 against real redis-server processes started by each test on free
// loopback ports: round trips, misses, AUTH, pipelining, server down / killed / paused /
// out of memory, concurrency, endpoint parsing and the cluster hash.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include "redis_test_util.h"
#include "tier/redis_wire.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;
using testing::RedisServer;
using testing::RedisServerOptions;

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
// Scatter destinations (RemoteGet::pieces).

// A scatter destination: each piece a buffer of its own (so no two are contiguous), filled
// with 0xAB.
struct Pieces {
  explicit Pieces(const std::vector<size_t>& sizes) {
    for (size_t n : sizes) bufs.emplace_back(n, 0xAB);
    for (auto& b : bufs) spans.emplace_back(b.data(), b.size());
  }
  // The first `n` bytes held by the pieces, in order.
  std::vector<uint8_t> Joined(size_t n) const {
    std::vector<uint8_t> out;
    for (const auto& b : bufs) out.insert(out.end(), b.begin(), b.end());
    out.resize(std::min(n, out.size()));
    return out;
  }
  // Whether every byte from byte `from` of the joined pieces on is still 0xAB.
  bool UntouchedFrom(size_t from) const {
    size_t at = 0;
    for (const auto& b : bufs) {
      for (uint8_t x : b) {
        if (at++ >= from && x != 0xAB) return false;
      }
    }
    return true;
  }
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<std::span<uint8_t>> spans;
};

// A KV block as an engine holds it: a 4096-byte header, then 64 chunks of 32 KiB.
std::vector<size_t> KvBlockLayout() {
  std::vector<size_t> sizes = {4096};
  sizes.insert(sizes.end(), 64, 32 << 10);
  return sizes;
}

// Uneven pieces (empty ones too) adding up to `total`.
std::vector<size_t> UnevenLayout(size_t total) {
  const std::vector<size_t> head = {4096, 0, 32 << 10, 1, 17, 0};
  size_t used = 0;
  for (size_t n : head) used += n;
  EXPECT_GE(total, used) << "UnevenLayout: too small a total";
  std::vector<size_t> sizes = head;
  sizes.push_back(total - used);
  return sizes;
}

// Gets Name(first + i) into pieces of layouts[i]; checks nothing.
struct ScatterResult {
  std::vector<Pieces> pieces;
  std::vector<RemoteGet> gets;
  std::vector<Status> results;
};
ScatterResult GetScattered(RemoteStore* store, uint64_t first,
                           const std::vector<std::vector<size_t>>& layouts) {
  ScatterResult r;
  for (const auto& l : layouts) r.pieces.emplace_back(l);
  for (size_t i = 0; i < layouts.size(); ++i) {
    RemoteGet g{Name(first + i), {}, 0};
    g.pieces = r.pieces[i].spans;
    r.gets.push_back(std::move(g));
  }
  r.results.resize(layouts.size());
  store->Get(r.gets, In(milliseconds(5000)), r.results);
  return r;
}

TEST(RedisStoreScatterTest, AKvBlockLandsByteExactInUnevenAndInEngineSizedPieces) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto store = MustOpen(Opts(server.endpoint()));
  ASSERT_NE(store, nullptr);
  const size_t kBlock = 2 * kMiB + 4096;
  const std::vector<std::vector<uint8_t>> values = {Pattern(11, kBlock)};
  ASSERT_TRUE(PutAll(store.get(), 0, values)[0].ok());

  for (const auto& layout : {UnevenLayout(kBlock), KvBlockLayout()}) {
    ScatterResult g = GetScattered(store.get(), 0, {layout});
    ASSERT_TRUE(g.results[0].ok()) << g.results[0].ToString();
    ASSERT_EQ(g.gets[0].bytes_read, kBlock);
    EXPECT_TRUE(g.pieces[0].Joined(kBlock) == values[0]) << "pieces of " << layout.size();
    EXPECT_TRUE(
        std::equal(g.pieces[0].bufs[0].begin(), g.pieces[0].bufs[0].end(), values[0].begin()))
        << "the header piece";
  }
  // The same object into a contiguous dest, for comparison.
  GetResult c = GetAll(store.get(), 0, 1, kBlock);
  ASSERT_TRUE(c.results[0].ok()) << c.results[0].ToString();
  EXPECT_EQ(c.bufs[0], values[0]);
  EXPECT_EQ(store->Stats().get_bytes, 3 * kBlock);
}

// Several objects in one call (pipelined on one connection), large and small, so payloads
// arrive both straight from the socket and out of the receive buffer, across piece boundaries.
TEST(RedisStoreScatterTest, PipelinedObjectsLandByteExactInTheirPieces) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  RedisStoreOptions o = Opts(server.endpoint());
  o.connections_per_node = 1;
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  const std::vector<size_t> sizes = {2 * kMiB + 4096, 5000, 1, 0, 70001, 2 * kMiB + 4096, 33};
  std::vector<std::vector<uint8_t>> values;
  std::vector<std::vector<size_t>> layouts;
  for (size_t i = 0; i < sizes.size(); ++i) {
    values.push_back(Pattern(20 + i, sizes[i]));
    if (sizes[i] > 2 * kMiB) {
      layouts.push_back(i == 0 ? KvBlockLayout() : UnevenLayout(sizes[i]));
    } else {
      // Small pieces of 1, 7 and 1000 bytes in turn, a little more than the object.
      std::vector<size_t> l;
      size_t total = 0;
      for (size_t k = 0; total < sizes[i] + 3; ++k) {
        l.push_back(k % 3 == 0 ? 1 : k % 3 == 1 ? 7 : 1000);
        total += l.back();
      }
      layouts.push_back(l);
    }
  }
  for (const Status& s : PutAll(store.get(), 0, values)) ASSERT_TRUE(s.ok()) << s.ToString();
  ScatterResult g = GetScattered(store.get(), 0, layouts);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(g.results[i].ok()) << i << ": " << g.results[i].ToString();
    ASSERT_EQ(g.gets[i].bytes_read, values[i].size()) << i;
    EXPECT_TRUE(g.pieces[i].Joined(values[i].size()) == values[i]) << i;
    EXPECT_TRUE(g.pieces[i].UntouchedFrom(values[i].size())) << i;
  }
}

TEST(RedisStoreScatterTest, ObjectLargerThanThePiecesIsCorruptionAndThePiecesUntouched) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto store = MustOpen(Opts(server.endpoint()));
  ASSERT_NE(store, nullptr);
  const size_t kBlock = 2 * kMiB + 4096;
  const std::vector<std::vector<uint8_t>> values = {Pattern(30, kBlock + 1), Pattern(31, 4000)};
  for (const Status& s : PutAll(store.get(), 0, values)) ASSERT_TRUE(s.ok());
  // One byte short, then (same call, same connection) an object that fits.
  ScatterResult g =
      GetScattered(store.get(), 0, {KvBlockLayout(), UnevenLayout(4096 + 32768 + 18 + 5)});
  EXPECT_TRUE(g.results[0].Is(StatusCode::kCorruption)) << g.results[0].ToString();
  EXPECT_NE(g.results[0].message().find(std::to_string(kBlock + 1)), std::string::npos)
      << g.results[0].ToString();
  EXPECT_NE(g.results[0].message().find(std::to_string(kBlock)), std::string::npos)
      << g.results[0].ToString();
  EXPECT_EQ(g.gets[0].bytes_read, 0u);
  EXPECT_TRUE(g.pieces[0].UntouchedFrom(0));
  ASSERT_TRUE(g.results[1].ok()) << g.results[1].ToString();
  EXPECT_TRUE(g.pieces[1].Joined(4000) == values[1]);
  EXPECT_EQ(store->Stats().get_failures, 1u);
}

TEST(RedisStoreScatterTest, AMissingObjectIsNotFoundAndThePiecesUntouched) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto store = MustOpen(Opts(server.endpoint()));
  ASSERT_NE(store, nullptr);
  ScatterResult g = GetScattered(store.get(), 5, {KvBlockLayout()});
  EXPECT_TRUE(g.results[0].Is(StatusCode::kNotFound)) << g.results[0].ToString();
  EXPECT_EQ(g.gets[0].bytes_read, 0u);
  EXPECT_TRUE(g.pieces[0].UntouchedFrom(0));
  EXPECT_EQ(store->Stats().get_misses, 1u);
}

TEST(RedisStoreScatterTest, AnObjectSmallerThanThePiecesFillsTheLeadingOnes) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto store = MustOpen(Opts(server.endpoint()));
  ASSERT_NE(store, nullptr);
  const std::vector<std::vector<uint8_t>> values = {Pattern(40, 4096 + 1000),
                                                    Pattern(41, 300 * 1024 + 5)};
  for (const Status& s : PutAll(store.get(), 0, values)) ASSERT_TRUE(s.ok());
  ScatterResult g = GetScattered(store.get(), 0, {KvBlockLayout(), KvBlockLayout()});
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(g.results[i].ok()) << g.results[i].ToString();
    ASSERT_EQ(g.gets[i].bytes_read, values[i].size());
    EXPECT_TRUE(g.pieces[i].Joined(values[i].size()) == values[i]) << i;
    EXPECT_TRUE(g.pieces[i].UntouchedFrom(values[i].size())) << i;
  }
  // The first: the header piece full, 1000 bytes in the next, the rest untouched.
  EXPECT_TRUE(
      std::equal(g.pieces[0].bufs[0].begin(), g.pieces[0].bufs[0].end(), values[0].begin()));
  EXPECT_EQ(g.pieces[0].bufs[1][999], values[0][4096 + 999]);
  EXPECT_EQ(g.pieces[0].bufs[1][1000], 0xAB);
}

// Many small pieces: 600 of 4 KiB, and 2000 of 1 KiB (more than IOV_MAX, 1024 on Linux, so one
// read cannot cover them all: reading them needs several readv calls, each within the limit).
TEST(RedisStoreScatterTest, ThousandsOfSmallPiecesLandByteExact) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto store = MustOpen(Opts(server.endpoint()));
  ASSERT_NE(store, nullptr);
  const std::vector<std::vector<uint8_t>> values = {
      Pattern(50, 600 * 4096), Pattern(51, 2000 * 1024), Pattern(52, 2000 * 1024 - 100)};
  for (const Status& s : PutAll(store.get(), 0, values)) ASSERT_TRUE(s.ok());
  const std::vector<std::vector<size_t>> layouts = {std::vector<size_t>(600, 4096),
                                                    std::vector<size_t>(2000, 1024),
                                                    std::vector<size_t>(2100, 1024)};
  // One object at a time (a payload straight from the socket), then all three pipelined.
  for (size_t i = 0; i < values.size(); ++i) {
    ScatterResult g = GetScattered(store.get(), i, {layouts[i]});
    ASSERT_TRUE(g.results[0].ok()) << i << ": " << g.results[0].ToString();
    ASSERT_EQ(g.gets[0].bytes_read, values[i].size());
    EXPECT_TRUE(g.pieces[0].Joined(values[i].size()) == values[i]) << i;
    EXPECT_TRUE(g.pieces[0].UntouchedFrom(values[i].size())) << i;
  }
  ScatterResult g = GetScattered(store.get(), 0, layouts);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(g.results[i].ok()) << i << ": " << g.results[i].ToString();
    EXPECT_TRUE(g.pieces[i].Joined(values[i].size()) == values[i]) << i;
  }
}

// Scatter destinations through a Redis Cluster: every node's lane, then an ASK mid-migration
// and a MOVED after it (both retried into the same pieces).
TEST(RedisStoreScatterTest, ClusterRoutesAndRedirectsIntoThePieces) {
  KVTIER_REQUIRE_REDIS();
  testing::RedisCluster cluster(3);
  ASSERT_TRUE(cluster.Start()) << cluster.error();
  RedisStoreOptions o = Opts(cluster.node(0).endpoint());
  o.cluster = true;
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  constexpr int kN = 24;
  std::vector<std::vector<uint8_t>> values;
  for (int i = 0; i < kN; ++i) values.push_back(Pattern(60 + i, 4096 + 32768 * (2 + i % 3)));
  for (const Status& s : PutAll(store.get(), 0, values)) ASSERT_TRUE(s.ok()) << s.ToString();
  for (int n = 0; n < 3; ++n) EXPECT_GT(cluster.node(n).DbSize(), 0) << "node " << n;
  ScatterResult g =
      GetScattered(store.get(), 0, std::vector<std::vector<size_t>>(kN, KvBlockLayout()));
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(g.results[i].ok()) << i << ": " << g.results[i].ToString();
    EXPECT_TRUE(g.pieces[i].Joined(values[i].size()) == values[i]) << i;
  }

  // Migrate the slot of Name(0) as redis-cli --cluster reshard does.
  const std::string s = std::to_string(RedisHashSlot(Name(0)));
  const int from = cluster.NodeOfSlot(RedisHashSlot(Name(0)));
  ASSERT_GE(from, 0);
  auto& src = cluster.node(from);
  auto& dst = cluster.node((from + 1) % 3);
  const std::string src_id = src.Command({"CLUSTER", "MYID"}).text;
  const std::string dst_id = dst.Command({"CLUSTER", "MYID"}).text;
  ASSERT_EQ(dst.Command({"CLUSTER", "SETSLOT", s, "IMPORTING", src_id}).text, "OK");
  ASSERT_EQ(src.Command({"CLUSTER", "SETSLOT", s, "MIGRATING", dst_id}).text, "OK");
  ASSERT_EQ(
      src.Command({"MIGRATE", "127.0.0.1", std::to_string(dst.port()), Name(0), "0", "5000"}).text,
      "OK");
  g = GetScattered(store.get(), 0, {UnevenLayout(values[0].size())});  // ASK
  ASSERT_TRUE(g.results[0].ok()) << g.results[0].ToString();
  EXPECT_TRUE(g.pieces[0].Joined(values[0].size()) == values[0]);
  EXPECT_EQ(store->Stats().redirects, 1u);
  for (int n = 0; n < 3; ++n) {
    ASSERT_EQ(cluster.node(n).Command({"CLUSTER", "SETSLOT", s, "NODE", dst_id}).text, "OK");
  }
  g = GetScattered(store.get(), 0, {UnevenLayout(values[0].size())});  // MOVED
  ASSERT_TRUE(g.results[0].ok()) << g.results[0].ToString();
  EXPECT_TRUE(g.pieces[0].Joined(values[0].size()) == values[0]);
  EXPECT_EQ(store->Stats().redirects, 2u);
}

}  // namespace
}  // namespace kvtier

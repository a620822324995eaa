// The Redis backend of G4 against real redis-server processes started by each test on free
// loopback ports: round trips, misses, AUTH, pipelining, server down / killed / paused /
// out of memory, concurrency, endpoint parsing and the cluster hash.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvtier

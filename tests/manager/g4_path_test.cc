// G4Path (src/manager/g4_path.h) on its own, over a real fs store: what it offers, what it
// stops offering after a failed load and until the block is written again, its counters, and
// how it refuses or leaves out a G4 that cannot open.
#include "manager/g4_path.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "disk_test_util.h"

namespace kvtier {
namespace {

using testing::TempDir;

constexpr uint64_t kNs = 0x1234;

G4Options FsOptions(const std::string& dir) {
  G4Options o;
  o.backend = G4Options::Backend::kFs;
  o.dir = dir;
  o.write_through = true;
  o.lookup_deadline_ms = 5000;
  o.load_deadline_ms = 5000;
  o.save_deadline_ms = 5000;
  o.threads = 1;
  o.max_queued_saves = 16;
  return o;
}

std::vector<BlockKey> Keys(int n) {
  std::vector<BlockKey> keys;
  for (int i = 0; i < n; ++i) keys.push_back(BlockKey{uint64_t(i + 1), uint64_t(100 + i)});
  return keys;
}

void PutObjects(RemoteStore* store, std::span<const BlockKey> keys) {
  const std::vector<uint8_t> bytes(64, 7);
  std::vector<RemotePut> puts;
  std::vector<std::string> names;
  for (const BlockKey& k : keys) names.push_back(RemoteObjectName(kNs, k));
  for (const std::string& n : names) puts.push_back(RemotePut{n, bytes});
  std::vector<Status> results(puts.size());
  store->Put(puts, RemoteClock::now() + std::chrono::seconds(5), results);
  for (const Status& s : results) ASSERT_TRUE(s.ok()) << s.ToString();
}

ManagerStats StatsOf(const G4Path& g4) {
  ManagerStats s;
  g4.FillStats(&s);
  return s;
}

TEST(G4PathTest, NoBackendIsNoG4) {
  Result<std::unique_ptr<G4Path>> g4 = G4Path::Open(G4Options{}, 4096, 16, nullptr);
  ASSERT_TRUE(g4.ok()) << g4.status().ToString();
  EXPECT_EQ(*g4, nullptr);
}

TEST(G4PathTest, AStoreThatCannotOpenIsLeftOutAMalformedEndpointIsRefused) {
  G4Options o = FsOptions("/proc/kvtier-no-such-dir/g4");
  Result<std::unique_ptr<G4Path>> fs = G4Path::Open(o, 4096, 16, nullptr);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_EQ(*fs, nullptr) << "a worker runs on without a G4 that cannot open";

  G4Options r;
  r.backend = G4Options::Backend::kRedis;
  r.endpoints = {"127.0.0.1:notaport"};
  Result<std::unique_ptr<G4Path>> redis = G4Path::Open(r, 4096, 16, nullptr);
  ASSERT_FALSE(redis.ok());
  EXPECT_TRUE(redis.status().Is(StatusCode::kInvalidArgument)) << redis.status().ToString();
}

TEST(G4PathTest, MatchCountsTheLeadingObjectsInTheirNamespace) {
  TempDir dir;
  auto g4 = G4Path::Open(FsOptions(dir.path()), 4096, 16, nullptr);
  ASSERT_TRUE(g4.ok() && *g4 != nullptr);
  const std::vector<BlockKey> keys = Keys(5);
  PutObjects((*g4)->store(), std::span<const BlockKey>(keys).first(3));
  EXPECT_EQ((*g4)->Match(keys, kNs), 3u);
  EXPECT_EQ((*g4)->Match(keys, kNs + 1), 0u) << "another namespace shares nothing";
  EXPECT_EQ(StatsOf(**g4).g4_lookup_blocks, 3u);
  EXPECT_TRUE(StatsOf(**g4).g4_enabled);
}

// A corrupt or vanished object is never offered again (Match stops before it, without asking)
// until this manager writes the block again; a transient failure rejects nothing.
TEST(G4PathTest, AFailedLoadStopsTheOfferUntilTheBlockIsWrittenAgain) {
  TempDir dir;
  auto g4 = G4Path::Open(FsOptions(dir.path()), 4096, 16, nullptr);
  ASSERT_TRUE(g4.ok() && *g4 != nullptr);
  G4Path& p = **g4;
  p.StartRemover();
  const std::vector<BlockKey> keys = Keys(4);
  PutObjects(p.store(), keys);
  ASSERT_EQ(p.Match(keys, kNs), 4u);

  p.LoadFailed(keys[2], kNs, Status::TimedOut("late"));
  EXPECT_EQ(p.Match(keys, kNs), 4u) << "a late load is not the object's fault";
  EXPECT_FALSE(p.Rejected(keys[2]));

  p.LoadFailed(keys[2], kNs, Status::NotFound("gone"));
  EXPECT_TRUE(p.Rejected(keys[2]));
  EXPECT_EQ(p.FirstRejected(keys), 2u);
  EXPECT_EQ(p.Match(keys, kNs), 2u);

  p.Written(keys[2]);
  EXPECT_FALSE(p.Rejected(keys[2]));
  EXPECT_EQ(p.Match(keys, kNs), 4u);

  const ManagerStats s = StatsOf(p);
  EXPECT_EQ(s.g4_load_failures, 2u);
  EXPECT_EQ(s.g4_corrupt_blocks, 0u);
  EXPECT_EQ(s.g4_saved_blocks, 1u);
  EXPECT_EQ(s.g4_rejected_keys, 0u);
}

// A corrupt object is also deleted from the store, off the caller's thread.
TEST(G4PathTest, ACorruptObjectIsRemovedFromTheStore) {
  TempDir dir;
  auto g4 = G4Path::Open(FsOptions(dir.path()), 4096, 16, nullptr);
  ASSERT_TRUE(g4.ok() && *g4 != nullptr);
  G4Path& p = **g4;
  p.StartRemover();
  const std::vector<BlockKey> keys = Keys(2);
  PutObjects(p.store(), keys);
  p.LoadFailed(keys[0], kNs, Status::Corruption("bad checksum"));
  EXPECT_EQ(StatsOf(p).g4_corrupt_blocks, 1u);
  const auto t0 = std::chrono::steady_clock::now();
  while (StatsOf(p).g4_removed_corrupt == 0 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(StatsOf(p).g4_removed_corrupt, 1u);
  std::vector<std::string> names{RemoteObjectName(kNs, keys[0]), RemoteObjectName(kNs, keys[1])};
  std::vector<uint8_t> present(2, 0);
  ASSERT_TRUE(
      p.store()->Contains(names, RemoteClock::now() + std::chrono::seconds(5), present).ok());
  EXPECT_EQ(present[0], 0) << "the corrupt object was deleted";
  EXPECT_EQ(present[1], 1) << "and only it";
  p.StopRemover();
  EXPECT_EQ(StatsOf(p).g4_removed_corrupt, 1u) << "the count outlives the remover";
}

TEST(G4PathTest, WritesInFlightAndTheirOutcomesAreCounted) {
  TempDir dir;
  auto g4 = G4Path::Open(FsOptions(dir.path()), 4096, 16, nullptr);
  ASSERT_TRUE(g4.ok() && *g4 != nullptr);
  G4Path& p = **g4;
  p.BeginWrite();
  p.BeginWrite();
  p.BeginWrite();
  EXPECT_EQ(p.writes_in_flight(), 3u);
  p.Written(Keys(1)[0]);
  p.EndWrite();
  p.WriteFailed();
  p.EndWrite();
  p.Dropped(1);
  p.EndWrite();
  EXPECT_EQ(p.writes_in_flight(), 0u);
  const ManagerStats s = StatsOf(p);
  EXPECT_EQ(s.g4_saved_blocks, 1u);
  EXPECT_EQ(s.g4_save_failures, 1u);
  EXPECT_EQ(s.g4_dropped_saves, 1u);
}

// g4.load_gbps with g4.recompute_tokens_per_s: G4 is skipped (and the skip counted) only when
// a block loads slower than it recomputes.
TEST(G4PathTest, LookupsAreSkippedOnlyWhenLoadingIsSlowerThanRecomputing) {
  TempDir dir;
  G4Options o = FsOptions(dir.path());
  // 1 MiB block at 1 GB/s: ~1 ms to load; 16 tokens at 1000 tokens/s: 16 ms to recompute.
  o.load_gbps = 1;
  o.recompute_tokens_per_s = 1000;
  auto fast = G4Path::Open(o, 1 << 20, 16, nullptr);
  ASSERT_TRUE(fast.ok() && *fast != nullptr);
  EXPECT_FALSE((*fast)->SkipLookup());
  EXPECT_EQ(StatsOf(**fast).g4_skipped_lookups, 0u);
  o.recompute_tokens_per_s = 1e6;  // 16 us to recompute
  auto slow = G4Path::Open(o, 1 << 20, 16, nullptr);
  ASSERT_TRUE(slow.ok() && *slow != nullptr);
  EXPECT_TRUE((*slow)->SkipLookup());
  EXPECT_EQ(StatsOf(**slow).g4_skipped_lookups, 1u);
}

}  // namespace
}  // namespace kvtier

// Warm restart of the disk tier: the clean-shutdown snapshot (used once), the header scan, a
// kill -9 in the middle of a stream of writes, on-disk corruption found at open, and the
// `kvtier inspect` report of the same directories.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cli_run.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "disk_test_util.h"
#include "tier/disk_recovery.h"
#include "tier/disk_tier.h"

namespace kvtier {
namespace {

using namespace kvtier::testing;

constexpr uint64_t kPayload = 12288;

// Block ids are recovered from keys by lookup, so tests can check every recovered block's
// payload against what was written.
std::unordered_map<BlockKey, uint64_t, BlockKeyHash> KeyIndex(uint64_t n) {
  std::unordered_map<BlockKey, uint64_t, BlockKeyHash> m;
  for (uint64_t i = 0; i < n; ++i) m[TestKey(i)] = i;
  return m;
}

void FlipByteOnDisk(const std::string& path, uint64_t offset) {
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b = 0;
  ASSERT_EQ(pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
  b ^= 0x10;
  ASSERT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
  fsync(fd);
  close(fd);
}

std::string RunCli(const std::string& args) {
  return cli_run::RunShell(std::string(KVTIER_CLI_PATH) + " " + args + " 2>&1").out;
}

TEST(DiskRecovery, CleanRestartKeepsEveryBlockFromTheSnapshot) {
  TempDir dir;
  const DiskTier::Config config = TestConfig(dir.path(), kPayload, 256);
  constexpr uint64_t kBlocks = 200;
  {
    auto opened = OpenOrDie(config);
    AlignedBuffer buf(opened.tier->io_bytes());
    for (uint64_t i = 0; i < kBlocks; ++i)
      ASSERT_TRUE(WriteBlock(opened.tier.get(), i, buf.data()).ok());
    ASSERT_TRUE(opened.tier->Close().ok());
  }
  ASSERT_TRUE(std::filesystem::exists(dir.sub("snapshot.kvt")));
  auto opened = OpenOrDie(config);
  const DiskTierStats s = opened.tier->stats();
  EXPECT_TRUE(s.recovered_from_snapshot);
  EXPECT_FALSE(std::filesystem::exists(dir.sub("snapshot.kvt"))) << "used once";
  ASSERT_GE(opened.recovered.size(), kBlocks * 99 / 100);
  EXPECT_EQ(opened.recovered.size(), kBlocks);
  const auto index = KeyIndex(kBlocks);
  AlignedBuffer buf(opened.tier->io_bytes());
  for (const RecoveredBlock& b : opened.recovered) {
    ASSERT_TRUE(index.contains(b.key));
    const uint64_t i = index.at(b.key);
    EXPECT_EQ(b.parent, TestParent(i));
    EXPECT_EQ(b.namespace_id, kTestNamespace);
    EXPECT_EQ(b.tokens, TestTokens(i));
    bool wrong = true;
    ASSERT_TRUE(ReadBlock(opened.tier.get(), i, buf.data(), &wrong).ok());
    EXPECT_FALSE(wrong);
  }
  EXPECT_EQ(opened.tier->stats().verify_failures, 0u);
  // New writes after a restart get newer generations than anything recovered.
  ASSERT_TRUE(opened.tier->Remove(TestKey(0)).ok());
  ASSERT_TRUE(WriteBlock(opened.tier.get(), 0, buf.data()).ok());
  ASSERT_TRUE(ReadBlock(opened.tier.get(), 0, buf.data()).ok());
}

TEST(DiskRecovery, WithoutSnapshotTheScanFindsEveryCompleteBlock) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 64);
  config.snapshot_on_close = false;  // as after a crash
  ASSERT_NO_FATAL_FAILURE(WriteBlocksAndClose(config, 40));
  auto opened = OpenOrDie(config);
  const DiskTierStats s = opened.tier->stats();
  EXPECT_FALSE(s.recovered_from_snapshot);
  EXPECT_EQ(s.recovered_blocks, 40u);
  EXPECT_EQ(s.scan_corrupt, 0u);
  AlignedBuffer buf(opened.tier->io_bytes());
  for (uint64_t i = 0; i < 40; ++i) {
    bool wrong = true;
    ASSERT_TRUE(ReadBlock(opened.tier.get(), i, buf.data(), &wrong).ok()) << i;
    EXPECT_FALSE(wrong);
  }
}

// The header scan reports its progress through the callback (a tool shows it; the tier never
// writes to a terminal): non-decreasing counts of the geometry's slots, ending at all of them.
TEST(DiskRecovery, ScanReportsProgressToTheCallback) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 64);
  config.snapshot_on_close = false;
  ASSERT_NO_FATAL_FAILURE(WriteBlocksAndClose(config, 10));
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  DiskTier::OpenOptions options;
  options.recovery_progress = [&calls](uint64_t scanned, uint64_t total) {
    calls.emplace_back(scanned, total);
  };
  auto opened = OpenOrDie(config, options);
  EXPECT_EQ(opened.recovered.size(), 10u);
  ASSERT_FALSE(calls.empty()) << "the scan never reported progress";
  const uint64_t slots = opened.tier->num_slots();
  EXPECT_EQ(calls.back(), std::make_pair(slots, slots));
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_LE(calls[i - 1].first, calls[i].first);
  // A clean restart (snapshot) does not scan: no progress to report.
  opened.tier.reset();
  config.snapshot_on_close = true;
  { auto again = OpenOrDie(config); }
  calls.clear();
  auto from_snapshot = OpenOrDie(config, options);
  EXPECT_TRUE(from_snapshot.tier->stats().recovered_from_snapshot);
  EXPECT_TRUE(calls.empty());
}

TEST(DiskRecovery, SnapshotIsNeverUsedTwice) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 16);
  ASSERT_NO_FATAL_FAILURE(WriteBlocksAndClose(config, 4));
  // Restart from the snapshot, change the contents, then "crash" (no snapshot written).
  config.snapshot_on_close = false;
  {
    auto opened = OpenOrDie(config);
    EXPECT_TRUE(opened.tier->stats().recovered_from_snapshot);
    ASSERT_TRUE(opened.tier->Remove(TestKey(0)).ok());
    AlignedBuffer buf(opened.tier->io_bytes());
    ASSERT_TRUE(WriteBlock(opened.tier.get(), 10, buf.data()).ok());
  }
  auto opened = OpenOrDie(config);
  EXPECT_FALSE(opened.tier->stats().recovered_from_snapshot) << "the old table is gone";
  EXPECT_TRUE(opened.tier->Contains(TestKey(10))) << "the scan sees the write made after it";
}

TEST(DiskRecovery, DamagedOrForeignSnapshotFallsBackToTheScan) {
  TempDir dir;
  const DiskTier::Config config = TestConfig(dir.path(), kPayload, 32);
  auto write_and_close = [&](uint64_t n) {
    auto opened = OpenOrDie(config);
    AlignedBuffer buf(opened.tier->io_bytes());
    for (uint64_t i = 0; i < n; ++i) {
      Status s = WriteBlock(opened.tier.get(), i, buf.data());
      ASSERT_TRUE(s.ok() || s.Is(StatusCode::kAlreadyExists)) << s.ToString();
    }
  };
  write_and_close(10);
  FlipByteOnDisk(dir.sub("snapshot.kvt"), 60);
  {
    auto opened = OpenOrDie(config);
    EXPECT_FALSE(opened.tier->stats().recovered_from_snapshot);
    EXPECT_EQ(opened.recovered.size(), 10u);
  }
  // A truncated snapshot.
  std::filesystem::resize_file(dir.sub("snapshot.kvt"), 30);
  {
    auto opened = OpenOrDie(config);
    EXPECT_FALSE(opened.tier->stats().recovered_from_snapshot);
    EXPECT_EQ(opened.recovered.size(), 10u);
  }
  // A valid snapshot of another formatting of the directory.
  Snapshot foreign;
  foreign.tier_id = 12345;
  foreign.blocks.push_back(RecoveredBlock{TestKey(99), TestParent(99), 0, 3, 1, {}});
  ASSERT_TRUE(WriteSnapshot(dir.sub("snapshot.kvt"), foreign).ok());
  auto opened = OpenOrDie(config);
  EXPECT_FALSE(opened.tier->stats().recovered_from_snapshot);
  EXPECT_FALSE(opened.tier->Contains(TestKey(99)));
  EXPECT_EQ(opened.recovered.size(), 10u);
}

TEST(DiskRecovery, SnapshotParserRefusesBadLengths) {
  TempDir dir;
  const std::string path = dir.sub("snap");
  Snapshot s{.tier_id = 1, .geometry_hash = 2, .next_generation = 3, .files = {}, .blocks = {}};
  s.blocks.push_back(RecoveredBlock{TestKey(1), TestParent(1), 5, 2, 7, TestTokens(1)});
  s.blocks.push_back(RecoveredBlock{TestKey(2), TestParent(2), 5, 3, 8, TestTokens(2)});
  ASSERT_TRUE(WriteSnapshot(path, s).ok());
  auto back = ReadSnapshot(path, 8);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->blocks.size(), 2u);
  EXPECT_EQ(back->blocks[1].tokens, TestTokens(2));
  EXPECT_EQ(back->next_generation, 3u);
  // Slot 3 does not exist in a 3-slot tier.
  EXPECT_TRUE(ReadSnapshot(path, 3).status().Is(StatusCode::kCorruption));
  // Repeated slots and keys.
  s.blocks[1].slot = 2;
  ASSERT_TRUE(WriteSnapshot(path, s).ok());
  EXPECT_TRUE(ReadSnapshot(path, 8).status().Is(StatusCode::kCorruption));
  s.blocks[1].slot = 3;
  s.blocks[1].key = s.blocks[0].key;
  ASSERT_TRUE(WriteSnapshot(path, s).ok());
  EXPECT_TRUE(ReadSnapshot(path, 8).status().Is(StatusCode::kCorruption));
  EXPECT_TRUE(ReadSnapshot(dir.sub("absent"), 8).status().Is(StatusCode::kNotFound));
  // Garbage of every length up to a few entries: refused, never a crash.
  for (size_t len = 0; len < 400; len += 7) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << std::string(len, '\xff');
    EXPECT_FALSE(ReadSnapshot(path, 8).ok()) << len;
  }
}

// The parser's checks that sit behind a valid checksum: each case edits a valid snapshot's bytes
// and forges the checksum again (as the block header tests do), so the check itself must refuse
// it, with its own message. Removing any one check fails one of these.
TEST(DiskRecovery, SnapshotParserRefusesForgedFieldsBehindAValidChecksum) {
  TempDir dir;
  const std::string path = dir.sub("snap");
  Snapshot s{.tier_id = 1, .geometry_hash = 2, .next_generation = 3, .files = {}, .blocks = {}};
  s.files.push_back(FileIdentity{11, 12, 13, 14});
  s.blocks.push_back(RecoveredBlock{TestKey(1), TestParent(1), 5, 2, 7, TestTokens(1)});
  s.blocks.push_back(RecoveredBlock{TestKey(2), TestParent(2), 5, 3, 8, TestTokens(2)});
  ASSERT_TRUE(WriteSnapshot(path, s).ok());
  std::string good;
  {
    std::ifstream in(path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto back = ReadSnapshot(path, 8);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->files.size(), 1u);
  EXPECT_EQ(back->files[0], (FileIdentity{11, 12, 13, 14}));
  // Layout (disk_recovery.cc): a 48-byte header (version at 8, file_count at 12, entry_count at
  // 40), 32 bytes per file record, then entries of 56 bytes (token_count at 4) and their tokens,
  // then the checksum.
  constexpr size_t kVersion = 8, kFileCount = 12, kEntryCount = 40, kFirstEntry = 48 + 32;
  auto forged = [&](const std::function<void(std::string*)>& edit) {
    std::string body = good.substr(0, good.size() - 8);
    edit(&body);
    const uint64_t sum = XXH3_64bits(body.data(), body.size());
    body.append(reinterpret_cast<const char*>(&sum), 8);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << body;
    return ReadSnapshot(path, 8).status();
  };
  auto put32 = [](std::string* b, size_t at, uint32_t v) { std::memcpy(b->data() + at, &v, 4); };
  auto put64 = [](std::string* b, size_t at, uint64_t v) { std::memcpy(b->data() + at, &v, 8); };
  struct Case {
    const char* what;
    std::function<void(std::string*)> edit;
    const char* message;
  };
  const Case cases[] = {
      {"wrong version", [&](std::string* b) { put32(b, kVersion, 1); }, "not a snapshot of this"},
      {"more entries than slots", [&](std::string* b) { put64(b, kEntryCount, 9); },
       "9 entries for 8 slots"},
      {"more file records than files may be", [&](std::string* b) { put32(b, kFileCount, 257); },
       "257 file records"},
      {"file records past the end", [&](std::string* b) { put32(b, kFileCount, 200); },
       "truncated file records"},
      {"an entry past the end", [&](std::string* b) { put64(b, kEntryCount, 3); },
       "truncated entry"},
      {"a token count above the maximum",
       [&](std::string* b) { put32(b, kFirstEntry + 4, KvLayout::kMaxTokensPerBlock + 1); },
       "bad token count"},
      {"tokens past the end", [&](std::string* b) { put32(b, kFirstEntry + 4, 1000); },
       "bad token count"},
      {"trailing bytes", [&](std::string* b) { b->append(4, '\0'); }, "trailing bytes"},
  };
  for (const Case& c : cases) {
    const Status st = forged(c.edit);
    EXPECT_TRUE(st.Is(StatusCode::kCorruption)) << c.what << ": " << st.ToString();
    EXPECT_NE(st.message().find(c.message), std::string::npos) << c.what << ": " << st.ToString();
  }
  EXPECT_TRUE(forged([](std::string*) {}).ok()) << "the unedited bytes still parse";
  // A token count above the maximum whose tokens are all there (the writer does not check).
  Snapshot big = s;
  big.blocks[1].tokens.assign(KvLayout::kMaxTokensPerBlock + 1, 7);
  ASSERT_TRUE(WriteSnapshot(path, big).ok());
  const Status st = ReadSnapshot(path, 8).status();
  EXPECT_NE(st.message().find("bad token count"), std::string::npos) << st.ToString();
}

TEST(DiskRecovery, CorruptSlotsFoundAtOpenAreNeverServed) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 32);
  config.snapshot_on_close = false;
  uint32_t header_slot = 0, payload_slot = 0;
  {
    auto opened = OpenOrDie(config);
    AlignedBuffer buf(opened.tier->io_bytes());
    for (uint64_t i = 0; i < 10; ++i)
      ASSERT_TRUE(WriteBlock(opened.tier.get(), i, buf.data()).ok());
    header_slot = 0;  // block 0 took slot 0, block 1 slot 1
    payload_slot = 1;
  }
  const DiskGeometry g =
      *DiskGeometry::For(config.capacity_bytes, kPayload, kBlockHeaderBytes, 1, kTestLayout);
  FlipByteOnDisk(dir.sub("g3-0000.kvt"), g.OffsetOf(header_slot) + 40);  // key
  FlipByteOnDisk(dir.sub("g3-0000.kvt"), g.OffsetOf(payload_slot) + kBlockHeaderBytes + 5);
  // What an operator sees: inspect reads every payload, so both damaged blocks show.
  const std::string report = RunCli("inspect " + dir.path() + " --json");
  EXPECT_NE(report.find("\"blocks\": 8"), std::string::npos) << report;
  EXPECT_NE(report.find("\"corrupt_blocks\": 2"), std::string::npos) << report;
  EXPECT_NE(report.find("\"bytes\": " + std::to_string(8 * kPayload)), std::string::npos) << report;
  EXPECT_NE(report.find("\"format_version\": 2"), std::string::npos) << report;
  EXPECT_NE(report.find("\"blocks_by_format_version\": {\"1\": 0, \"2\": 8}"), std::string::npos)
      << report;
  EXPECT_NE(report.find("slot 0: bad-header"), std::string::npos) << report;
  EXPECT_NE(report.find("slot 1: bad-payload"), std::string::npos) << report;
  const std::string headers = RunCli("inspect " + dir.path() + " --json --headers-only");
  EXPECT_NE(headers.find("\"blocks\": 9"), std::string::npos) << headers;
  EXPECT_NE(headers.find("\"corrupt_blocks\": 1"), std::string::npos) << headers;
  const std::string text = RunCli("inspect " + dir.path());
  EXPECT_NE(text.find("corrupt blocks   2 (bad-header 1, bad-payload 1)"), std::string::npos)
      << text;
  EXPECT_NE(RunCli("inspect " + dir.sub("nothing-here")).find("kvtier"), std::string::npos);

  auto opened = OpenOrDie(config);
  const DiskTierStats s = opened.tier->stats();
  EXPECT_EQ(s.scan_corrupt, 1u) << "the header that does not verify";
  EXPECT_EQ(opened.recovered.size(), 9u) << "the payload damage is found when read";
  AlignedBuffer buf(opened.tier->io_bytes());
  EXPECT_TRUE(ReadBlock(opened.tier.get(), 0, buf.data()).Is(StatusCode::kNotFound));
  EXPECT_TRUE(ReadBlock(opened.tier.get(), 1, buf.data()).Is(StatusCode::kCorruption));
  EXPECT_FALSE(opened.tier->Contains(TestKey(1)));
  for (uint64_t i = 2; i < 10; ++i) {
    bool wrong = true;
    ASSERT_TRUE(ReadBlock(opened.tier.get(), i, buf.data(), &wrong).ok());
    EXPECT_FALSE(wrong);
  }
  EXPECT_EQ(opened.tier->stats().free_slots, 32u - 8u);
}

TEST(DiskRecovery, DamagedSuperblockIsReportedThenReformatted) {
  TempDir dir;
  const DiskTier::Config config = TestConfig(dir.path(), kPayload, 8);
  {
    auto opened = OpenOrDie(config);
    AlignedBuffer buf(opened.tier->io_bytes());
    ASSERT_TRUE(WriteBlock(opened.tier.get(), 0, buf.data()).ok());
  }
  FlipByteOnDisk(dir.sub("g3-0000.kvt"), 20);
  const std::string report = RunCli("inspect " + dir.path());
  EXPECT_NE(report.find("superblock checksum mismatch"), std::string::npos) << report;
  auto opened = OpenOrDie(config);
  EXPECT_TRUE(opened.tier->stats().reformatted);
  EXPECT_TRUE(opened.recovered.empty());
  EXPECT_FALSE(std::filesystem::exists(dir.sub("snapshot.kvt")));
}

TEST(DiskRecovery, InspectReportsATruncatedFile) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 8);
  ASSERT_NO_FATAL_FAILURE(WriteBlocksAndClose(config, 8));
  const DiskGeometry g =
      *DiskGeometry::For(config.capacity_bytes, kPayload, kBlockHeaderBytes, 1, kTestLayout);
  std::filesystem::resize_file(dir.sub("g3-0000.kvt"), g.OffsetOf(5) + 100);
  const std::string report = RunCli("inspect " + dir.path() + " --json");
  EXPECT_NE(report.find("\"blocks\": 5"), std::string::npos) << report;
  EXPECT_NE(report.find("\"missing_slots\": 3"), std::string::npos) << report;
  EXPECT_NE(report.find("\"snapshot\": \"valid (8 blocks)\""), std::string::npos) << report;
}

// Reads the 12 blocks written by TruncatedAndExtended* back: how many are served intact, how many
// are misses; none may be served wrong.
void CountReads(DiskTier* tier, uint64_t n, uint64_t* served, uint64_t* missing) {
  AlignedBuffer buf(tier->io_bytes());
  for (uint64_t i = 0; i < n; ++i) {
    bool wrong = true;
    const Status r = ReadBlock(tier, i, buf.data(), &wrong);
    if (r.ok()) {
      EXPECT_FALSE(wrong) << "block " << i;
      ++*served;
    } else {
      EXPECT_TRUE(r.Is(StatusCode::kNotFound)) << "block " << i << ": " << r.ToString();
      ++*missing;
    }
  }
}

// A slot file truncated and extended back to its size between two runs: same inode, same size,
// but the slots past the cut are zeros now. The snapshot used to be trusted for them (every read
// then failed verification, and enough of those quarantine the whole tier); now the file is not
// the one the snapshot saw (less allocated, changed since), so its slots are scanned, and the
// other file's still come from the snapshot.
TEST(DiskRecovery, TruncatedAndExtendedBetweenRunsIsScannedNotTrusted) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 32);
  config.num_files = 2;
  uint64_t cut = 0;
  {
    auto opened = OpenOrDie(config);
    AlignedBuffer buf(opened.tier->io_bytes());
    for (uint64_t i = 0; i < 12; ++i)
      ASSERT_TRUE(WriteBlock(opened.tier.get(), i, buf.data()).ok());
    cut = opened.tier->geometry().OffsetOf(8);  // file 0 keeps its slots 0, 2, 4, 6
  }
  const std::string file0 = dir.sub("g3-0000.kvt");
  const auto full = std::filesystem::file_size(file0);
  ASSERT_EQ(truncate(file0.c_str(), static_cast<off_t>(cut)), 0);
  ASSERT_EQ(truncate(file0.c_str(), static_cast<off_t>(full)), 0);
  ASSERT_EQ(std::filesystem::file_size(file0), full) << "same size again";

  auto opened = OpenOrDie(config);
  const DiskTierStats s = opened.tier->stats();
  EXPECT_TRUE(s.recovered_from_snapshot) << "file 1 is unchanged: its slots come from it";
  EXPECT_EQ(s.files_rescanned, 1u);
  uint64_t served = 0, missing = 0;
  CountReads(opened.tier.get(), 12, &served, &missing);
  EXPECT_EQ(missing, 2u) << "the two blocks past the cut";
  EXPECT_EQ(served, 10u);
  EXPECT_EQ(opened.tier->stats().verify_failures, 0u) << "no zeroed slot was trusted";
  EXPECT_FALSE(opened.tier->stats().quarantined);
}

// The same damage while the tier runs, between two health checks (none sees a short file): the
// snapshot written at close records the file as damaged (a preallocated file holding less than
// its size), so the restart scans it.
TEST(DiskRecovery, TruncatedAndExtendedWhileRunningIsScannedAtTheRestart) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 32);
  config.num_files = 2;
  {
    auto opened = OpenOrDie(config);
    ASSERT_FALSE(opened.tier->stats().sparse_files) << "the check needs preallocated files";
    AlignedBuffer buf(opened.tier->io_bytes());
    for (uint64_t i = 0; i < 12; ++i)
      ASSERT_TRUE(WriteBlock(opened.tier.get(), i, buf.data()).ok());
    const std::string file0 = dir.sub("g3-0000.kvt");
    const auto full = std::filesystem::file_size(file0);
    ASSERT_EQ(truncate(file0.c_str(), static_cast<off_t>(opened.tier->geometry().OffsetOf(8))), 0);
    ASSERT_EQ(truncate(file0.c_str(), static_cast<off_t>(full)), 0);
  }
  auto opened = OpenOrDie(config);
  EXPECT_EQ(opened.tier->stats().files_rescanned, 1u);
  uint64_t served = 0, missing = 0;
  CountReads(opened.tier.get(), 12, &served, &missing);
  EXPECT_EQ(missing, 2u);
  EXPECT_EQ(served, 10u);
  EXPECT_EQ(opened.tier->stats().verify_failures, 0u);
}

TEST(DiskRecovery, NewestCopyOfAKeyWins) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 8);
  config.snapshot_on_close = false;
  uint32_t newest_slot = 0;
  {
    auto opened = OpenOrDie(config);
    AlignedBuffer buf(opened.tier->io_bytes());
    // Block 3 in slot 0; removed; written again into another slot (freed slots are reused
    // last-in first-out, so 4's slot goes first). Slot 0 still holds the older copy.
    ASSERT_TRUE(WriteBlock(opened.tier.get(), 3, buf.data()).ok());
    ASSERT_TRUE(WriteBlock(opened.tier.get(), 4, buf.data()).ok());
    ASSERT_TRUE(opened.tier->Remove(TestKey(3)).ok());
    ASSERT_TRUE(opened.tier->Remove(TestKey(4)).ok());
    ASSERT_TRUE(WriteBlock(opened.tier.get(), 3, buf.data()).ok());
    DiskOpWaiter w;
    const std::vector<TokenId> t = TestTokens(3);
    DiskReadRequest r = TestRead(3, t, buf.data(), &w);
    opened.tier->SubmitReads({&r, 1});
    const DiskOpResult res = w.Take(1)[0];
    ASSERT_TRUE(res.status.ok());
    newest_slot = res.slot;
  }
  EXPECT_NE(newest_slot, 0u);
  auto opened = OpenOrDie(config);
  EXPECT_EQ(opened.tier->stats().scan_duplicates, 1u);
  bool found = false;
  for (const RecoveredBlock& b : opened.recovered) {
    if (b.key == TestKey(3)) {
      found = true;
      EXPECT_EQ(b.slot, newest_slot);
    }
  }
  EXPECT_TRUE(found);
  AlignedBuffer buf(opened.tier->io_bytes());
  ASSERT_TRUE(ReadBlock(opened.tier.get(), 3, buf.data()).ok());
}

// ---- kill -9 in the middle of a stream of writes ----

// The child side: started by the test below as a separate process (this binary, re-executed),
// it writes blocks forever, batch after batch, recycling slots, until it is killed.
TEST(DiskRecoveryChild, WriteForever) {
  const char* dir = std::getenv("KVTIER_CRASH_CHILD_DIR");
  if (dir == nullptr) GTEST_SKIP() << "only runs as the child of KillDuringWrites";
  DiskTier::Config config = TestConfig(dir, kPayload, 48);
  auto opened = OpenOrDie(config);
  DiskTier* tier = opened.tier.get();
  for (const RecoveredBlock& b : opened.recovered) (void)tier->Remove(b.key);
  constexpr uint32_t kBatch = 8;
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  for (uint32_t b = 0; b < kBatch; ++b)
    bufs.push_back(std::make_unique<AlignedBuffer>(tier->io_bytes()));
  std::vector<std::vector<TokenId>> tokens(kBatch);
  uint64_t next = std::strtoull(std::getenv("KVTIER_CRASH_CHILD_FIRST"), nullptr, 10);
  std::ofstream(std::string(dir) + "/child-started") << "1";
  DiskOpWaiter waiter;
  for (uint64_t round = 0;; ++round) {
    std::vector<DiskWriteRequest> writes(kBatch);
    for (uint32_t b = 0; b < kBatch; ++b) {
      writes[b] = TestWrite(next + b, tokens[b], bufs[b]->data(), kPayload, &waiter);
    }
    tier->SubmitWrites(writes);
    (void)waiter.Take(kBatch);
    // Keep the tier about two-thirds full so slots are constantly rewritten.
    if (next >= 32) {
      for (uint32_t b = 0; b < kBatch; ++b) (void)tier->Remove(TestKey(next - 32 + b));
    }
    next += kBatch;
  }
}

TEST(DiskRecovery, KillDuringWritesServesOnlyVerifiedBlocks) {
  TempDir dir;
  const std::string tier_dir = dir.sub("g3");
  uint64_t first = 0;
  uint64_t total_recovered = 0, total_served = 0;
  for (int round = 0; round < 4; ++round) {
    std::filesystem::remove(tier_dir + "/child-started");
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setenv("KVTIER_CRASH_CHILD_DIR", tier_dir.c_str(), 1);
      setenv("KVTIER_CRASH_CHILD_FIRST", std::to_string(first).c_str(), 1);
      const int log =
          open((dir.path() + "/child.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (log >= 0) {
        dup2(log, 1);
        dup2(log, 2);
      }
      execl("/proc/self/exe", "disk_recovery_test", "--gtest_filter=DiskRecoveryChild.WriteForever",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(tier_dir + "/child-started") &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(std::filesystem::exists(tier_dir + "/child-started")) << "child did not start";
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + 70 * round));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child must have been killed, status " << status;

    DiskTier::Config config = TestConfig(tier_dir, kPayload, 48);
    config.snapshot_on_close = false;
    auto opened = OpenOrDie(config);
    EXPECT_FALSE(opened.tier->stats().recovered_from_snapshot);
    AlignedBuffer buf(opened.tier->io_bytes());
    uint64_t max_id = first;
    for (const RecoveredBlock& b : opened.recovered) {
      // Ids are recovered from the tokens, which the header carries: token 0 = id * 131.
      ASSERT_EQ(b.tokens.size(), kTestTokensPerBlock);
      const uint64_t i = b.tokens[0] / 131;
      ASSERT_EQ(b.key, TestKey(i)) << "recovered metadata is self-consistent";
      bool wrong = true;
      Status s = ReadBlock(opened.tier.get(), i, buf.data(), &wrong);
      if (s.ok()) {
        ++total_served;
        ASSERT_FALSE(wrong) << "a torn or stale block was served, id " << i;
      } else {
        // A torn write (header landed, payload did not) is found here, never served.
        ASSERT_TRUE(s.Is(StatusCode::kCorruption)) << s.ToString();
      }
      max_id = std::max(max_id, i + 1);
    }
    total_recovered += opened.recovered.size();
    EXPECT_GT(opened.recovered.size(), 0u);
    first = max_id + 1000;  // the next child writes new ids
  }
  EXPECT_GT(total_served, 0u);
  std::printf("kill -9 rounds: %llu blocks recovered, %llu served, all verified\n",
              static_cast<unsigned long long>(total_recovered),
              static_cast<unsigned long long>(total_served));
}

}  // namespace
}  // namespace kvtier

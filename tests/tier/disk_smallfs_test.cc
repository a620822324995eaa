// DiskTier on a real, small filesystem: a size-limited tmpfs mounted by the test (tmpfs takes
// O_DIRECT since Linux 6.6). ENOSPC at open and while writing, a file truncated or deleted
// underneath, for real rather than injected. Needs CAP_SYS_ADMIN to mount; skipped with the
// reason otherwise.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "disk_test_util.h"
#include "tier/disk_tier.h"

namespace kvtier {
namespace {

using namespace kvtier::testing;

constexpr uint64_t kPayload = 1u << 20;  // 1 MiB blocks

// A tmpfs of `bytes` mounted on a fresh directory; unmounted (lazily) at destruction.
class SmallFs {
 public:
  explicit SmallFs(uint64_t bytes) {
    const std::string options = "size=" + std::to_string(bytes) + ",mode=0700";
    if (mount("kvtier-test", dir_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) !=
        0) {
      error_ = std::string("mount tmpfs: ") + std::strerror(errno);
      return;
    }
    mounted_ = true;
    // tmpfs refuses O_DIRECT before Linux 6.6.
    const std::string probe = dir_.sub("probe");
    const int fd = open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd < 0) {
      error_ = std::string("tmpfs refuses O_DIRECT (Linux < 6.6?): ") + std::strerror(errno);
      return;
    }
    close(fd);
    unlink(probe.c_str());
  }
  ~SmallFs() {
    if (mounted_) umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::string path() const { return dir_.sub("g3"); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string error_;
};

#define REQUIRE_SMALL_FS(fs)                                                              \
  if (!(fs).ok()) {                                                                       \
    GTEST_SKIP() << "SKIPPED (no small filesystem for the real ENOSPC/truncation test): " \
                 << (fs).error();                                                         \
  }

TEST(DiskSmallFs, CapacityBeyondTheFilesystemIsRefusedClearly) {
  SmallFs fs(8u << 20);
  REQUIRE_SMALL_FS(fs);
  DiskTier::Config config = TestConfig(fs.path(), kPayload, 16);  // ~16 MiB on 8 MiB
  auto opened = DiskTier::Open(config);
  ASSERT_FALSE(opened.ok());
  EXPECT_TRUE(opened.status().Is(StatusCode::kNoSpace)) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("bytes free"), std::string::npos)
      << opened.status().message();
  EXPECT_FALSE(std::filesystem::exists(fs.path() + "/g3-0000.kvt")) << "nothing half-built left";
  // A capacity that fits opens on the same filesystem.
  auto fits = DiskTier::Open(TestConfig(fs.path(), kPayload, 5));
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
}

TEST(DiskSmallFs, SparseFilesMeetEnospcAndQuarantine) {
  SmallFs fs(8u << 20);
  REQUIRE_SMALL_FS(fs);
  DiskTier::Config config = TestConfig(fs.path(), kPayload, 16);
  config.preallocate = false;  // as on a filesystem that refuses fallocate
  config.quarantine_after_errors = 2;
  config.reprobe_interval_ms = 3'600'000;
  auto opened = OpenOrDie(config);
  DiskTier* tier = opened.tier.get();
  EXPECT_TRUE(tier->stats().sparse_files);
  AlignedBuffer buf(tier->io_bytes());
  uint64_t written = 0;
  Status last;
  for (uint64_t i = 0; i < 16 && !tier->quarantined(); ++i) {
    last = WriteBlock(tier, i, buf.data());
    if (last.ok()) ++written;
  }
  const DiskTierStats s = tier->stats();
  EXPECT_GT(written, 3u);
  EXPECT_LT(written, 8u);
  EXPECT_TRUE(last.Is(StatusCode::kNoSpace)) << last.ToString();
  EXPECT_TRUE(s.quarantined);
  EXPECT_GE(s.enospc_errors, 2u);
  EXPECT_EQ(s.blocks, written);
  EXPECT_TRUE(WriteBlock(tier, 100, buf.data()).Is(StatusCode::kUnavailable));
  // The probe page was written at creation, so the device itself works: the probe passes,
  // and what was written before the disk filled is still served, verified.
  ASSERT_TRUE(tier->ProbeNow().ok());
  for (uint64_t i = 0; i < written; ++i) {
    bool wrong = true;
    ASSERT_TRUE(ReadBlock(tier, i, buf.data(), &wrong).ok()) << i;
    EXPECT_FALSE(wrong);
  }
  // No room for the snapshot either: Close says so, and the next open scans instead.
  Status closed = tier->Close();
  EXPECT_TRUE(closed.Is(StatusCode::kNoSpace)) << closed.ToString();
  EXPECT_FALSE(std::filesystem::exists(fs.path() + "/snapshot.kvt.tmp"));
  auto reopened = OpenOrDie(config);
  EXPECT_FALSE(reopened.tier->stats().recovered_from_snapshot);
  // The scan reads headers only: a write that ENOSPC cut after its header landed is listed,
  // and then refused when read (its payload does not verify). Nothing wrong is served.
  EXPECT_GE(reopened.recovered.size(), written);
  uint64_t served = 0;
  for (const RecoveredBlock& b : reopened.recovered) {
    bool wrong = true;
    Status r = ReadBlock(reopened.tier.get(), b.tokens[0] / 131, buf.data(), &wrong);
    if (r.ok()) {
      ++served;
      EXPECT_FALSE(wrong);
    } else {
      EXPECT_TRUE(r.Is(StatusCode::kCorruption)) << r.ToString();
    }
  }
  EXPECT_EQ(served, written);
}

TEST(DiskSmallFs, TruncationUnderneathLosesOnlyTheCutBlocks) {
  SmallFs fs(32u << 20);
  REQUIRE_SMALL_FS(fs);
  DiskTier::Config config = TestConfig(fs.path(), kPayload, 8);
  config.reprobe_interval_ms = 3'600'000;
  auto opened = OpenOrDie(config);
  DiskTier* tier = opened.tier.get();
  AlignedBuffer buf(tier->io_bytes());
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(WriteBlock(tier, i, buf.data()).ok());
  // Cut the file in the middle of slot 4: slots 4..7 are gone.
  const DiskGeometry& g = tier->geometry();
  ASSERT_EQ(
      truncate((fs.path() + "/g3-0000.kvt").c_str(), static_cast<off_t>(g.OffsetOf(4) + 4096)), 0);
  // A read of a cut slot finds the end of the file: an error, never data.
  EXPECT_TRUE(ReadBlock(tier, 6, buf.data()).Is(StatusCode::kIOError));
  Status health = tier->CheckHealthNow();
  EXPECT_TRUE(health.Is(StatusCode::kFailedPrecondition)) << health.ToString();
  EXPECT_NE(health.message().find("truncated"), std::string::npos);
  DiskTierStats s = tier->stats();
  EXPECT_TRUE(s.quarantined);
  EXPECT_EQ(s.blocks_lost_to_truncation, 3u) << "4, 5 and 7 (6 was dropped by its read)";
  EXPECT_EQ(s.blocks, 4u);
  // The probe restores the file's size; the blocks before the cut are intact.
  ASSERT_TRUE(tier->ProbeNow().ok());
  EXPECT_FALSE(tier->quarantined());
  EXPECT_EQ(static_cast<uint64_t>(std::filesystem::file_size(fs.path() + "/g3-0000.kvt")),
            g.file_bytes());
  for (uint64_t i = 0; i < 8; ++i) {
    bool wrong = true;
    Status r = ReadBlock(tier, i, buf.data(), &wrong);
    if (i < 4) {
      ASSERT_TRUE(r.ok()) << i << " " << r.ToString();
      EXPECT_FALSE(wrong);
    } else {
      EXPECT_TRUE(r.Is(StatusCode::kNotFound)) << i << " " << r.ToString();
    }
  }
  ASSERT_TRUE(WriteBlock(tier, 20, buf.data()).ok());
  ASSERT_TRUE(ReadBlock(tier, 20, buf.data()).ok());
}

TEST(DiskSmallFs, TruncationWhileDownIsNeverServed) {
  SmallFs fs(32u << 20);
  REQUIRE_SMALL_FS(fs);
  const DiskTier::Config config = TestConfig(fs.path(), kPayload, 8);
  uint64_t cut = 0;
  {
    auto opened = OpenOrDie(config);
    AlignedBuffer buf(opened.tier->io_bytes());
    for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(WriteBlock(opened.tier.get(), i, buf.data()).ok());
    cut = opened.tier->geometry().OffsetOf(5);
  }
  ASSERT_EQ(truncate((fs.path() + "/g3-0000.kvt").c_str(), static_cast<off_t>(cut)), 0);
  // The snapshot still lists slots 5..7, but the file is not the one it saw (smaller): its slots
  // are scanned instead of trusted, and open gives the file its size back (zeros there).
  auto opened = OpenOrDie(config);
  EXPECT_TRUE(opened.tier->stats().recovered_from_snapshot);
  EXPECT_EQ(opened.tier->stats().files_rescanned, 1u);
  AlignedBuffer buf(opened.tier->io_bytes());
  for (uint64_t i = 0; i < 8; ++i) {
    bool wrong = true;
    Status r = ReadBlock(opened.tier.get(), i, buf.data(), &wrong);
    if (i < 5) {
      ASSERT_TRUE(r.ok()) << r.ToString();
      EXPECT_FALSE(wrong);
    } else {
      EXPECT_TRUE(r.Is(StatusCode::kNotFound)) << "the scan found the slot empty: " << r.ToString();
    }
  }
  EXPECT_EQ(opened.tier->stats().verify_failures, 0u) << "nothing zeroed was trusted";
}

TEST(DiskSmallFs, DeletedUnderneathQuarantinesUntilRestart) {
  SmallFs fs(32u << 20);
  REQUIRE_SMALL_FS(fs);
  DiskTier::Config config = TestConfig(fs.path(), kPayload, 4);
  config.reprobe_interval_ms = 3'600'000;
  {
    auto opened = OpenOrDie(config);
    AlignedBuffer buf(opened.tier->io_bytes());
    ASSERT_TRUE(WriteBlock(opened.tier.get(), 0, buf.data()).ok());
    ASSERT_EQ(unlink((fs.path() + "/g3-0000.kvt").c_str()), 0);
    Status health = opened.tier->CheckHealthNow();
    EXPECT_NE(health.message().find("deleted"), std::string::npos) << health.ToString();
    EXPECT_TRUE(opened.tier->quarantined());
    EXPECT_TRUE(ReadBlock(opened.tier.get(), 0, buf.data()).Is(StatusCode::kUnavailable));
    Status probe = opened.tier->ProbeNow();
    EXPECT_FALSE(probe.ok());
    EXPECT_NE(probe.message().find("restart"), std::string::npos) << probe.ToString();
    EXPECT_TRUE(opened.tier->quarantined());
  }
  // A restart builds fresh files.
  auto opened = OpenOrDie(config);
  EXPECT_TRUE(opened.recovered.empty());
  AlignedBuffer buf(opened.tier->io_bytes());
  ASSERT_TRUE(WriteBlock(opened.tier.get(), 1, buf.data()).ok());
}

}  // namespace
}  // namespace kvtier

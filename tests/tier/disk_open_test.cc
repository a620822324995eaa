// Every path of a G3 directory that a user or another process controls (the slot files, LOCK,
// the snapshot) is opened so that only a regular file is ever read: a FIFO or a device put under
// one of those names is refused by what it is, at once, by the tier and by `kvtier inspect`.
// Before, a FIFO named like a slot file hung `kvtier inspect` in open(2) and made a replay blame
// O_DIRECT; a FIFO under the snapshot's name hung the tier's open.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "cli_run.h"
#include "core/regular_file.h"
#include "disk_test_util.h"
#include "hang_guard.h"
#include "tier/disk_files.h"
#include "tier/disk_tier.h"

namespace kvtier {
namespace {

using namespace kvtier::testing;

constexpr uint64_t kPayload = 12288;
constexpr auto kLimit = std::chrono::seconds(20);

// Writes `n` blocks into a fresh tier in `dir` and closes it (a snapshot is written).
void WriteAndClose(const DiskTier::Config& config, uint64_t n) {
  auto opened = OpenOrDie(config);
  AlignedBuffer buf(opened.tier->io_bytes());
  for (uint64_t i = 0; i < n; ++i) ASSERT_TRUE(WriteBlock(opened.tier.get(), i, buf.data()).ok());
}

void ReplaceWithFifo(const std::string& path) {
  ASSERT_EQ(::unlink(path.c_str()), 0) << path << ": " << std::strerror(errno);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path << ": " << std::strerror(errno);
}

// `kvtier inspect ARGS` with a watchdog of its own (timeout(1)): exit 124 means it hung.
cli_run::CliRun Inspect(const std::string& args) {
  return cli_run::RunShell("timeout 20 " + std::string(KVTIER_CLI_PATH) + " inspect " + args +
                           " 2>&1");
}

TEST(RegularFile, OnlyARegularFileIsOpenedAndTheRestIsNamed) {
  TempDir dir;
  const std::string fifo = dir.sub("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Result<int> fd = Status::Internal("not run");
  const auto call = RunGuarded([&] { fd = OpenRegularFile(fifo, O_RDONLY); }, kLimit,
                               [&] { ReleaseFifoReaders(fifo); });
  EXPECT_TRUE(call.returned_in_time);
  ASSERT_FALSE(fd.ok());
  EXPECT_TRUE(fd.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(fd.status().message().find("is a FIFO"), std::string::npos) << fd.status().ToString();

  // O_WRONLY on a FIFO without a reader fails at once (ENXIO); it is named too.
  fd = OpenRegularFile(fifo, O_WRONLY);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("is a FIFO"), std::string::npos) << fd.status().ToString();

  fd = OpenRegularFile(dir.path(), O_RDONLY);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("is a directory"), std::string::npos);
  fd = OpenRegularFile(dir.path(), O_RDWR);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("is a directory"), std::string::npos);
  fd = OpenRegularFile("/dev/zero", O_RDONLY);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("is a character device"), std::string::npos);
  EXPECT_TRUE(OpenRegularFile(dir.sub("absent"), O_RDONLY).status().Is(StatusCode::kNotFound));

  // A regular file opens in blocking mode, with O_DIRECT when asked.
  fd = OpenRegularFile(dir.sub("file"), O_RDWR | O_CREAT | O_DIRECT);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  const int flags = ::fcntl(*fd, F_GETFL);
  EXPECT_EQ(flags & O_NONBLOCK, 0);
  EXPECT_NE(flags & O_DIRECT, 0);
  ::close(*fd);
}

TEST(DiskOpen, AFifoNamedLikeASlotFileIsRefusedByWhatItIsNotBlamedOnODirect) {
  TempDir dir;
  const DiskTier::Config config = TestConfig(dir.path(), kPayload, 32);
  WriteAndClose(config, 4);
  ReplaceWithFifo(dir.sub("g3-0000.kvt"));
  Result<DiskTier::Opened> opened = Status::Internal("not run");
  const auto call = RunGuarded([&] { opened = DiskTier::Open(config); }, kLimit,
                               [&] { ReleaseFifoReaders(dir.sub("g3-0000.kvt")); });
  EXPECT_TRUE(call.returned_in_time);
  ASSERT_FALSE(opened.ok());
  const std::string why = opened.status().message();
  EXPECT_NE(why.find("g3-0000.kvt is a FIFO"), std::string::npos) << why;
  EXPECT_EQ(why.find("O_DIRECT"), std::string::npos) << why;

  const auto r = Inspect(dir.path());
  EXPECT_NE(r.exit_code, 124) << "inspect hung on the FIFO";
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("g3-0000.kvt is a FIFO"), std::string::npos) << r.out;
  const auto j = Inspect(dir.path() + " --json");
  EXPECT_EQ(j.exit_code, 1) << j.out;
  EXPECT_NE(j.out.find("\"error\""), std::string::npos) << j.out;
  ReleaseFifoReaders(dir.sub("g3-0000.kvt"));  // in case an old build hung on it
}

TEST(DiskOpen, AFifoAsTheSecondSlotFileIsNamedToo) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 32);
  config.num_files = 2;
  WriteAndClose(config, 4);
  ReplaceWithFifo(dir.sub("g3-0001.kvt"));
  const auto r = Inspect(dir.path());
  EXPECT_NE(r.exit_code, 124) << "inspect hung on the FIFO";
  EXPECT_NE(r.out.find("g3-0001.kvt is a FIFO"), std::string::npos) << r.out;
  ReleaseFifoReaders(dir.sub("g3-0001.kvt"));
}

TEST(DiskOpen, AFifoAsTheLockFileIsRefused) {
  TempDir dir;
  const DiskTier::Config config = TestConfig(dir.path(), kPayload, 32);
  WriteAndClose(config, 4);
  ReplaceWithFifo(dir.sub("LOCK"));
  const auto r = Inspect(dir.path());
  EXPECT_NE(r.exit_code, 124) << "inspect hung on the FIFO";
  EXPECT_NE(r.out.find("LOCK is a FIFO"), std::string::npos) << r.out;
  ReleaseFifoReaders(dir.sub("LOCK"));
  auto opened = DiskTier::Open(config);
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.status().message().find("LOCK is a FIFO"), std::string::npos)
      << opened.status().ToString();
}

// A FIFO under the snapshot's name is not a snapshot: the tier scans instead (and removes it, as
// it removes any snapshot it has read).
TEST(DiskOpen, AFifoAsTheSnapshotFallsBackToTheScan) {
  TempDir dir;
  const DiskTier::Config config = TestConfig(dir.path(), kPayload, 32);
  WriteAndClose(config, 6);
  ReplaceWithFifo(dir.sub("snapshot.kvt"));
  const auto r = Inspect(dir.path());
  EXPECT_NE(r.exit_code, 124) << "inspect hung on the FIFO";
  EXPECT_NE(r.out.find("snapshot.kvt is a FIFO"), std::string::npos) << r.out;
  ReleaseFifoReaders(dir.sub("snapshot.kvt"));

  Result<DiskTier::Opened> opened = Status::Internal("not run");
  const auto call = RunGuarded([&] { opened = DiskTier::Open(config); }, kLimit,
                               [&] { ReleaseFifoReaders(dir.sub("snapshot.kvt")); });
  EXPECT_TRUE(call.returned_in_time) << "the tier's open hung on the FIFO";
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_FALSE(opened->tier->stats().recovered_from_snapshot);
  EXPECT_EQ(opened->recovered.size(), 6u);
  EXPECT_FALSE(std::filesystem::exists(dir.sub("snapshot.kvt")));
  // A FIFO left under the snapshot's temporary name does not hold the close either.
  ASSERT_EQ(::mkfifo(dir.sub("snapshot.kvt.tmp").c_str(), 0600), 0);
  Status closed;
  const auto close_call = RunGuarded([&] { closed = opened->tier->Close(); }, kLimit,
                                     [&] {
                                       // An old build opened it O_WRONLY without a reader: give it
                                       // one.
                                       const int fd = ::open(dir.sub("snapshot.kvt.tmp").c_str(),
                                                             O_RDONLY | O_NONBLOCK);
                                       if (fd >= 0) ::close(fd);
                                     });
  EXPECT_TRUE(close_call.returned_in_time) << "Close hung on the FIFO";
  EXPECT_TRUE(closed.ok()) << closed.ToString();
  auto again = OpenOrDie(config);
  EXPECT_TRUE(again.tier->stats().recovered_from_snapshot);
  EXPECT_EQ(again.recovered.size(), 6u);
}

}  // namespace
}  // namespace kvtier

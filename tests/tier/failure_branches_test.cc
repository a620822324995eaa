// Failure branches that no test reached before issue 16 (its item 8), each made to happen for
// real: a slot file whose superblock is too short, has a bad magic or another format version
// (forged behind a valid checksum); a multi-file set with a missing or a foreign file; io_uring
// refused by a seccomp filter (as container runtimes do) and the automatic fallback to threads;
// a shared-filesystem deadline passing partway through Contains and Remove.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "disk_test_util.h"
#include "tier/disk_files.h"
#include "tier/disk_tier.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace {

using namespace kvtier::testing;

constexpr uint64_t kPayload = 12288;

// Writes `n` blocks into a fresh tier of `config` and closes it.
void WriteAndClose(const DiskTier::Config& config, uint64_t n) {
  auto opened = OpenOrDie(config);
  AlignedBuffer buf(opened.tier->io_bytes());
  for (uint64_t i = 0; i < n; ++i) ASSERT_TRUE(WriteBlock(opened.tier.get(), i, buf.data()).ok());
}

std::string ReadBytes(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

void WriteBytesAt(const std::string& path, const std::string& bytes, off_t offset) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), offset), static_cast<ssize_t>(bytes.size()));
  ::fsync(fd);
  ::close(fd);
}

// ---- superblocks ----

// The superblock is one 4 KiB page: magic at 0, version at 8, ..., XXH3-64 of the first 4088
// bytes at 4088 (disk_files.cc).
constexpr size_t kSuperblockVersionAt = 8;
constexpr size_t kSuperblockChecksumAt = 4088;

std::string Forge(std::string sb) {
  const uint64_t sum = XXH3_64bits(sb.data(), kSuperblockChecksumAt);
  std::memcpy(sb.data() + kSuperblockChecksumAt, &sum, 8);
  return sb;
}

// Inspect (OpenReadOnly) names what is wrong; a tier opening the directory reformats it (its
// blocks dropped, never trusted).
void ExpectRefusedThenReformatted(const DiskTier::Config& config, const std::string& why) {
  auto ro = DiskFileSet::OpenReadOnly(config.dir);
  ASSERT_FALSE(ro.ok());
  EXPECT_TRUE(ro.status().Is(StatusCode::kCorruption)) << ro.status().ToString();
  EXPECT_NE(ro.status().message().find(why), std::string::npos) << ro.status().ToString();
  auto opened = DiskTier::Open(config);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_TRUE(opened->tier->stats().reformatted);
  EXPECT_TRUE(opened->recovered.empty());
}

TEST(SuperblockBranches, TooShortBadMagicAndWrongVersionAreRefused) {
  TempDir dir;
  const DiskTier::Config config = TestConfig(dir.path(), kPayload, 16);
  const std::string file0 = dir.sub("g3-0000.kvt");

  WriteAndClose(config, 3);
  std::filesystem::resize_file(file0, 100);
  ExpectRefusedThenReformatted(config, "file too short for a superblock");

  std::filesystem::remove_all(dir.path());
  WriteAndClose(config, 3);
  std::string sb = ReadBytes(file0, 4096);
  ASSERT_EQ(sb.size(), 4096u);
  sb[0] ^= 0x5a;  // the magic, checksum forged to match
  WriteBytesAt(file0, Forge(sb), 0);
  ExpectRefusedThenReformatted(config, "not a kvtier slot file");

  std::filesystem::remove_all(dir.path());
  WriteAndClose(config, 3);
  sb = ReadBytes(file0, 4096);
  const uint32_t version = 7;
  std::memcpy(sb.data() + kSuperblockVersionAt, &version, 4);
  WriteBytesAt(file0, Forge(sb), 0);
  ExpectRefusedThenReformatted(config, "slot file format version 7");
}

// ---- multi-file sets ----

TEST(SlotFileSetBranches, AMissingSecondFileIsNamedAndTheSetReformatted) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 16);
  config.num_files = 2;
  WriteAndClose(config, 6);
  ASSERT_TRUE(std::filesystem::remove(dir.sub("g3-0001.kvt")));
  ExpectRefusedThenReformatted(config, "missing slot file " + dir.sub("g3-0001.kvt"));
}

TEST(SlotFileSetBranches, AForeignSecondFileIsNamedAndTheSetReformatted) {
  TempDir dir, other;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 16);
  config.num_files = 2;
  WriteAndClose(config, 6);
  DiskTier::Config other_config = config;
  other_config.dir = other.path();
  WriteAndClose(other_config, 6);  // the same geometry, another formatting (tier id)
  std::filesystem::copy_file(other.sub("g3-0001.kvt"), dir.sub("g3-0001.kvt"),
                             std::filesystem::copy_options::overwrite_existing);
  auto ro = DiskFileSet::OpenReadOnly(dir.path());
  ASSERT_FALSE(ro.ok());
  EXPECT_NE(ro.status().message().find("g3-0001.kvt does not belong with"), std::string::npos)
      << ro.status().ToString();
  auto opened = DiskTier::Open(config);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_TRUE(opened->tier->stats().reformatted);
  EXPECT_TRUE(opened->recovered.empty()) << "no block of either formatting is trusted";
}

// ---- io_uring refused ----

// Makes io_uring_setup(2) fail with ENOSYS in this process from now on, as the default seccomp
// profiles of container runtimes do. False when the filter cannot be installed.
bool BlockIoUringSetup() {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])),
                            filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// In a child (the filter cannot be removed): with io_uring refused, io_backend = auto falls
// back to the thread pool and the tier works; io_backend = io_uring is refused clearly.
TEST(IoUringBranches, RefusedIoUringFallsBackToThreadsOrIsRefusedWhenRequired) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the seccomp filter is written for x86-64";
#endif
  TempDir dir;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!BlockIoUringSetup()) _exit(10);
    DiskTier::Config config = TestConfig(dir.path(), kPayload, 8);
    config.io_backend = IoBackend::kUring;
    auto refused = DiskTier::Open(config);
    if (refused.ok()) _exit(11);
    if (!refused.status().Is(StatusCode::kUnavailable)) _exit(12);
    if (refused.status().message().find("io_uring_queue_init failed") == std::string::npos) {
      _exit(13);
    }
    config.io_backend = IoBackend::kAuto;
    auto opened = DiskTier::Open(config);
    if (!opened.ok()) _exit(14);
    if (opened->tier->stats().io_backend.find("threads") == std::string::npos) _exit(15);
    AlignedBuffer buf(opened->tier->io_bytes());
    if (!WriteBlock(opened->tier.get(), 0, buf.data()).ok()) _exit(16);
    bool wrong = true;
    if (!ReadBlock(opened->tier.get(), 0, buf.data(), &wrong).ok() || wrong) _exit(17);
    opened->tier.reset();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 10) GTEST_SKIP() << "seccomp filters are not allowed here";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the _exit codes in the child";
}

// ---- shared-filesystem deadlines ----

// Contains and Remove check the deadline before every name. With many names and a deadline that
// passes while they are being worked through, they stop partway (saying how far they got) and
// return by the deadline; deadlines grow until one lands inside the work (the machine's speed
// decides which), so the branch is reached however loaded the machine is.
TEST(FsStoreBranches, ADeadlinePassingPartwayThroughContainsOrRemoveStopsThere) {
  TempDir dir;
  auto store = OpenFsStore(FsStoreOptions{dir.sub("g4"), {}});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<std::string> names;
  for (uint64_t i = 0; i < 200000; ++i) {
    names.push_back(RemoteObjectName(9, BlockKey{i * 0x9e3779b97f4a7c15ull, i}));
  }
  std::vector<uint8_t> present(names.size());
  bool contains_partway = false, remove_partway = false;
  for (int ms = 1; ms <= 4096 && !(contains_partway && remove_partway); ms *= 2) {
    const Status c =
        (*store)->Contains(names, RemoteClock::now() + std::chrono::milliseconds(ms), present);
    if (c.Is(StatusCode::kTimedOut) && c.message().find("after ") != std::string::npos &&
        c.message().find("after 0 of") == std::string::npos) {
      contains_partway = true;
      EXPECT_NE(c.message().find(" of 200000"), std::string::npos) << c.ToString();
      EXPECT_EQ(std::count(present.begin(), present.end(), 1), 0) << "a late answer is no answer";
    }
    const Status r = (*store)->Remove(names, RemoteClock::now() + std::chrono::milliseconds(ms));
    if (r.Is(StatusCode::kTimedOut) &&
        r.message().find("Remove passed its deadline") != std::string::npos) {
      remove_partway = true;
    }
  }
  EXPECT_TRUE(contains_partway) << "no deadline up to 4 s landed inside 200000 stat() calls";
  EXPECT_TRUE(remove_partway) << "no deadline up to 4 s landed inside 200000 unlink() calls";
  EXPECT_GT((*store)->Stats().timeouts, 0u);
  EXPECT_FALSE((*store)->Stats().breaker_open) << "running out of time is not a failing store";
}

}  // namespace
}  // namespace kvtier

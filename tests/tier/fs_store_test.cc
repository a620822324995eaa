// The shared-filesystem G4 backend on real files: round trips, a second process reading what
// the first wrote, several processes replacing one object while others read it, torn objects
// refused by verification, a read-only filesystem, ENOSPC on a small tmpfs, deadlines, stale
// temporary files, bad names.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "disk_test_util.h"
#include "hang_guard.h"
#include "scatter_test_util.h"
#include "tier/block_format.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace {

using kvtier::testing::ExpectEachLandedAndToldOnce;
using kvtier::testing::ExpectLanded;
using kvtier::testing::ExpectNothingLanded;
using kvtier::testing::ExpectToldOnce;
using kvtier::testing::GetScattered;
using kvtier::testing::kKvBlock;
using kvtier::testing::KvBlockLayout;
using kvtier::testing::Receive;
using kvtier::testing::ScatterResult;
using kvtier::testing::TempDir;
using kvtier::testing::UnevenLayout;

RemoteDeadline Soon() { return RemoteClock::now() + std::chrono::seconds(5); }

std::unique_ptr<RemoteStore> OpenOrDie(const std::string& dir, CircuitBreakerOptions breaker = {}) {
  auto store = OpenFsStore(FsStoreOptions{dir, breaker});
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(store).value() : nullptr;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 9));
  return v;
}

Status PutOne(RemoteStore* s, const std::string& name, std::span<const uint8_t> bytes) {
  RemotePut p{name, bytes};
  Status st;
  s->Put(std::span<const RemotePut>(&p, 1), Soon(), std::span<Status>(&st, 1));
  return st;
}

Status GetOne(RemoteStore* s, const std::string& name, std::span<uint8_t> dest,
              uint64_t* bytes_read = nullptr) {
  RemoteGet g{name, dest, 0};
  Status st;
  s->Get(std::span<RemoteGet>(&g, 1), Soon(), std::span<Status>(&st, 1));
  if (bytes_read != nullptr) *bytes_read = g.bytes_read;
  return st;
}

// A whole stored block (header + payload) for `key`.
std::vector<uint8_t> MakeBlock(const BlockKey& key, uint64_t ns, uint64_t payload_bytes,
                               std::span<const TokenId> tokens) {
  std::vector<uint8_t> block(kBlockHeaderBytes + payload_bytes);
  auto payload = Pattern(payload_bytes, static_cast<uint8_t>(key.lo));
  std::copy(payload.begin(), payload.end(), block.begin() + kBlockHeaderBytes);
  BlockHeaderFields f;
  f.layout_fingerprint = 0x1234;
  f.namespace_id = ns;
  f.key = key;
  EXPECT_TRUE(EncodeBlockHeader(f, tokens, payload_bytes,
                                PayloadChecksum(block.data() + kBlockHeaderBytes, payload_bytes),
                                block.data())
                  .ok());
  return block;
}

// A tmpfs of `bytes` mounted on a fresh directory (needs CAP_SYS_ADMIN), unmounted at the end.
class SmallFs {
 public:
  explicit SmallFs(uint64_t bytes) {
    const std::string options = "size=" + std::to_string(bytes) + ",mode=0755";
    if (mount("kvtier-g4-test", dir_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
              options.c_str()) != 0) {
      error_ = std::string("mount tmpfs: ") + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~SmallFs() {
    if (mounted_) umount2(dir_.path().c_str(), MNT_DETACH);
  }
  // Remounts read-only (true) or read-write.
  bool SetReadOnly(bool ro) {
    return mount(nullptr, dir_.path().c_str(), nullptr,
                 MS_REMOUNT | MS_NOSUID | MS_NODEV | (ro ? MS_RDONLY : 0), nullptr) == 0;
  }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::string path() const { return dir_.path(); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string error_;
};

TEST(RemoteObjectName, CarriesNamespaceAndKey) {
  const BlockKey key{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(RemoteObjectName(0xa1b2c3d4e5f60718ull, key),
            "kvt1:a1b2c3d4e5f60718:0123456789abcdeffedcba9876543210");
  EXPECT_NE(RemoteObjectName(1, key), RemoteObjectName(2, key)) << "tenants never share a name";
}

TEST(FsStore, OpenRefusesBadDirectories) {
  EXPECT_TRUE(OpenFsStore(FsStoreOptions{"", {}}).status().Is(StatusCode::kInvalidArgument));
  TempDir dir;
  std::ofstream(dir.sub("file")) << "x";
  auto on_file = OpenFsStore(FsStoreOptions{dir.sub("file"), {}});
  EXPECT_FALSE(on_file.ok());
  EXPECT_NE(on_file.status().message().find("file"), std::string::npos)
      << on_file.status().ToString();
  CircuitBreakerOptions bad;
  bad.failure_threshold = 0;
  EXPECT_TRUE(
      OpenFsStore(FsStoreOptions{dir.sub("ok"), bad}).status().Is(StatusCode::kInvalidArgument));
}

TEST(FsStore, PutGetContainsRemove) {
  TempDir dir;
  auto store = OpenOrDie(dir.sub("g4"));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Describe(), "fs:" + dir.sub("g4"));
  const std::string a = RemoteObjectName(7, BlockKey{0xab00000000000001ull, 1});
  const std::string b = "plain-name";
  const auto bytes_a = Pattern(100000, 1), bytes_b = Pattern(5000, 2);
  ASSERT_TRUE(PutOne(store.get(), a, bytes_a).ok());
  ASSERT_TRUE(PutOne(store.get(), b, bytes_b).ok());
  EXPECT_TRUE(std::filesystem::exists(dir.sub("g4/ab/" + a))) << "fanned out by the key";

  std::vector<uint8_t> dest(200000, 0xee);
  uint64_t n = 0;
  ASSERT_TRUE(GetOne(store.get(), a, dest, &n).ok());
  ASSERT_EQ(n, bytes_a.size());
  EXPECT_TRUE(std::equal(bytes_a.begin(), bytes_a.end(), dest.begin()));
  EXPECT_EQ(dest[bytes_a.size()], 0xee) << "nothing written past the object";

  // Replace: the new bytes win.
  const auto bytes_a2 = Pattern(100000, 9);
  ASSERT_TRUE(PutOne(store.get(), a, bytes_a2).ok());
  ASSERT_TRUE(GetOne(store.get(), a, dest, &n).ok());
  EXPECT_TRUE(std::equal(bytes_a2.begin(), bytes_a2.end(), dest.begin()));

  std::vector<std::string> names{a, "missing", b};
  std::vector<uint8_t> present(3, 9);
  ASSERT_TRUE(store->Contains(names, Soon(), present).ok());
  EXPECT_EQ(present, (std::vector<uint8_t>{1, 0, 1}));

  EXPECT_TRUE(GetOne(store.get(), "missing", dest).Is(StatusCode::kNotFound));
  ASSERT_TRUE(store->Remove(std::vector<std::string>{a, "missing"}, Soon()).ok());
  EXPECT_TRUE(GetOne(store.get(), a, dest).Is(StatusCode::kNotFound));

  const RemoteStoreStats s = store->Stats();
  EXPECT_EQ(s.puts, 3u);
  EXPECT_EQ(s.put_bytes, 205000u);
  EXPECT_EQ(s.get_hits, 2u);
  EXPECT_EQ(s.get_misses, 2u);
  EXPECT_EQ(s.get_failures, 0u);
  EXPECT_FALSE(s.breaker_open);
  // No temporary file is left anywhere.
  for (auto& e : std::filesystem::recursive_directory_iterator(dir.sub("g4"))) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp.", 0), 0u) << e.path();
  }
}

TEST(FsStore, ObjectLargerThanDestinationIsCorruptionAndNotCopied) {
  TempDir dir;
  auto store = OpenOrDie(dir.sub("g4"));
  ASSERT_TRUE(PutOne(store.get(), "big", Pattern(10000, 3)).ok());
  std::vector<uint8_t> dest(9999, 0x55);
  uint64_t n = 1;
  Status s = GetOne(store.get(), "big", dest, &n);
  EXPECT_TRUE(s.Is(StatusCode::kCorruption)) << s.ToString();
  EXPECT_EQ(n, 0u);
  EXPECT_TRUE(std::all_of(dest.begin(), dest.end(), [](uint8_t b) { return b == 0x55; }));
}

// KV is private: the store's directories are 0700 and its objects 0600, directories an older
// kvtier left 0755 are closed at open, and a process of another uid reads nothing (finding 11
// of issue 40: the fs G4 was readable by any local user).
TEST(FsStore, ObjectsAndDirectoriesAreTheirOwnersAlone) {
  TempDir dir;
  const std::string root = dir.sub("g4");
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/ab").c_str(), 0755), 0);  // as an older kvtier made it
  auto store = OpenOrDie(root);
  ASSERT_NE(store, nullptr);
  const std::string name = RemoteObjectName(7, BlockKey{0xab00000000000001ull, 1});
  ASSERT_TRUE(PutOne(store.get(), name, Pattern(4096, 3)).ok());
  auto mode = [](const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 01000u;
  };
  EXPECT_EQ(mode(root), 0700u);
  EXPECT_EQ(mode(root + "/ab"), 0700u);
  EXPECT_EQ(mode(root + "/cd"), 0700u);
  EXPECT_EQ(mode(root + "/ab/" + name), 0600u);
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to try a read as uid 65534";
  // The way to the store's directory is open (as /srv or a shared mount would be).
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(3);
    const int fd = ::open((root + "/ab/" + name).c_str(), O_RDONLY);
    if (fd >= 0) _exit(1);  // read another uid's KV
    _exit(errno == EACCES ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 3) GTEST_SKIP() << "setuid(65534) is not permitted here";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "uid 65534 opened an object of the fs G4";
}

TEST(FsStore, BadNamesAreRefused) {
  TempDir dir;
  auto store = OpenOrDie(dir.sub("g4"));
  const auto bytes = Pattern(10, 1);
  for (const std::string& bad : {std::string(""), std::string("../escape"), std::string(".tmp.x"),
                                 std::string("a/b"), std::string(300, 'x')}) {
    EXPECT_TRUE(PutOne(store.get(), bad, bytes).Is(StatusCode::kInvalidArgument)) << bad;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.sub("escape")));
  EXPECT_FALSE(store->Stats().breaker_open) << "a bad name is not a filesystem failure";
}

TEST(FsStore, PastDeadlineTouchesNothing) {
  TempDir dir;
  auto store = OpenOrDie(dir.sub("g4"));
  const auto bytes = Pattern(10, 1);
  RemotePut p{"late", bytes};
  Status st;
  store->Put(std::span<const RemotePut>(&p, 1), RemoteClock::now() - std::chrono::milliseconds(1),
             std::span<Status>(&st, 1));
  EXPECT_TRUE(st.Is(StatusCode::kTimedOut)) << st.ToString();
  std::vector<std::string> names{"late"};
  std::vector<uint8_t> present(1, 7);
  EXPECT_TRUE(store->Contains(names, RemoteClock::now(), present).Is(StatusCode::kTimedOut));
  EXPECT_EQ(present[0], 0);
  EXPECT_GE(store->Stats().timeouts, 2u);
  EXPECT_FALSE(store->Stats().breaker_open) << "running out of time is not a dead filesystem";
}

TEST(FsStore, SecondProcessReadsWhatTheFirstWrote) {
  TempDir dir;
  auto store = OpenOrDie(dir.sub("g4"));
  const BlockKey key{0x42, 0x43};
  const std::vector<TokenId> tokens{1, 2, 3, 4};
  const auto block = MakeBlock(key, 99, 64 * 1024, tokens);
  const std::string name = RemoteObjectName(99, key);
  ASSERT_TRUE(PutOne(store.get(), name, block).ok());

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child opens its own store on the same directory, reads and verifies, then writes an
    // object of its own for the parent.
    auto child = OpenFsStore(FsStoreOptions{dir.sub("g4"), {}});
    if (!child.ok()) _exit(2);
    std::vector<uint8_t> dest(block.size() + 4096);
    RemoteGet g{name, dest, 0};
    Status st;
    (*child)->Get(std::span<RemoteGet>(&g, 1), Soon(), std::span<Status>(&st, 1));
    if (!st.ok() || g.bytes_read != block.size()) _exit(3);
    ExpectedBlock e{.layout_fingerprint = 0x1234,
                    .namespace_id = 99,
                    .key = key,
                    .tokens = tokens,
                    .payload_bytes = 64 * 1024};
    if (VerifyBlock(std::span<const uint8_t>(dest.data(), g.bytes_read), e) != BlockCheck::kOk) {
      _exit(4);
    }
    const auto mine = Pattern(3333, 77);
    RemotePut p{"from-child", mine};
    (*child)->Put(std::span<const RemotePut>(&p, 1), Soon(), std::span<Status>(&st, 1));
    _exit(st.ok() ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "child failed (see the exit code in the test)";
  std::vector<uint8_t> dest(4000);
  uint64_t n = 0;
  ASSERT_TRUE(GetOne(store.get(), "from-child", dest, &n).ok());
  const auto want = Pattern(3333, 77);
  ASSERT_EQ(n, want.size());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), dest.begin()));
}

TEST(FsStore, ConcurrentWritersAndReadersAcrossProcessesNeverSeeATornObject) {
  TempDir dir;
  auto store = OpenOrDie(dir.sub("g4"));
  constexpr size_t kBytes = 256 * 1024;
  ASSERT_TRUE(PutOne(store.get(), "shared", std::vector<uint8_t>(kBytes, 1)).ok());
  // Two writer processes replace the object with uniform buffers of their own byte; two reader
  // processes check that every read is one whole buffer of a single value.
  std::vector<pid_t> pids;
  for (int role = 0; role < 4; ++role) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto s = OpenFsStore(FsStoreOptions{dir.sub("g4"), {}});
      if (!s.ok()) _exit(2);
      const auto until = RemoteClock::now() + std::chrono::milliseconds(700);
      std::vector<uint8_t> buf(kBytes, static_cast<uint8_t>(10 + role));
      uint64_t reads = 0;
      while (RemoteClock::now() < until) {
        Status st;
        if (role < 2) {
          RemotePut p{"shared", buf};
          (*s)->Put(std::span<const RemotePut>(&p, 1), Soon(), std::span<Status>(&st, 1));
          if (!st.ok()) _exit(3);
        } else {
          RemoteGet g{"shared", buf, 0};
          (*s)->Get(std::span<RemoteGet>(&g, 1), Soon(), std::span<Status>(&st, 1));
          if (!st.ok() || g.bytes_read != kBytes) _exit(4);
          for (size_t i = 1; i < kBytes; ++i) {
            if (buf[i] != buf[0]) _exit(5);  // torn: two writers' bytes mixed
          }
          ++reads;
        }
      }
      _exit(role >= 2 && reads == 0 ? 6 : 0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "process " << pid;
  }
}

TEST(FsStore, TruncatedObjectFailsVerificationAtTheCaller) {
  TempDir dir;
  auto store = OpenOrDie(dir.sub("g4"));
  const BlockKey key{0xcd00000000000000ull, 5};
  const std::vector<TokenId> tokens{9, 8, 7, 6};
  const auto block = MakeBlock(key, 1, 32 * 1024, tokens);
  const std::string name = RemoteObjectName(1, key);
  ASSERT_TRUE(PutOne(store.get(), name, block).ok());
  ExpectedBlock e{.layout_fingerprint = 0x1234,
                  .namespace_id = 1,
                  .key = key,
                  .tokens = tokens,
                  .payload_bytes = 32 * 1024};
  std::vector<uint8_t> dest(block.size());
  uint64_t n = 0;
  ASSERT_TRUE(GetOne(store.get(), name, dest, &n).ok());
  EXPECT_EQ(VerifyBlock(std::span<const uint8_t>(dest.data(), n), e), BlockCheck::kOk);

  // Torn: a crashed writer or a lost tail on the shared filesystem.
  ASSERT_EQ(truncate(dir.sub("g4/cd/" + name).c_str(), static_cast<off_t>(block.size() - 100)), 0);
  std::fill(dest.begin(), dest.end(), 0);
  ASSERT_TRUE(GetOne(store.get(), name, dest, &n).ok()) << "the store moves bytes only";
  EXPECT_EQ(n, block.size() - 100);
  EXPECT_EQ(VerifyBlock(std::span<const uint8_t>(dest.data(), n), e),
            BlockCheck::kWrongPayloadLength);

  // One flipped payload byte at full length.
  auto bad = block;
  bad[kBlockHeaderBytes + 1000] ^= 0x40;
  ASSERT_TRUE(PutOne(store.get(), name, bad).ok());
  ASSERT_TRUE(GetOne(store.get(), name, dest, &n).ok());
  EXPECT_EQ(VerifyBlock(std::span<const uint8_t>(dest.data(), n), e), BlockCheck::kBadPayload);
}

// A FIFO put under an object name (between a Contains and the Get that follows it) used to hold
// the Get in open(2) for good: FsStore opened without O_NONBLOCK. Now the Get refuses it at once,
// saying what it is, and Contains never offered it.
TEST(FsStore, AFifoUnderAnObjectNameIsRefusedWithoutBlocking) {
  TempDir dir;
  auto store = OpenOrDie(dir.sub("g4"));
  ASSERT_NE(store, nullptr);
  const std::string name = RemoteObjectName(5, BlockKey{0xab00000000000000ull, 9});
  const std::string path = dir.sub("g4/ab/" + name);
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0) << std::strerror(errno);
  std::vector<uint8_t> dest(64 * 1024);
  Status got;
  const auto call =
      testing::RunGuarded([&] { got = GetOne(store.get(), name, dest); }, std::chrono::seconds(20),
                          [&] { testing::ReleaseFifoReaders(path); });
  EXPECT_TRUE(call.returned_in_time) << "Get blocked in open() of a FIFO for " << call.took.count()
                                     << " ms (released by the test)";
  EXPECT_TRUE(got.Is(StatusCode::kCorruption)) << got.ToString();
  EXPECT_NE(got.message().find("FIFO"), std::string::npos) << got.ToString();
  EXPECT_FALSE(store->Stats().breaker_open) << "a bad object is not a failing filesystem";
  std::vector<uint8_t> present(1, 1);
  const std::string names[] = {name};
  ASSERT_TRUE(store->Contains(names, Soon(), present).ok());
  EXPECT_EQ(present[0], 0) << "Contains offers regular files only";
}

TEST(FsStore, StaleTemporaryFilesAreIgnoredAndCleanedAtOpen) {
  TempDir dir;
  {
    auto store = OpenOrDie(dir.sub("g4"));
    ASSERT_NE(store, nullptr);
  }
  const std::string name = RemoteObjectName(3, BlockKey{0x1100000000000000ull, 1});
  const std::string stale = dir.sub("g4/11/.tmp." + name + ".1.1.0");
  const std::string fresh = dir.sub("g4/11/.tmp." + name + ".2.2.0");
  std::ofstream(stale) << "half a block";
  std::ofstream(fresh) << "a writer at work";
  const timeval old[2] = {{time(nullptr) - 3600, 0}, {time(nullptr) - 3600, 0}};
  ASSERT_EQ(utimes(stale.c_str(), old), 0);
  auto store = OpenOrDie(dir.sub("g4"));
  EXPECT_FALSE(std::filesystem::exists(stale)) << "a crashed writer's file is removed";
  EXPECT_TRUE(std::filesystem::exists(fresh)) << "a live writer's file is left alone";
  std::vector<uint8_t> dest(100);
  EXPECT_TRUE(GetOne(store.get(), name, dest).Is(StatusCode::kNotFound))
      << "a temporary file is never served";
}

TEST(FsStore, ReadOnlyFilesystemIsIOErrorThenTheBreakerOpens) {
  SmallFs fs(16u << 20);
  if (!fs.ok()) GTEST_SKIP() << "SKIPPED (cannot mount a tmpfs): " << fs.error();
  CircuitBreakerOptions breaker;
  breaker.failure_threshold = 2;
  breaker.open_for = std::chrono::milliseconds(100);
  auto store = OpenOrDie(fs.path() + "/g4", breaker);
  ASSERT_NE(store, nullptr);
  const auto bytes = Pattern(4096, 1);
  ASSERT_TRUE(PutOne(store.get(), "before", bytes).ok());
  ASSERT_TRUE(fs.SetReadOnly(true)) << std::strerror(errno);

  Status s = PutOne(store.get(), "x1", bytes);
  EXPECT_TRUE(s.Is(StatusCode::kIOError)) << s.ToString();
  EXPECT_NE(s.message().find("Read-only"), std::string::npos) << s.message();
  EXPECT_TRUE(PutOne(store.get(), "x2", bytes).Is(StatusCode::kIOError));
  // Two failures: the breaker is open and refuses without touching the filesystem.
  EXPECT_TRUE(PutOne(store.get(), "x3", bytes).Is(StatusCode::kUnavailable));
  RemoteStoreStats st = store->Stats();
  EXPECT_TRUE(st.breaker_open);
  EXPECT_EQ(st.breaker_opens, 1u);
  EXPECT_GE(st.breaker_rejections, 1u);
  // A new store cannot open on a read-only directory.
  auto ro = OpenFsStore(FsStoreOptions{fs.path() + "/g4", {}});
  EXPECT_TRUE(ro.status().Is(StatusCode::kIOError)) << ro.status().ToString();

  // Writable again: after open_for a probe goes through and closes the breaker.
  ASSERT_TRUE(fs.SetReadOnly(false));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_TRUE(PutOne(store.get(), "x4", bytes).ok());
  EXPECT_FALSE(store->Stats().breaker_open);
  std::vector<uint8_t> dest(4096);
  EXPECT_TRUE(GetOne(store.get(), "before", dest).ok()) << "what was stored before is intact";
}

TEST(FsStore, EnospcOnASmallFilesystemLeavesNoPartialObject) {
  SmallFs fs(1u << 20);
  if (!fs.ok()) GTEST_SKIP() << "SKIPPED (cannot mount a tmpfs): " << fs.error();
  CircuitBreakerOptions breaker;
  breaker.failure_threshold = 100;
  auto store = OpenOrDie(fs.path() + "/g4", breaker);
  ASSERT_NE(store, nullptr);
  const auto bytes = Pattern(400 * 1024, 4);
  ASSERT_TRUE(PutOne(store.get(), "one", bytes).ok());
  Status last;
  int stored = 1;
  for (int i = 0; i < 4; ++i) {
    last = PutOne(store.get(), "more" + std::to_string(i), bytes);
    if (last.ok()) ++stored;
  }
  EXPECT_LT(stored, 3) << "1 MiB holds at most two 400 KiB objects";
  EXPECT_TRUE(last.Is(StatusCode::kIOError) || last.Is(StatusCode::kNoSpace)) << last.ToString();
  EXPECT_NE(last.message().find("No space"), std::string::npos) << last.message();
  std::vector<uint8_t> dest(bytes.size());
  uint64_t n = 0;
  ASSERT_TRUE(GetOne(store.get(), "one", dest, &n).ok());
  EXPECT_EQ(n, bytes.size());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), dest.begin()));
  // The failed writes left no temporary file and no partial object behind.
  for (auto& e : std::filesystem::recursive_directory_iterator(fs.path() + "/g4")) {
    const std::string f = e.path().filename().string();
    EXPECT_NE(f.rfind(".tmp.", 0), 0u) << e.path();
  }
  std::vector<std::string> names{"more0", "more1", "more2", "more3"};
  std::vector<uint8_t> present(4);
  ASSERT_TRUE(store->Contains(names, Soon(), present).ok());
  EXPECT_EQ(std::count(present.begin(), present.end(), 1), stored - 1);
}

// ---------------------------------------------------------------------------------------------
// Scatter destinations (RemoteGet::pieces), and what on_landed is told.

// Bytes with no period (unlike Pattern), so a piece landing at the wrong offset shows.
std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng() >> 56);
  return v;
}

// A fresh store in a temporary directory for each test.
class FsStoreScatter : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = OpenOrDie(dir_.sub("g4"));
    ASSERT_NE(store_, nullptr);
  }
  // Stores values[i] as names[i]; each put must succeed.
  void PutValues(const std::vector<std::string>& names,
                 const std::vector<std::vector<uint8_t>>& values) {
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(PutOne(store_.get(), names[i], values[i]).ok()) << names[i];
    }
  }
  ScatterResult Get(const std::vector<std::string>& names,
                    const std::vector<std::vector<size_t>>& layouts,
                    Receive how = Receive::kPieces) {
    return GetScattered(store_.get(), names, layouts, how);
  }

  TempDir dir_;
  std::unique_ptr<RemoteStore> store_;
};

TEST_F(FsStoreScatter, AKvBlockLandsByteExactInUnevenAndInEngineSizedPieces) {
  const auto bytes = RandomBytes(kKvBlock, 1);
  ASSERT_NO_FATAL_FAILURE(PutValues({"block"}, {bytes}));
  for (const auto& layout : {UnevenLayout(kKvBlock), KvBlockLayout()}) {
    SCOPED_TRACE("pieces of " + std::to_string(layout.size()));
    ScatterResult g = Get({"block"}, {layout});
    ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, 0, bytes));
    EXPECT_TRUE(std::equal(g.pieces[0].bufs[0].begin(), g.pieces[0].bufs[0].end(), bytes.begin()))
        << "the header piece";
  }
  // The same object into a contiguous dest, for comparison.
  std::vector<uint8_t> dest(kKvBlock);
  uint64_t n = 0;
  ASSERT_TRUE(GetOne(store_.get(), "block", dest, &n).ok());
  EXPECT_EQ(n, kKvBlock);
  EXPECT_EQ(dest, bytes);
  EXPECT_EQ(store_->Stats().get_bytes, 3 * kKvBlock);
}

// Several objects in one call, each into its own pieces, with a miss, an object too large and
// an empty one among them: each gets its own result.
TEST_F(FsStoreScatter, SeveralObjectsInOneCallEachGetTheirOwnResult) {
  const std::vector<std::vector<uint8_t>> values = {RandomBytes(kKvBlock, 2), RandomBytes(5000, 3),
                                                    RandomBytes(0, 4), RandomBytes(70001, 5)};
  const std::vector<std::string> names = {"a", "b", "c", "d", "missing", "a"};
  ASSERT_NO_FATAL_FAILURE(PutValues(names, values));
  const std::vector<std::vector<size_t>> layouts = {
      KvBlockLayout(), {1, 7, 1000, 1, 7, 1000, 4000}, {3}, UnevenLayout(70001),
      {100},           UnevenLayout(kKvBlock - 1)};
  ScatterResult g = Get(names, layouts);
  for (size_t i = 0; i < values.size(); ++i) ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, i, values[i]));
  ExpectNothingLanded(g, 4, StatusCode::kNotFound);
  ExpectNothingLanded(g, 5, StatusCode::kCorruption);
}

TEST_F(FsStoreScatter, ObjectLargerThanThePiecesIsCorruptionAndThePiecesUntouched) {
  ASSERT_NO_FATAL_FAILURE(PutValues({"big"}, {RandomBytes(kKvBlock + 1, 6)}));
  ScatterResult g = Get({"big"}, {KvBlockLayout()});
  ExpectNothingLanded(g, 0, StatusCode::kCorruption);
  EXPECT_NE(g.results[0].message().find(std::to_string(kKvBlock) + "-byte pieces"),
            std::string::npos)
      << g.results[0].ToString();
  EXPECT_EQ(store_->Stats().get_failures, 1u);
  EXPECT_FALSE(store_->Stats().breaker_open);
}

TEST_F(FsStoreScatter, AMissingObjectIsNotFoundAndThePiecesUntouched) {
  ExpectNothingLanded(Get({"nothing"}, {KvBlockLayout()}), 0, StatusCode::kNotFound);
}

TEST_F(FsStoreScatter, AnObjectSmallerThanThePiecesFillsTheLeadingOnes) {
  const auto bytes = RandomBytes(4096 + 1000, 7);
  ASSERT_NO_FATAL_FAILURE(PutValues({"small"}, {bytes}));
  ScatterResult g = Get({"small"}, {KvBlockLayout()});
  ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, 0, bytes));
  EXPECT_TRUE(std::equal(g.pieces[0].bufs[0].begin(), g.pieces[0].bufs[0].end(), bytes.begin()));
  EXPECT_EQ(g.pieces[0].bufs[1][999], bytes[4096 + 999]);
  EXPECT_EQ(g.pieces[0].bufs[1][1000], 0xAB);
}

// 600 pieces of 4 KiB, and 2000 of 1 KiB: more than IOV_MAX (1024), so one preadv cannot take
// them all.
TEST_F(FsStoreScatter, ThousandsOfSmallPiecesLandByteExact) {
  const std::vector<std::vector<uint8_t>> values = {
      RandomBytes(600 * 4096, 8), RandomBytes(2000 * 1024, 9), RandomBytes(2000 * 1024 - 100, 10)};
  const std::vector<std::string> names = {"x", "y", "z"};
  ASSERT_NO_FATAL_FAILURE(PutValues(names, values));
  ScatterResult g = Get(names, {std::vector<size_t>(600, 4096), std::vector<size_t>(2000, 1024),
                                std::vector<size_t>(2100, 1024)});
  for (size_t i = 0; i < values.size(); ++i) ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, i, values[i]));
}

// on_landed: the same store as the scatter tests.
class FsStoreLanded : public FsStoreScatter {};

// Objects into contiguous dests and into pieces (engine-sized, uneven with empty ones, more
// than IOV_MAX tiny ones), in one call: each told of its own ranges, once, in order.
TEST_F(FsStoreLanded, EveryRangeOfADestOrOfPiecesIsToldOnceInOrder) {
  const std::vector<std::vector<uint8_t>> values = {RandomBytes(kKvBlock, 20),
                                                    RandomBytes(5000, 21), RandomBytes(0, 22),
                                                    RandomBytes(70001, 23), RandomBytes(6000, 24)};
  const std::vector<std::string> names = {"a", "b", "c", "d", "e"};
  ASSERT_NO_FATAL_FAILURE(PutValues(names, values));
  std::vector<size_t> tiny;  // 1..7 bytes and empty, more than 1024 of them
  for (size_t k = 0, sum = 0; sum < 6000 + 5; sum += tiny.back(), ++k) tiny.push_back(k % 8);
  ASSERT_GT(tiny.size(), 1024u);
  const std::vector<std::vector<std::vector<size_t>>> ways = {
      {KvBlockLayout(), {1, 7, 0, 1000, 1, 7, 1000, 4000}, {3}, UnevenLayout(70001), tiny},
      {{kKvBlock}, {5000}, {0}, {70001 + 7}, {6000}}};
  for (size_t w = 0; w < ways.size(); ++w) {
    SCOPED_TRACE(w == 0 ? "into pieces" : "into a contiguous dest");
    ScatterResult g = Get(names, ways[w], w == 1 ? Receive::kDestLanded : Receive::kPiecesLanded);
    ASSERT_NO_FATAL_FAILURE(ExpectEachLandedAndToldOnce(g, values));
    EXPECT_TRUE(g.landed[2].empty()) << "an empty object has no range to tell";
  }
}

TEST_F(FsStoreLanded, NoRangeIsToldOfAnObjectTooLargeOrMissing) {
  const std::vector<std::vector<uint8_t>> values = {RandomBytes(kKvBlock + 1, 30),
                                                    RandomBytes(4000, 31)};
  ASSERT_NO_FATAL_FAILURE(PutValues({"big", "fits"}, values));
  const std::vector<std::string> names = {"big", "missing", "fits"};
  for (const bool dest : {false, true}) {
    SCOPED_TRACE(dest ? "into a contiguous dest" : "into pieces");
    ScatterResult g = dest ? Get(names, {{kKvBlock}, {kKvBlock}, {kKvBlock}}, Receive::kDestLanded)
                           : Get(names, {KvBlockLayout(), KvBlockLayout(), UnevenLayout(kKvBlock)},
                                 Receive::kPiecesLanded);
    ExpectNothingLanded(g, 0, StatusCode::kCorruption);
    ExpectNothingLanded(g, 1, StatusCode::kNotFound);
    ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, 2, values[1]));
    ExpectToldOnce(g, 2, values[1]);
  }
}

// A sysfs attribute: a regular file whose fstat size (a page) is more than it holds, as an
// object truncated underneath would be. Its path, its size, and what a read gives; no path when
// none is found.
struct ShortFile {
  std::string path;
  uint64_t size = 0;
  std::vector<uint8_t> bytes;
};
ShortFile ShorterThanItsSize() {
  for (const char* path : {"/sys/devices/system/cpu/possible", "/sys/devices/system/cpu/online",
                           "/sys/kernel/mm/transparent_hugepage/enabled"}) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
    if (bytes.size() >= 2 && bytes.size() < static_cast<uint64_t>(st.st_size)) {
      return {path, static_cast<uint64_t>(st.st_size), bytes};
    }
  }
  return {};
}

// The file ends before its size says: the first read stops inside the second piece, the next
// one, started there, finds the end. Ok with what was read, and that is what is told, a range
// a piece. (Only such a short read leaves the cursor inside a piece; the cursor's resumption
// with more bytes to come is PieceCursor's, tested through the Redis store's reads.)
TEST_F(FsStoreLanded, AFileEndingBeforeItsSizeIsToldUpToItsEnd) {
  const ShortFile file = ShorterThanItsSize();
  if (file.path.empty()) GTEST_SKIP() << "SKIPPED: no sysfs file shorter than its size to read";
  const std::string name = RemoteObjectName(4, BlockKey{0xab00000000000000ull, 4});
  ASSERT_EQ(symlink(file.path.c_str(), dir_.sub("g4/ab/" + name).c_str()), 0)
      << std::strerror(errno);
  ScatterResult g = Get({name}, {{1, file.size}}, Receive::kPiecesLanded);
  ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, 0, file.bytes)) << file.path;
  ExpectToldOnce(g, 0, file.bytes);
  EXPECT_EQ(g.landed[0].size(), 2u) << "one range a piece";
}

}  // namespace
}  // namespace kvtier

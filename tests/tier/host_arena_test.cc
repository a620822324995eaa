#include "tier/host_arena.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

std::unique_ptr<HostArena> MakeArena(uint64_t capacity, uint64_t slot) {
  HostArena::Config cfg;
  cfg.capacity_bytes = capacity;
  cfg.slot_bytes = slot;
  cfg.prefault_threads = 2;
  auto arena = HostArena::Create(cfg);
  EXPECT_TRUE(arena.ok()) << arena.status().ToString();
  return std::move(arena).value();
}

TEST(HostArenaTest, SlotsAreAlignedAndWithinCapacity) {
  // 10,000-byte slots round up to a 12,288-byte stride; 1 MiB holds 85 of them.
  auto arena = MakeArena(1 << 20, 10000);
  EXPECT_EQ(arena->slot_stride(), 12288u);
  EXPECT_EQ(arena->num_slots(), (1u << 20) / 12288);
  EXPECT_LE(uint64_t{arena->num_slots()} * arena->slot_stride(), 1u << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(arena->base()) % (2u << 20), 0u);
  std::set<uint32_t> seen;
  while (auto slot = arena->Allocate()) {
    EXPECT_LT(*slot, arena->num_slots());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arena->SlotData(*slot)) % HostArena::kSlotAlignment, 0u);
    EXPECT_TRUE(seen.insert(*slot).second) << "slot handed out twice";
    // The slot's bytes are ours: write them all.
    std::memset(arena->SlotData(*slot), 0xab, arena->slot_bytes());
  }
  EXPECT_EQ(seen.size(), arena->num_slots());
  EXPECT_EQ(arena->free_slots(), 0u);
  EXPECT_FALSE(arena->Allocate().has_value()) << "the arena never grows past its capacity";
}

TEST(HostArenaTest, ReleaseRejectsDoubleAndOutOfRange) {
  auto arena = MakeArena(64 * 4096, 4096);
  auto slot = arena->Allocate();
  ASSERT_TRUE(slot.has_value());
  EXPECT_TRUE(arena->Release(*slot).ok());
  Status twice = arena->Release(*slot);
  EXPECT_EQ(twice.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("double release"), std::string::npos);
  EXPECT_EQ(arena->Release(arena->num_slots()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(arena->free_slots(), arena->num_slots());
}

TEST(HostArenaTest, RejectsBadConfig) {
  HostArena::Config cfg;
  cfg.slot_bytes = 0;
  cfg.capacity_bytes = 1 << 20;
  EXPECT_EQ(HostArena::Create(cfg).status().code(), StatusCode::kInvalidArgument);
  cfg.slot_bytes = 1 << 20;
  cfg.capacity_bytes = 4096;
  Status s = HostArena::Create(cfg).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("capacity_bytes"), std::string::npos);
}

// Pre-faulting is real: when Create returns, every page of the arena is resident (mincore), and
// the time it took is reported. (This asserted prefault_ms >= 0 before, which cannot fail.)
TEST(HostArenaTest, ReportsStartupAndEveryPageIsResidentAfterIt) {
  auto arena = MakeArena(8 << 20, 1 << 20);
  EXPECT_EQ(arena->startup().threads, 2u);
  EXPECT_GT(arena->startup().prefault_ms, 0.0);
  EXPECT_LE(arena->startup().prefault_ms, arena->startup().total_ms());
  EXPECT_EQ(arena->mapped_bytes(), 8u << 20);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident(arena->mapped_bytes() / page);
  ASSERT_EQ(mincore(arena->base(), arena->mapped_bytes(), resident.data()), 0)
      << std::strerror(errno);
  size_t missing = 0;
  for (unsigned char r : resident) missing += (r & 1) ? 0 : 1;
  EXPECT_EQ(missing, 0u) << "pages not faulted in by Create";
}

// Without permission to lock memory (a small RLIMIT_MEMLOCK and no CAP_IPC_LOCK, as for most
// non-root users) the arena must still come up, unlocked, with a warning. Runs in a child
// process because dropping the capability is irreversible.
TEST(HostArenaTest, WorksUnlockedWhenMlockIsRefused) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer runtime intercepts mlock and reports success without locking, "
                  "so the refusal cannot happen here; this test runs in the release build";
#endif
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2]{};
    if (syscall(SYS_capget, &hdr, data) != 0) _exit(10);
    data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
    if (syscall(SYS_capset, &hdr, data) != 0) _exit(11);
    rlimit lim{64 << 10, 64 << 10};
    if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0) _exit(12);
    HostArena::Config cfg;
    cfg.capacity_bytes = 8 << 20;
    cfg.slot_bytes = 1 << 20;
    auto arena = HostArena::Create(cfg);
    if (!arena.ok()) _exit(13);
    if ((*arena)->startup().locked) _exit(14);  // the lock should have been refused
    auto slot = (*arena)->Allocate();
    if (!slot) _exit(15);
    std::memset((*arena)->SlotData(*slot), 1, (*arena)->slot_bytes());
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child step that failed: " << WEXITSTATUS(status);
}

TEST(HostArenaTest, MapFailureIsNoSpaceNotACrash) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers reserve terabytes of shadow memory, so RLIMIT_AS cannot be lowered "
                  "here; this test runs in the release build";
#else
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit lim{1ull << 30, 1ull << 30};  // 1 GiB of address space in all
    if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(10);
    HostArena::Config cfg;
    cfg.capacity_bytes = 4ull << 30;
    cfg.slot_bytes = 2 << 20;
    auto arena = HostArena::Create(cfg);
    if (arena.ok()) _exit(11);
    if (arena.status().code() != StatusCode::kNoSpace) _exit(12);
    if (arena.status().message().find("capacity_bytes") == std::string::npos) _exit(13);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child step that failed: " << WEXITSTATUS(status);
#endif
}

TEST(HostArenaTest, ConcurrentAllocateReleaseNeverDuplicates) {
  auto arena = MakeArena(256 * 4096, 4096);
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint32_t> mine;
      for (int i = 0; i < 20000; ++i) {
        if ((i + t) % 3 != 0) {
          if (auto s = arena->Allocate()) {
            // Stamp the slot with our id; nobody else may hold it meanwhile.
            *reinterpret_cast<int*>(arena->SlotData(*s)) = t;
            mine.push_back(*s);
          }
        } else if (!mine.empty()) {
          if (*reinterpret_cast<int*>(arena->SlotData(mine.back())) != t) ++errors;
          if (!arena->Release(mine.back()).ok()) ++errors;
          mine.pop_back();
        }
      }
      for (uint32_t s : mine) {
        if (!arena->Release(s).ok()) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(arena->free_slots(), arena->num_slots());
}

HostArena::Config SharedConfig(uint64_t capacity, uint64_t slot) {
  HostArena::Config cfg;
  cfg.capacity_bytes = capacity;
  cfg.slot_bytes = slot;
  cfg.prefault_threads = 2;
  cfg.shared = true;
  return cfg;
}

// Byte i of a slot filled with `seed`: differs between seeds and along the slot.
uint8_t PatternByte(uint8_t seed, uint64_t i) {
  return static_cast<uint8_t>(seed + i * 131 + (i >> 12));
}

void FillPattern(uint8_t* p, uint64_t n, uint8_t seed) {
  for (uint64_t i = 0; i < n; ++i) p[i] = PatternByte(seed, i);
}

bool HasPattern(const uint8_t* p, uint64_t n, uint8_t seed) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != PatternByte(seed, i)) return false;
  }
  return true;
}

// The point of a shared arena: another process maps the same bytes with Attach() on the fd (the
// child does not read through the mapping fork() left it; it checks its view is a second one).
// Both directions, and live: the parent writes one slot after the fork, before the child reads.
TEST(HostArenaTest, SharedArenaBytesCrossProcessesThroughAttach) {
  const HostArena::Config cfg = SharedConfig(8 << 20, 1 << 20);
  auto created = HostArena::Create(cfg);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  HostArena* arena = created->get();
  ASSERT_GE(arena->shared_fd(), 0);
  const auto before = arena->Allocate(), after = arena->Allocate(), by_child = arena->Allocate();
  ASSERT_TRUE(before && after && by_child);
  const uint64_t n = arena->slot_bytes();
  FillPattern(arena->SlotData(*before), n, 1);
  int go[2];
  ASSERT_EQ(pipe(go), 0) << std::strerror(errno);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(go[1]);
    auto view = HostArena::Attach(arena->shared_fd(), cfg);
    if (!view.ok()) _exit(10);
    if (!(*view)->attached()) _exit(11);
    if ((*view)->base() == arena->base()) _exit(12);  // must be a mapping of its own
    char c = 0;
    if (read(go[0], &c, 1) != 1) _exit(13);  // the parent has written `after`
    if (!HasPattern((*view)->SlotData(*before), n, 1)) _exit(14);
    if (!HasPattern((*view)->SlotData(*after), n, 2)) _exit(15);
    FillPattern((*view)->SlotData(*by_child), n, 3);
    _exit(0);
  }
  close(go[0]);
  FillPattern(arena->SlotData(*after), n, 2);
  ASSERT_EQ(write(go[1], "x", 1), 1);
  close(go[1]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "child step that failed: " << WEXITSTATUS(status);
  EXPECT_TRUE(HasPattern(arena->SlotData(*by_child), n, 3))
      << "the child's writes through its attached mapping are not in the parent's";
}

// The fd comes over a socket: a config that implies another size is refused, naming both.
TEST(HostArenaTest, AttachRejectsAConfigOfAnotherSize) {
  const HostArena::Config cfg = SharedConfig(8 << 20, 1 << 20);
  auto arena = HostArena::Create(cfg);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  for (uint64_t capacity : {uint64_t{16} << 20, uint64_t{4} << 20}) {
    HostArena::Config wrong = cfg;
    wrong.capacity_bytes = capacity;
    auto r = HostArena::Attach((*arena)->shared_fd(), wrong);
    ASSERT_FALSE(r.ok()) << "attached with capacity " << capacity;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find(std::to_string(8 << 20)), std::string::npos)
        << r.status().ToString();
    EXPECT_NE(r.status().message().find(std::to_string(capacity)), std::string::npos)
        << r.status().ToString();
  }
  EXPECT_EQ(HostArena::Attach(-1, cfg).status().code(), StatusCode::kInvalidArgument);
  HostArena::Config bad = cfg;
  bad.slot_bytes = 0;
  EXPECT_EQ(HostArena::Attach((*arena)->shared_fd(), bad).status().code(),
            StatusCode::kInvalidArgument);
}

// Not a memfd at all: a regular file of the wrong size, and a pipe (not a regular file).
TEST(HostArenaTest, AttachRejectsAFileOfTheWrongSizeAndANonFile) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string path = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/kvtier-g2-XXXXXX";
  const int fd = mkstemp(path.data());
  ASSERT_GE(fd, 0) << std::strerror(errno);
  unlink(path.c_str());
  ASSERT_EQ(ftruncate(fd, 3 * 4096), 0) << std::strerror(errno);
  const HostArena::Config cfg = SharedConfig(8 << 20, 1 << 20);
  auto r = HostArena::Attach(fd, cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("12288"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find(std::to_string(8 << 20)), std::string::npos)
      << r.status().ToString();
  close(fd);

  int p[2];
  ASSERT_EQ(pipe(p), 0);
  auto piped = HostArena::Attach(p[0], cfg);
  EXPECT_EQ(piped.status().code(), StatusCode::kInvalidArgument) << piped.status().ToString();
  close(p[0]);
  close(p[1]);
}

// An attached arena maps the owner's slots and lends none; it holds its own dup of the fd, so
// it outlives the owner's arena (and fd).
TEST(HostArenaTest, AttachedArenaRefusesAllocateAndRelease) {
  const HostArena::Config cfg = SharedConfig(8 << 20, 1 << 20);
  auto owner = HostArena::Create(cfg);
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  auto view = HostArena::Attach((*owner)->shared_fd(), cfg);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_TRUE((*view)->attached());
  EXPECT_FALSE((*owner)->attached());
  EXPECT_TRUE((*view)->startup().shared);
  EXPECT_EQ((*view)->num_slots(), (*owner)->num_slots());
  EXPECT_EQ((*view)->slot_stride(), (*owner)->slot_stride());
  EXPECT_EQ((*view)->slot_bytes(), (*owner)->slot_bytes());
  EXPECT_EQ((*view)->mapped_bytes(), (*owner)->mapped_bytes());
  EXPECT_NE((*view)->base(), (*owner)->base());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*view)->base()) % (2u << 20), 0u);
  ASSERT_GE((*view)->shared_fd(), 0);
  EXPECT_NE((*view)->shared_fd(), (*owner)->shared_fd()) << "Attach must dup the fd";
  EXPECT_TRUE(fcntl((*view)->shared_fd(), F_GETFD) & FD_CLOEXEC);

  EXPECT_FALSE((*view)->Allocate().has_value());
  EXPECT_EQ((*view)->free_slots(), 0u);
  auto slot = (*owner)->Allocate();
  ASSERT_TRUE(slot.has_value());
  Status refused = (*view)->Release(*slot);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("daemon's to lend"), std::string::npos) << refused.ToString();
  EXPECT_EQ((*owner)->free_slots(), (*owner)->num_slots() - 1) << "the owner's list changed";

  // Slot bytes are the same bytes in both mappings, both ways.
  FillPattern((*owner)->SlotData(*slot), cfg.slot_bytes, 5);
  EXPECT_TRUE(HasPattern((*view)->SlotData(*slot), cfg.slot_bytes, 5));
  FillPattern((*view)->SlotData(*slot), cfg.slot_bytes, 6);
  EXPECT_TRUE(HasPattern((*owner)->SlotData(*slot), cfg.slot_bytes, 6));
  EXPECT_TRUE((*owner)->Release(*slot).ok());

  owner->reset();  // closes the owner's fd and mapping
  EXPECT_NE(fcntl((*view)->shared_fd(), F_GETFD), -1) << std::strerror(errno);
  EXPECT_TRUE(HasPattern((*view)->SlotData(*slot), cfg.slot_bytes, 6));
}

// A shared arena hands out and takes back slots exactly as a private one, and its memfd is
// sized, sealed, pre-faulted and closed with the arena.
TEST(HostArenaTest, SharedArenaSlotsAllocateAndReleaseLikePrivate) {
  auto created = HostArena::Create(SharedConfig(1 << 20, 10000));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<HostArena> arena = std::move(created).value();
  EXPECT_TRUE(arena->startup().shared);
  EXPECT_FALSE(arena->attached());
  const int fd = arena->shared_fd();
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), arena->mapped_bytes());
  const int seals = fcntl(fd, F_GET_SEALS);
  ASSERT_GE(seals, 0) << std::strerror(errno);
  // ASSERT: without the seals the shrink below would succeed and the next touch raise SIGBUS.
  ASSERT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(ftruncate(fd, static_cast<off_t>(arena->mapped_bytes() * 2)), 0) << "grew";
  EXPECT_NE(ftruncate(fd, 4096), 0) << "shrank";
  struct statfs fs {};
  ASSERT_EQ(fstatfs(fd, &fs), 0);
  EXPECT_EQ(arena->startup().hugetlb, fs.f_type == HUGETLBFS_MAGIC);

  EXPECT_EQ(arena->slot_stride(), 12288u);
  EXPECT_EQ(arena->num_slots(), (1u << 20) / 12288);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(arena->base()) % (2u << 20), 0u);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident(arena->mapped_bytes() / page);
  ASSERT_EQ(mincore(arena->base(), arena->mapped_bytes(), resident.data()), 0);
  size_t missing = 0;
  for (unsigned char r : resident) missing += (r & 1) ? 0 : 1;
  EXPECT_EQ(missing, 0u) << "pages not faulted in by Create";

  std::set<uint32_t> seen;
  while (auto slot = arena->Allocate()) {
    EXPECT_LT(*slot, arena->num_slots());
    EXPECT_TRUE(seen.insert(*slot).second) << "slot handed out twice";
    std::memset(arena->SlotData(*slot), 0xab, arena->slot_bytes());
  }
  EXPECT_EQ(seen.size(), arena->num_slots());
  EXPECT_EQ(arena->free_slots(), 0u);
  for (uint32_t s : seen) EXPECT_TRUE(arena->Release(s).ok());
  EXPECT_EQ(arena->Release(*seen.begin()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(arena->Release(arena->num_slots()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(arena->free_slots(), arena->num_slots());

  arena.reset();
  errno = 0;
  EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "the arena's destructor did not close its memfd";
  EXPECT_EQ(errno, EBADF);
}

TEST(HostArenaTest, PrivateArenaHasNoSharedFd) {
  auto arena = MakeArena(1 << 20, 4096);
  EXPECT_EQ(arena->shared_fd(), -1);
  EXPECT_FALSE(arena->startup().shared);
  EXPECT_FALSE(arena->startup().hugetlb);
  EXPECT_FALSE(arena->attached());
  // A private arena really is private: a forked child's writes do not reach the parent.
  auto slot = arena->Allocate();
  ASSERT_TRUE(slot.has_value());
  std::memset(arena->SlotData(*slot), 1, 4096);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::memset(arena->SlotData(*slot), 2, 4096);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_EQ(arena->SlotData(*slot)[0], 1);
}

}  // namespace
}  // namespace kvtier

// kvtier serve with real processes: the daemon is the real `kvtier serve` binary, started and
// killed (SIGKILL) by the tests; engines are attached BlockManagers with a host G1, in this
// process and in child processes (this binary run again with KVTIER_TEST_SERVICE_ROLE, so each
// engine is its own process with its own mapping of G2). docs/service.md.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "client/attached_manager.h"
#include "core/unique_fd.h"
#include "kvtier/connector.h"
#include "kvtier/service_lookup.h"
#include "proto/protocol.h"
#include "proto/unix_socket.h"
#include "service_test_util.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

using namespace service_test;  // NOLINT: the helpers of every service test

// Runs this binary again as a child engine with `role`; returns its pid.
pid_t SpawnEngine(const std::string& role, const std::string& socket, const std::string& arg) {
  return SpawnSelf("service_test", "ServiceChild.Run",
                   {{"KVTIER_TEST_SERVICE_ROLE", role},
                    {"KVTIER_TEST_SERVICE_SOCKET", socket},
                    {"KVTIER_TEST_SERVICE_ARG", arg}});
}

// The child side. Roles:
//   load   loads prompt ARG (8 blocks) and exits 0 when all of it came from kvtier intact
//   save   computes and saves prompt ARG (8 blocks), exits 0
//   stall  commits prompt ARG (32 blocks), starts the saves with its copies stalled
//          (KVTIER_TEST_ATTACHED_COPY_STALL_MS), and waits to be killed
TEST(ServiceChild, Run) {
  const char* role = std::getenv("KVTIER_TEST_SERVICE_ROLE");
  if (role == nullptr) GTEST_SKIP() << "the child side of the service tests (run by them)";
  const std::string socket = std::getenv("KVTIER_TEST_SERVICE_SOCKET");
  const uint32_t seed = static_cast<uint32_t>(std::atoi(std::getenv("KVTIER_TEST_SERVICE_ARG")));
  Engine e = MakeEngine(socket, std::string("child-") + role + "-" + std::to_string(::getpid()));
  if (std::string(role) == "load") {
    bool ok = false;
    const uint32_t loaded = LookupAndLoad(e, "b-req", seed, 8, 0, &ok);
    std::fprintf(stderr, "child: loaded %u tokens, bytes %s\n", loaded, ok ? "ok" : "WRONG");
    _exit(loaded == 8 * 16 && ok ? 0 : 1);
  }
  if (std::string(role) == "save") {
    ComputeAndSave(e, "s-req", seed, 8);
    _exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  if (std::string(role) == "stall") {
    CommitStalledSaves(e, seed);
    std::fprintf(stderr, "child: saves started\n");
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  _exit(2);
}

// Two engine processes on one daemon: B's first request for a prefix A computed loads it from
// the shared G2, byte for byte.
TEST(Service, SecondEngineLoadsWhatTheFirstSaved) {
  ServedDir served("share");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start());
  Engine a = EngineThatSaved(socket, "engine-a", "a-req", 7, 8);
  EXPECT_EQ(a.manager->Stats().saved_blocks, 8u);
  EXPECT_EQ(WaitExit(SpawnEngine("load", socket, "7")), 0) << "B did not load A's prefix intact";
  // A prompt nobody computed is a miss for B.
  EXPECT_EQ(WaitExit(SpawnEngine("load", socket, "8")), 1);
  const ManagerStats s = a.manager->Stats();
  EXPECT_EQ(s.hit_blocks[kTierG2], 8u);
  EXPECT_EQ(s.pinned_blocks, 0u);
}

// An engine killed with -9 while its saves are in flight: the daemon stays up, the dead
// engine's unfinished saves are dropped (never served), its requests and slots come back, and
// the other engine is unaffected.
// A scheduler process's lookups straight to the daemon (ServiceLookup) under the engine's
// instance name: misses while that engine is not attached, then the request entry its Lookup
// makes is the one the engine's own PrepareLoad finds and loads from.
TEST(Service, SchedulerLookupsGoStraightToTheDaemon) {
  ServedDir served("lookup");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start());
  Config config;
  ASSERT_TRUE(config.Set("service.socket", socket).ok());
  ASSERT_TRUE(config.Set("service.reattach_ms", "50").ok());
  EXPECT_EQ(ServiceLookup::Create(config, "").status().code(), StatusCode::kInvalidArgument);
  Config no_socket;
  EXPECT_EQ(ServiceLookup::Create(no_socket, "x").status().code(), StatusCode::kInvalidArgument);
  auto sched = ServiceLookup::Create(config, "engine-b");
  ASSERT_TRUE(sched.ok()) << sched.status().ToString();
  const KvLayout l = TestLayout();
  const std::vector<TokenId> prompt = Prompt(21, 6 * l.tokens_per_block + 1);
  RequestSpec spec;
  spec.request_id = "sched-1";
  spec.prompt = prompt;
  // Nobody named engine-b is attached: a miss, not an error.
  auto early = (*sched)->Lookup(spec, 0);
  ASSERT_TRUE(early.ok()) << early.status().ToString();
  EXPECT_EQ(early->num_tokens, 0u);
  EXPECT_GE((*sched)->stats().failed_calls, 1u);
  EXPECT_FALSE((*sched)->stats().connected);
  spec.request_id.clear();
  EXPECT_EQ((*sched)->Lookup(spec, 0).status().code(), StatusCode::kInvalidArgument);
  spec.request_id = "sched-1";

  Engine a = EngineThatSaved(socket, "engine-a", "a-req", 21, 6);
  Engine b = MakeEngine(socket, "engine-b");
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // past service.reattach_ms
  auto found = (*sched)->Lookup(spec, 0);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->num_tokens, 6 * l.tokens_per_block);
  EXPECT_EQ(found->blocks_by_tier[kTierG2], 6u);
  EXPECT_TRUE((*sched)->stats().connected);
  // Engine B never looked "sched-1" up itself: its PrepareLoad finds the daemon's entry.
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 7; ++i) ids.push_back(10 + i);
  auto planned = b.manager->PrepareLoad("sched-1", ids, found->num_tokens);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(*planned, 6 * l.tokens_per_block);
  ASSERT_TRUE(b.manager->StartLoad().ok());
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    ASSERT_TRUE(b.manager->WaitLayer(layer).ok());
  }
  EXPECT_EQ(b.manager->LoadedTokens("sched-1"), 6 * l.tokens_per_block);
  for (uint32_t i = 0; i < 6; ++i) {
    EXPECT_TRUE(
        BlockIs(b.g1_bytes.data() + uint64_t{10 + i} * l.BlockBytes(), l.BlockBytes(), 21, i))
        << "block " << i;
  }
  EXPECT_FALSE(b.manager->RequestFinished("sched-1"));
  (void)b.manager->Finished();
  // Engine B gone: its instance ended, so the scheduler's lookups are misses again, at once.
  b.manager.reset();
  spec.request_id = "sched-2";
  const auto t0 = Clock::now();
  uint32_t tokens = 1;
  while (tokens != 0 && Clock::now() - t0 < std::chrono::seconds(5)) {
    auto r = (*sched)->Lookup(spec, 0);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    tokens = r->num_tokens;
    if (tokens != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(tokens, 0u) << "lookups for an ended instance still answered after 5 s";
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_FALSE((*sched)->stats().connected);
}

// A rogue (or buggy) engine: a data connection of its own, and the G2 memfd mapped and
// written over whole.
void ScribbleOverG2(const std::string& socket) {
  auto fd = proto::ConnectUnix(socket);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  auto reply = RawHello(fd->get(), proto::Role::kData, "scribbler");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  proto::WireReader r(reply->payload);
  Status status;
  proto::HelloReply hr;
  ASSERT_TRUE(proto::DecodeStatus(&r, &status).ok());
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_TRUE(proto::DecodeHelloReply(&r, &hr).ok());
  ASSERT_TRUE(reply->fd) << "no G2 memfd with the data Hello's reply";
  void* map =
      ::mmap(nullptr, hr.g2_capacity_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, reply->fd.get(), 0);
  ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);
  std::memset(map, 0xab, hr.g2_capacity_bytes);
  ::munmap(map, hr.g2_capacity_bytes);
}

// Every engine maps G2 writable. The daemon takes each block's checksum when the engine's save
// of it lands (its commit), so a block some engine wrote into afterwards is never persisted:
// here a rogue client scribbles over the whole mapping, the daemon shuts down (flushing G2 to
// G3, and what G3 is given on to G4) and restarts, and only the blocks saved after the scribble
// come back.
TEST(Service, BlockChangedAfterItsCommitIsNeverPersisted) {
  ServedDir served("checksum");
  auto& [dir, socket, daemon] = served;
  const std::string g3 = dir + "/g3", g4 = dir + "/g4";
  ASSERT_NO_FATAL_FAILURE(daemon.Start(1000, g3, g4));
  {
    Engine a = EngineThatSaved(socket, "engine-a", "a1", 31, 4);
    ASSERT_NO_FATAL_FAILURE(ScribbleOverG2(socket));
    // Saved after the scribble: its checksum is of its own bytes.
    ComputeAndSave(a, "a2", 32, 3, 20);
  }
  EXPECT_EQ(daemon.Kill(SIGTERM), 0) << "kvtier serve did not shut down cleanly";
  ASSERT_NO_FATAL_FAILURE(daemon.Start(1000, g3, g4));
  Engine b = MakeEngine(socket, "engine-b");
  bool bytes_ok = false;
  EXPECT_EQ(LookupAndLoad(b, "b1", 32, 3, 0, &bytes_ok), 3 * b.g1.layout.tokens_per_block)
      << "the block saved after the scribble did not come back from G3";
  EXPECT_TRUE(bytes_ok);
  EXPECT_EQ(LookupAndLoad(b, "b2", 31, 4, 10, &bytes_ok), 0u)
      << "a block changed after its commit was persisted to G3 or G4 and served";
  // G4 alone (G3 emptied): the same.
  b.manager.reset();
  EXPECT_EQ(daemon.Kill(SIGKILL), SIGKILL);
  fs::remove_all(g3);
  ASSERT_NO_FATAL_FAILURE(daemon.Start(1000, g3, g4));
  Engine c = MakeEngine(socket, "engine-c");
  EXPECT_EQ(LookupAndLoad(c, "c1", 32, 3, 0, &bytes_ok), 3 * c.g1.layout.tokens_per_block)
      << "the block saved after the scribble is not in G4";
  EXPECT_TRUE(bytes_ok);
  EXPECT_EQ(LookupAndLoad(c, "c2", 31, 4, 10, &bytes_ok), 0u)
      << "a block changed after its commit was persisted to G4 and served";
}

// Without G3 and without write-through, G2's victims go straight to G4 (DemoteToG4): a block
// some engine wrote into after its commit must not be written there either. (Found in the
// issue 42 carve: that path did not pass the commit checksum, so G4 took the scribbled bytes,
// checksummed them as its own, and served them after a restart.)
TEST(Service, BlockChangedAfterItsCommitIsNotEvictedIntoG4) {
  ServedDir served("checksum-g4");
  auto& [dir, socket, daemon] = served;
  const std::string g4 = dir + "/g4";
  const std::vector<std::pair<std::string, std::string>> small_g2 = {
      {"KVTIER_G2_CAPACITY_BYTES", "384KiB"}};
  ASSERT_NO_FATAL_FAILURE(daemon.Start(1000, "", g4, small_g2));
  {
    Engine a = EngineThatSaved(socket, "engine-a", "a1", 41, 4);
    ASSERT_NO_FATAL_FAILURE(ScribbleOverG2(socket));
    // Saved after the scribble: they push a1's blocks out of G2, to G4 if anywhere.
    for (uint32_t i = 0; i < 8; ++i) ComputeAndSave(a, "a" + std::to_string(i + 2), 42 + i, 4, 20);
    const ManagerStats s = a.manager->Stats();
    EXPECT_GT(s.evicted_blocks_g2, 4u) << "G2 never evicted: the test did not reach DemoteToG4";
    EXPECT_GT(s.g4_saved_blocks, 0u) << "nothing was evicted into G4";
  }
  EXPECT_EQ(daemon.Kill(SIGTERM), 0) << "kvtier serve did not shut down cleanly";
  ASSERT_NO_FATAL_FAILURE(daemon.Start(1000, "", g4, small_g2));
  Engine c = MakeEngine(socket, "engine-c");
  bool bytes_ok = false;
  const uint32_t loaded = LookupAndLoad(c, "c1", 41, 4, 0, &bytes_ok);
  EXPECT_EQ(loaded, 0u) << "a block changed after its commit was evicted into G4 and served"
                        << (bytes_ok ? "" : " (with the scribbled bytes)");
}

// An engine stopped (SIGSTOP) with saves lent to it: the other engine's lookups, saves and
// loads go on (well within 5 s: the stopped engine holds its lent saves for ever).
TEST(Service, StoppedEngineDoesNotStallTheOthers) {
  ServedDir served("stop");
  auto& [dir, socket, daemon] = served;
  // A lease longer than the child's stalled batches (8 blocks x 100 ms), so they are lent, not
  // refused as late.
  ASSERT_NO_FATAL_FAILURE(daemon.Start(/*lease_ms=*/10000));
  Engine a = EngineThatSaved(socket, "engine-a", "a-warm", 41, 2, 0);
  const uint64_t saved = a.manager->Stats().saved_blocks;
  ::setenv("KVTIER_TEST_ATTACHED_COPY_STALL_MS", "100", 1);
  pid_t child = SpawnEngine("stall", socket, "42");
  ::unsetenv("KVTIER_TEST_ATTACHED_COPY_STALL_MS");
  struct Reap {
    pid_t pid;
    ~Reap() {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        (void)WaitExit(pid);
      }
    }
  } reap{child};
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline && a.manager->Stats().saved_blocks < saved + 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(a.manager->Stats().saved_blocks, saved + 1) << "the child's saves never started";
  ::kill(child, SIGSTOP);  // its remaining saves stay lent to a process that does not run
  const auto t0 = Clock::now();
  ComputeAndSave(a, "a-during", 43, 8, 8);
  bool ok = false;
  EXPECT_EQ(LookupAndLoad(a, "a-load", 43, 8, 24, &ok), 8u * 16);
  EXPECT_TRUE(ok);
  const auto took = Clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(5))
      << "a stopped engine stalled another's save and load for "
      << std::chrono::duration<double>(took).count() << " s";
  ::kill(child, SIGKILL);
  EXPECT_EQ(WaitExit(child), 128 + SIGKILL);
  reap.pid = -1;
}

// A client of another uid is refused by the daemon itself (SO_PEERCRED), even when the socket's
// directory has been opened to it.
TEST(Service, ClientOfAnotherUidIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run a client as uid 65534";
  ServedDir served("uid");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start());
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod((dir + "/sock").c_str(), 0755), 0);
  ASSERT_EQ(::chmod(socket.c_str(), 0777), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(3);
    auto fd = proto::ConnectUnix(socket);
    if (!fd.ok()) _exit(4);
    auto reply = RawHello(fd->get(), proto::Role::kCall, "intruder");
    if (!reply.ok()) _exit(0);  // closed before or after the Hello: refused
    proto::WireReader r(reply->payload);
    Status status;
    if (!proto::DecodeStatus(&r, &status).ok()) _exit(5);
    std::fprintf(stderr, "intruder: %s\n", status.ToString().c_str());
    _exit(status.code() == StatusCode::kFailedPrecondition ? 0 : 1);
  }
  EXPECT_EQ(WaitExit(pid), 0) << "a client of uid 65534 was not refused";
  // The daemon's own engines are still served.
  Engine a = EngineThatSaved(socket, "engine-a", "a-req", 44, 2);
  EXPECT_EQ(a.manager->Stats().saved_blocks, 2u);
}

TEST(Service, EngineKilledMidSaveLosesOnlyItsUnfinishedSaves) {
  ServedDir served("kill");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start(/*lease_ms=*/500));
  Engine a = EngineThatSaved(socket, "engine-a", "a-req", 3, 8, 0);
  const ManagerStats before = a.manager->Stats();

  ::setenv("KVTIER_TEST_ATTACHED_COPY_STALL_MS", "20", 1);
  pid_t child = SpawnEngine("stall", socket, "11");
  ::unsetenv("KVTIER_TEST_ATTACHED_COPY_STALL_MS");
  // Wait until its first batch reached G2 but not all four (8 blocks of 20 ms each a batch).
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline && a.manager->Stats().saved_blocks < before.saved_blocks + 8) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(child, SIGKILL);
  EXPECT_EQ(WaitExit(child), 128 + SIGKILL);

  // Within the bound its instance ends: requests finished, pins and slots back.
  ManagerStats s;
  const auto bound = Clock::now() + std::chrono::seconds(5);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s = a.manager->Stats();
  } while (Clock::now() < bound && (s.tracked_requests != 0 || s.pinned_blocks != 0 ||
                                    s.g2_free_slots + s.g2_blocks != s.g2_slots));
  EXPECT_EQ(s.tracked_requests, 0u);
  EXPECT_EQ(s.pinned_blocks, 0u);
  EXPECT_EQ(s.g2_free_slots + s.g2_blocks, s.g2_slots) << "a dead engine's G2 slots leaked";
  EXPECT_LT(s.saved_blocks, before.saved_blocks + 32) << "the kill came after every save";

  // The other engine is unaffected: its prefix still loads intact.
  bool ok = false;
  EXPECT_EQ(LookupAndLoad(a, "a-again", 3, 8, 16, &ok), 8u * 16);
  EXPECT_TRUE(ok);
  // What the dead engine finished saving is its own prefix, exact; nothing else is served.
  const uint32_t loaded = LookupAndLoad(a, "k-check", 11, 32, 24, &ok);
  EXPECT_TRUE(ok) << "a block the killed engine was writing was served";
  EXPECT_GE(loaded, 8u * 16) << "not even its first batch, which ended before the kill, is served";
  EXPECT_LT(loaded, 32u * 16);
}

// kill -9 of the daemon: the engine's calls turn into misses (never an error, never a hang),
// then it attaches again by itself once a daemon is back, and reuses again.
TEST(Service, DaemonKilledTurnsCallsIntoMissesThenReattaches) {
  ServedDir served("daemon");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start());
  Engine a = EngineThatSaved(socket, "engine-a", "a-req", 5, 8);
  const uint64_t saved_before = a.manager->Stats().saved_blocks;
  ASSERT_EQ(saved_before, 8u);
  daemon.Kill(SIGKILL);

  const auto t0 = Clock::now();
  bool ok = false;
  EXPECT_EQ(LookupAndLoad(a, "miss-1", 5, 8, 16, &ok), 0u);
  RequestSpec spec;
  const std::vector<TokenId> prompt = Prompt(5, 8 * 16 + 1);
  spec.request_id = "miss-2";
  spec.prompt = prompt;
  auto found = a.manager->Lookup(spec, 0);
  ASSERT_TRUE(found.ok()) << "a gone daemon must be a miss, not " << found.status().ToString();
  EXPECT_EQ(found->num_tokens, 0u);
  std::vector<uint32_t> ids(9);
  EXPECT_TRUE(a.manager->Commit("miss-2", prompt, ids).ok());
  EXPECT_FALSE(a.manager->RequestFinished("miss-2"));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3)) << "calls hung on a dead daemon";
  // Counters never go backwards (engines report their deltas): the last answer stands.
  EXPECT_EQ(a.manager->Stats().saved_blocks, saved_before);

  Daemon again(socket);
  ASSERT_NO_FATAL_FAILURE(again.Start());
  // Attaches within service.reattach_ms of a call; G2 is new, so compute once, then reuse.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ComputeAndSave(a, "b-req", 6, 8);
  EXPECT_EQ(WaitExit(SpawnEngine("load", socket, "6")), 0);
  // The new daemon's counters add to the old one's.
  EXPECT_EQ(a.manager->Stats().hit_blocks[kTierG2], 8u);
  EXPECT_EQ(a.manager->Stats().saved_blocks, saved_before + 8);
}

// A peer that sends garbage is cut off; the daemon keeps serving the others.
TEST(Service, BadFramesEndOnlyTheirConnection) {
  ServedDir served("bad");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start());
  Engine a = MakeEngine(socket, "engine-a");
  uint32_t seed = 99;
  for (int i = 0; i < 50; ++i) {
    auto fd = proto::ConnectUnix(socket);
    ASSERT_TRUE(fd.ok());
    std::vector<uint8_t> junk(1 + (seed % 200));
    for (auto& b : junk) {
      seed = seed * 1103515245u + 12345u;
      b = static_cast<uint8_t>(seed >> 16);
    }
    if (i % 2 == 0) {
      // A well-formed frame header around a payload that is not a Hello.
      (void)proto::SendFrame(fd->get(), static_cast<uint16_t>(proto::MsgType::kHello), 1, junk, -1,
                             Clock::now() + std::chrono::seconds(1));
      auto reply = proto::RecvFrame(fd->get(), Clock::now() + std::chrono::seconds(5));
      ASSERT_TRUE(reply.ok()) << reply.status().ToString();
      proto::WireReader r(reply->payload);
      Status st;
      ASSERT_TRUE(proto::DecodeStatus(&r, &st).ok());
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    } else {
      (void)::write(fd->get(), junk.data(), junk.size());
    }
  }
  ComputeAndSave(a, "a-req", 1, 4);
  bool ok = false;
  EXPECT_EQ(LookupAndLoad(a, "a-again", 1, 4, 8, &ok), 4u * 16);
  EXPECT_TRUE(ok);
}

}  // namespace
}  // namespace kvtier

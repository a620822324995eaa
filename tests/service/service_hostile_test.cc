// kvtier serve against hostile and broken local peers (issue 40): an engine that detaches in
// the middle of its saves, one whose data connection is cut, one stopped with SIGSTOP while
// others wait for their saves, two engines given one instance name, a listener of another uid
// on the socket's path, a flood of silent connections under a low RLIMIT_NPROC, a peer of
// another uid (refused before a byte of it is read, or allowed by service.allowed_gids but
// kept out of other engines' instances), oversized Hellos, thousands of distinct salts, and a
// pool closed under its lookup connections. Real `kvtier serve` processes, real uids (root
// runs children as uid 65534), real signals.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <fstream>

#include "kvtier/service_lookup.h"
#include "proto/wire.h"
#include "service_test_util.h"

namespace kvtier {
namespace {

using namespace service_test;  // NOLINT: the helpers of every service test

constexpr uid_t kNobody = 65534;

// Kills and reaps a child at scope end unless released.
struct Reap {
  pid_t pid = -1;
  ~Reap() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      (void)WaitExit(pid);
    }
  }
};

// Runs this binary again as a child with `role` (ServiceHostileChild.Run below).
pid_t Spawn(const std::string& role, const std::string& socket, const std::string& arg = "0",
            const std::vector<std::pair<std::string, std::string>>& env = {}) {
  std::vector<std::pair<std::string, std::string>> all = {{"KVTIER_TEST_HOSTILE_ROLE", role},
                                                          {"KVTIER_TEST_HOSTILE_SOCKET", socket},
                                                          {"KVTIER_TEST_HOSTILE_ARG", arg}};
  all.insert(all.end(), env.begin(), env.end());
  return SpawnSelf("service_hostile_test", "ServiceHostileChild.Run", all);
}

// Drops to uid/gid 65534 with no supplementary groups; false when not permitted.
bool BecomeNobody() {
  return ::setgroups(0, nullptr) == 0 && ::setgid(kNobody) == 0 && ::setuid(kNobody) == 0;
}

constexpr int kNoSetuid = 10;

// A fresh directory TempDir(`tag`) that all may enter, with a directory "sock" of mode `mode`
// owned by uid 65534 in it; `*socket` is the socket path there. Wrap in ASSERT_NO_FATAL_FAILURE.
void SocketInNobodysDir(const std::string& tag, mode_t mode, std::string* socket) {
  const std::string dir = TempDir(tag);
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  const std::string sock_dir = dir + "/sock";
  ASSERT_EQ(::mkdir(sock_dir.c_str(), mode), 0);
  ASSERT_EQ(::chown(sock_dir.c_str(), kNobody, kNobody), 0);
  *socket = sock_dir + "/kvtier.sock";
}

// The child side. Roles:
//   stall      commits prompt ARG (32 blocks), starts its saves with its copies stalled, and
//              waits to be killed
//   same-name  attaches as instance "shared-name"; exits 0 when refused with the reason
//   other-uid  as uid 65534 (service.allowed_gids lets it attach): saves and loads its own
//              prompt, then tries to join instance "engine-a" for lookups; exits 0 when its own
//              blocks load and it learns nothing of engine-a's prompt ARG
//   flood      as uid 65534: opens ARG connections, sends nothing, holds them 2 s
//   probe      as uid 65534: attaches, saves and loads prompt ARG; exits 0 when byte-exact
TEST(ServiceHostileChild, Run) {
  const char* role_env = std::getenv("KVTIER_TEST_HOSTILE_ROLE");
  if (role_env == nullptr) GTEST_SKIP() << "the child side of the hostile-peer tests";
  const std::string role = role_env;
  const std::string socket = std::getenv("KVTIER_TEST_HOSTILE_SOCKET");
  const uint32_t arg = static_cast<uint32_t>(std::atoi(std::getenv("KVTIER_TEST_HOSTILE_ARG")));
  if (role == "stall") {
    Engine e = MakeEngine(socket, "child-stall-" + std::to_string(::getpid()));
    CommitStalledSaves(e, arg);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (role == "same-name") {
    Result<Engine> e = TryMakeEngine(socket, "shared-name");
    std::fprintf(stderr, "child: %s\n", e.status().ToString().c_str());
    const bool refused =
        !e.ok() && e.status().code() == StatusCode::kFailedPrecondition &&
        e.status().message().find("in use by another engine process") != std::string::npos;
    _exit(refused ? 0 : 1);
  }
  if (role == "other-uid" || role == "flood" || role == "probe") {
    if (!BecomeNobody()) _exit(kNoSetuid);
  }
  if (role == "other-uid") {
    // An engine of another uid names the daemon's (root's) uid: it checks who answers.
    Result<Engine> e =
        TryMakeEngine(socket, "engine-x", "service-test", 64, {{"service.daemon_uid", "0"}});
    if (!e.ok()) {
      std::fprintf(stderr, "child: attach as uid 65534: %s\n", e.status().ToString().c_str());
      _exit(2);
    }
    ComputeAndSave(*e, "x-req", arg + 1, 4);
    bool ok = false;
    const uint32_t own = LookupAndLoad(*e, "x-again", arg + 1, 4, 8, &ok);
    if (own != 4 * 16 || !ok) _exit(3);
    Config c;
    (void)c.Set("service.socket", socket);
    (void)c.Set("service.daemon_uid", "0");
    Result<std::unique_ptr<ServiceLookup>> lookup = ServiceLookup::Create(c, "engine-a");
    if (!lookup.ok()) _exit(4);
    const std::vector<TokenId> prompt = Prompt(arg, 4 * 16 + 1);
    RequestSpec spec;
    spec.request_id = "peek";
    spec.prompt = prompt;
    Result<LookupResult> peek = (*lookup)->Lookup(spec, 0);
    std::fprintf(stderr, "child: lookup through engine-a: %s %u tokens\n",
                 peek.status().ToString().c_str(), peek.ok() ? peek->num_tokens : 0);
    _exit(peek.ok() && peek->num_tokens != 0 ? 5 : 0);
  }
  if (role == "flood") {
    std::vector<UniqueFd> held;
    for (uint32_t i = 0; i < arg; ++i) {
      Result<UniqueFd> c = proto::ConnectUnix(socket);
      if (c.ok()) held.push_back(std::move(*c));
    }
    std::fprintf(stderr, "child: holding %zu silent connections\n", held.size());
    std::this_thread::sleep_for(std::chrono::seconds(2));
    _exit(held.empty() ? 1 : 0);
  }
  if (role == "probe") {
    Result<Engine> e = TryMakeEngine(socket, "probe-" + std::to_string(::getpid()));
    if (!e.ok()) {
      std::fprintf(stderr, "child: probe: %s\n", e.status().ToString().c_str());
      _exit(2);
    }
    ComputeAndSave(*e, "p-req", arg, 4);
    bool ok = false;
    const uint32_t n = LookupAndLoad(*e, "p-again", arg, 4, 8, &ok);
    _exit(n == 4 * 16 && ok && !::testing::Test::HasFailure() ? 0 : 3);
  }
  _exit(99);
}

// Engine A (calls time out after 300 ms; each block its data thread copies waits 100 ms
// first) commits 16 blocks of prompt `seed` and starts saving them: the saves run for ~1.6 s.
Result<Engine> EngineSavingSlowly(const std::string& socket, uint32_t seed) {
  ::setenv("KVTIER_TEST_ATTACHED_COPY_STALL_MS", "100", 1);
  Result<Engine> a =
      TryMakeEngine(socket, "engine-a", "service-test", 64, {{"service.call_timeout_ms", "300"}});
  ::unsetenv("KVTIER_TEST_ATTACHED_COPY_STALL_MS");
  if (!a.ok()) return a.status();
  const KvLayout& l = a->g1.layout;
  const std::vector<TokenId> prompt = Prompt(seed, 16 * l.tokens_per_block + 1);
  RequestSpec spec;
  spec.request_id = "a-req";
  spec.prompt = prompt;
  KVTIER_RETURN_IF_ERROR(a->manager->Lookup(spec, 0).status());
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i <= 16; ++i) ids.push_back(i);
  KVTIER_RETURN_IF_ERROR(a->manager->PrepareLoad("a-req", ids, 0).status());
  for (uint32_t i = 0; i < 16; ++i) {
    FillBlock(a->g1_bytes.data() + uint64_t{i} * l.BlockBytes(), l.BlockBytes(), seed, i);
  }
  KVTIER_RETURN_IF_ERROR(a->manager->Commit("a-req", prompt, ids));
  KVTIER_RETURN_IF_ERROR(a->manager->StartSave());
  return a;
}

// Finding 2: an engine whose call times out detaches while its data thread is in the middle
// of a save batch. The daemon takes the batch's slots back when the data connection ends and
// lends them to the next engine. The detached engine must not write them any more: B's blocks,
// saved into those slots afterwards, load byte for byte.
TEST(ServiceHostile, DetachedEngineWritesNoSlotTheDaemonGaveBack) {
  ServedDir served("detach");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start(/*lease_ms=*/20000));
  Engine b = MakeEngine(socket, "engine-b");
  // A commits 16 blocks; its copies take 100 ms a block.
  Result<Engine> a = EngineSavingSlowly(socket, 1);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  // The daemon stops answering for a moment: A's next call times out and A detaches.
  ::kill(daemon.pid(), SIGSTOP);
  RequestSpec other;
  other.request_id = "a-other";
  const std::vector<TokenId> other_prompt = Prompt(5, 33);
  other.prompt = other_prompt;
  (void)a->manager->Lookup(other, 0);
  ::kill(daemon.pid(), SIGCONT);
  // B saves 16 blocks into what the daemon has free (A's slots among them), then waits as
  // long as A's stalled copies would have gone on.
  ComputeAndSave(b, "b-req", 2, 16, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  bool bytes_ok = false;
  EXPECT_EQ(LookupAndLoad(b, "b-load", 2, 16, 20, &bytes_ok), 16u * 16);
  EXPECT_TRUE(bytes_ok) << "B's blocks were overwritten by a detached engine's copies";
}

// The attached destructor waits for the engine's saves in flight (connector.h), bounded as
// WaitForSaves is: a daemon stopped (SIGSTOP) in the middle of them holds the engine's exit no
// longer than service.call_timeout_ms plus four leases.
TEST(ServiceHostile, StoppedDaemonHoldsTheAttachedDestructorNoLongerThanItsBound) {
  ServedDir served("dtor");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start(/*lease_ms=*/500));
  Result<Engine> a = EngineSavingSlowly(socket, 7);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ::kill(daemon.pid(), SIGSTOP);
  const auto t0 = Clock::now();
  a->manager.reset();
  const auto took = Clock::now() - t0;
  ::kill(daemon.pid(), SIGCONT);
  // 300 ms + 4 x 500 ms, and room for a sanitizer build on a busy machine.
  EXPECT_LT(took, std::chrono::milliseconds(300 + 4 * 500 + 3000))
      << "a stopped daemon held the attached destructor past its bound";
}

// The highest-numbered descriptor of this process connected to `daemon`: an engine's data
// connection opens after its first call connection.
int NewestConnectionTo(pid_t daemon) {
  int found = -1;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(entry.path().filename().c_str());
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid == daemon) {
      found = std::max(found, fd);
    }
  }
  return found;
}

// Finding 4: the data connection alone is cut while the daemon lives. The engine detaches
// (misses, not hits that fail to load) and attaches again with a new data connection: its
// prompt loads byte for byte again within a few seconds.
TEST(ServiceHostile, CutDataConnectionDetachesAndAttachesAgain) {
  ServedDir served("cut");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start());
  Engine a = EngineThatSaved(socket, "engine-a", "a-req", 3, 4);
  bool bytes_ok = false;
  ASSERT_EQ(LookupAndLoad(a, "a-load", 3, 4, 8, &bytes_ok), 4u * 16);
  const int data = NewestConnectionTo(daemon.pid());
  ASSERT_GE(data, 0);
  ASSERT_EQ(::shutdown(data, SHUT_RDWR), 0);
  uint32_t loaded = 0;
  for (const auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(5);) {
    loaded = LookupAndLoad(a, "a-again", 3, 4, 8, &bytes_ok);
    if (loaded == 4u * 16 && bytes_ok) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(loaded, 4u * 16) << "an engine without a data connection stayed attached: its hits "
                                "never load";
  EXPECT_TRUE(bytes_ok);
}

// Finding 7: an engine stopped (SIGSTOP) with saves lent to it holds up no other engine's
// WaitForSaves.
TEST(ServiceHostile, StoppedEngineDoesNotDelayAnothersWaitForSaves) {
  ServedDir served("waitsaves");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start(/*lease_ms=*/20000));
  Engine b = MakeEngine(socket, "engine-b");
  const uint64_t saved = b.manager->Stats().saved_blocks;
  Reap child{Spawn("stall", socket, "42", {{"KVTIER_TEST_ATTACHED_COPY_STALL_MS", "100"}})};
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline && b.manager->Stats().saved_blocks < saved + 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(b.manager->Stats().saved_blocks, saved + 1) << "the child's saves never started";
  ::kill(child.pid, SIGSTOP);
  ComputeAndSave(b, "b-req", 43, 4, 0);
  const auto t0 = Clock::now();
  b.manager->WaitForSaves();
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(took, 1.0) << "a stopped engine's lent saves held another engine's WaitForSaves";
  bool bytes_ok = false;
  EXPECT_EQ(LookupAndLoad(b, "b-load", 43, 4, 8, &bytes_ok), 4u * 16);
  EXPECT_TRUE(bytes_ok);
}

// Finding 8: a second engine process given an instance name that a live engine holds is
// refused at start, with the reason.
TEST(ServiceHostile, SecondEngineWithTheSameInstanceNameIsRefused) {
  ServedDir served("samename");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start());
  Engine a = EngineThatSaved(socket, "shared-name", "a-req", 4, 2);
  EXPECT_EQ(WaitExit(Spawn("same-name", socket)), 0)
      << "a second engine process joined a live engine's instance";
  // The first engine is untouched.
  bool bytes_ok = false;
  EXPECT_EQ(LookupAndLoad(a, "a-load", 4, 2, 8, &bytes_ok), 2u * 16);
  EXPECT_TRUE(bytes_ok);
}

// Finding 3: another user owns the socket's directory and listens there. The engine checks
// who answers (SO_PEERCRED) before it sends anything: the listener hears not a byte (no model
// id, no instance), and the engine refuses to start, naming the uid it found.
TEST(ServiceHostile, ListenerOfAnotherUidHearsNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a listener as uid 65534";
  std::string socket;
  ASSERT_NO_FATAL_FAILURE(SocketInNobodysDir("fake", 0755, &socket));
  int ready[2], heard[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(heard), 0);
  const pid_t fake = ::fork();
  if (fake == 0) {
    if (!BecomeNobody()) _exit(kNoSetuid);
    const int l = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket.c_str());
    if (::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(l, 8) != 0) {
      _exit(2);
    }
    ::chmod(socket.c_str(), 0777);
    (void)!::write(ready[1], "r", 1);
    uint64_t total = 0;
    for (int round = 0; round < 3; ++round) {
      pollfd p{l, POLLIN, 0};
      if (::poll(&p, 1, 1500) != 1) break;
      const int c = ::accept(l, nullptr, nullptr);
      pollfd q{c, POLLIN, 0};
      char buf[4096];
      while (::poll(&q, 1, 500) == 1) {
        const ssize_t n = ::read(c, buf, sizeof(buf));
        if (n <= 0) break;
        total += static_cast<uint64_t>(n);
      }
      ::close(c);
    }
    (void)!::write(heard[1], &total, sizeof(total));
    _exit(0);
  }
  Reap reap{fake};
  char r = 0;
  ASSERT_EQ(::read(ready[0], &r, 1), 1) << "the fake daemon did not start";
  Result<Engine> e = TryMakeEngine(socket, "engine-a");
  uint64_t total = 0;
  ASSERT_EQ(::read(heard[0], &total, sizeof(total)), static_cast<ssize_t>(sizeof(total)));
  EXPECT_EQ(total, 0u) << "a listener of uid 65534 received " << total
                       << " bytes of the engine's Hello";
  EXPECT_FALSE(e.ok()) << "the engine started against a listener of another uid";
  EXPECT_NE(e.status().message().find("runs as uid 65534"), std::string::npos)
      << e.status().ToString();
  reap.pid = -1;
  EXPECT_EQ(WaitExit(fake), 0);
}

// Finding 5: a flood of silent connections against a daemon whose uid may run few threads
// (RLIMIT_NPROC). The daemon refuses what it cannot serve, never aborts, and serves an engine
// once the flood is gone.
TEST(ServiceHostile, FloodOfSilentConnectionsUnderALowThreadLimit) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the daemon as uid 65534";
  std::string socket;
  ASSERT_NO_FATAL_FAILURE(SocketInNobodysDir("flood", 0700, &socket));
  const pid_t daemon = ::fork();
  if (daemon == 0) {
    // Few threads for uid 65534 (RLIMIT_NPROC counts that uid's threads); the flooding child
    // and the probe run as 65534 too, with their own (unlimited) rlimit.
    const rlimit lim{48, 48};
    if (!BecomeNobody() || ::setrlimit(RLIMIT_NPROC, &lim) != 0) _exit(kNoSetuid);
    ::setenv("KVTIER_G2_CAPACITY_BYTES", "8MiB", 1);
    ::setenv("KVTIER_G3_ENABLED", "false", 1);
    ::setenv("KVTIER_G2_LOCK_MEMORY", "false", 1);
    ::execl(KVTIER_CLI_PATH, KVTIER_CLI_PATH, "serve", "--socket", socket.c_str(),
            static_cast<char*>(nullptr));
    _exit(127);
  }
  Reap reap{daemon};
  bool up = false;
  for (const auto t0 = Clock::now(); !up && Clock::now() - t0 < std::chrono::seconds(20);) {
    up = proto::ConnectUnix(socket).ok();
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(up) << "kvtier serve as uid 65534 did not listen";
  const int flood = WaitExit(Spawn("flood", socket, "300"));
  if (flood == kNoSetuid) GTEST_SKIP() << "setuid(65534) is not permitted here";
  EXPECT_EQ(flood, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(daemon, &status, WNOHANG), 0)
      << "kvtier serve died under a flood of connections (status " << status << ")";
  int probe = -1;
  for (const auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(15);) {
    probe = WaitExit(Spawn("probe", socket, "7"));
    if (probe == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(probe, 0) << "no engine could use kvtier serve after the flood";
  ASSERT_EQ(::waitpid(daemon, &status, WNOHANG), 0) << "kvtier serve died";
}

// Finding 11: service.allowed_gids lets a process of another uid attach (the socket's
// directory and the socket belong to that group), and it uses its own instance, but it
// cannot join another uid's instance to look its prompts up.
TEST(ServiceHostile, AllowedGroupAttachesButCannotJoinAnotherUidsInstance) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run an engine as uid 65534";
  ServedDir served("gids");
  auto& [dir, socket, daemon] = served;
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  ASSERT_NO_FATAL_FAILURE(
      daemon.Start(1000, "", "", {{"KVTIER_SERVICE_ALLOWED_GIDS", std::to_string(kNobody)}}));
  Engine a = EngineThatSaved(socket, "engine-a", "a-req", 60, 4);
  const int code = WaitExit(Spawn("other-uid", socket, "60"));
  if (code == kNoSetuid) GTEST_SKIP() << "setuid(65534) is not permitted here";
  EXPECT_NE(code, 2) << "service.allowed_gids did not let uid 65534 attach";
  EXPECT_NE(code, 5) << "uid 65534 looked up engine-a's prompt through engine-a's instance";
  EXPECT_EQ(code, 0);
}

// Findings 5 and 11: a peer the daemon does not allow is answered at once, before it sends a
// byte (the daemon reads nothing of it); an allowed peer announcing a Hello larger than any
// real one is refused without its payload being read.
TEST(ServiceHostile, UnallowedPeersAndOversizedHellosAreRefusedUnread) {
  ServedDir served("unread");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start());
  {
    Result<UniqueFd> c = proto::ConnectUnix(socket);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    proto::FrameHeader h;
    h.type = static_cast<uint16_t>(proto::MsgType::kHello);
    h.seq = 1;
    h.payload_bytes = 8u << 20;
    uint8_t header[proto::kFrameHeaderBytes];
    proto::EncodeHeader(h, header);
    ASSERT_EQ(::send(c->get(), header, sizeof(header), MSG_NOSIGNAL),
              static_cast<ssize_t>(sizeof(header)));
    Result<proto::Frame> reply = proto::RecvFrame(c->get(), Clock::now() + std::chrono::seconds(2));
    ASSERT_TRUE(reply.ok()) << "no answer to an 8 MiB Hello header: " << reply.status().ToString();
    proto::WireReader r(reply->payload);
    Status status;
    ASSERT_TRUE(proto::DecodeStatus(&r, &status).ok());
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  }
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as uid 65534";
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod((dir + "/sock").c_str(), 0755), 0);
  ASSERT_EQ(::chmod(socket.c_str(), 0777), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!BecomeNobody()) _exit(kNoSetuid);
    Result<UniqueFd> c = proto::ConnectUnix(socket);
    if (!c.ok()) _exit(2);
    // Sends nothing: the refusal must come anyway, well before the daemon's 5 s Hello wait.
    Result<proto::Frame> reply =
        proto::RecvFrame(c->get(), Clock::now() + std::chrono::milliseconds(1500));
    if (!reply.ok()) _exit(3);
    proto::WireReader r(reply->payload);
    Status status;
    if (!proto::DecodeStatus(&r, &status).ok()) _exit(4);
    _exit(status.code() == StatusCode::kFailedPrecondition ? 0 : 5);
  }
  const int code = WaitExit(pid);
  if (code == kNoSetuid) GTEST_SKIP() << "setuid(65534) is not permitted here";
  EXPECT_EQ(code, 0) << "a peer of uid 65534 was not refused before it sent its Hello";
}

uint64_t RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

// Finding 6: 10,000 distinct 4 KiB salts, as API clients may send them, leave the daemon's
// memory where it was (within 16 MiB); a salt seen before still hits.
TEST(ServiceHostile, TenThousandDistinctSaltsKeepTheDaemonsMemoryBounded) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // ASan's quarantine keeps freed memory resident and TSan's shadow grows with what is
  // touched: RSS says nothing there. HasherCacheBound (identity_test) checks the bound itself.
  GTEST_SKIP() << "the daemon's RSS is not its heap under a sanitizer";
#endif
  ServedDir served("salts");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start());
  Engine a = MakeEngine(socket, "engine-a");
  const std::vector<TokenId> prompt = Prompt(70, 2 * 16 + 1);
  uint32_t answered = 0;
  // A salt of 4 KiB (the most a Lookup carries), distinct in its last 8 bytes.
  auto salt = [](char fill, int i) {
    char tail[16];
    std::snprintf(tail, sizeof(tail), "%08d", i);
    return std::string(4096 - 8, fill) + tail;
  };
  auto lookup = [&](const std::string& s, const std::string& id) {
    RequestSpec spec;
    spec.request_id = id;
    spec.prompt = prompt;
    spec.cache_salt = s;
    Result<LookupResult> r = a.manager->Lookup(spec, 0);
    answered += r.ok();
    (void)a.manager->RequestFinished(id);
  };
  for (int i = 0; i < 500; ++i) lookup(salt('w', i), "warm");
  const uint64_t before = RssKiB(daemon.pid());
  for (int i = 0; i < 10000; ++i) lookup(salt('s', i), "salted");
  (void)a.manager->Finished();
  const uint64_t after = RssKiB(daemon.pid());
  EXPECT_EQ(answered, 10500u) << "lookups with a 4 KiB salt were refused";
  EXPECT_LT(after, before + 16 * 1024)
      << "the daemon grew from " << before << " to " << after << " KiB with 10,000 distinct salts";
}

// Finding 11: closing a pool to make room for another model (service.max_pools) ends the
// lookup connections of its ended instances at once, so its G2 share and G3 directory go
// with it: the new model attaches without waiting for them.
TEST(ServiceHostile, ClosingAPoolEndsItsLookupConnections) {
  ServedDir served("poolclose");
  auto& [dir, socket, daemon] = served;
  ASSERT_NO_FATAL_FAILURE(daemon.Start(1000, dir + "/g3"));
  std::optional<Engine> a(MakeEngine(socket, "engine-a", 64, "model-a"));
  ComputeAndSave(*a, "a-req", 80, 2);
  Config c;
  ASSERT_TRUE(c.Set("service.socket", socket).ok());
  Result<std::unique_ptr<ServiceLookup>> lookup = ServiceLookup::Create(c, "engine-a");
  ASSERT_TRUE(lookup.ok()) << lookup.status().ToString();
  const std::vector<TokenId> prompt = Prompt(80, 2 * 16 + 1);
  RequestSpec spec;
  spec.request_id = "peek";
  spec.prompt = prompt;
  Result<LookupResult> found = (*lookup)->Lookup(spec, 0);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->num_tokens, 2u * 16);
  a.reset();  // model-a's pool is idle; its scheduler's lookup connection stays open
  Result<Engine> b = Status::Unavailable("not yet");
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < std::chrono::seconds(15)) {
    b = TryMakeEngine(socket, "engine-b", "model-b");
    if (b.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  // Attached for real: what it saves, it loads (an attach that timed out would be misses).
  bool bytes_ok = false;
  uint32_t loaded = 0;
  while (Clock::now() - t0 < std::chrono::seconds(15)) {
    ComputeAndSave(*b, "b-req", 81, 2);
    loaded = LookupAndLoad(*b, "b-load", 81, 2, 8, &bytes_ok);
    if (loaded == 2u * 16) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(loaded, 2u * 16);
  EXPECT_TRUE(bytes_ok);
  EXPECT_LT(took, 3.0) << "model-b waited " << took << " s for the closed pool's lookup connection";
}

}  // namespace
}  // namespace kvtier

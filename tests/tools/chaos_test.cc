// Chaos, bounded in time: `kvtier replay` runs a trace with G2, G3 and G4 (a real redis-server)
// again and again on one G3 directory while this test, as a second actor, flips bytes in the G3
// slot files, kills and restarts redis-server, and kill -9s the replay at random moments (the
// next replay restarts on the same directory). Every replay that finishes must have served 0
// mismatched blocks and end with no pin held and every G2 slot accounted for; every phase has a
// deadline (a replay still running after it is a hang, and fails the test). A final replay
// without chaos, and `kvtier inspect` of the directory, close the run.
//
// KVTIER_TEST_CHAOS_SECONDS sets the chaos window (default 40 s; the whole test stays near a
// minute in the release build); KVTIER_TEST_CHAOS_SEED the random seed (printed, so a failing
// run can be replayed).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "redis_test_util.h"
#include "replay_test_util.h"

namespace kvtier {
namespace {

using cli::replay_testing::JsonNumber;
using cli::replay_testing::kData;
using cli::replay_testing::TempDir;
using Clock = std::chrono::steady_clock;

// A replay that runs longer than this is hung (a clean one takes about a second in the
// release build, several under a sanitizer).
constexpr auto kPhaseLimit = std::chrono::seconds(90);

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

// A `kvtier replay` child writing its JSON to `out`.
pid_t StartReplay(const std::string& g3_dir, const std::string& redis, const std::string& out) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (fd < 0 || null_fd < 0) _exit(126);
  dup2(fd, 1);
  dup2(null_fd, 2);
  const std::string trace = kData + "replay_mooncake_small.jsonl";
  const std::string g4 = "redis:" + redis;
  const char* argv[] = {KVTIER_CLI_PATH,
                        "replay",
                        "--trace",
                        trace.c_str(),
                        "--capacity-fraction",
                        "0.05",
                        "--g3-fraction",
                        "0.3",
                        "--g3-dir",
                        g3_dir.c_str(),
                        "--g4",
                        g4.c_str(),
                        "--g4-lookup-deadline-ms",
                        "50",
                        "--g4-load-deadline-ms",
                        "300",
                        "--json",
                        nullptr};
  execv(KVTIER_CLI_PATH, const_cast<char* const*>(argv));
  _exit(127);
}

// Flips `n` random bytes past the superblock and probe page of a random slot file in `dir`.
int CorruptG3(const std::string& dir, std::mt19937_64& rng, int n) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("g3-", 0) == 0 && e.path().extension() == ".kvt") files.push_back(e.path());
  }
  if (files.empty()) return 0;
  const std::string& path = files[rng() % files.size()];
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st;
  int done = 0;
  if (fstat(fd, &st) == 0 && st.st_size > 8192) {
    for (int i = 0; i < n; ++i) {
      const off_t at = 8192 + static_cast<off_t>(rng() % static_cast<uint64_t>(st.st_size - 8192));
      uint8_t b = 0;
      if (pread(fd, &b, 1, at) != 1) continue;
      b ^= static_cast<uint8_t>(1u << (rng() % 8));
      if (pwrite(fd, &b, 1, at) == 1) ++done;
    }
  }
  ::close(fd);
  return done;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Tally {
  int completed = 0, killed = 0, corruptions = 0, redis_restarts = 0;
  double verified = 0, refused = 0, quarantines = 0;
};

// Checks a finished replay's JSON: what must hold however much chaos it met.
void ExpectCleanReplay(const std::string& json, int exit_code, const std::string& what,
                       Tally* tally) {
  ASSERT_EQ(exit_code, 0) << what << ": " << json;
  ASSERT_FALSE(json.empty()) << what;
  EXPECT_EQ(JsonNumber(json, "mismatched_blocks"), 0) << what << ": " << json;
  EXPECT_EQ(JsonNumber(json, "pinned_blocks_at_end"), 0) << what << ": a pin leaked";
  EXPECT_EQ(JsonNumber(json, "g2_slots_unaccounted_at_end"), 0) << what << ": a G2 slot leaked";
  tally->verified += JsonNumber(json, "verified_blocks");
  tally->refused += JsonNumber(json, "corrupt_blocks") + JsonNumber(json, "g4_corrupt_blocks");
  tally->quarantines += JsonNumber(json, "g3_quarantines");
}

TEST(Chaos, ReplaysSurviveG3CorruptionRedisRestartsAndKill9) {
  KVTIER_REQUIRE_REDIS();
  const uint64_t seconds = EnvOr("KVTIER_TEST_CHAOS_SECONDS", 40);
  const uint64_t seed = EnvOr("KVTIER_TEST_CHAOS_SEED", 16);
  std::printf("chaos: %llu s, seed %llu (KVTIER_TEST_CHAOS_SECONDS, KVTIER_TEST_CHAOS_SEED)\n",
              static_cast<unsigned long long>(seconds), static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  testing::RedisServer redis;
  ASSERT_TRUE(redis.Start()) << redis.error();
  TempDir dir;
  const std::string g3 = dir.path() + "/g3";
  const std::string out = dir.path() + "/replay.json";
  Tally tally;
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  int phase = 0;
  uint64_t typical_ms = 500;  // how long a replay that finished took, smoothed
  while (Clock::now() < end) {
    ++phase;
    const pid_t pid = StartReplay(g3, redis.endpoint(), out);
    ASSERT_GT(pid, 0);
    const auto started = Clock::now();
    // Every third phase (the 2nd, 5th, ...) ends in kill -9 at a random moment of the run
    // (replays take about as long as the last ones did; a sanitizer makes them longer), so even
    // a slow run of a few phases has kills.
    const bool kill_it = phase % 3 == 2;
    const auto kill_at =
        started + std::chrono::milliseconds(5 + rng() % (typical_ms + typical_ms / 4 + 1));
    int status = 0;
    bool exited = false;
    while (!exited) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      const auto now = Clock::now();
      if (now - started > kPhaseLimit) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        FAIL() << "phase " << phase << ": the replay hung (still running after "
               << std::chrono::duration_cast<std::chrono::seconds>(kPhaseLimit).count() << " s)";
      }
      if (kill_it && now >= kill_at) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ++tally.killed;
        break;
      }
      // The other actor, every 30-150 ms: G3 corruption (most often), or Redis killed and
      // restarted (its data gone), or paused for a moment.
      const uint64_t dice = rng() % 10;
      if (dice < 6) {
        tally.corruptions += CorruptG3(g3, rng, 1 + static_cast<int>(rng() % 8));
      } else if (dice == 6) {
        redis.Kill();
        ASSERT_TRUE(redis.Restart()) << redis.error();
        ++tally.redis_restarts;
      } else if (dice == 7) {
        redis.Pause();
        std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 400));
        redis.Resume();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 120));
    }
    if (exited) {
      ASSERT_TRUE(WIFEXITED(status)) << "phase " << phase << ": the replay died of signal "
                                     << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      const uint64_t took_ms = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count());
      typical_ms = (3 * typical_ms + took_ms) / 4;
      ++tally.completed;
      ExpectCleanReplay(ReadFile(out), WEXITSTATUS(status), "phase " + std::to_string(phase),
                        &tally);
      if (::testing::Test::HasFailure()) return;
    }
  }
  // No chaos: the directory left by all of that still replays cleanly, and inspect reads it.
  if (!redis.running()) {
    ASSERT_TRUE(redis.Restart()) << redis.error();
  }
  const pid_t pid = StartReplay(g3, redis.endpoint(), out);
  const auto started = Clock::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (Clock::now() - started > kPhaseLimit) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      FAIL() << "the final replay hung";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(WIFEXITED(status));
  ++tally.completed;
  ExpectCleanReplay(ReadFile(out), WEXITSTATUS(status), "the final replay", &tally);
  const auto inspect = cli_run::RunShell("timeout 60 " + std::string(KVTIER_CLI_PATH) +
                                         " inspect " + g3 + " --json 2>/dev/null");
  EXPECT_EQ(inspect.exit_code, 0) << inspect.out;
  std::printf(
      "chaos: %d phases, %d replays finished (%.0f blocks verified byte for byte, %.0f corrupt "
      "blocks refused, %.0f G3 quarantines), %d killed, %d G3 bytes flipped, %d Redis "
      "restarts\n",
      phase, tally.completed, tally.verified, tally.refused, tally.quarantines, tally.killed,
      tally.corruptions, tally.redis_restarts);
  EXPECT_GE(tally.completed, 2);
  EXPECT_GT(tally.corruptions, 0);
  EXPECT_GT(tally.killed, 0);
}

}  // namespace
}  // namespace kvtier

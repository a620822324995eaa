// Two workers, one cache: two separate processes (this binary re-executed in a worker mode),
// each with its own G1 (the reference engine's paged cache), G2 and G3, share one redis-server
// started by the test. Worker A prefills a prompt; worker B, a fresh process, loads A's prefix
// from G4 and its result (last-token logits, greedy continuation) equals recomputing it. The
// engine is the reference Llama with random weights from a fixed seed, the same in every process.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "kvtier/connector.h"
#include "redis_test_util.h"

namespace kvtier::engine {
namespace {

constexpr uint32_t kTpb = 16;
constexpr uint32_t kSeed = 2024;

std::vector<TokenId> TestPrompt() {
  std::vector<TokenId> t(6 * kTpb + 5);
  uint32_t s = 11;
  for (TokenId& x : t) {
    s = s * 1664525u + 1013904223u;
    x = (s >> 8) % 256;
  }
  return t;
}

LlamaConfig ModelConfig() {
  LlamaConfig c;
  c.num_layers = 3;
  return c;
}

// What a worker reports to the test, one "key value..." line each.
struct Report {
  uint32_t offered = 0, loaded = 0, computed = 0;
  uint64_t g4_hits = 0, g4_saved = 0, g4_lookup_blocks = 0;
  std::vector<TokenId> generated;
  std::vector<float> logits;
};

void WriteReport(const std::string& path, const RequestOutcome& out, const ManagerStats& s) {
  std::ofstream f(path);
  f << "offered " << out.offered_tokens << "\nloaded " << out.loaded_tokens << "\ncomputed "
    << out.computed_tokens << "\ng4_hits " << s.hit_blocks[kTierG4] << "\ng4_saved "
    << s.g4_saved_blocks << "\ng4_lookup_blocks " << s.g4_lookup_blocks << "\ngenerated";
  for (TokenId t : out.generated) f << ' ' << t;
  f << "\nlogits";
  f.precision(9);
  for (float x : out.prompt_logits) f << ' ' << x;
  f << "\n";
}

bool ReadReport(const std::string& path, Report* r) {
  std::ifstream f(path);
  std::string line;
  int fields = 0;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    ++fields;
    if (key == "offered") in >> r->offered;
    if (key == "loaded") in >> r->loaded;
    if (key == "computed") in >> r->computed;
    if (key == "g4_hits") in >> r->g4_hits;
    if (key == "g4_saved") in >> r->g4_saved;
    if (key == "g4_lookup_blocks") in >> r->g4_lookup_blocks;
    if (key == "generated") {
      for (TokenId t; in >> t;) r->generated.push_back(t);
    }
    if (key == "logits") {
      for (float x; in >> x;) r->logits.push_back(x);
    }
  }
  return fields == 8;
}

// The worker mode: KVTIER_TEST_WORKER_REDIS, _DIR (its own G3) and _OUT (the report file).
int RunWorker() {
  const char* redis = std::getenv("KVTIER_TEST_WORKER_REDIS");
  const char* dir = std::getenv("KVTIER_TEST_WORKER_DIR");
  const char* out_path = std::getenv("KVTIER_TEST_WORKER_OUT");
  if (redis == nullptr || dir == nullptr || out_path == nullptr) return 10;
  auto model = LlamaModel::Random(ModelConfig(), kSeed);
  if (!model.ok()) return 11;
  const KvLayout layout = (*model)->MakeKvLayout(kTpb);
  ManagerOptions o;
  o.layout = layout;
  o.model_id = "random-llama-two-workers";
  const uint64_t slot = 4096 + layout.BlockBytes();
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"g2.capacity_bytes", std::to_string(64 * slot)},
           {"g2.lock_memory", "false"},
           {"g2.prefault_threads", "1"},
           {"g3.dir", dir},
           {"g3.capacity_bytes", std::to_string(64 * slot + (1 << 20))},
           {"g4.backend", "redis"},
           {"g4.endpoints", redis},
           {"g4.lookup_deadline_ms", "200"},
           {"g4.load_deadline_ms", "2000"}}) {
    if (!o.config.Set(k, v).ok()) return 12;
  }
  auto manager = BlockManager::Create(o);
  if (!manager.ok()) return 13;
  auto engine = Engine::Create(model->get(), manager->get(), 32, kTpb);
  if (!engine.ok()) return 14;
  const std::vector<TokenId> prompt = TestPrompt();
  auto out = (*engine)->Run({"req", prompt, "", "", {}}, 8, -1);
  if (!out.ok()) return 15;
  (*engine)->ReleaseFinished(/*wait=*/true);
  (*manager)->WaitForSaves();
  WriteReport(out_path, *out, (*manager)->Stats());
  return 0;
}

// Runs this binary as a worker; returns its exit code (-1 when it did not exit normally).
int SpawnWorker(const std::string& redis, const std::string& dir, const std::string& out) {
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("KVTIER_TEST_WORKER_MODE", "1", 1);
    setenv("KVTIER_TEST_WORKER_REDIS", redis.c_str(), 1);
    setenv("KVTIER_TEST_WORKER_DIR", dir.c_str(), 1);
    setenv("KVTIER_TEST_WORKER_OUT", out.c_str(), 1);
    execl("/proc/self/exe", "two_workers_test", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(TwoWorkers, WorkerBLoadsWorkerAsPrefixFromRedisAndMatchesRecompute) {
  KVTIER_REQUIRE_REDIS();
  kvtier::testing::RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  testing::TempDir tmp;
  ASSERT_EQ(SpawnWorker(server.endpoint(), tmp.File("g3-a"), tmp.File("a.txt")), 0);
  ASSERT_EQ(SpawnWorker(server.endpoint(), tmp.File("g3-b"), tmp.File("b.txt")), 0);
  Report a, b;
  ASSERT_TRUE(ReadReport(tmp.File("a.txt"), &a));
  ASSERT_TRUE(ReadReport(tmp.File("b.txt"), &b));

  const uint32_t n = static_cast<uint32_t>(TestPrompt().size());
  const uint32_t full = (n - 1) / kTpb * kTpb;
  EXPECT_EQ(a.loaded, 0u);
  EXPECT_GE(a.g4_saved, full / kTpb) << "A wrote its prompt blocks through to Redis";
  EXPECT_EQ(b.offered, full);
  EXPECT_EQ(b.loaded, full) << "B loaded A's prefix";
  EXPECT_EQ(b.computed, n - full);
  EXPECT_EQ(b.g4_hits, full / kTpb) << "from G4: B's own G2/G3 were empty";

  // Recompute here, in a third process, with no kvtier at all.
  auto model = LlamaModel::Random(ModelConfig(), kSeed);
  ASSERT_TRUE(model.ok());
  auto engine = Engine::Create(model->get(), nullptr, 32, kTpb);
  ASSERT_TRUE(engine.ok());
  auto ref = (*engine)->Run({"ref", TestPrompt(), "", "", {}}, 8, -1);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(b.generated, ref->generated);
  EXPECT_EQ(a.generated, ref->generated);
  ASSERT_EQ(b.logits.size(), ref->prompt_logits.size());
  EXPECT_LT(testing::RelativeError(b.logits, ref->prompt_logits), 1e-4);
  std::printf(
      "two workers: A computed %u tokens and saved %llu blocks to G4; B loaded %u of %u "
      "prompt tokens from G4 (%llu blocks), computed %u; B == recompute\n",
      a.computed, static_cast<unsigned long long>(a.g4_saved), b.loaded, n,
      static_cast<unsigned long long>(b.g4_hits), b.computed);
}

}  // namespace
}  // namespace kvtier::engine

int main(int argc, char** argv) {
  if (std::getenv("KVTIER_TEST_WORKER_MODE") != nullptr) return kvtier::engine::RunWorker();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

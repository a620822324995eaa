// kvtier demo --workers 2: two worker processes, one cache. Each worker is a separate process
// (this binary re-executed with --worker-id) with its own G1, G2 and G3, and both use one Redis
// as G4. Worker 1 runs a chat conversation; worker 2 then runs the same conversation (a
// session moved to another worker) and loads what worker 1 computed from G4, comparing every
// turn's first token with a recompute-only run. Per turn: the tier that served each block.
// Without --redis, a private redis-server is started on a free loopback port and stopped at the
// end. See docs/demo.md.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/embedded_redis.h"
#include "cli/json_writer.h"
#include "demo/demo_model.h"
#include "engine/chat_template.h"
#include "engine/engine.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kvtier/connector.h"

namespace kvtier::cli {
namespace {

using engine::ChatMessage;
using engine::ChatTemplate;
using engine::Engine;
using engine::LlamaModel;
using engine::Tokenizer;

constexpr uint32_t kTpb = 16;
constexpr uint32_t kMaxNew = 16;

const char* const kSystem =
    "You are Sage, the assistant of the Northwind Public Library. Answer questions from "
    "members briefly and accurately, in plain language, in one to three sentences. The library "
    "opens at nine and closes at eight on weekdays, opens at ten and closes at five on "
    "Saturday, and is closed on Sunday. Members may borrow twelve items for three weeks; films "
    "for one week. Late books cost ten cents a day, at most five dollars per item. Cards are "
    "free for county residents and cost fifteen dollars a year for visitors. The library has "
    "free wireless internet, public computers bookable for one hour, printing at ten cents a "
    "page, quiet study rooms, story time on Tuesday and Thursday mornings, a book club on the "
    "first Wednesday of the month, and homework help on weekday afternoons. For medical, legal "
    "or financial questions give general information only and suggest a professional. Never ask "
    "for private information. If you are unsure, say so and suggest the reference desk.\n";
const char* const kQuestions[] = {
    "What are the opening hours on Saturday?",
    "How many books can I borrow?",
    "Is there wireless internet?",
    "What does a visitor card cost?",
    "When is story time?",
    "How much is a late fee for a book?",
};

struct Turn {
  uint32_t worker = 0, turn = 0, prompt = 0, reused = 0, computed = 0;
  std::array<uint64_t, kNumTiers> blocks{};
  double ttft_ms = 0, ttft_recompute_ms = -1;
  int first_token_match = -1;  // -1: not compared
};

// One worker process: runs the conversation, writes one "turn ..." line per turn to `report`.
int RunWorker(const CliArgs& args, uint32_t worker) {
  const std::string model_path =
      args.GetString("model", "./models/SmolLM2-135M-Instruct.Q4_1.gguf");
  const std::string redis = args.GetString("redis", "");
  const std::string report = args.GetString("report", "");
  auto turns_r = args.GetUint("turns", 3);
  if (redis.empty() || report.empty() || !turns_r.ok()) {
    return UsageError(Status::InvalidArgument("worker mode needs --redis, --report, --turns"));
  }
  const bool compare = worker > 1;  // the reusing worker checks its first tokens
  FILE* log = args.Has("json") ? stderr : stdout;
  auto loaded = LoadDemoModel(model_path);
  if (!loaded.ok()) return Failure(loaded.status());
  const Tokenizer& tok = *loaded->tokenizer;
  LlamaModel* const model = loaded->model.get();
  const ChatTemplate* const chat = &loaded->chat;
  const KvLayout layout = model->MakeKvLayout(kTpb);
  const std::string g3_dir = "./kvtier-data/demo-worker" + std::to_string(worker);
  std::error_code ec;
  std::filesystem::remove_all(g3_dir, ec);
  std::filesystem::create_directories(g3_dir, ec);
  ManagerOptions mo;
  mo.layout = layout;
  mo.model_id = "SmolLM2-135M-Instruct.Q4_1";
  for (const auto& [k, v] :
       std::vector<std::pair<std::string, std::string>>{{"g2.capacity_bytes", "256MiB"},
                                                        {"g2.lock_memory", "false"},
                                                        {"g3.dir", g3_dir},
                                                        {"g3.capacity_bytes", "256MiB"},
                                                        {"g4.backend", "redis"},
                                                        {"g4.endpoints", redis},
                                                        {"g4.lookup_deadline_ms", "100"},
                                                        {"g4.load_deadline_ms", "2000"},
                                                        {"g4.save_deadline_ms", "5000"},
                                                        {"g4.max_queued_saves", "4096"}}) {
    if (Status s = mo.config.Set(k, v); !s.ok()) return Failure(s);
  }
  auto manager = BlockManager::Create(mo);
  if (!manager.ok()) return Failure(manager.status());
  const uint32_t g1_blocks = 256;
  auto with = Engine::Create(model, manager->get(), g1_blocks, kTpb);
  if (!with.ok()) return Failure(with.status());
  auto without = Engine::Create(model, nullptr, g1_blocks, kTpb);
  if (!without.ok()) return Failure(without.status());

  std::ofstream out(report);
  std::vector<ChatMessage> conv{{"system", kSystem}};
  for (uint32_t t = 0; t < *turns_r; ++t) {
    conv.push_back({"user", kQuestions[t % std::size(kQuestions)]});
    const auto ids = tok.Encode(chat->Apply(conv, true), true);
    const std::string id = "w" + std::to_string(worker) + "t" + std::to_string(t);
    Turn r;
    r.worker = worker;
    r.turn = t;
    r.prompt = static_cast<uint32_t>(ids.size());
    std::vector<TokenId> ref_first;
    if (compare) {
      auto ref = (*without)->Run({id + "-ref", ids, "", "", {}}, 1, tok.eos_id());
      if (!ref.ok()) return Failure(ref.status());
      r.ttft_recompute_ms = ref->ttft_seconds * 1e3;
      ref_first = ref->generated;
    }
    const ManagerStats s0 = (*manager)->Stats();
    auto res = (*with)->Run({id, ids, "", "", {}}, kMaxNew, tok.eos_id());
    if (!res.ok()) return Failure(res.status());
    (*with)->ReleaseFinished(true);
    (*manager)->WaitForSaves();  // written through to G4 before the next worker looks
    const ManagerStats s1 = (*manager)->Stats();
    for (TierId k = 0; k < kNumTiers; ++k) r.blocks[k] = s1.hit_blocks[k] - s0.hit_blocks[k];
    r.reused = res->loaded_tokens;
    r.computed = res->computed_tokens;
    r.ttft_ms = res->ttft_seconds * 1e3;
    if (compare) {
      r.first_token_match =
          !ref_first.empty() && !res->generated.empty() && ref_first[0] == res->generated[0];
    }
    std::string answer = tok.Decode(res->generated, /*skip_special=*/true);
    while (!answer.empty() && (answer.back() == ' ' || answer.back() == '\n')) answer.pop_back();
    conv.push_back({"assistant", answer});
    std::string from;
    for (TierId k = 0; k < kNumTiers; ++k) {
      if (r.blocks[k] == 0) continue;
      from +=
          (from.empty() ? "" : "+") + std::string(TierName(k)) + ":" + std::to_string(r.blocks[k]);
    }
    if (from.empty()) from = "-";
    std::string ref_text = "-";
    if (compare) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.0fms %s", r.ttft_recompute_ms,
                    r.first_token_match ? "same" : "DIFFERENT");
      ref_text = buf;
    }
    std::string shown = answer.substr(0, 48);
    for (char& c : shown) c = (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
    std::fprintf(log, "%-6u %-4u %6u %7u %-16s %7.0fms  %-16s %s\n", worker, t, r.prompt, r.reused,
                 from.c_str(), r.ttft_ms, ref_text.c_str(), answer.substr(0, 48).c_str());
    std::fflush(log);
    out << "turn " << r.worker << ' ' << r.turn << ' ' << r.prompt << ' ' << r.reused << ' '
        << r.computed << ' ' << r.blocks[kTierG2] << ' ' << r.blocks[kTierG3] << ' '
        << r.blocks[kTierG4] << ' ' << r.ttft_ms << ' ' << r.ttft_recompute_ms << ' '
        << r.first_token_match << "\n";
  }
  const ManagerStats s = (*manager)->Stats();
  out << "g4 " << s.g4_saved_blocks << ' ' << s.g4_save_failures << ' ' << s.g4_load_failures << ' '
      << s.g4_corrupt_blocks << "\n";
  return out.good() ? 0 : 1;
}

}  // namespace

int RunDemoWorkers(const CliArgs& args) {
  if (Status s = args.CheckKnown(
          {"workers", "worker-id", "report", "redis", "model", "turns", "json", "no-plot", "help"});
      !s.ok()) {
    return UsageError(s);
  }
  if (args.Has("worker-id")) {
    auto id = args.GetUint("worker-id", 1);
    if (!id.ok()) return UsageError(id.status());
    return RunWorker(args, static_cast<uint32_t>(*id));
  }
  auto workers_r = args.GetUint("workers", 2);
  auto turns_r = args.GetUint("turns", 3);
  if (!workers_r.ok()) return UsageError(workers_r.status());
  if (!turns_r.ok()) return UsageError(turns_r.status());
  if (*workers_r < 2 || *workers_r > 8 || *turns_r < 1 || *turns_r > 6) {
    return UsageError(Status::InvalidArgument("--workers must be in 2..8 and --turns in 1..6"));
  }
  const std::string model_path =
      args.GetString("model", "./models/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (Status s = CheckDemoModelPath(model_path); !s.ok()) return UsageError(s);
  const bool json = args.Has("json");
  FILE* log = json ? stderr : stdout;
  EmbeddedRedis own;
  std::string redis = args.GetString("redis", "");
  if (redis.empty()) {
    if (Status s = own.Start(); !s.ok()) return Failure(s);
    redis = own.endpoint();
    std::fprintf(log,
                 "started a private redis-server on %s (pass --redis HOST:PORT to use yours)\n",
                 redis.c_str());
  }
  std::fprintf(log,
               "%llu worker processes, each with its own G1/G2/G3, sharing G4 = redis %s; worker 1 "
               "runs a %llu-turn chat, then each other worker runs the same chat\n\n",
               static_cast<unsigned long long>(*workers_r), redis.c_str(),
               static_cast<unsigned long long>(*turns_r));
  std::fprintf(log, "%-6s %-4s %6s %7s %-16s %9s  %-16s %s\n", "worker", "turn", "prompt", "reused",
               "from", "ttft", "recompute", "answer");
  std::fflush(log);
  std::vector<Turn> turns;
  std::vector<std::string> g4_lines;
  for (uint32_t w = 1; w <= *workers_r; ++w) {
    const std::string report = "./kvtier-data/demo-worker" + std::to_string(w) + ".report";
    std::error_code ec;
    std::filesystem::create_directories("./kvtier-data", ec);
    std::filesystem::remove(report, ec);
    const std::vector<std::string> argv = {"kvtier",      "demo",
                                           "--workers",   std::to_string(*workers_r),
                                           "--worker-id", std::to_string(w),
                                           "--redis",     redis,
                                           "--model",     model_path,
                                           "--turns",     std::to_string(*turns_r),
                                           "--report",    report};
    std::vector<char*> cargv;
    for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    if (json) cargv.push_back(const_cast<char*>("--json"));
    cargv.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      execv("/proc/self/exe", cargv.data());
      _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "kvtier: worker %u failed (exit status %d)\n", w,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      return 1;
    }
    std::ifstream in(report);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string kind;
      ls >> kind;
      if (kind == "turn") {
        Turn t;
        ls >> t.worker >> t.turn >> t.prompt >> t.reused >> t.computed >> t.blocks[kTierG2] >>
            t.blocks[kTierG3] >> t.blocks[kTierG4] >> t.ttft_ms >> t.ttft_recompute_ms >>
            t.first_token_match;
        turns.push_back(t);
      } else if (kind == "g4") {
        g4_lines.push_back(line);
      }
    }
  }
  uint64_t g4_blocks = 0, reused_later = 0, compared = 0, same = 0;
  for (const Turn& t : turns) {
    if (t.worker == 1) continue;
    g4_blocks += t.blocks[kTierG4];
    reused_later += t.reused;
    if (t.first_token_match >= 0) {
      ++compared;
      same += t.first_token_match;
    }
  }
  std::fprintf(log,
               "\nsummary: workers 2..%llu loaded %llu blocks from G4 (%llu tokens reused in all); "
               "first token equal to recompute in %llu of %llu turns\n",
               static_cast<unsigned long long>(*workers_r),
               static_cast<unsigned long long>(g4_blocks),
               static_cast<unsigned long long>(reused_later), static_cast<unsigned long long>(same),
               static_cast<unsigned long long>(compared));
  if (json) {
    std::string arr = "[";
    for (size_t i = 0; i < turns.size(); ++i) {
      const Turn& t = turns[i];
      JsonObject o;
      o.Add("worker", t.worker)
          .Add("turn", t.turn)
          .Add("prompt_tokens", t.prompt)
          .Add("reused_tokens", t.reused)
          .Add("computed_tokens", t.computed)
          .Add("blocks_g2", t.blocks[kTierG2])
          .Add("blocks_g3", t.blocks[kTierG3])
          .Add("blocks_g4", t.blocks[kTierG4])
          .Add("ttft_ms", t.ttft_ms)
          .Add("ttft_recompute_ms", t.ttft_recompute_ms)
          .Add("first_token_match", t.first_token_match);
      arr += (i ? ", " : "") + o.Str();
    }
    arr += "]";
    JsonObject summary;
    summary.Add("workers", *workers_r)
        .Add("redis", redis)
        .Add("g4_blocks_loaded_by_later_workers", g4_blocks)
        .Add("first_token_matches", same)
        .Add("first_token_compared", compared);
    JsonObject top;
    top.Raw("turns", arr).Raw("summary", summary.Str());
    std::printf("%s\n", top.Str().c_str());
  }
  return compared == same ? 0 : 1;
}

}  // namespace kvtier::cli

// kvtier demo: a multi-turn chat on the real model (SmolLM2-135M-Instruct), every turn run
// twice: recompute-only (the engine without kvtier) and with kvtier (the engine + a
// BlockManager on the embedded defaults, with small G1/G2 capacities so blocks are evicted
// and demoted to G3). Prints per turn the TTFT of both runs, the tokens reused and the tier
// that supplied them, and the answer's first words; then a summary. See docs/demo.md.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "cli/commands.h"
#include "cli/json_writer.h"
#include "cli/metrics_settings.h"
#include "cli/progress.h"
#include "cli/service_env.h"
#include "core/parallel.h"
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
using engine::RequestOutcome;
using engine::Tokenizer;

constexpr uint32_t kTokensPerBlock = 16;
constexpr uint32_t kMaxNewTokens = 24;
constexpr uint32_t kLongContext = 1024;  // turns counted in the ttft ratios
constexpr const char* kDataDir = "./kvtier-data/demo";

// A shared system prompt long enough (~1,000 tokens) that every turn has >= 1,024 tokens of
// context, as a real deployment's instructions often are.
const char* const kSystemPrompt =
    "You are Sage, the helpful assistant of the Northwind Public Library help desk. You answer "
    "questions from library members and visitors in a friendly, clear and concise way. Follow "
    "these guidelines in every conversation.\n\n"
    "1. Answer the question that was asked first, in one or two short sentences, and only then "
    "add details if they are useful. Most people read only the first sentence.\n"
    "2. Use plain language. Avoid jargon, and when a technical word is needed, explain it in a "
    "few words the first time you use it.\n"
    "3. Be accurate. If you are not sure about a fact, say so honestly instead of guessing, and "
    "suggest where the member could check it, such as the reference desk or an encyclopedia.\n"
    "4. Be polite and patient with everyone, including people who are upset, confused or in a "
    "hurry. Never make fun of a question, however simple it seems.\n"
    "5. Keep answers short. A good answer is usually between one and four sentences. Use a "
    "short list only when the member asks for several items or steps.\n"
    "6. The library is open from nine in the morning to eight in the evening from Monday to "
    "Friday, and from ten in the morning to five in the afternoon on Saturday. It is closed on "
    "Sunday and on public holidays.\n"
    "7. Members may borrow up to twelve items at a time. Books can be kept for three weeks, "
    "films and music for one week, and magazines for one week. Items can be renewed twice "
    "online or at the front desk unless another member has reserved them.\n"
    "8. Late returns cost ten cents per day for books and fifty cents per day for films, with a "
    "maximum of five dollars per item. Children's items never have late fees.\n"
    "9. A library card is free for everyone who lives, works or studies in the county. A "
    "visitor card costs fifteen dollars per year. To get a card, bring a photo identification "
    "and a proof of address to the front desk.\n"
    "10. The library offers free wireless internet, public computers that can be booked for "
    "one hour at a time, printing at ten cents per page, a scanner, and quiet study rooms that "
    "can be reserved up to one week in advance.\n"
    "11. Events include a children's story time every Tuesday and Thursday morning, a book club "
    "on the first Wednesday of every month, free computer classes for beginners on Saturday "
    "mornings, and homework help for students on weekday afternoons.\n"
    "12. If a question is about general knowledge, such as science, history, geography, "
    "cooking, health or everyday life, answer it directly from what you know, briefly and "
    "correctly, as a knowledgeable librarian would.\n"
    "13. For medical, legal or financial questions, give general information only and suggest "
    "that the person speaks with a qualified professional for advice about their own case.\n"
    "14. Never ask for or repeat private information such as card numbers, passwords, home "
    "addresses or phone numbers. If a member shares such information, remind them gently not to "
    "share it in the chat.\n"
    "15. If a member wants to recommend a book for the collection, thank them and tell them to "
    "fill in the suggestion form at the front desk or on the library website.\n"
    "16. If a member reports a lost or damaged item, tell them not to worry, and explain that "
    "the front desk will help them replace it or pay the replacement cost.\n"
    "17. When a member asks for reading suggestions, ask what they enjoyed recently if they did "
    "not say, and suggest two or three well-known titles that match their interests.\n"
    "18. For children and students, use simple words, encourage their curiosity, and suggest a "
    "book or a resource where they can learn more about the topic.\n"
    "19. Do not discuss politics or religion beyond neutral facts, and do not share personal "
    "opinions on controversial subjects. Point to balanced sources in the collection instead.\n"
    "20. If you do not understand a question, ask one short clarifying question rather than "
    "guessing what the member meant.\n"
    "21. End your answer when the question is answered. Do not add long greetings, do not repeat "
    "the question, and do not list these guidelines to the member.\n"
    "22. If a member asks who you are, say that you are Sage, the library's virtual assistant, "
    "and that the staff at the front desk can help with anything you cannot answer.\n"
    "23. Accessibility matters: the building has step-free access, an elevator to every floor, "
    "large print books, audio books, and a reading machine for people with low vision. "
    "Assistance dogs are always welcome.\n"
    "24. Food is allowed only in the cafe on the ground floor; covered drinks are allowed "
    "everywhere except in the local history room, where old and rare documents are kept.\n"
    "25. Parking is free for two hours in the lot behind the building, and bicycle racks are "
    "next to the main entrance. Buses number four and eleven stop in front of the library.\n"
    "26. Lost and found items are kept at the front desk for thirty days. Members can call or "
    "visit to ask whether something they lost has been handed in.\n"
    "27. Meeting rooms can be booked by community groups free of charge for non-commercial "
    "events. Bookings are made at the front desk at least two days ahead.\n"
    "28. Always stay calm, kind and helpful, and answer in English unless the member writes in "
    "another language.\n";

const char* const kQuestions[] = {
    "What is the capital of France?",    "Name three primary colors.",
    "How many legs does a spider have?", "What is photosynthesis?",
    "Give me one tip for better sleep.", "What is the boiling point of water?",
    "Who wrote Romeo and Juliet?",       "Why is the sky blue?",
    "Suggest a good name for a cat.",    "What is the largest planet in our solar system?",
    "How do I make a cup of tea?",       "What are the opening hours on Saturday?",
};
constexpr size_t kNumQuestions = sizeof(kQuestions) / sizeof(kQuestions[0]);

// Unrelated prompts for the no-reuse overhead measurement.
const char* const kUnrelated[] = {
    "Write a short poem about the sea at night, with the moon and the stars above the waves.",
    "Explain in simple words how a bicycle works, from the pedals to the wheels.",
    "List three things to pack for a weekend camping trip in the mountains.",
};

struct TurnResult {
  uint32_t user = 0, turn = 0, prompt_tokens = 0;
  bool after_restart = false;  // the manager was restarted (warm, from G3) before this turn
  uint32_t reused_tokens = 0, computed_tokens = 0;
  uint32_t new_tokens = 0;  // tokens not in the user's previous context (the new message)
  std::array<uint64_t, kNumTiers> blocks{};  // hit blocks by source tier (stats delta)
  std::string source;        // "G2" or "G3" when that tier supplied every block, "mixed", or "none"
  bool full_prefix = false;  // everything before the new message was loaded
  double ttft_recompute = 0, ttft_kvtier = 0;
  double load_wait = 0, compute = 0;  // parts of ttft_kvtier (RequestOutcome)
  double bound = 0;                   // 1.5 x (bytes / tier bandwidth + compute); 0 = no hit
  bool first_token_match = false;
  std::string answer;
};

double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

std::string FirstWords(const std::string& text, size_t words) {
  std::string out;
  size_t n = 0;
  bool in_word = false;
  for (char c : text) {
    const bool space = c == ' ' || c == '\n' || c == '\t';
    if (space) {
      if (in_word && ++n == words) return out + " ...";
      in_word = false;
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      in_word = true;
      out += c;
    }
  }
  return out;
}

// memcpy GB/s over 64 MiB with `threads` threads (pre-faulted, best of 3): the G2 -> G1 limit
// of this machine, measured in the same run.
double MeasureMemcpyGbps(unsigned threads) {
  const size_t bytes = 64u << 20;
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    ParallelRanges(threads, bytes, [&](unsigned, size_t lo, size_t hi) {
      std::memcpy(b.data() + lo, a.data() + lo, hi - lo);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, bytes / s / 1e9);
  }
  return best;
}

// O_DIRECT read GB/s of a 128 MiB file written in `dir` (4 threads x 1 MiB reads, best of 2):
// the G3 limit of this disk, measured in the same run. NaN when the file system refuses.
double MeasureDirectReadGbps(const std::string& dir) {
  const std::string path = dir + "/bandwidth-probe.tmp";
  const size_t chunk = 1u << 20, chunks = 128;
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, chunk * 4) != 0) return std::nan("");
  std::memset(buf, 7, chunk * 4);
  double best = std::nan("");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (fd >= 0) {
    bool ok = true;
    for (size_t i = 0; i < chunks && ok; ++i)
      ok = ::pwrite(fd, buf, chunk, static_cast<off_t>(i * chunk)) == static_cast<ssize_t>(chunk);
    for (int rep = 0; rep < 2 && ok; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      std::atomic<bool> all{true};
      ParallelRanges(4, chunks, [&](unsigned t, size_t lo, size_t hi) {
        uint8_t* mine = static_cast<uint8_t*>(buf) + t * chunk;
        for (size_t i = lo; i < hi; ++i) {
          if (::pread(fd, mine, chunk, static_cast<off_t>(i * chunk)) !=
              static_cast<ssize_t>(chunk))
            all = false;
        }
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!all) break;
      const double gbps = chunks * chunk / s / 1e9;
      best = std::isnan(best) ? gbps : std::max(best, gbps);
    }
    ::close(fd);
    ::unlink(path.c_str());
  }
  std::free(buf);
  return best;
}

bool HaveGnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

Status WritePlot(const std::vector<TurnResult>& turns, const std::string& png) {
  const std::string dat = "demo-ttft.dat";
  FILE* f = std::fopen(dat.c_str(), "w");
  if (f == nullptr) return Status::IOError("cannot write " + dat);
  std::fprintf(f, "# index user turn recompute_ms kvtier_ms source\n");
  for (size_t i = 0; i < turns.size(); ++i) {
    std::fprintf(f, "%zu \"u%u/t%u\" %.3f %.3f %s\n", i + 1, turns[i].user, turns[i].turn,
                 turns[i].ttft_recompute * 1e3, turns[i].ttft_kvtier * 1e3,
                 turns[i].source.c_str());
  }
  std::fclose(f);
  const std::string script = "demo-ttft.gp";
  f = std::fopen(script.c_str(), "w");
  if (f == nullptr) return Status::IOError("cannot write " + script);
  std::fprintf(f,
               "set terminal png size 1000,560\n"
               "set output '%s'\n"
               "set title 'kvtier demo: TTFT per turn (SmolLM2-135M, CPU)'\n"
               "set ylabel 'TTFT (ms)'\nset xlabel 'turn (user/turn)'\n"
               "set logscale y\nset grid\nset key top left\n"
               "set style data linespoints\n"
               "plot '%s' using 1:3:xtic(2) title 'recompute only' lw 2, "
               "'' using 1:4 title 'with kvtier' lw 2\n",
               png.c_str(), dat.c_str());
  std::fclose(f);
  const std::string cmd = "gnuplot " + script + " 2>&1";
  if (std::system(cmd.c_str()) != 0) return Status::Internal("gnuplot failed");
  std::error_code ec;
  std::filesystem::remove(dat, ec);
  std::filesystem::remove(script, ec);
  return Status::Ok();
}

}  // namespace

int RunDemo(const CliArgs& args) {
  if (args.Named("workers")) return RunDemoWorkers(args);  // G4: several worker processes
  if (args.Has("help")) {
    std::printf(
        "kvtier demo [--model PATH] [--users N] [--turns T] [--json] [--no-plot]\n\n"
        "A multi-turn chat on SmolLM2-135M-Instruct: N users (default 3) share a long system\n"
        "prompt and take T turns each (default 3), interleaved. Every turn runs twice,\n"
        "recompute-only and with kvtier (G1 budget of one conversation, G2, G3 in\n"
        "%s), and the TTFT of both is printed with the tokens reused and their tier.\n"
        "Then kvtier restarts before each user returns once more: those turns load from G3.\n"
        "--json prints one JSON object (turns and summary); --no-plot skips demo-ttft.png.\n",
        kDataDir);
    return 0;
  }
  if (Status s = args.CheckKnown({"model", "users", "turns", "json", "no-plot", "help"}); !s.ok())
    return UsageError(s);
  const std::string model_path =
      args.GetString("model", "./models/SmolLM2-135M-Instruct.Q4_1.gguf");
  auto users_r = args.GetUint("users", 3);
  auto turns_r = args.GetUint("turns", 3);
  if (!users_r.ok()) return UsageError(users_r.status());
  if (!turns_r.ok()) return UsageError(turns_r.status());
  const auto users = static_cast<uint32_t>(*users_r);
  const auto turns = static_cast<uint32_t>(*turns_r);
  if (users < 1 || users > 16 || turns < 1 || turns > 16)
    return UsageError(Status::InvalidArgument("--users and --turns must be in 1..16"));
  const bool json = args.Has("json");
  const bool plot = !args.Has("no-plot");
  FILE* log = json ? stderr : stdout;

  if (Status s = CheckDemoModelPath(model_path); !s.ok()) return UsageError(s);
  std::fprintf(log, "loading %s ...\n", model_path.c_str());
  std::fflush(log);
  auto loaded = LoadDemoModel(model_path);
  if (!loaded.ok()) return Failure(loaded.status());
  const Tokenizer& tok = *loaded->tokenizer;
  LlamaModel* const model = loaded->model.get();
  const ChatTemplate* const chat = &loaded->chat;
  const int64_t eos = tok.eos_id();

  const KvLayout layout = model->MakeKvLayout(kTokensPerBlock);
  const uint64_t block_bytes = layout.BlockBytes();
  const uint64_t slot = 4096 + block_bytes;
  const auto system_tokens = static_cast<uint32_t>(
      tok.Encode(chat->Apply({{"system", kSystemPrompt}}, false), true).size());
  const uint32_t system_blocks = system_tokens / kTokensPerBlock;
  // The largest conversation: system + turns x (question + answer + template).
  const uint32_t max_tokens = system_tokens + turns * (40 + kMaxNewTokens) + kMaxNewTokens;
  const uint32_t g1_blocks = max_tokens / kTokensPerBlock + 8;  // one conversation at a time
  // G2 holds every conversation (G1 holds one), so returning turns load from G2. Then each
  // user returns once more after the worker restarted: G2 was written to G3 at the clean
  // shutdown (g3.flush_on_close) and the new process starts with an empty G2, so those turns
  // load their whole prefix from G3.
  constexpr uint32_t kStagingSlots = 8;
  const uint64_t g2_blocks = system_blocks +
                             uint64_t{users} * (max_tokens - system_tokens) / kTokensPerBlock +
                             2 * kStagingSlots;

  std::error_code ec;
  std::filesystem::remove_all(kDataDir, ec);
  std::filesystem::create_directories(kDataDir, ec);
  ManagerOptions mo;
  mo.layout = layout;
  mo.model_id = "SmolLM2-135M-Instruct.Q4_1";
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"g2.capacity_bytes", std::to_string(g2_blocks * slot)},
           {"g2.lock_memory", "false"},
           {"g2.prefault_threads", "1"},
           {"g3.dir", kDataDir},
           {"g3.capacity_bytes", std::to_string(512ull << 20)},
           {"g2.staging_slots", std::to_string(kStagingSlots)},
           {"g3.admit_min_seen", "1"}}) {
    if (Status s = mo.config.Set(k, v); !s.ok()) return Failure(s);
  }
  // KVTIER_METRICS_PORT: /metrics while the demo runs (docs/metrics.md).
  auto metrics = MetricsSettings();
  if (!metrics.ok()) return UsageError(metrics.status());
  for (const auto& [k, v] : *metrics) {
    if (Status s = mo.config.Set(k, v); !s.ok()) return UsageError(s);
  }
  // KVTIER_SERVICE_SOCKET: the reference engine attached to kvtier serve (docs/service.md);
  // the daemon's settings then size G2 and G3, and a "restart" below restarts only this side.
  if (Status s = mo.config.LoadEnvironment(ServiceEnvironment()); !s.ok()) return UsageError(s);
  std::unique_ptr<BlockManager> manager;
  std::unique_ptr<Engine> with;
  Progress progress("demo", uint64_t{users} * (turns + 1), "turns");
  // (Re)starts kvtier: a restart shuts the old manager down cleanly (its G2 goes to G3) and
  // opens a new one on the same G3 directory (a warm restart: it recovers those blocks).
  auto start_kvtier = [&]() -> Status {
    with.reset();
    manager.reset();
    progress.Clear();
    {
      Progress recovery("G3 recovery (header scan)", 0, "slots");
      ManagerOptions opts = mo;
      opts.g3_recovery_progress = [&recovery](uint64_t scanned, uint64_t total) {
        recovery.Update(scanned, total);
      };
      KVTIER_ASSIGN_OR_RETURN(manager, BlockManager::Create(opts));
    }
    KVTIER_ASSIGN_OR_RETURN(with, Engine::Create(model, manager.get(), g1_blocks, kTokensPerBlock));
    return Status::Ok();
  };
  if (Status s = start_kvtier(); !s.ok()) return Failure(s);
  auto without = Engine::Create(model, nullptr, g1_blocks, kTokensPerBlock);
  if (!without.ok()) return Failure(without.status());
  // The tiers' limits on this machine, measured now, for the per-hit TTFT bound.
  const double g2_gbps =
      MeasureMemcpyGbps(static_cast<unsigned>(mo.config.GetUint("transfer.copy_threads")));
  const double g3_gbps = MeasureDirectReadGbps(kDataDir);

  std::fprintf(log,
               "model: %u layers, KV %.1f KiB/token; block %u tokens (%.0f KiB)\n"
               "system prompt: %u tokens; G1 %u blocks (%.1f MiB, < %u users' KV), G2 %llu "
               "blocks (%.1f MiB), G3 %s (admit_min_seen=1)\n\n",
               model->config().num_layers, block_bytes / 1024.0 / kTokensPerBlock, kTokensPerBlock,
               block_bytes / 1024.0, system_tokens, g1_blocks, g1_blocks * block_bytes / 1048576.0,
               users, static_cast<unsigned long long>(g2_blocks), g2_blocks * slot / 1048576.0,
               kDataDir);
  std::fprintf(log,
               "measured now: memcpy %.1f GB/s (G2 -> G1 limit), O_DIRECT read %.2f GB/s (G3 "
               "limit)\n\n",
               g2_gbps, g3_gbps);
  std::fprintf(log, "%-4s %-5s %6s %7s %-14s %9s %9s %7s %8s  %s\n", "user", "turn", "prompt",
               "reused", "from", "recompute", "kvtier", "speedup", "bound", "answer");
  std::fflush(log);

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<ChatMessage>> convs(users);
  std::vector<uint32_t> prev_context(users, 0);
  for (auto& c : convs) c.push_back({"system", kSystemPrompt});
  std::vector<TurnResult> results;
  // Counters summed per turn (a restart starts the manager's counters anew).
  uint64_t asked = 0, missed = 0, demoted = 0, promoted = 0;
  std::array<uint64_t, kNumTiers> hits{};
  auto run_turn = [&](uint32_t u, uint32_t t, bool after_restart) -> Status {
    TurnResult r;
    r.user = u;
    r.turn = t;
    r.after_restart = after_restart;
    convs[u].push_back({"user", kQuestions[(u * 5 + t * 3) % kNumQuestions]});
    const auto ids = tok.Encode(chat->Apply(convs[u], true), true);
    r.prompt_tokens = static_cast<uint32_t>(ids.size());
    r.new_tokens = r.prompt_tokens - std::min(r.prompt_tokens, prev_context[u]);
    const std::string id = "u" + std::to_string(u) + "t" + std::to_string(t);
    KVTIER_ASSIGN_OR_RETURN(RequestOutcome ref,
                            without->get()->Run({id + "-ref", ids, "", "", {}}, 1, eos));
    const ManagerStats s0 = manager->Stats();
    KVTIER_ASSIGN_OR_RETURN(RequestOutcome out,
                            with->Run({id, ids, "", "", {}}, kMaxNewTokens, eos));
    with->ReleaseFinished(true);
    const ManagerStats s1 = manager->Stats();
    for (TierId k = 0; k < kNumTiers; ++k) {
      r.blocks[k] = s1.hit_blocks[k] - s0.hit_blocks[k];
      hits[k] += r.blocks[k];
    }
    asked += s1.lookup_blocks - s0.lookup_blocks;
    missed += s1.miss_blocks - s0.miss_blocks;
    demoted += s1.demoted_blocks - s0.demoted_blocks;
    promoted += s1.promoted_blocks - s0.promoted_blocks;
    uint64_t loaded_blocks = 0;
    for (uint64_t b : r.blocks) loaded_blocks += b;
    r.source = loaded_blocks == 0 ? "none" : "mixed";
    for (TierId k = 0; k < kNumTiers; ++k)
      if (loaded_blocks > 0 && r.blocks[k] == loaded_blocks) r.source = TierName(k);
    r.reused_tokens = out.loaded_tokens;
    r.computed_tokens = out.computed_tokens;
    r.full_prefix = r.reused_tokens > 0 && r.computed_tokens <= r.new_tokens + kTokensPerBlock;
    r.ttft_recompute = ref.ttft_seconds;
    r.ttft_kvtier = out.ttft_seconds;
    r.load_wait = out.load_wait_seconds;
    r.compute = out.compute_seconds;
    if (loaded_blocks > 0) {
      const double transfer = double(r.blocks[kTierG2] * block_bytes) / (g2_gbps * 1e9) +
                              double(r.blocks[kTierG3] * block_bytes) / (g3_gbps * 1e9);
      r.bound = 1.5 * (transfer + out.compute_seconds);
    }
    r.first_token_match =
        !ref.generated.empty() && !out.generated.empty() && ref.generated[0] == out.generated[0];
    r.answer = tok.Decode(out.generated, /*skip_special=*/true);
    while (!r.answer.empty() && (r.answer.back() == ' ' || r.answer.back() == '\n'))
      r.answer.pop_back();
    convs[u].push_back({"assistant", r.answer});
    prev_context[u] = r.prompt_tokens;  // the next prompt starts with this one

    std::string from = "-";
    if (r.reused_tokens > 0) {
      from.clear();
      for (TierId k = 0; k < kNumTiers; ++k) {
        if (r.blocks[k] == 0) continue;
        from += (from.empty() ? "" : "+") + std::string(TierName(k)) + ":" +
                std::to_string(r.blocks[k]);
      }
    }
    const std::string turn_label = std::to_string(t) + (after_restart ? "R" : "");
    const std::string bound =
        r.bound == 0 ? "-"
                     : (r.ttft_kvtier <= r.bound ? "ok " : "OVER ") +
                           std::to_string(static_cast<int>(r.bound * 1e3 + 0.5)) + "ms";
    progress.Clear();  // the row replaces the progress line; progress redraws below it
    std::fprintf(log, "%-4u %-5s %6u %7u %-14s %7.0fms %7.0fms %6.1fx %8s  %s\n", u,
                 turn_label.c_str(), r.prompt_tokens, r.reused_tokens, from.c_str(),
                 r.ttft_recompute * 1e3, r.ttft_kvtier * 1e3, r.ttft_recompute / r.ttft_kvtier,
                 bound.c_str(), FirstWords(r.answer, 8).c_str());
    std::fflush(log);
    results.push_back(std::move(r));
    progress.Update(results.size());
    return Status::Ok();
  };
  for (uint32_t t = 0; t < turns; ++t) {
    for (uint32_t u = 0; u < users; ++u) {
      if (Status s = run_turn(u, t, false); !s.ok()) return Failure(s);
    }
  }
  std::fprintf(log,
               "-- kvtier restarts before each user's next turn (R): the prefix comes from G3\n");
  for (uint32_t u = 0; u < users; ++u) {
    if (Status s = start_kvtier(); !s.ok()) return Failure(s);
    if (Status s = run_turn(u, turns, true); !s.ok()) return Failure(s);
  }
  const ManagerStats after_chat = manager->Stats();
  progress.Finish();

  // Overhead without reuse: unrelated prompts, each under a fresh cache salt so nothing is
  // ever cached, with kvtier and without, alternating.
  std::vector<double> ov_with, ov_without;
  for (uint32_t rep = 0; rep < 2; ++rep) {
    for (size_t p = 0; p < std::size(kUnrelated); ++p) {
      const auto ids = tok.Encode(chat->Apply({{"user", kUnrelated[p]}}, true), true);
      const std::string id = "ov" + std::to_string(rep) + "-" + std::to_string(p);
      auto a = without->get()->Run({id + "-ref", ids, "", "", {}}, 1, eos);
      auto b = with->Run({id, ids, "overhead-" + id, "", {}}, 1, eos);
      if (!a.ok()) return Failure(a.status());
      if (!b.ok()) return Failure(b.status());
      with->ReleaseFinished(true);
      ov_without.push_back(a->ttft_seconds);
      ov_with.push_back(b->ttft_seconds);
    }
  }
  const double overhead = Median(ov_with) / Median(ov_without) - 1;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<double> speedups, g2_ratio, g3_ratio;
  uint32_t hit_turns = 0, within_bound = 0;
  for (const TurnResult& r : results) {
    if (r.reused_tokens > 0) speedups.push_back(r.ttft_recompute / r.ttft_kvtier);
    if (r.bound > 0) {
      ++hit_turns;
      if (r.ttft_kvtier <= r.bound) ++within_bound;
    }
    if (!r.full_prefix || r.prompt_tokens < kLongContext) continue;
    if (r.source == TierName(kTierG2)) g2_ratio.push_back(r.ttft_kvtier / r.ttft_recompute);
    if (r.source == TierName(kTierG3)) g3_ratio.push_back(r.ttft_kvtier / r.ttft_recompute);
  }
  std::array<double, kNumTiers> hit_rate{};
  for (TierId k = 0; k < kNumTiers; ++k) hit_rate[k] = asked == 0 ? 0 : double(hits[k]) / asked;
  const double miss_rate = asked == 0 ? 0 : double(missed) / double(asked);
  uint32_t matches = 0;
  for (const TurnResult& r : results) matches += r.first_token_match ? 1 : 0;

  std::string png;
  if (plot) {
    if (!HaveGnuplot()) {
      std::fprintf(stderr,
                   "kvtier: warning: gnuplot not found, no plot written (install gnuplot-nox, "
                   "see scripts/install-deps.sh; --no-plot silences this)\n");
    } else if (Status s = WritePlot(results, "demo-ttft.png"); !s.ok()) {
      std::fprintf(stderr, "kvtier: warning: plot not written: %s\n", s.ToString().c_str());
    } else {
      png = (std::filesystem::current_path() / "demo-ttft.png").string();
    }
  }

  std::fprintf(log,
               "\nsummary (%zu turns, %.1f s):\n"
               "  median TTFT speedup with reuse: %.1fx (over %zu turns that reused a prefix)\n"
               "  ttft_ratio_g2 = %.3f (%zu full-prefix G2 turns >= %u tokens)\n"
               "  ttft_ratio_g3 = %.3f (%zu full-prefix G3 turns >= %u tokens, after a restart)\n"
               "  hits within the TTFT bound 1.5 x (bytes / tier bandwidth + compute): %u of %u\n"
               "  block hit rate: G2 %.1f%%, G3 %.1f%%, miss %.1f%% (of %llu blocks looked up)\n"
               "  demoted to G3: %llu blocks; promoted back: %llu\n"
               "  overhead_no_reuse = %+.3f (median TTFT %.1f ms with kvtier, %.1f ms "
               "without)\n"
               "  first token equal to recompute: %u of %zu turns\n",
               results.size(), seconds, Median(speedups), speedups.size(), Median(g2_ratio),
               g2_ratio.size(), kLongContext, Median(g3_ratio), g3_ratio.size(), kLongContext,
               within_bound, hit_turns, 100 * hit_rate[kTierG2], 100 * hit_rate[kTierG3],
               100 * miss_rate, static_cast<unsigned long long>(asked),
               static_cast<unsigned long long>(demoted), static_cast<unsigned long long>(promoted),
               overhead, Median(ov_with) * 1e3, Median(ov_without) * 1e3, matches, results.size());
  if (!png.empty()) std::fprintf(log, "  plot: %s\n", png.c_str());
  std::fprintf(log, "  (dropped saves %llu, demotions not admitted %llu, demotion failures %llu)\n",
               static_cast<unsigned long long>(after_chat.dropped_saves),
               static_cast<unsigned long long>(after_chat.demotions_not_admitted),
               static_cast<unsigned long long>(after_chat.demotion_failures));

  if (json) {
    std::string arr = "[";
    for (size_t i = 0; i < results.size(); ++i) {
      const TurnResult& r = results[i];
      JsonObject o;
      o.Add("user", r.user)
          .Add("turn", r.turn)
          .Add("prompt_tokens", r.prompt_tokens)
          .Add("reused_tokens", r.reused_tokens)
          .Add("computed_tokens", r.computed_tokens)
          .Add("blocks_g2", r.blocks[kTierG2])
          .Add("blocks_g3", r.blocks[kTierG3])
          .Add("source", r.source)
          .Add("after_restart", r.after_restart)
          .Add("load_wait_ms", r.load_wait * 1e3)
          .Add("compute_ms", r.compute * 1e3)
          .Add("ttft_bound_ms", r.bound * 1e3)
          .Add("within_bound", r.bound == 0 || r.ttft_kvtier <= r.bound)
          .Add("full_prefix", r.full_prefix)
          .Add("ttft_recompute_ms", r.ttft_recompute * 1e3)
          .Add("ttft_kvtier_ms", r.ttft_kvtier * 1e3)
          .Add("first_token_match", r.first_token_match)
          .Add("answer", r.answer);
      arr += (i ? ", " : "") + o.Str();
    }
    arr += "]";
    JsonObject summary;
    summary.Add("ttft_ratio_g2", Median(g2_ratio))
        .Add("ttft_ratio_g3", Median(g3_ratio))
        .Add("overhead_no_reuse", overhead)
        .Add("median_speedup", Median(speedups))
        .Add("g2_turns", static_cast<uint64_t>(g2_ratio.size()))
        .Add("g3_turns", static_cast<uint64_t>(g3_ratio.size()))
        .Add("hit_turns", hit_turns)
        .Add("hits_within_bound", within_bound)
        .Add("g2_gbps_measured", g2_gbps)
        .Add("g3_gbps_measured", g3_gbps)
        .Add("hit_rate_g2", hit_rate[kTierG2])
        .Add("hit_rate_g3", hit_rate[kTierG3])
        .Add("miss_rate", miss_rate)
        .Add("first_token_matches", matches)
        .Add("seconds", seconds)
        .Add("plot", png);
    JsonObject top;
    top.Raw("turns", arr).Raw("summary", summary.Str());
    std::printf("%s\n", top.Str().c_str());
  }
  return 0;
}

}  // namespace kvtier::cli

#include "replay/trace_gen.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_map>
#include <variant>

namespace kvtier::replay {

namespace {

constexpr uint64_t kTokensPerBlock = 512;
// A session stops when its prompt would pass this many blocks (the trace parser's limit is
// 16,384 ids per request; real engines' context windows are far below it).
constexpr uint64_t kMaxPromptBlocks = 1024;

// ---- Parameters by name -----------------------------------------------------------------------

struct Field {
  const char* name;
  const char* comment;
  std::variant<uint64_t TraceParams::*, uint32_t TraceParams::*, double TraceParams::*> member;
  double lo, hi;  // accepted range, inclusive
};

const std::vector<Field>& Fields() {
  static const std::vector<Field> fields = {
      {"requests", "requests written (the first ones by timestamp)", &TraceParams::requests, 1,
       1e7},
      {"sessions_per_s", "session arrival rate (Poisson)", &TraceParams::sessions_per_s, 1e-6, 1e6},
      {"bursty", "0 flat arrivals, 1 on/off bursts", &TraceParams::bursty, 0, 1},
      {"burst_factor", "bursty: rate x this in on periods, / this in off periods",
       &TraceParams::burst_factor, 1, 1000},
      {"burst_period_s", "bursty: length of each on and off period, s",
       &TraceParams::burst_period_s, 1e-3, 1e6},
      {"sys_prompts", "distinct system prompts", &TraceParams::sys_prompts, 1, 1e7},
      {"sys_zipf", "Zipf exponent of system-prompt popularity", &TraceParams::sys_zipf, 0, 4},
      {"sys_blocks_min", "system prompt length, blocks (min)", &TraceParams::sys_blocks_min, 0,
       256},
      {"sys_blocks_max", "system prompt length, blocks (max)", &TraceParams::sys_blocks_max, 0,
       256},
      {"turns_mean", "mean turns per session (geometric)", &TraceParams::turns_mean, 1, 1000},
      {"turns_max", "most turns per session", &TraceParams::turns_max, 1, 10000},
      {"think_s", "mean time between a session's turns, s (exponential)", &TraceParams::think_s, 0,
       1e6},
      {"user_tokens_min", "fresh user text per turn, tokens (min)", &TraceParams::user_tokens_min,
       1, 1e6},
      {"user_tokens_max", "fresh user text per turn, tokens (max)", &TraceParams::user_tokens_max,
       1, 1e6},
      {"output_tokens_min", "answer length, tokens (min)", &TraceParams::output_tokens_min, 0, 1e6},
      {"output_tokens_max", "answer length, tokens (max)", &TraceParams::output_tokens_max, 0, 1e6},
      {"block_aligned", "1: pad appended text and answers to whole blocks",
       &TraceParams::block_aligned, 0, 1},
      {"docs", "RAG corpus size (0 = no documents)", &TraceParams::docs, 0, 1e7},
      {"doc_zipf", "Zipf exponent of document popularity", &TraceParams::doc_zipf, 0, 4},
      {"doc_blocks_min", "document length, blocks (min)", &TraceParams::doc_blocks_min, 1, 256},
      {"doc_blocks_max", "document length, blocks (max)", &TraceParams::doc_blocks_max, 1, 256},
      {"docs_min", "documents per RAG request (min)", &TraceParams::docs_min, 1, 16},
      {"docs_max", "documents per RAG request (max)", &TraceParams::docs_max, 1, 16},
      {"oneoff_share", "share of sessions that are one long never-repeated prompt",
       &TraceParams::oneoff_share, 0, 1},
      {"oneoff_blocks_min", "one-off prompt length, blocks (min)", &TraceParams::oneoff_blocks_min,
       1, 1000},
      {"oneoff_blocks_max", "one-off prompt length, blocks (max)", &TraceParams::oneoff_blocks_max,
       1, 1000},
  };
  return fields;
}

double ValueOf(const TraceParams& p, const Field& f) {
  return std::visit([&](auto m) { return static_cast<double>(p.*m); }, f.member);
}

std::string Shortest(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string FieldNames() {
  std::string names;
  for (const Field& f : Fields()) names += (names.empty() ? "" : ", ") + std::string(f.name);
  return names;
}

// ---- Randomness -------------------------------------------------------------------------------

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256** (Blackman & Vigna), seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& w : s_) w = SplitMix64(seed);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1).
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [lo, hi].
  uint64_t Between(uint64_t lo, uint64_t hi) {
    return hi <= lo ? lo : lo + static_cast<uint64_t>(Unit() * static_cast<double>(hi - lo + 1));
  }
  double Exponential(double mean) { return mean <= 0 ? 0 : -std::log1p(-Unit()) * mean; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Draws 0..n-1 with probability proportional to 1 / (i + 1)^alpha.
class Zipf {
 public:
  Zipf(uint64_t n, double alpha) : cdf_(std::max<uint64_t>(n, 1)) {
    double sum = 0;
    for (size_t i = 0; i < cdf_.size(); ++i) cdf_[i] = sum += std::pow(double(i + 1), -alpha);
    for (double& c : cdf_) c /= sum;
  }
  uint64_t Draw(Rng& rng) const {
    const double u = rng.Unit();
    return std::min<uint64_t>(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin(),
                              cdf_.size() - 1);
  }

 private:
  std::vector<double> cdf_;
};

// ---- Content labels and hash ids
// -----------------------------------------------------------------

uint64_t SysLabel(uint64_t prompt, uint64_t block) { return (1ull << 62) | (prompt << 20) | block; }
uint64_t DocLabel(uint64_t doc, uint64_t block) { return (2ull << 62) | (doc << 20) | block; }

struct PairHash {
  size_t operator()(const std::pair<uint64_t, uint64_t>& p) const {
    uint64_t s = p.first * 0x9e3779b97f4a7c15ull ^ p.second;
    return SplitMix64(s);
  }
};

// Interns (parent id, label) -> hash id, numbering ids in order of first appearance.
class IdTable {
 public:
  uint64_t Id(uint64_t parent, uint64_t label) {
    auto [it, inserted] = ids_.try_emplace({parent, label}, ids_.size());
    return it->second;
  }
  uint64_t FreshLabel() { return (3ull << 62) | next_fresh_++; }

 private:
  std::unordered_map<std::pair<uint64_t, uint64_t>, uint64_t, PairHash> ids_;
  uint64_t next_fresh_ = 0;
};

struct Turn {
  double time_s;
  uint64_t session;
  uint32_t turn;
};

struct Session {
  uint32_t turns = 1;
  bool oneoff = false;
  std::vector<uint64_t> labels;  // the last prompt's blocks
  uint64_t prompt_tokens = 0;    // the last prompt's length
  uint64_t output_tokens = 0;    // the last answer's length
  bool ended = false;
};

uint64_t RoundUpToBlock(uint64_t tokens) {
  return (tokens + kTokensPerBlock - 1) / kTokensPerBlock * kTokensPerBlock;
}

}  // namespace

Status TraceParams::Validate() const {
  for (const Field& f : Fields()) {
    const double v = ValueOf(*this, f);
    if (!(std::isfinite(v) && v >= f.lo && v <= f.hi)) {
      return Status::InvalidArgument(std::string(f.name) + " = " + Shortest(v) + ": must be in [" +
                                     Shortest(f.lo) + ", " + Shortest(f.hi) + "]");
    }
  }
  const std::pair<const char*, std::pair<double, double>> ranges[] = {
      {"sys_blocks", {sys_blocks_min, sys_blocks_max}},
      {"user_tokens", {user_tokens_min, user_tokens_max}},
      {"output_tokens", {output_tokens_min, output_tokens_max}},
      {"doc_blocks", {doc_blocks_min, doc_blocks_max}},
      {"docs", {docs_min, docs_max}},
      {"oneoff_blocks", {oneoff_blocks_min, oneoff_blocks_max}}};
  for (const auto& [name, r] : ranges) {
    if (r.first > r.second) {
      return Status::InvalidArgument(std::string(name) + "_min = " + Shortest(r.first) +
                                     " is above " + name + "_max = " + Shortest(r.second));
    }
  }
  if (turns_mean > turns_max) {
    return Status::InvalidArgument("turns_mean = " + Shortest(turns_mean) +
                                   " is above turns_max = " + std::to_string(turns_max));
  }
  return Status::Ok();
}

Status SetTraceParam(TraceParams& params, std::string_view name, std::string_view value) {
  for (const Field& f : Fields()) {
    if (name != f.name) continue;
    return std::visit(
        [&](auto m) -> Status {
          using T = std::remove_reference_t<decltype(params.*m)>;
          T parsed{};
          auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
          if (ec != std::errc() || end != value.data() + value.size()) {
            return Status::InvalidArgument(
                std::string(f.name) + " = '" + std::string(value) + "': must be " +
                (std::is_floating_point_v<T> ? "a number" : "a non-negative integer") + " in [" +
                Shortest(f.lo) + ", " + Shortest(f.hi) + "]");
          }
          params.*m = parsed;
          return Status::Ok();
        },
        f.member);
  }
  return Status::InvalidArgument("no workload parameter '" + std::string(name) +
                                 "'; the parameters: " + FieldNames());
}

std::string DescribeTraceParams(const TraceParams& params) {
  std::string out;
  for (const Field& f : Fields()) {
    char line[256];
    std::snprintf(line, sizeof(line), "  %-18s = %-10s # %s\n", f.name,
                  Shortest(ValueOf(params, f)).c_str(), f.comment);
    out += line;
  }
  return out;
}

const std::vector<TracePreset>& TracePresets() {
  static const std::vector<TracePreset> presets = [] {
    std::vector<TracePreset> v;
    TraceParams p;
    // Few shared system prompts: every request is one turn behind one of 4 long prompts.
    p = TraceParams();
    p.requests = 6000, p.sessions_per_s = 4, p.sys_prompts = 4, p.sys_zipf = 0.8;
    p.sys_blocks_min = 8, p.sys_blocks_max = 16, p.user_tokens_min = 100, p.user_tokens_max = 3000;
    v.push_back({"sysprompt-few", "4 long shared system prompts, one-turn requests", p});
    // Many system prompts (per-app or per-tenant), Zipf-popular, some with a second turn.
    p = TraceParams();
    p.requests = 6000, p.sessions_per_s = 4, p.sys_prompts = 2000, p.sys_zipf = 1.0;
    p.sys_blocks_min = 2, p.sys_blocks_max = 12, p.turns_mean = 1.3, p.turns_max = 4;
    p.think_s = 60, p.user_tokens_min = 100, p.user_tokens_max = 2000;
    v.push_back({"sysprompt-many", "2,000 Zipf(1.0) system prompts, mostly one turn", p});
    // Multi-turn chat: a short common prompt, sessions of ~4 turns a minute apart.
    p = TraceParams();
    p.requests = 5000, p.sessions_per_s = 1.0, p.sys_blocks_min = 2, p.sys_blocks_max = 2;
    p.turns_mean = 4, p.turns_max = 24, p.think_s = 60, p.user_tokens_min = 50,
    p.user_tokens_max = 1500;
    v.push_back({"chat-multiturn", "chat sessions, mean 4 turns, think time 60 s, flat", p});
    // Deep chats arriving in bursts, quick replies.
    p = TraceParams();
    p.requests = 5000, p.sessions_per_s = 0.3, p.bursty = 1, p.burst_factor = 5,
    p.burst_period_s = 120, p.sys_blocks_min = 2, p.sys_blocks_max = 2;
    p.turns_mean = 10, p.turns_max = 40, p.think_s = 20, p.user_tokens_min = 50,
    p.user_tokens_max = 800;
    v.push_back({"chat-deep-bursty", "deep chats (mean 10 turns, 20 s think), bursty arrivals", p});
    // RAG: documents reused across users, behind one system prompt.
    p = TraceParams();
    p.requests = 5000, p.sessions_per_s = 3, p.sys_blocks_min = 3, p.sys_blocks_max = 3;
    p.docs = 3000, p.doc_zipf = 0.9, p.doc_blocks_min = 4, p.doc_blocks_max = 12, p.docs_min = 1,
    p.docs_max = 3, p.turns_mean = 1.2, p.turns_max = 3, p.think_s = 30;
    p.user_tokens_min = 30, p.user_tokens_max = 300;
    v.push_back({"rag-shared-docs", "RAG, 1-3 of 3,000 Zipf(0.9) documents per query", p});
    // Agent loops: a context re-sent every step, growing by whole tool outputs.
    p = TraceParams();
    p.requests = 5000, p.sessions_per_s = 0.4, p.sys_blocks_min = 6, p.sys_blocks_max = 6;
    p.turns_mean = 20, p.turns_max = 60, p.think_s = 3, p.user_tokens_min = 200,
    p.user_tokens_max = 2000, p.output_tokens_min = 30, p.output_tokens_max = 300,
    p.block_aligned = 1;
    v.push_back({"agent-loop", "agents re-sending a growing context every ~3 s, 20 steps", p});
    // Chat behind a few prompts, with one-off long prompts (documents pasted once) streaming by.
    p = TraceParams();
    p.requests = 5000, p.sessions_per_s = 1.5, p.sys_prompts = 3, p.sys_zipf = 1.0,
    p.sys_blocks_min = 4, p.sys_blocks_max = 8;
    p.turns_mean = 3, p.turns_max = 12, p.think_s = 30, p.user_tokens_min = 50,
    p.user_tokens_max = 1000, p.oneoff_share = 0.25, p.oneoff_blocks_min = 64,
    p.oneoff_blocks_max = 192;
    v.push_back({"oneoff-long", "chat with 25% one-off 64-192-block prompts streaming past", p});
    // Everything at once, in bursts: the catch-all.
    p = TraceParams();
    p.requests = 6000, p.sessions_per_s = 2, p.bursty = 1, p.burst_factor = 4,
    p.burst_period_s = 90, p.sys_prompts = 50, p.sys_zipf = 1.1, p.sys_blocks_min = 2,
    p.sys_blocks_max = 10, p.turns_mean = 3, p.turns_max = 30, p.think_s = 40, p.docs = 1000,
    p.doc_zipf = 1.0, p.doc_blocks_min = 2, p.doc_blocks_max = 10, p.docs_min = 1, p.docs_max = 2,
    p.oneoff_share = 0.1, p.oneoff_blocks_min = 48, p.oneoff_blocks_max = 128;
    v.push_back({"mixed-bursty", "50 prompts, RAG, chats and one-offs, bursty", p});
    return v;
  }();
  return presets;
}

Result<TracePreset> FindTracePreset(std::string_view name) {
  std::string names;
  for (const TracePreset& p : TracePresets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  return Status::InvalidArgument("unknown preset '" + std::string(name) +
                                 "'; the presets: " + names);
}

Status GenerateTrace(const TraceParams& p, uint64_t seed, std::ostream& out) {
  KVTIER_RETURN_IF_ERROR(p.Validate());
  Rng rng(seed);
  std::vector<uint32_t> sys_blocks(p.sys_prompts);
  for (uint32_t& b : sys_blocks)
    b = static_cast<uint32_t>(rng.Between(p.sys_blocks_min, p.sys_blocks_max));
  std::vector<uint32_t> doc_blocks(p.docs);
  for (uint32_t& b : doc_blocks)
    b = static_cast<uint32_t>(rng.Between(p.doc_blocks_min, p.doc_blocks_max));
  const Zipf sys_pick(p.sys_prompts, p.sys_zipf);
  const Zipf doc_pick(std::max<uint32_t>(p.docs, 1), p.doc_zipf);

  // 1. Sessions and the times of their turns, until the first p.requests turns are settled:
  // sessions arrive in time order, so once that many turns start before the latest arrival,
  // no later session can displace them.
  std::vector<Session> sessions;
  std::vector<Turn> turns;
  const double peak = p.sessions_per_s * (p.bursty ? p.burst_factor : 1.0);
  double now = 0;
  while (true) {
    if (sessions.size() % 256 == 0 && !turns.empty()) {
      uint64_t before = 0;
      for (const Turn& t : turns) before += t.time_s <= now;
      if (before >= p.requests) break;
    }
    // Next arrival (thinning against the peak rate when bursty).
    while (true) {
      now += rng.Exponential(1.0 / peak);
      if (!p.bursty) break;
      const bool on = static_cast<uint64_t>(now / p.burst_period_s) % 2 == 0;
      const double rate =
          on ? p.sessions_per_s * p.burst_factor : p.sessions_per_s / p.burst_factor;
      if (rng.Unit() * peak < rate) break;
    }
    Session s;
    s.oneoff = p.oneoff_share > 0 && rng.Unit() < p.oneoff_share;
    if (!s.oneoff && p.turns_mean > 1) {
      const double q = 1.0 - 1.0 / p.turns_mean;  // chance of another turn
      s.turns = 1 + static_cast<uint32_t>(std::min(
                        std::floor(std::log1p(-rng.Unit()) / std::log(q)), double(p.turns_max)));
      s.turns = std::min(s.turns, p.turns_max);
    }
    double t = now;
    for (uint32_t k = 0; k < s.turns; ++k) {
      if (k > 0) t += 0.001 + rng.Exponential(p.think_s);
      turns.push_back({t, sessions.size(), k});
    }
    sessions.push_back(std::move(s));
  }
  std::sort(turns.begin(), turns.end(), [](const Turn& a, const Turn& b) {
    if (a.time_s != b.time_s) return a.time_s < b.time_s;
    return a.session != b.session ? a.session < b.session : a.turn < b.turn;
  });
  if (turns.size() > p.requests) turns.resize(p.requests);

  // 2. Prompts, in time order (a session's turns come in turn order).
  IdTable ids;
  std::string line;
  for (const Turn& t : turns) {
    Session& s = sessions[t.session];
    if (s.ended) continue;
    const uint64_t output = rng.Between(p.output_tokens_min, p.output_tokens_max);
    uint64_t user = rng.Between(p.user_tokens_min, p.user_tokens_max);
    if (t.turn == 0) {
      const uint64_t sys = sys_pick.Draw(rng);
      for (uint64_t j = 0; j < sys_blocks[sys]; ++j) s.labels.push_back(SysLabel(sys, j));
      if (!s.oneoff && p.docs > 0) {
        const uint64_t n = rng.Between(p.docs_min, p.docs_max);
        for (uint64_t i = 0; i < n; ++i) {
          const uint64_t d = doc_pick.Draw(rng);
          for (uint64_t j = 0; j < doc_blocks[d]; ++j) s.labels.push_back(DocLabel(d, j));
        }
      }
      if (s.oneoff) user = rng.Between(p.oneoff_blocks_min, p.oneoff_blocks_max) * kTokensPerBlock;
      if (p.block_aligned) user = RoundUpToBlock(user);
      s.prompt_tokens = s.labels.size() * kTokensPerBlock + user;
    } else {
      // Keep the previous prompt's full blocks; its partial tail, the answer and the new text
      // are new blocks.
      s.labels.resize(s.prompt_tokens / kTokensPerBlock);
      const uint64_t answer = p.block_aligned ? RoundUpToBlock(s.output_tokens) : s.output_tokens;
      if (p.block_aligned) user = RoundUpToBlock(user);
      s.prompt_tokens += answer + user;
    }
    const uint64_t blocks = (s.prompt_tokens + kTokensPerBlock - 1) / kTokensPerBlock;
    if (blocks > kMaxPromptBlocks) {
      s.ended = true;  // the context window is full: the session ends here
      continue;
    }
    while (s.labels.size() < blocks) s.labels.push_back(ids.FreshLabel());
    s.output_tokens = output;

    line = "{\"timestamp\": " + std::to_string(static_cast<uint64_t>(t.time_s * 1000.0)) +
           ", \"input_length\": " + std::to_string(s.prompt_tokens) +
           ", \"output_length\": " + std::to_string(output) + ", \"hash_ids\": [";
    uint64_t parent = std::numeric_limits<uint64_t>::max();
    for (size_t i = 0; i < s.labels.size(); ++i) {
      parent = ids.Id(parent, s.labels[i]);
      if (i > 0) line += ", ";
      line += std::to_string(parent);
    }
    line += "]}\n";
    out << line;
    if (!out) return Status::IOError("writing the trace failed");
  }
  out.flush();
  if (!out) return Status::IOError("writing the trace failed");
  return Status::Ok();
}

}  // namespace kvtier::replay

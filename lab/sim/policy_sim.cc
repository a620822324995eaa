#include "sim/policy_sim.h"

#include "sim/jsonl_line.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace kvtier {

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The hash id of a root (no parent); real ids are < 2^64 - 1 (see ParseUint).
constexpr uint64_t kNoParent = std::numeric_limits<uint64_t>::max();

// Parses one non-blank line into `ids` (appended) and `input_length` (0 when absent). On error
// `ids` may hold part of the line.
Status ParseLine(std::string_view text, uint64_t line, std::vector<uint64_t>* ids,
                 double* input_length) {
  JsonLineParser p(text, line);
  if (Status s = p.Expect('{'); !s.ok()) return s;
  bool have_ids = false;
  if (!p.Take('}')) {
    do {
      auto key = p.String();
      if (!key.ok()) return key.status();
      if (Status s = p.Expect(':'); !s.ok()) return s;
      if (*key == "hash_ids") {
        if (have_ids) return p.Error("duplicate key \"hash_ids\"");
        have_ids = true;
        if (Status s = p.Expect('['); !s.ok()) return s;
        if (!p.Take(']')) {
          do {
            if (ids->size() >= kMaxTraceLineIds) {
              return p.Error("more than " + std::to_string(kMaxTraceLineIds) +
                             " hash ids in one request; split it");
            }
            auto id = p.Uint("hash_ids[" + std::to_string(ids->size()) + "]");
            if (!id.ok()) return id.status();
            ids->push_back(*id);
          } while (p.Take(','));
          if (Status s = p.Expect(']'); !s.ok()) return s;
        }
      } else if (*key == "timestamp" || *key == "input_length" || *key == "output_length") {
        auto v = p.NonNegativeNumber(std::string(*key));
        if (!v.ok()) return v.status();
        if (*key == "input_length") *input_length = *v;
      } else if (Status s = p.SkipValue(); !s.ok()) {
        return s;
      }
    } while (p.Take(','));
    if (Status s = p.Expect('}'); !s.ok()) return s;
  }
  if (!p.AtEnd()) return p.Error("unexpected text after the object");
  if (!have_ids) return p.Error("missing \"hash_ids\"");
  return Status::Ok();
}

}  // namespace

Result<Trace> ParseMooncakeTrace(std::istream& in) {
  Trace trace;
  std::unordered_map<uint64_t, uint64_t> parent_of;  // id -> parent id (kNoParent at the root)
  std::string text;
  std::vector<uint64_t> ids;
  JsonLineReader reader(in);
  while (reader.Next(&text)) {
    const uint64_t line = reader.line();
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    ids.clear();
    double input_length = 0;
    if (Status s = ParseLine(text, line, &ids, &input_length); !s.ok()) return s;
    trace.input_lengths.push_back(
        static_cast<uint64_t>(std::min(input_length, 1e15)));  // checked finite, >= 0
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint64_t parent = i == 0 ? kNoParent : ids[i - 1];
      auto [it, inserted] = parent_of.try_emplace(ids[i], parent);
      if (!inserted && it->second != parent) ++trace.lineage_conflicts;
      trace.ids.push_back(ids[i]);
    }
    trace.request_ends.push_back(trace.ids.size());
  }
  KVTIER_RETURN_IF_ERROR(reader.status());
  if (in.bad()) return Status::IOError("reading the trace failed");
  trace.distinct_blocks = parent_of.size();
  return trace;
}

Result<Trace> LoadMooncakeTrace(const std::string& path) {
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<RegularFileStream> in, OpenTraceFile(path));
  auto trace = ParseMooncakeTrace(*in);
  if (!in->read_error().ok()) return in->read_error();
  if (!trace.ok()) return Status::InvalidArgument(path + ": " + trace.status().message());
  return trace;
}

BlockKey TraceBlockKey(uint64_t hash_id) { return BlockKey{hash_id + 1, SplitMix64(hash_id)}; }

BlockKey TraceRootKey() { return BlockKey{0, SplitMix64(kNoParent)}; }

std::vector<BlockKey> TraceReferences(const Trace& trace) {
  std::vector<BlockKey> refs;
  refs.reserve(trace.ids.size());
  for (uint64_t id : trace.ids) refs.push_back(TraceBlockKey(id));
  return refs;
}

uint64_t CapacityForFraction(const Trace& trace, double fraction) {
  const double blocks = std::ceil(fraction * static_cast<double>(trace.distinct_blocks));
  if (!(blocks >= 1.0)) return 1;
  if (blocks >= static_cast<double>(std::numeric_limits<uint64_t>::max())) {
    return std::numeric_limits<uint64_t>::max();
  }
  return static_cast<uint64_t>(blocks);
}

Result<SimResult> SimulatePolicy(const Trace& trace, EvictionPolicy& policy,
                                 uint64_t capacity_blocks) {
  if (capacity_blocks == 0) return Status::InvalidArgument("capacity must be at least one block");
  if (policy.size() != 0) return Status::InvalidArgument("the policy must start empty");
  SimResult result;
  std::unordered_set<BlockKey, BlockKeyHash> cached;
  cached.reserve(static_cast<size_t>(std::min<uint64_t>(capacity_blocks, trace.ids.size())) * 2);
  const auto any = [](const BlockKey&) { return true; };
  for (size_t r = 0; r < trace.requests(); ++r) {
    const uint64_t begin = trace.begin(r);
    const uint64_t end = trace.end(r);
    uint64_t i = begin;
    for (; i < end && cached.contains(TraceBlockKey(trace.ids[i])); ++i) {
      policy.OnAccess(TraceBlockKey(trace.ids[i]));
    }
    result.hit_blocks += i - begin;
    for (; i < end; ++i) {
      const BlockKey key = TraceBlockKey(trace.ids[i]);
      if (cached.contains(key)) {
        policy.OnAccess(key);
        ++result.late_accesses;
        continue;
      }
      if (cached.size() >= capacity_blocks) {
        const std::optional<BlockKey> victim = policy.Victim(any);
        if (!victim) return Status::Internal("the policy named no victim in a full tier");
        if (cached.erase(*victim) != 1) {
          return Status::Internal("the policy named a victim that is not cached: " +
                                  victim->ToHex());
        }
        policy.OnRemove(*victim);
        ++result.evictions;
      }
      const BlockKey parent = i == begin ? TraceRootKey() : TraceBlockKey(trace.ids[i - 1]);
      policy.OnInsert(key, parent);
      cached.insert(key);
      ++result.inserts;
    }
  }
  result.blocks = trace.ids.size();
  if (policy.size() != cached.size()) {
    return Status::Internal("the policy tracks " + std::to_string(policy.size()) +
                            " blocks but the tier holds " + std::to_string(cached.size()));
  }
  return result;
}

SimResult SimulateUnbounded(const Trace& trace) {
  SimResult result;
  std::unordered_set<uint64_t> cached;
  cached.reserve(trace.distinct_blocks * 2);
  for (size_t r = 0; r < trace.requests(); ++r) {
    uint64_t i = trace.begin(r);
    for (; i < trace.end(r) && cached.contains(trace.ids[i]); ++i) ++result.hit_blocks;
    for (; i < trace.end(r); ++i) {
      if (cached.insert(trace.ids[i]).second) {
        ++result.inserts;
      } else {
        ++result.late_accesses;
      }
    }
  }
  result.blocks = trace.ids.size();
  return result;
}

}  // namespace kvtier

#include "proto/protocol.h"

#include <type_traits>

#include "kvtier/tier.h"

namespace kvtier::proto {

const char* MsgTypeName(uint16_t type) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::kHello:
      return "Hello";
    case MsgType::kReply:
      return "Reply";
    case MsgType::kLookup:
      return "Lookup";
    case MsgType::kPrepareLoad:
      return "PrepareLoad";
    case MsgType::kCommit:
      return "Commit";
    case MsgType::kRequestFinished:
      return "RequestFinished";
    case MsgType::kRegisterG1:
      return "RegisterG1";
    case MsgType::kStartLoad:
      return "StartLoad";
    case MsgType::kStartSave:
      return "StartSave";
    case MsgType::kWaitLayer:
      return "WaitLayer";
    case MsgType::kLoadedTokens:
      return "LoadedTokens";
    case MsgType::kWaitForSaves:
      return "WaitForSaves";
    case MsgType::kWaitForRequestSaves:
      return "WaitForRequestSaves";
    case MsgType::kFinished:
      return "Finished";
    case MsgType::kStats:
      return "Stats";
    case MsgType::kCopy:
      return "Copy";
    case MsgType::kCopyLayer:
      return "CopyLayer";
    case MsgType::kCopyDone:
      return "CopyDone";
    case MsgType::kFetch:
      return "Fetch";
    case MsgType::kFetchDone:
      return "FetchDone";
    case MsgType::kG4Config:
      return "G4Config";
    case MsgType::kG4Ready:
      return "G4Ready";
    case MsgType::kEvents:
      return "Events";
  }
  return "unknown";
}

void EncodeStatus(WireWriter* w, const Status& status) {
  w->U8(static_cast<uint8_t>(status.code()));
  w->String(status.ok() ? std::string_view() : std::string_view(status.message()));
}

Status DecodeStatus(WireReader* r, Status* out) {
  uint8_t code = 0;
  std::string message;
  KVTIER_RETURN_IF_ERROR(r->U8("status code", &code));
  KVTIER_RETURN_IF_ERROR(r->String("status message", kMaxMessageBytes, &message));
  if (code > static_cast<uint8_t>(StatusCode::kInternal)) {
    return Status::InvalidArgument("service protocol: status code " + std::to_string(code) +
                                   " is not one this build knows");
  }
  *out = code == 0 ? Status::Ok() : Status(static_cast<StatusCode>(code), std::move(message));
  return Status::Ok();
}

namespace {

void EncodeLayout(WireWriter* w, const KvLayout& l) {
  w->U32(l.num_layers);
  w->U32(l.num_planes);
  w->U32(l.num_kv_heads);
  w->U32(l.head_dim);
  w->U32(l.tokens_per_block);
  w->U8(static_cast<uint8_t>(l.dtype));
  w->U8(static_cast<uint8_t>(l.g1_arrangement));
}

Status DecodeLayout(WireReader* r, KvLayout* l) {
  uint8_t dtype = 0, arrangement = 0;
  KVTIER_RETURN_IF_ERROR(r->U32("layout.num_layers", &l->num_layers));
  KVTIER_RETURN_IF_ERROR(r->U32("layout.num_planes", &l->num_planes));
  KVTIER_RETURN_IF_ERROR(r->U32("layout.num_kv_heads", &l->num_kv_heads));
  KVTIER_RETURN_IF_ERROR(r->U32("layout.head_dim", &l->head_dim));
  KVTIER_RETURN_IF_ERROR(r->U32("layout.tokens_per_block", &l->tokens_per_block));
  KVTIER_RETURN_IF_ERROR(r->U8("layout.dtype", &dtype));
  KVTIER_RETURN_IF_ERROR(r->U8("layout.g1_arrangement", &arrangement));
  if (dtype > static_cast<uint8_t>(DType::kFp8) ||
      arrangement > static_cast<uint8_t>(G1Arrangement::kBlockContiguous)) {
    return Status::InvalidArgument("service protocol: layout dtype " + std::to_string(dtype) +
                                   " / arrangement " + std::to_string(arrangement) +
                                   " names none this build knows");
  }
  l->dtype = static_cast<DType>(dtype);
  l->g1_arrangement = static_cast<G1Arrangement>(arrangement);
  Status valid = l->Validate();
  if (!valid.ok()) return Status::InvalidArgument("service protocol: " + valid.message());
  return Status::Ok();
}

Status DecodeTokens(WireReader* r, const char* field, std::vector<TokenId>* out) {
  static_assert(std::is_same_v<TokenId, uint32_t>);
  return r->U32Array(field, kMaxPromptTokens, out);
}

void EncodeTokens(WireWriter* w, std::span<const TokenId> tokens) {
  static_assert(sizeof(TokenId) == sizeof(uint32_t));
  w->U32Array(
      std::span<const uint32_t>(reinterpret_cast<const uint32_t*>(tokens.data()), tokens.size()));
}

void EncodeStrings(WireWriter* w, const std::vector<std::string>& v) {
  w->U32(static_cast<uint32_t>(v.size()));
  for (const std::string& s : v) w->String(s);
}

Status DecodeStrings(WireReader* r, const char* field, uint32_t max_count,
                     std::vector<std::string>* out) {
  uint32_t n = 0;
  KVTIER_RETURN_IF_ERROR(r->Count(field, max_count, 4, &n));
  out->resize(n);
  for (uint32_t i = 0; i < n; ++i)
    KVTIER_RETURN_IF_ERROR(r->String(field, kMaxIdBytes, &(*out)[i]));
  return Status::Ok();
}

// The Stats reply: every field of ManagerStats in the table's order (manager_stats_fields.h),
// a u64 as 8 bytes, a flag as 1, an array element by element.
template <typename S, typename U64, typename Bool>
void ForEachStat(S& s, U64 u64, Bool boolean) {
  ForEachStatField(
      [&](const StatField&, auto& v) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(v)>, bool>) {
          boolean(v);
        } else if constexpr (std::is_same_v<std::remove_cvref_t<decltype(v)>, uint64_t>) {
          u64(v);
        } else {
          for (auto& e : v) u64(e);
        }
      },
      s);
}

constexpr size_t StatsReplyBytes() {
  size_t n = 0;
  for (const StatField& f : kManagerStatsFields) {
    switch (f.shape) {
      case StatShape::kU64:
        n += 8;
        break;
      case StatShape::kFlag:
        n += 1;
        break;
      case StatShape::kPerTier:
        n += 8 * kNumTiers;
        break;
      case StatShape::kPerPath:
        n += 8 * kNumTransferPaths;
        break;
    }
  }
  return n;
}

}  // namespace

void EncodeHello(WireWriter* w, const Hello& m) {
  w->U8(static_cast<uint8_t>(m.role));
  w->String(m.instance_name);
  w->String(m.model_id);
  if (m.role != Role::kLookup) EncodeLayout(w, m.layout);
  w->U32(m.pid);
}

Status DecodeHello(WireReader* r, Hello* m) {
  uint8_t role = 0;
  KVTIER_RETURN_IF_ERROR(r->U8("hello.role", &role));
  if (role > static_cast<uint8_t>(Role::kEvents)) {
    return Status::InvalidArgument("service protocol: hello.role " + std::to_string(role) +
                                   " is none of call (0), data (1), lookup (2) and events (3)");
  }
  m->role = static_cast<Role>(role);
  KVTIER_RETURN_IF_ERROR(r->String("hello.instance_name", kMaxNameBytes, &m->instance_name));
  KVTIER_RETURN_IF_ERROR(r->String("hello.model_id", kMaxModelIdBytes, &m->model_id));
  if (m->role != Role::kLookup) KVTIER_RETURN_IF_ERROR(DecodeLayout(r, &m->layout));
  KVTIER_RETURN_IF_ERROR(r->U32("hello.pid", &m->pid));
  return r->Done();
}

void EncodeHelloReply(WireWriter* w, const HelloReply& m) {
  w->U32(m.instance);
  w->U64(m.epoch);
  w->U32(m.lease_ms);
  w->U64(m.g2_capacity_bytes);
  w->U64(m.g2_slot_bytes);
}

Status DecodeHelloReply(WireReader* r, HelloReply* m) {
  KVTIER_RETURN_IF_ERROR(r->U32("hello.instance", &m->instance));
  KVTIER_RETURN_IF_ERROR(r->U64("hello.epoch", &m->epoch));
  KVTIER_RETURN_IF_ERROR(r->U32("hello.lease_ms", &m->lease_ms));
  KVTIER_RETURN_IF_ERROR(r->U64("hello.g2_capacity_bytes", &m->g2_capacity_bytes));
  KVTIER_RETURN_IF_ERROR(r->U64("hello.g2_slot_bytes", &m->g2_slot_bytes));
  return r->Done();
}

void EncodeLookup(WireWriter* w, const RequestSpec& spec, uint32_t num_computed_tokens) {
  w->String(spec.request_id);
  EncodeTokens(w, spec.prompt);
  w->String(spec.cache_salt);
  w->String(spec.adapter_id);
  EncodeStrings(w, spec.block_extra);
  w->U8(spec.load_tiers);
  w->U8(spec.store_tiers);
  w->U32(num_computed_tokens);
}

Status DecodeLookup(WireReader* r, LookupCall* m) {
  KVTIER_RETURN_IF_ERROR(r->String("lookup.request_id", kMaxIdBytes, &m->request_id));
  KVTIER_RETURN_IF_ERROR(DecodeTokens(r, "lookup.prompt", &m->prompt));
  KVTIER_RETURN_IF_ERROR(r->String("lookup.cache_salt", kMaxIdBytes, &m->cache_salt));
  KVTIER_RETURN_IF_ERROR(r->String("lookup.adapter_id", kMaxIdBytes, &m->adapter_id));
  KVTIER_RETURN_IF_ERROR(DecodeStrings(r, "lookup.block_extra", kMaxBlockIds, &m->block_extra));
  KVTIER_RETURN_IF_ERROR(r->U8("lookup.load_tiers", &m->load_tiers));
  KVTIER_RETURN_IF_ERROR(r->U8("lookup.store_tiers", &m->store_tiers));
  KVTIER_RETURN_IF_ERROR(r->U32("lookup.num_computed_tokens", &m->num_computed_tokens));
  return r->Done();
}

void EncodeLookupResult(WireWriter* w, const LookupResult& m) {
  w->U32(m.num_tokens);
  for (uint32_t b : m.blocks_by_tier) w->U32(b);
}

Status DecodeLookupResult(WireReader* r, LookupResult* m) {
  KVTIER_RETURN_IF_ERROR(r->U32("lookup.num_tokens", &m->num_tokens));
  for (uint32_t& b : m->blocks_by_tier) KVTIER_RETURN_IF_ERROR(r->U32("lookup.blocks_by_tier", &b));
  return r->Done();
}

void EncodePrepareLoad(WireWriter* w, const PrepareLoadCall& m) {
  w->String(m.request_id);
  w->U32Array(m.g1_block_ids);
  w->U32(m.num_external_tokens);
  w->U8(m.async_load ? 1 : 0);
}

Status DecodePrepareLoad(WireReader* r, PrepareLoadCall* m) {
  uint8_t async = 0;
  KVTIER_RETURN_IF_ERROR(r->String("prepare_load.request_id", kMaxIdBytes, &m->request_id));
  KVTIER_RETURN_IF_ERROR(r->U32Array("prepare_load.g1_block_ids", kMaxBlockIds, &m->g1_block_ids));
  KVTIER_RETURN_IF_ERROR(r->U32("prepare_load.num_external_tokens", &m->num_external_tokens));
  KVTIER_RETURN_IF_ERROR(r->U8("prepare_load.async_load", &async));
  m->async_load = async != 0;
  return r->Done();
}

void EncodeCommit(WireWriter* w, std::string_view request_id, std::span<const TokenId> tokens,
                  std::span<const uint32_t> g1_block_ids) {
  w->String(request_id);
  EncodeTokens(w, tokens);
  w->U32Array(g1_block_ids);
}

Status DecodeCommit(WireReader* r, CommitCall* m) {
  KVTIER_RETURN_IF_ERROR(r->String("commit.request_id", kMaxIdBytes, &m->request_id));
  KVTIER_RETURN_IF_ERROR(DecodeTokens(r, "commit.tokens", &m->tokens));
  KVTIER_RETURN_IF_ERROR(r->U32Array("commit.g1_block_ids", kMaxBlockIds, &m->g1_block_ids));
  return r->Done();
}

Status DecodeRequestId(WireReader* r, std::string* id) {
  KVTIER_RETURN_IF_ERROR(r->String("request_id", kMaxIdBytes, id));
  return r->Done();
}

void EncodeFinished(WireWriter* w, const FinishedRequests& m) {
  EncodeStrings(w, m.saves_done);
  EncodeStrings(w, m.loads_done);
}

Status DecodeFinished(WireReader* r, FinishedRequests* m) {
  KVTIER_RETURN_IF_ERROR(DecodeStrings(r, "finished.saves_done", kMaxBlockIds, &m->saves_done));
  KVTIER_RETURN_IF_ERROR(DecodeStrings(r, "finished.loads_done", kMaxBlockIds, &m->loads_done));
  return r->Done();
}

void EncodeStats(WireWriter* w, const ManagerStats& m) {
  ManagerStats copy = m;
  ForEachStat(
      copy, [w](uint64_t& v) { w->U64(v); }, [w](bool& b) { w->U8(b ? 1 : 0); });
}

Status DecodeStats(WireReader* r, ManagerStats* m) {
  // A peer of another build may know other fields: refused by size, before any is read.
  constexpr size_t kBytes = StatsReplyBytes();
  if (r->remaining() != kBytes) {
    return Status::InvalidArgument("service protocol: stats reply of " +
                                   std::to_string(r->remaining()) + " bytes, this build's is " +
                                   std::to_string(kBytes) + " (" +
                                   std::to_string(kNumManagerStatsFields) +
                                   " fields): the daemon and this engine are different builds");
  }
  Status s = Status::Ok();
  ForEachStat(
      *m,
      [&](uint64_t& v) {
        if (s.ok()) s = r->U64("stats", &v);
      },
      [&](bool& b) {
        uint8_t v = 0;
        if (s.ok()) s = r->U8("stats", &v);
        b = v != 0;
      });
  KVTIER_RETURN_IF_ERROR(s);
  return r->Done();
}

void EncodeCopy(WireWriter* w, const CopyCall& m) {
  w->U64(m.batch);
  w->U8(m.dir);
  w->I64(m.deadline_ns);
  w->U32(static_cast<uint32_t>(m.copies.size()));
  for (const auto& [block, offset] : m.copies) {
    w->U32(block);
    w->U64(offset);
  }
}

Status DecodeCopy(WireReader* r, CopyCall* m) {
  KVTIER_RETURN_IF_ERROR(r->U64("copy.batch", &m->batch));
  KVTIER_RETURN_IF_ERROR(r->U8("copy.dir", &m->dir));
  if (m->dir > 1) {
    return Status::InvalidArgument("service protocol: copy.dir " + std::to_string(m->dir) +
                                   " is neither save (0) nor load (1)");
  }
  KVTIER_RETURN_IF_ERROR(r->I64("copy.deadline_ns", &m->deadline_ns));
  uint32_t n = 0;
  KVTIER_RETURN_IF_ERROR(r->Count("copy.copies", kMaxCopies, 12, &n));
  m->copies.resize(n);
  for (auto& [block, offset] : m->copies) {
    KVTIER_RETURN_IF_ERROR(r->U32("copy.g1_block", &block));
    KVTIER_RETURN_IF_ERROR(r->U64("copy.offset", &offset));
  }
  return r->Done();
}

void EncodeFetch(WireWriter* w, const FetchCall& m) {
  w->U64(m.batch);
  w->I64(m.deadline_ns);
  w->U32(static_cast<uint32_t>(m.items.size()));
  for (const G4Fetch& f : m.items) {
    w->U32(f.g1_block);
    w->String(f.name);
    w->U64(f.namespace_id);
    w->U64(f.key.hi);
    w->U64(f.key.lo);
    w->U32Array(f.tokens);
  }
}

Status DecodeFetch(WireReader* r, FetchCall* m) {
  KVTIER_RETURN_IF_ERROR(r->U64("fetch.batch", &m->batch));
  KVTIER_RETURN_IF_ERROR(r->I64("fetch.deadline_ns", &m->deadline_ns));
  uint32_t n = 0;
  // Each item: block, name length, namespace, key, token count: at least 32 bytes.
  KVTIER_RETURN_IF_ERROR(r->Count("fetch.items", kMaxCopies, 32, &n));
  // Grown item by item (an item in memory is larger than its 32 bytes on the wire).
  m->items.clear();
  for (uint32_t i = 0; i < n; ++i) {
    G4Fetch f;
    KVTIER_RETURN_IF_ERROR(r->U32("fetch.g1_block", &f.g1_block));
    KVTIER_RETURN_IF_ERROR(r->String("fetch.name", kMaxNameBytes, &f.name));
    KVTIER_RETURN_IF_ERROR(r->U64("fetch.namespace_id", &f.namespace_id));
    KVTIER_RETURN_IF_ERROR(r->U64("fetch.key", &f.key.hi));
    KVTIER_RETURN_IF_ERROR(r->U64("fetch.key", &f.key.lo));
    KVTIER_RETURN_IF_ERROR(r->U32Array("fetch.tokens", kMaxBlockTokens, &f.tokens));
    m->items.push_back(std::move(f));
  }
  return r->Done();
}

void EncodeFetchDone(WireWriter* w, const FetchDone& m) {
  w->U64(m.batch);
  w->U32(static_cast<uint32_t>(m.statuses.size()));
  for (const Status& s : m.statuses) EncodeStatus(w, s);
}

Status DecodeFetchDone(WireReader* r, FetchDone* m) {
  KVTIER_RETURN_IF_ERROR(r->U64("fetch_done.batch", &m->batch));
  uint32_t n = 0;
  KVTIER_RETURN_IF_ERROR(r->Count("fetch_done.statuses", kMaxCopies, 5, &n));
  m->statuses.clear();
  for (uint32_t i = 0; i < n; ++i) {
    Status s;
    KVTIER_RETURN_IF_ERROR(DecodeStatus(r, &s));
    m->statuses.push_back(std::move(s));
  }
  return r->Done();
}

void EncodeG4Config(WireWriter* w, const G4Config& m) {
  w->String(m.endpoints);
  w->U8(m.cluster ? 1 : 0);
  w->String(m.username);
  w->String(m.password);
  w->U32(m.connections);
  w->U64(m.pipeline_bytes);
}

Status DecodeG4Config(WireReader* r, G4Config* m) {
  KVTIER_RETURN_IF_ERROR(r->String("g4_config.endpoints", kMaxIdBytes, &m->endpoints));
  uint8_t cluster = 0;
  KVTIER_RETURN_IF_ERROR(r->U8("g4_config.cluster", &cluster));
  m->cluster = cluster != 0;
  KVTIER_RETURN_IF_ERROR(r->String("g4_config.username", kMaxIdBytes, &m->username));
  KVTIER_RETURN_IF_ERROR(r->String("g4_config.password", kMaxIdBytes, &m->password));
  KVTIER_RETURN_IF_ERROR(r->U32("g4_config.connections", &m->connections));
  if (m->connections < 1 || m->connections > 64) {
    return Status::InvalidArgument("service protocol: g4_config.connections " +
                                   std::to_string(m->connections) + " is outside 1..64");
  }
  KVTIER_RETURN_IF_ERROR(r->U64("g4_config.pipeline_bytes", &m->pipeline_bytes));
  return r->Done();
}

void EncodeEvents(WireWriter* w, uint64_t dropped, std::span<const KvEvent> events) {
  w->U64(dropped);
  w->U32(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) {
    w->U8(static_cast<uint8_t>(e.kind));
    w->U64(e.key.hi);
    w->U64(e.key.lo);
    w->U64(e.parent.hi);
    w->U64(e.parent.lo);
    w->U8(e.tier);
    w->U64(e.time_ns);
    w->U32(e.block_size);
    w->U8(e.parent_is_root ? 1 : 0);
    EncodeTokens(w, e.token_ids);
    w->String(e.lora_name);
    w->String(e.cache_salt);
    w->U8(e.namespace_known ? 1 : 0);
  }
}

uint64_t EventWireBytes(const KvEvent& e) {
  // 60 fixed (see DecodeEvents), the tokens, the two strings' bytes.
  return 60 + uint64_t{4} * e.token_ids.size() + e.lora_name.size() + e.cache_salt.size();
}

size_t EventsInFrame(std::span<const KvEvent> events) {
  uint64_t bytes = 12;  // dropped, count
  size_t n = 0;
  while (n < events.size() && n < kMaxEventsPerFrame) {
    const uint64_t b = EventWireBytes(events[n]);
    if (n > 0 && bytes + b > kMaxPayloadBytes / 2) break;
    bytes += b;
    ++n;
  }
  return n;
}

Status DecodeEvents(WireReader* r, EventsFrame* m) {
  KVTIER_RETURN_IF_ERROR(r->U64("events.dropped", &m->dropped));
  uint32_t n = 0;
  // Each event takes at least 60 bytes on the wire (its fixed fields and three empty lists).
  KVTIER_RETURN_IF_ERROR(r->Count("events.count", kMaxEventsPerFrame, 60, &n));
  m->events.resize(n);
  for (KvEvent& e : m->events) {
    uint8_t kind = 0, tier = 0, root = 0, known = 0;
    KVTIER_RETURN_IF_ERROR(r->U8("event.kind", &kind));
    if (kind > static_cast<uint8_t>(KvEvent::Kind::kRemoved)) {
      return Status::InvalidArgument("service protocol: event.kind " + std::to_string(kind) +
                                     " is neither stored (0) nor removed (1)");
    }
    e.kind = static_cast<KvEvent::Kind>(kind);
    KVTIER_RETURN_IF_ERROR(r->U64("event.key", &e.key.hi));
    KVTIER_RETURN_IF_ERROR(r->U64("event.key", &e.key.lo));
    KVTIER_RETURN_IF_ERROR(r->U64("event.parent", &e.parent.hi));
    KVTIER_RETURN_IF_ERROR(r->U64("event.parent", &e.parent.lo));
    KVTIER_RETURN_IF_ERROR(r->U8("event.tier", &tier));
    if (tier >= kNumTiers) {
      return Status::InvalidArgument("service protocol: event.tier " + std::to_string(tier) +
                                     " names no tier (0 to " + std::to_string(kNumTiers - 1) + ")");
    }
    e.tier = tier;
    KVTIER_RETURN_IF_ERROR(r->U64("event.time_ns", &e.time_ns));
    KVTIER_RETURN_IF_ERROR(r->U32("event.block_size", &e.block_size));
    if (e.block_size > kMaxBlockTokens) {
      return Status::InvalidArgument("service protocol: event.block_size " +
                                     std::to_string(e.block_size) + " is over " +
                                     std::to_string(kMaxBlockTokens));
    }
    KVTIER_RETURN_IF_ERROR(r->U8("event.parent_is_root", &root));
    e.parent_is_root = root != 0;
    KVTIER_RETURN_IF_ERROR(r->U32Array("event.token_ids", kMaxBlockTokens, &e.token_ids));
    if (e.token_ids.size() > e.block_size) {
      return Status::InvalidArgument(
          "service protocol: event.token_ids holds " + std::to_string(e.token_ids.size()) +
          " tokens, more than its block_size " + std::to_string(e.block_size));
    }
    KVTIER_RETURN_IF_ERROR(r->String("event.lora_name", kMaxIdBytes, &e.lora_name));
    KVTIER_RETURN_IF_ERROR(r->String("event.cache_salt", kMaxIdBytes, &e.cache_salt));
    KVTIER_RETURN_IF_ERROR(r->U8("event.namespace_known", &known));
    e.namespace_known = known != 0;
  }
  return r->Done();
}

}  // namespace kvtier::proto

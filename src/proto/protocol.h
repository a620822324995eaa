// The messages of kvtier serve's protocol (docs/service.md): what each frame type carries and
// how it is encoded on top of wire.h's fields. Every decoder checks every length and count
// against the limits below before it allocates, and names the field that was wrong.
//
// Two kinds of connection, both opened by the engine's process:
//   call  one request frame, one kReply frame with the same seq, in turn (a client keeps a pool
//         of these, one per call in flight);
//   data  the daemon sends kCopy frames (copy these blocks between your G1 and G2 before the
//         deadline); the engine answers kCopyLayer (layer l of the batch landed) and kCopyDone.
//         With a Redis G4, the daemon first offers the store (kG4Config); an engine that can
//         fetch from it answers kG4Ready Ok, and G4 loads into its G1 then come as kFetch
//         frames (get these objects straight into these G1 blocks, verified), answered by one
//         kFetchDone with every block's status.
// The first frame on either is kHello; its reply carries the instance number and, on a data
// connection, the G2 memfd (SCM_RIGHTS) and the geometry to map it with.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/g4_fetch.h"
#include "kvtier/connector.h"
#include "kvtier/events.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"
#include "proto/wire.h"

namespace kvtier::proto {

enum class MsgType : uint16_t {
  kHello = 1,
  kReply = 2,  // every answer on a call connection: status code + message, then the payload
  kLookup = 10,
  kPrepareLoad = 11,
  kCommit = 12,
  kRequestFinished = 13,
  kRegisterG1 = 14,
  kStartLoad = 15,
  kStartSave = 16,
  kWaitLayer = 17,
  kLoadedTokens = 18,
  kWaitForSaves = 19,
  kWaitForRequestSaves = 20,
  kFinished = 21,
  kStats = 22,
  kCopy = 40,       // daemon -> engine, data connection
  kCopyLayer = 41,  // engine -> daemon
  kCopyDone = 42,   // engine -> daemon
  kFetch = 43,      // daemon -> engine, data connection: get these G4 objects into G1
  kFetchDone = 44,  // engine -> daemon: each fetched block's status
  kG4Config = 45,   // daemon -> engine, data connection: the G4 store to fetch from
  kG4Ready = 46,    // engine -> daemon: whether it fetches (Ok) or not (why)
  kEvents = 50,     // daemon -> engine, events connection
};
// "Lookup", "Copy", ...; "unknown" for a value that names no type.
const char* MsgTypeName(uint16_t type);

// Limits every decoder enforces (a frame is at most kMaxPayloadBytes in all).
inline constexpr uint32_t kMaxNameBytes = 256;  // instance name
// A model id carries the model's path, its weights fingerprint, layout tag and parallel rank
// (a hybrid model's groups as a hash): a long local path alone can pass 256 bytes.
inline constexpr uint32_t kMaxModelIdBytes = 4096;
inline constexpr uint32_t kMaxIdBytes = 4096;           // request id, salt, adapter, extra entry
inline constexpr uint32_t kMaxPromptTokens = 4u << 20;  // 4 Mi tokens
inline constexpr uint32_t kMaxBlockIds = 1u << 20;
inline constexpr uint32_t kMaxMessageBytes = 64u << 10;  // an error's text
inline constexpr uint32_t kMaxCopies = 1u << 20;
inline constexpr uint32_t kMaxEventsPerFrame = 1u << 16;
inline constexpr uint32_t kMaxBlockTokens = 1u << 20;  // an event's block_size and token_ids
// G1 block ids an attached engine may use: the daemon keeps the instance in the top 8 bits.
inline constexpr uint32_t kInstanceShift = 24;
inline constexpr uint32_t kMaxInstances = 255;
inline constexpr uint32_t kMaxG1Blocks = 1u << kInstanceShift;

// kLookup: an engine's scheduler process (no G1), joining an attached instance by name to ask
// Lookup only (include/kvtier/service_lookup.h); its Hello carries no layout.
// kEvents: the pool's KV events (BlockManager::SubscribeEvents), pushed by the daemon as kEvents
// frames; the connection joins no instance (it never holds one up) and carries nothing back.
enum class Role : uint8_t { kCall = 0, kData = 1, kLookup = 2, kEvents = 3 };

struct Hello {
  Role role = Role::kCall;
  std::string instance_name;  // engine processes that give the same name share an instance
  std::string model_id;
  KvLayout layout;
  uint32_t pid = 0;
};
struct HelloReply {
  uint32_t instance = 0;
  uint64_t epoch = 0;  // random per daemon start: a client that sees another re-attached
  uint32_t lease_ms = 0;
  // Data connections: the G2 arena to map (the memfd travels with the frame).
  uint64_t g2_capacity_bytes = 0;
  uint64_t g2_slot_bytes = 0;
};

// A reply's leading status, then call-specific fields.
void EncodeStatus(WireWriter* w, const Status& status);
Status DecodeStatus(WireReader* r, Status* out);

void EncodeHello(WireWriter* w, const Hello& m);
Status DecodeHello(WireReader* r, Hello* m);
void EncodeHelloReply(WireWriter* w, const HelloReply& m);
Status DecodeHelloReply(WireReader* r, HelloReply* m);

// Lookup: the RequestSpec (prompt included) and num_computed_tokens.
struct LookupCall {
  std::string request_id;
  std::vector<TokenId> prompt;
  std::string cache_salt;
  std::string adapter_id;
  std::vector<std::string> block_extra;
  uint8_t load_tiers = kAllTiers;
  uint8_t store_tiers = kAllTiers;
  uint32_t num_computed_tokens = 0;
};
void EncodeLookup(WireWriter* w, const RequestSpec& spec, uint32_t num_computed_tokens);
Status DecodeLookup(WireReader* r, LookupCall* m);
void EncodeLookupResult(WireWriter* w, const LookupResult& m);
Status DecodeLookupResult(WireReader* r, LookupResult* m);

struct PrepareLoadCall {
  std::string request_id;
  std::vector<uint32_t> g1_block_ids;
  uint32_t num_external_tokens = 0;
  bool async_load = false;
};
void EncodePrepareLoad(WireWriter* w, const PrepareLoadCall& m);
Status DecodePrepareLoad(WireReader* r, PrepareLoadCall* m);

struct CommitCall {
  std::string request_id;
  std::vector<TokenId> tokens;
  std::vector<uint32_t> g1_block_ids;
};
void EncodeCommit(WireWriter* w, std::string_view request_id, std::span<const TokenId> tokens,
                  std::span<const uint32_t> g1_block_ids);
Status DecodeCommit(WireReader* r, CommitCall* m);

// Calls whose payload is one request id, one u32, or nothing: written and read in place.
Status DecodeRequestId(WireReader* r, std::string* id);

void EncodeFinished(WireWriter* w, const FinishedRequests& m);
Status DecodeFinished(WireReader* r, FinishedRequests* m);

void EncodeStats(WireWriter* w, const ManagerStats& m);
Status DecodeStats(WireReader* r, ManagerStats* m);

// kCopy: copy these blocks before `deadline_ns` (steady clock, which both processes on one
// host share). dir 0: G1 -> G2 (a save), 1: G2 -> G1 (a load). `offset` is the slot payload's
// byte offset in the G2 mapping.
struct CopyCall {
  uint64_t batch = 0;
  uint8_t dir = 0;
  int64_t deadline_ns = 0;
  std::vector<std::pair<uint32_t, uint64_t>> copies;  // (g1 block, G2 offset)
};
void EncodeCopy(WireWriter* w, const CopyCall& m);
Status DecodeCopy(WireReader* r, CopyCall* m);
// kFetch: get each object straight into its G1 block before `deadline_ns` (as kCopy's) and
// verify it (block_format.h) against the fields given; answered by one kFetchDone.
struct FetchCall {
  uint64_t batch = 0;
  int64_t deadline_ns = 0;
  std::vector<G4Fetch> items;
};
void EncodeFetch(WireWriter* w, const FetchCall& m);
Status DecodeFetch(WireReader* r, FetchCall* m);
// kFetchDone: statuses[i] is item i's (Ok: it landed in G1 and verified).
struct FetchDone {
  uint64_t batch = 0;
  std::vector<Status> statuses;
};
void EncodeFetchDone(WireWriter* w, const FetchDone& m);
Status DecodeFetchDone(WireReader* r, FetchDone* m);
// kG4Config: the daemon's Redis G4 (g4.* settings), for the engine's own client. The peer is
// authenticated (docs/service.md), so the password travels in it.
struct G4Config {
  std::string endpoints;  // g4.endpoints
  bool cluster = false;
  std::string username;
  std::string password;
  uint32_t connections = 1;     // per node, and the engine's fetch threads
  uint64_t pipeline_bytes = 0;  // g4.redis_pipeline_kib in bytes
};
void EncodeG4Config(WireWriter* w, const G4Config& m);
Status DecodeG4Config(WireReader* r, G4Config* m);

// kEvents: the pool's events in the order they were made. `dropped`: events this connection lost
// since its previous frame (its queue was full: a subscriber that does not keep up).
struct EventsFrame {
  uint64_t dropped = 0;
  std::vector<KvEvent> events;
};
void EncodeEvents(WireWriter* w, uint64_t dropped, std::span<const KvEvent> events);
Status DecodeEvents(WireReader* r, EventsFrame* m);
// Bytes `e` takes in an EncodeEvents frame.
uint64_t EventWireBytes(const KvEvent& e);
// How many of `events` (from the first) go in one kEvents frame: at most kMaxEventsPerFrame,
// and no more than kMaxPayloadBytes / 2 of them on the wire (a count alone does not bound a
// frame: one event of a 4096-token block is ~16 KiB, and a G3 recovery hands over every block
// it found at once). At least 1 for a non-empty span.
size_t EventsInFrame(std::span<const KvEvent> events);

struct CopyReport {
  uint64_t batch = 0;
  uint32_t layer = 0;  // kCopyLayer
  Status status;       // kCopyDone
};

}  // namespace kvtier::proto

// BlockManager: kvtier as an inference engine sees it. The connector API mirrors vLLM's KV
// connector (v1); docs/connector.md maps each method to vLLM's, one by one.
//
// A request's life:
//   scheduler  Lookup ──> (engine allocates G1 blocks) ──> PrepareLoad
//   worker     StartLoad ──> WaitLayer(0), WaitLayer(1), ... (compute layer l once it returns)
//   scheduler  Commit (after each step that completed full blocks)
//   worker     StartSave
//   scheduler  RequestFinished ──> true: keep the G1 blocks until Finished() lists the request
//
// Device G1 (a GPU engine): the engine's kernels that write and read the KV run asynchronously
// on its CUDA stream, while kvtier copies on streams of its own. StartSave(engine_stream) and
// StartLoad(engine_stream) order kvtier's G1 accesses after the work the engine queued so far;
// reading what a load wrote needs no stream, because WaitLayer and Finished() report a load only
// once the device finished writing it. A host G1 uses StartSave() and StartLoad().
//
// Threads: scheduler-side and worker-side methods may run on different threads; each method is
// thread-safe. Nothing here waits on I/O except WaitLayer, LoadedTokens, WaitForSaves and
// WaitForRequestSaves, which exist to wait.
//
// Request entries: Lookup creates one per request id; RequestFinished forgets it once nothing
// of the request is in flight. An entry the engine never finishes (a Lookup that arrived after
// the request's end) is dropped after manager.idle_request_ttl_ms without a call for it
// (ManagerStats::expired_requests), so entries never pile up.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/config.h"
#include "kvtier/events.h"
#include "kvtier/g1_memory.h"
#include "kvtier/layout.h"
#include "kvtier/manager_stats.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"

namespace kvtier {

// A G1 block id that names no block: the engine does not hold the request's block at that
// index (a hybrid model's sliding-window group frees the blocks that left its window, and vLLM
// shows them as its null block). Commit neither saves nor reuses such a block (the blocks after
// it still are); a load stops at the first one (the engine computes the rest).
inline constexpr uint32_t kNoG1Block = 0xFFFFFFFFu;

struct ManagerOptions {
  KvLayout layout;       // the engine's KV layout (G1 arrangement included)
  std::string model_id;  // part of every key's namespace
  Config config;         // capacities, directories, policies (see `kvtier config`)
  // Called during Create while G3 recovery scans slot headers (no clean-shutdown snapshot):
  // (slots scanned, slots in all). Null: not called. For a tool's progress display.
  std::function<void(uint64_t scanned, uint64_t total)> g3_recovery_progress;
};

// What a request is, for keying: the same tokens under another salt or adapter are other blocks.
struct RequestSpec {
  std::string request_id;
  std::span<const TokenId> prompt;  // copied by Lookup
  std::string cache_salt;           // tenant isolation; empty = shared
  std::string adapter_id;           // LoRA adapter; empty = base model
  // Whatever else block i's KV depends on besides its tokens and everything before it (the
  // hashes of the multimodal inputs or prompt embeddings in the block's range, say): mixed into
  // block i's key, so the same tokens with another image or other embeddings are other blocks.
  // Blocks past the end (generated tokens, plain text) have none. Copied by Lookup; Commit keys
  // the request's later blocks with the same list.
  std::vector<std::string> block_extra;
  // The tiers (bits 1 << kTierG2 .. kTierG4) this request may load from: Lookup offers only
  // blocks held there. And those its blocks may be stored in: without G2 nothing of it is saved
  // (G2 is the way to the tiers below); without G3 its blocks are never demoted to G3; without
  // G4 they are not written to G4. Blocks that other requests store are not affected.
  uint8_t load_tiers = kAllTiers;
  uint8_t store_tiers = kAllTiers;
};

struct LookupResult {
  // Prompt tokens after `num_computed_tokens` that kvtier can load (a multiple of the block
  // size; never the whole prompt: the last token is always left to compute).
  uint32_t num_tokens = 0;
  // Of those tokens' blocks, how many each tier would supply.
  std::array<uint32_t, kNumTiers> blocks_by_tier{};
};

struct FinishedRequests {
  // Requests that RequestFinished() kept (it returned true) whose saves are now done: the
  // engine may free their G1 blocks.
  std::vector<std::string> saves_done;
  // Requests whose loads ended since the last call (successfully or not), finished ones
  // included: an engine that finished a request with a load in flight frees the G1 blocks the
  // load was writing once it is listed here.
  std::vector<std::string> loads_done;
};

// An interface with two implementations, chosen by Create: embedded (src/manager) and attached
// (src/client). Engines, tools and the Python package hold a BlockManager and see nothing else.
class BlockManager {
 public:
  // With service.socket set (a file, KVTIER_SERVICE_SOCKET or Set): attached mode. The manager
  // is kvtier serve, the per-host daemon on that socket (docs/service.md); this process only
  // copies between its G1 and its mapping of the daemon's G2. Every call below keeps its
  // contract, and a daemon that is absent, dies or does not answer makes the calls answer as
  // an empty cache would (Lookup 0 tokens, loads none, Commit Ok), never an error or a hang;
  // the manager attaches again by itself. Stats() and the events SubscribeEvents hears are the
  // daemon pool's (every attached engine's blocks), on a thread of the manager's. A daemon
  // that refuses the engine (a uid it does not allow, no G2 room for the model:
  // service.max_pools) fails Create with its reason.
  // Otherwise (the default), embedded:
  // Builds the tiers from options.config: the G2 arena (pre-faulted), G3 in g3.dir when
  // g3.enabled (its blocks recovered from a previous run), the index and the transfer engine.
  // InvalidArgument for a bad layout or config; the tiers' errors otherwise. A G3 that cannot
  // open (g3.dir a file, read-only, too small for g3.capacity_bytes, locked by another process,
  // not creatable) fails Create with the tier's status code and a message naming the directory,
  // the reason and what to do, when g3.dir was set explicitly (Config::IsSet: a file, KVTIER_*
  // or Set); with the default g3.dir it is left out with one warning saying so, and kvtier runs
  // on G2 alone. g3.enabled = false never opens G3.
  static Result<std::unique_ptr<BlockManager>> Create(const ManagerOptions& options);
  // Finishes transfers in flight, then closes the tiers (G3 writes its restart snapshot). With
  // G4, the saves and demotions in flight end first, with their G4 writes: a block committed
  // before the destructor reaches G4 unless its write fails or times out.
  virtual ~BlockManager() = default;
  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  // ---- scheduler side ----

  // vLLM get_num_new_matched_tokens. How many prompt tokens past `num_computed_tokens` (what
  // the engine's own G1 prefix cache supplies; a multiple of the block size) kvtier can load.
  // The run counts from the block at `num_computed_tokens`: kvtier need not hold the blocks
  // before it (the engine does; a hybrid model's state group holds only some boundaries).
  // No I/O, no pins: may be asked again for a request that cannot be scheduled yet.
  // InvalidArgument for an empty request id or a misaligned num_computed_tokens.
  virtual Result<LookupResult> Lookup(const RequestSpec& request, uint32_t num_computed_tokens) = 0;

  // vLLM update_state_after_alloc. The engine allocated G1 blocks for the request:
  // `g1_block_ids[i]` holds the request's i-th block. Binds the next `num_external_tokens`
  // (from the last Lookup) to their G1 blocks and pins their sources. Returns the tokens that
  // will actually load, which may be fewer than asked when blocks left kvtier since the Lookup
  // or no G2 slot was free to stage a G3 block; the engine computes the rest.
  // `async_load` (vLLM's load_kv_async): for an engine that polls Finished().loads_done before
  // it uses the blocks. StartLoad submits it apart from the synchronous loads, WaitLayer never
  // waits for it, and LoadedTokens(request_id) still waits for it.
  // A kNoG1Block id in the load's range ends the load at that block.
  // NotFound for a request without a Lookup; InvalidArgument for too few G1 block ids.
  virtual Result<uint32_t> PrepareLoad(const std::string& request_id,
                                       std::span<const uint32_t> g1_block_ids,
                                       uint32_t num_external_tokens, bool async_load = false) = 0;

  // The engine finished computing more of the request: `tokens` is everything so far (prompt
  // and generated), `g1_block_ids` its block table. Full blocks not committed before are keyed;
  // those G2 already holds count as reuse (dedup_blocks; a copy in G3 alone is no reason to
  // skip: the engine computed the block because that copy could not serve it, and the fresh
  // one goes to G2, found first), the others are queued to save to G2 (StartSave
  // starts them). Never waits on I/O. A save that finds no free G2 slot while G2's victims are
  // being written to G3 waits for one (deferred: the engine keeps the G1 block meanwhile, as
  // for any save, up to transfer.max_queued_saves of them); with no slot free nor freeing it is
  // dropped and counted.
  // Blocks whose G1 id is kNoG1Block are skipped (neither saved nor counted as reuse).
  // NotFound for a request without a Lookup.
  virtual Status Commit(const std::string& request_id, std::span<const TokenId> tokens,
                        std::span<const uint32_t> g1_block_ids) = 0;

  // vLLM request_finished. True when saves still read the request's G1 blocks: the engine must
  // keep them until Finished() lists the request in saves_done. False: no save reads them.
  // The return value is about saves only: a load still in flight (the engine aborted a request
  // it was loading) keeps its pins and keeps writing into its G1 blocks until it ends, and
  // Finished().loads_done lists the request then; the engine frees those blocks only after
  // that. Forgets the request once nothing of it is in flight; after a load, LoadedTokens
  // still answers until the Finished() call after the one that listed it. Unknown ids: false.
  virtual bool RequestFinished(const std::string& request_id) = 0;

  // ---- worker side ----

  // vLLM register_kv_caches. Where G1 lives. REQUIRES: before any load or save; the layout
  // must be the one given at Create. Unavailable for GPU memory without a CUDA backend.
  virtual Status RegisterDeviceMemory(const G1Memory& g1) = 0;

  // vLLM start_load_kv. Starts every load that PrepareLoad bound since the last call (by any
  // thread) at load priority: the synchronous ones as one batch, the asynchronous ones as
  // another. Returns at once.
  virtual Status StartLoad() = 0;
  // StartLoad for a device G1 that the engine's work on a CUDA stream uses: the loads started
  // by this call and by later calls write G1 only after the work queued on `engine_stream`
  // before this call has finished (vLLM zeroes new blocks and copies blocks on its stream just
  // before it starts loads into them; a block freed by a preemption may still be in use by the
  // previous step's kernels). `engine_stream` is a cudaStream_t of G1's device as an integer:
  // PyTorch's torch.cuda.current_stream().cuda_stream, where 0 is the legacy default stream.
  // Never waits on the host (kvtier's load stream waits on the device), but the loads start no
  // earlier than that queued work ends: an engine that launched a whole forward pass before
  // this call delays the loads by that pass.
  // Reading the loaded KV needs no stream: WaitLayer(l) returns only after the device finished
  // writing layer l of every synchronous load (kvtier's completion thread waited for the
  // layer's CUDA event), so a kernel the engine launches after WaitLayer returns, on any
  // stream, starts after those writes and sees them; an asynchronous load's blocks likewise
  // once Finished() lists it in loads_done. A device-side wait on the engine's stream would add
  // a CUDA call per layer and order nothing more.
  // Errors (the loads are started all the same, and fail when the ordering failed: the engine
  // recomputes them, as for any failed load; device loads keep failing until an ordering
  // succeeds): FailedPrecondition before RegisterDeviceMemory, or while `engine_stream` is
  // capturing a CUDA graph; InvalidArgument for a host G1 (use StartLoad()); IOError naming the
  // CUDA error for a stream the device refuses.
  // REQUIRES: `engine_stream` is a live stream (or 0); a dangling handle is undefined behaviour
  // in CUDA itself.
  virtual Status StartLoad(uintptr_t engine_stream) = 0;

  // vLLM wait_for_layer_load. Blocks until layer `layer` of every synchronous load started so
  // far has landed in G1; asynchronous loads (PrepareLoad's async_load) are never waited for.
  // Ok, or the first failure: then LoadedTokens() says how much of each request arrived
  // intact, and the engine computes the rest. InvalidArgument for a layer past the layout's.
  virtual Status WaitLayer(uint32_t layer) = 0;

  // Waits for the request's loads to end, then returns how many tokens past its
  // num_computed_tokens arrived intact (a prefix of what PrepareLoad promised; 0 when none
  // were planned or the request is unknown).
  virtual uint32_t LoadedTokens(const std::string& request_id) = 0;

  // vLLM save_kv_layer / wait_for_save. Starts the saves that Commit queued, and deferred
  // saves whose G2 slot has freed since. Returns at once. For a host G1, or a device G1 whose
  // engine has finished (synchronized) the work that wrote the committed blocks.
  virtual Status StartSave() = 0;
  // StartSave for a device G1 that the engine's kernels write on a CUDA stream (vLLM launches
  // the forward pass asynchronously, then calls wait_for_save): the saves started by this call,
  // and every save started after it (deferred saves that Finished() or WaitForSaves() retry
  // included), read G1 only after the work queued on `engine_stream` before this call has
  // finished. `engine_stream` as for StartLoad(engine_stream): torch.cuda.current_stream()
  // .cuda_stream, 0 being the legacy default stream. Never waits on the host: kvtier's save
  // stream waits on the device (one CUDA event recorded on the engine's stream per call; no
  // allocation). The engine may reuse a saved block's G1 memory once the save ended
  // (Finished().saves_done, WaitForRequestSaves), which the host observes, so nothing orders
  // the other way.
  // REQUIRES: called after the Commit of blocks that the engine's queued work writes and before
  // anything else starts saves (Finished() and WaitForSaves() start committed saves too when
  // deferred saves wait); vLLM's connector commits and calls it back to back in wait_for_save.
  // Errors as StartLoad(engine_stream), with "saves" for "loads": the saves are started all the
  // same and, when the ordering failed, fail (dropped and counted, never read out of order);
  // device saves keep failing until an ordering of saves succeeds.
  virtual Status StartSave(uintptr_t engine_stream) = 0;
  // Blocks until every save (deferred ones included) and every demotion to G3 started so far
  // has ended (for tests, benchmarks and shutdown).
  virtual void WaitForSaves() = 0;
  // The engine is about to free or reuse this request's G1 blocks (vLLM preemption): drops the
  // request's saves that have not started (deferred, or queued for StartSave; counted as
  // dropped_saves) and blocks until none of its saves still reads G1 (a save batch holding
  // some of them ends). Other requests' saves, demotions and G4 writes are not waited for.
  // Returns at once for an unknown request or one without saves.
  virtual void WaitForRequestSaves(const std::string& request_id) = 0;

  // vLLM get_finished. Also starts deferred saves whose G2 slot has freed (an engine polls
  // this each step, so deferred saves progress without another call).
  virtual FinishedRequests Finished() = 0;

  // ---- observability ----
  // The counters and gauges (kvtier/manager_stats.h; each field's meaning is in its row of
  // manager_stats_fields.h).
  virtual ManagerStats Stats() = 0;
  // Registers a callback for every store/removal event in every tier. Attached: the daemon's
  // events for this model's pool, from the moment its events connection opens (the first
  // subscriber of a pool also hears the blocks G3 recovered at the daemon's start).
  virtual void SubscribeEvents(KvEventCallback callback) = 0;
  virtual const KvLayout& layout() const = 0;
  // True in attached mode.
  virtual bool attached() const = 0;

 protected:
  // Only the two implementations (embedded: src/manager; attached: src/client) derive from it.
  BlockManager() = default;
};

}  // namespace kvtier

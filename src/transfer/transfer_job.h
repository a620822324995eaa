// TransferJob: one submitted batch of block moves and its completion state.
//
// Every move ends exactly once, with a Status (MoveDone). Moves whose destination is G1 also
// report each layer as it lands (LayerLanded, once per layer, in any order), so an engine can
// start computing layer 0 while later layers are still arriving. A move that fails marks its
// remaining layers as landed-with-error, so no waiter can hang on it.
//
// Thread-safe. Backends call LayerLanded/MoveDone from their threads; engine threads wait.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/mutex.h"
#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

enum class TransferPriority : uint8_t {
  kLoad = 0,  // an engine waits on it: runs first, never dropped
  kSave = 1,  // offload: runs when no load waits; dropped when its queue is full
};

struct BlockTransfer {
  enum class Op : uint8_t {
    kG1ToG2,  // gather G1 block `g1_block` into the payload of G2 slot `g2_slot`
    kG2ToG1,  // scatter the payload of G2 slot `g2_slot` into G1 block `g1_block`, layer by layer
    kG2ToG3,  // write G2 slot `g2_slot` (header area + payload) to G3 as `key`
    kG3ToG2,  // read `key` from G3 into G2 slot `g2_slot`, verified
    kG3ToG1,  // kG3ToG2, then kG2ToG1 through the same G2 slot (staging)
    kG2ToG4,  // encode the header into G2 slot `g2_slot`'s header area, put the slot to G4
    kG4ToG2,  // get `key` from G4 into G2 slot `g2_slot`, verified (a mismatch: Corruption)
    kG4ToG1,  // kG4ToG2, then kG2ToG1 through the same G2 slot (staging)
  };
  Op op = Op::kG2ToG1;
  BlockKey key;
  BlockKey parent;
  uint64_t namespace_id = 0;
  // G3/G4 moves: the block's tokens (written into the header; checked on read). Empty for
  // others.
  std::vector<TokenId> tokens;
  uint32_t g1_block = 0;
  // kG3ToG1 may give kAnyStagingSlot: the transfer engine then stages through one of its
  // registered staging slots (TransferEngine::RegisterStagingSlots), reused as moves finish,
  // so a batch may hold more G3 blocks than there are staging slots.
  static constexpr uint32_t kAnyStagingSlot = UINT32_MAX;
  uint32_t g2_slot = 0;
  // kG2ToG3, kG2ToG4: when nonzero, the payload's PayloadChecksum must equal it, or the move
  // fails with Corruption and nothing is persisted (kvtier serve sets it from the checksum
  // taken at the engine's commit).
  uint64_t expected_checksum = 0;

  bool IntoG1() const { return op == Op::kG2ToG1 || op == Op::kG3ToG1 || op == Op::kG4ToG1; }
  bool Remote() const { return op == Op::kG2ToG4 || op == Op::kG4ToG2 || op == Op::kG4ToG1; }
};

inline constexpr size_t kNumTransferOps = 8;
const char* BlockTransferOpName(BlockTransfer::Op op);

class TransferJob {
 public:
  // Called once per move when it ends, on the thread that ended it. Must be quick and must
  // not wait on this job (it may ask it about the move: SlotLent).
  using MoveCallback =
      std::function<void(const TransferJob& job, size_t index, const Status& status)>;
  // Called once, after every move ended and every MoveCallback returned.
  using DoneCallback = std::function<void(const TransferJob& job)>;

  TransferJob(std::vector<BlockTransfer> moves, uint32_t num_layers, TransferPriority priority,
              MoveCallback on_move = nullptr, DoneCallback on_done = nullptr);
  TransferJob(const TransferJob&) = delete;
  TransferJob& operator=(const TransferJob&) = delete;

  const std::vector<BlockTransfer>& moves() const { return moves_; }
  TransferPriority priority() const { return priority_; }
  uint32_t num_layers() const { return num_layers_; }

  // True once every move ended and the callbacks returned.
  bool Done() const EXCLUDES(mu_);
  // Blocks until every move ended and the callbacks returned. Ok, or the first failure (in the
  // order moves ended).
  Status Wait() const EXCLUDES(mu_);
  // Blocks until layer `layer` of every G1-bound move landed (or its move failed). Ok, or the
  // first failure among those moves. Ok at once for a job without G1-bound moves.
  // InvalidArgument for layer >= num_layers().
  Status WaitLayer(uint32_t layer) const EXCLUDES(mu_);
  // The final status of move `index`; FailedPrecondition while it is still in flight.
  Status MoveStatus(size_t index) const EXCLUDES(mu_);
  // Moves that ended with an error so far.
  size_t failed_moves() const EXCLUDES(mu_);
  // True when move `index` was abandoned at its deadline while its I/O was running (it ended
  // TimedOut): the G2 slot it names is still lent to that I/O. The transfer engine hands a
  // caller's slot back (TransferEngine::RemoteConfig::release_lent_slot) once the call has
  // returned; until then the slot's owner must not reuse it.
  bool SlotLent(size_t index) const EXCLUDES(mu_);

  // ---- for backends ----
  // Layer `layer` of G1-bound move `index` landed. Returns true when that was the move's last
  // layer (the caller then ends the move with MoveDone). Repeats and bad arguments are ignored.
  bool LayerLanded(size_t index, uint32_t layer) EXCLUDES(mu_);
  // LayerLanded for several moves at once (one lock). Appends to `finished` the moves whose
  // last layer this was.
  void LayersLanded(std::span<const uint32_t> moves, uint32_t layer,
                    std::vector<uint32_t>* finished) EXCLUDES(mu_);
  // Move `index` ended. For G1-bound moves, an Ok end REQUIRES all layers landed; an error end
  // lands the remaining layers as failed. Ignores a second end of the same move.
  void MoveDone(size_t index, const Status& status) EXCLUDES(mu_);

  // ---- for backends whose I/O may outlive a deadline (G4 loads) ----
  // Such a move is queued (no I/O began), in I/O (a call that may not return by the deadline
  // writes into the move's G2 slot), landing (the call returned in time: the backend ends the
  // move itself, in bounded time, without waiting on I/O), or abandoned (the deadline passed
  // first: the move ended TimedOut, and the slot stays lent to the call until it returns).
  // The backend is about to start the move's I/O. False when the move was abandoned while
  // queued (it has ended): start nothing.
  bool BeginIo(size_t index) EXCLUDES(mu_);
  // The move's I/O call returned. True: the move is landing, and the backend ends it. False:
  // it was abandoned meanwhile; the backend discards what the call delivered and releases the
  // slot the call used (nothing else will).
  bool FinishIo(size_t index) EXCLUDES(mu_);
  enum class Abandoned : uint8_t {
    kNo,           // ended already, or landing: nothing to do
    kWhileQueued,  // no I/O began: the move's slot is free now
    kInIo,         // a call still writes into the move's slot: FinishIo will say when it returned
  };
  // At the move's deadline: abandons it unless it ended already or is landing. The caller then
  // ends it (MoveDone) with TimedOut; nobody else will.
  Abandoned Abandon(size_t index) EXCLUDES(mu_);

 private:
  const std::vector<BlockTransfer> moves_;
  const uint32_t num_layers_;
  const TransferPriority priority_;
  const MoveCallback on_move_;
  const DoneCallback on_done_;

  mutable Mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<Status> status_ GUARDED_BY(mu_);
  std::vector<uint8_t> ended_ GUARDED_BY(mu_);
  std::vector<uint8_t> landed_ GUARDED_BY(mu_);          // [move * layers + layer]
  std::vector<uint32_t> layers_left_ GUARDED_BY(mu_);    // per move: layers not landed yet
  std::vector<uint32_t> layer_pending_ GUARDED_BY(mu_);  // per layer: G1 moves not landed yet
  std::vector<Status> layer_error_ GUARDED_BY(mu_);      // per layer: first failure
  size_t remaining_ GUARDED_BY(mu_);                     // moves not ended yet
  size_t callbacks_left_ GUARDED_BY(mu_);  // moves whose MoveCallback has not returned yet
  bool finished_ GUARDED_BY(mu_);          // every move ended and the callbacks returned
  size_t failed_ GUARDED_BY(mu_) = 0;
  enum class IoPhase : uint8_t { kQueued, kInIo, kLanding, kAbandoned };
  std::vector<IoPhase> io_phase_ GUARDED_BY(mu_);  // per move; see BeginIo
  std::vector<uint8_t> lent_ GUARDED_BY(mu_);      // per move; see SlotLent
  Status first_error_ GUARDED_BY(mu_);
};

}  // namespace kvtier

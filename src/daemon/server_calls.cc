// kvtier serve's call dispatcher: one decoded request frame, run on the pool's manager.
#include "core/log.h"
#include "daemon/server_state.h"

namespace kvtier::daemon {

// The protocol's names this file uses most.
using proto::EncodeStatus;
using proto::MsgType;

// Decodes and runs one call; writes the reply (status first). A decode error is returned (and
// nothing written); a call's own error is written into the reply and Ok returned.
Status Server::State::HandleCall(uint32_t instance, Pool* pool, const proto::Frame& frame,
                                 proto::WireWriter* out) {
  SharedManager::EngineView engine = pool->manager->ForEngine(instance);
  proto::WireReader r(frame.payload);
  uint32_t g1_limit = proto::kMaxG1Blocks - 1;
  {
    MutexLock lock(&mu);
    auto it = instances.find(instance);
    if (it != instances.end()) g1_limit = it->second->g1_blocks;
  }
  // An engine's G1 ids become the pool's: the instance in the top bits. kNoG1Block (a block the
  // engine does not hold: a sliding-window group's blocks before its window) passes unchanged,
  // so the manager skips it in a commit and stops a load at it; no mapped id equals it
  // (an engine holds fewer than kMaxG1Blocks - 1 blocks, so the id bits are never all ones).
  auto map_blocks = [&](std::vector<uint32_t>* ids) -> Status {
    for (uint32_t& id : *ids) {
      if (id == kNoG1Block) continue;
      if (id >= g1_limit) {
        return Status::InvalidArgument("G1 block id " + std::to_string(id) +
                                       " is past the engine's " + std::to_string(g1_limit) +
                                       " blocks");
      }
      id |= instance << proto::kInstanceShift;
    }
    return Status::Ok();
  };
  switch (static_cast<MsgType>(frame.header.type)) {
    case MsgType::kLookup: {
      proto::LookupCall m;
      KVTIER_RETURN_IF_ERROR(proto::DecodeLookup(&r, &m));
      RequestSpec spec;
      spec.request_id = m.request_id.empty() ? std::string() : Rid(instance, m.request_id);
      spec.prompt = m.prompt;
      spec.cache_salt = m.cache_salt;
      spec.adapter_id = m.adapter_id;
      spec.block_extra = std::move(m.block_extra);
      spec.load_tiers = m.load_tiers;
      spec.store_tiers = m.store_tiers;
      Result<LookupResult> res = engine.Lookup(spec, m.num_computed_tokens);
      EncodeStatus(out, res.status());
      if (res.ok()) proto::EncodeLookupResult(out, *res);
      return Status::Ok();
    }
    case MsgType::kPrepareLoad: {
      proto::PrepareLoadCall m;
      KVTIER_RETURN_IF_ERROR(proto::DecodePrepareLoad(&r, &m));
      Status mapped = map_blocks(&m.g1_block_ids);
      Result<uint32_t> res = mapped.ok()
                                 ? engine.PrepareLoad(Rid(instance, m.request_id), m.g1_block_ids,
                                                      m.num_external_tokens, m.async_load)
                                 : Result<uint32_t>(mapped);
      EncodeStatus(out, res.status());
      if (res.ok()) out->U32(*res);
      return Status::Ok();
    }
    case MsgType::kCommit: {
      proto::CommitCall m;
      KVTIER_RETURN_IF_ERROR(proto::DecodeCommit(&r, &m));
      Status mapped = map_blocks(&m.g1_block_ids);
      EncodeStatus(out, mapped.ok()
                            ? engine.Commit(Rid(instance, m.request_id), m.tokens, m.g1_block_ids)
                            : mapped);
      return Status::Ok();
    }
    case MsgType::kRequestFinished: {
      std::string id;
      KVTIER_RETURN_IF_ERROR(proto::DecodeRequestId(&r, &id));
      const bool kept = engine.RequestFinished(Rid(instance, id));
      EncodeStatus(out, Status::Ok());
      out->U8(kept ? 1 : 0);
      return Status::Ok();
    }
    case MsgType::kRegisterG1: {
      uint32_t blocks = 0;
      KVTIER_RETURN_IF_ERROR(r.U32("register_g1.num_blocks", &blocks));
      KVTIER_RETURN_IF_ERROR(r.Done());
      if (blocks == 0 || blocks >= proto::kMaxG1Blocks) {
        EncodeStatus(out, Status::InvalidArgument("an attached engine's G1 holds 1 to " +
                                                  std::to_string(proto::kMaxG1Blocks - 1) +
                                                  " blocks, not " + std::to_string(blocks)));
        return Status::Ok();
      }
      {
        MutexLock lock(&mu);
        auto it = instances.find(instance);
        if (it != instances.end()) it->second->g1_blocks = blocks;
      }
      EncodeStatus(out, Status::Ok());
      return Status::Ok();
    }
    case MsgType::kStartLoad:
      KVTIER_RETURN_IF_ERROR(r.Done());
      EncodeStatus(out, engine.StartLoad());
      return Status::Ok();
    case MsgType::kStartSave:
      KVTIER_RETURN_IF_ERROR(r.Done());
      EncodeStatus(out, engine.StartSave());
      return Status::Ok();
    case MsgType::kWaitLayer: {
      uint32_t layer = 0;
      KVTIER_RETURN_IF_ERROR(r.U32("wait_layer.layer", &layer));
      KVTIER_RETURN_IF_ERROR(r.Done());
      EncodeStatus(out, engine.WaitLayer(layer));
      return Status::Ok();
    }
    case MsgType::kLoadedTokens: {
      std::string id;
      KVTIER_RETURN_IF_ERROR(proto::DecodeRequestId(&r, &id));
      const uint32_t n = engine.LoadedTokens(Rid(instance, id));
      EncodeStatus(out, Status::Ok());
      out->U32(n);
      return Status::Ok();
    }
    case MsgType::kWaitForSaves:
      KVTIER_RETURN_IF_ERROR(r.Done());
      engine.WaitForSaves();  // its own saves: a stuck engine holds up nobody else
      EncodeStatus(out, Status::Ok());
      return Status::Ok();
    case MsgType::kWaitForRequestSaves: {
      std::string id;
      KVTIER_RETURN_IF_ERROR(proto::DecodeRequestId(&r, &id));
      engine.WaitForRequestSaves(Rid(instance, id));
      EncodeStatus(out, Status::Ok());
      return Status::Ok();
    }
    case MsgType::kFinished: {
      KVTIER_RETURN_IF_ERROR(r.Done());
      FinishedRequests f = engine.Finished();
      f.saves_done = StripRids(instance, std::move(f.saves_done));
      f.loads_done = StripRids(instance, std::move(f.loads_done));
      EncodeStatus(out, Status::Ok());
      proto::EncodeFinished(out, f);
      return Status::Ok();
    }
    case MsgType::kStats: {
      KVTIER_RETURN_IF_ERROR(r.Done());
      EncodeStatus(out, Status::Ok());
      proto::EncodeStats(out, pool->manager->Stats());
      return Status::Ok();
    }
    default:
      return Status::InvalidArgument(
          std::string("service protocol: ") + proto::MsgTypeName(frame.header.type) + " (type " +
          std::to_string(frame.header.type) + ") is not a call a call connection carries");
  }
}

}  // namespace kvtier::daemon

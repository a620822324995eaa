#include "engine/engine.h"

#include <chrono>

namespace kvtier::engine {

Result<std::unique_ptr<Engine>> Engine::Create(const LlamaModel* model, BlockManager* manager,
                                               uint32_t g1_blocks, uint32_t tokens_per_block,
                                               DType kv_dtype) {
  if (model == nullptr) return Status::InvalidArgument("Engine needs a model");
  const KvLayout layout = model->MakeKvLayout(tokens_per_block, kv_dtype);
  if (manager != nullptr) {
    const KvLayout& m = manager->layout();
    if (m.Fingerprint() != layout.Fingerprint() || m.g1_arrangement != layout.g1_arrangement) {
      return Status::InvalidArgument("BlockManager layout " + m.ToString() +
                                     " is not the engine's " + layout.ToString());
    }
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<PagedKvCache> cache,
                          PagedKvCache::Create(layout, g1_blocks));
  if (manager != nullptr) KVTIER_RETURN_IF_ERROR(manager->RegisterDeviceMemory(cache->memory()));
  return std::unique_ptr<Engine>(new Engine(model, manager, std::move(cache)));
}

void Engine::Abandon(const std::string& id, SequenceState& seq) {
  // RequestFinished forgets the request; blocks a save may still read are held.
  if (manager_ != nullptr && manager_->RequestFinished(id)) {
    std::vector<uint32_t>& held = held_[id];  // an id reused while held: keep both sets
    held.insert(held.end(), seq.block_table.begin(), seq.block_table.end());
  } else {
    (void)cache_->Free(seq.block_table);
  }
  seq.block_table.clear();
}

Result<std::vector<float>> Engine::Prefill(const RequestSpec& request, SequenceState& seq,
                                           uint32_t computed, uint32_t planned,
                                           RequestOutcome& out) {
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const auto n = static_cast<uint32_t>(request.prompt.size());
  auto t0 = Clock::now();
  if (planned == 0) {
    out.computed_tokens = n - computed;
    auto logits =
        model_->Forward(*cache_, seq.block_table, request.prompt.subspan(computed), computed);
    out.compute_seconds = seconds_since(t0);
    return logits;
  }
  ForwardOptions opts;
  double waited = 0;
  opts.before_layer = [&](uint32_t layer) {
    const auto w = Clock::now();
    Status s = manager_->WaitLayer(layer);
    waited += seconds_since(w);
    return s;
  };
  const uint32_t from = computed + planned;
  auto logits = model_->Forward(*cache_, seq.block_table, request.prompt.subspan(from), from, opts);
  out.load_wait_seconds = waited;
  out.compute_seconds = seconds_since(t0) - waited;
  // Loads can end short of the plan (a failed read): recompute from what arrived intact.
  const uint32_t loaded = manager_->LoadedTokens(request.request_id);
  if (logits.ok() && loaded >= planned) {
    out.loaded_tokens = planned;
    out.computed_tokens = n - from;
    return logits;
  }
  if (!logits.ok() && loaded >= planned) return logits;  // not a load failure
  out.loaded_tokens = loaded;
  out.computed_tokens = n - computed - loaded;
  t0 = Clock::now();
  logits = model_->Forward(*cache_, seq.block_table, request.prompt.subspan(computed + loaded),
                           computed + loaded);
  out.compute_seconds += seconds_since(t0);
  return logits;
}

void Engine::DropSessions() {
  bool pending = false;
  for (const auto& [name, sess] : sessions_) pending = pending || sess.saves_pending;
  if (pending && manager_ != nullptr) manager_->WaitForSaves();
  for (auto& [name, sess] : sessions_) (void)cache_->Free(sess.blocks);
  sessions_.clear();
}

Result<RequestOutcome> Engine::Run(const RequestSpec& request, uint32_t max_new, int64_t stop_id) {
  return Run(request, max_new, stop_id, "");
}

Result<RequestOutcome> Engine::Run(const RequestSpec& request, uint32_t max_new, int64_t stop_id,
                                   const std::string& session) {
  if (request.prompt.empty()) return Status::InvalidArgument("request has an empty prompt");
  const auto start = std::chrono::steady_clock::now();
  const auto n = static_cast<uint32_t>(request.prompt.size());
  const uint32_t tpb = cache_->tokens_per_block();
  RequestOutcome out;
  SequenceState seq;
  uint32_t computed = 0;  // prompt tokens whose KV is still in G1 (the session's)
  if (!session.empty()) {
    auto it = sessions_.find(session);
    if (it != sessions_.end()) {
      Session sess = std::move(it->second);
      sessions_.erase(it);
      uint32_t common = 0;
      const uint32_t limit = std::min<uint32_t>(static_cast<uint32_t>(sess.tokens.size()), n - 1);
      while (common < limit && sess.tokens[common] == request.prompt[common]) ++common;
      computed = common / tpb * tpb;
      const uint32_t keep = computed / tpb;
      if (sess.saves_pending && keep < sess.blocks.size() && manager_ != nullptr) {
        manager_->WaitForSaves();  // saves may still read the blocks given back below
      }
      (void)cache_->Free(std::span<const uint32_t>(sess.blocks).subspan(keep));
      seq.block_table.assign(sess.blocks.begin(), sess.blocks.begin() + keep);
      seq.num_tokens = computed;
    }
  }
  out.g1_reused_tokens = computed;
  Status cap = EnsureCapacity(*cache_, seq, n);
  if (cap.Is(StatusCode::kResourceExhausted) && !sessions_.empty()) {
    DropSessions();  // retained sessions give their blocks back before a request fails
    cap = EnsureCapacity(*cache_, seq, n);
  }
  if (!cap.ok()) {
    (void)cache_->Free(seq.block_table);
    return cap;
  }

  uint32_t planned = 0;
  if (manager_ != nullptr) {
    auto lookup = manager_->Lookup(request, computed);
    if (!lookup.ok()) {
      Abandon(request.request_id, seq);
      return lookup.status();
    }
    out.offered_tokens = lookup->num_tokens;
    auto prepared = manager_->PrepareLoad(request.request_id, seq.block_table, lookup->num_tokens);
    if (!prepared.ok() || !manager_->StartLoad().ok()) {
      Abandon(request.request_id, seq);
      return prepared.ok() ? Status::Internal("StartLoad failed") : prepared.status();
    }
    planned = *prepared;
  }

  auto logits = Prefill(request, seq, computed, planned, out);
  if (!logits.ok()) {
    Abandon(request.request_id, seq);
    return logits.status();
  }
  out.ttft_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  seq.num_tokens = n;
  out.prompt_logits = *logits;
  if (manager_ != nullptr) {
    Status s = manager_->Commit(request.request_id, request.prompt, seq.block_table);
    if (s.ok()) s = manager_->StartSave();
    if (!s.ok()) {
      Abandon(request.request_id, seq);
      return s;
    }
  }

  auto generated = GreedyDecode(*model_, *cache_, seq, std::move(*logits), max_new, stop_id);
  if (!generated.ok()) {
    Abandon(request.request_id, seq);
    return generated.status();
  }
  out.generated = std::move(*generated);
  std::vector<TokenId> all(request.prompt.begin(), request.prompt.end());
  all.insert(all.end(), out.generated.begin(),
             out.generated.begin() + static_cast<ptrdiff_t>(seq.num_tokens - n));
  if (manager_ != nullptr && seq.num_tokens > n) {
    Status s = manager_->Commit(request.request_id, all, seq.block_table);
    if (s.ok()) s = manager_->StartSave();
    if (!s.ok()) {
      Abandon(request.request_id, seq);
      return s;
    }
  }
  if (session.empty()) {
    Abandon(request.request_id, seq);  // the request is done: same release path
    return out;
  }
  // Kept in G1 for the session's next turn; kvtier forgets the request (its saves may still
  // read the blocks: the session remembers to wait for them before giving any back).
  Session sess;
  sess.tokens = std::move(all);
  sess.blocks = std::move(seq.block_table);
  sess.saves_pending = manager_ != nullptr && manager_->RequestFinished(request.request_id);
  auto old = sessions_.find(session);
  if (old != sessions_.end()) {
    // A session reused while another of its sequences is kept: the older one goes.
    if (old->second.saves_pending && manager_ != nullptr) manager_->WaitForSaves();
    (void)cache_->Free(old->second.blocks);
    sessions_.erase(old);
  }
  sessions_.emplace(session, std::move(sess));
  return out;
}

uint32_t Engine::ReleaseFinished(bool wait) {
  if (manager_ == nullptr) return 0;
  if (wait) manager_->WaitForSaves();
  uint32_t freed = 0;
  for (const std::string& id : manager_->Finished().saves_done) {
    auto it = held_.find(id);
    if (it == held_.end()) continue;
    (void)cache_->Free(it->second);
    held_.erase(it);
    ++freed;
  }
  return freed;
}

}  // namespace kvtier::engine

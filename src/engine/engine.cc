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
                                           uint32_t planned, RequestOutcome& out) {
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const auto n = static_cast<uint32_t>(request.prompt.size());
  auto t0 = Clock::now();
  if (planned == 0) {
    out.computed_tokens = n;
    auto logits = model_->Forward(*cache_, seq.block_table, request.prompt, 0);
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
  auto logits =
      model_->Forward(*cache_, seq.block_table, request.prompt.subspan(planned), planned, opts);
  out.load_wait_seconds = waited;
  out.compute_seconds = seconds_since(t0) - waited;
  // Loads can end short of the plan (a failed read): recompute from what arrived intact.
  const uint32_t loaded = manager_->LoadedTokens(request.request_id);
  if (logits.ok() && loaded >= planned) {
    out.loaded_tokens = planned;
    out.computed_tokens = n - planned;
    return logits;
  }
  if (!logits.ok() && loaded >= planned) return logits;  // not a load failure
  out.loaded_tokens = loaded;
  out.computed_tokens = n - loaded;
  t0 = Clock::now();
  logits = model_->Forward(*cache_, seq.block_table, request.prompt.subspan(loaded), loaded);
  out.compute_seconds += seconds_since(t0);
  return logits;
}

Result<RequestOutcome> Engine::Run(const RequestSpec& request, uint32_t max_new, int64_t stop_id) {
  if (request.prompt.empty()) return Status::InvalidArgument("request has an empty prompt");
  const auto start = std::chrono::steady_clock::now();
  const auto n = static_cast<uint32_t>(request.prompt.size());
  RequestOutcome out;
  SequenceState seq;
  KVTIER_RETURN_IF_ERROR(EnsureCapacity(*cache_, seq, n));

  uint32_t planned = 0;
  if (manager_ != nullptr) {
    auto lookup = manager_->Lookup(request, 0);
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

  auto logits = Prefill(request, seq, planned, out);
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
  if (manager_ != nullptr && seq.num_tokens > n) {
    std::vector<TokenId> all(request.prompt.begin(), request.prompt.end());
    all.insert(all.end(), out.generated.begin(),
               out.generated.begin() + static_cast<ptrdiff_t>(seq.num_tokens - n));
    Status s = manager_->Commit(request.request_id, all, seq.block_table);
    if (s.ok()) s = manager_->StartSave();
    if (!s.ok()) {
      Abandon(request.request_id, seq);
      return s;
    }
  }
  Abandon(request.request_id, seq);  // the request is done: same release path
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

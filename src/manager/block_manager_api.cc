// BlockManager, the public facade (include/kvtier/connector.h): each call goes to the
// in-process manager (BlockManager::Impl, embedded: the default) or, with service.socket set,
// to kvtier serve through an AttachedManager (src/service; docs/service.md).
#include "kvtier/connector.h"
#include "manager/block_manager_impl.h"
#include "service/attached_manager.h"

namespace kvtier {

BlockManager::BlockManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlockManager::BlockManager(std::unique_ptr<service::AttachedManager> attached)
    : attached_(std::move(attached)) {}
BlockManager::~BlockManager() = default;

Result<std::unique_ptr<BlockManager>> BlockManager::Create(const ManagerOptions& options) {
  if (!options.config.GetString("service.socket").empty()) {
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<service::AttachedManager> attached,
                            service::AttachedManager::Create(options));
    return std::unique_ptr<BlockManager>(new BlockManager(std::move(attached)));
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Impl::Create(options));
  return std::unique_ptr<BlockManager>(new BlockManager(std::move(impl)));
}

bool BlockManager::attached() const { return attached_ != nullptr; }

Result<LookupResult> BlockManager::Lookup(const RequestSpec& request,
                                          uint32_t num_computed_tokens) {
  if (attached_) return attached_->Lookup(request, num_computed_tokens);
  return impl_->Lookup(request, num_computed_tokens);
}
Result<uint32_t> BlockManager::PrepareLoad(const std::string& request_id,
                                           std::span<const uint32_t> g1_block_ids,
                                           uint32_t num_external_tokens, bool async_load) {
  if (attached_) {
    return attached_->PrepareLoad(request_id, g1_block_ids, num_external_tokens, async_load);
  }
  return impl_->PrepareLoad(request_id, g1_block_ids, num_external_tokens, async_load);
}
Status BlockManager::Commit(const std::string& request_id, std::span<const TokenId> tokens,
                            std::span<const uint32_t> g1_block_ids) {
  if (attached_) return attached_->Commit(request_id, tokens, g1_block_ids);
  return impl_->Commit(request_id, tokens, g1_block_ids);
}
bool BlockManager::RequestFinished(const std::string& request_id) {
  if (attached_) return attached_->RequestFinished(request_id);
  return impl_->RequestFinished(request_id);
}
Status BlockManager::RegisterDeviceMemory(const G1Memory& g1) {
  if (attached_) return attached_->RegisterDeviceMemory(g1);
  return impl_->RegisterDeviceMemory(g1);
}
Status BlockManager::StartLoad() {
  if (attached_) return attached_->StartLoad();
  return impl_->StartLoad();
}
// Ordered first, then started either way: after a failed ordering the loads (saves) fail rather
// than wait unstarted while the engine goes on (connector.h).
Status BlockManager::StartLoad(uintptr_t engine_stream) {
  if (attached_) return attached_->StartLoad(engine_stream);
  const Status ordered = impl_->OrderAfterEngineStream(CopyDirection::kHostToDevice, engine_stream);
  const Status started = impl_->StartLoad();
  return ordered.ok() ? started : ordered;
}
Status BlockManager::WaitLayer(uint32_t layer) {
  if (attached_) return attached_->WaitLayer(layer);
  return impl_->WaitLayer(layer);
}
uint32_t BlockManager::LoadedTokens(const std::string& request_id) {
  if (attached_) return attached_->LoadedTokens(request_id);
  return impl_->LoadedTokens(request_id);
}
Status BlockManager::StartSave() {
  if (attached_) return attached_->StartSave();
  return impl_->StartSave();
}
Status BlockManager::StartSave(uintptr_t engine_stream) {
  if (attached_) return attached_->StartSave(engine_stream);
  const Status ordered = impl_->OrderAfterEngineStream(CopyDirection::kDeviceToHost, engine_stream);
  const Status started = impl_->StartSave();
  return ordered.ok() ? started : ordered;
}
void BlockManager::WaitForSaves() {
  if (attached_) return attached_->WaitForSaves();
  impl_->WaitForSaves();
}
void BlockManager::WaitForRequestSaves(const std::string& request_id) {
  if (attached_) return attached_->WaitForRequestSaves(request_id);
  impl_->WaitForRequestSaves(request_id);
}
FinishedRequests BlockManager::Finished() {
  if (attached_) return attached_->Finished();
  return impl_->Finished();
}
ManagerStats BlockManager::Stats() {
  if (attached_) return attached_->Stats();
  return impl_->Stats();
}
void BlockManager::SubscribeEvents(KvEventCallback callback) {
  if (attached_) return attached_->SubscribeEvents(std::move(callback));
  impl_->SubscribeEvents(std::move(callback));
}
const KvLayout& BlockManager::layout() const {
  return attached_ ? attached_->layout() : impl_->layout();
}

}  // namespace kvtier

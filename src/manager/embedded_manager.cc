// EmbeddedManager: each call goes to the in-process BlockManagerImpl, for engine instance 0.
#include "manager/embedded_manager.h"

#include <utility>

#include "manager/block_manager_impl.h"

namespace kvtier {

Result<std::unique_ptr<EmbeddedManager>> EmbeddedManager::Create(const ManagerOptions& options) {
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockManagerImpl> impl,
                          BlockManagerImpl::Create(options));
  return std::make_unique<EmbeddedManager>(std::move(impl));
}

EmbeddedManager::EmbeddedManager(std::unique_ptr<BlockManagerImpl> impl) : impl_(std::move(impl)) {}
EmbeddedManager::~EmbeddedManager() = default;

Result<LookupResult> EmbeddedManager::Lookup(const RequestSpec& request,
                                             uint32_t num_computed_tokens) {
  return impl_->Lookup(request, num_computed_tokens);
}
Result<uint32_t> EmbeddedManager::PrepareLoad(const std::string& request_id,
                                              std::span<const uint32_t> g1_block_ids,
                                              uint32_t num_external_tokens, bool async_load) {
  return impl_->PrepareLoad(request_id, g1_block_ids, num_external_tokens, async_load);
}
Status EmbeddedManager::Commit(const std::string& request_id, std::span<const TokenId> tokens,
                               std::span<const uint32_t> g1_block_ids) {
  return impl_->Commit(request_id, tokens, g1_block_ids);
}
bool EmbeddedManager::RequestFinished(const std::string& request_id) {
  return impl_->RequestFinished(request_id);
}
Status EmbeddedManager::RegisterDeviceMemory(const G1Memory& g1) {
  return impl_->RegisterDeviceMemory(g1);
}
Status EmbeddedManager::StartLoad() { return impl_->StartLoad(); }
// Ordered first, then started either way: after a failed ordering the loads (saves) fail rather
// than wait unstarted while the engine goes on (connector.h).
Status EmbeddedManager::StartLoad(uintptr_t engine_stream) {
  const Status ordered = impl_->OrderAfterEngineStream(CopyDirection::kHostToDevice, engine_stream);
  const Status started = impl_->StartLoad();
  return ordered.ok() ? started : ordered;
}
Status EmbeddedManager::WaitLayer(uint32_t layer) { return impl_->WaitLayer(layer); }
uint32_t EmbeddedManager::LoadedTokens(const std::string& request_id) {
  return impl_->LoadedTokens(request_id);
}
Status EmbeddedManager::StartSave() { return impl_->StartSave(); }
Status EmbeddedManager::StartSave(uintptr_t engine_stream) {
  const Status ordered = impl_->OrderAfterEngineStream(CopyDirection::kDeviceToHost, engine_stream);
  const Status started = impl_->StartSave();
  return ordered.ok() ? started : ordered;
}
void EmbeddedManager::WaitForSaves() { impl_->WaitForSaves(); }
void EmbeddedManager::WaitForRequestSaves(const std::string& request_id) {
  impl_->WaitForRequestSaves(request_id);
}
FinishedRequests EmbeddedManager::Finished() { return impl_->Finished(); }
ManagerStats EmbeddedManager::Stats() { return impl_->Stats(); }
void EmbeddedManager::SubscribeEvents(KvEventCallback callback) {
  impl_->SubscribeEvents(std::move(callback));
}
const KvLayout& EmbeddedManager::layout() const { return impl_->layout(); }

}  // namespace kvtier

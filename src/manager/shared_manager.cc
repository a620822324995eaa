// SharedManager: kvtier serve's per-engine views over one BlockManagerImpl.
#include "manager/shared_manager.h"

#include <utility>

#include "manager/block_manager_impl.h"

namespace kvtier {

Result<std::unique_ptr<SharedManager>> SharedManager::Create(const ManagerOptions& options,
                                                             DeviceBackendFactory device_backend) {
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockManagerImpl> impl,
                          BlockManagerImpl::Create(options, {}, nullptr, std::move(device_backend),
                                                   /*shared_g2=*/true));
  return std::unique_ptr<SharedManager>(new SharedManager(std::move(impl)));
}

SharedManager::SharedManager(std::unique_ptr<BlockManagerImpl> impl) : impl_(std::move(impl)) {}
SharedManager::~SharedManager() = default;

SharedManager::EngineView SharedManager::ForEngine(uint32_t instance) {
  return EngineView(impl_.get(), instance);
}
Status SharedManager::RegisterDeviceMemory(const G1Memory& g1) {
  return impl_->RegisterDeviceMemory(g1);
}
const HostArena* SharedManager::g2_arena() const { return impl_->g2_arena(); }
bool SharedManager::g3_enabled() const { return impl_->g3_enabled(); }
bool SharedManager::HasG4() const { return impl_->HasG4(); }
ManagerStats SharedManager::Stats() { return impl_->Stats(); }
void SharedManager::SubscribeEvents(KvEventCallback callback) {
  impl_->SubscribeEvents(std::move(callback));
}

Result<LookupResult> SharedManager::EngineView::Lookup(const RequestSpec& request,
                                                       uint32_t num_computed_tokens) {
  return impl_->Lookup(request, num_computed_tokens, instance_);
}
Result<uint32_t> SharedManager::EngineView::PrepareLoad(const std::string& request_id,
                                                        std::span<const uint32_t> g1_block_ids,
                                                        uint32_t num_external_tokens,
                                                        bool async_load) {
  return impl_->PrepareLoad(request_id, g1_block_ids, num_external_tokens, async_load);
}
Status SharedManager::EngineView::Commit(const std::string& request_id,
                                         std::span<const TokenId> tokens,
                                         std::span<const uint32_t> g1_block_ids) {
  return impl_->Commit(request_id, tokens, g1_block_ids);
}
bool SharedManager::EngineView::RequestFinished(const std::string& request_id) {
  return impl_->RequestFinished(request_id);
}
Status SharedManager::EngineView::StartLoad() { return impl_->StartLoad(instance_); }
Status SharedManager::EngineView::StartSave() { return impl_->StartSave(instance_); }
Status SharedManager::EngineView::WaitLayer(uint32_t layer) {
  return impl_->WaitLayer(layer, instance_);
}
uint32_t SharedManager::EngineView::LoadedTokens(const std::string& request_id) {
  return impl_->LoadedTokens(request_id);
}
void SharedManager::EngineView::WaitForSaves() { impl_->WaitForSaves(instance_); }
void SharedManager::EngineView::WaitForRequestSaves(const std::string& request_id) {
  impl_->WaitForRequestSaves(request_id);
}
FinishedRequests SharedManager::EngineView::Finished() { return impl_->Finished(instance_); }
size_t SharedManager::EngineView::Forget() { return impl_->ForgetInstance(instance_); }
void SharedManager::EngineView::Adopt() { impl_->AdoptInstance(instance_); }
size_t SharedManager::EngineView::Requests() { return impl_->InstanceRequests(instance_); }

}  // namespace kvtier

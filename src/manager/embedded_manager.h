// EmbeddedManager: the BlockManager that runs in the engine's own process (the default; see
// include/kvtier/connector.h for every method's contract). It owns one BlockManagerImpl
// (block_manager_impl.h) and hands each call to it for engine instance 0: an embedded manager
// serves one engine. BlockManager::Create makes it when service.socket is not set; tests make it
// from an Impl they built with their fault-injection seams (BlockManagerImpl::Create).
//
// Thread-safety: as BlockManager's (every method may be called from any thread); it keeps no
// state of its own besides the Impl, which is set at construction and never replaced.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvtier/connector.h"

namespace kvtier {

class BlockManagerImpl;  // manager/block_manager_impl.h

class EmbeddedManager final : public BlockManager {
 public:
  // Builds the Impl (tiers, index, transfer engine) from `options`: BlockManager::Create's
  // embedded half, with its errors.
  static Result<std::unique_ptr<EmbeddedManager>> Create(const ManagerOptions& options);
  // REQUIRES: `impl` is not null.
  explicit EmbeddedManager(std::unique_ptr<BlockManagerImpl> impl);
  ~EmbeddedManager() override;

  Result<LookupResult> Lookup(const RequestSpec& request, uint32_t num_computed_tokens) override;
  Result<uint32_t> PrepareLoad(const std::string& request_id,
                               std::span<const uint32_t> g1_block_ids, uint32_t num_external_tokens,
                               bool async_load = false) override;
  Status Commit(const std::string& request_id, std::span<const TokenId> tokens,
                std::span<const uint32_t> g1_block_ids) override;
  bool RequestFinished(const std::string& request_id) override;
  Status RegisterDeviceMemory(const G1Memory& g1) override;
  Status StartLoad() override;
  Status StartLoad(uintptr_t engine_stream) override;
  Status WaitLayer(uint32_t layer) override;
  uint32_t LoadedTokens(const std::string& request_id) override;
  Status StartSave() override;
  Status StartSave(uintptr_t engine_stream) override;
  void WaitForSaves() override;
  void WaitForRequestSaves(const std::string& request_id) override;
  FinishedRequests Finished() override;
  ManagerStats Stats() override;
  void SubscribeEvents(KvEventCallback callback) override;
  const KvLayout& layout() const override;
  bool attached() const override { return false; }

 private:
  const std::unique_ptr<BlockManagerImpl> impl_;
};

}  // namespace kvtier

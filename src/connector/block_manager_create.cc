// BlockManager::Create (include/kvtier/connector.h): the one place that chooses the
// implementation. With service.socket set, the attached manager (kvtier serve's client,
// src/client; docs/service.md); otherwise the embedded one (EmbeddedManager, src/manager).
#include "client/attached_manager.h"
#include "kvtier/connector.h"
#include "manager/embedded_manager.h"

namespace kvtier {

Result<std::unique_ptr<BlockManager>> BlockManager::Create(const ManagerOptions& options) {
  if (client::AttachedManager::Requested(options.config)) {
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<client::AttachedManager> attached,
                            client::AttachedManager::Create(options));
    return std::unique_ptr<BlockManager>(std::move(attached));
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddedManager> embedded,
                          EmbeddedManager::Create(options));
  return std::unique_ptr<BlockManager>(std::move(embedded));
}

}  // namespace kvtier

// A test manager whose G3 I/O goes through a FaultInjectingIo, for the manager tests that make
// G3 fail, stall or corrupt bytes under the manager.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <utility>

#include "kvtier/connector.h"
#include "manager/block_manager_impl.h"
#include "manager/embedded_manager.h"
#include "manager_test_util.h"
#include "tier/fault_injecting_io.h"

namespace kvtier::testing {

// A manager on TestLayout() for model "test-model" with `config`, its G3 I/O wrapped in a
// FaultInjectingIo that starts with `plan`; *faults is that wrapper once G3 opens (left as it
// was when G3 does not open). A test failure and nullptr when the manager cannot be created.
inline std::unique_ptr<BlockManager> FaultyG3Manager(const Config& config,
                                                     FaultInjectingIo** faults,
                                                     const FaultPlan& plan = FaultPlan{}) {
  ManagerOptions options;
  options.layout = TestLayout();
  options.model_id = "test-model";
  options.config = config;
  DiskTier::OpenOptions open;
  open.wrap_io = [faults, plan](std::unique_ptr<DiskIo> inner) -> std::unique_ptr<DiskIo> {
    auto f = std::make_unique<FaultInjectingIo>(std::move(inner));
    f->SetPlan(plan);
    *faults = f.get();
    return f;
  };
  auto impl = BlockManagerImpl::Create(options, open);
  EXPECT_TRUE(impl.ok()) << impl.status().ToString();
  if (!impl.ok()) return nullptr;
  return std::make_unique<EmbeddedManager>(std::move(impl).value());
}

}  // namespace kvtier::testing

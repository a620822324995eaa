// G4Fetch: one G4 object for a G1 block's owner to fetch itself (DeviceCopyBackend::Fetch; the
// service protocol's kFetch carries a list of them): the name, and what the object's header must
// say (block_format.h's ExpectedBlock, less what the layout gives). A plain value in core, so
// the transfer engine and the protocol (which depends on core only) share it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier {

struct G4Fetch {
  uint32_t g1_block = 0;
  std::string name;
  uint64_t namespace_id = 0;
  BlockKey key;
  std::vector<uint32_t> tokens;
};

}  // namespace kvtier

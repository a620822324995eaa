// The routing half of kvtier._kvtier (router_bindings.cc), registered by the module's init.
#pragma once

#include <pybind11/pybind11.h>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

// A key as Python sees it: 16 bytes, the digest's first 16 bytes in order (kvtier_bindings.cc).
pybind11::bytes KeyBytes(const BlockKey& k);

// Adds BlockHasher and KvRouter to `mod`. `thrower` raises a Status that is not ok as the
// module's KvtierError (it must not return).
void BindRouter(pybind11::module_& mod, void (*thrower)(const Status&));

}  // namespace kvtier

// The routing half of kvtier._kvtier (router_bindings.cc), registered by the module's init.
#pragma once

#include <pybind11/pybind11.h>

#include "kvtier/status.h"

namespace kvtier {

// Adds BlockHasher and KvRouter to `mod`. `thrower` raises a Status that is not ok as the
// module's KvtierError (it must not return).
void BindRouter(pybind11::module_& mod, void (*thrower)(const Status&));

}  // namespace kvtier

#include "tier/remote_store.h"

namespace kvtier {

std::string RemoteObjectName(uint64_t namespace_id, const BlockKey& key) {
  static const char kHex[] = "0123456789abcdef";
  std::string name = "kvt1:";
  name.reserve(5 + 16 + 1 + 32);
  for (int shift = 60; shift >= 0; shift -= 4) name.push_back(kHex[(namespace_id >> shift) & 0xf]);
  name.push_back(':');
  name += key.ToHex();
  return name;
}

}  // namespace kvtier

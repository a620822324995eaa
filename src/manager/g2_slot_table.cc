// G2SlotTable: see g2_slot_table.h.
#include "manager/g2_slot_table.h"

#include <algorithm>
#include <cassert>

namespace kvtier {

G2SlotTable::G2SlotTable(uint32_t num_slots, uint32_t tokens_per_block, double namespace_share)
    : num_slots_(num_slots), tpb_(tokens_per_block), share_(namespace_share) {
  assert(tokens_per_block >= 1 && "G2SlotTable: tokens_per_block must be at least 1");
  {
    MutexLock lock(&meta_mu_);
    meta_.resize(num_slots_);
    tokens_.resize(size_t{num_slots_} * tpb_);
  }
  MutexLock lock(&ns_mu_);
  slot_ns_.assign(num_slots_, 0);
}

void G2SlotTable::Set(uint32_t slot, const Meta& meta, std::span<const TokenId> tokens) {
  AssignNamespace(slot, meta.namespace_id);
  MutexLock lock(&meta_mu_);
  meta_[slot] = meta;
  std::fill_n(tokens_.begin() + size_t{slot} * tpb_, tpb_, TokenId{0});
  std::copy_n(tokens.begin(), std::min<size_t>(tokens.size(), tpb_),
              tokens_.begin() + size_t{slot} * tpb_);
}

void G2SlotTable::Free(uint32_t slot) { AssignNamespace(slot, 0); }

void G2SlotTable::SetCommitChecksum(uint32_t slot, uint64_t checksum) {
  MutexLock lock(&meta_mu_);
  meta_[slot].commit_checksum = checksum;
}

uint8_t G2SlotTable::StoreTiers(uint32_t slot) const {
  MutexLock lock(&meta_mu_);
  return meta_[slot].store_tiers;
}

G2SlotTable::WriteRecord G2SlotTable::CopyForWrite(uint32_t slot) const {
  WriteRecord r;
  MutexLock lock(&meta_mu_);
  r.namespace_id = meta_[slot].namespace_id;
  r.commit_checksum = meta_[slot].commit_checksum;
  r.tokens.assign(tokens_.begin() + size_t{slot} * tpb_, tokens_.begin() + size_t{slot + 1} * tpb_);
  return r;
}

void G2SlotTable::AssignNamespace(uint32_t slot, uint64_t ns) {
  MutexLock lock(&ns_mu_);
  if (slot >= slot_ns_.size() || slot_ns_[slot] == ns) return;
  if (uint64_t old = slot_ns_[slot]; old != 0) {
    auto it = ns_slots_.find(old);
    if (it != ns_slots_.end() && --it->second == 0) ns_slots_.erase(it);
  }
  slot_ns_[slot] = ns;
  if (ns != 0) ++ns_slots_[ns];
}

bool G2SlotTable::EvictableFor(uint64_t ns, uint32_t slot) const {
  if (ns == 0 || share_ <= 0) return true;
  MutexLock lock(&ns_mu_);
  if (slot >= slot_ns_.size()) return true;
  const uint64_t owner = slot_ns_[slot];
  if (owner == 0 || owner == ns) return true;
  // The requester counts as a namespace holding blocks even before its first one lands.
  const uint64_t holders = ns_slots_.size() + (ns_slots_.count(ns) == 0 ? 1 : 0);
  const double guaranteed = share_ * static_cast<double>(slot_ns_.size()) /
                            static_cast<double>(std::max<uint64_t>(holders, 1));
  auto it = ns_slots_.find(owner);
  return it != ns_slots_.end() && static_cast<double>(it->second) > guaranteed;
}

uint32_t G2SlotTable::SlotsOf(uint64_t ns) const {
  MutexLock lock(&ns_mu_);
  auto it = ns_slots_.find(ns);
  return it == ns_slots_.end() ? 0 : it->second;
}

size_t G2SlotTable::Namespaces() const {
  MutexLock lock(&ns_mu_);
  return ns_slots_.size();
}

}  // namespace kvtier

#include "policies/lineage_lru_policy.h"

#include <cassert>

namespace kvtier {

uint32_t LineageLruPolicy::ChildCount(const BlockKey& key) const {
  if (auto it = nodes_.find(key); it != nodes_.end()) return it->second.children;
  return orphan_children_.Count(key);
}

void LineageLruPolicy::Reclassify(Node& node, bool was_leaf) {
  Order& from = was_leaf ? leaves_ : inner_;
  Order& to = was_leaf ? inner_ : leaves_;
  auto handle = from.extract(node.pos);  // reuses the set node: no allocation
  node.pos = to.insert(std::move(handle)).position;
}

void LineageLruPolicy::OnInsert(const BlockKey& key, const BlockKey& parent) {
  auto [it, inserted] = nodes_.try_emplace(key);
  assert(inserted && "LineageLruPolicy::OnInsert: key is tracked already");
  if (!inserted) {  // Release builds: treat a double insert as an access rather than corrupt.
    OnAccess(key);
    return;
  }
  Node& node = it->second;
  node.parent = parent;
  node.tick = ++tick_;
  // Children that arrived before their parent were counted as orphans; adopt them.
  node.children = orphan_children_.Adopt(key);
  node.pos = SetOf(node).emplace_hint(SetOf(node).end(), node.tick, key);

  if (parent == key) return;
  if (auto p = nodes_.find(parent); p != nodes_.end()) {
    if (p->second.children++ == 0) Reclassify(p->second, /*was_leaf=*/true);
  } else {
    orphan_children_.AddChild(parent);
  }
}

void LineageLruPolicy::OnAccess(const BlockKey& key) {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return;
  Node& node = it->second;
  Order& set = SetOf(node);
  auto handle = set.extract(node.pos);
  node.tick = ++tick_;
  handle.value().first = node.tick;
  node.pos = set.insert(set.end(), std::move(handle));
}

void LineageLruPolicy::OnRemove(const BlockKey& key) {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return;
  Node& node = it->second;
  SetOf(node).erase(node.pos);
  // Children stay tracked; remember them so the key is an inner block again if it comes back.
  orphan_children_.Orphan(key, node.children);
  const BlockKey parent = node.parent;
  nodes_.erase(it);

  if (parent == key) return;
  if (auto p = nodes_.find(parent); p != nodes_.end()) {
    assert(p->second.children > 0);
    if (--p->second.children == 0) Reclassify(p->second, /*was_leaf=*/false);
  } else {
    orphan_children_.RemoveChild(parent);
  }
}

std::optional<BlockKey> LineageLruPolicy::Victim(const EvictablePredicate& evictable) {
  for (const Order* set : {&leaves_, &inner_}) {
    for (const auto& [tick, key] : *set) {
      if (evictable(key)) return key;
    }
    if (leaf_only_) break;
  }
  return std::nullopt;
}

}  // namespace kvtier

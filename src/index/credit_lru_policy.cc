#include "index/credit_lru_policy.h"

#include <cassert>
#include <cmath>
#include <string>

namespace kvtier {

Result<std::unique_ptr<CreditLruPolicy>> CreditLruPolicy::Create(size_t capacity_blocks,
                                                                 const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<CreditLruPolicy>(new CreditLruPolicy(capacity_blocks, config));
}

CreditLruPolicy::CreditLruPolicy(size_t capacity_blocks)
    : CreditLruPolicy(capacity_blocks, Config()) {}

CreditLruPolicy::CreditLruPolicy(size_t capacity_blocks, const Config& config)
    : config_(config),
      capacity_(static_cast<double>(capacity_blocks > 0 ? capacity_blocks : 1)),
      ghost_(static_cast<size_t>(config.ghost_factor * capacity_)) {
  assert(config.Validate().ok() && "CreditLruPolicy: invalid config");
}

uint32_t CreditLruPolicy::Uses(const BlockKey& key) const {
  if (auto it = nodes_.find(key); it != nodes_.end()) return it->second.uses;
  return ghost_.Peek(key);
}

double CreditLruPolicy::CreditOf(const BlockKey& key) const {
  auto it = nodes_.find(key);
  return it == nodes_.end() ? 0.0 : Credit(key, it->second);
}

double CreditLruPolicy::Credit(const BlockKey& key, const Node& node) const {
  const BlockRuns::Run& run = runs_.at(node.run);
  if (node.uses == 1 && node.children == 0 && run.last == key) return config_.stale_tail;
  double credit = 0;
  if (node.uses == 2) credit += config_.used_twice;
  if (node.uses >= 3) credit += config_.used_thrice;
  if (run.follow_up && run.length >= kLongRun) credit += config_.long_follow_up;
  return credit;
}

void CreditLruPolicy::Place(const BlockKey& key, Node& node) {
  if (node.children > 0) {
    node.pos = inner_.emplace_hint(inner_.end(), static_cast<int64_t>(node.tick), key);
    return;
  }
  const int64_t score =
      static_cast<int64_t>(node.tick) + std::llround(Credit(key, node) * capacity_);
  node.pos = leaves_.emplace(score, key).first;
}

void CreditLruPolicy::Unplace(Node& node) {
  (node.children > 0 ? inner_ : leaves_).erase(node.pos);
}

void CreditLruPolicy::OnInsert(const BlockKey& key, const BlockKey& parent) {
  auto [it, inserted] = nodes_.try_emplace(key);
  assert(inserted && "CreditLruPolicy::OnInsert: key is tracked already");
  if (!inserted) {  // Release builds: treat a double insert as an access rather than corrupt.
    OnAccess(key);
    return;
  }
  Node& node = it->second;
  node.parent = parent;
  node.tick = ++tick_;
  if (const uint32_t uses = ghost_.Take(key); uses > 0) {
    node.uses = uses + (uses < UINT32_MAX ? 1 : 0);
  }
  node.children = orphan_children_.Adopt(key);

  Node* parent_node = nullptr;
  if (parent != key) {
    if (auto p = nodes_.find(parent); p != nodes_.end()) parent_node = &p->second;
  }
  node.depth = parent_node != nullptr ? parent_node->depth + 1 : 0;
  node.run = runs_.Join(parent_node != nullptr ? parent_node->run : 0, parent, key, node.depth);

  if (parent_node != nullptr) {
    if (parent_node->children == 0) {
      Unplace(*parent_node);
      parent_node->children = 1;
      Place(parent, *parent_node);
    } else {
      ++parent_node->children;
    }
  } else if (parent != key) {
    orphan_children_.AddChild(parent);
  }
  Place(key, node);
}

void CreditLruPolicy::OnAccess(const BlockKey& key) {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return;
  Node& node = it->second;
  Unplace(node);
  node.tick = ++tick_;
  if (node.uses < UINT32_MAX) ++node.uses;
  Place(key, node);
}

void CreditLruPolicy::OnRemove(const BlockKey& key) {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return;
  Node& node = it->second;
  Unplace(node);
  orphan_children_.Orphan(key, node.children);
  runs_.Leave(node.run);
  ghost_.Remember(key, node.uses);
  const BlockKey parent = node.parent;
  nodes_.erase(it);

  if (parent == key) return;
  if (auto p = nodes_.find(parent); p != nodes_.end()) {
    assert(p->second.children > 0);
    if (p->second.children == 1) {
      Unplace(p->second);
      p->second.children = 0;
      Place(parent, p->second);
    } else {
      --p->second.children;
    }
  } else {
    orphan_children_.RemoveChild(parent);
  }
}

std::optional<BlockKey> CreditLruPolicy::Victim(const EvictablePredicate& evictable) {
  for (const Order* set : {&leaves_, &inner_}) {
    for (const auto& [score, key] : *set) {
      if (evictable(key)) return key;
    }
  }
  return std::nullopt;
}

}  // namespace kvtier

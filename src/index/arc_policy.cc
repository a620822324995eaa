#include "index/arc_policy.h"

#include <algorithm>
#include <cassert>

namespace kvtier {

ArcPolicy::ArcPolicy(size_t capacity_blocks)
    : c_(static_cast<double>(std::max<size_t>(capacity_blocks, 1))) {}

std::list<BlockKey>& ArcPolicy::ListOf(Where w) {
  switch (w) {
    case Where::kT1:
      return t1_;
    case Where::kT2:
      return t2_;
    case Where::kB1:
      return b1_;
    case Where::kB2:
      return b2_;
  }
  return t1_;
}

void ArcPolicy::MoveTo(Entry& e, const BlockKey& key, Where to) {
  std::list<BlockKey>& from = ListOf(e.where);
  std::list<BlockKey>& dest = ListOf(to);
  dest.splice(dest.begin(), from, e.pos);
  e.pos = dest.begin();
  e.where = to;
  (void)key;
}

bool ArcPolicy::Contains(const BlockKey& key) const {
  auto it = where_.find(key);
  return it != where_.end() && (it->second.where == Where::kT1 || it->second.where == Where::kT2);
}

void ArcPolicy::TrimGhosts() {
  while (!b1_.empty() && static_cast<double>(t1_.size() + b1_.size()) > c_) {
    where_.erase(b1_.back());
    b1_.pop_back();
  }
  while (!b2_.empty() &&
         static_cast<double>(t1_.size() + t2_.size() + b1_.size() + b2_.size()) > 2 * c_) {
    where_.erase(b2_.back());
    b2_.pop_back();
  }
}

void ArcPolicy::OnInsert(const BlockKey& key, const BlockKey& /*parent*/) {
  auto it = where_.find(key);
  if (it == where_.end()) {
    t1_.push_front(key);
    where_.emplace(key, Entry{Where::kT1, t1_.begin()});
    TrimGhosts();
    return;
  }
  Entry& e = it->second;
  switch (e.where) {
    case Where::kT1:
    case Where::kT2:
      assert(false && "ArcPolicy::OnInsert: key is tracked already");
      MoveTo(e, key, Where::kT2);  // release builds: treat as an access
      return;
    case Where::kB1: {
      const double delta =
          std::max(1.0, double(b2_.size()) / double(std::max<size_t>(b1_.size(), 1)));
      p_ = std::min(c_, p_ + delta);
      break;
    }
    case Where::kB2: {
      const double delta =
          std::max(1.0, double(b1_.size()) / double(std::max<size_t>(b2_.size(), 1)));
      p_ = std::max(0.0, p_ - delta);
      break;
    }
  }
  MoveTo(e, key, Where::kT2);
  TrimGhosts();
}

void ArcPolicy::OnAccess(const BlockKey& key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  Entry& e = it->second;
  if (e.where != Where::kT1 && e.where != Where::kT2) return;  // a ghost is not tracked
  MoveTo(e, key, Where::kT2);
}

void ArcPolicy::OnRemove(const BlockKey& key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  Entry& e = it->second;
  if (e.where == Where::kT1) {
    MoveTo(e, key, Where::kB1);
  } else if (e.where == Where::kT2) {
    MoveTo(e, key, Where::kB2);
  } else {
    return;  // already a ghost
  }
  TrimGhosts();
}

std::optional<BlockKey> ArcPolicy::Victim(const EvictablePredicate& evictable) {
  const bool t1_first = !t1_.empty() && (static_cast<double>(t1_.size()) > p_ || t2_.empty());
  const std::list<BlockKey>* order[2] = {&t1_, &t2_};
  if (!t1_first) std::swap(order[0], order[1]);
  for (const std::list<BlockKey>* list : order) {
    for (auto it = list->rbegin(); it != list->rend(); ++it) {
      if (evictable(*it)) return *it;
    }
  }
  return std::nullopt;
}

}  // namespace kvtier

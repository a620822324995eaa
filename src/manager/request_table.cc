#include "manager/request_table.h"

namespace kvtier {

RequestState* RequestTable::Find(const std::string& id) {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

const RequestState* RequestTable::Find(const std::string& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

RequestState& RequestTable::Activate(const std::string& id, bool* made) {
  auto [it, inserted] = entries_.try_emplace(id);
  if (inserted) {
    it->second.id = id;
    it->second.by_activity = by_activity_.insert(by_activity_.end(), id);
  }
  *made = inserted;
  Touch(it->second);
  return it->second;
}

void RequestTable::Touch(RequestState& r) {
  r.last_active = std::chrono::steady_clock::now();
  by_activity_.splice(by_activity_.end(), by_activity_, r.by_activity);
}

void RequestTable::Erase(RequestState& r) {
  by_activity_.erase(r.by_activity);
  const std::string id = std::move(r.id);
  entries_.erase(id);
}

size_t RequestTable::SweepIdle(std::chrono::steady_clock::time_point now, int max) {
  size_t erased = 0;
  for (int n = 0; n < max && !by_activity_.empty(); ++n) {
    RequestState* r = Find(by_activity_.front());
    if (r == nullptr) {  // cannot happen (the invariant); heal rather than spin
      by_activity_.pop_front();
      continue;
    }
    if (now - r->last_active < idle_ttl_) break;  // the rest is more recent
    if (r->Idle()) {
      Erase(*r);
      ++erased;
    } else {
      Touch(*r);
    }
  }
  return erased;
}

}  // namespace kvtier

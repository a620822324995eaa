#include "index/hit_density_policy.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <tuple>

namespace kvtier {

namespace {

// A class with fewer (decayed) lifetime ends than this has no estimate of its own yet; the
// estimate of all classes pooled stands in for it.
constexpr double kMinEvents = 4.0;

uint64_t NextRandom(uint64_t& state) {  // xorshift64*: deterministic sampling
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return state * 0x2545f4914f6cdd1dull;
}

}  // namespace

Result<std::unique_ptr<HitDensityPolicy>> HitDensityPolicy::Create(size_t capacity_blocks,
                                                                   const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<HitDensityPolicy>(new HitDensityPolicy(capacity_blocks, config));
}

HitDensityPolicy::HitDensityPolicy(size_t capacity_blocks)
    : HitDensityPolicy(capacity_blocks, Config()) {}

HitDensityPolicy::HitDensityPolicy(size_t capacity_blocks, const Config& config)
    : config_(config),
      capacity_(std::max<size_t>(capacity_blocks, 1)),
      ghost_(static_cast<size_t>(config.ghost_factor * static_cast<double>(capacity_))),
      refresh_period_(std::max<uint64_t>(
          16,
          static_cast<uint64_t>(std::llround(config.refresh * static_cast<double>(capacity_))))),
      age_width_(std::max<uint64_t>(
          1, static_cast<uint64_t>(std::ceil(config.max_age * static_cast<double>(capacity_) /
                                             static_cast<double>(kAgeBuckets))))),
      samples_(static_cast<size_t>(config.samples)),
      next_refresh_(refresh_period_),
      hits_now_(kClasses, Histogram{}),
      evictions_now_(kClasses, Histogram{}),
      hits_(kClasses, Histogram{}),
      evictions_(kClasses, Histogram{}),
      density_(kClasses, Histogram{}) {
  assert(config.Validate().ok() && "HitDensityPolicy: invalid config");
}

uint32_t HitDensityPolicy::Uses(const BlockKey& key) const {
  if (auto it = nodes_.find(key); it != nodes_.end()) return it->second.uses;
  return ghost_.Peek(key);
}

double HitDensityPolicy::DensityOf(const BlockKey& key) const {
  auto it = nodes_.find(key);
  return it == nodes_.end() ? 0.0 : Density(it->second);
}

size_t HitDensityPolicy::ClassOf(const BlockKey& key) const {
  auto it = nodes_.find(key);
  return it == nodes_.end() ? kClasses : Class(it->second);
}

size_t HitDensityPolicy::Class(const Node& node) const {
  const auto features = static_cast<uint32_t>(config_.features);
  size_t uses = 0, ended = 0, long_follow_up = 0, depth = 0;
  if (features & Config::kUses) uses = std::min<uint32_t>(node.uses, kUseClasses) - 1;
  if (features & Config::kEnded) ended = node.ended ? 1 : 0;
  if (features & Config::kLongFollowUp) {
    const BlockRuns::Run& run = runs_.at(node.run);
    long_follow_up = run.follow_up && run.length >= kLongRun ? 1 : 0;
  }
  if (features & Config::kDepth) {
    depth = node.depth < 4 ? 0 : node.depth < 16 ? 1 : node.depth < 64 ? 2 : 3;
  }
  return ((uses * 2 + ended) * 2 + long_follow_up) * kDepthClasses + depth;
}

size_t HitDensityPolicy::AgeBucket(const Node& node) const {
  return static_cast<size_t>(std::min<uint64_t>((tick_ - node.tick) / age_width_, kAgeBuckets - 1));
}

double HitDensityPolicy::Density(const Node& node) const {
  return density_[Class(node)][AgeBucket(node)];
}

void HitDensityPolicy::Refresh() {
  Histogram pooled_hits{}, pooled_events{};
  for (size_t c = 0; c < kClasses; ++c) {
    for (size_t a = 0; a < kAgeBuckets; ++a) {
      hits_[c][a] = hits_[c][a] * config_.decay + hits_now_[c][a];
      evictions_[c][a] = evictions_[c][a] * config_.decay + evictions_now_[c][a];
      pooled_hits[a] += hits_[c][a];
      pooled_events[a] += hits_[c][a] + evictions_[c][a];
    }
    hits_now_[c].fill(0);
    evictions_now_[c].fill(0);
  }
  // density(a) = hits at ages >= a over the space-time they and the evictions still take.
  // Returns the number of events.
  auto fill = [](const Histogram& hits, const Histogram& events, Histogram& density) {
    double cum_hits = 0, cum_events = 0, cum_life = 0;
    for (size_t a = kAgeBuckets; a-- > 0;) {
      cum_hits += hits[a];
      cum_events += events[a];
      cum_life += cum_events;
      density[a] = cum_life > 0 ? cum_hits / cum_life : 0;
    }
    return cum_events;
  };
  Histogram pooled_density{}, events{};
  fill(pooled_hits, pooled_events, pooled_density);
  for (size_t c = 0; c < kClasses; ++c) {
    for (size_t a = 0; a < kAgeBuckets; ++a) events[a] = hits_[c][a] + evictions_[c][a];
    if (fill(hits_[c], events, density_[c]) < kMinEvents) density_[c] = pooled_density;
  }
}

void HitDensityPolicy::Reference(Node& node) {
  if (last_ != nullptr && last_ != &node && node.parent != last_->key) last_->ended = true;
  node.ended = false;
  last_ = &node;
  if (tick_ >= next_refresh_) {
    Refresh();
    next_refresh_ = tick_ + refresh_period_;
  }
}

void HitDensityPolicy::AddTo(std::vector<Node*>& set, Node& node) {
  node.slot = static_cast<uint32_t>(set.size());
  set.push_back(&node);
}

void HitDensityPolicy::RemoveFrom(std::vector<Node*>& set, Node& node) {
  assert(node.slot < set.size() && set[node.slot] == &node);
  Node* moved = set.back();
  set[node.slot] = moved;
  moved->slot = node.slot;
  set.pop_back();
}

void HitDensityPolicy::OnInsert(const BlockKey& key, const BlockKey& parent) {
  auto [it, inserted] = nodes_.try_emplace(key);
  assert(inserted && "HitDensityPolicy::OnInsert: key is tracked already");
  if (!inserted) {  // Release builds: a double insert counts as a use rather than corrupt.
    OnAccess(key);
    return;
  }
  Node& node = it->second;
  node.key = key;
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
    if (parent_node->children++ == 0) {
      RemoveFrom(leaves_, *parent_node);
      AddTo(inner_, *parent_node);
    }
  } else if (parent != key) {
    orphan_children_.AddChild(parent);
  }
  AddTo(node.children > 0 ? inner_ : leaves_, node);
  Reference(node);
}

void HitDensityPolicy::OnAccess(const BlockKey& key) {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return;
  Node& node = it->second;
  hits_now_[Class(node)][AgeBucket(node)] += 1;
  node.tick = ++tick_;
  if (node.uses < UINT32_MAX) ++node.uses;
  Reference(node);
}

void HitDensityPolicy::OnRemove(const BlockKey& key) {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return;
  Node& node = it->second;
  evictions_now_[Class(node)][AgeBucket(node)] += 1;
  RemoveFrom(node.children > 0 ? inner_ : leaves_, node);
  orphan_children_.Orphan(key, node.children);
  runs_.Leave(node.run);
  ghost_.Remember(key, node.uses);
  if (last_ == &node) last_ = nullptr;
  const BlockKey parent = node.parent;
  nodes_.erase(it);

  if (parent == key) return;
  if (auto p = nodes_.find(parent); p != nodes_.end()) {
    Node& parent_node = p->second;
    assert(parent_node.children > 0);
    if (--parent_node.children == 0) {
      RemoveFrom(inner_, parent_node);
      AddTo(leaves_, parent_node);
    }
  } else {
    orphan_children_.RemoveChild(parent);
  }
}

bool HitDensityPolicy::Ask(Node& node, const EvictablePredicate& evictable) {
  if (node.asked != epoch_) {
    node.asked = epoch_;
    node.evictable = evictable(node.key);
  }
  return node.evictable;
}

std::optional<BlockKey> HitDensityPolicy::Victim(const EvictablePredicate& evictable) {
  ++epoch_;
  // Lower density first; on a tie the older block, then the smaller key (determinism).
  auto rank = [this](const Node* n) { return std::make_tuple(Density(*n), n->tick, n->key); };
  const Node* best = nullptr;
  auto consider = [&](Node* n) {
    if (Ask(*n, evictable) && (best == nullptr || rank(n) < rank(best))) best = n;
  };
  const bool sampled = leaves_.size() > samples_;
  if (sampled) {
    for (size_t i = 0; i < samples_; ++i) consider(leaves_[NextRandom(rng_) % leaves_.size()]);
  } else {
    for (Node* n : leaves_) consider(n);
  }
  if (best != nullptr) return best->key;

  if (sampled) {  // every sample was refused: rank all leaves not asked yet
    std::vector<std::tuple<double, uint64_t, BlockKey, Node*>> ranked;
    for (Node* n : leaves_) {
      if (n->asked != epoch_) ranked.emplace_back(Density(*n), n->tick, n->key, n);
    }
    std::sort(ranked.begin(), ranked.end());
    for (const auto& entry : ranked) {
      if (Ask(*std::get<3>(entry), evictable)) return std::get<2>(entry);
    }
  }
  // No leaf may go: the least recently used evictable inner block, so the tier never jams.
  std::vector<Node*> inner = inner_;
  std::sort(inner.begin(), inner.end(), [](const Node* a, const Node* b) {
    return std::tie(a->tick, a->key) < std::tie(b->tick, b->key);
  });
  for (Node* n : inner) {
    if (Ask(*n, evictable)) return n->key;
  }
  return std::nullopt;
}

}  // namespace kvtier

#include "tier/fault_injecting_io.h"

#include <cstdlib>
#include <cstring>

namespace kvtier {

namespace {
constexpr uint32_t kPage = 4096;
}

FaultInjectingIo::FaultInjectingIo(std::unique_ptr<DiskIo> inner) : inner_(std::move(inner)) {
  MutexLock lock(&mu_);
  rng_.seed(plan_.seed);
}

FaultInjectingIo::~FaultInjectingIo() {
  for (auto& [tag, p] : pending_) std::free(p.bounce);
}

void FaultInjectingIo::SetPlan(const FaultPlan& plan) {
  MutexLock lock(&mu_);
  plan_ = plan;
  rng_.seed(plan.seed);
}

void FaultInjectingIo::FailNext(IoKind kind, int err, uint32_t count) {
  MutexLock lock(&mu_);
  if (kind == IoKind::kRead) {
    fail_next_reads_ = count;
    fail_next_read_errno_ = err;
  } else {
    fail_next_writes_ = count;
    fail_next_write_errno_ = err;
  }
}

void FaultInjectingIo::FailNextPoll() {
  {
    MutexLock lock(&mu_);
    fail_next_poll_ = true;
  }
  inner_->Wake();
}

void FaultInjectingIo::ReleaseStalled() {
  {
    MutexLock lock(&mu_);
    ++release_epoch_;
  }
  inner_->Wake();
}

FaultCounts FaultInjectingIo::counts() const {
  MutexLock lock(&mu_);
  return counts_;
}

uint64_t FaultInjectingIo::forwarded(IoKind kind) const {
  MutexLock lock(&mu_);
  return kind == IoKind::kRead ? forwarded_reads_ : forwarded_writes_;
}

uint32_t FaultInjectingIo::RandomPages(uint32_t below_pages) {
  if (below_pages == 0) return 0;
  return static_cast<uint32_t>(rng_() % below_pages);
}

FaultInjectingIo::Fault FaultInjectingIo::Draw(const IoRequest& r) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const bool read = r.kind == IoKind::kRead;
  // One draw per request, compared against the cumulative probabilities, so a plan's
  // probabilities are exactly the rates observed.
  const double x = u(rng_);
  double acc = 0;
  auto hit = [&](double p) {
    acc += p;
    return x < acc;
  };
  if (read) {
    if (hit(plan_.short_read)) return Fault::kShortRead;
    if (hit(plan_.read_bit_flip)) return Fault::kReadFlip;
  } else {
    if (hit(plan_.short_write)) return Fault::kShortWrite;
    if (hit(plan_.torn_write) && r.len >= 2 * kPage) return Fault::kTornWrite;
    if (hit(plan_.write_bit_flip)) return Fault::kWriteFlip;
  }
  if (hit(plan_.stall)) return Fault::kStall;
  return Fault::kNone;
}

void FaultInjectingIo::Queue(const IoRequest& r) {
  Pending p;
  p.original = r;
  IoRequest fwd = r;
  {
    MutexLock lock(&mu_);
    const bool read = r.kind == IoKind::kRead;
    std::uniform_real_distribution<double> u(0.0, 1.0);
    int fail_errno = 0;
    if (read && fail_next_reads_ > 0) {
      --fail_next_reads_;
      fail_errno = fail_next_read_errno_;
    } else if (!read && fail_next_writes_ > 0) {
      --fail_next_writes_;
      fail_errno = fail_next_write_errno_;
    } else if (read && u(rng_) < plan_.read_error) {
      fail_errno = plan_.read_errno;
    } else if (!read && u(rng_) < plan_.write_error) {
      fail_errno = plan_.write_errno;
    }
    if (fail_errno != 0) {
      ++(read ? counts_.read_errors : counts_.write_errors);
      synthetic_.push_back(IoCompletion{r.tag, -fail_errno});
      return;
    }
    p.fault = Draw(r);
    const uint32_t pages = r.len / kPage;
    switch (p.fault) {
      case Fault::kNone:
        break;
      case Fault::kShortRead:
        ++counts_.short_reads;
        p.report = RandomPages(pages) * kPage;
        break;
      case Fault::kShortWrite:
        ++counts_.short_writes;
        p.report = RandomPages(pages) * kPage;
        fwd.len = p.report;
        break;
      case Fault::kTornWrite: {
        ++counts_.torn_writes;
        p.report = r.len;
        if (rng_() % 2 == 0) {  // a prefix landed (at least the header page, not all)
          fwd.len = (1 + RandomPages(pages - 1)) * kPage;
        } else {  // everything but the header page landed
          fwd.offset += kPage;
          fwd.buf += kPage;
          fwd.len -= kPage;
        }
        break;
      }
      case Fault::kWriteFlip: {
        ++counts_.write_bit_flips;
        p.bounce = static_cast<uint8_t*>(std::aligned_alloc(kPage, r.len));
        std::memcpy(p.bounce, r.buf, r.len);
        const uint64_t bit = rng_() % (uint64_t{r.len} * 8);
        p.bounce[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        fwd.buf = p.bounce;
        break;
      }
      case Fault::kReadFlip:
        ++counts_.read_bit_flips;
        p.report = static_cast<uint32_t>(rng_() % (uint64_t{r.len} * 8));  // the bit to flip
        break;
      case Fault::kStall:
        ++counts_.stalls;
        p.epoch = release_epoch_;
        break;
    }
    if (p.fault == Fault::kShortWrite && fwd.len == 0) {
      synthetic_.push_back(IoCompletion{r.tag, 0});
      return;
    }
    ++(read ? forwarded_reads_ : forwarded_writes_);
  }
  pending_[r.tag] = p;
  inner_->Queue(fwd);
}

Result<size_t> FaultInjectingIo::Poll(int timeout_ms, std::vector<IoCompletion>* out) {
  uint64_t epoch;
  {
    MutexLock lock(&mu_);
    epoch = release_epoch_;
    if (fail_next_poll_) {
      fail_next_poll_ = false;
      return Status::IOError("injected I/O engine failure");
    }
  }
  bool released_any = false;
  for (const Stalled& s : stalled_) released_any = released_any || s.epoch < epoch;
  const bool ready_now = !synthetic_.empty() || released_any;
  inner_out_.clear();
  auto polled = inner_->Poll(ready_now ? 0 : timeout_ms, &inner_out_);
  if (!polled.ok()) return polled.status();
  const size_t before = out->size();
  out->insert(out->end(), synthetic_.begin(), synthetic_.end());
  synthetic_.clear();
  if (released_any) {
    std::vector<Stalled> still;
    for (const Stalled& s : stalled_) {
      if (s.epoch < epoch) {
        out->push_back(s.completion);
      } else {
        still.push_back(s);
      }
    }
    stalled_.swap(still);
  }
  for (IoCompletion c : inner_out_) {
    auto it = pending_.find(c.tag);
    if (it == pending_.end()) {
      out->push_back(c);
      continue;
    }
    Pending p = it->second;
    pending_.erase(it);
    std::free(p.bounce);
    const bool full = c.result >= 0;
    switch (p.fault) {
      case Fault::kNone:
        break;
      case Fault::kShortRead:
        if (full) c.result = std::min<int32_t>(c.result, static_cast<int32_t>(p.report));
        break;
      case Fault::kShortWrite:
        break;  // the device wrote the prefix and said so
      case Fault::kTornWrite:
        if (full) c.result = static_cast<int32_t>(p.report);
        break;
      case Fault::kWriteFlip:
        break;
      case Fault::kReadFlip:
        if (c.result > 0) {
          const uint64_t bit = p.report % (static_cast<uint64_t>(c.result) * 8);
          p.original.buf[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        }
        break;
      case Fault::kStall:
        if (p.epoch >= epoch) {
          stalled_.push_back(Stalled{c, p.epoch});
          continue;
        }
        break;
    }
    out->push_back(c);
  }
  return out->size() - before;
}

}  // namespace kvtier

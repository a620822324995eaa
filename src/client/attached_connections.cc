// AttachedManager's two background connections to kvtier serve (docs/service.md): the data
// connection, on which the daemon lends this engine G1<->G2 copies (kCopy batches, run here
// through this process's mapping of the shared G2, reported per layer or per batch), and the
// events connection that feeds SubscribeEvents. The call side is attached_manager.cc.
#include <sys/socket.h>

#include "client/attached_manager.h"
#include "client/g1_fetcher.h"
#include "core/log.h"
#include "proto/handshake.h"
#include "proto/load_trace.h"
#include "tier/cond_wait.h"
#include "transfer/block_copy.h"

namespace kvtier::client {

// The protocol's names this file uses most.
using proto::LoadTrace;
using proto::MsgType;
using proto::WireWriter;

void AttachedManager::SubscribeEvents(KvEventCallback callback) {
  {
    MutexLock lock(&mu_);
    callbacks_.push_back(std::move(callback));
  }
  MutexLock lock(&events_mu_);
  if (!events_thread_.joinable() && !events_stop_) {
    events_thread_ = std::thread([this] { EventsLoop(); });
  }
}

void AttachedManager::EventsLoop() {
  bool warned = false;
  for (;;) {
    {
      MutexLock lock(&events_mu_);
      if (events_stop_) return;
    }
    Result<proto::Handshake> opened =
        proto::OpenConnection(socket_path_, daemon_uid_, MakeHello(proto::Role::kEvents), ++seq_,
                              Clock::now() + call_timeout_);
    if (opened.ok()) {
      MutexLock lock(&events_mu_);
      if (events_stop_) return;
      events_fd_ = opened->fd.get();
    }
    if (opened.ok()) {
      warned = false;
      {
        MutexLock lock(&mu_);
        stats_.events_connects++;
      }
      const int fd = opened->fd.get();
      for (;;) {
        Result<proto::Frame> frame = proto::RecvFrame(fd, Clock::time_point::max());
        if (!frame.ok()) break;
        proto::EventsFrame ev;
        proto::WireReader r(frame->payload);
        Status decoded =
            frame->header.type == static_cast<uint16_t>(MsgType::kEvents)
                ? proto::DecodeEvents(&r, &ev)
                : Status::InvalidArgument(std::string("an events connection carries Events, not ") +
                                          proto::MsgTypeName(frame->header.type));
        if (!decoded.ok()) {
          KVTIER_LOG(kWarn) << "kvtier: events from kvtier serve at " << socket_path_ << ": "
                            << decoded.message() << "; connecting again";
          break;
        }
        std::vector<KvEventCallback> callbacks;
        {
          MutexLock lock(&mu_);
          callbacks = callbacks_;
          stats_.events += ev.events.size();
          stats_.events_dropped += ev.dropped;
        }
        if (ev.dropped != 0) {
          KVTIER_LOG(kWarn) << "kvtier: kvtier serve dropped " << ev.dropped
                            << " KV events for this engine (its callbacks did not keep up)";
        }
        for (const auto& cb : callbacks) cb(ev.events);
      }
      MutexLock lock(&events_mu_);
      events_fd_ = -1;
    } else if (!warned) {
      KVTIER_LOG(kDebug) << "kvtier: events from kvtier serve at " << socket_path_ << ": "
                         << opened.status().message() << "; retried every "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(reattach_).count()
                         << " ms";
      warned = true;
    }
    MutexLock lock(&events_mu_);
    const auto until = Clock::now() + reattach_;
    while (!events_stop_ && Clock::now() < until) {
      CondWaitFor(&events_cv_, &events_mu_, until - Clock::now());
    }
  }
}

Status AttachedManager::SendReport(int fd, MsgType type, uint64_t batch, uint32_t layer,
                                   const Status& status) {
  WireWriter w;
  w.U64(batch);
  if (type == MsgType::kCopyLayer) {
    w.U32(layer);
  } else {
    proto::EncodeStatus(&w, status);
  }
  MutexLock lock(&send_mu_);
  return proto::SendFrame(fd, static_cast<uint16_t>(type), ++seq_, w.data(), -1,
                          Clock::now() + call_timeout_);
}

void AttachedManager::RunCopy(int fd, const proto::CopyCall& call) {
  const KvLayout& layout = options_.layout;
  const uint64_t block_bytes = layout.BlockBytes();
  for (const auto& [block, offset] : call.copies) {
    if (block >= g1_->num_blocks || offset > arena_->mapped_bytes() ||
        arena_->mapped_bytes() - offset < block_bytes) {
      (void)SendReport(fd, MsgType::kCopyDone, call.batch, 0,
                       Status::InvalidArgument("a copy names G1 block " + std::to_string(block) +
                                               " or G2 offset " + std::to_string(offset) +
                                               " outside this engine's memory"));
      return;
    }
  }
  const auto deadline = Clock::time_point(std::chrono::nanoseconds(call.deadline_ns));
  auto late = [&] {
    MutexLock lock(&mu_);
    stats_.late_batches++;
    return Status::TimedOut("the copy's lease ended before it could run");
  };
  // Checked inside each pass (FenceCopies): once this engine detached, the daemon may have
  // lent the batch's slots to another engine.
  auto stopped = [&] {
    return copies_stopped_.load() ? Status::Unavailable("this engine detached from kvtier serve")
                                  : Status::Ok();
  };
  {
    MutexLock lock(&mu_);
    stats_.copy_batches++;
  }
  if (Clock::now() >= deadline) {
    (void)SendReport(fd, MsgType::kCopyDone, call.batch, 0, late());
    return;
  }
  if (Status s = stopped(); !s.ok()) {
    (void)SendReport(fd, MsgType::kCopyDone, call.batch, 0, s);
    return;
  }
  if (device_) {
    std::vector<DeviceBlockCopy> copies;
    for (const auto& [block, offset] : call.copies) {
      copies.push_back(DeviceBlockCopy{block, arena_->base() + offset});
    }
    const uint64_t batch = call.batch;
    const bool load = call.dir == 1;
    // FenceCopies waits for this batch's done callback (the device's copies have ended then).
    {
      MutexLock lock(&device_mu_);
      ++device_batches_;
    }
    auto ended = [this] {
      MutexLock lock(&device_mu_);
      if (--device_batches_ == 0) device_cv_.notify_all();
    };
    Status s = device_->Submit(
        load ? CopyDirection::kHostToDevice : CopyDirection::kDeviceToHost, copies,
        [this, fd, batch, load](uint32_t layer) {
          if (load) (void)SendReport(fd, MsgType::kCopyLayer, batch, layer, Status::Ok());
        },
        [this, fd, batch, ended](const Status& st) {
          ended();
          (void)SendReport(fd, MsgType::kCopyDone, batch, 0, st);
        },
        load);
    if (!s.ok()) {
      ended();
      (void)SendReport(fd, MsgType::kCopyDone, call.batch, 0, s);
    }
    return;
  }
  Status status;
  if (call.dir == 1) {
    LoadTrace* trace = proto::ActiveLoadTrace();
    if (trace) {
      LoadTrace::SetFirst(trace->first_copy_received_ns, LoadTrace::NowNs());
      trace->batches.fetch_add(1, std::memory_order_relaxed);
    }
    const Stores stores = call.copies.size() * layout.BlockBytes() >= stream_load_bytes_
                              ? Stores::kStreaming
                              : Stores::kCached;
    for (uint32_t l = 0; l < layout.num_layers && status.ok(); ++l) {
      const int64_t t0 = trace ? LoadTrace::NowNs() : 0;
      {
        CopyGate::Pass pass(copy_gate_);
        if (Clock::now() >= deadline) {
          status = late();
          break;
        }
        if (status = stopped(); !status.ok()) break;
        for (const auto& [block, offset] : call.copies) {
          ScatterLayer(*g1_, arena_->base() + offset, block, l, stores);
        }
      }
      const int64_t t1 = trace ? LoadTrace::NowNs() : 0;
      if (trace) {
        trace->copy_ns.fetch_add(t1 - t0, std::memory_order_relaxed);
        if (l < LoadTrace::kMaxLayers) LoadTrace::SetMax(trace->layer_copied_ns[l], t1);
      }
      status = SendReport(fd, MsgType::kCopyLayer, call.batch, l, Status::Ok());
      if (trace) trace->report_ns.fetch_add(LoadTrace::NowNs() - t1, std::memory_order_relaxed);
      if (!status.ok()) return;  // the daemon is gone
    }
  } else {
    for (const auto& [block, offset] : call.copies) {
      if (copy_stall_.count() > 0) std::this_thread::sleep_for(copy_stall_);
      CopyGate::Pass pass(copy_gate_);
      if (Clock::now() >= deadline) {
        status = late();
        break;
      }
      if (status = stopped(); !status.ok()) break;
      GatherBlock(*g1_, block, arena_->base() + offset);
    }
  }
  (void)SendReport(fd, MsgType::kCopyDone, call.batch, 0, status);
}

Status AttachedManager::SendFrameLocked(int fd, MsgType type, const WireWriter& w) {
  MutexLock lock(&send_mu_);
  return proto::SendFrame(fd, static_cast<uint16_t>(type), ++seq_, w.data(), -1,
                          Clock::now() + call_timeout_);
}

std::unique_ptr<G1Fetcher> AttachedManager::OpenFetcher(int fd, const proto::G4Config& config) {
  Result<std::unique_ptr<G1Fetcher>> opened =
      G1Fetcher::Create(config, *g1_, &copy_gate_, [this, fd](const proto::FetchDone& done) {
        WireWriter w;
        proto::EncodeFetchDone(&w, done);
        (void)SendFrameLocked(fd, MsgType::kFetchDone, w);
      });
  if (g4_ready_delay_.count() > 0) std::this_thread::sleep_for(g4_ready_delay_);
  WireWriter w;
  proto::EncodeStatus(&w, opened.status());
  (void)SendFrameLocked(fd, MsgType::kG4Ready, w);
  {
    MutexLock lock(&mu_);
    stats_.fetches_g4 = opened.ok();
  }
  if (!opened.ok()) {
    KVTIER_LOG(kInfo) << "kvtier: G4 loads go through kvtier serve's G2: "
                      << opened.status().message();
    return nullptr;
  }
  return std::move(opened).value();
}

void AttachedManager::DataLoop(int fd) {
  std::unique_ptr<G1Fetcher> fetcher;  // stopped (its calls ended) before this returns
  for (;;) {
    Result<proto::Frame> frame = proto::RecvFrame(fd, Clock::time_point::max());
    if (!frame.ok()) break;
    proto::WireReader r(frame->payload);
    const auto type = static_cast<MsgType>(frame->header.type);
    Status decoded;
    if (type == MsgType::kCopy) {
      proto::CopyCall call;
      decoded = proto::DecodeCopy(&r, &call);
      if (decoded.ok()) RunCopy(fd, call);
    } else if (type == MsgType::kFetch) {
      proto::FetchCall call;
      decoded = proto::DecodeFetch(&r, &call);
      if (decoded.ok()) {
        {
          MutexLock lock(&mu_);
          stats_.fetch_batches++;
        }
        if (fetcher) {
          fetcher->Enqueue(std::move(call));
        } else {
          proto::FetchDone done;
          done.batch = call.batch;
          done.statuses.assign(call.items.size(),
                               Status::FailedPrecondition("this engine does not fetch from G4"));
          WireWriter w;
          proto::EncodeFetchDone(&w, done);
          (void)SendFrameLocked(fd, MsgType::kFetchDone, w);
        }
      }
    } else if (type == MsgType::kG4Config) {
      proto::G4Config config;
      decoded = proto::DecodeG4Config(&r, &config);
      if (decoded.ok() && !fetcher) fetcher = OpenFetcher(fd, config);
    } else {
      decoded = Status::InvalidArgument(std::string("a data connection cannot carry ") +
                                        proto::MsgTypeName(frame->header.type));
    }
    if (!decoded.ok()) {
      KVTIER_LOG(kWarn) << "kvtier: kvtier serve sent a bad data frame: " << decoded.ToString();
      break;
    }
  }
  fetcher.reset();  // its fetches end before this engine detaches
  // A data connection that ended while attached (the daemon's writer gave up at the lease, a
  // bad frame, a cut connection) leaves no way to load or save: detach, so lookups are misses
  // and the next call attaches again with a new data connection. After a Detach, the
  // destructor or a new attach this is a no-op (attached_ is false by then).
  bool lost;
  {
    MutexLock lock(&mu_);
    lost = attached_ && data_fd_.get() == fd;
    if (lost) stats_.data_lost++;
  }
  if (lost) Detach("its data connection ended");
}

}  // namespace kvtier::client

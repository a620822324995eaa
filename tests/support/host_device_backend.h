// HostDeviceBackend: a DeviceCopyBackend whose "device" is host memory, for testing the
// TransferEngine's device path on machines without a GPU (a stand-in only because the real
// thing cannot exist here). It runs the real planner's units with the real kernel body
// (RunPlanLayerOnHost) on one worker thread, layer by layer, in submission order, and honours
// max_batches and wait_for_room as the CUDA backend does. Tests can hold the worker after a
// layer, and inject a device fault at a layer.
// Engine streams are simulated: a test names a stream by any integer, marks work as queued on
// it (QueueEngineWork) and finished (FinishEngineWork), as an engine's kernels would be.
// OrderAfterStream does what CUDA's event record + stream wait do: every batch of that
// direction submitted after the call waits, before its first layer, until the work queued on
// the stream before the call has finished (the worker runs batches in submission order, so a
// waiting batch also holds back the batches behind it, of either direction, which real CUDA
// streams would not). Each call is recorded, with the batches of its direction submitted before
// it, and a call can be made to fail.
#pragma once

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "transfer/device_backend.h"

namespace kvtier {

class HostDeviceBackend final : public DeviceCopyBackend {
 public:
  explicit HostDeviceBackend(const Config& config) : config_(config) {
    worker_ = std::thread([this] { Run(); });
  }
  ~HostDeviceBackend() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      released_ = true;
      finished_ = queued_;  // the engine's streams end too
      cv_.notify_all();
      cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  std::string Describe() const override { return "host stand-in for a device (tests)"; }
  Method method() const override { return Method::kKernel; }
  Status RegisterG1(const G1Memory& g1) override {
    KVTIER_RETURN_IF_ERROR(g1.Validate());
    if (!g1.on_device) return Status::InvalidArgument("on_device is false");
    g1_ = g1;
    return Status::Ok();
  }
  Status RegisterHost(uint8_t* base, uint64_t bytes) override {
    window_ = HostWindow{base, bytes, reinterpret_cast<uintptr_t>(base)};
    ++host_registrations;
    return Status::Ok();
  }
  Status Submit(CopyDirection dir, std::span<const DeviceBlockCopy> copies, LayerCallback on_layer,
                DoneCallback on_done, bool wait_for_room) override {
    Batch b;
    KVTIER_RETURN_IF_ERROR(
        BuildDeviceCopyPlan(g1_, window_, dir, copies, config_.max_unit_bytes, &b.plan));
    b.on_layer = std::move(on_layer);
    b.on_done = std::move(on_done);
    std::unique_lock<std::mutex> lock(mu_);
    const bool on_worker = std::this_thread::get_id() == worker_.get_id();
    while (InFlight() >= config_.max_batches) {
      if (!wait_for_room) {
        return Status::ResourceExhausted("all " + std::to_string(config_.max_batches) +
                                         " device batches are in flight");
      }
      if (on_worker) break;
      cv_.wait(lock);
    }
    b.waits = waits_[static_cast<int>(dir)];
    ++submitted_[static_cast<int>(dir)];
    queue_.push_back(std::move(b));
    cv_.notify_all();
    return Status::Ok();
  }

  // One OrderAfterStream call: its direction, stream, and the batches of that direction
  // submitted before it.
  struct Order {
    CopyDirection dir;
    uintptr_t stream;
    uint64_t batches_before;
  };
  Status OrderAfterStream(CopyDirection dir, uintptr_t engine_stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (fail_next_order_) {
      fail_next_order_ = false;
      return Status::IOError("injected failure ordering after stream " +
                             std::to_string(engine_stream));
    }
    orders_.push_back(Order{dir, engine_stream, submitted_[static_cast<int>(dir)]});
    waits_[static_cast<int>(dir)].push_back({engine_stream, queued_[engine_stream]});
    return Status::Ok();
  }
  // Work is queued on `stream` (an engine's kernel launched there, still running).
  void QueueEngineWork(uintptr_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    ++queued_[stream];
  }
  // All work queued on `stream` so far has finished.
  void FinishEngineWork(uintptr_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    finished_[stream] = queued_[stream];
    cv_.notify_all();
  }
  // True while the worker holds a batch back for an engine stream's work.
  bool waiting_for_engine() {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_for_engine_;
  }
  std::vector<Order> orders() {
    std::lock_guard<std::mutex> lock(mu_);
    return orders_;
  }
  // Batches accepted by Submit in direction `dir`.
  uint64_t submitted(CopyDirection dir) {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_[static_cast<int>(dir)];
  }
  // The next OrderAfterStream fails (IOError) and records nothing.
  void FailNextOrder() {
    std::lock_guard<std::mutex> lock(mu_);
    fail_next_order_ = true;
  }

  Result<uint8_t*> AllocateDevice(uint64_t bytes) override { return new uint8_t[bytes](); }
  void FreeDevice(uint8_t* ptr) override { delete[] ptr; }
  Status CopyToDevice(uint8_t* dev, const uint8_t* host, uint64_t bytes) override {
    std::memcpy(dev, host, bytes);
    return Status::Ok();
  }
  Status CopyFromDevice(uint8_t* host, const uint8_t* dev, uint64_t bytes) override {
    std::memcpy(host, dev, bytes);
    return Status::Ok();
  }
  Result<PlainCopyTime> TimePlainCopy(CopyDirection, uint8_t*, uint8_t*, uint64_t,
                                      uint32_t) override {
    return Status::Unavailable("not on a host stand-in");
  }
  // The worker stops after layer `layer` of the next batch until ReleaseStallForTest().
  void StallNextLoadAfterLayerForTest(uint32_t layer) override {
    std::lock_guard<std::mutex> lock(mu_);
    hold_after_layer_ = layer;
  }
  void ReleaseStallForTest() override {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  // The next batch fails at layer `layer` (its earlier layers land, that one does not).
  void FailNextBatchAtLayer(uint32_t layer) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_at_layer_ = layer;
  }
  // True while the worker is held after a layer.
  bool holding() {
    std::lock_guard<std::mutex> lock(mu_);
    return holding_;
  }

  int host_registrations = 0;

 private:
  // The work queued on `stream` up to `count` must finish before a batch starts.
  struct StreamWait {
    uintptr_t stream;
    uint64_t count;
  };
  struct Batch {
    DeviceCopyPlan plan;
    LayerCallback on_layer;
    DoneCallback on_done;
    std::vector<StreamWait> waits;
  };
  bool EngineWorkDone(const std::vector<StreamWait>& waits) {
    for (const StreamWait& w : waits) {
      if (finished_[w.stream] < w.count) return false;
    }
    return true;
  }
  size_t InFlight() const { return queue_.size() + (busy_ ? 1 : 0); }

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Batch b = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      if (!EngineWorkDone(b.waits)) {
        waiting_for_engine_ = true;
        cv_.wait(lock, [&] { return stopping_ || EngineWorkDone(b.waits); });
        waiting_for_engine_ = false;
      }
      const int64_t fail_at = fail_at_layer_;
      fail_at_layer_ = -1;
      const int64_t hold_at = hold_after_layer_;
      hold_after_layer_ = -1;
      released_ = false;
      lock.unlock();
      Status status;
      for (uint32_t l = 0; l < b.plan.num_layers(); ++l) {
        if (static_cast<int64_t>(l) == fail_at) {
          status = Status::IOError("injected device fault at layer " + std::to_string(l));
          break;
        }
        RunPlanLayerOnHost(b.plan, l, 32);
        if (b.on_layer) b.on_layer(l);
        if (static_cast<int64_t>(l) == hold_at) {
          std::unique_lock<std::mutex> hold(mu_);
          holding_ = true;
          cv_.wait(hold, [&] { return released_; });
          holding_ = false;
        }
      }
      if (b.on_done) b.on_done(status);
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  const Config config_;
  G1Memory g1_;
  HostWindow window_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  bool holding_ = false;
  bool released_ = false;
  int64_t hold_after_layer_ = -1;
  int64_t fail_at_layer_ = -1;
  uint64_t submitted_[2] = {0, 0};
  std::vector<Order> orders_;
  bool fail_next_order_ = false;
  std::vector<StreamWait> waits_[2];  // what a batch of each direction submitted now waits for
  std::map<uintptr_t, uint64_t> queued_, finished_;  // engine work per stream, counted
  bool waiting_for_engine_ = false;
  std::thread worker_;
};

}  // namespace kvtier

// RemoteG1Backend's G4 fetches (kvtier serve's side of "G4 loads straight into G1",
// docs/service.md): which instances fetch, the kFetch frames it queues, how each answer (or the
// lack of one) ends the items. The frames are captured instead of sent: the backend's contract
// is what it queues and what it calls back; the real connections are service_g4_fetch_test's.
#include "daemon/remote_g1_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>

#include "client/copy_gate.h"

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtier::daemon {
namespace {

using Clock = std::chrono::steady_clock;

struct Sent {
  uint32_t instance;
  proto::FetchCall call;
};

// A backend whose fetch frames land in `sent` (or are refused while `refuse` is set), and the
// item endings its callbacks saw.
struct Harness {
  std::mutex mu;
  std::vector<Sent> sent;
  bool refuse = false;
  std::vector<std::pair<size_t, Status>> ended;
  std::unique_ptr<RemoteG1Backend> backend;

  explicit Harness(std::chrono::milliseconds lease = std::chrono::milliseconds(5000)) {
    backend = std::make_unique<RemoteG1Backend>(
        [](uint32_t, const proto::CopyCall&) { return Status::Ok(); }, lease, 4);
    backend->SetFetchSender([this](uint32_t instance, const proto::FetchCall& call) {
      std::lock_guard lock(mu);
      if (refuse) return Status::Unavailable("the data connection is closing");
      sent.push_back(Sent{instance, call});
      return Status::Ok();
    });
  }
  DeviceCopyBackend::FetchCallback Callback() {
    return [this](size_t item, const Status& s) {
      std::lock_guard lock(mu);
      ended.emplace_back(item, s);
    };
  }
  std::vector<std::pair<size_t, Status>> Ended() {
    std::lock_guard lock(mu);
    return ended;
  }
};

G4Fetch Item(uint32_t instance, uint32_t block) {
  G4Fetch f;
  f.g1_block = (instance << proto::kInstanceShift) | block;
  f.name = "kvt1:" + std::to_string(instance) + ":" + std::to_string(block);
  f.namespace_id = 7;
  f.key = BlockKey{instance, block};
  f.tokens = {1, 2, 3};
  return f;
}

Clock::time_point Soon() { return Clock::now() + std::chrono::seconds(5); }

TEST(RemoteG1BackendFetch, OnlyInstancesThatSaidSoFetch) {
  Harness h;
  EXPECT_FALSE(h.backend->CanFetch((3u << proto::kInstanceShift) | 1));
  h.backend->SetFetcher(3, true);
  EXPECT_TRUE(h.backend->CanFetch((3u << proto::kInstanceShift) | 1));
  EXPECT_FALSE(h.backend->CanFetch((4u << proto::kInstanceShift) | 1));
  h.backend->SetFetcher(3, false);
  EXPECT_FALSE(h.backend->CanFetch((3u << proto::kInstanceShift) | 1));

  // Items of an instance that does not fetch end at once, and nothing is sent.
  ASSERT_TRUE(h.backend->Fetch({Item(3, 1), Item(3, 2)}, Soon(), h.Callback()).ok());
  const auto ended = h.Ended();
  ASSERT_EQ(ended.size(), 2u);
  for (const auto& [item, s] : ended) EXPECT_TRUE(s.Is(StatusCode::kUnavailable)) << s.ToString();
  EXPECT_TRUE(h.sent.empty());
}

TEST(RemoteG1BackendFetch, OneFramePerInstanceWithTheEnginesOwnBlockIds) {
  Harness h;
  h.backend->SetFetcher(2, true);
  h.backend->SetFetcher(5, true);
  const auto deadline = Soon();
  ASSERT_TRUE(
      h.backend->Fetch({Item(2, 10), Item(5, 11), Item(2, 12)}, deadline, h.Callback()).ok());
  ASSERT_EQ(h.sent.size(), 2u);
  EXPECT_EQ(h.sent[0].instance, 2u);
  ASSERT_EQ(h.sent[0].call.items.size(), 2u);
  EXPECT_EQ(h.sent[0].call.items[0].g1_block, 10u);  // the instance bits are off
  EXPECT_EQ(h.sent[0].call.items[1].g1_block, 12u);
  EXPECT_EQ(h.sent[0].call.items[1].name, Item(2, 12).name);
  EXPECT_EQ(h.sent[0].call.items[1].tokens, Item(2, 12).tokens);
  EXPECT_EQ(
      h.sent[0].call.deadline_ns,
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count());
  EXPECT_EQ(h.sent[1].instance, 5u);
  ASSERT_EQ(h.sent[1].call.items.size(), 1u);
  EXPECT_NE(h.sent[0].call.batch, h.sent[1].call.batch);
  EXPECT_TRUE(h.Ended().empty());

  // Each answer ends its own items, by the caller's indices, with the engine's statuses.
  proto::FetchDone done;
  done.batch = h.sent[0].call.batch;
  done.statuses = {Status::Ok(), Status::Corruption("bad payload")};
  h.backend->OnFetchDone(2, done);
  auto ended = h.Ended();
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].first, 0u);
  EXPECT_TRUE(ended[0].second.ok());
  EXPECT_EQ(ended[1].first, 2u);
  EXPECT_TRUE(ended[1].second.Is(StatusCode::kCorruption));

  // The same answer again, or one from another instance, is a stray report: nothing ends.
  h.backend->OnFetchDone(2, done);
  proto::FetchDone other;
  other.batch = h.sent[1].call.batch;
  other.statuses = {Status::Ok()};
  h.backend->OnFetchDone(2, other);
  EXPECT_EQ(h.Ended().size(), 2u);
  EXPECT_EQ(h.backend->stats().stray_reports, 2u);
  h.backend->OnFetchDone(5, other);
  ended = h.Ended();
  ASSERT_EQ(ended.size(), 3u);
  EXPECT_EQ(ended[2].first, 1u);
  EXPECT_TRUE(ended[2].second.ok());
  EXPECT_EQ(h.backend->stats().fetch_batches, 2u);
}

TEST(RemoteG1BackendFetch, AnAnswerWithTheWrongCountFailsEveryItem) {
  Harness h;
  h.backend->SetFetcher(1, true);
  ASSERT_TRUE(h.backend->Fetch({Item(1, 1), Item(1, 2)}, Soon(), h.Callback()).ok());
  ASSERT_EQ(h.sent.size(), 1u);
  proto::FetchDone done;
  done.batch = h.sent[0].call.batch;
  done.statuses = {Status::Ok()};  // one status for two blocks
  h.backend->OnFetchDone(1, done);
  const auto ended = h.Ended();
  ASSERT_EQ(ended.size(), 2u);
  for (const auto& [item, s] : ended) {
    EXPECT_TRUE(s.Is(StatusCode::kIOError)) << s.ToString();
    EXPECT_NE(s.message().find("2 blocks with 1 statuses"), std::string::npos) << s.ToString();
  }
}

TEST(RemoteG1BackendFetch, AFrameThatCannotBeQueuedEndsItsItems) {
  Harness h;
  h.backend->SetFetcher(1, true);
  h.refuse = true;
  ASSERT_TRUE(h.backend->Fetch({Item(1, 1)}, Soon(), h.Callback()).ok());
  const auto ended = h.Ended();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_TRUE(ended[0].second.Is(StatusCode::kUnavailable)) << ended[0].second.ToString();
}

TEST(RemoteG1BackendFetch, ADeadEngineEndsItsFetchesAndFetchesNoMore) {
  Harness h;
  h.backend->SetFetcher(1, true);
  h.backend->SetFetcher(2, true);
  ASSERT_TRUE(h.backend->Fetch({Item(1, 1), Item(2, 1)}, Soon(), h.Callback()).ok());
  h.backend->FailInstance(1, Status::Unavailable("engine 1's data connection ended"));
  auto ended = h.Ended();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].first, 0u);
  EXPECT_NE(ended[0].second.message().find("engine 1's"), std::string::npos);
  EXPECT_FALSE(h.backend->CanFetch((1u << proto::kInstanceShift) | 1));
  EXPECT_TRUE(h.backend->CanFetch((2u << proto::kInstanceShift) | 1));
  // Its late answer changes nothing.
  proto::FetchDone late;
  late.batch = h.sent[0].call.batch;
  late.statuses = {Status::Ok()};
  h.backend->OnFetchDone(1, late);
  EXPECT_EQ(h.Ended().size(), 1u);
}

TEST(RemoteG1BackendFetch, AnEngineThatNeverAnswersTimesOutALeaseAfterTheDeadline) {
  Harness h(std::chrono::milliseconds(100));
  h.backend->SetFetcher(1, true);
  const auto t0 = Clock::now();
  ASSERT_TRUE(
      h.backend->Fetch({Item(1, 1), Item(1, 2)}, t0 + std::chrono::milliseconds(50), h.Callback())
          .ok());
  std::vector<std::pair<size_t, Status>> ended;
  while (Clock::now() - t0 < std::chrono::seconds(5)) {
    ended = h.Ended();
    if (ended.size() == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto waited = Clock::now() - t0;
  ASSERT_EQ(ended.size(), 2u);
  for (const auto& [item, s] : ended) EXPECT_TRUE(s.Is(StatusCode::kTimedOut)) << s.ToString();
  EXPECT_GE(waited, std::chrono::milliseconds(150));  // the deadline, then a lease
  EXPECT_EQ(h.backend->stats().fetch_expired, 1u);
}

TEST(RemoteG1BackendFetch, ShutdownEndsWhatIsOpen) {
  Harness h;
  h.backend->SetFetcher(1, true);
  ASSERT_TRUE(h.backend->Fetch({Item(1, 1)}, Soon(), h.Callback()).ok());
  h.backend.reset();
  const auto ended = h.Ended();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_TRUE(ended[0].second.Is(StatusCode::kUnavailable)) << ended[0].second.ToString();
}

// The daemon's side of a kCopy lease (docs/service.md, "Leases"): a load its engine has not
// finished by the deadline fails TimedOut (the engine recomputes); a save never does while the
// engine lives (a slot handed back while the engine may still write it could corrupt the next
// block stored there), so it ends only with the engine's answer.
TEST(RemoteG1BackendCopy, ALateLoadFailsAtItsDeadlineALateSaveWaitsForItsEngine) {
  std::mutex mu;
  std::vector<proto::CopyCall> sent;
  RemoteG1Backend backend(
      [&](uint32_t, const proto::CopyCall& call) {
        std::lock_guard lock(mu);
        sent.push_back(call);
        return Status::Ok();
      },
      std::chrono::milliseconds(50), 4);
  std::vector<uint8_t> g2(1 << 16);
  ASSERT_TRUE(backend.RegisterHost(g2.data(), g2.size()).ok());
  struct Ending {
    std::mutex mu;
    bool done = false;
    Status status;
  };
  Ending load, save;
  auto submit = [&](CopyDirection dir, Ending* end) {
    const DeviceBlockCopy copy{(1u << proto::kInstanceShift) | 3, g2.data() + 8192};
    return backend.Submit(
        dir, {&copy, 1}, [](uint32_t) {},
        [end](const Status& s) {
          std::lock_guard lock(end->mu);
          end->done = true;
          end->status = s;
        },
        dir == CopyDirection::kHostToDevice);
  };
  auto ended = [](Ending& e) {
    std::lock_guard lock(e.mu);
    return e.done;
  };
  const auto t0 = Clock::now();
  ASSERT_TRUE(submit(CopyDirection::kHostToDevice, &load).ok());
  ASSERT_TRUE(submit(CopyDirection::kDeviceToHost, &save).ok());
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].dir, 1u);  // the load
  EXPECT_EQ(sent[1].dir, 0u);  // the save
  while (!ended(load) && Clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(ended(load)) << "a load its engine never finished did not fail at its deadline";
  EXPECT_TRUE(load.status.Is(StatusCode::kTimedOut)) << load.status.ToString();
  EXPECT_EQ(backend.stats().lease_expired, 1u);
  // Four more leases: the save is still the engine's.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(ended(save)) << "a live engine's save was failed at its deadline: "
                            << save.status.ToString();
  // The engine answers: the save ends with its answer, Ok, late as it is.
  backend.OnDone(1, sent[1].batch, Status::Ok());
  ASSERT_TRUE(ended(save));
  EXPECT_TRUE(save.status.ok()) << save.status.ToString();
  EXPECT_EQ(backend.stats().lease_expired, 1u);
}

// The engine's side of the lease rule: Barrier waits for the G1 writes begun before it, and
// only for those (a stream of later fetches must not starve it).
TEST(CopyGateTest, BarrierWaitsForEarlierPassesOnly) {
  client::CopyGate gate;
  gate.Barrier();  // nothing in progress: at once
  auto first = std::make_unique<client::CopyGate::Pass>(gate);
  std::atomic<bool> returned{false};
  std::future<void> barrier = std::async(std::launch::async, [&] {
    gate.Barrier();
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned) << "Barrier returned while an earlier pass was in progress";
  // A pass begun after the barrier does not hold it up, and passes never wait for each other.
  client::CopyGate::Pass later(gate);
  first.reset();
  ASSERT_EQ(barrier.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_TRUE(returned);
}

}  // namespace
}  // namespace kvtier::daemon

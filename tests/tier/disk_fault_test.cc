// DiskTier under injected faults (FaultInjectingIo): silent corruption is never served, I/O
// errors and ENOSPC quarantine the tier, a quarantined tier fails fast and comes back after a
// probe, short transfers are resumed, stuck I/O is noticed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "disk_test_util.h"
#include "tier/block_format.h"
#include "tier/disk_tier.h"
#include "tier/fault_injecting_io.h"

namespace kvtier {
namespace {

using namespace kvtier::testing;

constexpr uint64_t kPayload = 28672;  // 7 pages: 8-page slots, room for torn writes

struct FaultyTier {
  DiskTier::Opened opened;
  FaultInjectingIo* faults = nullptr;
  DiskTier* tier() { return opened.tier.get(); }
};

FaultyTier OpenFaulty(const DiskTier::Config& config) {
  FaultyTier f;
  DiskTier::OpenOptions options;
  options.wrap_io = [&f](std::unique_ptr<DiskIo> io) {
    auto w = std::make_unique<FaultInjectingIo>(std::move(io));
    f.faults = w.get();
    return w;
  };
  f.opened = OpenOrDie(config, options);
  return f;
}

// The bar: 1,000 injected bit flips and torn writes, 0 corrupt blocks served. Every
// block that the tier serves is compared byte for byte with what was written, independently of
// the tier's own checksums.
TEST(DiskFaults, ThousandBitFlipsAndTornWritesServeNothingCorrupt) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 64);
  config.quarantine_after_errors = 1u << 30;  // this test is about verification, not quarantine
  FaultyTier f = OpenFaulty(config);
  DiskTier* tier = f.tier();
  FaultPlan plan;
  plan.torn_write = 0.15;
  plan.write_bit_flip = 0.15;
  plan.read_bit_flip = 0.15;
  plan.seed = 20240611;
  f.faults->SetPlan(plan);

  const uint32_t kBatch = 64;
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  for (uint32_t i = 0; i < kBatch; ++i)
    bufs.push_back(std::make_unique<AlignedBuffer>(tier->io_bytes()));
  std::vector<std::vector<TokenId>> tokens(kBatch);
  uint64_t served = 0, served_wrong = 0, rejected = 0, next = 0;
  DiskOpWaiter waiter;
  for (int round = 0; f.faults->counts().silent() < 1000; ++round) {
    ASSERT_LT(round, 200) << "too few faults injected";
    // Fill the tier with fresh blocks in one batch...
    std::vector<DiskWriteRequest> writes(kBatch);
    const uint64_t first = next;
    for (uint32_t b = 0; b < kBatch; ++b, ++next) {
      writes[b] = TestWrite(next, tokens[b], bufs[b]->data(), kPayload, &waiter, next);
    }
    tier->SubmitWrites(writes);
    for (const DiskOpResult& r : waiter.Take(kBatch))
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    // ...read them all back in one batch (into zeroed buffers)...
    std::vector<DiskReadRequest> reads(kBatch);
    for (uint32_t b = 0; b < kBatch; ++b) {
      std::memset(bufs[b]->data(), 0, tier->io_bytes());
      reads[b] = TestRead(first + b, tokens[b], bufs[b]->data(), &waiter);
      reads[b].cookie = b;
    }
    tier->SubmitReads(reads);
    for (const DiskOpResult& r : waiter.Take(kBatch)) {
      if (r.status.ok()) {
        ++served;
        if (!TestPayloadMatches(first + r.cookie, bufs[r.cookie]->data() + kBlockHeaderBytes,
                                kPayload)) {
          ++served_wrong;
        }
      } else {
        ASSERT_TRUE(r.status.Is(StatusCode::kCorruption)) << r.status.ToString();
        ++rejected;
      }
    }
    // ...and empty it for the next round (failed reads freed their slots already).
    for (uint32_t b = 0; b < kBatch; ++b) (void)tier->Remove(TestKey(first + b));
  }
  const FaultCounts injected = f.faults->counts();
  const DiskTierStats s = tier->stats();
  EXPECT_GE(injected.silent(), 1000u);
  EXPECT_EQ(served_wrong, 0u) << "corrupt blocks served";
  EXPECT_GT(served, 0u);
  EXPECT_EQ(s.verify_failures, rejected);
  EXPECT_EQ(s.slots_dropped, rejected);
  EXPECT_EQ(s.free_slots, s.slots) << "every slot came back";
  // Almost every silent fault is caught (a torn write that tore nothing new is harmless: the
  // reads that pass are byte-exact, as checked above).
  EXPECT_GE(rejected, injected.silent() * 9 / 10)
      << "torn " << injected.torn_writes << " flips " << injected.write_bit_flips << "+"
      << injected.read_bit_flips;
  EXPECT_GT(s.verify_failures_by_check[static_cast<size_t>(BlockCheck::kBadPayload)], 0u);
  EXPECT_GT(s.verify_failures_by_check[static_cast<size_t>(BlockCheck::kBadHeader)], 0u);
  EXPECT_FALSE(s.quarantined);
}

void ExpectQuarantinedByWrites(int err, StatusCode code) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 16);
  config.quarantine_after_errors = 3;
  config.reprobe_interval_ms = 3'600'000;  // probes only when the test asks
  FaultyTier f = OpenFaulty(config);
  DiskTier* tier = f.tier();
  AlignedBuffer buf(tier->io_bytes());
  ASSERT_TRUE(WriteBlock(tier, 100, buf.data()).ok());

  f.faults->FailNext(IoKind::kWrite, err, 3);
  for (uint64_t i = 0; i < 3; ++i) {
    Status s = WriteBlock(tier, i, buf.data());
    EXPECT_TRUE(s.Is(code)) << s.ToString();
    EXPECT_FALSE(tier->Contains(TestKey(i)));
  }
  DiskTierStats s = tier->stats();
  EXPECT_TRUE(s.quarantined);
  EXPECT_EQ(s.quarantines, 1u);
  EXPECT_EQ(s.write_errors, 3u);
  EXPECT_EQ(err == ENOSPC ? s.enospc_errors : s.eio_errors, 3u);
  EXPECT_NE(s.quarantine_reason.find("3 error(s) in a row"), std::string::npos)
      << s.quarantine_reason;
  EXPECT_EQ(s.free_slots, 15u) << "failed writes gave their slots back";

  // Quarantined: fail fast, without touching the device.
  const uint64_t forwarded =
      f.faults->forwarded(IoKind::kWrite) + f.faults->forwarded(IoKind::kRead);
  EXPECT_TRUE(WriteBlock(tier, 7, buf.data()).Is(StatusCode::kUnavailable));
  EXPECT_TRUE(ReadBlock(tier, 100, buf.data()).Is(StatusCode::kUnavailable));
  EXPECT_EQ(f.faults->forwarded(IoKind::kWrite) + f.faults->forwarded(IoKind::kRead), forwarded);

  // The device still fails: the probe says so and the tier stays out.
  f.faults->FailNext(IoKind::kWrite, err, 1);
  EXPECT_FALSE(tier->ProbeNow().ok());
  EXPECT_TRUE(tier->quarantined());
  // It works again: back in service, and the block written before is still served.
  ASSERT_TRUE(tier->ProbeNow().ok());
  EXPECT_FALSE(tier->quarantined());
  bool wrong = true;
  ASSERT_TRUE(ReadBlock(tier, 100, buf.data(), &wrong).ok());
  EXPECT_FALSE(wrong);
  ASSERT_TRUE(WriteBlock(tier, 7, buf.data()).ok());
  s = tier->stats();
  EXPECT_EQ(s.probes, 2u);
  EXPECT_EQ(s.probes_ok, 1u);
  EXPECT_EQ(s.consecutive_errors, 0u);
}

TEST(DiskFaults, EioOnWritesQuarantines) { ExpectQuarantinedByWrites(EIO, StatusCode::kIOError); }

TEST(DiskFaults, EnospcOnWritesQuarantines) {
  ExpectQuarantinedByWrites(ENOSPC, StatusCode::kNoSpace);
}

TEST(DiskFaults, OneReadErrorIsAMissNotALoss) {
  TempDir dir;
  FaultyTier f = OpenFaulty(TestConfig(dir.path(), kPayload, 4));
  AlignedBuffer buf(f.tier()->io_bytes());
  ASSERT_TRUE(WriteBlock(f.tier(), 0, buf.data()).ok());
  f.faults->FailNext(IoKind::kRead, EIO, 1);
  EXPECT_TRUE(ReadBlock(f.tier(), 0, buf.data()).Is(StatusCode::kIOError));
  EXPECT_TRUE(f.tier()->Contains(TestKey(0))) << "EIO may be transient: the block is kept";
  ASSERT_TRUE(ReadBlock(f.tier(), 0, buf.data()).ok());
  const DiskTierStats s = f.tier()->stats();
  EXPECT_EQ(s.read_errors, 1u);
  EXPECT_EQ(s.eio_errors, 1u);
  EXPECT_FALSE(s.quarantined);
}

TEST(DiskFaults, EioOnReadsQuarantinesAndReprobesByItself) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 4);
  config.quarantine_after_errors = 2;
  config.reprobe_interval_ms = 50;
  FaultyTier f = OpenFaulty(config);
  AlignedBuffer buf(f.tier()->io_bytes());
  ASSERT_TRUE(WriteBlock(f.tier(), 0, buf.data()).ok());
  f.faults->FailNext(IoKind::kRead, EIO, 2);
  EXPECT_TRUE(ReadBlock(f.tier(), 0, buf.data()).Is(StatusCode::kIOError));
  EXPECT_TRUE(ReadBlock(f.tier(), 0, buf.data()).Is(StatusCode::kIOError));
  EXPECT_TRUE(f.tier()->quarantined());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (f.tier()->quarantined() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(f.tier()->quarantined()) << "the periodic probe brought it back";
  EXPECT_GE(f.tier()->stats().probes_ok, 1u);
  ASSERT_TRUE(ReadBlock(f.tier(), 0, buf.data()).ok());
}

TEST(DiskFaults, RepeatedCorruptionQuarantines) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 8);
  config.quarantine_after_errors = 3;
  config.reprobe_interval_ms = 3'600'000;
  FaultyTier f = OpenFaulty(config);
  AlignedBuffer buf(f.tier()->io_bytes());
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(WriteBlock(f.tier(), i, buf.data()).ok());
  FaultPlan flips;
  flips.read_bit_flip = 1.0;
  f.faults->SetPlan(flips);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(ReadBlock(f.tier(), i, buf.data()).Is(StatusCode::kCorruption));
  }
  const DiskTierStats s = f.tier()->stats();
  EXPECT_TRUE(s.quarantined);
  EXPECT_EQ(s.verify_failures, 3u);
  EXPECT_NE(s.quarantine_reason.find("failed verification"), std::string::npos);
  EXPECT_TRUE(ReadBlock(f.tier(), 3, buf.data()).Is(StatusCode::kUnavailable));
}

TEST(DiskFaults, ShortTransfersAreResumed) {
  TempDir dir;
  FaultyTier f = OpenFaulty(TestConfig(dir.path(), kPayload, 16));
  DiskTier* tier = f.tier();
  FaultPlan plan;
  plan.short_read = 0.5;
  plan.short_write = 0.5;
  f.faults->SetPlan(plan);
  AlignedBuffer buf(tier->io_bytes());
  uint64_t ok_writes = 0, served = 0;
  for (uint64_t i = 0; i < 16; ++i) {
    Status w = WriteBlock(tier, i, buf.data());
    // A short write of 0 bytes cannot be resumed: an error, the slot is given back.
    if (!w.ok()) {
      EXPECT_TRUE(w.Is(StatusCode::kIOError)) << w.ToString();
      EXPECT_NE(w.message().find("stopped short"), std::string::npos);
      continue;
    }
    ++ok_writes;
    bool wrong = true;
    Status r = ReadBlock(tier, i, buf.data(), &wrong);
    if (r.ok()) {
      ++served;
      EXPECT_FALSE(wrong);
    } else {
      EXPECT_TRUE(r.Is(StatusCode::kIOError)) << r.ToString();
    }
  }
  const DiskTierStats s = tier->stats();
  EXPECT_GT(ok_writes, 0u);
  EXPECT_GT(served, 0u);
  EXPECT_GT(s.short_transfers, 0u);
  EXPECT_EQ(s.verify_failures, 0u) << "resumed transfers put every byte in place";
}

TEST(DiskFaults, StuckIoQuarantines) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 4);
  config.io_timeout_ms = 50;
  config.reprobe_interval_ms = 3'600'000;
  FaultyTier f = OpenFaulty(config);
  AlignedBuffer buf(f.tier()->io_bytes());
  ASSERT_TRUE(WriteBlock(f.tier(), 0, buf.data()).ok());
  FaultPlan stall;
  stall.stall = 1.0;
  f.faults->SetPlan(stall);
  const std::vector<TokenId> tokens = TestTokens(0);
  DiskOpWaiter waiter;
  DiskReadRequest r = TestRead(0, tokens, buf.data(), &waiter);
  f.tier()->SubmitReads({&r, 1});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!f.tier()->quarantined() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  DiskTierStats s = f.tier()->stats();
  EXPECT_TRUE(s.quarantined);
  EXPECT_EQ(s.stuck_ios, 1u);
  EXPECT_NE(s.quarantine_reason.find("has not completed"), std::string::npos);
  f.faults->SetPlan(FaultPlan{});
  f.faults->ReleaseStalled();
  EXPECT_TRUE(waiter.Take(1)[0].status.ok()) << "the late read still completes, verified";
  EXPECT_TRUE(f.tier()->ProbeNow().ok());
  EXPECT_FALSE(f.tier()->quarantined());
}

TEST(DiskFaults, QuarantineFailsQueuedRequests) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 32);
  config.queue_depth = 1;
  config.quarantine_after_errors = 1;
  config.reprobe_interval_ms = 3'600'000;
  FaultyTier f = OpenFaulty(config);
  DiskTier* tier = f.tier();
  f.faults->FailNext(IoKind::kWrite, EIO, 1);
  DiskOpWaiter waiter;
  const std::vector<TokenId> tokens = TestTokens(0);
  TestWriteBatch batch = MakeTestWriteBatch(*tier, 8, tokens, &waiter);
  tier->SubmitWrites(batch.writes);
  size_t io_errors = 0, unavailable = 0;
  for (const DiskOpResult& r : waiter.Take(8)) {
    io_errors += r.status.Is(StatusCode::kIOError);
    unavailable += r.status.Is(StatusCode::kUnavailable);
  }
  EXPECT_EQ(io_errors, 1u);
  EXPECT_EQ(unavailable, 7u) << "queued requests fail fast once quarantined";
  EXPECT_EQ(tier->stats().free_slots, 32u);
  EXPECT_EQ(f.faults->forwarded(IoKind::kWrite), 0u) << "nothing reached the device";
}

TEST(DiskFaults, EngineFailureQuarantines) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 4);
  config.reprobe_interval_ms = 3'600'000;
  FaultyTier f = OpenFaulty(config);
  f.faults->FailNextPoll();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!f.tier()->quarantined() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const DiskTierStats s = f.tier()->stats();
  EXPECT_TRUE(s.quarantined);
  EXPECT_NE(s.quarantine_reason.find("I/O engine failed"), std::string::npos)
      << s.quarantine_reason;
  ASSERT_TRUE(f.tier()->ProbeNow().ok());
  AlignedBuffer buf(f.tier()->io_bytes());
  ASSERT_TRUE(WriteBlock(f.tier(), 0, buf.data()).ok());
}

TEST(DiskFaults, ReadErrorsDuringTheOpenScanFreeThoseSlots) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 16);
  config.snapshot_on_close = false;
  ASSERT_NO_FATAL_FAILURE(WriteBlocksAndClose(config, 10));
  DiskTier::OpenOptions options;
  options.wrap_io = [](std::unique_ptr<DiskIo> io) {
    auto w = std::make_unique<FaultInjectingIo>(std::move(io));
    w->FailNext(IoKind::kRead, EIO, 3);  // the scan's first three header reads
    return w;
  };
  auto opened = OpenOrDie(config, options);
  const DiskTierStats s = opened.tier->stats();
  EXPECT_EQ(s.scan_read_errors, 3u);
  EXPECT_EQ(opened.recovered.size(), 7u);
  EXPECT_EQ(s.free_slots, 9u);
  AlignedBuffer buf(opened.tier->io_bytes());
  for (const RecoveredBlock& b : opened.recovered) {
    bool wrong = true;
    ASSERT_TRUE(ReadBlock(opened.tier.get(), b.tokens[0] / 131, buf.data(), &wrong).ok());
    EXPECT_FALSE(wrong);
  }
}

// A DiskIo that, just before it starts a read of (file, offset), lets the test rewrite those
// bytes on the device: a write that overtakes a read already issued for the slot's old
// generation (another process writing the file, a device reordering writes).
class OvertakingWriteIo final : public DiskIo {
 public:
  using Hook = std::function<void(const IoRequest&)>;
  OvertakingWriteIo(std::unique_ptr<DiskIo> inner, Hook before_read)
      : inner_(std::move(inner)), before_read_(std::move(before_read)) {}
  uint32_t queue_depth() const override { return inner_->queue_depth(); }
  void Queue(const IoRequest& r) override {
    if (r.kind == IoKind::kRead) before_read_(r);
    inner_->Queue(r);
  }
  Result<size_t> Poll(int timeout_ms, std::vector<IoCompletion>* out) override {
    return inner_->Poll(timeout_ms, out);
  }
  void Wake() override { inner_->Wake(); }
  Status RegisterBuffers(std::span<const iovec> regions) override {
    return inner_->RegisterBuffers(regions);
  }
  bool buffers_registered() const override { return inner_->buffers_registered(); }
  std::string name() const override { return "overtaking(" + inner_->name() + ")"; }

 private:
  std::unique_ptr<DiskIo> inner_;
  Hook before_read_;
};

// A read of a slot's generation g that finds generation g+1 there (same key, slot, tokens and
// a valid checksum, but other bytes) must not serve it: only the write generation tells them
// apart, so this fails if the read's generation check is switched off.
TEST(DiskFaults, AReadNeverServesANewerGenerationThatOvertookIt) {
  TempDir dir;
  const DiskTier::Config config = TestConfig(dir.path(), kPayload, 4);
  std::vector<uint8_t> newer;  // the overtaking write's bytes, set once the slot is known
  uint64_t target_offset = UINT64_MAX;
  int overtaken = 0;
  DiskTier::OpenOptions options;
  options.wrap_io = [&](std::unique_ptr<DiskIo> io) -> std::unique_ptr<DiskIo> {
    return std::make_unique<OvertakingWriteIo>(std::move(io), [&](const IoRequest& r) {
      if (r.file != 0 || r.offset != target_offset || newer.empty()) return;
      const int fd = ::open(dir.sub("g3-0000.kvt").c_str(), O_WRONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::pwrite(fd, newer.data(), newer.size(), static_cast<off_t>(r.offset)),
                static_cast<ssize_t>(newer.size()));
      ::fdatasync(fd);
      ::close(fd);
      ++overtaken;
    });
  };
  auto opened = OpenOrDie(config, options);
  DiskTier* tier = opened.tier.get();
  AlignedBuffer buf(tier->io_bytes());
  ASSERT_TRUE(WriteBlock(tier, 0, buf.data()).ok());
  // Slot 0 (the first free slot) holds block 0 at some generation g.
  target_offset = tier->geometry().OffsetOf(0);
  {
    AlignedBuffer probe(tier->io_bytes());
    const int fd = ::open(dir.sub("g3-0000.kvt").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pread(fd, probe.data(), kBlockHeaderBytes, static_cast<off_t>(target_offset)),
              static_cast<ssize_t>(kBlockHeaderBytes));
    ::close(fd);
    DecodedBlockHeader h;
    ASSERT_EQ(DecodeBlockHeader({probe.data(), kBlockHeaderBytes}, &h), BlockCheck::kOk);
    ASSERT_EQ(h.fields.key, TestKey(0));
    ASSERT_EQ(h.fields.slot_index, 0u);
    // Generation g + 1 of the same key in the same slot, with other payload bytes.
    newer.assign(tier->io_bytes(), 0);
    std::vector<uint8_t> payload(kPayload);
    FillTestPayload(1, payload.data(), kPayload);
    std::copy(payload.begin(), payload.end(), newer.begin() + kBlockHeaderBytes);
    BlockHeaderFields f = h.fields;
    f.write_generation = h.fields.write_generation + 1;
    const std::vector<TokenId> tokens = TestTokens(0);
    ASSERT_TRUE(EncodeBlockHeader(f, tokens, kPayload, PayloadChecksum(payload.data(), kPayload),
                                  newer.data())
                    .ok());
  }
  bool wrong = false;
  const Status r = ReadBlock(tier, 0, buf.data(), &wrong);
  EXPECT_EQ(overtaken, 1);
  EXPECT_TRUE(r.Is(StatusCode::kCorruption)) << r.ToString();
  EXPECT_FALSE(wrong && r.ok()) << "the overtaking generation was served";
  EXPECT_EQ(
      tier->stats().verify_failures_by_check[static_cast<size_t>(BlockCheck::kWrongGeneration)],
      1u);
  EXPECT_FALSE(tier->Contains(TestKey(0))) << "the slot is dropped, never served";
}

}  // namespace
}  // namespace kvtier

// DiskTier: the request API, the slot state machine, configuration, files and admission.
#include "tier/disk_tier.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "disk_test_util.h"
#include "tier/fault_injecting_io.h"
#include "tier/host_arena.h"

namespace kvtier {
namespace {

using namespace kvtier::testing;

constexpr uint64_t kPayload = 12288;  // 3 pages: slot = 4 pages

// Open options that wrap the tier's I/O in a FaultInjectingIo, left in `*faults`.
DiskTier::OpenOptions WrapInFaults(FaultInjectingIo** faults) {
  DiskTier::OpenOptions options;
  options.wrap_io = [faults](std::unique_ptr<DiskIo> io) {
    auto w = std::make_unique<FaultInjectingIo>(std::move(io));
    *faults = w.get();
    return w;
  };
  return options;
}

class DiskTierBackends : public ::testing::TestWithParam<IoBackend> {};

TEST_P(DiskTierBackends, WriteThenReadEveryBlock) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 64);
  config.io_backend = GetParam();
  auto opened = OpenOrDie(config);
  DiskTier* tier = opened.tier.get();
  EXPECT_TRUE(opened.recovered.empty());
  ASSERT_EQ(tier->num_slots(), 64u);
  ASSERT_EQ(tier->io_bytes(), 16384u);
  EXPECT_EQ(tier->stats().io_backend, GetParam() == IoBackend::kThreads ? "threads" : "io_uring");

  // Batched: all 64 writes submitted in one call, each from its own buffer.
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  std::vector<std::vector<TokenId>> tokens;
  std::vector<DiskWriteRequest> writes;
  DiskOpWaiter waiter;
  for (uint64_t i = 0; i < 64; ++i) {
    bufs.push_back(std::make_unique<AlignedBuffer>(tier->io_bytes()));
    FillTestPayload(i, bufs.back()->data() + kBlockHeaderBytes, kPayload);
    tokens.push_back(TestTokens(i));
  }
  for (uint64_t i = 0; i < 64; ++i) {
    DiskWriteRequest r;
    r.key = TestKey(i);
    r.parent = TestParent(i);
    r.namespace_id = kTestNamespace;
    r.tokens = tokens[i];
    r.buffer = bufs[i]->data();
    r.sink = &waiter;
    r.cookie = i;
    writes.push_back(r);
  }
  tier->SubmitWrites(writes);
  for (const DiskOpResult& r : waiter.Take(64)) {
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_TRUE(tier->Contains(TestKey(r.cookie)));
  }
  for (uint64_t i = 0; i < 64; ++i) {
    AlignedBuffer out(tier->io_bytes());
    bool wrong = true;
    ASSERT_TRUE(ReadBlock(tier, i, out.data(), &wrong).ok());
    EXPECT_FALSE(wrong) << i;
  }
  const DiskTierStats s = tier->stats();
  EXPECT_EQ(s.writes_completed, 64u);
  EXPECT_EQ(s.reads_served, 64u);
  EXPECT_EQ(s.blocks, 64u);
  EXPECT_EQ(s.free_slots, 0u);
  EXPECT_EQ(s.verify_failures, 0u);
  EXPECT_EQ(s.bytes_written, 64u * tier->io_bytes());
}

INSTANTIATE_TEST_SUITE_P(Backends, DiskTierBackends,
                         ::testing::Values(IoBackend::kUring, IoBackend::kThreads),
                         [](const auto& info) {
                           return std::string(info.param == IoBackend::kUring ? "Uring"
                                                                              : "Threads");
                         });

TEST(DiskTier, ConfigValidationNamesTheField) {
  TempDir dir;
  auto check = [&](auto mutate, const char* field) {
    DiskTier::Config c = TestConfig(dir.path(), kPayload, 4);
    mutate(c);
    Status s = c.Validate();
    EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument)) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
    EXPECT_FALSE(DiskTier::Open(c).ok());
  };
  check([](auto& c) { c.payload_bytes = 0; }, "payload_bytes");
  check([](auto& c) { c.queue_depth = 0; }, "queue_depth");
  check([](auto& c) { c.queue_depth = 5000; }, "queue_depth");
  check([](auto& c) { c.max_queued = 1; }, "max_queued");
  check([](auto& c) { c.num_files = 0; }, "num_files");
  check([](auto& c) { c.quarantine_after_errors = 0; }, "quarantine_after_errors");
  check([](auto& c) { c.capacity_bytes = 4096; }, "capacity_bytes");
  check([](auto& c) { c.admission.min_seen = 0; }, "min_seen");
  check([](auto& c) { c.dir = ""; }, "dir");
  EXPECT_TRUE(TestConfig(dir.path(), kPayload, 4).Validate().ok());
}

TEST(DiskTier, FilesArePrivateAndPreallocated) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.sub("g3"), kPayload, 32);
  config.num_files = 2;
  auto opened = OpenOrDie(config);
  struct stat st;
  ASSERT_EQ(stat(dir.sub("g3").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  for (const char* f : {"g3-0000.kvt", "g3-0001.kvt"}) {
    ASSERT_EQ(stat((dir.sub("g3") + "/" + f).c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << f;
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), opened.tier->geometry().file_bytes());
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, opened.tier->geometry().file_bytes())
        << "fallocate reserved the space";
  }
  EXPECT_FALSE(opened.tier->stats().sparse_files);
  // Slots alternate between the two files.
  EXPECT_EQ(opened.tier->geometry().FileOf(0), 0u);
  EXPECT_EQ(opened.tier->geometry().FileOf(1), 1u);
  AlignedBuffer buf(opened.tier->io_bytes());
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(WriteBlock(opened.tier.get(), i, buf.data()).ok());
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(ReadBlock(opened.tier.get(), i, buf.data()).ok());
}

TEST(DiskTier, SparseWhenPreallocationIsOff) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 32);
  config.preallocate = false;
  auto opened = OpenOrDie(config);
  EXPECT_TRUE(opened.tier->stats().sparse_files);
  struct stat st;
  ASSERT_EQ(stat(dir.sub("g3-0000.kvt").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), opened.tier->geometry().file_bytes());
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, opened.tier->geometry().file_bytes());
  AlignedBuffer buf(opened.tier->io_bytes());
  ASSERT_TRUE(WriteBlock(opened.tier.get(), 1, buf.data()).ok());
  ASSERT_TRUE(ReadBlock(opened.tier.get(), 1, buf.data()).ok());
}

TEST(DiskTier, SecondProcessOrOpenIsRefused) {
  TempDir dir;
  auto first = OpenOrDie(TestConfig(dir.path(), kPayload, 4));
  auto second = DiskTier::Open(TestConfig(dir.path(), kPayload, 4));
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(second.status().Is(StatusCode::kFailedPrecondition)) << second.status().ToString();
  EXPECT_NE(second.status().message().find("in use"), std::string::npos);
}

TEST(DiskTier, MissDuplicateFullAndRemove) {
  TempDir dir;
  auto opened = OpenOrDie(TestConfig(dir.path(), kPayload, 2));
  DiskTier* tier = opened.tier.get();
  AlignedBuffer buf(tier->io_bytes());
  EXPECT_TRUE(ReadBlock(tier, 0, buf.data()).Is(StatusCode::kNotFound));
  ASSERT_TRUE(WriteBlock(tier, 0, buf.data()).ok());
  EXPECT_TRUE(WriteBlock(tier, 0, buf.data()).Is(StatusCode::kAlreadyExists));
  ASSERT_TRUE(WriteBlock(tier, 1, buf.data()).ok());
  EXPECT_TRUE(WriteBlock(tier, 2, buf.data()).Is(StatusCode::kResourceExhausted));
  EXPECT_TRUE(tier->Remove(TestKey(5)).Is(StatusCode::kNotFound));
  ASSERT_TRUE(tier->Remove(TestKey(0)).ok());
  EXPECT_FALSE(tier->Contains(TestKey(0)));
  EXPECT_TRUE(ReadBlock(tier, 0, buf.data()).Is(StatusCode::kNotFound));
  ASSERT_TRUE(WriteBlock(tier, 2, buf.data()).ok());
  bool wrong = true;
  ASSERT_TRUE(ReadBlock(tier, 2, buf.data(), &wrong).ok());
  EXPECT_FALSE(wrong);
  const DiskTierStats s = tier->stats();
  EXPECT_EQ(s.read_misses, 2u);
  EXPECT_EQ(s.writes_rejected, 2u);
  EXPECT_EQ(s.blocks, 2u);
}

TEST(DiskTier, BadBuffersAreRejected) {
  TempDir dir;
  auto opened = OpenOrDie(TestConfig(dir.path(), kPayload, 4));
  AlignedBuffer buf(opened.tier->io_bytes() + 4096);
  EXPECT_TRUE(WriteBlock(opened.tier.get(), 0, buf.data() + 512).Is(StatusCode::kInvalidArgument));
  ASSERT_TRUE(WriteBlock(opened.tier.get(), 0, buf.data()).ok());
  EXPECT_TRUE(ReadBlock(opened.tier.get(), 0, buf.data() + 8).Is(StatusCode::kInvalidArgument));
  // Tokens that cannot be stored: the slot is given back.
  std::vector<TokenId> tokens(2000, 1);
  DiskOpWaiter waiter;
  DiskWriteRequest r;
  r.key = TestKey(9);
  r.tokens = tokens;
  r.buffer = buf.data();
  r.sink = &waiter;
  opened.tier->SubmitWrites({&r, 1});
  EXPECT_TRUE(waiter.Take(1)[0].status.Is(StatusCode::kInvalidArgument));
  EXPECT_EQ(opened.tier->stats().free_slots, 3u);
  EXPECT_FALSE(opened.tier->Contains(TestKey(9)));
}

TEST(DiskTier, ForeignTokensOrNamespaceAreAMissAndFreeTheSlot) {
  TempDir dir;
  auto opened = OpenOrDie(TestConfig(dir.path(), kPayload, 4));
  DiskTier* tier = opened.tier.get();
  AlignedBuffer buf(tier->io_bytes());
  ASSERT_TRUE(WriteBlock(tier, 0, buf.data()).ok());
  ASSERT_TRUE(WriteBlock(tier, 1, buf.data()).ok());

  const std::vector<TokenId> other = TestTokens(99);  // a colliding key's tokens
  DiskOpWaiter waiter;
  DiskReadRequest r = TestRead(0, other, buf.data(), &waiter);
  tier->SubmitReads({&r, 1});
  Status s = waiter.Take(1)[0].status;
  EXPECT_TRUE(s.Is(StatusCode::kCorruption)) << s.ToString();
  EXPECT_NE(s.message().find("wrong-tokens"), std::string::npos);
  EXPECT_FALSE(tier->Contains(TestKey(0)));

  const std::vector<TokenId> mine = TestTokens(1);
  r.key = TestKey(1);
  r.namespace_id = kTestNamespace + 1;
  r.expected_tokens = mine;
  tier->SubmitReads({&r, 1});
  EXPECT_TRUE(waiter.Take(1)[0].status.Is(StatusCode::kCorruption));
  const DiskTierStats st = tier->stats();
  EXPECT_EQ(st.verify_failures, 2u);
  EXPECT_EQ(st.verify_failures_by_check[static_cast<size_t>(BlockCheck::kWrongTokens)], 1u);
  EXPECT_EQ(st.verify_failures_by_check[static_cast<size_t>(BlockCheck::kWrongNamespace)], 1u);
  EXPECT_EQ(st.slots_dropped, 2u);
  EXPECT_EQ(st.free_slots, 4u);
  EXPECT_EQ(st.consecutive_errors, 0u) << "a caller-side mismatch is not a device error";
}

// A slot being read is pinned: Remove makes the block unreachable at once, but the slot is not
// rewritten before the read finishes, so the read still returns the block it started on.
TEST(DiskTier, RemoveDuringReadDefersSlotReuse) {
  TempDir dir;
  FaultInjectingIo* faults = nullptr;
  const DiskTier::OpenOptions options = WrapInFaults(&faults);
  auto opened = OpenOrDie(TestConfig(dir.path(), kPayload, 1), options);
  DiskTier* tier = opened.tier.get();
  AlignedBuffer wbuf(tier->io_bytes()), rbuf(tier->io_bytes());
  ASSERT_TRUE(WriteBlock(tier, 0, wbuf.data()).ok());

  FaultPlan stall;
  stall.stall = 1.0;
  faults->SetPlan(stall);
  const std::vector<TokenId> tokens = TestTokens(0);
  DiskOpWaiter read_waiter;
  DiskReadRequest r = TestRead(0, tokens, rbuf.data(), &read_waiter);
  tier->SubmitReads({&r, 1});
  while (faults->counts().stalls == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  faults->SetPlan(FaultPlan{});

  ASSERT_TRUE(tier->Remove(TestKey(0)).ok());
  EXPECT_FALSE(tier->Contains(TestKey(0)));
  EXPECT_EQ(tier->stats().free_slots, 0u) << "pinned by the read";
  EXPECT_TRUE(WriteBlock(tier, 1, wbuf.data()).Is(StatusCode::kResourceExhausted));

  faults->ReleaseStalled();
  Status s = read_waiter.Take(1)[0].status;
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(TestPayloadMatches(0, rbuf.data() + kBlockHeaderBytes, kPayload));
  EXPECT_EQ(tier->stats().free_slots, 1u);
  ASSERT_TRUE(WriteBlock(tier, 1, wbuf.data()).ok());
  EXPECT_TRUE(tier->Remove(TestKey(1)).ok());
}

TEST(DiskTier, FullQueueDropsRequests) {
  TempDir dir;
  FaultInjectingIo* faults = nullptr;
  const DiskTier::OpenOptions options = WrapInFaults(&faults);
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 64);
  config.queue_depth = 2;
  config.max_queued = 4;
  auto opened = OpenOrDie(config, options);
  DiskTier* tier = opened.tier.get();
  FaultPlan stall;
  stall.stall = 1.0;
  faults->SetPlan(stall);
  DiskOpWaiter waiter;
  const std::vector<TokenId> tokens = TestTokens(0);
  TestWriteBatch batch = MakeTestWriteBatch(*tier, 12, tokens, &waiter);
  tier->SubmitWrites(batch.writes);
  // 4 accepted; the other 8 are dropped at once, never waited for.
  auto dropped = waiter.Take(8);
  for (const DiskOpResult& r : dropped) {
    EXPECT_TRUE(r.status.Is(StatusCode::kResourceExhausted)) << r.status.ToString();
  }
  faults->SetPlan(FaultPlan{});
  faults->ReleaseStalled();
  auto done = waiter.Take(4);
  for (const DiskOpResult& r : done) EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(tier->stats().blocks, 4u);
  EXPECT_EQ(tier->stats().free_slots, 60u);
}

TEST(DiskTier, RegisteredBuffersFromAHostArena) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 16);
  HostArena::Config arena_config;
  arena_config.slot_bytes = kBlockHeaderBytes + kPayload;
  arena_config.capacity_bytes = 8 * 16384;
  arena_config.lock_memory = false;
  auto arena = HostArena::Create(arena_config);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  ASSERT_EQ((*arena)->slot_stride(), 16384u);
  DiskTier::OpenOptions options;
  options.buffers.push_back(DiskBufferRegion{(*arena)->base(), (*arena)->mapped_bytes()});
  auto opened = OpenOrDie(config, options);
  DiskTier* tier = opened.tier.get();
  EXPECT_TRUE(tier->stats().buffers_registered);
  for (uint32_t i = 0; i < 8; ++i) ASSERT_TRUE(WriteBlock(tier, i, (*arena)->SlotData(i)).ok());
  for (uint32_t i = 0; i < 8; ++i) {
    bool wrong = true;
    ASSERT_TRUE(ReadBlock(tier, i, (*arena)->SlotData(7 - i), &wrong).ok());
    EXPECT_FALSE(wrong);
  }
  // Re-registration at run time (e.g. a second arena) goes through the I/O thread.
  EXPECT_TRUE(tier->RegisterBuffers(options.buffers).ok());
  ASSERT_TRUE(ReadBlock(tier, 3, (*arena)->SlotData(0)).ok());
}

TEST(DiskTier, RefusedRegistrationFallsBackToUnregisteredIo) {
  TempDir dir;
  // Memory that may not be accessed: the kernel refuses to register (pin) it.
  void* gone = mmap(nullptr, 1 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 4);
  config.io_backend = IoBackend::kUring;
  DiskTier::OpenOptions options;
  options.buffers.push_back(DiskBufferRegion{static_cast<uint8_t*>(gone), 1 << 20});
  auto opened = OpenOrDie(config, options);
  EXPECT_FALSE(opened.tier->stats().buffers_registered);
  Status s = opened.tier->RegisterBuffers(options.buffers);
  EXPECT_TRUE(s.Is(StatusCode::kUnavailable)) << s.ToString();
  EXPECT_NE(s.message().find("io_uring_register_buffers"), std::string::npos);
  AlignedBuffer buf(opened.tier->io_bytes());
  ASSERT_TRUE(WriteBlock(opened.tier.get(), 0, buf.data()).ok());
  ASSERT_TRUE(ReadBlock(opened.tier.get(), 0, buf.data()).ok());
  munmap(gone, 1 << 20);
}

TEST(DiskTier, ThreadsBackendReportsNoRegistration) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 4);
  config.io_backend = IoBackend::kThreads;
  auto opened = OpenOrDie(config);
  AlignedBuffer buf(opened.tier->io_bytes());
  DiskBufferRegion region{buf.data(), buf.size()};
  EXPECT_TRUE(opened.tier->RegisterBuffers({&region, 1}).Is(StatusCode::kUnavailable));
  EXPECT_FALSE(opened.tier->stats().buffers_registered);
  ASSERT_TRUE(WriteBlock(opened.tier.get(), 0, buf.data()).ok()) << "I/O goes on unregistered";
}

// A sink may submit more requests from its callback: on the I/O thread (completions) and on
// the submitting thread, inside Submit*() (rejections).
TEST(DiskTier, SinksMaySubmitFromTheirCallbacks) {
  TempDir dir;
  auto opened = OpenOrDie(TestConfig(dir.path(), kPayload, 8));
  DiskTier* tier = opened.tier.get();
  AlignedBuffer first(tier->io_bytes()), second(tier->io_bytes()), readback(tier->io_bytes());
  FillTestPayload(1, second.data() + kBlockHeaderBytes, kPayload);
  const std::vector<TokenId> tokens0 = TestTokens(0), tokens1 = TestTokens(1);
  DiskOpWaiter done;
  struct Chain : DiskCompletionSink {
    DiskTier* tier;
    DiskWriteRequest next_write;  // submitted when a write is rejected
    DiskReadRequest next_read;    // submitted when a write completes
    void OnDiskOpDone(const DiskOpResult& r) override {
      if (r.cookie == 1 && r.status.Is(StatusCode::kAlreadyExists)) {
        tier->SubmitWrites({&next_write, 1});
      } else if (r.cookie == 2 && r.status.ok()) {
        tier->SubmitReads({&next_read, 1});
      }
    }
  } chain;
  chain.tier = tier;
  chain.next_write.key = TestKey(1);
  chain.next_write.parent = TestParent(1);
  chain.next_write.namespace_id = kTestNamespace;
  chain.next_write.tokens = tokens1;
  chain.next_write.buffer = second.data();
  chain.next_write.sink = &chain;
  chain.next_write.cookie = 2;
  chain.next_read.key = TestKey(1);
  chain.next_read.namespace_id = kTestNamespace;
  chain.next_read.expected_tokens = tokens1;
  chain.next_read.buffer = readback.data();
  chain.next_read.sink = &done;
  ASSERT_TRUE(WriteBlock(tier, 0, first.data()).ok());
  DiskWriteRequest dup;
  dup.key = TestKey(0);
  dup.tokens = tokens0;
  dup.buffer = first.data();
  dup.sink = &chain;
  dup.cookie = 1;
  std::vector<DiskWriteRequest> batch(3, dup);  // all three rejected, each chains a write
  tier->SubmitWrites(batch);
  // The first chained write lands; the two others are duplicates of it (or of it in flight).
  const DiskOpResult r = done.Take(1)[0];
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_TRUE(TestPayloadMatches(1, readback.data() + kBlockHeaderBytes, kPayload));
}

TEST(DiskTier, RequestsAfterCloseAreUnavailable) {
  TempDir dir;
  auto opened = OpenOrDie(TestConfig(dir.path(), kPayload, 4));
  AlignedBuffer buf(opened.tier->io_bytes());
  ASSERT_TRUE(WriteBlock(opened.tier.get(), 0, buf.data()).ok());
  ASSERT_TRUE(opened.tier->Close().ok());
  EXPECT_TRUE(opened.tier->Close().ok()) << "idempotent";
  EXPECT_TRUE(WriteBlock(opened.tier.get(), 1, buf.data()).Is(StatusCode::kUnavailable));
  EXPECT_TRUE(ReadBlock(opened.tier.get(), 0, buf.data()).Is(StatusCode::kUnavailable));
  EXPECT_TRUE(opened.tier->ProbeNow().Is(StatusCode::kUnavailable));
}

TEST(DiskTier, GeometryChangeReformatsOrIsRefused) {
  TempDir dir;
  {
    auto opened = OpenOrDie(TestConfig(dir.path(), kPayload, 8));
    AlignedBuffer buf(opened.tier->io_bytes());
    ASSERT_TRUE(WriteBlock(opened.tier.get(), 0, buf.data()).ok());
  }
  DiskTier::Config other = TestConfig(dir.path(), 2 * kPayload, 8);
  other.reformat_on_mismatch = false;
  auto refused = DiskTier::Open(other);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().Is(StatusCode::kFailedPrecondition)) << refused.status().ToString();

  other.reformat_on_mismatch = true;
  auto opened = OpenOrDie(other);
  EXPECT_TRUE(opened.recovered.empty());
  EXPECT_TRUE(opened.tier->stats().reformatted);
  EXPECT_FALSE(opened.tier->Contains(TestKey(0)));
}

// Concurrent writers, readers and removers over a small tier (TSan checks the locking).
TEST(DiskTier, ConcurrentUseServesOnlyRightBytes) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 24);
  auto opened = OpenOrDie(config);
  DiskTier* tier = opened.tier.get();
  std::atomic<uint64_t> wrong{0}, served{0};
  std::atomic<bool> stop{false};
  auto writer = [&](uint64_t base) {
    AlignedBuffer buf(tier->io_bytes());
    for (uint64_t n = 0; n < 150; ++n) {
      const uint64_t i = base + n % 40;
      Status s = WriteBlock(tier, i, buf.data());
      if (s.Is(StatusCode::kResourceExhausted) || s.Is(StatusCode::kAlreadyExists)) {
        (void)tier->Remove(TestKey(base + (n + 7) % 40));
      }
    }
  };
  auto reader = [&](uint64_t base) {
    AlignedBuffer buf(tier->io_bytes());
    uint64_t n = 0;
    while (!stop.load()) {
      bool bad = false;
      if (ReadBlock(tier, base + n++ % 40, buf.data(), &bad).ok()) {
        ++served;
        if (bad) ++wrong;
      }
    }
  };
  std::thread w1(writer, 0), w2(writer, 1000), r1(reader, 0), r2(reader, 1000);
  w1.join();
  w2.join();
  stop = true;
  r1.join();
  r2.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(served.load(), 0u);
  const DiskTierStats s = tier->stats();
  EXPECT_EQ(s.verify_failures, 0u);
  EXPECT_EQ(s.blocks + s.free_slots, s.slots) << "no slot leaked";
}

TEST(DiskAdmission, SeenTwiceThenAdmitted) {
  auto gate = DiskAdmission::Create(DiskAdmission::Config{});
  ASSERT_TRUE(gate.ok());
  const BlockKey k = TestKey(1);
  EXPECT_EQ((*gate)->Admit(k, 100), DiskAdmission::Decision::kNotSeenEnough);
  EXPECT_EQ((*gate)->Admit(k, 100), DiskAdmission::Decision::kAdmit);
  EXPECT_EQ((*gate)->Admit(TestKey(2), 100), DiskAdmission::Decision::kNotSeenEnough);
  EXPECT_EQ((*gate)->counts().admitted, 1u);
  EXPECT_EQ((*gate)->counts().not_seen_enough, 2u);
}

TEST(DiskAdmission, WriteBudgetLimitsTheRate) {
  DiskAdmission::Config config;
  config.min_seen = 1;
  config.write_budget_bytes_per_s = 1000;
  auto gate = DiskAdmission::Create(config);
  ASSERT_TRUE(gate.ok());
  const auto t0 = DiskAdmission::Clock::now();
  // A full bucket admits a block larger than the burst once, then is in debt.
  EXPECT_EQ((*gate)->Admit(TestKey(1), 1500, t0), DiskAdmission::Decision::kAdmit);
  EXPECT_EQ((*gate)->Admit(TestKey(2), 1500, t0), DiskAdmission::Decision::kOverBudget);
  // Half a second pays back the 500-byte debt; not yet positive.
  EXPECT_EQ((*gate)->Admit(TestKey(3), 1500, t0 + std::chrono::milliseconds(500)),
            DiskAdmission::Decision::kOverBudget);
  EXPECT_EQ((*gate)->Admit(TestKey(4), 1500, t0 + std::chrono::milliseconds(600)),
            DiskAdmission::Decision::kAdmit);
  // Over 100 s, admitted bytes stay within the budget (plus one block).
  uint64_t admitted_bytes = 0;
  for (int ms = 700; ms < 100'000; ms += 10) {
    if ((*gate)->Admit(TestKey(ms), 1500, t0 + std::chrono::milliseconds(ms)) ==
        DiskAdmission::Decision::kAdmit) {
      admitted_bytes += 1500;
    }
  }
  EXPECT_LE(admitted_bytes, 100'000u + 1500u);
  EXPECT_GE(admitted_bytes, 95'000u);
  EXPECT_GT((*gate)->counts().over_budget, 0u);
}

TEST(DiskAdmission, TierGateDefaultsToSeenTwice) {
  TempDir dir;
  DiskTier::Config config = TestConfig(dir.path(), kPayload, 4);
  config.admission = DiskAdmission::Config{};
  auto opened = OpenOrDie(config);
  EXPECT_EQ(opened.tier->Admit(TestKey(1)), DiskAdmission::Decision::kNotSeenEnough);
  EXPECT_EQ(opened.tier->Admit(TestKey(1)), DiskAdmission::Decision::kAdmit);
  EXPECT_EQ(opened.tier->stats().admitted, 1u);
  EXPECT_EQ(opened.tier->stats().not_admitted_unseen, 1u);
}

}  // namespace
}  // namespace kvtier

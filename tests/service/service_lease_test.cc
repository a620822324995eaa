// The engine's side of a kCopy lease (docs/service.md, "Leases and the failure model"), with a
// real `kvtier serve` and attached engines in this process. Each of AttachedManager::RunCopy's
// three deadline checks is made to matter by a test of its own:
//  - before the batch: a batch that reaches the engine after its deadline (a device G1, whose
//    copies have no other check) never writes G1;
//  - before each layer of a load: a load whose deadline passes while a layer is being copied
//    (the copy held in a page fault, through userfaultfd) writes no later layer;
//  - before each block of a save: a save whose deadline passes between blocks
//    (KVTIER_TEST_ATTACHED_COPY_STALL_MS) writes no later block and is not stored.
// Once the engine has heard a load failed (LoadedTokens), it recomputes into the same G1
// blocks; a copy of that load landing later would overwrite its recompute.
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "client/attached_manager.h"
#include "host_device_backend.h"
#include "service_test_util.h"

namespace kvtier {
namespace {

using namespace service_test;  // NOLINT: the helpers of every service test

constexpr uint32_t kLeaseMs = 300;
constexpr uint8_t kRecomputed = 0x5a;  // what the engine writes into G1 after a failed load

ManagerOptions EngineOptions(const std::string& socket, const std::string& name) {
  ManagerOptions o;
  o.layout = TestLayout();
  o.model_id = "service-test";
  EXPECT_TRUE(o.config.Set("service.socket", socket).ok());
  EXPECT_TRUE(o.config.Set("service.instance", name).ok());
  EXPECT_TRUE(o.config.Set("service.reattach_ms", "100").ok());
  EXPECT_TRUE(o.config.Set("service.call_timeout_ms", "5000").ok());
  return o;
}

// Looks prompt `seed` (`blocks` full blocks + 1 token) up, expects all of it found, and starts
// its load into G1 blocks from `first` (nothing waits for it).
void StartLoadOf(Engine& e, const std::string& id, uint32_t seed, uint32_t blocks, uint32_t first) {
  const uint32_t tpb = e.g1.layout.tokens_per_block;
  const std::vector<TokenId> prompt = Prompt(seed, blocks * tpb + 1);
  RequestSpec spec;
  spec.request_id = id;
  spec.prompt = prompt;
  Result<LookupResult> found = e.manager->Lookup(spec, 0);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->num_tokens, blocks * tpb);
  std::vector<uint32_t> ids;
  for (uint32_t b = 0; b <= blocks; ++b) ids.push_back(first + b);
  Result<uint32_t> planned = e.manager->PrepareLoad(id, ids, found->num_tokens);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  ASSERT_EQ(*planned, blocks * tpb);
  ASSERT_TRUE(e.manager->StartLoad().ok());
}

// True when every byte of `bytes` at `p` is `value`.
bool AllAre(const uint8_t* p, uint64_t bytes, uint8_t value) {
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != value) return false;
  }
  return true;
}

template <typename F>
bool WaitUntil(F done, std::chrono::milliseconds limit = std::chrono::milliseconds(10000)) {
  const auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Before the batch.

// A device G1 (a host stand-in for the CUDA backend, one batch at a time) hands a batch to its
// device once RunCopy has checked the deadline. Load A is held on the device; load B, which
// arrived in time, waits in Submit for room, so the data connection reads nothing; load C's
// frame waits behind it. After two leases (the daemon failed all three; the engine heard so
// and recomputed C's blocks) the device is let go: C, read after its deadline, must be refused
// before it reaches the device.
TEST(ServiceLease, ABatchThatArrivesAfterItsDeadlineNeverWritesG1) {
  const std::string dir = TempDir("lease-batch");
  const std::string socket = dir + "/sock/kvtier.sock";
  Daemon daemon(socket);
  ASSERT_NO_FATAL_FAILURE(daemon.Start(kLeaseMs));
  HostDeviceBackend* device = nullptr;
  auto factory =
      [&device](
          const DeviceCopyBackend::Config& config) -> Result<std::unique_ptr<DeviceCopyBackend>> {
    DeviceCopyBackend::Config one = config;
    one.max_batches = 1;
    auto b = std::make_unique<HostDeviceBackend>(one);
    device = b.get();
    return std::unique_ptr<DeviceCopyBackend>(std::move(b));
  };
  Result<std::unique_ptr<client::AttachedManager>> attached =
      client::AttachedManager::Create(EngineOptions(socket, "device-engine"), factory);
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  client::AttachedManager* client = attached->get();
  Engine e;
  const KvLayout l = TestLayout();
  e.g1 = ContiguousG1(l, 64, e.g1_bytes);
  e.g1.on_device = true;  // host memory the stand-in treats as a device's
  e.manager = std::move(attached).value();
  ASSERT_TRUE(e.manager->RegisterDeviceMemory(e.g1).ok());
  ASSERT_NE(device, nullptr);
  ComputeAndSave(e, "save-a", 71, 2, 0);
  ComputeAndSave(e, "save-b", 72, 2, 0);
  ComputeAndSave(e, "save-c", 73, 2, 0);

  device->StallNextLoadAfterLayerForTest(0);
  ASSERT_NO_FATAL_FAILURE(StartLoadOf(e, "load-a", 71, 2, 20));
  ASSERT_TRUE(WaitUntil([&] { return device->holding(); })) << "load A never reached the device";
  ASSERT_NO_FATAL_FAILURE(StartLoadOf(e, "load-b", 72, 2, 30));
  ASSERT_NO_FATAL_FAILURE(StartLoadOf(e, "load-c", 73, 2, 40));
  std::this_thread::sleep_for(std::chrono::milliseconds(2 * kLeaseMs));
  // The daemon failed the three loads at their deadlines; the engine hears it and recomputes C.
  EXPECT_EQ(e.manager->LoadedTokens("load-c"), 0u);
  std::fill(e.g1_bytes.begin() + 40 * l.BlockBytes(), e.g1_bytes.begin() + 42 * l.BlockBytes(),
            kRecomputed);

  const uint64_t late_before = client->client_stats().late_batches;
  device->ReleaseStallForTest();
  // C is read once B is on the device: refused (late), or (the fault) submitted.
  EXPECT_TRUE(WaitUntil([&] {
    return client->client_stats().late_batches > late_before ||
           device->submitted(CopyDirection::kHostToDevice) >= 3;
  }));
  ASSERT_TRUE(WaitUntil([&] { return !device->holding(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a copy of C would be done
  EXPECT_EQ(device->submitted(CopyDirection::kHostToDevice), 2u)
      << "load C reached the device after its deadline";
  EXPECT_TRUE(AllAre(e.g1_bytes.data() + 40 * l.BlockBytes(), 2 * l.BlockBytes(), kRecomputed))
      << "load C wrote G1 after its deadline, over the engine's recompute";
  EXPECT_EQ(client->client_stats().late_batches, late_before + 1);
  for (const char* id : {"load-a", "load-b", "load-c"}) (void)e.manager->RequestFinished(id);
  (void)e.manager->Finished();
}

// ---------------------------------------------------------------------------------------------
// Before each layer of a load.

// Anonymous memory whose pages, until first touched, fault to this object's thread
// (userfaultfd, missing mode). Each fault is answered with a page of `fill`; once Arm()ed, the
// first one is held `hold` first, so the thread that touched the page stops right there.
class HeldPages {
 public:
  HeldPages(uint64_t bytes, uint8_t fill) : bytes_(bytes) {
    page_.assign(static_cast<size_t>(::sysconf(_SC_PAGESIZE)), fill);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      why_ = std::string("mmap: ") + std::strerror(errno);
      return;
    }
    base_ = static_cast<uint8_t*>(p);
    // Root may handle kernel-mode faults too; others only user-mode ones (vm.unprivileged_
    // userfaultfd = 0), which is all this needs: the copies are memcpy.
    fd_ = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
    if (fd_ < 0) {
      fd_ = static_cast<int>(
          ::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
    }
    if (fd_ < 0) {
      why_ = std::string("userfaultfd: ") + std::strerror(errno);
      return;
    }
    uffdio_api api{};
    api.api = UFFD_API;
    uffdio_register reg{};
    reg.range.start = reinterpret_cast<uintptr_t>(base_);
    reg.range.len = bytes_;
    reg.mode = UFFDIO_REGISTER_MODE_MISSING;
    if (::ioctl(fd_, UFFDIO_API, &api) != 0 || ::ioctl(fd_, UFFDIO_REGISTER, &reg) != 0) {
      why_ = std::string("userfaultfd ioctl: ") + std::strerror(errno);
      return;
    }
    thread_ = std::thread([this] { Serve(); });
  }
  ~HeldPages() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
    if (base_ != nullptr) ::munmap(base_, bytes_);
  }
  // Empty when usable; else why not (the test is skipped).
  const std::string& why() const { return why_; }
  uint8_t* data() const { return base_; }
  void Arm(std::chrono::milliseconds hold) {
    hold_ms_ = hold.count();
    armed_ = true;
  }
  bool held() const { return held_; }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      uffd_msg msg;
      if (::read(fd_, &msg, sizeof(msg)) != sizeof(msg)) continue;
      if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
      if (armed_ && !held_.exchange(true)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms_.load()));
      }
      uffdio_copy copy{};
      copy.dst = msg.arg.pagefault.address & ~(uint64_t{page_.size()} - 1);
      copy.src = reinterpret_cast<uintptr_t>(page_.data());
      copy.len = page_.size();
      (void)::ioctl(fd_, UFFDIO_COPY, &copy);  // EEXIST: another fault filled it already
    }
  }

  const uint64_t bytes_;
  std::vector<uint8_t> page_;
  uint8_t* base_ = nullptr;
  int fd_ = -1;
  std::string why_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, armed_{false}, held_{false};
  std::atomic<int64_t> hold_ms_{0};
};

// A host G1 whose blocks 32..63 are HeldPages, never touched before the load. The load into
// them stops in its first layer, in a page fault held past the lease; the daemon fails it at
// its deadline, and the engine hears so (LoadedTokens waits for the layer in progress). Layer 0,
// whose copy had begun in time, lands; no later layer may (their bytes stay the engine's).
TEST(ServiceLease, ALoadWhoseDeadlinePassesBetweenLayersWritesNoLaterLayer) {
  const KvLayout l = TestLayout();
  const uint32_t kBlocks = 64, kHeldFrom = 32;
  HeldPages memory(uint64_t{kBlocks} * l.BlockBytes(), kRecomputed);
  if (!memory.why().empty()) GTEST_SKIP() << "no userfaultfd here: " << memory.why();
  const std::string dir = TempDir("lease-layer");
  const std::string socket = dir + "/sock/kvtier.sock";
  Daemon daemon(socket);
  ASSERT_NO_FATAL_FAILURE(daemon.Start(kLeaseMs));
  Result<std::unique_ptr<client::AttachedManager>> attached =
      client::AttachedManager::Create(EngineOptions(socket, "held-engine"));
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  client::AttachedManager* client = attached->get();
  Engine e;  // g1_bytes unused: G1 is `memory`
  e.g1.layout = l;
  e.g1.num_blocks = kBlocks;
  e.g1.regions = {G1Region{memory.data(), l.BlockBytes()}};
  e.manager = std::move(attached).value();
  ASSERT_TRUE(e.manager->RegisterDeviceMemory(e.g1).ok());

  // Save prompt 81 from blocks 0..3 (not held), as ComputeAndSave would from g1_bytes.
  const std::vector<TokenId> prompt = Prompt(81, 4 * l.tokens_per_block + 1);
  RequestSpec spec;
  spec.request_id = "save";
  spec.prompt = prompt;
  ASSERT_TRUE(e.manager->Lookup(spec, 0).ok());
  const std::vector<uint32_t> save_ids = {0, 1, 2, 3, 4};
  ASSERT_TRUE(e.manager->PrepareLoad("save", save_ids, 0).ok());
  for (uint32_t b = 0; b < 4; ++b)
    FillBlock(memory.data() + b * l.BlockBytes(), l.BlockBytes(), 81, b);
  ASSERT_TRUE(e.manager->Commit("save", prompt, save_ids).ok());
  ASSERT_TRUE(e.manager->StartSave().ok());
  e.manager->WaitForRequestSaves("save");
  (void)e.manager->RequestFinished("save");
  (void)e.manager->Finished();
  ASSERT_EQ(e.manager->Stats().saved_blocks, 4u);

  memory.Arm(std::chrono::milliseconds(kLeaseMs + 400));
  const uint64_t late_before = client->client_stats().late_batches;
  ASSERT_NO_FATAL_FAILURE(StartLoadOf(e, "load", 81, 4, kHeldFrom));
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) (void)e.manager->WaitLayer(layer);
  EXPECT_EQ(e.manager->LoadedTokens("load"), 0u) << "the load was not failed at its deadline";
  EXPECT_TRUE(memory.held()) << "the load's copy never touched the held pages";
  // The engine has heard: from here on no copy of the load may write its blocks.
  EXPECT_TRUE(WaitUntil([&] { return client->client_stats().late_batches > late_before; },
                        std::chrono::milliseconds(1000)))
      << "the engine never refused the rest of the load at its deadline";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (uint32_t b = 0; b < 4; ++b) {
    const uint8_t* block = memory.data() + (kHeldFrom + b) * l.BlockBytes();
    std::vector<uint8_t> want(l.BlockBytes());
    FillBlock(want.data(), want.size(), 81, b);
    EXPECT_EQ(std::memcmp(block, want.data(), l.LayerBytes()), 0)
        << "block " << b << ": layer 0, begun in time, did not land";
    EXPECT_TRUE(AllAre(block + l.LayerBytes(), l.BlockBytes() - l.LayerBytes(), kRecomputed))
        << "block " << b << ": a layer was copied after the load's deadline";
  }
  (void)e.manager->RequestFinished("load");
  (void)e.manager->Finished();
}

// ---------------------------------------------------------------------------------------------
// Before each block of a save.

// Each block a save copies waits 100 ms first (the test hook), so an 8-block save outlives its
// 300 ms lease by the third block. The engine stops there: the batch ends TimedOut, and the
// daemon, which indexes a save only at kCopyDone Ok, stores none of it.
TEST(ServiceLease, ASaveWhoseDeadlinePassesBetweenBlocksIsRefused) {
  const std::string dir = TempDir("lease-save");
  const std::string socket = dir + "/sock/kvtier.sock";
  Daemon daemon(socket);
  ASSERT_NO_FATAL_FAILURE(daemon.Start(kLeaseMs));
  ::setenv("KVTIER_TEST_ATTACHED_COPY_STALL_MS", "100", 1);
  Result<std::unique_ptr<client::AttachedManager>> attached =
      client::AttachedManager::Create(EngineOptions(socket, "slow-saver"));
  ::unsetenv("KVTIER_TEST_ATTACHED_COPY_STALL_MS");
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  client::AttachedManager* client = attached->get();
  Engine e;
  e.g1 = ContiguousG1(TestLayout(), 16, e.g1_bytes);
  e.manager = std::move(attached).value();
  ASSERT_TRUE(e.manager->RegisterDeviceMemory(e.g1).ok());

  const auto t0 = Clock::now();
  ComputeAndSave(e, "save", 91, 8, 0);
  const auto took = Clock::now() - t0;
  EXPECT_EQ(client->client_stats().late_batches, 1u);
  EXPECT_LT(took, std::chrono::milliseconds(700))
      << "the save copied on past its deadline (8 blocks x 100 ms)";
  EXPECT_EQ(e.manager->Stats().saved_blocks, 0u) << "a save past its lease was stored";
  bool bytes_ok = false;
  EXPECT_EQ(LookupAndLoad(e, "look", 91, 8, 0, &bytes_ok), 0u);
}

}  // namespace
}  // namespace kvtier

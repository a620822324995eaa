// Helpers for the disk-tier tests: temporary directories, aligned buffers, deterministic blocks
// (payload and tokens derived from an index, so any served byte can be checked independently
// of the tier's own verification), and synchronous write/read wrappers.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tier/disk_tier.h"

namespace kvtier::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents at destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/kvtier-disk-XXXXXX";
    char* p = mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// 4 KiB-aligned memory, freed at destruction.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes)
      : data_(static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))),
        size_(bytes) {
    std::memset(data_, 0, (bytes + 4095) / 4096 * 4096);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_;
  size_t size_;
};

inline constexpr uint64_t kTestLayout = 0x1a2b3c4d5e6f7081ull;
inline constexpr uint64_t kTestNamespace = 77;
inline constexpr uint32_t kTestTokensPerBlock = 16;

inline BlockKey TestKey(uint64_t i) {
  return BlockKey{0x9e3779b97f4a7c15ull * (i + 1), 0xc2b2ae3d27d4eb4full ^ (i * 0x100000001b3ull)};
}
inline BlockKey TestParent(uint64_t i) { return i == 0 ? BlockKey{1, 1} : TestKey(i - 1); }

inline std::vector<TokenId> TestTokens(uint64_t i) {
  std::vector<TokenId> t(kTestTokensPerBlock);
  for (uint32_t j = 0; j < kTestTokensPerBlock; ++j) t[j] = static_cast<TokenId>(i * 131 + j * 7);
  return t;
}

// The payload of block i: a pattern that differs for every block and every 8 bytes.
inline void FillTestPayload(uint64_t i, uint8_t* payload, uint64_t bytes) {
  uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull;
  for (uint64_t off = 0; off + 8 <= bytes; off += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(payload + off, &x, 8);
  }
  for (uint64_t off = bytes / 8 * 8; off < bytes; ++off) payload[off] = static_cast<uint8_t>(i);
}

inline bool TestPayloadMatches(uint64_t i, const uint8_t* payload, uint64_t bytes) {
  std::vector<uint8_t> want(bytes);
  FillTestPayload(i, want.data(), bytes);
  return std::memcmp(want.data(), payload, bytes) == 0;
}

inline DiskTier::Config TestConfig(const std::string& dir, uint64_t payload_bytes, uint32_t slots) {
  DiskTier::Config c;
  c.dir = dir;
  c.payload_bytes = payload_bytes;
  c.layout_fingerprint = kTestLayout;
  const uint64_t stride = (4096 + payload_bytes + 4095) / 4096 * 4096;
  c.capacity_bytes = kFirstSlotOffset + uint64_t{slots} * stride;
  c.queue_depth = 8;
  c.admission.min_seen = 1;
  return c;
}

// A write of block i in kTestNamespace from `buffer` (io_bytes long, its payload filled here),
// its tokens put in `tokens` (which must outlive the submission), its result sent to `sink`.
inline DiskWriteRequest TestWrite(uint64_t i, std::vector<TokenId>& tokens, uint8_t* buffer,
                                  uint64_t payload_bytes, DiskCompletionSink* sink,
                                  uint64_t cookie = 0) {
  FillTestPayload(i, buffer + kBlockHeaderBytes, payload_bytes);
  tokens = TestTokens(i);
  DiskWriteRequest r;
  r.key = TestKey(i);
  r.parent = TestParent(i);
  r.namespace_id = kTestNamespace;
  r.tokens = tokens;
  r.buffer = buffer;
  r.sink = sink;
  r.cookie = cookie;
  return r;
}

// Writes block i from `buffer` (io_bytes long) and waits for the result.
inline Status WriteBlock(DiskTier* tier, uint64_t i, uint8_t* buffer) {
  std::vector<TokenId> tokens;
  DiskOpWaiter waiter;
  DiskWriteRequest r = TestWrite(i, tokens, buffer, tier->payload_bytes(), &waiter);
  tier->SubmitWrites({&r, 1});
  return waiter.Take(1)[0].status;
}

// A read of block TestKey(i) in kTestNamespace into `buffer` (io_bytes long), checked against
// `tokens` (which must outlive the submission), its result sent to `sink`.
inline DiskReadRequest TestRead(uint64_t i, const std::vector<TokenId>& tokens, uint8_t* buffer,
                                DiskCompletionSink* sink) {
  DiskReadRequest r;
  r.key = TestKey(i);
  r.namespace_id = kTestNamespace;
  r.expected_tokens = tokens;
  r.buffer = buffer;
  r.sink = sink;
  return r;
}

// Reads block i into `buffer` and waits. `served_wrong` is set when the tier said Ok but the
// bytes are not block i's: the one outcome that must never happen.
inline Status ReadBlock(DiskTier* tier, uint64_t i, uint8_t* buffer, bool* served_wrong = nullptr) {
  const std::vector<TokenId> tokens = TestTokens(i);
  DiskOpWaiter waiter;
  DiskReadRequest r = TestRead(i, tokens, buffer, &waiter);
  tier->SubmitReads({&r, 1});
  Status s = waiter.Take(1)[0].status;
  if (s.ok() && served_wrong != nullptr) {
    *served_wrong = !TestPayloadMatches(i, buffer + kBlockHeaderBytes, tier->payload_bytes());
  }
  return s;
}

// Writes of blocks TestKey(0..n-1), each from a buffer of its own, for tests of what the tier
// does with a batch (queueing, dropping, quarantine) rather than with the bytes.
struct TestWriteBatch {
  std::vector<std::unique_ptr<AlignedBuffer>> buffers;  // io_bytes() each; live with the batch
  std::vector<DiskWriteRequest> writes;
};

// `n` writes, all carrying `tokens` (which must outlive the submission), each reporting to
// `sink` with its index as cookie.
inline TestWriteBatch MakeTestWriteBatch(const DiskTier& tier, uint64_t n,
                                         const std::vector<TokenId>& tokens,
                                         DiskCompletionSink* sink) {
  TestWriteBatch batch;
  for (uint64_t i = 0; i < n; ++i) {
    batch.buffers.push_back(std::make_unique<AlignedBuffer>(tier.io_bytes()));
    DiskWriteRequest w;
    w.key = TestKey(i);
    w.tokens = tokens;
    w.buffer = batch.buffers.back()->data();
    w.sink = sink;
    w.cookie = i;
    batch.writes.push_back(w);
  }
  return batch;
}

inline DiskTier::Opened OpenOrDie(const DiskTier::Config& config,
                                  const DiskTier::OpenOptions& options = {}) {
  auto opened = DiskTier::Open(config, options);
  EXPECT_TRUE(opened.ok()) << opened.status().ToString();
  if (!opened.ok()) std::abort();
  return std::move(opened).value();
}

// Opens a tier with `config`, writes blocks 0..n-1 through one buffer (each write must
// succeed), and closes it again: the setup of the tests of what a later open finds.
inline void WriteBlocksAndClose(const DiskTier::Config& config, uint64_t n) {
  auto opened = OpenOrDie(config);
  AlignedBuffer buf(opened.tier->io_bytes());
  for (uint64_t i = 0; i < n; ++i) ASSERT_TRUE(WriteBlock(opened.tier.get(), i, buf.data()).ok());
}

}  // namespace kvtier::testing

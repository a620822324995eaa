#include "tier/host_arena.h"

#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

std::unique_ptr<HostArena> MakeArena(uint64_t capacity, uint64_t slot) {
  HostArena::Config cfg;
  cfg.capacity_bytes = capacity;
  cfg.slot_bytes = slot;
  cfg.prefault_threads = 2;
  auto arena = HostArena::Create(cfg);
  EXPECT_TRUE(arena.ok()) << arena.status().ToString();
  return std::move(arena).value();
}

TEST(HostArenaTest, SlotsAreAlignedAndWithinCapacity) {
  // 10,000-byte slots round up to a 12,288-byte stride; 1 MiB holds 85 of them.
  auto arena = MakeArena(1 << 20, 10000);
  EXPECT_EQ(arena->slot_stride(), 12288u);
  EXPECT_EQ(arena->num_slots(), (1u << 20) / 12288);
  EXPECT_LE(uint64_t{arena->num_slots()} * arena->slot_stride(), 1u << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(arena->base()) % (2u << 20), 0u);
  std::set<uint32_t> seen;
  while (auto slot = arena->Allocate()) {
    EXPECT_LT(*slot, arena->num_slots());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arena->SlotData(*slot)) % HostArena::kSlotAlignment, 0u);
    EXPECT_TRUE(seen.insert(*slot).second) << "slot handed out twice";
    // The slot's bytes are ours: write them all.
    std::memset(arena->SlotData(*slot), 0xab, arena->slot_bytes());
  }
  EXPECT_EQ(seen.size(), arena->num_slots());
  EXPECT_EQ(arena->free_slots(), 0u);
  EXPECT_FALSE(arena->Allocate().has_value()) << "the arena never grows past its capacity";
}

TEST(HostArenaTest, ReleaseRejectsDoubleAndOutOfRange) {
  auto arena = MakeArena(64 * 4096, 4096);
  auto slot = arena->Allocate();
  ASSERT_TRUE(slot.has_value());
  EXPECT_TRUE(arena->Release(*slot).ok());
  Status twice = arena->Release(*slot);
  EXPECT_EQ(twice.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("double release"), std::string::npos);
  EXPECT_EQ(arena->Release(arena->num_slots()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(arena->free_slots(), arena->num_slots());
}

TEST(HostArenaTest, RejectsBadConfig) {
  HostArena::Config cfg;
  cfg.slot_bytes = 0;
  cfg.capacity_bytes = 1 << 20;
  EXPECT_EQ(HostArena::Create(cfg).status().code(), StatusCode::kInvalidArgument);
  cfg.slot_bytes = 1 << 20;
  cfg.capacity_bytes = 4096;
  Status s = HostArena::Create(cfg).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("capacity_bytes"), std::string::npos);
}

TEST(HostArenaTest, ReportsStartup) {
  auto arena = MakeArena(8 << 20, 1 << 20);
  EXPECT_EQ(arena->startup().threads, 2u);
  EXPECT_GE(arena->startup().prefault_ms, 0.0);
  EXPECT_EQ(arena->mapped_bytes(), 8u << 20);
}

TEST(HostArenaTest, ConcurrentAllocateReleaseNeverDuplicates) {
  auto arena = MakeArena(256 * 4096, 4096);
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint32_t> mine;
      for (int i = 0; i < 20000; ++i) {
        if ((i + t) % 3 != 0) {
          if (auto s = arena->Allocate()) {
            // Stamp the slot with our id; nobody else may hold it meanwhile.
            *reinterpret_cast<int*>(arena->SlotData(*s)) = t;
            mine.push_back(*s);
          }
        } else if (!mine.empty()) {
          if (*reinterpret_cast<int*>(arena->SlotData(mine.back())) != t) ++errors;
          if (!arena->Release(mine.back()).ok()) ++errors;
          mine.pop_back();
        }
      }
      for (uint32_t s : mine) {
        if (!arena->Release(s).ok()) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(arena->free_slots(), arena->num_slots());
}

}  // namespace
}  // namespace kvtier

#include "index/admission_filter.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

// A configuration of the three settings Validate checks.
AdmissionFilter::Config FilterConfig(uint32_t min_seen, uint64_t expected, uint64_t sample) {
  AdmissionFilter::Config c;
  c.min_seen = min_seen;
  c.expected_keys = expected;
  c.sample_size = sample;
  return c;
}

// Uniformly random keys, as the hasher makes them.
class KeySource {
 public:
  explicit KeySource(uint64_t seed) : rng_(seed) {}
  BlockKey Next() { return BlockKey{rng_(), rng_()}; }

 private:
  std::mt19937_64 rng_;
};

std::unique_ptr<AdmissionFilter> MakeFilter(uint32_t min_seen, uint64_t expected_keys = 1 << 12,
                                            uint64_t sample_size = 0) {
  auto filter = AdmissionFilter::Create(FilterConfig(min_seen, expected_keys, sample_size));
  EXPECT_TRUE(filter.ok()) << filter.status().ToString();
  return std::move(filter).value();
}

TEST(AdmissionFilterTest, RejectsTheFirstSightingAndAdmitsTheSecond) {
  auto filter = MakeFilter(2);
  KeySource keys(1);
  const BlockKey a = keys.Next(), b = keys.Next();
  EXPECT_EQ(filter->min_seen(), 2u);
  EXPECT_EQ(filter->Estimate(a), 0u);
  EXPECT_FALSE(filter->RecordAndCheck(a));
  EXPECT_EQ(filter->Estimate(a), 1u);
  EXPECT_FALSE(filter->RecordAndCheck(b)) << "another key's sighting does not count for it";
  EXPECT_TRUE(filter->RecordAndCheck(a));
  EXPECT_TRUE(filter->RecordAndCheck(a));
  EXPECT_EQ(filter->Estimate(a), 3u);
}

TEST(AdmissionFilterTest, MinSeenThreeNeedsThreeSightings) {
  auto filter = MakeFilter(3);
  const BlockKey a = KeySource(2).Next();
  EXPECT_FALSE(filter->RecordAndCheck(a));
  EXPECT_FALSE(filter->RecordAndCheck(a));
  EXPECT_TRUE(filter->RecordAndCheck(a));
}

TEST(AdmissionFilterTest, MinSeenOneAdmitsEverything) {
  // A tiny sketch that halves on every record: even then each key is admitted on sight.
  auto filter = MakeFilter(1, /*expected_keys=*/1, /*sample_size=*/1);
  KeySource keys(3);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(filter->RecordAndCheck(keys.Next())) << i;
}

TEST(AdmissionFilterTest, EstimateSaturatesAtFifteen) {
  auto filter = MakeFilter(15);
  const BlockKey a = KeySource(4).Next();
  for (int i = 1; i <= 14; ++i) EXPECT_FALSE(filter->RecordAndCheck(a)) << i;
  EXPECT_TRUE(filter->RecordAndCheck(a));
  EXPECT_EQ(filter->Estimate(a), 15u);
  for (int i = 0; i < 100; ++i) filter->RecordAndCheck(a);
  EXPECT_EQ(filter->Estimate(a), 15u) << "a 4-bit counter must not wrap";
}

TEST(AdmissionFilterTest, HalvingEverySampleLowersEstimates) {
  constexpr uint64_t kSample = 1024;
  auto filter = MakeFilter(2, /*expected_keys=*/1024, kSample);
  KeySource keys(5);
  const BlockKey hot = keys.Next();
  for (int i = 0; i < 11; ++i) filter->RecordAndCheck(hot);
  // Fill the sample with other keys, one short of the halving.
  for (uint64_t i = 11; i < kSample - 1; ++i) filter->RecordAndCheck(keys.Next());
  EXPECT_EQ(filter->Estimate(hot), 11u);
  filter->RecordAndCheck(keys.Next());  // record number kSample: every counter halves
  EXPECT_EQ(filter->Estimate(hot), 5u);
  // The next halving comes after another full sample, not before.
  for (uint64_t i = 0; i < kSample - 1; ++i) filter->RecordAndCheck(keys.Next());
  EXPECT_EQ(filter->Estimate(hot), 5u);
  filter->RecordAndCheck(keys.Next());
  EXPECT_EQ(filter->Estimate(hot), 2u);
}

TEST(AdmissionFilterTest, DefaultSampleIsTenTimesExpectedKeys) {
  auto filter = MakeFilter(2, /*expected_keys=*/16);
  const BlockKey hot = KeySource(6).Next();
  // A halving before record 160 (= 10 x 16) would show as a drop from the saturated 15.
  for (int i = 1; i < 160; ++i) {
    filter->RecordAndCheck(hot);
    if (i >= 15) {
      ASSERT_EQ(filter->Estimate(hot), 15u) << "record " << i;
    }
  }
  filter->RecordAndCheck(hot);  // record 160
  EXPECT_EQ(filter->Estimate(hot), 7u);
}

// Records `records` sightings drawn uniformly from `distinct` random keys, and returns how many of
// the keys read exactly their true count (capped at 15). Fails the test on any underestimate.
size_t RecordAndCountExact(AdmissionFilter* filter, size_t distinct, int records, uint64_t seed) {
  KeySource keys(seed);
  std::mt19937_64 rng(seed + 1);
  std::vector<BlockKey> pool(distinct);
  for (BlockKey& k : pool) k = keys.Next();
  std::map<BlockKey, uint32_t> truth;
  for (int i = 0; i < records; ++i) {
    const BlockKey& k = pool[rng() % pool.size()];
    filter->RecordAndCheck(k);
    ++truth[k];
  }
  size_t exact = 0;
  for (const auto& [k, n] : truth) {
    const uint32_t expected = std::min<uint32_t>(n, 15);
    const uint32_t estimate = filter->Estimate(k);
    EXPECT_GE(estimate, expected) << k.ToHex();
    if (estimate == expected) ++exact;
  }
  return exact;
}

TEST(AdmissionFilterTest, NeverUnderestimatesEvenWhenOverloaded) {
  // 4000 keys in a sketch sized for 1024: about four keys share every counter.
  auto filter = MakeFilter(2, /*expected_keys=*/1024, /*sample_size=*/1 << 20);
  RecordAndCountExact(filter.get(), 4000, 20000, 7);
}

TEST(AdmissionFilterTest, MostlyExactWithinItsSize) {
  // 1000 keys in a sketch sized for 4096: the four rows rarely all collide.
  auto filter = MakeFilter(2, /*expected_keys=*/4096);
  const size_t exact = RecordAndCountExact(filter.get(), 1000, 5000, 11);
  EXPECT_GE(exact, 980u);
}

TEST(AdmissionFilterTest, RowsUseIndependentKeyBits) {
  // Keys that agree on all but one 32-bit quarter collide in three rows; the fourth row must
  // still tell them apart.
  for (int quarter = 0; quarter < 4; ++quarter) {
    const int shift = 32 * (quarter % 2);
    auto key = [&](uint64_t v) {
      BlockKey k{0x0123456789abcdefull, 0xfedcba9876543210ull};
      (quarter < 2 ? k.lo : k.hi) ^= v << shift;
      return k;
    };
    const BlockKey a = key(1), b = key(2);
    auto filter = MakeFilter(2, /*expected_keys=*/1024);
    for (int i = 0; i < 5; ++i) filter->RecordAndCheck(a);
    EXPECT_EQ(filter->Estimate(a), 5u);
    EXPECT_EQ(filter->Estimate(b), 0u) << "quarter " << quarter;
  }
}

// A key whose four 32-bit quarters (row 0 reads the low half of `lo`, row 3 the high half of
// `hi`) are `q0`..`q3`.
BlockKey KeyOfQuarters(uint32_t q0, uint32_t q1, uint32_t q2, uint32_t q3) {
  return BlockKey{(uint64_t{q3} << 32) | q2, (uint64_t{q1} << 32) | q0};
}

TEST(AdmissionFilterTest, ConservativeUpdateSparesCollidingKeys) {
  auto filter = MakeFilter(2, /*expected_keys=*/1024);
  const BlockKey b = KeyOfQuarters(1, 2, 3, 4);
  const BlockKey a = KeyOfQuarters(1, 2, 3, 99);    // shares b's counters in rows 0..2
  const BlockKey c = KeyOfQuarters(97, 98, 99, 4);  // shares b's counter in row 3
  for (int i = 0; i < 5; ++i) filter->RecordAndCheck(b);
  filter->RecordAndCheck(a);
  filter->RecordAndCheck(c);
  // Plain count-min would have raised all four of b's counters to 6; conservative update only
  // raises the counters at a key's own minimum, which b does not share.
  EXPECT_EQ(filter->Estimate(b), 5u);
  EXPECT_EQ(filter->Estimate(a), 1u);
  EXPECT_EQ(filter->Estimate(c), 1u);
}

TEST(AdmissionFilterTest, HalvingKeepsNeighbouringCountersApart) {
  // 16 columns per row; a and b sit in adjacent 4-bit counters of the same word in every row.
  auto filter = MakeFilter(2, /*expected_keys=*/16, /*sample_size=*/16);
  const BlockKey a = KeyOfQuarters(4, 4, 4, 4);
  const BlockKey b = KeyOfQuarters(5, 5, 5, 5);
  for (int i = 0; i < 3; ++i) filter->RecordAndCheck(a);
  for (int i = 0; i < 12; ++i) filter->RecordAndCheck(b);
  ASSERT_EQ(filter->Estimate(a), 3u);
  ASSERT_EQ(filter->Estimate(b), 12u);
  filter->RecordAndCheck(b);  // record 16: halving; b = 13 is odd, its low bit must not leak
  EXPECT_EQ(filter->Estimate(a), 1u);
  EXPECT_EQ(filter->Estimate(b), 6u);
}

TEST(AdmissionFilterTest, ValidateNamesTheBadField) {
  struct Case {
    AdmissionFilter::Config config;
    std::string field;
    std::string value;
  };
  const std::vector<Case> cases = {
      {FilterConfig(0, 100, 0), "min_seen", "0"},
      {FilterConfig(16, 100, 0), "min_seen", "16"},
      {FilterConfig(2, 0, 0), "expected_keys", "0"},
      {FilterConfig(2, (uint64_t{1} << 32) + 1, 0), "expected_keys", "4294967297"},
      {FilterConfig(2, 100, 99), "sample_size", "99"},
      {FilterConfig(2, 100, 1), "sample_size", "1"},
  };
  for (const Case& c : cases) {
    const Status status = c.config.Validate();
    ASSERT_FALSE(status.ok()) << c.field << " = " << c.value;
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(c.field + " = " + c.value), std::string::npos)
        << status.message();
    auto filter = AdmissionFilter::Create(c.config);
    ASSERT_FALSE(filter.ok());
    EXPECT_EQ(filter.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_NE(FilterConfig(0, 100, 0).Validate().message().find("1..15"), std::string::npos);
}

TEST(AdmissionFilterTest, ValidateAcceptsTheEdgesOfEachRange) {
  EXPECT_TRUE(AdmissionFilter::Config{}.Validate().ok());
  EXPECT_TRUE(FilterConfig(1, 1, 0).Validate().ok());
  EXPECT_TRUE(FilterConfig(15, 1, 1).Validate().ok());
  EXPECT_TRUE(FilterConfig(2, uint64_t{1} << 32, 0).Validate().ok());
  EXPECT_TRUE(FilterConfig(2, 100, 100).Validate().ok());
}

TEST(AdmissionFilterTest, ConcurrentRecordsAreAllCounted) {
  // Four threads record the same three keys three times each (12 records per key) between
  // noise, while four more read; the sketch never halves in this run, so each hot key must read
  // exactly 12: a lost update would read less.
  constexpr int kThreads = 4;
  auto filter = MakeFilter(2, /*expected_keys=*/1 << 16);
  KeySource keys(9);
  const std::vector<BlockKey> hot = {keys.Next(), keys.Next(), keys.Next()};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&filter, &hot, t] {
      KeySource noise(100 + t);
      for (int round = 0; round < 3; ++round) {
        for (const BlockKey& k : hot) {
          filter->RecordAndCheck(k);
          for (int i = 0; i < 200; ++i) filter->RecordAndCheck(noise.Next());
        }
      }
    });
  }
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&filter, &hot] {
      for (int i = 0; i < 500; ++i) EXPECT_LE(filter->Estimate(hot[i % hot.size()]), 15u);
    });
  }
  for (std::thread& th : threads) th.join();
  for (const BlockKey& k : hot) EXPECT_EQ(filter->Estimate(k), 12u) << k.ToHex();
}

}  // namespace
}  // namespace kvtier

// RequestTable (src/manager/request_table.h) on its own: entries made once, the activity order
// the idle sweep walks, and what the sweep erases, touches or leaves.
#include "manager/request_table.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

TEST(RequestTableTest, AnEntryIsMadeOnceAndFoundByItsId) {
  RequestTable t;
  bool made = false;
  RequestState& a = t.Activate("a", &made);
  EXPECT_TRUE(made);
  EXPECT_EQ(a.id, "a");
  a.instance = 3;
  RequestState& again = t.Activate("a", &made);
  EXPECT_FALSE(made);
  EXPECT_EQ(&again, &a);
  EXPECT_EQ(again.instance, 3u);
  EXPECT_EQ(t.Find("a"), &a);
  EXPECT_EQ(t.Find("b"), nullptr);
  EXPECT_EQ(t.size(), 1u);
  t.Erase(a);
  EXPECT_EQ(t.Find("a"), nullptr);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.SweepIdle(Clock::now() + std::chrono::hours(1), 64), 0u) << "order emptied too";
}

// The sweep erases idle entries past the TTL, least recently active first, and stops at the
// first one active within the TTL; an entry with work in flight is touched, not erased.
TEST(RequestTableTest, TheSweepErasesIdleEntriesInOrderOfActivity) {
  RequestTable t;
  t.set_idle_ttl(milliseconds(100));
  bool made;
  t.Activate("old-idle", &made);
  RequestState& busy = t.Activate("old-busy", &made);
  busy.saves_in_flight = 1;
  t.Activate("old-loading", &made).load_in_flight = true;
  const Clock::time_point later = Clock::now() + milliseconds(200);
  t.Activate("fresh", &made).last_active = later;  // active at `later`: not past the TTL
  EXPECT_EQ(t.SweepIdle(later, 64), 1u);
  EXPECT_EQ(t.Find("old-idle"), nullptr);
  ASSERT_NE(t.Find("old-busy"), nullptr);
  ASSERT_NE(t.Find("old-loading"), nullptr);
  ASSERT_NE(t.Find("fresh"), nullptr);
  // The busy ones were touched at the sweep: not looked at again until a TTL after it.
  EXPECT_GE(t.Find("old-busy")->last_active, later - milliseconds(200));
  busy.saves_in_flight = 0;
  t.Find("old-loading")->load_in_flight = false;
  // Now "fresh" is at the front (the busy ones were moved behind it): a sweep before its TTL
  // ends erases nothing, one after erases all three.
  EXPECT_EQ(t.SweepIdle(later + milliseconds(50), 64), 0u);
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.SweepIdle(later + milliseconds(150), 64), 3u);
  EXPECT_EQ(t.size(), 0u);
}

TEST(RequestTableTest, TheSweepLooksAtNoMoreThanItsBound) {
  RequestTable t;
  t.set_idle_ttl(milliseconds(1));
  bool made;
  for (int i = 0; i < 10; ++i) t.Activate("r" + std::to_string(i), &made);
  const Clock::time_point later = Clock::now() + milliseconds(50);
  EXPECT_EQ(t.SweepIdle(later, 4), 4u);
  EXPECT_EQ(t.size(), 6u);
  EXPECT_EQ(t.Find("r0"), nullptr) << "the least recently active go first";
  EXPECT_NE(t.Find("r4"), nullptr);
  EXPECT_EQ(t.SweepIdle(later, 64), 6u);
}

// Touch makes an entry the most recently active: the sweep reaches it last.
TEST(RequestTableTest, TouchMovesAnEntryToTheBackOfTheOrder) {
  RequestTable t;
  t.set_idle_ttl(milliseconds(1));
  bool made;
  RequestState& a = t.Activate("a", &made);
  t.Activate("b", &made);
  t.Touch(a);
  const Clock::time_point later = Clock::now() + milliseconds(50);
  EXPECT_EQ(t.SweepIdle(later, 1), 1u);
  EXPECT_EQ(t.Find("b"), nullptr);
  EXPECT_NE(t.Find("a"), nullptr);
}

}  // namespace
}  // namespace kvtier

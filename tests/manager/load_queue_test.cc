// LoadQueue (src/manager/load_queue.h) on its own: planned loads handed out once per
// instance in plan order, only synchronous batches kept (and finished ones dropped), and each
// ended load reported once to its own instance.
#include "manager/load_queue.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "transfer/transfer_job.h"

namespace kvtier {
namespace {

PlannedLoad Planned(uint32_t instance, const std::string& request, uint32_t block) {
  PlannedLoad p;
  p.instance = instance;
  p.request_id = request;
  p.block_index = block;
  p.key = BlockKey{block + 1, instance};
  return p;
}

// A batch with no moves: Done() at once.
std::shared_ptr<TransferJob> FinishedJob() {
  return std::make_shared<TransferJob>(std::vector<BlockTransfer>{}, 2, TransferPriority::kLoad);
}

// A batch with one G2 -> G1 move that never ends here (no engine runs it).
std::shared_ptr<TransferJob> RunningJob() {
  BlockTransfer m;
  m.op = BlockTransfer::Op::kG2ToG1;
  return std::make_shared<TransferJob>(std::vector<BlockTransfer>{m}, 2, TransferPriority::kLoad);
}

TEST(LoadQueueTest, PlannedLoadsAreHandedOutOncePerInstanceInPlanOrder) {
  LoadQueue q;
  q.Plan({Planned(1, "a", 0), Planned(2, "b", 0), Planned(1, "a", 1)});
  q.Plan({Planned(1, "c", 0)});
  std::vector<PlannedLoad> one = q.TakePlanned(1);
  ASSERT_EQ(one.size(), 3u);
  EXPECT_EQ(one[0].request_id, "a");
  EXPECT_EQ(one[0].block_index, 0u);
  EXPECT_EQ(one[1].block_index, 1u);
  EXPECT_EQ(one[2].request_id, "c");
  EXPECT_TRUE(q.TakePlanned(1).empty()) << "a planned load must be handed out once";
  EXPECT_EQ(q.planned(), 1u) << "another instance's load must stay planned";
  std::vector<PlannedLoad> all = q.TakePlanned(LoadQueue::kAll);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].instance, 2u);
  EXPECT_EQ(q.planned(), 0u);
}

TEST(LoadQueueTest, OnlySynchronousBatchesAreWaitedOnAndFinishedOnesAreDropped) {
  LoadQueue q;
  std::shared_ptr<TransferJob> sync1 = RunningJob(), async1 = RunningJob();
  q.Started(1, sync1, /*async=*/false);
  q.Started(1, async1, /*async=*/true);
  q.Started(2, RunningJob(), /*async=*/false);
  std::vector<std::shared_ptr<TransferJob>> jobs = q.JobsOf(1);
  ASSERT_EQ(jobs.size(), 1u) << "WaitLayer must not wait on an asynchronous batch";
  EXPECT_EQ(jobs[0], sync1);
  EXPECT_EQ(q.JobsOf(LoadQueue::kAll).size(), 2u);
  EXPECT_TRUE(q.JobsOf(3).empty());

  LoadQueue r;
  r.Started(1, FinishedJob(), false);
  EXPECT_EQ(r.JobsOf(1).size(), 1u) << "kept until the next start";
  r.Started(1, RunningJob(), false);
  EXPECT_EQ(r.JobsOf(1).size(), 1u) << "a finished batch must be dropped at the next start";
}

TEST(LoadQueueTest, EachEndedLoadIsReportedOnceToItsOwnInstance) {
  LoadQueue q;
  q.Done(1, "a");
  q.Done(2, "b");
  q.Done(1, "c");
  std::vector<std::string> one;
  q.TakeDone(1, &one);
  EXPECT_EQ(one, (std::vector<std::string>{"a", "c"}));
  std::vector<std::string> again;
  q.TakeDone(1, &again);
  EXPECT_TRUE(again.empty()) << "an ended load must be reported once";
  std::vector<std::string> all;
  q.TakeDone(LoadQueue::kAll, &all);
  EXPECT_EQ(all, (std::vector<std::string>{"b"}));
}

}  // namespace
}  // namespace kvtier

#include "manager/load_queue.h"

#include <algorithm>

#include "transfer/transfer_job.h"

namespace kvtier {

void LoadQueue::Plan(std::vector<PlannedLoad> loads) {
  for (PlannedLoad& p : loads) planned_.push_back(std::move(p));
}

std::vector<PlannedLoad> LoadQueue::TakePlanned(uint32_t instance) {
  std::vector<PlannedLoad> taken, others;
  for (PlannedLoad& p : planned_) {
    (Matches(p.instance, instance) ? taken : others).push_back(std::move(p));
  }
  planned_.swap(others);
  return taken;
}

void LoadQueue::Started(uint32_t instance, std::shared_ptr<TransferJob> job, bool async) {
  std::erase_if(jobs_, [](const auto& j) { return j.second->Done(); });
  if (!async) jobs_.emplace_back(instance, std::move(job));
}

std::vector<std::shared_ptr<TransferJob>> LoadQueue::JobsOf(uint32_t instance) const {
  std::vector<std::shared_ptr<TransferJob>> jobs;
  for (const auto& [owner, job] : jobs_) {
    if (Matches(owner, instance)) jobs.push_back(job);
  }
  return jobs;
}

void LoadQueue::Done(uint32_t instance, std::string request_id) {
  done_.emplace_back(instance, std::move(request_id));
}

void LoadQueue::TakeDone(uint32_t instance, std::vector<std::string>* to) {
  TakeIdsOf(&done_, instance, to);
}

void TakeIdsOf(std::vector<std::pair<uint32_t, std::string>>* from, uint32_t instance,
               std::vector<std::string>* to) {
  std::erase_if(*from, [&](std::pair<uint32_t, std::string>& e) {
    if (instance != LoadQueue::kAll && e.first != instance) return false;
    to->push_back(std::move(e.second));
    return true;
  });
}

}  // namespace kvtier

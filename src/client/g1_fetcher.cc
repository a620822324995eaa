#include "client/g1_fetcher.h"

#include <chrono>
#include <string>

#include "core/host_port.h"
#include "tier/block_format.h"
#include "tier/cond_wait.h"
#include "transfer/block_copy.h"

namespace kvtier::client {

Result<std::unique_ptr<G1Fetcher>> G1Fetcher::Create(const proto::G4Config& config,
                                                     const G1Memory& g1, CopyGate* gate,
                                                     Report report) {
  if (g1.on_device) {
    return Status::InvalidArgument(
        "G1 is device memory: a socket cannot receive into it, so G4 loads go through G2");
  }
  KVTIER_RETURN_IF_ERROR(g1.Validate());
  RedisStoreOptions ro;
  ro.endpoints = SplitEndpoints(config.endpoints);
  ro.cluster = config.cluster;
  ro.username = config.username;
  ro.password = config.password;
  ro.connections_per_node = config.connections;
  if (config.pipeline_bytes > 0) ro.max_pipeline_bytes = config.pipeline_bytes;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<RemoteStore> store, OpenRedisStore(ro));
  std::unique_ptr<G1Fetcher> f(new G1Fetcher(g1, gate, std::move(report), std::move(store)));
  for (uint32_t i = 0; i < config.connections; ++i) {
    f->workers_.emplace_back([raw = f.get()] { raw->Worker(); });
  }
  return f;
}

G1Fetcher::G1Fetcher(const G1Memory& g1, CopyGate* gate, Report report,
                     std::unique_ptr<RemoteStore> store)
    : g1_(g1), gate_(gate), report_(std::move(report)), store_(std::move(store)) {}

G1Fetcher::~G1Fetcher() {
  std::deque<proto::FetchCall> left;
  {
    MutexLock lock(&mu_);
    stop_ = true;
    left.swap(queue_);
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  for (const proto::FetchCall& call : left) {
    proto::FetchDone done;
    done.batch = call.batch;
    done.statuses.assign(call.items.size(),
                         Status::Unavailable("the engine's G4 fetcher stopped (its data "
                                             "connection to kvtier serve ended)"));
    report_(done);
  }
}

void G1Fetcher::Enqueue(proto::FetchCall call) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(call));
  }
  cv_.notify_one();
}

void G1Fetcher::Worker() {
  for (;;) {
    proto::FetchCall call;
    {
      MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) CondWait(&cv_, &mu_);
      if (stop_) return;
      call = std::move(queue_.front());
      queue_.pop_front();
    }
    report_(Run(call));
  }
}

proto::FetchDone G1Fetcher::Run(const proto::FetchCall& call) {
  const KvLayout& layout = g1_.layout;
  const uint64_t header_bytes = BlockHeaderBytes(layout);
  proto::FetchDone done;
  done.batch = call.batch;
  done.statuses.assign(call.items.size(), Status::Ok());
  const auto deadline = RemoteClock::time_point(std::chrono::nanoseconds(call.deadline_ns));
  std::vector<size_t> asked;  // items with a valid block, in order
  for (size_t k = 0; k < call.items.size(); ++k) {
    const G4Fetch& item = call.items[k];
    if (item.g1_block >= g1_.num_blocks) {
      done.statuses[k] =
          Status::InvalidArgument("a fetch names G1 block " + std::to_string(item.g1_block) +
                                  "; this engine has " + std::to_string(g1_.num_blocks));
    } else if (item.tokens.size() != layout.tokens_per_block) {
      done.statuses[k] = Status::InvalidArgument(
          "a fetch carries " + std::to_string(item.tokens.size()) + " tokens for a block of " +
          std::to_string(layout.tokens_per_block));
    } else {
      asked.push_back(k);
    }
  }
  if (asked.empty()) return done;
  CopyGate::Pass pass(*gate_);
  if (RemoteClock::now() >= deadline) {
    for (size_t k : asked) {
      done.statuses[k] = Status::TimedOut("the fetch's deadline passed before it could start");
    }
    return done;
  }
  std::vector<uint8_t> headers(asked.size() * header_bytes);
  std::vector<RemoteGet> gets(asked.size());
  // Each payload is hashed as it lands, while it is still in the caches: no second pass over G1.
  std::vector<PayloadHasher> hashers(asked.size());
  for (size_t j = 0; j < asked.size(); ++j) {
    const G4Fetch& item = call.items[asked[j]];
    gets[j].name = item.name;
    gets[j].pieces.emplace_back(headers.data() + j * header_bytes, header_bytes);
    AppendBlockPieces(g1_, item.g1_block, &gets[j].pieces);
    gets[j].on_landed = [h = &hashers[j], header_bytes](uint64_t offset,
                                                        std::span<const uint8_t> bytes) {
      if (offset == 0) h->Reset();  // a get tried again starts over
      if (offset + bytes.size() <= header_bytes) return;
      h->Update(bytes.subspan(offset < header_bytes ? header_bytes - offset : 0));
    };
  }
  std::vector<Status> results(gets.size());
  store_->Get(gets, deadline, results);
  for (size_t j = 0; j < asked.size(); ++j) {
    const G4Fetch& item = call.items[asked[j]];
    Status st = results[j];
    if (st.ok()) {
      const ExpectedBlock e = ExpectedLayoutBlock(layout, item.namespace_id, item.key, item.tokens);
      const std::span<const std::span<uint8_t>> payload(gets[j].pieces.data() + 1,
                                                        gets[j].pieces.size() - 1);
      const BlockCheck check =
          VerifyBlockPieces({headers.data() + j * header_bytes, header_bytes}, payload,
                            gets[j].bytes_read, e, hashers[j].Digest());
      if (check != BlockCheck::kOk) {
        st = Status::Corruption("G4 object " + item.name + " failed verification (" +
                                BlockCheckName(check) + "); not served");
      }
    }
    done.statuses[asked[j]] = st;
  }
  return done;
}

}  // namespace kvtier::client

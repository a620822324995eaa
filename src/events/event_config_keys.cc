#include "events/event_config_keys.h"

#include <cstdint>

namespace kvtier {

Status CheckZmqAddress(std::string_view address) {
  if (!address.empty() && !address.starts_with("tcp://") && !address.starts_with("ipc://") &&
      !address.starts_with("inproc://")) {
    return Status::InvalidArgument(
        "not a ZMQ address (tcp://HOST:PORT, tcp://*:PORT, ipc://PATH or inproc://NAME)");
  }
  return Status::Ok();
}

ConfigKeyTable EventConfigKeys() {
  using T = ConfigType;
  const std::string zmq_allowed =
      "a ZMQ address: tcp://*:5557 (bind), tcp://HOST:PORT, ipc://PATH, or empty (off)";
  ConfigKeyTable table;
  table.order = 300;
  table.keys = {
      {{"events.endpoint",
        T::kString,
        "",
        "ZMQ PUB address of the KV event stream (tcp://*:5557 binds, tcp://host:5557 connects to "
        "a subscriber that binds; empty: off)",
        0,
        UINT64_MAX,
        {}},
       CheckZmqAddress,
       zmq_allowed},
      {{"events.replay_endpoint",
        T::kString,
        "",
        "ZMQ ROUTER address (bound) that replays past batches from a sequence number (empty: "
        "none)",
        0,
        UINT64_MAX,
        {}},
       CheckZmqAddress,
       zmq_allowed},
      {{"events.topic", T::kString, "", "topic frame of every event message", 0, UINT64_MAX, {}}},
      {{"events.queue_events",
        T::kUint,
        "100000",
        "events waiting to be sent at most; beyond it events are dropped and counted",
        1,
        1u << 24,
        {}}},
      {{"events.replay_batches", T::kUint, "10000", "batches kept for replay", 0, 1u << 20, {}}},
      {{"events.replay_bytes",
        T::kBytes,
        "256MiB",
        "payload bytes kept for replay at most (the oldest batches go first)",
        4096,
        UINT64_MAX,
        {}}},
      {{"events.data_parallel_rank",
        T::kUint,
        "0",
        "data_parallel_rank written in every batch (vLLM's)",
        0,
        1u << 16,
        {}}},
  };
  return table;
}

}  // namespace kvtier

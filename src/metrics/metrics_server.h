// MetricsServer: a tiny HTTP/1.1 server for Prometheus scrapes. One thread; GET /metrics
// returns the body of a render callback with the exposition's Content-Type; any other path is
// 404, any other method 405, a malformed request line 400, a request head over
// Options::max_request_bytes 431. Every response closes its connection (no keep-alive).
//
// It never blocks its owner: the thread multiplexes up to Options::max_connections clients with
// poll() on non-blocking sockets, and drops one that has not sent its whole request head (or
// read its whole response) within Options::timeout. A slow or hostile client costs one slot
// for at most that long; others are served meanwhile.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "kvtier/status.h"

namespace kvtier {

class MetricsServer {
 public:
  struct Options {
    std::string bind = "127.0.0.1";  // an IPv4 address or "localhost"; 0.0.0.0 for every one
    uint16_t port = 0;               // 0: an ephemeral port (see port())
    uint32_t max_request_bytes = 8192;
    uint32_t max_connections = 16;
    std::chrono::milliseconds timeout{5000};

    // Ok, or InvalidArgument naming the field: max_request_bytes >= 64, max_connections >= 1,
    // timeout > 0.
    Status Validate() const;
  };
  using Render = std::function<std::string()>;

  // Listens and starts the thread. InvalidArgument for bad options or a bind address that is
  // not an IPv4 address; Unavailable when the address cannot be bound (the message names the
  // address and port, the reason, e.g. "Address already in use", and what to do).
  static Result<std::unique_ptr<MetricsServer>> Start(const Options& options, Render render);
  // Stops the thread and closes every socket.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  uint16_t port() const { return port_; }
  uint64_t scrapes() const { return scrapes_.load(std::memory_order_relaxed); }
  // Requests answered with an error status, or dropped (timed out, too many connections).
  uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }

 private:
  MetricsServer(const Options& options, Render render);
  void Loop();

  Options options_;
  Render render_;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // a pipe: the destructor writes to stop the loop
  uint16_t port_ = 0;
  std::atomic<uint64_t> scrapes_{0};
  std::atomic<uint64_t> rejected_{0};
  std::thread thread_;
};

}  // namespace kvtier

// src/metrics: histograms, the text exposition, and the /metrics server over real sockets
// (a real client on 127.0.0.1: good requests, bad ones, a huge head, a silent client, a port
// in use). The exposition is also checked by Python's prometheus_client parser in
// tests/metrics_scrape_test.py.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "metrics/metrics.h"
#include "metrics/metrics_server.h"
#include "metrics/prometheus_text.h"

namespace kvtier {
namespace {

using namespace std::chrono_literals;

TEST(HistogramTest, BucketsAreUpperInclusiveAndCountEverything) {
  Histogram h;
  h.ObserveSeconds(1e-6);   // exactly the first bound: first bucket
  h.ObserveSeconds(3e-6);   // (2.5us, 5us]
  h.ObserveSeconds(0.2);    // (0.1, 0.25]
  h.ObserveSeconds(100.0);  // +Inf
  h.ObserveNanos(-5);       // counted as 0: first bucket
  const Histogram::Snapshot s = h.Read();
  EXPECT_EQ(s.count, 5u);
  EXPECT_EQ(s.buckets[0], 2u);
  EXPECT_EQ(s.buckets[2], 1u);
  EXPECT_EQ(s.buckets[16], 1u);
  EXPECT_EQ(s.buckets[kHistogramBounds], 1u);
  EXPECT_NEAR(s.sum_seconds, 100.200004, 1e-6);
}

TEST(HistogramTest, ConcurrentObservationsAreAllCounted) {
  Histogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) h.ObserveNanos(i % 5000);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(h.Read().count, 400000u);
}

TEST(PrometheusTextTest, RendersCountersGaugesHistogramsWithEscapes) {
  MetricsRegistry r;
  r.AddCounter("kvtier_things", "Things.\nTwo lines \\ slash.", {{"tier", "g2"}})->Add(3);
  r.AddGauge("kvtier_level", "Level.")->Set(0.5);
  r.AddHistogram("kvtier_wait_seconds", "Waits.", {{"tier", "g\"3"}})->ObserveSeconds(0.002);
  r.AddCollector([](MetricSink& sink) {
    sink.Add("kvtier_computed", "Computed.", MetricType::kGauge, {}, 7);
  });
  const std::string text = RenderPrometheusText(r.Snapshot());
  EXPECT_NE(text.find("# HELP kvtier_things_total Things.\\nTwo lines \\\\ slash.\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE kvtier_things_total counter\nkvtier_things_total{tier=\"g2\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("kvtier_level 0.5\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_computed 7\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_wait_seconds_bucket{tier=\"g\\\"3\",le=\"0.001\"} 0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvtier_wait_seconds_bucket{tier=\"g\\\"3\",le=\"0.0025\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("kvtier_wait_seconds_bucket{tier=\"g\\\"3\",le=\"+Inf\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("kvtier_wait_seconds_count{tier=\"g\\\"3\"} 1\n"), std::string::npos);
  // Families come out sorted by name.
  EXPECT_LT(text.find("kvtier_computed"), text.find("kvtier_level"));
}

TEST(PrometheusTextTest, SpecialValues) {
  EXPECT_EQ(FormatMetricValue(12), "12");
  EXPECT_EQ(FormatMetricValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatMetricValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatMetricValue(0.0 / 0.0), "NaN");
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
}

TEST(MetricNameTest, Validates) {
  EXPECT_TRUE(IsValidMetricName("kvtier_a:b_1"));
  EXPECT_FALSE(IsValidMetricName("1abc"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName(""));
}

// ---- the server, over real sockets ----

int Connect(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` and reads until the server closes (at most `limit`).
std::string Exchange(uint16_t port, const std::string& request, std::chrono::milliseconds limit) {
  const int fd = Connect(port);
  if (fd < 0) return "<connect failed>";
  if (!request.empty()) (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  const auto end = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      out += "<timed out>";
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

std::unique_ptr<MetricsServer> StartServer(std::chrono::milliseconds timeout = 5000ms) {
  MetricsServer::Options o;
  o.timeout = timeout;
  o.max_request_bytes = 1024;
  auto s = MetricsServer::Start(o, [] { return std::string("kvtier_up 1\n"); });
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(MetricsServerTest, ServesMetricsAnd404Elsewhere) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  ASSERT_NE(s->port(), 0);
  const std::string ok = Exchange(s->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 5s);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(ok.find("\r\n\r\nkvtier_up 1\n"), std::string::npos);
  EXPECT_EQ(Exchange(s->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n", 5s).rfind("HTTP/1.1 200", 0),
            0u);
  EXPECT_EQ(Exchange(s->port(), "GET / HTTP/1.1\r\n\r\n", 5s).rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(Exchange(s->port(), "POST /metrics HTTP/1.1\r\n\r\n", 5s).rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(Exchange(s->port(), "garbage\r\n\r\n", 5s).rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(s->scrapes(), 2u);
  EXPECT_EQ(s->rejected(), 3u);
}

TEST(MetricsServerTest, HugeHeadIsRefusedNotBuffered) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  const std::string huge = "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(64 * 1024, 'a');
  const std::string r = Exchange(s->port(), huge, 5s);
  EXPECT_EQ(r.rfind("HTTP/1.1 431", 0), 0u) << r.substr(0, 100);
  // Still serving.
  EXPECT_EQ(Exchange(s->port(), "GET /metrics HTTP/1.1\r\n\r\n", 5s).rfind("HTTP/1.1 200", 0), 0u);
}

TEST(MetricsServerTest, SilentClientIsDroppedAndDoesNotBlockOthers) {
  // The silent client's time-out (6 s) is far longer than the bound on the other's wait (3 s),
  // so a server that served one client at a time fails even on a loaded machine. (With 2 s and
  // 1 s, a 2-core machine running two builds beside ctest -j2 once took 3.5 s to serve it.)
  auto s = StartServer(6s);
  ASSERT_NE(s, nullptr);
  const int silent = Connect(s->port());
  ASSERT_GE(silent, 0);
  (void)!send(silent, "GET /met", 8, MSG_NOSIGNAL);  // and never the rest
  // Another client is served at once, while the silent one holds its connection.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Exchange(s->port(), "GET /metrics HTTP/1.1\r\n\r\n", 5s).rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  // The silent one is closed by the server after its time-out.
  pollfd p{silent, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 15000), 1) << "the server never dropped a silent client";
  char c;
  EXPECT_LE(read(silent, &c, 1), 0);
  close(silent);
  EXPECT_GE(s->rejected(), 1u);
}

TEST(MetricsServerTest, PortInUseIsAClearError) {
  auto first = StartServer();
  ASSERT_NE(first, nullptr);
  MetricsServer::Options o;
  o.port = first->port();
  auto second = MetricsServer::Start(o, [] { return std::string(); });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  const std::string msg = second.status().ToString();
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(first->port())), std::string::npos) << msg;
  EXPECT_NE(msg.find("in use"), std::string::npos) << msg;
  EXPECT_NE(msg.find("KVTIER_METRICS_PORT"), std::string::npos) << msg;
}

TEST(MetricsServerTest, BadOptionsAreRefused) {
  MetricsServer::Options o;
  o.bind = "not-an-address";
  auto s = MetricsServer::Start(o, [] { return std::string(); });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().ToString().find("metrics.bind"), std::string::npos);
  MetricsServer::Options t;
  t.timeout = 0ms;
  EXPECT_FALSE(MetricsServer::Start(t, [] { return std::string(); }).ok());
}

}  // namespace
}  // namespace kvtier

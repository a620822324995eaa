#include "metrics/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "metrics/prometheus_text.h"

namespace kvtier {

namespace {

using Clock = std::chrono::steady_clock;

struct Conn {
  int fd = -1;
  std::string in;
  std::string out;
  size_t out_off = 0;
  bool responding = false;
  Clock::time_point deadline;
};

std::string Response(int code, const char* reason, const std::string& content_type,
                     const std::string& body) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\n";
  r += "Content-Type: " + content_type + "\r\n";
  r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  r += "Connection: close\r\n\r\n";
  r += body;
  return r;
}

std::string ErrorResponse(int code, const char* reason, const std::string& message) {
  return Response(code, reason, "text/plain; charset=utf-8", message + "\n");
}

}  // namespace

Status MetricsServer::Options::Validate() const {
  if (max_request_bytes < 64) {
    return Status::InvalidArgument("MetricsServer: max_request_bytes must be >= 64");
  }
  if (max_connections < 1) {
    return Status::InvalidArgument("MetricsServer: max_connections must be >= 1");
  }
  if (timeout.count() <= 0) return Status::InvalidArgument("MetricsServer: timeout must be > 0");
  return Status::Ok();
}

MetricsServer::MetricsServer(const Options& options, Render render)
    : options_(options), render_(std::move(render)) {}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Options& options, Render render) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(options.port);
  const std::string host = options.bind == "localhost" ? "127.0.0.1" : options.bind;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return Status::InvalidArgument("metrics.bind = '" + options.bind +
                                   "' is not an IPv4 address; give one such as 127.0.0.1 "
                                   "(this machine only) or 0.0.0.0 (every interface)");
  }
  std::unique_ptr<MetricsServer> s(new MetricsServer(options, std::move(render)));
  s->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s->listen_fd_ < 0) return Status::FromErrno(errno, "metrics: socket");
  const int one = 1;
  setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const std::string where = options.bind + ":" + std::to_string(options.port);
  if (bind(s->listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(s->listen_fd_, 64) != 0) {
    const int err = errno;
    return Status::Unavailable("metrics: cannot listen on " + where + ": " + std::strerror(err) +
                               "; set metrics.port (KVTIER_METRICS_PORT) to a free port, or 0 "
                               "to turn the /metrics endpoint off");
  }
  socklen_t len = sizeof(addr);
  if (getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::FromErrno(errno, "metrics: getsockname");
  }
  s->port_ = ntohs(addr.sin_port);
  if (pipe2(s->wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status::FromErrno(errno, "metrics: pipe");
  }
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    const char b = 1;
    (void)!write(wake_fds_[1], &b, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_fds_[0], wake_fds_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void MetricsServer::Loop() {
  std::vector<Conn> conns;
  std::vector<pollfd> pfds;
  char buf[4096];
  for (;;) {
    pfds.clear();
    pfds.push_back({wake_fds_[0], POLLIN, 0});
    pfds.push_back({listen_fd_, POLLIN, 0});
    for (const Conn& c : conns) {
      pfds.push_back({c.fd, static_cast<short>(c.responding ? POLLOUT : POLLIN), 0});
    }
    // Wake up at the earliest deadline (at most every second).
    auto now = Clock::now();
    auto wait = std::chrono::milliseconds(1000);
    for (const Conn& c : conns) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now);
      if (left < wait) wait = std::max(left, std::chrono::milliseconds(0));
    }
    const int n = poll(pfds.data(), pfds.size(), static_cast<int>(wait.count()) + 1);
    if (n < 0 && errno != EINTR) return;
    if (pfds[0].revents != 0) break;  // stop
    now = Clock::now();
    // Existing connections first (their pollfds follow the first two, in order).
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      const short rev = pfds[i + 2].revents;
      bool close_it = false;
      if (!c.responding && (rev & (POLLIN | POLLHUP | POLLERR))) {
        const ssize_t r = read(c.fd, buf, sizeof(buf));
        if (r <= 0) {
          if (r == 0 || (errno != EAGAIN && errno != EINTR)) close_it = true;
        } else {
          c.in.append(buf, static_cast<size_t>(r));
          const size_t head_end = c.in.find("\r\n\r\n");
          if (head_end == std::string::npos && c.in.size() > options_.max_request_bytes) {
            c.out = ErrorResponse(
                431, "Request Header Fields Too Large",
                "request head over " + std::to_string(options_.max_request_bytes) + " bytes");
            rejected_.fetch_add(1, std::memory_order_relaxed);
            c.responding = true;
          } else if (head_end != std::string::npos) {
            const std::string line = c.in.substr(0, c.in.find("\r\n"));
            const size_t sp1 = line.find(' ');
            const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
            if (sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
              c.out = ErrorResponse(400, "Bad Request", "expected: GET /metrics HTTP/1.1");
              rejected_.fetch_add(1, std::memory_order_relaxed);
            } else {
              const std::string method = line.substr(0, sp1);
              std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
              if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
              if (method != "GET") {
                c.out = ErrorResponse(405, "Method Not Allowed", "only GET is served");
                rejected_.fetch_add(1, std::memory_order_relaxed);
              } else if (path != "/metrics") {
                c.out = ErrorResponse(404, "Not Found", "not found: try GET /metrics");
                rejected_.fetch_add(1, std::memory_order_relaxed);
              } else {
                c.out = Response(200, "OK", kPrometheusContentType, render_());
                scrapes_.fetch_add(1, std::memory_order_relaxed);
              }
            }
            c.responding = true;
          }
        }
      } else if (c.responding && (rev & (POLLOUT | POLLHUP | POLLERR))) {
        const ssize_t w =
            send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
          close_it = true;
        } else if (w > 0) {
          c.out_off += static_cast<size_t>(w);
          if (c.out_off == c.out.size()) close_it = true;
        }
      }
      if (!close_it && now >= c.deadline) {
        close_it = true;  // a slow client: dropped
        rejected_.fetch_add(1, std::memory_order_relaxed);
      }
      if (close_it) {
        close(c.fd);
        c.fd = -1;
      }
    }
    std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
    if (pfds[1].revents & POLLIN) {
      for (;;) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        if (conns.size() >= options_.max_connections) {
          close(fd);  // full: the client retries at its next scrape
          rejected_.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        Conn c;
        c.fd = fd;
        c.deadline = now + options_.timeout;
        conns.push_back(std::move(c));
      }
    }
  }
  for (Conn& c : conns) close(c.fd);
}

}  // namespace kvtier

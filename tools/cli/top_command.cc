// kvtier top URL [URL...]: a live terminal view of running kvtier processes, read from their
// Prometheus /metrics (docs/metrics.md): hit ratio by tier, GB/s by path, p50/p99 load latency
// from the histograms, occupancy bars, and the error counters. Refreshed every second; q or
// Ctrl-C exits and restores the terminal. A target that does not answer is shown as down and
// retried at every refresh.
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/host_port.h"
#include "metrics/metrics.h"

namespace kvtier::cli {

namespace {

using Clock = std::chrono::steady_clock;

// One sample line: name{labels} value.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Target {
  std::string url, host, port, path;
  bool up = false;
  std::string error;
  std::vector<Sample> now, before;
  Clock::time_point at, before_at;
  bool has_before = false;
};

// Parses the text exposition's sample lines (comments and malformed lines are skipped).
std::vector<Sample> ParseSamples(const std::string& text) {
  std::vector<Sample> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') break;
        const std::string key = line.substr(i, eq - i);
        std::string val;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) {
            ++j;
            val += line[j] == 'n' ? '\n' : line[j];
          } else {
            val += line[j];
          }
        }
        s.labels[key] = val;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i < line.size() && line[i] == '}') ++i;
    }
    while (i < line.size() && line[i] == ' ') ++i;
    const std::string v = line.substr(i, line.find(' ', i) - i);
    if (v.empty()) continue;
    s.value = v == "+Inf" ? INFINITY : v == "-Inf" ? -INFINITY : std::strtod(v.c_str(), nullptr);
    out.push_back(std::move(s));
  }
  return out;
}

// Splits http://host:port/path (or host:port). InvalidArgument, saying what is wrong, when
// there is no host or no port, or the port is not in 1..65535.
Status ParseUrl(const std::string& url, Target* t) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  const size_t slash = rest.find('/');
  t->path = slash == std::string::npos ? "/metrics" : rest.substr(slash);
  auto hp = ParseHostPort(rest.substr(0, slash), "target");
  if (!hp.ok()) {
    return Status::InvalidArgument(hp.status().message() + " (in '" + url +
                                   "'); give http://HOST:PORT/metrics or HOST:PORT");
  }
  t->host = hp->host;
  t->port = std::to_string(hp->port);
  t->url = url;
  return Status::Ok();
}

// GET with a total time limit; the body, or an error message in *error.
bool HttpGet(const Target& t, std::chrono::milliseconds limit, std::string* body,
             std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* ai = nullptr;
  if (const int rc = getaddrinfo(t.host.c_str(), t.port.c_str(), &hints, &ai); rc != 0) {
    *error = std::string("cannot resolve ") + t.host + ": " + gai_strerror(rc);
    return false;
  }
  const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const auto deadline = Clock::now() + limit;
  int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  auto wait = [&](short events) -> bool {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd, events, 0};
      const int n = poll(&p, 1, static_cast<int>(left.count()));
      if (n == 1) return true;
      if (n < 0 && errno == EINTR) continue;  // a signal (a terminal resize): wait on
      return false;
    }
  };
  if (rc != 0 && errno == EINPROGRESS) {
    if (!wait(POLLOUT)) {
      *error = "connect timed out";
      close(fd);
      return false;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    *error = std::strerror(errno);
    close(fd);
    return false;
  }
  const std::string req = "GET " + t.path + " HTTP/1.1\r\nHost: " + t.host +
                          "\r\nConnection: close\r\nUser-Agent: kvtier-top\r\n\r\n";
  size_t sent = 0;
  while (sent < req.size()) {
    if (!wait(POLLOUT)) break;
    const ssize_t n = send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string resp;
  char buf[16384];
  for (;;) {
    if (!wait(POLLIN)) {
      *error = "no complete answer within " + std::to_string(limit.count()) + " ms";
      close(fd);
      return false;
    }
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;
    resp.append(buf, static_cast<size_t>(n));
    if (resp.size() > (64u << 20)) break;
  }
  close(fd);
  if (resp.rfind("HTTP/1.", 0) != 0) {
    *error = "not an HTTP answer";
    return false;
  }
  const std::string status = resp.substr(9, 3);
  if (status != "200") {
    *error = "HTTP " + resp.substr(9, resp.find("\r\n") - 9);
    return false;
  }
  const size_t head = resp.find("\r\n\r\n");
  *body = head == std::string::npos ? "" : resp.substr(head + 4);
  return true;
}

double Sum(const std::vector<Sample>& v, const std::string& name,
           const std::map<std::string, std::string>& match = {}) {
  double s = 0;
  for (const Sample& x : v) {
    if (x.name != name) continue;
    bool ok = true;
    for (const auto& [k, val] : match) {
      auto it = x.labels.find(k);
      if (it == x.labels.end() || it->second != val) ok = false;
    }
    if (ok) s += x.value;
  }
  return s;
}

// Quantile q of histogram `name`{match} from cumulative buckets (linear within a bucket), in
// seconds; NaN when empty. `base` (may be empty) is subtracted first: the recent window.
double Quantile(const std::vector<Sample>& now, const std::vector<Sample>* base,
                const std::string& name, const std::map<std::string, std::string>& match,
                double q) {
  std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
  for (const Sample& x : now) {
    if (x.name != name + "_bucket") continue;
    bool ok = true;
    for (const auto& [k, val] : match) {
      auto it = x.labels.find(k);
      if (it == x.labels.end() || it->second != val) ok = false;
    }
    if (!ok) continue;
    const std::string le = x.labels.count("le") ? x.labels.at("le") : "+Inf";
    double c = x.value;
    if (base != nullptr) {
      auto m = match;
      m["le"] = le;
      c -= Sum(*base, name + "_bucket", m);
    }
    buckets.emplace_back(le == "+Inf" ? INFINITY : std::strtod(le.c_str(), nullptr), c);
  }
  std::sort(buckets.begin(), buckets.end());
  if (buckets.empty() || buckets.back().second <= 0) return NAN;
  const double rank = q * buckets.back().second;
  double prev_le = 0, prev_c = 0;
  for (const auto& [le, c] : buckets) {
    if (c >= rank) {
      if (std::isinf(le)) return prev_le;
      if (c == prev_c) return le;
      return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c);
    }
    prev_le = le;
    prev_c = c;
  }
  return prev_le;
}

std::string Ms(double seconds) {
  if (std::isnan(seconds)) return "-";
  char b[32];
  if (seconds < 1e-3) {
    std::snprintf(b, sizeof(b), "%.0fus", seconds * 1e6);
  } else {
    std::snprintf(b, sizeof(b), "%.2fms", seconds * 1e3);
  }
  return b;
}

std::string Bar(double fraction, int width) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int n = static_cast<int>(std::lround(fraction * width));
  return "[" + std::string(n, '#') + std::string(width - n, ' ') + "]";
}

std::string Fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof(b), f, a);
  return b;
}

// The view of one target.
std::string RenderTarget(const Target& t) {
  std::string o = "== " + t.url + "  ";
  if (!t.up) {
    return o + "DOWN: " + t.error + " (retrying every refresh)\n";
  }
  o += "up\n";
  const auto& n = t.now;
  const std::vector<Sample>* b = t.has_before ? &t.before : nullptr;
  const double dt = t.has_before ? std::chrono::duration<double>(t.at - t.before_at).count() : 0.0;
  auto rate = [&](const std::string& name, const std::map<std::string, std::string>& m) {
    if (b == nullptr || dt <= 0) return 0.0;
    return (Sum(n, name, m) - Sum(*b, name, m)) / dt;
  };
  const double lookups = Sum(n, "kvtier_lookups_total");
  const double asked = Sum(n, "kvtier_lookup_blocks_total");
  o += " lookups        " + Fmt("%.0f", lookups) + "  (" +
       Fmt("%.1f", rate("kvtier_lookups_total", {})) + "/s)   blocks asked " + Fmt("%.0f", asked) +
       "\n";
  o += " hit ratio     ";
  double all = 0;
  for (const char* tier : {"g2", "g3", "g4"}) {
    const double h = Sum(n, "kvtier_hit_blocks_total", {{"tier", tier}});
    all += h;
    o += std::string(" ") + tier + " " + Fmt("%5.1f%%", asked > 0 ? 100.0 * h / asked : 0.0);
  }
  o += "   all " + Fmt("%5.1f%%", asked > 0 ? 100.0 * all / asked : 0.0) + "\n";
  o += " GB/s          ";
  int shown = 0;
  for (const char* path : {"g2_to_g1", "g1_to_g2", "g2_to_g3", "g3_to_g2", "g3_to_g1", "g2_to_g4",
                           "g4_to_g2", "g4_to_g1"}) {
    const double total = Sum(n, "kvtier_transfer_bytes_total", {{"path", path}});
    if (total == 0) continue;
    o += std::string(" ") + path + " " +
         Fmt("%.3f", rate("kvtier_transfer_bytes_total", {{"path", path}}) / 1e9);
    ++shown;
  }
  if (shown == 0) o += " (nothing moved yet)";
  o += "\n";
  o += " load p50/p99  ";
  for (const char* tier : {"g2", "g3", "g4"}) {
    const double count = Sum(n, "kvtier_load_seconds_count", {{"tier", tier}});
    if (count == 0) continue;
    o += std::string(" ") + tier + " " +
         Ms(Quantile(n, nullptr, "kvtier_load_seconds", {{"tier", tier}}, 0.5)) + "/" +
         Ms(Quantile(n, nullptr, "kvtier_load_seconds", {{"tier", tier}}, 0.99));
  }
  o += "   lookup p50 " + Ms(Quantile(n, nullptr, "kvtier_lookup_seconds", {}, 0.5)) + "\n";
  for (const char* tier : {"g2", "g3"}) {
    const double slots = Sum(n, "kvtier_slots", {{"tier", tier}});
    if (slots == 0) continue;
    const double blocks = Sum(n, "kvtier_blocks", {{"tier", tier}});
    o += std::string(" occupancy ") + tier + "  " + Bar(blocks / slots, 30) + " " +
         Fmt("%5.1f%%", 100.0 * blocks / slots) + "  " + Fmt("%.0f", blocks) + "/" +
         Fmt("%.0f", slots) + " blocks, " +
         Fmt("%.1f", Sum(n, "kvtier_stored_bytes", {{"tier", tier}}) / 1048576.0) + " MiB\n";
  }
  o += " pinned " + Fmt("%.0f", Sum(n, "kvtier_pinned_blocks")) + "  queued saves " +
       Fmt("%.0f", Sum(n, "kvtier_queue_depth", {{"queue", "saves"}})) + "  demotions " +
       Fmt("%.0f", Sum(n, "kvtier_queue_depth", {{"queue", "demotions"}})) + "\n";
  o += " errors         load_failures " + Fmt("%.0f", Sum(n, "kvtier_load_failures_total")) +
       "  dropped_saves " + Fmt("%.0f", Sum(n, "kvtier_dropped_saves_total")) + "  corrupt " +
       Fmt("%.0f", Sum(n, "kvtier_corrupt_blocks_total")) + "  g3 " +
       (Sum(n, "kvtier_g3_quarantined") > 0 ? "QUARANTINED" : "ok") + "  g4 " +
       (Sum(n, "kvtier_g4_enabled") == 0       ? "off"
        : Sum(n, "kvtier_g4_breaker_open") > 0 ? "BREAKER OPEN"
                                               : "ok") +
       "  g4 failures " +
       Fmt("%.0f", Sum(n, "kvtier_g4_save_failures_total") +
                       Sum(n, "kvtier_g4_load_failures_total") +
                       Sum(n, "kvtier_g4_lookup_failures_total")) +
       "\n";
  return o;
}

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

void PrintUsage() {
  std::printf(
      "usage: kvtier top URL [URL...] [--interval-ms N] [--once]\n"
      "  A live view of running kvtier processes from their Prometheus endpoint\n"
      "  (KVTIER_METRICS_PORT): hit ratio by tier, GB/s by path, p50/p99 load latency,\n"
      "  occupancy, errors. URL: http://HOST:PORT/metrics or HOST:PORT. q or Ctrl-C quits.\n"
      "  --interval-ms N   refresh period (default 1000, 100..60000)\n"
      "  --once            print one view (two scrapes --interval-ms apart) and exit\n");
}

}  // namespace

int RunTop(const CliArgs& args) {
  if (args.Has("help")) {
    PrintUsage();
    return 0;
  }
  if (Status s = args.CheckKnown({"help", "interval-ms", "once"}); !s.ok()) return UsageError(s);
  auto interval = args.GetUint("interval-ms", 1000);
  if (!interval.ok()) return UsageError(interval.status());
  if (*interval < 100 || *interval > 60000) {
    return UsageError(Status::InvalidArgument("--interval-ms 100..60000"));
  }
  std::vector<std::string> urls = args.positional();
  if (urls.empty()) {
    return UsageError(Status::InvalidArgument(
        "give at least one URL, e.g. kvtier top http://127.0.0.1:9400/metrics"));
  }
  std::vector<Target> targets;
  for (const std::string& u : urls) {
    Target t;
    if (Status s = ParseUrl(u, &t); !s.ok()) return UsageError(s);
    targets.push_back(std::move(t));
  }
  const auto period = std::chrono::milliseconds(*interval);
  const bool once = args.Has("once");
  const bool interactive = !once && isatty(STDIN_FILENO) == 1 && isatty(STDOUT_FILENO) == 1;

  termios saved{};
  if (interactive) {
    tcgetattr(STDIN_FILENO, &saved);
    termios raw = saved;
    raw.c_lflag &= ~(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    std::fputs("\033[?1049h\033[?25l", stdout);  // alternate screen, hide the cursor
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  int frames = 0;
  while (!g_stop) {
    for (Target& t : targets) {
      std::string body, error;
      const auto at = Clock::now();
      if (HttpGet(t, std::min(period, std::chrono::milliseconds(2000)), &body, &error)) {
        if (t.up) {
          t.before = std::move(t.now);
          t.before_at = t.at;
          t.has_before = true;
        }
        t.now = ParseSamples(body);
        t.at = at;
        t.up = true;
      } else {
        t.up = false;
        t.has_before = false;
        t.error = error;
      }
    }
    ++frames;
    if (!once || frames >= 2) {
      std::string frame;
      if (interactive) frame += "\033[H\033[2J";
      frame += "kvtier top: " + std::to_string(targets.size()) + " target(s), refresh " +
               std::to_string(*interval) + " ms" + (interactive ? ", q to quit" : "") + "\n\n";
      for (const Target& t : targets) frame += RenderTarget(t) + "\n";
      std::fputs(frame.c_str(), stdout);
      std::fflush(stdout);
      if (once) break;
    }
    // Wait a period, waking for q.
    const auto until = Clock::now() + period;
    while (!g_stop && Clock::now() < until) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (!interactive) {
        pollfd p{-1, 0, 0};
        poll(&p, 0, static_cast<int>(std::max<int64_t>(left.count(), 1)));
        continue;
      }
      pollfd p{STDIN_FILENO, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 1))) == 1) {
        char c = 0;
        if (read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q' || c == 3)) g_stop = 1;
      }
    }
  }
  if (interactive) {
    std::fputs("\033[?25h\033[?1049l", stdout);  // cursor back, main screen back
    std::fflush(stdout);
    tcsetattr(STDIN_FILENO, TCSANOW, &saved);
  }
  bool any_up = false;
  for (const Target& t : targets) any_up = any_up || t.up;
  if (once && !any_up) return 1;
  return 0;
}

}  // namespace kvtier::cli

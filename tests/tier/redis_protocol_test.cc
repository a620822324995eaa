// Corrupt bytes from the network: a real TCP server in the test answers the store's requests
// with scripted, malformed RESP (a real redis-server never would, so this is the one place a
// stand-in speaks for the server). Every malformed reply must fail its items cleanly (IOError /
// Unavailable / TimedOut, never a crash, never bytes served), the connection must be dropped,
// and the next call on a fresh connection must work.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <thread>

#include "core/mutex.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;

// Accepts connections on 127.0.0.1:<free port>; for each request received (any bytes), sends
// the next scripted reply; a reply marked `close` closes the connection after it is sent.
class ScriptedServer {
 public:
  struct Reply {
    std::string bytes;
    bool close = false;
  };

  ScriptedServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Loop(); });
  }
  ~ScriptedServer() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  void Push(std::string bytes, bool close_after = false) {
    MutexLock lock(&mu_);
    script_.push_back(Reply{std::move(bytes), close_after});
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  void Loop() {
    std::vector<int> conns;
    while (!stop_) {
      std::vector<pollfd> fds = {{fd_, POLLIN, 0}};
      for (int c : conns) fds.push_back({c, POLLIN, 0});
      if (poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) conns.push_back(c);
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const int c = fds[i].fd;
        char buf[65536];
        const ssize_t n = recv(c, buf, sizeof(buf), 0);
        bool drop = n <= 0;
        if (n > 0) {
          Reply r;
          {
            MutexLock lock(&mu_);
            if (!script_.empty()) {
              r = script_.front();
              script_.pop_front();
            }
          }
          if (!r.bytes.empty()) (void)send(c, r.bytes.data(), r.bytes.size(), MSG_NOSIGNAL);
          drop = r.close;
        }
        if (drop) {
          close(c);
          conns.erase(std::find(conns.begin(), conns.end(), c));
        }
      }
    }
    for (int c : conns) close(c);
  }

  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  Mutex mu_;
  std::deque<Reply> script_ GUARDED_BY(mu_);
  std::thread thread_;
};

struct OneGet {
  std::vector<uint8_t> buf = std::vector<uint8_t>(64, 0xAB);
  RemoteGet get{"k", {}, 0};
  Status status;
};

OneGet Get(RemoteStore* store, milliseconds budget = milliseconds(300)) {
  OneGet g;
  g.get.dest = g.buf;
  std::vector<Status> r(1);
  store->Get(std::span<RemoteGet>(&g.get, 1), RemoteClock::now() + budget, r);
  g.status = r[0];
  return g;
}

bool Untouched(const OneGet& g) {
  return std::all_of(g.buf.begin(), g.buf.end(), [](uint8_t b) { return b == 0xAB; });
}

std::unique_ptr<RemoteStore> Open(const std::string& endpoint) {
  RedisStoreOptions o;
  o.endpoints = {endpoint};
  o.breaker.failure_threshold = 100;  // every scripted failure reaches the server
  auto s = OpenRedisStore(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

TEST(RedisProtocolTest, MalformedRepliesFailCleanlyAndTheNextCallWorks) {
  ScriptedServer server;
  auto store = Open(server.endpoint());
  const struct {
    const char* reply;
    const char* expect;  // in the status message
  } cases[] = {
      {"*1\r\n$1\r\nx\r\n", "unexpected reply type '*'"},
      {"$abc\r\n", "bad bulk length"},
      {"$-7\r\n", "bad bulk length"},
      {"$3\r\nabcXY", "not ended by CRLF"},
      {":12x\r\n", "bad integer"},
      {"+OK\r\n+OK\r\n", "unexpected reply to GET"},  // and the extra reply drops the link
  };
  for (const auto& c : cases) {
    server.Push(c.reply);
    OneGet g = Get(store.get());
    EXPECT_TRUE(g.status.Is(StatusCode::kIOError)) << c.reply << " -> " << g.status.ToString();
    EXPECT_NE(g.status.message().find(c.expect), std::string::npos) << g.status.ToString();
    EXPECT_EQ(g.get.bytes_read, 0u);
    // The broken connection was dropped: the next call opens a new one and reads cleanly.
    server.Push("$5\r\nhello\r\n");
    g = Get(store.get());
    ASSERT_TRUE(g.status.ok()) << "after " << c.reply << ": " << g.status.ToString();
    EXPECT_EQ(g.get.bytes_read, 5u);
    EXPECT_EQ(std::string(g.buf.begin(), g.buf.begin() + 5), "hello");
  }
}

TEST(RedisProtocolTest, ConnectionClosedMidReplyIsUnavailable) {
  ScriptedServer server;
  auto store = Open(server.endpoint());
  server.Push("$10\r\nhel", /*close_after=*/true);
  OneGet g = Get(store.get());
  EXPECT_TRUE(g.status.Is(StatusCode::kUnavailable)) << g.status.ToString();
  EXPECT_NE(g.status.message().find("closed"), std::string::npos) << g.status.ToString();
  server.Push("$2\r\nok\r\n");
  g = Get(store.get());
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
}

TEST(RedisProtocolTest, AbsurdBulkLengthIsNeverCopiedAndEndsByTheDeadline) {
  ScriptedServer server;
  auto store = Open(server.endpoint());
  server.Push("$99999999999\r\nxxxxxxxx");  // claims ~100 GB, sends 8 bytes, then nothing
  const auto t0 = RemoteClock::now();
  OneGet g = Get(store.get(), milliseconds(200));
  EXPECT_LT(RemoteClock::now() - t0, milliseconds(200 + 2000));  // slack for a loaded machine
  EXPECT_TRUE(g.status.Is(StatusCode::kTimedOut)) << g.status.ToString();
  EXPECT_TRUE(Untouched(g));
  // A complete oversized reply is Corruption, and the stream stays usable.
  server.Push("$70\r\n" + std::string(70, 'z') + "\r\n");
  g = Get(store.get());
  EXPECT_TRUE(g.status.Is(StatusCode::kCorruption)) << g.status.ToString();
  EXPECT_TRUE(Untouched(g));
  server.Push("$2\r\nok\r\n");
  g = Get(store.get());
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
}

TEST(RedisProtocolTest, ServerErrorRepliesCarryTheServerText) {
  ScriptedServer server;
  auto store = Open(server.endpoint());
  server.Push("-ERR something odd happened\r\n");
  OneGet g = Get(store.get());
  EXPECT_TRUE(g.status.Is(StatusCode::kIOError)) << g.status.ToString();
  EXPECT_NE(g.status.message().find("ERR something odd happened"), std::string::npos);
  // An unexpected but well-formed reply type for the command is an IOError too.
  server.Push(":1\r\n");
  g = Get(store.get());
  EXPECT_TRUE(g.status.Is(StatusCode::kIOError)) << g.status.ToString();
  EXPECT_NE(g.status.message().find("unexpected reply"), std::string::npos);
}

}  // namespace
}  // namespace kvtier

// kvtier serve's Unix socket transport (src/proto/unix_socket.h) between real processes:
// forked peers, memfds passed with frames, deadlines on both sides, stale and live sockets,
// the socket directory's checks, and peer credentials under another uid; and UniqueFd.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "hang_guard.h"
#include "proto/unix_socket.h"

namespace kvtier::proto {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Clock::time_point In(int ms) { return Clock::now() + milliseconds(ms); }

// ---- the Unix socket ---------------------------------------------------------------------

// A fresh directory under /tmp (mode 0700), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvtier-svc-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs `body` in a forked child that exits with its return value (SIGALRM ends it after 30 s,
// should it hang). The child never returns into the test.
pid_t ForkChild(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(30);
    ::_exit(body());
  }
  return pid;
}

// The child's exit code, or 128 + the signal that ended it.
int WaitChild(pid_t pid) {
  int st = 0;
  if (::waitpid(pid, &st, 0) != pid) return -1;
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

// The number of descriptors this process has open.
int OpenFdCount() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

// A memfd holding `bytes`.
UniqueFd MemfdWith(const char* name, std::string_view bytes) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC));
  if (!fd) return fd;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t r = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (r <= 0) return UniqueFd();
    done += static_cast<size_t>(r);
  }
  return fd;
}

// The whole content of `fd` (a memfd or regular file), read through a shared mapping.
std::string ReadThroughMmap(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size == 0) return "";
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return "";
  std::string out(static_cast<const char*>(p), static_cast<size_t>(st.st_size));
  ::munmap(p, static_cast<size_t>(st.st_size));
  return out;
}

std::string PayloadText(const Frame& f) { return std::string(f.payload.begin(), f.payload.end()); }

class UnixSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed";
    run_dir_ = dir_.path() + "/run";
    sock_ = run_dir_ + "/serve.sock";
  }
  // Listens at sock_ (creating run_dir_).
  UniqueFd Listen() {
    Result<UniqueFd> l = ListenUnix(sock_);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    return l.ok() ? std::move(l).value() : UniqueFd();
  }
  UniqueFd Accept(int listen_fd) {
    Result<UniqueFd> c = AcceptUnix(listen_fd, 5000);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : UniqueFd();
  }

  TempDir dir_;
  std::string run_dir_;
  std::string sock_;
};

TEST_F(UnixSocketTest, ListenCreatesAPrivateDirectoryAndSocket) {
  UniqueFd l = Listen();
  ASSERT_TRUE(l);
  struct stat st {};
  ASSERT_EQ(::stat(run_dir_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  ASSERT_EQ(::lstat(sock_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_TRUE(::fcntl(l.get(), F_GETFD) & FD_CLOEXEC);
}

TEST_F(UnixSocketTest, FramesFromAForkedChild) {
  UniqueFd l = Listen();
  ASSERT_TRUE(l);
  const pid_t child = ForkChild([&] {
    Result<UniqueFd> c = ConnectUnix(sock_);
    if (!c.ok()) return 2;
    if (!SendFrame(c->get(), 1, 100, AsBytes("hello")).ok()) return 3;
    if (!SendFrame(c->get(), 2, 101, {}).ok()) return 4;
    std::vector<uint8_t> big(1 << 20);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
    if (!SendFrame(c->get(), 3, 102, big, -1, In(10000)).ok()) return 5;
    return 0;  // exiting closes the connection
  });
  ASSERT_GT(child, 0);
  UniqueFd conn = Accept(l.get());
  ASSERT_TRUE(conn);
  EXPECT_TRUE(::fcntl(conn.get(), F_GETFD) & FD_CLOEXEC);
  Result<PeerCred> cred = GetPeerCred(conn.get());
  ASSERT_TRUE(cred.ok()) << cred.status().ToString();
  EXPECT_EQ(cred->pid, child);
  EXPECT_EQ(cred->uid, ::geteuid());
  EXPECT_EQ(cred->gid, ::getegid());

  Result<Frame> f = RecvFrame(conn.get(), In(5000));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->header.type, 1);
  EXPECT_EQ(f->header.seq, 100u);
  EXPECT_EQ(PayloadText(*f), "hello");
  EXPECT_FALSE(f->fd) << "no descriptor was sent";
  f = RecvFrame(conn.get(), In(5000));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->header.type, 2);
  EXPECT_EQ(f->header.seq, 101u);
  EXPECT_TRUE(f->payload.empty());
  f = RecvFrame(conn.get(), In(5000));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->header.seq, 102u);
  ASSERT_EQ(f->payload.size(), size_t{1} << 20);
  bool same = true;
  for (size_t i = 0; i < f->payload.size(); ++i) same &= f->payload[i] == uint8_t(i * 7);
  EXPECT_TRUE(same);

  f = RecvFrame(conn.get(), In(5000));
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(f.status().message().find("peer closed"), std::string::npos) << f.status().ToString();
  EXPECT_EQ(WaitChild(child), 0);
}

// A memfd passed each way: the child maps the one it received and sends back what it read;
// then it passes one of its own.
TEST_F(UnixSocketTest, MemfdsPassedWithFramesAreReadThroughMmap) {
  UniqueFd l = Listen();
  ASSERT_TRUE(l);
  std::string parent_bytes(10000, '\0');
  for (size_t i = 0; i < parent_bytes.size(); ++i) parent_bytes[i] = static_cast<char>(i % 251);
  const std::string child_bytes = "KV blocks from the engine";

  const pid_t child = ForkChild([&] {
    Result<UniqueFd> c = ConnectUnix(sock_);
    if (!c.ok()) return 2;
    Result<Frame> f = RecvFrame(c->get(), In(10000));
    if (!f.ok()) return 3;
    if (!f->fd) return 4;
    if (!(::fcntl(f->fd.get(), F_GETFD) & FD_CLOEXEC)) return 5;  // MSG_CMSG_CLOEXEC
    const std::string seen = ReadThroughMmap(f->fd.get());
    if (!SendFrame(c->get(), 2, f->header.seq, AsBytes(seen), -1, In(10000)).ok()) return 6;
    UniqueFd mine = MemfdWith("child", child_bytes);
    if (!mine) return 7;
    // An empty payload: the descriptor travels with the header.
    if (!SendFrame(c->get(), 3, 8, {}, mine.get(), In(10000)).ok()) return 8;
    Result<Frame> end = RecvFrame(c->get(), In(10000));
    return end.status().code() == StatusCode::kUnavailable ? 0 : 9;
  });
  ASSERT_GT(child, 0);
  UniqueFd conn = Accept(l.get());
  ASSERT_TRUE(conn);
  UniqueFd memfd = MemfdWith("parent", parent_bytes);
  ASSERT_TRUE(memfd);
  Status s = SendFrame(conn.get(), 1, 7, AsBytes("here is a memfd"), memfd.get(), In(5000));
  ASSERT_TRUE(s.ok()) << s.ToString();

  Result<Frame> echo = RecvFrame(conn.get(), In(5000));
  ASSERT_TRUE(echo.ok()) << echo.status().ToString();
  EXPECT_EQ(echo->header.seq, 7u);
  EXPECT_EQ(PayloadText(*echo), parent_bytes) << "the child read the memfd's bytes via mmap";
  EXPECT_FALSE(echo->fd);

  Result<Frame> passed = RecvFrame(conn.get(), In(5000));
  ASSERT_TRUE(passed.ok()) << passed.status().ToString();
  EXPECT_EQ(passed->header.type, 3);
  EXPECT_TRUE(passed->payload.empty());
  ASSERT_TRUE(passed->fd);
  EXPECT_TRUE(::fcntl(passed->fd.get(), F_GETFD) & FD_CLOEXEC);
  EXPECT_EQ(ReadThroughMmap(passed->fd.get()), child_bytes);

  conn.reset();
  EXPECT_EQ(WaitChild(child), 0);
}

// A peer that passes three descriptors with one frame: the first is kept, the others closed.
TEST_F(UnixSocketTest, ExtraPassedDescriptorsAreClosed) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  UniqueFd first = MemfdWith("first", "1"), second = MemfdWith("second", "2"),
           third = MemfdWith("third", "3");
  ASSERT_TRUE(first && second && third);

  FrameHeader h;
  h.type = 5;
  h.payload_bytes = 2;
  uint8_t bytes[kFrameHeaderBytes + 2];
  EncodeHeader(h, bytes);
  bytes[kFrameHeaderBytes] = 'o';
  bytes[kFrameHeaderBytes + 1] = 'k';
  iovec iov{bytes, sizeof(bytes)};
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(3 * sizeof(int));
  const int fds[3] = {first.get(), second.get(), third.get()};
  std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
  ASSERT_EQ(::sendmsg(b.get(), &msg, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(bytes)));
  first.reset();
  second.reset();
  third.reset();

  const int before = OpenFdCount();
  Result<Frame> f = RecvFrame(a.get(), In(5000));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(PayloadText(*f), "ok");
  ASSERT_TRUE(f->fd);
  EXPECT_EQ(ReadThroughMmap(f->fd.get()), "1") << "the first descriptor is the one kept";
  EXPECT_EQ(OpenFdCount(), before + 1) << "the two extra descriptors were closed";
}

TEST_F(UnixSocketTest, RecvFrameTimesOutAtItsDeadline) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);

  // Nothing arrives: TimedOut at the deadline, and the stream is still usable. Should the
  // receive ignore its deadline, shutting the other end down ends it (and fails the test).
  Result<Frame> f = Status::Internal("not run");
  const auto rescue = [&] { ::shutdown(b.get(), SHUT_WR); };
  testing::GuardedCall g =
      testing::RunGuarded([&] { f = RecvFrame(a.get(), In(200)); }, milliseconds(3000), rescue);
  ASSERT_TRUE(g.returned_in_time) << "RecvFrame ignored its deadline";
  auto took = g.took;
  EXPECT_EQ(f.status().code(), StatusCode::kTimedOut);
  EXPECT_NE(f.status().message().find("still usable"), std::string::npos) << f.status().ToString();
  EXPECT_GE(took, milliseconds(195));
  EXPECT_LT(took, milliseconds(3000));
  ASSERT_TRUE(SendFrame(b.get(), 1, 1, AsBytes("late")).ok());
  f = RecvFrame(a.get(), In(5000));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(PayloadText(*f), "late");

  // Part of a frame arrives: TimedOut, and the message says the stream is unusable.
  uint8_t header[kFrameHeaderBytes];
  FrameHeader h;
  h.payload_bytes = 100;
  EncodeHeader(h, header);
  ASSERT_EQ(::write(b.get(), header, sizeof(header)), static_cast<ssize_t>(sizeof(header)));
  ASSERT_EQ(::write(b.get(), "abc", 3), 3);
  g = testing::RunGuarded([&] { f = RecvFrame(a.get(), In(200)); }, milliseconds(3000), rescue);
  ASSERT_TRUE(g.returned_in_time) << "RecvFrame ignored its deadline";
  took = g.took;
  EXPECT_EQ(f.status().code(), StatusCode::kTimedOut);
  EXPECT_NE(f.status().message().find("only 27 bytes of a frame arrived"), std::string::npos)
      << f.status().ToString();
  EXPECT_NE(f.status().message().find("unusable"), std::string::npos) << f.status().ToString();
  EXPECT_GE(took, milliseconds(195));
  EXPECT_LT(took, milliseconds(3000));
}

TEST_F(UnixSocketTest, EndOfStreamIsUnavailable) {
  UniqueFd l = Listen();
  ASSERT_TRUE(l);
  // A peer that connects and leaves at once.
  pid_t child = ForkChild([&] { return ConnectUnix(sock_).ok() ? 0 : 2; });
  UniqueFd conn = Accept(l.get());
  ASSERT_TRUE(conn);
  Result<Frame> f = RecvFrame(conn.get(), In(5000));
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(f.status().message(), "receive of a frame: peer closed");
  EXPECT_EQ(WaitChild(child), 0);

  // A peer that leaves in the middle of a header.
  child = ForkChild([&] {
    Result<UniqueFd> c = ConnectUnix(sock_);
    if (!c.ok()) return 2;
    uint8_t header[kFrameHeaderBytes];
    EncodeHeader(FrameHeader{}, header);
    return ::write(c->get(), header, 10) == 10 ? 0 : 3;
  });
  conn = Accept(l.get());
  ASSERT_TRUE(conn);
  f = RecvFrame(conn.get(), In(5000));
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(f.status().message(), "receive of a frame: peer closed after 10 bytes of a frame");
  EXPECT_EQ(WaitChild(child), 0);
}

TEST_F(UnixSocketTest, BadHeaderFromThePeerIsInvalidArgument) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::write(b.get(), http, sizeof(http) - 1), static_cast<ssize_t>(sizeof(http) - 1));
  Result<Frame> f = RecvFrame(a.get(), In(5000));
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("not a kvtier service frame (magic 0x20544547)"),
            std::string::npos)
      << f.status().ToString();

  // A header that announces more than the limit: refused before any payload is read.
  FrameHeader h;
  h.payload_bytes = kMaxPayloadBytes + 1;
  uint8_t header[kFrameHeaderBytes];
  EncodeHeader(h, header);
  int sv2[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv2), 0);
  UniqueFd c(sv2[0]), d(sv2[1]);
  ASSERT_EQ(::write(d.get(), header, sizeof(header)), static_cast<ssize_t>(sizeof(header)));
  f = RecvFrame(c.get(), In(5000));
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("exceeds the limit"), std::string::npos)
      << f.status().ToString();
}

TEST_F(UnixSocketTest, ParentDirectoryOpenToOthersIsRefused) {
  for (mode_t mode : {0755, 0750, 0701, 0770}) {
    const std::string dir = dir_.path() + "/open" + std::to_string(mode);
    ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(dir.c_str(), mode), 0);
    const std::string path = dir + "/serve.sock";
    Result<UniqueFd> l = ListenUnix(path);
    EXPECT_EQ(l.status().code(), StatusCode::kFailedPrecondition) << std::oct << mode;
    EXPECT_NE(l.status().message().find("chmod 700 " + dir), std::string::npos)
        << l.status().ToString();
    struct stat st {};
    EXPECT_NE(::lstat(path.c_str(), &st), 0) << "no socket was created";
  }
}

TEST_F(UnixSocketTest, ParentDirectoryOfAnotherUidIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown a directory to uid 65534";
  const std::string dir = dir_.path() + "/theirs";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
  Result<UniqueFd> l = ListenUnix(dir + "/serve.sock");
  EXPECT_EQ(l.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(l.status().message().find("is owned by uid 65534"), std::string::npos)
      << l.status().ToString();
}

// Issue 40, finding 3: a socket directory reached through a symlink is refused even when it
// leads to a 0700 directory of the daemon's own uid (whoever owns the link could point it at a
// directory of its own later), and so is one below a directory that others may write.
TEST_F(UnixSocketTest, SymlinkedOrReplaceableSocketDirectoriesAreRefused) {
  const std::string real = dir_.path() + "/real";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  const std::string link = dir_.path() + "/link";
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  Result<UniqueFd> l = ListenUnix(link + "/serve.sock");
  EXPECT_EQ(l.status().code(), StatusCode::kFailedPrecondition) << l.status().ToString();
  EXPECT_NE(l.status().message().find("symbolic link"), std::string::npos) << l.status().ToString();
  struct stat st {};
  EXPECT_NE(::lstat((real + "/serve.sock").c_str(), &st), 0) << "a socket was made through it";

  const std::string open = dir_.path() + "/open";
  ASSERT_EQ(::mkdir(open.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open.c_str(), 0777), 0);  // writable by all, not sticky
  l = ListenUnix(open + "/run/serve.sock");
  EXPECT_EQ(l.status().code(), StatusCode::kFailedPrecondition) << l.status().ToString();
  EXPECT_NE(l.status().message().find("above the socket directory"), std::string::npos)
      << l.status().ToString();
  ASSERT_EQ(::chmod(open.c_str(), 01777), 0);  // sticky, as /tmp: nobody else can replace run/
  l = ListenUnix(open + "/run/serve.sock");
  EXPECT_TRUE(l.ok()) << l.status().ToString();
}

// Issue 40, finding 11: with service.allowed_gids the socket's directory and the socket belong
// to the group (0750, 0660), so its members can reach them; a directory that others or the
// group may write is still refused.
TEST_F(UnixSocketTest, AnAllowedGroupGetsTheDirectoryAndTheSocket) {
  const gid_t group = 65534;
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to group 65534";
  Result<UniqueFd> l = ListenUnix(sock_, group);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  struct stat st {};
  ASSERT_EQ(::lstat(run_dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_gid, group);
  ASSERT_EQ(::lstat(sock_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, group);
  l = Result<UniqueFd>(Status::Unavailable("closed"));
  const std::string other = dir_.path() + "/gw";
  ASSERT_EQ(::mkdir(other.c_str(), 0770), 0);
  ASSERT_EQ(::chown(other.c_str(), 0, group), 0);
  ASSERT_EQ(::chmod(other.c_str(), 0770), 0);
  l = ListenUnix(other + "/serve.sock", group);
  EXPECT_EQ(l.status().code(), StatusCode::kFailedPrecondition) << l.status().ToString();
}

TEST(AuthorizePeerTest, ASupplementaryGroupCounts) {
  PeerCred cred{1234, 4321, 4321, {100, 200}};
  const gid_t allowed[] = {200};
  EXPECT_TRUE(AuthorizePeer(cred, allowed).ok());
  const gid_t other[] = {300};
  EXPECT_EQ(AuthorizePeer(cred, other).code(), StatusCode::kFailedPrecondition);
}

TEST_F(UnixSocketTest, PathsThatCannotBeASocketAreRefused) {
  const std::string too_long = dir_.path() + "/" + std::string(120, 's');
  Result<UniqueFd> l = ListenUnix(too_long);
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("choose a shorter path"), std::string::npos)
      << l.status().ToString();
  EXPECT_EQ(ConnectUnix(too_long).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ListenUnix("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ListenUnix(run_dir_ + "/").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(UnixSocketTest, StaleSocketFileIsReplaced) {
  // A socket file that nobody accepts on, as a daemon that died leaves behind.
  ASSERT_EQ(::mkdir(run_dir_.c_str(), 0700), 0);
  {
    UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, sock_.data(), sock_.size());
    ASSERT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  struct stat st {};
  ASSERT_EQ(::lstat(sock_.c_str(), &st), 0);
  ASSERT_TRUE(S_ISSOCK(st.st_mode));
  Result<UniqueFd> stale = ConnectUnix(sock_);
  EXPECT_EQ(stale.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(stale.status().message().find("is kvtier serve running?"), std::string::npos)
      << stale.status().ToString();

  UniqueFd l = Listen();
  ASSERT_TRUE(l);
  Result<UniqueFd> c = ConnectUnix(sock_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  UniqueFd conn = Accept(l.get());
  ASSERT_TRUE(conn);
  ASSERT_TRUE(SendFrame(c->get(), 4, 4, AsBytes("fresh")).ok());
  Result<Frame> f = RecvFrame(conn.get(), In(5000));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(PayloadText(*f), "fresh");
}

TEST_F(UnixSocketTest, SecondListenOnALivePathIsAlreadyExists) {
  UniqueFd l = Listen();
  ASSERT_TRUE(l);
  Result<UniqueFd> second = ListenUnix(sock_);
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(second.status().message(), "another kvtier serve listens on " + sock_);

  // The first daemon still serves: it accepts the probe (which ends without a frame), then a
  // real engine.
  UniqueFd probe = Accept(l.get());
  ASSERT_TRUE(probe);
  EXPECT_EQ(RecvFrame(probe.get(), In(5000)).status().code(), StatusCode::kUnavailable);
  const pid_t child = ForkChild([&] {
    Result<UniqueFd> c = ConnectUnix(sock_);
    return c.ok() && SendFrame(c->get(), 1, 1, AsBytes("still here")).ok() ? 0 : 2;
  });
  UniqueFd conn = Accept(l.get());
  ASSERT_TRUE(conn);
  Result<Frame> f = RecvFrame(conn.get(), In(5000));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(PayloadText(*f), "still here");
  EXPECT_EQ(WaitChild(child), 0);
}

TEST_F(UnixSocketTest, ANonSocketFileAtThePathIsLeftAlone) {
  ASSERT_EQ(::mkdir(run_dir_.c_str(), 0700), 0);
  {
    UniqueFd f(::open(sock_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(f);
    ASSERT_EQ(::write(f.get(), "keep", 4), 4);
  }
  Result<UniqueFd> l = ListenUnix(sock_);
  EXPECT_EQ(l.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(l.status().message().find("is not a socket"), std::string::npos)
      << l.status().ToString();
  struct stat st {};
  ASSERT_EQ(::lstat(sock_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 4);
}

TEST_F(UnixSocketTest, ConnectWithoutADaemonIsUnavailable) {
  Result<UniqueFd> c = ConnectUnix(sock_);
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(c.status().message(), "cannot connect to " + sock_ + ": " + std::strerror(ENOENT) +
                                      ": is kvtier serve running?");
}

TEST_F(UnixSocketTest, AcceptTimesOutWhenNobodyConnects) {
  UniqueFd l = Listen();
  ASSERT_TRUE(l);
  const auto t0 = Clock::now();
  Result<UniqueFd> c = AcceptUnix(l.get(), 150);
  const auto took = Clock::now() - t0;
  EXPECT_EQ(c.status().code(), StatusCode::kTimedOut);
  EXPECT_GE(took, milliseconds(145));
  EXPECT_LT(took, milliseconds(3000));
  EXPECT_EQ(AcceptUnix(l.get(), 0).status().code(), StatusCode::kTimedOut);
}

TEST_F(UnixSocketTest, SendFrameRefusesAnOversizedPayload) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  const std::vector<uint8_t> big(size_t{kMaxPayloadBytes} + 1);
  Status s = SendFrame(a.get(), 1, 1, big);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceeds the limit 67108864"), std::string::npos) << s.ToString();
  EXPECT_EQ(RecvFrame(b.get(), In(50)).status().code(), StatusCode::kTimedOut)
      << "nothing was sent";
}

TEST_F(UnixSocketTest, SendFrameToAClosedPeerIsUnavailable) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  b.reset();
  // No SIGPIPE: the test process would die of it.
  Status s = SendFrame(a.get(), 1, 1, AsBytes("anyone?"));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("peer closed"), std::string::npos) << s.ToString();
}

TEST_F(UnixSocketTest, SendFrameToAPeerThatNeverReadsTimesOut) {
  UniqueFd l = Listen();
  ASSERT_TRUE(l);
  int gate[2];
  ASSERT_EQ(::pipe2(gate, O_CLOEXEC), 0);
  const pid_t child = ForkChild([&] {
    ::close(gate[1]);
    Result<UniqueFd> c = ConnectUnix(sock_);
    if (!c.ok()) return 2;
    char byte;
    (void)!::read(gate[0], &byte, 1);  // until the parent closes its end; never reads c
    return 0;
  });
  ::close(gate[0]);
  UniqueFd conn = Accept(l.get());
  ASSERT_TRUE(conn);

  const std::vector<uint8_t> chunk(64 << 10, 0x5a);
  Status s;
  Clock::duration took{};
  int sent = 0;
  // Should a send ignore its deadline, killing the child (the peer closes) ends it.
  const auto rescue = [&] { ::kill(child, SIGKILL); };
  for (; sent < 1000; ++sent) {  // 64 MiB at most: far beyond any socket buffer
    testing::GuardedCall g = testing::RunGuarded(
        [&] { s = SendFrame(conn.get(), 1, static_cast<uint64_t>(sent), chunk, -1, In(300)); },
        milliseconds(3000), rescue);
    ASSERT_TRUE(g.returned_in_time) << "SendFrame ignored its deadline: " << s.ToString();
    took = g.took;
    if (!s.ok()) break;
  }
  EXPECT_EQ(s.code(), StatusCode::kTimedOut) << "after " << sent << " frames: " << s.ToString();
  EXPECT_NE(s.message().find("the peer did not read"), std::string::npos) << s.ToString();
  EXPECT_GT(sent, 0) << "the socket buffer holds at least one 64 KiB frame";
  EXPECT_GE(took, milliseconds(295)) << "the send waited for its deadline";
  ::close(gate[1]);
  EXPECT_EQ(WaitChild(child), 0);
}

TEST(AuthorizePeerTest, SameUidOrAnAllowedGid) {
  const uid_t me = ::geteuid();
  const gid_t none[] = {0};
  EXPECT_TRUE(AuthorizePeer(PeerCred{10, me, 12345, {}}, {}).ok());
  const uid_t other = me == 4242 ? 4243 : 4242;
  Status s = AuthorizePeer(PeerCred{77, other, 999, {}}, std::span<const gid_t>(none, 0));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "peer pid 77 uid " + std::to_string(other) +
                             " gid 999 is not allowed: run the engine as uid " +
                             std::to_string(me) +
                             " or add one of its groups to service.allowed_gids");
  const gid_t allowed[] = {5, 999};
  EXPECT_TRUE(AuthorizePeer(PeerCred{77, other, 999, {}}, allowed).ok());
  const gid_t others[] = {5, 6};
  EXPECT_FALSE(AuthorizePeer(PeerCred{77, other, 999, {}}, others).ok());
}

TEST(GetPeerCredTest, NotASocketIsIOError) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd r(p[0]), w(p[1]);
  EXPECT_EQ(GetPeerCred(r.get()).status().code(), StatusCode::kIOError);
}

// Real peers under another uid: the kernel's credentials of a child that became uid 65534 are
// refused, while a child of the daemon's own uid is allowed.
TEST_F(UnixSocketTest, PeerOfAnotherUidIsRefusedAndSameUidAllowed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a child as uid 65534 (setuid)";
  UniqueFd l = Listen();
  ASSERT_TRUE(l);
  // Open the way for uid 65534, as an operator would for an engine of another uid.
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0711), 0);
  ASSERT_EQ(::chmod(run_dir_.c_str(), 0711), 0);
  ASSERT_EQ(::chmod(sock_.c_str(), 0666), 0);

  constexpr int kNoSetuid = 10;
  const pid_t nobody = ForkChild([&] {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) {
      return kNoSetuid;
    }
    Result<UniqueFd> c = ConnectUnix(sock_);
    if (!c.ok()) return 2;
    if (!SendFrame(c->get(), 1, 1, AsBytes("from nobody")).ok()) return 3;
    Result<Frame> end = RecvFrame(c->get(), In(10000));
    return end.status().code() == StatusCode::kUnavailable ? 0 : 4;
  });
  Result<UniqueFd> conn = AcceptUnix(l.get(), 5000);
  if (!conn.ok()) {
    const int code = WaitChild(nobody);
    if (code == kNoSetuid) GTEST_SKIP() << "setuid(65534) is not permitted here";
    FAIL() << conn.status().ToString() << "; child exited " << code;
  }
  Result<PeerCred> cred = GetPeerCred(conn->get());
  ASSERT_TRUE(cred.ok()) << cred.status().ToString();
  EXPECT_EQ(cred->pid, nobody);
  EXPECT_EQ(cred->uid, 65534u);
  EXPECT_EQ(cred->gid, 65534u);
  Status s = AuthorizePeer(*cred, {});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "peer pid " + std::to_string(nobody) +
                             " uid 65534 gid 65534 is not allowed: run the engine as uid 0 or "
                             "add one of its groups to service.allowed_gids");
  const gid_t allowed[] = {65534};
  EXPECT_TRUE(AuthorizePeer(*cred, allowed).ok());
  Result<Frame> f = RecvFrame(conn->get(), In(5000));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(PayloadText(*f), "from nobody");
  conn->reset();
  EXPECT_EQ(WaitChild(nobody), 0);

  const pid_t same = ForkChild([&] {
    Result<UniqueFd> c = ConnectUnix(sock_);
    if (!c.ok()) return 2;
    Result<Frame> end = RecvFrame(c->get(), In(10000));
    return end.status().code() == StatusCode::kUnavailable ? 0 : 4;
  });
  UniqueFd conn2 = Accept(l.get());
  ASSERT_TRUE(conn2);
  cred = GetPeerCred(conn2.get());
  ASSERT_TRUE(cred.ok()) << cred.status().ToString();
  EXPECT_EQ(cred->pid, same);
  EXPECT_EQ(cred->uid, ::geteuid());
  EXPECT_TRUE(AuthorizePeer(*cred, {}).ok());
  conn2.reset();
  EXPECT_EQ(WaitChild(same), 0);
}

TEST(UniqueFdTest, OwnsClosesMovesAndReleases) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  const int write_end = p[1];
  {
    UniqueFd w(write_end);
    EXPECT_TRUE(w);
    EXPECT_EQ(w.get(), write_end);
    UniqueFd moved(std::move(w));
    EXPECT_FALSE(w);  // NOLINT(bugprone-use-after-move): the moved-from state is the contract
    EXPECT_EQ(moved.get(), write_end);
    UniqueFd assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.get(), write_end);
  }
  EXPECT_EQ(::fcntl(write_end, F_GETFD), -1) << "closed when its owner went away";
  UniqueFd r(p[0]);
  const int raw = r.release();
  EXPECT_FALSE(r);
  EXPECT_EQ(raw, p[0]);
  EXPECT_NE(::fcntl(raw, F_GETFD), -1) << "release does not close";
  r.reset(raw);
  r.reset();
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1) << "reset closes the old descriptor";
}

}  // namespace
}  // namespace kvtier::proto

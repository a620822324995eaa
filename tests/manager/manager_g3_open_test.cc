// A G3 the user configured must not silently disappear (issue 21, finding 11): with g3.dir set
// explicitly (a file, KVTIER_G3_DIR, Config::Set), a G3 that cannot open fails
// BlockManager::Create with a status naming the directory, the reason and what to do; with the
// default g3.dir the manager runs on G2 alone and says so in one warning. Each way a directory
// fails is made for real: a regular file, a path through a file, a read-only filesystem, a
// filesystem too small for g3.capacity_bytes, a LOCK held by another manager or process. The
// read-only and small filesystems are tmpfs mounts made in a child process's own mount
// namespace (nothing is left mounted); without CAP_SYS_ADMIN those tests are skipped, saying so.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "manager_test_util.h"

namespace kvtier {
namespace {

using namespace kvtier::testing;

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

ManagerOptions Options(Config config) {
  ManagerOptions o = testing::TestManagerOptions(std::move(config), "g3-open-test");
  return o;
}

// SmallConfig with G3 in `g3_dir` (set explicitly, by Set).
Config ExplicitG3(const std::string& g3_dir) { return SmallConfig(g3_dir, 8, 16); }

// Create must fail with `code`, and its message must name the directory, hold `reason`, and
// say what to do.
void ExpectCreateFails(const Config& config, StatusCode code, const std::string& dir,
                       const std::string& reason) {
  auto mgr = BlockManager::Create(Options(config));
  ASSERT_FALSE(mgr.ok()) << "G3 in " << dir << " cannot open, and Create succeeded";
  const Status& s = mgr.status();
  EXPECT_TRUE(s.Is(code)) << s.ToString();
  EXPECT_NE(s.message().find("G3 cannot open in g3.dir = " + dir + " (set explicitly"),
            std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find(reason), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("or set g3.enabled = false to run without the SSD tier"),
            std::string::npos)
      << s.ToString();
}

TEST(ManagerG3Open, AnExplicitDirThatIsARegularFileFailsCreate) {
  TempDirectory dir;
  const std::string file = dir.path() + "/not-a-dir";
  WriteFile(file, "x");
  ExpectCreateFails(ExplicitG3(file), StatusCode::kInvalidArgument, file,
                    file + " exists and is not a directory");
  // With G3 off, the same directory is never opened: Create succeeds, on G2 alone.
  Config off = ExplicitG3(file);
  ASSERT_TRUE(off.Set("g3.enabled", "false").ok());
  auto mgr = BlockManager::Create(Options(off));
  ASSERT_TRUE(mgr.ok()) << mgr.status().ToString();
  EXPECT_EQ((*mgr)->Stats().g3_slots, 0u);
}

TEST(ManagerG3Open, AnExplicitDirBelowARegularFileCannotBeCreatedAndFailsCreate) {
  TempDirectory dir;
  const std::string file = dir.path() + "/a-file";
  WriteFile(file, "x");
  ExpectCreateFails(ExplicitG3(file + "/g3"), StatusCode::kIOError, file + "/g3",
                    "cannot create " + file + "/g3: Not a directory");
}

// Every explicit source counts: the file (naming its line) and the environment (naming the
// variable), as Set does above; so does a value equal to the default, set on purpose.
TEST(ManagerG3Open, ADirFromAFileOrTheEnvironmentFailsCreateNamingItsSource) {
  TempDirectory dir;
  const std::string file = dir.path() + "/a-file";
  WriteFile(file, "x");
  const std::string toml = dir.path() + "/kvtier.toml";
  WriteFile(toml, "[g3]\ndir = \"" + file + "\"\n");
  Config from_file = SmallConfig("", 8, 16);
  ASSERT_TRUE(from_file.Set("g3.enabled", "true").ok());
  ASSERT_TRUE(from_file.LoadFile(toml).ok());
  ExpectCreateFails(from_file, StatusCode::kInvalidArgument, file, "from " + toml + ":2)");

  Config from_env = SmallConfig("", 8, 16);
  ASSERT_TRUE(from_env.Set("g3.enabled", "true").ok());
  ASSERT_TRUE(from_env.LoadEnvironment({"KVTIER_G3_DIR=" + file}).ok());
  ExpectCreateFails(from_env, StatusCode::kInvalidArgument, file, "from KVTIER_G3_DIR)");
}

// A second manager on a directory in use; another process holding its LOCK (flock(1) takes
// the same flock(2) lock the tier takes).
TEST(ManagerG3Open, AnExplicitDirWhoseLockIsHeldFailsCreate) {
  TempDirectory dir;
  const std::string g3 = dir.path() + "/g3";
  {
    auto first = BlockManager::Create(Options(ExplicitG3(g3)));
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    EXPECT_GT((*first)->Stats().g3_slots, 0u);
    ExpectCreateFails(ExplicitG3(g3), StatusCode::kFailedPrecondition, g3,
                      g3 + " is in use by another kvtier process");
  }
  // The first is gone: the directory opens again.
  {
    auto again = BlockManager::Create(Options(ExplicitG3(g3)));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
  }
  // Another process holds the LOCK until it is killed.
  const pid_t holder = fork();
  if (holder == 0) {
    // A process group of its own: flock(1) forks `sleep`, which holds the lock (and the test's
    // output pipe, which ctest waits on) until the group is killed.
    setpgid(0, 0);
    execlp("flock", "flock", "--exclusive", (g3 + "/LOCK").c_str(), "sleep", "60",
           static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(holder, 0);
  setpgid(holder, holder);  // either side may run first
  // Until flock(1) has the lock, a Create may still succeed: wait for the refusal, bounded.
  Result<std::unique_ptr<BlockManager>> mgr = Status::Internal("not tried");
  for (int i = 0; i < 200; ++i) {
    mgr = BlockManager::Create(Options(ExplicitG3(g3)));
    if (!mgr.ok()) break;
    mgr = Status::Internal("not tried");
    usleep(20 * 1000);
  }
  kill(-holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  ASSERT_FALSE(mgr.ok()) << "flock(1) never held " << g3 << "/LOCK";
  EXPECT_TRUE(mgr.status().Is(StatusCode::kFailedPrecondition)) << mgr.status().ToString();
  EXPECT_NE(mgr.status().message().find(g3 + " is in use by another kvtier process"),
            std::string::npos)
      << mgr.status().ToString();
  EXPECT_NE(mgr.status().message().find("g3.enabled = false"), std::string::npos)
      << mgr.status().ToString();
}

// Runs `body` in a child process with its own mount namespace, where it may mount what it needs
// (gone with the child). Returns the text the body returned, or "SKIP: why" when the namespace
// or the mount cannot be made here.
std::string InMountNamespace(const std::function<std::string()>& body) {
  int fds[2];
  if (pipe(fds) != 0) return std::string("SKIP: pipe: ") + std::strerror(errno);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string out;
    if (unshare(CLONE_NEWNS) != 0) {
      out = std::string("SKIP: unshare(CLONE_NEWNS): ") + std::strerror(errno);
    } else if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      out = std::string("SKIP: making / private: ") + std::strerror(errno);
    } else {
      out = body();
    }
    (void)!write(fds[1], out.data(), out.size());
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "the child did not exit cleanly";
  return out;
}

// A tmpfs on `dir` with `options`, `flags` (MS_RDONLY); "" or "SKIP: why".
std::string MountTmpfs(const std::string& dir, unsigned long flags, const std::string& options) {
  if (mount("kvtier-test", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | flags, options.c_str()) !=
      0) {
    return std::string("SKIP: mount tmpfs: ") + std::strerror(errno);
  }
  return "";
}

// Create's outcome as text: "ok" or the status.
std::string CreateOutcome(const Config& config) {
  auto mgr = BlockManager::Create(Options(config));
  return mgr.ok() ? "ok" : mgr.status().ToString();
}

#define SKIP_IF_ASKED(out)                                                                    \
  if ((out).rfind("SKIP: ", 0) == 0) {                                                        \
    GTEST_SKIP() << "SKIPPED (no mount namespace or tmpfs for a read-only or small G3 dir): " \
                 << (out);                                                                    \
  }

// Root ignores permission bits, so "read-only" is a read-only filesystem: the directory exists
// (its LOCK cannot be created), and a directory below it cannot be made.
TEST(ManagerG3Open, AnExplicitDirOnAReadOnlyFilesystemFailsCreate) {
  TempDirectory dir;
  const std::string ro = dir.path();
  const std::string out = InMountNamespace([&] {
    if (std::string m = MountTmpfs(ro, MS_RDONLY, "size=1m,mode=0700"); !m.empty()) return m;
    return CreateOutcome(ExplicitG3(ro)) + "\n" + CreateOutcome(ExplicitG3(ro + "/g3"));
  });
  SKIP_IF_ASKED(out);
  const size_t nl = out.find('\n');
  ASSERT_NE(nl, std::string::npos) << out;
  const std::string existing = out.substr(0, nl), below = out.substr(nl + 1);
  for (const auto& [what, text, path] : {std::tuple{"the read-only dir itself", existing, ro},
                                         std::tuple{"a dir to create on it", below, ro + "/g3"}}) {
    EXPECT_EQ(text.rfind("IOError: G3 cannot open in g3.dir = " + path + " (set explicitly", 0), 0u)
        << what << ": " << text;
    EXPECT_NE(text.find("Read-only file system"), std::string::npos) << what << ": " << text;
    EXPECT_NE(text.find("g3.enabled = false"), std::string::npos) << what << ": " << text;
  }
  EXPECT_NE(existing.find(ro + "/LOCK"), std::string::npos) << existing;
  EXPECT_NE(below.find("cannot create " + ro + "/g3"), std::string::npos) << below;
}

TEST(ManagerG3Open, AnExplicitDirOnAFilesystemTooSmallForTheCapacityFailsCreate) {
  TempDirectory dir;
  const std::string g3 = dir.path() + "/g3";
  const std::string out = InMountNamespace([&] {
    if (std::string m = MountTmpfs(dir.path(), 0, "size=8m,mode=0700"); !m.empty()) return m;
    Config c = ExplicitG3(g3);
    if (!c.Set("g3.capacity_bytes", "64MiB").ok()) return std::string("bad test config");
    const std::string small = CreateOutcome(c);
    if (!c.Set("g3.capacity_bytes", "4MiB").ok()) return std::string("bad test config");
    return small + "\n" + CreateOutcome(c);  // one that fits, on the same filesystem
  });
  SKIP_IF_ASKED(out);
  const size_t nl = out.find('\n');
  ASSERT_NE(nl, std::string::npos) << out;
  const std::string small = out.substr(0, nl), fits = out.substr(nl + 1);
  EXPECT_EQ(small.rfind("NoSpace: G3 cannot open in g3.dir = " + g3 + " (set explicitly", 0), 0u)
      << small;
  EXPECT_NE(small.find("bytes free; lower the G3 capacity or free space"), std::string::npos)
      << small;
  EXPECT_NE(small.find("g3.enabled = false"), std::string::npos) << small;
  EXPECT_EQ(fits, "ok");
}

// Runs in `dir` until destroyed.
class WorkingDirectory {
 public:
  explicit WorkingDirectory(const std::string& dir) : old_(std::filesystem::current_path()) {
    std::filesystem::current_path(dir);
  }
  ~WorkingDirectory() { std::filesystem::current_path(old_); }

 private:
  std::filesystem::path old_;
};

// The default g3.dir (./kvtier-data) may fall back: Create succeeds on G2 alone and says so in
// exactly one warning, with the reason. The same path set explicitly fails.
TEST(ManagerG3Open, TheDefaultDirThatCannotOpenIsLeftOutWithOneWarning) {
  TempDirectory dir;
  WorkingDirectory cwd(dir.path());
  WriteFile("kvtier-data", "x");  // the default g3.dir is a regular file
  Config c = SmallConfig("", 8, 16);
  ASSERT_TRUE(c.Set("g3.enabled", "true").ok());
  ASSERT_FALSE(c.IsSet("g3.dir"));
  ::testing::internal::CaptureStderr();
  auto mgr = BlockManager::Create(Options(c));
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(mgr.ok()) << mgr.status().ToString();
  EXPECT_EQ((*mgr)->Stats().g3_slots, 0u);
  size_t warnings = 0;
  for (size_t at = 0; (at = log.find("G3", at)) != std::string::npos; ++at) {
    if (log.compare(at, 10, "G3 is off:") == 0) ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << log;
  EXPECT_NE(log.find("kvtier WARN: G3 is off: it could not open in the default g3.dir "
                     "./kvtier-data (InvalidArgument: ./kvtier-data exists and is not a "
                     "directory); kvtier runs on G2 alone."),
            std::string::npos)
      << log;
  MiniEngine engine(mgr->get(), 16);
  EXPECT_EQ(engine.Run("a", Prompt(90, 33)).mismatched_blocks, 0u);

  ASSERT_TRUE(c.Set("g3.dir", "./kvtier-data").ok());  // the default's value, on purpose
  ExpectCreateFails(c, StatusCode::kInvalidArgument, "./kvtier-data",
                    "./kvtier-data exists and is not a directory");
}

}  // namespace
}  // namespace kvtier

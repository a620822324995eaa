#include "cli/temp_dirs.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

namespace kvtier::cli {

namespace {

constexpr int kMaxDirs = 16;
constexpr size_t kMaxPath = 512;
// A registered directory's path, NUL-terminated; written only while its slot is not in use.
char g_dirs[kMaxDirs][kMaxPath];
std::atomic<bool> g_used[kMaxDirs];
bool g_handlers_installed = false;  // the main thread's

// getdents64's record (linux/dirent.h's linux_dirent64).
struct Dirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

// Removes everything under the open directory `dirfd` (not the directory itself), with
// async-signal-safe calls only. Subdirectories at most `depth_left` deep; symlinks are removed,
// never followed. Re-reads the directory until a pass removes nothing (entries removed while
// reading may make getdents64 skip others).
void RemoveContents(int dirfd, int depth_left) {
  alignas(8) char buf[2048];
  bool removed_any = true;
  while (removed_any) {
    removed_any = false;
    if (::lseek(dirfd, 0, SEEK_SET) < 0) return;
    for (;;) {
      const long n = ::syscall(SYS_getdents64, dirfd, buf, sizeof(buf));
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        const auto* d = reinterpret_cast<const Dirent64*>(buf + off);
        off += d->d_reclen;
        const char* name = d->d_name;
        if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'))) continue;
        if (::unlinkat(dirfd, name, 0) == 0) {
          removed_any = true;
          continue;
        }
        if ((errno != EISDIR && errno != EPERM) || depth_left == 0) continue;
        const int sub = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) continue;
        RemoveContents(sub, depth_left - 1);
        ::close(sub);
        if (::unlinkat(dirfd, name, AT_REMOVEDIR) == 0) removed_any = true;
      }
    }
  }
}

void RemoveTreeSignalSafe(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    RemoveContents(fd, 8);
    ::close(fd);
  }
  ::rmdir(path);
}

void OnStopSignal(int sig) {
  const int saved = errno;
  for (int i = 0; i < kMaxDirs; ++i) {
    if (g_used[i].load(std::memory_order_acquire)) RemoveTreeSignalSafe(g_dirs[i]);
  }
  errno = saved;
  // SA_RESETHAND put the default action back: the signal, blocked while this handler runs,
  // ends the process once it returns, as it would have without kvtier's handler.
  ::raise(sig);
}

void InstallHandlers() {
  if (g_handlers_installed) return;
  g_handlers_installed = true;
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace

Result<std::string> MakeTempDir(const std::string& prefix, bool keep) {
  int slot = -1;
  for (int i = 0; i < kMaxDirs && slot < 0; ++i) {
    if (!g_used[i].load(std::memory_order_acquire)) slot = i;
  }
  if (slot < 0) {
    return Status::ResourceExhausted("more than " + std::to_string(kMaxDirs) +
                                     " temporary directories at once (internal limit)");
  }
  std::vector<char> tmpl(prefix.begin(), prefix.end());
  for (int i = 0; i < 6; ++i) tmpl.push_back('X');
  tmpl.push_back('\0');
  if (tmpl.size() > kMaxPath) {
    return Status::InvalidArgument("temporary directory name too long: " + prefix);
  }
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return Status::IOError("cannot create a temporary directory " + std::string(tmpl.data()) +
                           ": " + std::strerror(errno) +
                           "; check that directory's permissions and free space");
  }
  if (keep) return std::string(tmpl.data());
  InstallHandlers();
  std::memcpy(g_dirs[slot], tmpl.data(), tmpl.size());
  g_used[slot].store(true, std::memory_order_release);
  return std::string(tmpl.data());
}

void RemoveTempDir(const std::string& dir) {
  for (int i = 0; i < kMaxDirs; ++i) {
    if (g_used[i].load(std::memory_order_acquire) && dir == g_dirs[i]) {
      g_used[i].store(false, std::memory_order_release);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace kvtier::cli

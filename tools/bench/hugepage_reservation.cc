#include "bench/hugepage_reservation.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>

namespace kvtier::cli {

// One field of /proc/meminfo ("HugePages_Free", "Hugepagesize", ...): the number after the
// colon (kB for sizes), or -1.
long long MeminfoField(const std::string& name) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, name.size() + 1, name + ":") == 0) {
      return std::strtoll(line.c_str() + name.size() + 1, nullptr, 10);
    }
  }
  return -1;
}

constexpr const char* kNrHugepages = "/proc/sys/vm/nr_hugepages";

long long ReadNrHugepages() {
  std::ifstream in(kNrHugepages);
  long long v = -1;
  if (!(in >> v)) return -1;
  return v;
}

// Writes `value` to vm.nr_hugepages; 0 or an errno. Async-signal-safe (open/write/close only).
int WriteNrHugepages(long long value) {
  char buf[32];
  int n = 0;
  char digits[24];
  int d = 0;
  unsigned long long v = value < 0 ? 0 : static_cast<unsigned long long>(value);
  do {
    digits[d++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && d < 24);
  while (d > 0) buf[n++] = digits[--d];
  buf[n++] = '\n';
  const int fd = open(kNrHugepages, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const ssize_t w = write(fd, buf, static_cast<size_t>(n));
  const int err = w == n ? 0 : (w < 0 ? errno : EIO);
  close(fd);
  return err;
}

// The value to restore if a signal ends the run while vm.nr_hugepages is raised; -1 when none.
volatile std::sig_atomic_t g_restore_hugepages = -1;

extern "C" void RestoreHugepagesOnSignal(int sig) {
  const long long prev = g_restore_hugepages;
  if (prev >= 0) (void)WriteNrHugepages(prev);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace kvtier::cli

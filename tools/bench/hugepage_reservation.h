// vm.nr_hugepages raised for one benchmark run and put back afterwards (`kvtier bench disk`:
// fio's --iomem=shmhuge buffers and a hugetlbfs G2 arena, so both sides use 2 MiB pages).
#pragma once

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace kvtier::cli {

// One field of /proc/meminfo ("HugePages_Free", "Hugepagesize", ...): the number after the
// colon (kB for sizes), or -1.
long long MeminfoField(const std::string& name);
// vm.nr_hugepages, or -1 when it cannot be read.
long long ReadNrHugepages();
// Writes `value` to vm.nr_hugepages; 0 or an errno. Async-signal-safe (open/write/close only).
int WriteNrHugepages(long long value);
// The value to restore if a signal ends the run while vm.nr_hugepages is raised; -1 when none.
extern volatile std::sig_atomic_t g_restore_hugepages;
// Puts g_restore_hugepages back (when set), then re-raises `sig` with its default action.
extern "C" void RestoreHugepagesOnSignal(int sig);

// Raises vm.nr_hugepages so that `pages` default-size huge pages are free for this run, and
// restores the previous value when destroyed (and, through a handler, on SIGINT / SIGTERM /
// SIGHUP). Nothing is written when enough pages are already free.
class HugepageReservation {
 public:
  HugepageReservation() = default;
  HugepageReservation(const HugepageReservation&) = delete;
  HugepageReservation& operator=(const HugepageReservation&) = delete;
  ~HugepageReservation() { Restore(); }

  // True when `pages` huge pages are free (not reserved by anyone) now; else false with
  // `why`, and vm.nr_hugepages as it was.
  bool Reserve(uint64_t pages, std::string* why) {
    const long long free_pages = MeminfoField("HugePages_Free");
    const long long rsvd = MeminfoField("HugePages_Rsvd");
    prev_ = ReadNrHugepages();
    if (free_pages < 0 || rsvd < 0 || prev_ < 0) {
      *why = "no huge page counters in /proc/meminfo or /proc/sys/vm/nr_hugepages";
      return false;
    }
    const long long available = free_pages - rsvd;
    if (available >= static_cast<long long>(pages)) {
      reason_ = std::to_string(available) + " huge pages were already free (vm.nr_hugepages " +
                std::to_string(prev_) + ", left as it was)";
      return true;
    }
    const long long target = prev_ + (static_cast<long long>(pages) - available);
    g_restore_hugepages = static_cast<std::sig_atomic_t>(prev_);
    for (int sig : {SIGINT, SIGTERM, SIGHUP})
      old_handlers_.push_back(std::signal(sig, RestoreHugepagesOnSignal));
    if (const int err = WriteNrHugepages(target); err != 0) {
      Restore();
      *why = std::string("cannot raise vm.nr_hugepages to ") + std::to_string(target) + ": " +
             std::strerror(err) + (err == EACCES || err == EPERM ? " (not root?)" : "");
      return false;
    }
    raised_ = true;
    const long long now_free = MeminfoField("HugePages_Free") - MeminfoField("HugePages_Rsvd");
    if (now_free < static_cast<long long>(pages)) {
      const long long total = ReadNrHugepages();
      Restore();
      *why = "the kernel found " + std::to_string(total - prev_) + " of the " +
             std::to_string(target - prev_) +
             " huge pages asked for (memory fragmented?); vm.nr_hugepages put back to " +
             std::to_string(prev_);
      return false;
    }
    reason_ = "vm.nr_hugepages raised from " + std::to_string(prev_) + " to " +
              std::to_string(target) + " for the run (restored at exit)";
    target_ = target;
    return true;
  }

  // Tops the pool up when fewer than `pages` are free again (others on the machine can take
  // pages out of a raised pool between fio runs: e.g. a hugetlbfs G2 of a test running
  // meanwhile). Only after a Reserve() that succeeded; true when `pages` are free afterwards.
  bool EnsureFree(uint64_t pages) {
    if (prev_ < 0) return false;
    auto available_now = [] {
      return MeminfoField("HugePages_Free") - MeminfoField("HugePages_Rsvd");
    };
    // The previous fio's pages come back a little after it exits (its io_uring, which pinned
    // them as fixed buffers, is torn down by a kernel worker): wait up to 3 s for them first.
    long long available = available_now();
    for (int i = 0; i < 300 && available < static_cast<long long>(pages); ++i) {
      usleep(10000);
      available = available_now();
    }
    if (available >= static_cast<long long>(pages)) return true;
    const long long now = ReadNrHugepages();
    if (now < 0) return false;
    if (!raised_) {
      g_restore_hugepages = static_cast<std::sig_atomic_t>(prev_);
      for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
        old_handlers_.push_back(std::signal(sig, RestoreHugepagesOnSignal));
      }
    }
    const long long target = now + (static_cast<long long>(pages) - available);
    if (WriteNrHugepages(target) != 0) return false;
    raised_ = true;
    target_ = std::max(target_, target);
    ++topups_;
    return MeminfoField("HugePages_Free") - MeminfoField("HugePages_Rsvd") >=
           static_cast<long long>(pages);
  }
  uint64_t topups() const { return topups_; }

  void Restore() {
    if (raised_) {
      if (const int err = WriteNrHugepages(prev_); err != 0) {
        std::fprintf(stderr, "kvtier bench disk: could not restore vm.nr_hugepages to %lld: %s\n",
                     prev_, std::strerror(err));
      }
      raised_ = false;
    }
    if (!old_handlers_.empty()) {
      int i = 0;
      for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, old_handlers_[i++]);
      old_handlers_.clear();
    }
    g_restore_hugepages = -1;
  }

  const std::string& reason() const { return reason_; }
  long long previous() const { return prev_; }
  long long target() const { return target_; }

 private:
  long long prev_ = -1;
  long long target_ = -1;
  bool raised_ = false;
  uint64_t topups_ = 0;
  std::string reason_;
  std::vector<void (*)(int)> old_handlers_;
};

}  // namespace kvtier::cli

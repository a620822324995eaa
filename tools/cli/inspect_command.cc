// kvtier inspect DIR: what an operator runs after a crash. Reads a G3 directory without
// changing it (read-only, O_DIRECT) and reports its geometry and format versions, how many
// blocks verify, how many bytes they hold, and which slots are corrupt.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/json_writer.h"
#include "cli/progress.h"
#include "core/regular_file.h"
#include "tier/block_format.h"
#include "tier/disk_files.h"
#include "tier/disk_io.h"
#include "tier/disk_recovery.h"

namespace kvtier::cli {
namespace {

void PrintUsage() {
  std::printf(
      "usage: kvtier inspect DIR [--json] [--headers-only] [--qd Q]\n"
      "  Scans the G3 slot files in DIR (read-only) and reports blocks, bytes, corrupt blocks\n"
      "  and format versions. Reads every slot in full and checks payload checksums, unless\n"
      "  --headers-only. --qd: reads in flight (32).\n");
}

std::string CheckSummary(const ScanReport& r) {
  std::string out;
  for (size_t i = 0; i < kNumBlockChecks; ++i) {
    if (r.by_check[i] == 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(BlockCheckName(static_cast<BlockCheck>(i))) +
           " " + std::to_string(r.by_check[i]);
  }
  return out;
}

// The failure as the command reports it: on stderr, and with --json also as a JSON object on
// stdout ({"dir", "error", "code"}), so a script that asked for JSON always gets JSON. Exit 1
// (failed work), or 2 with `usage` (a path that is no directory).
int InspectFailure(const std::string& dir, bool json, const Status& status, bool usage = false) {
  if (json) {
    JsonObject o;
    o.Add("dir", dir);
    o.Add("error", status.message());
    o.Add("code", std::string(StatusCodeName(status.code())));
    std::printf("%s\n", o.Str().c_str());
  }
  return usage ? UsageError(status) : Failure(status);
}

}  // namespace

int RunInspect(const CliArgs& args) {
  if (args.Has("help")) {
    PrintUsage();
    return 0;
  }
  if (Status s = args.CheckKnown({"json", "help", "headers-only", "qd"}); !s.ok()) {
    return UsageError(s);
  }
  if (args.positional().size() != 1) {
    return UsageError(Status::InvalidArgument("inspect takes one directory: kvtier inspect DIR"));
  }
  auto qd = args.GetUint("qd", 32);
  if (!qd.ok()) return UsageError(qd.status());
  if (*qd < 1 || *qd > 1024) return UsageError(Status::InvalidArgument("--qd must be in 1..1024"));
  const std::string dir = args.positional()[0];
  const bool json = args.Has("json");
  const bool verify_payload = !args.Has("headers-only");

  // A path that is not a directory is the user's mistake (exit 2), named for what it is.
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    const Status s = Status::InvalidArgument(
        (::stat(dir.c_str(), &st) != 0 ? dir + " does not exist"
                                       : dir + " is " + FileKindName(st.st_mode)) +
        "; give inspect a G3 directory (the g3.dir of a tier)");
    return InspectFailure(dir, json, s, /*usage=*/true);
  }
  auto files = DiskFileSet::OpenReadOnly(dir);
  if (!files.ok()) return InspectFailure(dir, json, files.status());
  const DiskGeometry& g = (*files)->geometry();
  // A file cut short (a crash during a copy, an operator's truncate) is scanned as far as it
  // goes; the slots past its end are reported missing rather than read.
  auto health = (*files)->Health();
  if (!health.ok()) return InspectFailure(dir, json, health.status());
  DiskGeometry present = g;
  for (const FileHealth& h : *health) {
    const uint64_t slots =
        h.size > kFirstSlotOffset ? (h.size - kFirstSlotOffset) / g.slot_stride : 0;
    present.slots_per_file =
        static_cast<uint32_t>(std::min<uint64_t>(present.slots_per_file, slots));
  }
  const uint64_t missing = uint64_t{g.num_slots()} - present.num_slots();
  auto io = CreateDiskIo(IoBackend::kAuto, (*files)->fds(), static_cast<uint32_t>(*qd));
  if (!io.ok()) return InspectFailure(dir, json, io.status());
  Progress progress("inspect: scanning " + dir, present.num_slots(), "slots");
  auto report = ScanSlots(io->get(), present, verify_payload, {},
                          [&progress](uint64_t scanned, uint64_t) { progress.Update(scanned); });
  progress.Finish();
  if (!report.ok()) return InspectFailure(dir, json, report.status());

  std::string snapshot = "absent";
  auto snap = ReadSnapshot((*files)->SnapshotPath(), g.num_slots());
  if (snap.ok()) {
    snapshot = snap->tier_id == (*files)->tier_id() && snap->geometry_hash == g.Hash()
                   ? "valid (" + std::to_string(snap->blocks.size()) + " blocks)"
                   : "stale (another formatting)";
  } else if (!snap.status().Is(StatusCode::kNotFound)) {
    snapshot = "invalid (" + snap.status().message() + ")";
  }
  const uint64_t blocks = report->blocks.size();
  const uint64_t bytes = blocks * g.payload_bytes;

  if (json) {
    JsonObject o;
    o.Add("dir", dir);
    o.Add("format_version", kBlockFormatVersion);
    JsonObject versions;
    for (uint32_t v = kOldestReadableBlockFormatVersion; v <= kBlockFormatVersion; ++v) {
      versions.Add(std::to_string(v), report->by_version[v]);
    }
    o.Raw("blocks_by_format_version", versions.Str());
    o.Add("slot_file_version", kSlotFileFormatVersion);
    o.Add("files", g.num_files);
    o.Add("slots", g.num_slots());
    o.Add("payload_bytes", g.payload_bytes);
    o.Add("slot_stride", g.slot_stride);
    o.Add("layout_fingerprint", g.layout_fingerprint);
    o.Add("blocks", blocks);
    o.Add("bytes", bytes);
    o.Add("empty_slots", report->empty);
    o.Add("corrupt_blocks", report->corrupt);
    o.Add("unreadable_slots", report->read_errors);
    o.Add("missing_slots", missing);
    o.Add("duplicates", report->duplicates);
    o.Add("payload_verified", verify_payload);
    o.Add("snapshot", snapshot);
    o.Add("locked_by_live_tier", (*files)->locked_by_other());
    std::string problems = "[";
    for (size_t i = 0; i < report->problems.size(); ++i) {
      problems += (i ? ", " : "") + JsonObject::Quote(report->problems[i]);
    }
    o.Raw("problems", problems + "]");
    std::printf("%s\n", o.Str().c_str());
    return 0;
  }
  std::printf("G3 directory %s%s\n", dir.c_str(),
              (*files)->locked_by_other()
                  ? " (in use by a live tier: in-flight writes may show as corrupt)"
                  : "");
  std::string found;
  for (uint32_t v = kOldestReadableBlockFormatVersion; v <= kBlockFormatVersion; ++v) {
    if (report->by_version[v] == 0) continue;
    found += (found.empty() ? "; blocks found: " : ", ") + std::to_string(report->by_version[v]) +
             " of v" + std::to_string(v);
  }
  std::printf("  format version   block %u (reads %u..%u%s), slot files %u\n", kBlockFormatVersion,
              kOldestReadableBlockFormatVersion, kBlockFormatVersion, found.c_str(),
              kSlotFileFormatVersion);
  std::printf("  geometry         %s\n", g.ToString().c_str());
  std::printf("  blocks           %llu (%.3f GiB of payload)%s\n",
              static_cast<unsigned long long>(blocks), static_cast<double>(bytes) / (1ull << 30),
              verify_payload ? ", every payload verified" : ", headers only");
  std::printf("  empty slots      %llu\n", static_cast<unsigned long long>(report->empty));
  std::printf("  corrupt blocks   %llu%s%s%s\n", static_cast<unsigned long long>(report->corrupt),
              report->corrupt ? " (" : "", CheckSummary(*report).c_str(),
              report->corrupt ? ")" : "");
  std::printf("  unreadable slots %llu\n", static_cast<unsigned long long>(report->read_errors));
  if (missing > 0) {
    std::printf("  missing slots    %llu (a slot file is shorter than its geometry: truncated)\n",
                static_cast<unsigned long long>(missing));
  }
  std::printf("  duplicate copies %llu (older generations, dropped at open)\n",
              static_cast<unsigned long long>(report->duplicates));
  std::printf("  snapshot         %s\n", snapshot.c_str());
  for (const std::string& p : report->problems) std::printf("    %s\n", p.c_str());
  return 0;
}

}  // namespace kvtier::cli

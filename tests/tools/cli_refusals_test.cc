// Inputs that used to look like success (exit 0), to run without end, or to crash, each refused
// with a clear message, and with JSON where --json was asked: a line of a trace without an end,
// checked under a memory limit; an empty trace; --sweep-fractions without --sweep; a directory
// as the config file; an integer where TOML wants a boolean; an endpoint without a port;
// `inspect --json` on a corrupt superblock. Then every input path of every `kvtier` command
// against the same kinds of bad input (BadInputs below, one table): a directory, a FIFO, a
// device, a missing or empty or garbage file where a file is expected, a non-number, nan, an
// out-of-range number, a missing value, an unknown flag, a bad TOML file. Also what the
// replay's JSON must show: G3's corrupt blocks and quarantines, G4's abandoned loads.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "core/regular_file.h"
#include "replay_test_util.h"
#include "sim/jsonl_line.h"
#include "sim/policy_sim.h"

namespace kvtier {
namespace {

using cli::replay_testing::TempDir;
using cli_run::CliRun;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// A sanitizer reserves terabytes of address space: RLIMIT_AS cannot be used; the child's
// resident memory is watched instead.
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

CliRun Cli(const std::string& args) {
  return cli_run::RunShell(std::string(KVTIER_CLI_PATH) + " " + args + " 2>&1");
}
CliRun CliStdout(const std::string& args) {
  return cli_run::RunShell(std::string(KVTIER_CLI_PATH) + " " + args + " 2>/dev/null");
}

struct LimitedRun {
  int exit_code = -1;        // -1 when killed or not exited normally
  bool over_memory = false;  // killed by this harness: resident memory passed the limit
  bool timed_out = false;    // killed by this harness: still running at the time limit
  uint64_t peak_rss_bytes = 0;
  std::string out;  // stdout and stderr
};

uint64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Runs the kvtier CLI with `args` in a child limited to `limit` bytes of address space
// (RLIMIT_AS; resident memory watched instead under a sanitizer) and `timeout`.
LimitedRun RunUnderMemoryLimit(const std::vector<std::string>& args, uint64_t limit,
                               std::chrono::seconds timeout) {
  LimitedRun r;
  char out_path[] = "/tmp/kvtier-limited-XXXXXX";
  const int out_fd = mkstemp(out_path);
  if (out_fd < 0) return r;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    if (!kSanitized) {
      const rlimit rl{limit, limit};
      setrlimit(RLIMIT_AS, &rl);
    }
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(KVTIER_CLI_PATH));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(KVTIER_CLI_PATH, argv.data());
    _exit(127);
  }
  const auto until = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    const uint64_t rss = ResidentBytes(pid);
    r.peak_rss_bytes = std::max(r.peak_rss_bytes, rss);
    if (rss > limit || std::chrono::steady_clock::now() > until) {
      (rss > limit ? r.over_memory : r.timed_out) = true;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  std::ifstream in(out_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.out = ss.str();
  close(out_fd);
  std::filesystem::remove(out_path);
  return r;
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// ---- traces ----

TEST(TraceLines, ALineLongerThanTheBoundIsRefusedWithItsNumber) {
  std::istringstream in("{\"a\": 1}\n\n" + std::string(100, 'x'));
  JsonLineReader reader(in, 16);
  std::string text;
  ASSERT_TRUE(reader.Next(&text));
  EXPECT_EQ(text, "{\"a\": 1}");
  ASSERT_TRUE(reader.Next(&text));
  EXPECT_EQ(text, "");
  EXPECT_EQ(reader.line(), 2u);
  EXPECT_FALSE(reader.Next(&text));
  EXPECT_TRUE(reader.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(reader.status().message().find("trace line 3 is longer than 16 bytes"),
            std::string::npos)
      << reader.status().ToString();
  EXPECT_FALSE(reader.Next(&text)) << "and stays stopped";

  std::istringstream exact("0123456789abcdef\nlast");  // the bound itself is fine
  JsonLineReader r2(exact, 16);
  ASSERT_TRUE(r2.Next(&text));
  ASSERT_TRUE(r2.Next(&text));
  EXPECT_EQ(text, "last");
  EXPECT_FALSE(r2.Next(&text));
  EXPECT_TRUE(r2.status().ok());
}

TEST(TraceLines, AMooncakeLineHoldsABoundedNumberOfIds) {
  std::string ids;
  for (size_t i = 0; i <= kMaxTraceLineIds; ++i) ids += (i ? "," : "") + std::to_string(i);
  std::istringstream in("{\"hash_ids\": [1, 2]}\n{\"hash_ids\": [" + ids + "]}\n");
  auto t = ParseMooncakeTrace(in);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("trace line 2"), std::string::npos) << t.status().ToString();
  EXPECT_NE(t.status().message().find("more than 16384 hash ids"), std::string::npos)
      << t.status().ToString();
}

// The stream traces are read through: seekable (the format is sniffed, then the file read again
// from its start), and a read(2) that fails ends it with badbit and the error, not with an
// exception past the parser (std::ifstream threw std::ios_base::failure on a directory).
TEST(TraceLines, ARegularFileStreamSeeksAndReportsAFailedRead) {
  TempDir dir;
  WriteFile(dir.path() + "/t.jsonl", "first\nsecond\n");
  auto in = RegularFileStream::Open(dir.path() + "/t.jsonl");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  std::string line;
  ASSERT_TRUE(std::getline(**in, line));
  EXPECT_EQ(line, "first");
  EXPECT_EQ((*in)->tellg(), 6);
  (*in)->clear();
  (*in)->seekg(0);
  JsonLineReader reader(**in);
  ASSERT_TRUE(reader.Next(&line));
  EXPECT_EQ(line, "first");
  ASSERT_TRUE(reader.Next(&line));
  EXPECT_EQ(line, "second");
  EXPECT_FALSE(reader.Next(&line));
  EXPECT_TRUE((*in)->read_error().ok());
  EXPECT_FALSE((*in)->bad());

  EXPECT_TRUE(RegularFileStream::Open(dir.path()).status().Is(StatusCode::kInvalidArgument));
  // A descriptor whose read(2) fails (EISDIR), handed over directly.
  const int fd = ::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  RegularFileStream failing(fd, dir.path());
  JsonLineReader r2(failing);
  EXPECT_FALSE(r2.Next(&line));
  EXPECT_TRUE(failing.bad());
  EXPECT_TRUE(failing.read_error().Is(StatusCode::kIOError)) << failing.read_error().ToString();
  EXPECT_NE(failing.read_error().message().find("reading " + dir.path()), std::string::npos)
      << failing.read_error().ToString();
}

// The reproduction: `kvtier replay --trace /dev/zero` grew about 1 GB/s with no end.
// Under a 1 GiB limit it is now refused at once: a trace is a regular file (a long line in one
// is stopped at the line's bound: TraceLines above).
TEST(CliRefusals, DevZeroAsATraceIsRefusedUnderAMemoryLimit) {
  constexpr uint64_t kLimit = uint64_t{1} << 30;
  const std::vector<std::vector<std::string>> runs = {
      {"replay", "--trace", "/dev/zero"},
      {"replay", "--trace", "/dev/zero", "--format", "mooncake"},
      {"replay", "--trace", "/dev/zero", "--format", "kvtier"},
      {"sim", "--trace", "/dev/zero"},
  };
  for (const auto& args : runs) {
    const LimitedRun r = RunUnderMemoryLimit(args, kLimit, std::chrono::seconds(120));
    EXPECT_FALSE(r.over_memory) << args[0] << " " << args.back() << ": resident "
                                << r.peak_rss_bytes << " bytes";
    EXPECT_FALSE(r.timed_out) << args[0] << " " << args.back();
    EXPECT_EQ(r.exit_code, 2) << args[0] << " " << args.back() << ": " << r.out;
    EXPECT_NE(r.out.find("/dev/zero is a character device, not a regular file"), std::string::npos)
        << r.out;
  }
}

TEST(CliRefusals, AnEmptyTraceIsRefused) {
  TempDir dir;
  for (const std::string& text : {std::string(), std::string("\n  \n\t\n")}) {
    WriteFile(dir.path() + "/empty.jsonl", text);
    CliRun r = Cli("replay --trace " + dir.path() + "/empty.jsonl");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.out.find("holds no requests"), std::string::npos) << r.out;
    r = Cli("sim --trace " + dir.path() + "/empty.jsonl");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.out.find("holds no requests"), std::string::npos) << r.out;
  }
}

TEST(CliRefusals, SweepFlagsWithoutSweepAreRefused) {
  const std::string trace = cli::replay_testing::kData + "replay_mooncake_small.jsonl";
  CliRun r = Cli("replay --trace " + trace + " --sweep-fractions 0.1,0.2 --requests 2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--sweep-fractions goes with --sweep"), std::string::npos) << r.out;
  r = Cli("replay --trace " + trace + " --sweep-out x.png --requests 2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--sweep-out goes with --sweep"), std::string::npos) << r.out;
}

// ---- configuration ----

TEST(CliRefusals, ADirectoryAsTheConfigFileIsRefused) {
  TempDir dir;
  CliRun r = Cli("config --config " + dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("is a directory"), std::string::npos) << r.out;
  r = CliStdout("config --json --config " + dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(r.out.rfind("{\"error\": ", 0), 0u) << "JSON with the error: " << r.out;
  EXPECT_NE(r.out.find("is a directory"), std::string::npos) << r.out;
  r = Cli("config --config /dev/null");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("is a character device"), std::string::npos) << r.out;
}

TEST(CliRefusals, AnIntegerWhereTomlWantsABooleanIsRefused) {
  TempDir dir;
  const std::string file = dir.path() + "/kvtier.toml";
  WriteFile(file, "[g3]\nenabled = 1\n");
  CliRun r = Cli("config --config " + file);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("g3.enabled = 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is an integer; allowed: true or false"), std::string::npos) << r.out;
  WriteFile(file, "[g3]\nenabled = false\n");
  r = Cli("config --config " + file);
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST(CliRefusals, AnEndpointWithoutAPortIsRefused) {
  CliRun r = cli_run::RunShell("KVTIER_G4_ENDPOINTS=localhost " + std::string(KVTIER_CLI_PATH) +
                               " config 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("KVTIER_G4_ENDPOINTS"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'localhost' has no :port"), std::string::npos) << r.out;
  r = cli_run::RunShell("KVTIER_G4_ENDPOINTS='10.0.0.1:7000, [::1]:7001' " +
                        std::string(KVTIER_CLI_PATH) + " config 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  r = cli_run::RunShell("KVTIER_G4_ENDPOINTS=10.0.0.1:7000,h:0 " + std::string(KVTIER_CLI_PATH) +
                        " config 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("port must be a number in 1..65535"), std::string::npos) << r.out;
}

// ---- every input path of every command (issue 21, finding 11) ----

// A directory of bad inputs: a directory, a FIFO (open(2) for reading blocks on one until a
// writer comes), an empty file, a file of garbage, a file that is no directory, a bad TOML file,
// a name that does not exist. Root reads any file whatever its mode, so "unreadable" is a
// directory or a FIFO here.
class BadInputs {
 public:
  BadInputs() {
    ::mkdir(sub("adir").c_str(), 0700);
    EXPECT_EQ(::mkfifo(sub("fifo").c_str(), 0600), 0);
    WriteFile(sub("empty"), "");
    WriteFile(sub("garbage"), std::string("GGUF\x01\x02{{{ not a trace\n", 22));
    WriteFile(sub("afile"), "x");
    WriteFile(sub("bad.toml"), "[g2\ncapacity_bytes = \n");
  }
  ~BadInputs() {
    ReleaseFifo();  // in case a build without the fix still holds it open
  }
  std::string sub(const std::string& name) const { return dir_.path() + "/" + name; }
  // Replaces every {NAME} in `text` by sub(NAME); a brace without its pair stays as it is.
  std::string Expand(std::string text) const {
    for (size_t at = 0; (at = text.find('{', at)) != std::string::npos;) {
      const size_t end = text.find('}', at);
      if (end == std::string::npos) break;
      const std::string path = sub(text.substr(at + 1, end - at - 1));
      text.replace(at, end - at + 1, path);
      at += path.size();
    }
    return text;
  }
  bool FifoIsStillAFifo() const {
    struct stat st;
    return ::lstat(sub("fifo").c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
  }

 private:
  void ReleaseFifo() const {
    const int fd = ::open(sub("fifo").c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  TempDir dir_;
};

struct BadInput {
  std::string args;     // kvtier's arguments; {NAME} is BadInputs::sub(NAME)
  int exit_code;        // 2: the user's input is wrong; 1: the work failed on it
  std::string message;  // a part of the one message on stderr; {NAME} as in args
};

// Runs `kvtier ARGS` (with `env` before it) under a time limit: a command that blocks on a FIFO
// or sleeps on a nan must not hold the suite (the limit's exit code is 124).
CliRun CliWithin(const std::string& env, const std::string& args) {
  return cli_run::RunShell(env + " timeout -k 5 60 " + std::string(KVTIER_CLI_PATH) + " " + args +
                           " 2>&1 </dev/null");
}

void ExpectRefused(const BadInputs& in, const std::vector<BadInput>& cases,
                   const std::string& env = "") {
  for (const BadInput& c : cases) {
    const std::string args = in.Expand(c.args);
    const CliRun r = CliWithin(env, args);
    EXPECT_NE(r.exit_code, 124) << args << ": still running at the time limit (a hang)";
    EXPECT_EQ(r.exit_code, c.exit_code) << args << ": " << r.out;
    EXPECT_NE(r.out.find(in.Expand(c.message)), std::string::npos) << args << ": " << r.out;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << args << ": " << r.out;
  }
}

// kvtier replay and sim: --trace names a directory (std::ifstream threw std::ios_base::failure
// out of the parser: abort), a FIFO (blocked forever), a device, nothing, an empty name.
TEST(BadInputs, TracesThatAreNotRegularFilesAreRefusedByName) {
  BadInputs in;
  std::vector<BadInput> cases;
  for (const std::string command :
       {"replay --trace", "replay --format kvtier --trace", "replay --format mooncake --trace",
        "replay --workers 2 --trace", "sim --trace"}) {
    cases.push_back({command + " {adir}", 2, "trace {adir} is a directory, not a regular file"});
    cases.push_back(
        {command + " {fifo}", 2, "trace {fifo} is a FIFO (named pipe), not a regular file"});
    cases.push_back(
        {command + " /dev/null", 2, "trace /dev/null is a character device, not a regular file"});
    cases.push_back({command + " {missing.jsonl}", 2,
                     "trace {missing.jsonl} does not exist; give the path of a JSONL trace"});
    cases.push_back({command + " ''", 2, "the trace path is empty"});
  }
  ExpectRefused(in, cases);
  EXPECT_TRUE(in.FifoIsStillAFifo());
  // Garbage and an empty file were refused before; they still are.
  ExpectRefused(in, {{"replay --trace {garbage}", 2, "trace line 1, column 1: expected '{'"},
                     {"sim --trace {empty}", 2, "holds no requests"}});
}

// Flag values: nan passed every range check (`bench manager --commit-seconds nan` crashed with
// SIGSEGV, `replay --hold-s nan` ran as if unset); an unknown flag at the end of the line was
// reported as a flag without its value; a port out of range was taken by `top`.
TEST(BadInputs, FlagValuesThatAreNotNumbersOrOutOfRangeAreRefused) {
  BadInputs in;
  const std::string replay =
      "replay --trace " + cli::replay_testing::kData + "replay_mooncake_small.jsonl ";
  const std::string sim =
      "sim --trace " + cli::replay_testing::kData + "replay_mooncake_small.jsonl ";
  ExpectRefused(
      in, {
              {"bench manager --commit-seconds nan", 2,
               "--commit-seconds = 'nan' is not a finite number"},
              {replay + "--hold-s nan", 2, "--hold-s = 'nan' is not a finite number"},
              {replay + "--capacity-fraction inf", 2,
               "--capacity-fraction = 'inf' is not a finite number"},
              {"bench remote --seconds -inf --no-redis-benchmark", 2,
               "--seconds = '-inf' is not a finite number"},
              {sim + "--bogus", 2, "unknown flag --bogus; this command takes"},
              {replay + "--no-such-flag 1", 2, "unknown flag --no-such-flag"},
              {"demo --workers", 2, "flag --workers needs a value"},
              {replay + "--requests", 2, "flag --requests needs a value"},
              {replay + "--requests abc", 2, "--requests: 'abc' is not a size"},
              {replay + "--requests 99999999999999999999999", 2, "is too large"},
              {"top --once 127.0.0.1:99999", 2, "port must be a number in 1..65535"},
              {"top --once http://localhost:0/metrics", 2, "port must be a number in 1..65535"},
              {"top --once localhost", 2, "has no :port"},
              {"keys --model m --tokens 1,x", 2, "--tokens: 'x' is not a token id"},
              {"inspect {adir} --qd 0", 2, "--qd must be in 1..1024"},
              {"gen-trace --preset nope --out {x}", 2, "unknown preset 'nope'"},
          });
}

// Files a command writes: gen-trace renamed its output over whatever --out named, so a FIFO (or,
// as root, /dev/null) became a regular file, and a directory failed only after the work; the
// sweep's plot was drawn after the whole sweep, into whatever --sweep-out named.
TEST(BadInputs, OutputPathsThatAreNotFilesAreRefusedFirst) {
  BadInputs in;
  const std::string sweep = "replay --trace " + cli::replay_testing::kData +
                            "replay_mooncake_small.jsonl --sweep --sweep-fractions 0.1 "
                            "--sweep-out ";
  ExpectRefused(
      in, {
              {"gen-trace --preset chat-multiturn --requests 3 --out {fifo}", 2,
               "--out {fifo} is a FIFO (named pipe), not a regular file"},
              {"gen-trace --preset chat-multiturn --requests 3 --out {adir}", 2,
               "--out {adir} is a directory, not a regular file"},
              {"gen-trace --preset chat-multiturn --requests 3 --out {missing-dir}/t.jsonl", 2,
               "{missing-dir} is not an existing directory"},
              {"gen-trace --preset chat-multiturn --requests 3 --out {afile}/t.jsonl", 2,
               "{afile} is not an existing directory"},
              {sweep + "{adir}", 2, "--sweep-out {adir} is a directory, not a regular file"},
              {sweep + "{missing-dir}/plot.png", 2, "{missing-dir} is not an existing directory"},
              {sweep + "\"{it's.png}\"", 2, "a file name with a quote or a newline"},
          });
  EXPECT_TRUE(in.FifoIsStillAFifo()) << "gen-trace replaced the FIFO";
  // A regular file is still written, readable as any new file is (mkstemp makes 0600).
  const CliRun ok = CliWithin("umask 022;", in.Expand("gen-trace --preset chat-multiturn "
                                                      "--requests 3 --out {t.jsonl}"));
  ASSERT_EQ(ok.exit_code, 0) << ok.out;
  struct stat st;
  ASSERT_EQ(::stat(in.sub("t.jsonl").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_FALSE(std::filesystem::exists(in.sub("t.jsonl.tmp"))) << "no temporary left behind";
}

// The model file of `demo` (a FIFO blocked both the demo and every worker of --workers; a
// directory failed in mmap as "No such device"; /dev/zero passed as an empty file) and the
// directories of `inspect` and the benchmarks (`bench manager --dir FILE` deleted FILE: it
// removed --dir whole).
TEST(BadInputs, ModelFilesAndDirectoriesThatAreNotWhatTheySayAreRefused) {
  BadInputs in;
  ExpectRefused(
      in, {
              {"demo --model {fifo} --no-plot", 2,
               "--model: {fifo} is a FIFO (named pipe), not a regular file"},
              {"demo --workers 2 --model {fifo}", 2, "{fifo} is a FIFO (named pipe)"},
              {"demo --model {adir} --no-plot", 2, "{adir} is a directory, not a regular file"},
              {"demo --workers 2 --model {adir}", 2, "{adir} is a directory"},
              {"demo --model /dev/zero --no-plot", 2, "/dev/zero is a character device"},
              {"demo --model {missing.gguf} --no-plot", 2,
               "model file {missing.gguf} not found. Run scripts/fetch-model.sh"},
              {"demo --model {empty} --no-plot", 1, "GGUF file {empty} is empty"},
              {"demo --model {garbage} --no-plot", 1, "unsupported GGUF version"},
              {"inspect {missing}", 2, "{missing} does not exist; give inspect a G3 directory"},
              {"inspect {afile}", 2, "{afile} is a regular file; give inspect a G3 directory"},
              {"inspect {fifo}", 2, "{fifo} is a FIFO (named pipe); give inspect"},
              {"inspect {adir}", 1, "no G3 slot files in {adir}"},
              {"bench manager --prompts 1 --prompt-blocks 1 --dir {afile}", 2,
               "--dir {afile} exists and is not a directory"},
              {"bench manager --prompts 1 --prompt-blocks 1 --dir {afile}/sub", 2,
               "--dir: cannot create {afile}/sub/bench-manager-"},
              {"bench disk --no-fio --total-bytes 1M --dir {fifo}", 2,
               "--dir {fifo} exists and is not a directory"},
          });
  EXPECT_TRUE(std::filesystem::is_regular_file(in.sub("afile"))) << "bench manager removed it";
  EXPECT_TRUE(in.FifoIsStillAFifo());
  // JSON was asked: JSON it gets, with the error.
  const CliRun j = cli_run::RunShell(std::string(KVTIER_CLI_PATH) + " inspect " + in.sub("afile") +
                                     " --json 2>/dev/null");
  EXPECT_EQ(j.exit_code, 2) << j.out;
  EXPECT_EQ(j.out.rfind("{\"dir\": ", 0), 0u) << j.out;
  EXPECT_NE(j.out.find("\"code\": \"InvalidArgument\""), std::string::npos) << j.out;
}

// A bad configuration file, by --config or KVTIER_CONFIG, stops every command that reads it;
// and the last safety net in main turns an exception that escapes a command into one line and
// exit 2 instead of an abort.
TEST(BadInputs, BadConfigFilesAndEscapedExceptionsEndInOneLine) {
  BadInputs in;
  const std::string replay =
      "replay --requests 2 --trace " + cli::replay_testing::kData + "replay_mooncake_small.jsonl";
  ExpectRefused(in, {{"config --config {bad.toml}", 2, "config file {bad.toml}:1:"},
                     {"config --config {garbage}", 2, "config file {garbage}:1:"},
                     {"config --config {fifo}", 2, "{fifo} is a FIFO (named pipe)"}});
  ExpectRefused(in, {{replay, 2, "config file {bad.toml}:1:"}},
                in.Expand("KVTIER_CONFIG={bad.toml}"));
  ExpectRefused(in, {{"bench manager --prompts 1", 2, "{adir} is a directory"}},
                in.Expand("KVTIER_CONFIG={adir}"));
  ExpectRefused(in, {{"config", 2, "kvtier: stopped by an unexpected error: "}},
                "KVTIER_TEST_THROW_IN_MAIN=1");
}

// ---- inspect ----

TEST(CliRefusals, InspectJsonOnACorruptSuperblockGivesJsonWithTheError) {
  TempDir dir;
  WriteFile(dir.path() + "/g3-0000.kvt", std::string(16384, 'z'));
  CliRun r = CliStdout("inspect " + dir.path() + " --json");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(r.out.rfind("{\"dir\": ", 0), 0u) << "JSON: " << r.out;
  EXPECT_NE(r.out.find("\"error\": \""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not a kvtier slot file"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"code\": \"Corruption\""), std::string::npos) << r.out;
}

// ---- what the replay shows ----

TEST(CliRefusals, ReplayJsonShowsG3AndG4FailureCounters) {
  const std::string trace = cli::replay_testing::kData + "replay_mooncake_small.jsonl";
  CliRun r = CliStdout("replay --trace " + trace + " --g3-fraction 0.2 --g4 fs --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* key :
       {"\"corrupt_blocks\": ", "\"g3_quarantines\": ", "\"g3_quarantined_at_end\": ",
        "\"demotion_failures\": ", "\"g4_abandoned_loads\": ", "\"g4_late_returns\": ",
        "\"g4_timeouts\": ", "\"g2_slots_unaccounted_at_end\": 0"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
}

// A G3 dir holding a previous run's blocks is recovered and its blocks count as hits (a replay
// once reported 1.1 x an unbounded cache that way): right for a warm restart, so allowed, but
// said on stderr. An empty dir says nothing.
TEST(CliRefusals, ReplayWarnsOfAG3DirThatIsNotEmpty) {
  const std::string trace = cli::replay_testing::kData + "replay_mooncake_small.jsonl";
  TempDir dir;
  CliRun cold = Cli("replay --trace " + trace + " --g3-fraction 0.2 --g3-dir " + dir.path());
  EXPECT_EQ(cold.exit_code, 0) << cold.out;
  EXPECT_EQ(cold.out.find("is not empty"), std::string::npos) << cold.out;
  CliRun warm = Cli("replay --trace " + trace + " --g3-fraction 0.2 --g3-dir " + dir.path());
  EXPECT_EQ(warm.exit_code, 0) << warm.out;
  EXPECT_NE(warm.out.find("is not empty: G3 recovers its blocks"), std::string::npos) << warm.out;
  EXPECT_NE(warm.out.find("name an empty dir for a cold run"), std::string::npos) << warm.out;
}

// The first-sighting gate's flag: [0, 1e6], 0 turning it off.
TEST(CliRefusals, ReplayRefusesABadWritesPerHit) {
  const std::string trace = cli::replay_testing::kData + "replay_mooncake_small.jsonl";
  for (const char* bad : {"-1", "nan", "2e6", "lots"}) {
    CliRun r =
        Cli("replay --trace " + trace + " --g3-fraction 0.2 --g3-admit-max-writes-per-hit " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("--g3-admit-max-writes-per-hit"), std::string::npos) << r.out;
  }
  CliRun off = CliStdout("replay --trace " + trace +
                         " --g3-fraction 0.2 --g3-admit-max-writes-per-hit 0 --json");
  ASSERT_EQ(off.exit_code, 0) << off.out;
  EXPECT_NE(off.out.find("\"g3_first_sighting_writes\": 0,"), std::string::npos) << off.out;
  // The default (min_seen 2, the gate at 8): while G3 fills, the gate admits first sightings,
  // so the manager wrote some of them to G3.
  CliRun on = CliStdout("replay --trace " + trace + " --g3-fraction 0.2 --json");
  ASSERT_EQ(on.exit_code, 0) << on.out;
  EXPECT_GT(cli::replay_testing::JsonNumber(on.out, "g3_first_sighting_writes"), 0) << on.out;
  EXPECT_LE(cli::replay_testing::JsonNumber(on.out, "g3_first_sighting_writes"),
            cli::replay_testing::JsonNumber(on.out, "g3_blocks_written"))
      << on.out;
}

}  // namespace
}  // namespace kvtier

#include "bench/redis_benchmark.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>

namespace kvtier::cli {

double RedisBenchmark(const std::string& base, const std::string& test, uint32_t pipeline,
                      uint64_t requests, std::string* command, std::string* error) {
  *command = base + " -P " + std::to_string(pipeline) + " -n " + std::to_string(requests) + " -t " +
             test + " --csv";
  FILE* p = popen((*command + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    *error = "popen failed";
    return -1;
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  // CSV: "test","rps",...  then "SET","724.64",...
  std::string upper = test;
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::string row = "\"" + upper + "\",\"";
  const size_t at = out.find(row);
  if (rc != 0 || at == std::string::npos) {
    *error = "redis-benchmark failed (exit " + std::to_string(rc) + "): " + out.substr(0, 300);
    return -1;
  }
  return std::strtod(out.c_str() + at + row.size(), nullptr);
}

bool RedisBenchmarkInstalled() {
  return std::system("command -v redis-benchmark >/dev/null 2>&1") == 0;
}

}  // namespace kvtier::cli

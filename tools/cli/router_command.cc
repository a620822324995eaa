// kvtier router: the KV-aware HTTP router (python/kvtier/router, docs/router.md). The proxy is
// Python (aiohttp, pyzmq) over kvtier's C++ KvRouter through the binding; this command runs it
// with this build's package (build/python) and passes the caller's flags through.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/commands.h"

#ifndef KVTIER_BINARY_DIR
#define KVTIER_BINARY_DIR "./build"
#endif

namespace kvtier::cli {

int ExecRouter(int argc, char** argv, int first) {
  const std::string pkg = std::string(KVTIER_BINARY_DIR) + "/python";
  if (access((pkg + "/kvtier/router/__main__.py").c_str(), R_OK) != 0) {
    std::fprintf(stderr,
                 "kvtier router: %s has no kvtier package with the router; build with the Python "
                 "binding (make build)\n",
                 pkg.c_str());
    return 1;
  }
  const char* old = std::getenv("PYTHONPATH");
  std::string path = pkg + (old != nullptr && *old != '\0' ? ":" + std::string(old) : "");
  setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<std::string> words = {"python3", "-m", "kvtier.router"};
  for (int i = first; i < argc; ++i) words.emplace_back(argv[i]);
  std::vector<char*> exec_argv;
  for (std::string& w : words) exec_argv.push_back(w.data());
  exec_argv.push_back(nullptr);
  execvp("python3", exec_argv.data());
  std::perror("kvtier router: exec python3");
  return 1;
}

}  // namespace kvtier::cli

// kvtier router: the KV-aware HTTP router (python/kvtier/router, docs/router.md). The proxy is
// Python (aiohttp, pyzmq) over kvtier's C++ KvRouter through the binding; this command runs it
// with this build's package (build/python) and passes the caller's flags through.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"

#ifndef KVTIER_BINARY_DIR
#define KVTIER_BINARY_DIR "./build"
#endif
// The interpreter the binding was built for (CMakeLists.txt); python3 on PATH otherwise.
#ifndef KVTIER_PYTHON_EXECUTABLE
#define KVTIER_PYTHON_EXECUTABLE "python3"
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
  // --python PATH runs another interpreter (a virtual environment with transformers, for
  // --tokenizer PATH); it must be the same Python version the binding was built for.
  std::string python = KVTIER_PYTHON_EXECUTABLE;
  std::vector<std::string> words = {"", "-m", "kvtier.router"};
  for (int i = first; i < argc; ++i) {
    if (std::string(argv[i]) == "--python") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvtier router: --python needs a path to a Python interpreter\n");
        return 2;
      }
      python = argv[++i];
      continue;
    }
    words.emplace_back(argv[i]);
  }
  words[0] = python;
  std::vector<char*> exec_argv;
  for (std::string& w : words) exec_argv.push_back(w.data());
  exec_argv.push_back(nullptr);
  execvp(python.c_str(), exec_argv.data());
  std::fprintf(stderr, "kvtier router: cannot run %s: %s\n", python.c_str(), std::strerror(errno));
  return 1;
}

}  // namespace kvtier::cli

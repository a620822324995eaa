// Temporary directories a command makes for its own use (replay's G3 and G4 under /tmp) and
// removes when it ends, also when SIGINT, SIGTERM or SIGHUP stops it: without this, a Ctrl-C
// on `kvtier replay` left its G3 slot files (up to the G3 capacity) in /tmp for good. The
// handler removes every registered directory with async-signal-safe calls only, then lets the
// signal end the process as it would have (the default action). SIGKILL cannot be caught: a
// directory is then left behind, and its name says what made it.
#pragma once

#include <string>

#include "kvtier/status.h"

namespace kvtier::cli {

// Makes a fresh 0700 directory `prefix` + 6 random characters (mkdtemp) and, unless `keep`
// (the command's --keep: the user wants it after the run), registers it: the first
// registration installs the signal handlers. Up to 16 directories are registered at once; more
// is ResourceExhausted. IOError (with the path) when the directory cannot be made.
// REQUIRES: called from one thread at a time (a command's main thread).
Result<std::string> MakeTempDir(const std::string& prefix, bool keep = false);

// Removes `dir` and everything under it, and unregisters it. A path MakeTempDir did not return
// is removed too (best effort, errors ignored).
void RemoveTempDir(const std::string& dir);

}  // namespace kvtier::cli

// redis-benchmark, the raw limit the G4 Redis paths are compared with (`bench remote`,
// `bench handoff`): run one test and read its requests/s from the CSV it prints.
#pragma once

#include <cstdint>
#include <string>

namespace kvtier::cli {

// Runs `base` (e.g. "redis-benchmark -h H -p P -c C -d BYTES") for one test ("set" or "get")
// with pipeline `pipeline` and `requests` requests. Returns requests/s; -1 with `*error` set
// when it fails or prints no row for the test. `*command` is the command line run.
double RedisBenchmark(const std::string& base, const std::string& test, uint32_t pipeline,
                      uint64_t requests, std::string* command, std::string* error);

// True when redis-benchmark is on PATH.
bool RedisBenchmarkInstalled();

}  // namespace kvtier::cli

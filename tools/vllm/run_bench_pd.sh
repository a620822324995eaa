#!/usr/bin/env bash
# kvtier bench pd: tools/vllm/bench_pd.py in the cached vLLM environment, with this build's
# kvtier package and binary (run_bench.sh does the set-up). Arguments pass through (--quick,
# --json, --out FILE, --configs, ...). Exit 3 when vLLM cannot be installed here (no PyPI).
KVTIER_BENCH_PROGRAM=bench_pd.py exec "$(dirname "${BASH_SOURCE[0]}")/run_bench.sh" "$@"

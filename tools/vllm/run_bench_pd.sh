#!/usr/bin/env bash
# kvtier bench pd: tools/vllm/bench_pd.py in the cached vLLM environment, with this build's
# kvtier package and binary (run_bench.sh does the set-up). Arguments pass through (--quick,
# --json, --out FILE, --configs, ...). Exit 3 when vLLM cannot be installed here (no PyPI).
# The program is an argument, not a variable in the environment: vLLM's processes inherit the
# environment, and kvtier's configuration refuses a KVTIER_* variable that names no setting.
exec "$(dirname "${BASH_SOURCE[0]}")/run_bench.sh" --program bench_pd.py "$@"

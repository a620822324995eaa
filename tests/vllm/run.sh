#!/usr/bin/env bash
# ctest vllm_connector_test: KvtierConnector on a real vLLM (CPU backend) and the layout tests.
# Makes (once; cached outside the clone) the vLLM environment and the converted model with
# scripts/setup-vllm.sh, then runs tests/vllm/ with this build's kvtier package.
# Usage: tests/vllm/run.sh BUILD_DIR [--vllm=VERSION[-engine]] [test_file.py ...] [pytest args...]
# (without test files: the connector and layout tests)
# --vllm=VERSION: vLLM VERSION's Python classes over the 0.32 CPU environment
# (scripts/setup-vllm-overlay.sh; the scheduler-level tests); VERSION-engine also lays 0.32's
# CPU kernels under them, so that a real engine of VERSION runs (0.33).
# Exit 77 (ctest: skipped) when vLLM cannot be installed because PyPI is unreachable; every
# other failure fails the test.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:?usage: run.sh BUILD_DIR [pytest args]}"
shift
. "$ROOT/scripts/vllm-env.sh"
kvtier_vllm_env vllm_connector_test
export PYTHONPATH="$BUILD/python"
case "${1:-}" in
  --vllm=*)
    flavor="${1#--vllm=}"
    shift
    version="${flavor%-engine}"
    engine=()
    [ "$version" = "$flavor" ] || engine=(--engine)
    kvtier_vllm_overlay "vllm tests on vLLM $version" "$version" "${engine[@]}"
    export PYTHONPATH="$KVTIER_VLLM_OVERLAY:$BUILD/python"
    # 0.34 builds its platform for the CPU only when told (its wheel is a CUDA build).
    export VLLM_TARGET_DEVICE=cpu
    # The tests check which vLLM answered (test_vllm_compat.py).
    export KVTIER_TEST_VLLM_VERSION="$version"
    echo "run.sh: vLLM $version's Python ($KVTIER_VLLM_OVERLAY) over the 0.32 CPU environment" >&2
    ;;
esac
export KVTIER_TEST_VLLM_MODEL="$KVTIER_VLLM_MODEL"
export KVTIER_TEST_CLI="$BUILD/kvtier"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
# OpenMP threads that sleep at a barrier instead of spinning. ctest runs two entries at once,
# and some tests run two or three vLLMs at once; each vLLM's OpenMP team takes every core, and
# spinning teams of two processes on 2 cores starve each other: two identical runs side by
# side took 81 s of generation each with libgomp's default, 42 s with PASSIVE (18 s for one
# alone; PASSIVE alone: 20.5 s). Outputs do not depend on it (the same kernels, the same
# order of operations).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# Results that depend only on vLLM and the model (vLLM alone's reference tokens), shared by
# the ctest entries of one build (tests/vllm/test_vllm_connector.py's baseline).
export KVTIER_TEST_VLLM_CACHE="$BUILD/vllm-test-cache"
cd "$ROOT/tests/vllm"
files=()
args=()
for a in "$@"; do
  case "$a" in
    *.py) files+=("$a") ;;
    *) args+=("$a") ;;
  esac
done
[ ${#files[@]} -gt 0 ] || files=(test_layouts.py test_vllm_connector.py)
# --durations: each test's time in ctest's log (where a slow run spends it).
exec "$KVTIER_VLLM_PYTHON" -m pytest -q -p no:cacheprovider -ra --durations=10 \
  "${args[@]}" "${files[@]}"

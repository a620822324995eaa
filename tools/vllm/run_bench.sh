#!/usr/bin/env bash
# kvtier bench vllm: makes (once; cached) the vLLM-for-CPU environment and the converted model
# with scripts/setup-vllm.sh, then runs tools/vllm/bench_vllm.py in it with the kvtier package
# of this build (build/python). Arguments pass through (--json, --users, --rounds, ...).
# Exit 3 when vLLM cannot be installed here (no PyPI): the benchmark needs it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build"
if [ "${1:-}" = "--build-dir" ]; then
  BUILD="$2"
  shift 2
fi
if [ ! -f "$BUILD/python/kvtier/__init__.py" ]; then
  echo "kvtier bench vllm: $BUILD/python has no kvtier package; build first (make build)" >&2
  exit 1
fi
# The benchmark needs vLLM: no PyPI (77 from the helper) is exit 3, "unavailable here".
(. "$ROOT/scripts/vllm-env.sh" && kvtier_vllm_env "kvtier bench vllm" >/dev/null) || {
  rc=$?
  [ $rc -eq 77 ] && exit 3
  exit 1
}
. "$ROOT/scripts/vllm-env.sh"
kvtier_vllm_env "kvtier bench vllm"
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
export BENCH_KVTIER_CLI="${BENCH_KVTIER_CLI:-$BUILD/kvtier}"  # kvtier serve, for --instances 2
exec "$KVTIER_VLLM_PYTHON" "$ROOT/tools/vllm/bench_vllm.py" --model "$KVTIER_VLLM_MODEL" "$@"

#!/usr/bin/env bash
# kvtier bench vllm (and, through run_bench_pd.sh, kvtier bench pd): makes (once; cached) the
# vLLM-for-CPU environment and the converted model with scripts/setup-vllm.sh, then runs
# tools/vllm/$KVTIER_BENCH_PROGRAM (default bench_vllm.py) in it with the kvtier package and
# the kvtier binary (kvtier serve) of this build. Arguments pass through (--json, --quick, ...).
# Exit 3 when vLLM cannot be installed here (no PyPI): the benchmark needs it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build"
PROGRAM="${KVTIER_BENCH_PROGRAM:-bench_vllm.py}"
for a in "$@"; do
  # kvtier bench vllm --hybrid: the hybrid-model benchmark (tools/vllm/bench_hybrid.py).
  [ "$a" = "--hybrid" ] && [ -z "${KVTIER_BENCH_PROGRAM:-}" ] && PROGRAM=bench_hybrid.py
done
NAME="${PROGRAM#bench_}"
NAME="kvtier bench ${NAME%.py}"
if [ "${1:-}" = "--build-dir" ]; then
  BUILD="$2"
  shift 2
fi
if [ ! -f "$BUILD/python/kvtier/__init__.py" ]; then
  echo "$NAME: $BUILD/python has no kvtier package; build first (make build)" >&2
  exit 1
fi
# The benchmark needs vLLM: no PyPI (77 from the helper) is exit 3, "unavailable here".
(. "$ROOT/scripts/vllm-env.sh" && kvtier_vllm_env "$NAME" >/dev/null) || {
  rc=$?
  [ $rc -eq 77 ] && exit 3
  exit 1
}
. "$ROOT/scripts/vllm-env.sh"
kvtier_vllm_env "$NAME"
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
export BENCH_KVTIER_CLI="${BENCH_KVTIER_CLI:-$BUILD/kvtier}"  # kvtier serve (--instances 2, P/D)
exec "$KVTIER_VLLM_PYTHON" "$ROOT/tools/vllm/$PROGRAM" --model "$KVTIER_VLLM_MODEL" "$@"

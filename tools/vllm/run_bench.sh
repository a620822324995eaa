#!/usr/bin/env bash
# kvtier bench vllm (and, through run_bench_pd.sh, kvtier bench pd): makes (once; cached) the
# vLLM-for-CPU environment and the converted model with scripts/setup-vllm.sh, then runs
# tools/vllm/PROGRAM (--program PROGRAM; default bench_vllm.py, bench_hybrid.py with --hybrid)
# in it with the kvtier package and the kvtier binary (kvtier serve) of this build. Other
# arguments pass through (--json, --quick, ...).
#   run_bench.sh [--program PROGRAM] [--build-dir BUILD] [benchmark arguments...]
# Exit 3 when vLLM cannot be installed here (no PyPI): the benchmark needs it.
# Nothing here exports a KVTIER_* variable: the benchmark's vLLM processes inherit this
# environment, and kvtier's configuration refuses a KVTIER_* variable that names no setting.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build"
PROGRAM=""
while [ $# -ge 2 ]; do
  case "$1" in
    --program) PROGRAM="$2" ;;
    --build-dir) BUILD="$2" ;;
    *) break ;;
  esac
  shift 2
done
if [ -z "$PROGRAM" ]; then
  PROGRAM=bench_vllm.py
  for a in "$@"; do
    # kvtier bench vllm --hybrid: the hybrid-model benchmark (tools/vllm/bench_hybrid.py).
    [ "$a" = "--hybrid" ] && PROGRAM=bench_hybrid.py
  done
fi
NAME="${PROGRAM#bench_}"
NAME="kvtier bench ${NAME%.py}"
if [ ! -f "$ROOT/tools/vllm/$PROGRAM" ]; then
  echo "$NAME: tools/vllm/$PROGRAM is missing" >&2
  exit 1
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
# Every vLLM process of the benchmark loads kvtier's configuration from this environment (and
# KVTIER_CONFIG's file): check it now, in milliseconds, rather than at the first configuration
# with kvtier, minutes in, inside a vLLM traceback.
if ! refused="$("$BENCH_KVTIER_CLI" config 2>&1 >/dev/null)"; then
  echo "$NAME: kvtier's configuration refuses this environment, so every vLLM with kvtier would:" >&2
  echo "$refused" >&2
  exit 1
fi
exec "$KVTIER_VLLM_PYTHON" "$ROOT/tools/vllm/$PROGRAM" --model "$KVTIER_VLLM_MODEL" "$@"

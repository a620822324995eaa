#!/usr/bin/env bash
# kvtier bench pd: makes (once; cached) the vLLM-for-CPU environment and the converted model
# with scripts/setup-vllm.sh, then runs tools/vllm/bench_pd.py in it with the kvtier package
# and the kvtier binary (kvtier serve) of this build. Arguments pass through (--quick, --json,
# --out FILE, --configs, ...). Exit 3 when vLLM cannot be installed here (no PyPI): the
# benchmark needs it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build"
if [ "${1:-}" = "--build-dir" ]; then
  BUILD="$2"
  shift 2
fi
if [ ! -f "$BUILD/python/kvtier/__init__.py" ]; then
  echo "kvtier bench pd: $BUILD/python has no kvtier package; build first (make build)" >&2
  exit 1
fi
# The benchmark needs vLLM: no PyPI (77 from the helper) is exit 3, "unavailable here".
(. "$ROOT/scripts/vllm-env.sh" && kvtier_vllm_env "kvtier bench pd" >/dev/null) || {
  rc=$?
  [ $rc -eq 77 ] && exit 3
  exit 1
}
. "$ROOT/scripts/vllm-env.sh"
kvtier_vllm_env "kvtier bench pd"
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
export BENCH_KVTIER_CLI="${BENCH_KVTIER_CLI:-$BUILD/kvtier}"  # kvtier serve, for the P/D configs
exec "$KVTIER_VLLM_PYTHON" "$ROOT/tools/vllm/bench_pd.py" --model "$KVTIER_VLLM_MODEL" "$@"

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
set +e
setup="$("$ROOT/scripts/setup-vllm.sh")"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "kvtier bench vllm: scripts/setup-vllm.sh failed (exit $rc): no vLLM environment" >&2
  [ $rc -eq 3 ] && exit 3
  exit 1
fi
eval "$setup"
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$KVTIER_VLLM_PYTHON" "$ROOT/tools/vllm/bench_vllm.py" --model "$KVTIER_VLLM_MODEL" "$@"

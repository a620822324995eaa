#!/usr/bin/env bash
# ctest vllm_events_test: kvtier's KV event stream decoded by vLLM's own classes
# (tests/python/test_events_vllm.py), under the vLLM environment that scripts/setup-vllm.sh
# caches outside the clone. Exit 77 (ctest: skipped, loudly) when it cannot be made.
# Usage: tests/python/events_vllm_test.sh BUILD_DIR [pytest args...]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:?usage: events_vllm_test.sh BUILD_DIR [pytest args]}"
shift
. "$ROOT/scripts/vllm-env.sh"
kvtier_vllm_env vllm_events_test
export PYTHONPATH="$BUILD/python:$ROOT/tests/python"
cd "$ROOT/tests/python"
exec "$KVTIER_VLLM_PYTHON" -m pytest -q -p no:cacheprovider -ra "$@" test_events_vllm.py

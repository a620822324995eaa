# Sourced (not run) by the scripts that need the vLLM environment: tests/vllm/run.sh,
# tests/python/pip_install_test.sh and tools/vllm/run_bench.sh.
#   kvtier_vllm_env WHAT
# runs scripts/setup-vllm.sh and sets KVTIER_VLLM_PYTHON and KVTIER_VLLM_MODEL (shell variables,
# not exported: a KVTIER_* variable in the environment of a process that loads kvtier's
# configuration must name a setting). When PyPI cannot be reached it says so and exits 77
# (ctest: skipped; the benchmark maps it to 3); any other failure exits 1. WHAT names the caller
# in the messages.
kvtier_vllm_env() {
  _kvtier_vllm_setup "$1" "vLLM for the CPU could not be installed" setup-vllm.sh
}

#   kvtier_vllm_overlay WHAT VERSION [--engine]
# the same for scripts/setup-vllm-overlay.sh: sets KVTIER_VLLM_OVERLAY (vLLM VERSION's Python,
# to put first on PYTHONPATH).
kvtier_vllm_overlay() {
  _kvtier_vllm_setup "$1" "vLLM $2 could not be downloaded" setup-vllm-overlay.sh "${@:2}"
}

_kvtier_vllm_setup() {
  local what="$1" unreachable="$2" script="$3" root setup rc
  shift 3
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  setup="$("$root/scripts/$script" "$@")"
  rc=$?
  if [ $rc -eq 3 ]; then
    echo "SKIPPED: $what: $unreachable (PyPI unreachable); nothing ran" >&2
    exit 77
  elif [ $rc -ne 0 ]; then
    echo "$what: scripts/$script failed (exit $rc)" >&2
    exit 1
  fi
  eval "$setup"
}

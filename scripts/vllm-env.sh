# Sourced (not run) by the scripts that need the vLLM environment: tests/vllm/run.sh,
# tests/python/pip_install_test.sh and tools/vllm/run_bench.sh.
#   kvtier_vllm_env WHAT
# runs scripts/setup-vllm.sh and sets KVTIER_VLLM_PYTHON and KVTIER_VLLM_MODEL (shell variables,
# not exported: a KVTIER_* variable in the environment of a process that loads kvtier's
# configuration must name a setting). When PyPI cannot be reached it says so and exits 77
# (ctest: skipped; the benchmark maps it to 3); any other failure exits 1. WHAT names the caller
# in the messages.
kvtier_vllm_env() {
  local what="$1" root setup rc
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  setup="$("$root/scripts/setup-vllm.sh")"
  rc=$?
  if [ $rc -eq 3 ]; then
    echo "SKIPPED: $what: vLLM for the CPU could not be installed (PyPI unreachable); nothing ran" >&2
    exit 77
  elif [ $rc -ne 0 ]; then
    echo "$what: scripts/setup-vllm.sh failed (exit $rc)" >&2
    exit 1
  fi
  eval "$setup"
}

#!/usr/bin/env bash
# ctest python_pip_install_test: `pip install .` of this repository builds the kvtier package
# (scikit-build-core drives the project's CMake build of the native module), and the binding
# tests pass against the installed package, not the build tree.
# Uses the cached vLLM environment's Python (scripts/setup-vllm.sh), which has pip,
# scikit-build-core, pybind11, ninja and pytest; exit 77 (skipped) without PyPI.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLI="${1:?usage: pip_install_test.sh KVTIER_CLI}"
. "$ROOT/scripts/vllm-env.sh"
kvtier_vllm_env python_pip_install_test
work="$(mktemp -d /tmp/kvtier-pip-XXXXXX)"
trap 'rm -rf "$work"' EXIT
# A copy of the tracked sources: pip must not find or reuse anything of this checkout's builds.
mkdir -p "$work/src"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
   | xargs -0 cp --parents -t "$work/src") || { echo "cannot copy the sources" >&2; exit 1; }
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
start=$(date +%s)
# -O1 instead of the package's -O3: this test checks that pip builds and installs the package
# and that the binding works, not its speed, and -O1 compiles in well under half the time.
if ! "$KVTIER_VLLM_PYTHON" -m pip install --no-build-isolation --no-deps --no-index \
     --config-settings=cmake.define.CMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
     --target "$work/site" "$work/src" > "$work/pip.log" 2>&1; then
  echo "python_pip_install_test: pip install failed:" >&2
  tail -40 "$work/pip.log" >&2
  exit 1
fi
echo "pip install . built and installed kvtier in $(( $(date +%s) - start )) s"
test -f "$work/site/kvtier/__init__.py" || { echo "no kvtier/__init__.py installed" >&2; exit 1; }
ls "$work/site/kvtier/"_kvtier*.so >/dev/null || { echo "no native module installed" >&2; exit 1; }
cd "$work"
PYTHONPATH="$work/site" KVTIER_TEST_CLI="$CLI" "$KVTIER_VLLM_PYTHON" -m pytest -q \
  -p no:cacheprovider "$ROOT/tests/python/test_bindings.py"

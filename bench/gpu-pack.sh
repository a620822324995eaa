#!/usr/bin/env bash
# bench/gpu-pack.sh: runs bench/gpu.sh on a GPU machine that cannot build kvtier (no liburing,
# hiredis, zmq, xxhash, toml++, openblas, GoogleTest development packages, no package registry:
# the device machines lent to sessions are so). Build here, carry the binaries, run there.
#
#   bench/gpu-pack.sh pack     (here) builds the release targets with the CUDA backend, strips
#                              them, copies the shared libraries they need beyond glibc and
#                              libstdc++ and writes .gpu/pkg.tar.xz (~10 MB). .gpu/ is ignored by
#                              git: name it in the device call's carry.
#   bench/gpu-pack.sh run [ARGS]  (there) unpacks into build/ and /tmp/kvtier-gpu-lib and runs
#                              bench/gpu.sh --no-build ARGS with LD_LIBRARY_PATH set; gpu.sh's
#                              own output goes to $OUT (or ./gpu-results) as usual. With
#                              .gpu/vllm034.tar.xz there too, it also installs that and gpu.sh
#                              runs its vLLM 0.34 step (bench/gpu_vllm034.py).
#   bench/gpu-pack.sh pack-vllm034
#                              (here) writes .gpu/vllm034.tar.xz (~16 MB), what the vLLM 0.34
#                              step needs on a machine without network whose image has torch
#                              (2.11 there) but no vLLM: vLLM 0.34's Python files and
#                              dist-info (no compiled kernels: scripts/setup-vllm-overlay.sh's
#                              SHA-256-checked wheel), the wheels of bench/gpu-vllm034-
#                              requirements.txt (CPython 3.12, hash-pinned), and kvtier's Python
#                              package with its native module built for CPython 3.12 with the
#                              CUDA backend (build-gpu-py312/; a Python 3.12 with headers:
#                              $PYTHON312, python3.12 on PATH, pyenv's, or /usr/bin/python3.12)
#                              and the shared libraries it needs. docs/cuda.md, "vLLM 0.34 extensible KV cache".
# The binaries need a glibc at least as new as the build machine's (Debian 12: 2.36).
set -euo pipefail
cd "$(dirname "$0")/.."
readonly TARGETS=(kvtier cuda_backend_test device_copy_plan_test transfer_engine_test)

# Copies the shared libraries the given binaries need beyond glibc and libstdc++ into $1.
bundle_libs() {
  local dest=$1
  shift
  ldd "$@" | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libpthread* | libresolv* | libdl.so* | librt.so* | libgcc_s* | \
        libstdc++* | ld-linux*) ;;
      *) cp -L "$lib" "$dest/" ;;
    esac
  done
}

find_python312() {
  local c
  for c in "${PYTHON312:-}" "$(command -v python3.12 || true)" \
    "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    [ -n "$c" ] && [ -x "$c" ] || continue
    "$c" -c 'import sys, sysconfig, os
sys.exit(sys.version_info[:2] != (3, 12)
         or not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
      2>/dev/null && { echo "$c"; return 0; }
  done
  return 1
}

pack_vllm034() {
  local py312 overlay
  py312=$(find_python312) ||
    { echo "gpu-pack: no CPython 3.12 with headers (set PYTHON312); the GPU image's python3 is 3.12" >&2; exit 1; }
  echo "gpu-pack: kvtier's native module for $py312 with the CUDA backend (build-gpu-py312/)"
  cmake -S . -B build-gpu-py312 -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${KVTIER_CUDA_ARCHS:-90}" -DKVTIER_PYTHON=ON \
    -DPython_EXECUTABLE="$py312" >build-gpu-py312.configure.log 2>&1 ||
    { tail -n 20 build-gpu-py312.configure.log; echo "gpu-pack: configure failed" >&2; exit 1; }
  grep -q "CUDA backend ON" build-gpu-py312.configure.log ||
    { echo "gpu-pack: build-gpu-py312 has no CUDA backend (no nvcc?)" >&2; exit 1; }
  rm -f build-gpu-py312.configure.log
  cmake --build build-gpu-py312 -j"$(nproc)" --target _kvtier
  overlay=$(scripts/setup-vllm-overlay.sh 0.34.0) ||
    { echo "gpu-pack: scripts/setup-vllm-overlay.sh 0.34.0 failed" >&2; exit 1; }
  eval "$overlay"
  stage=$(mktemp -d)  # global: the EXIT trap reads it
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/vllm-py" "$stage/wheels" "$stage/kvtier-py" "$stage/lib" .gpu
  (cd "$KVTIER_VLLM_OVERLAY" && find vllm vllm-0.34.0.dist-info \( -name '*.py' -o -name py.typed \
    -o -path 'vllm-0.34.0.dist-info/*' \) -print0 | tar --null -cf - -T -) | tar -C "$stage/vllm-py" -xf -
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
    --require-hashes -r bench/gpu-vllm034-requirements.txt -d "$stage/wheels"
  (cd python && find kvtier \( -name '*.py' -o -name py.typed \) -print0 | tar --null -cf - -T -) |
    tar -C "$stage/kvtier-py" -xf -
  strip --strip-unneeded -o "$stage/kvtier-py/kvtier/$(basename build-gpu-py312/python/kvtier/_kvtier*.so)" \
    build-gpu-py312/python/kvtier/_kvtier*.so
  bundle_libs "$stage/lib" build-gpu-py312/python/kvtier/_kvtier*.so
  tar -C "$stage" -cJf .gpu/vllm034.tar.xz .
  echo "gpu-pack: wrote .gpu/vllm034.tar.xz ($(du -h .gpu/vllm034.tar.xz | cut -f1)); carry .gpu"
}
case "${1:-}" in
  pack)
    grep -q "CUDA backend ON" <(cmake --preset release 2>&1) ||
      { echo "gpu-pack: the release build has no CUDA backend (no nvcc?)" >&2; exit 1; }
    cmake --build build -j"$(nproc)" --target "${TARGETS[@]}"
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/lib" .gpu
    strip -o "$stage/kvtier" build/kvtier
    for t in "${TARGETS[@]:1}"; do strip -o "$stage/$t" "build/tests/$t"; done
    bundle_libs "$stage/lib" build/kvtier build/tests/cuda_backend_test \
      build/tests/transfer_engine_test
    tar -C "$stage" -cJf .gpu/pkg.tar.xz .
    echo "gpu-pack: wrote .gpu/pkg.tar.xz ($(du -h .gpu/pkg.tar.xz | cut -f1)); on the GPU" \
      "machine: bench/gpu-pack.sh run"
    ;;
  run)
    [ -f .gpu/pkg.tar.xz ] || { echo "gpu-pack: no .gpu/pkg.tar.xz (run 'pack' first)" >&2; exit 1; }
    lib=/tmp/kvtier-gpu-lib
    rm -rf "$lib" && mkdir -p "$lib" build/tests
    tar -C "$lib" -xJf .gpu/pkg.tar.xz
    mv "$lib/kvtier" build/
    for t in "${TARGETS[@]:1}"; do mv "$lib/$t" build/tests/; done
    missing=$(LD_LIBRARY_PATH=$lib/lib ldd build/kvtier | grep 'not found' || true)
    [ -z "$missing" ] || { echo "gpu-pack: libraries missing there: $missing" >&2; exit 1; }
    ldpath=$lib/lib
    if [ -f .gpu/vllm034.tar.xz ]; then
      v=/tmp/kvtier-gpu-vllm034
      rm -rf "$v" && mkdir -p "$v"
      tar -C "$v" -xJf .gpu/vllm034.tar.xz
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$v/site" "$v"/wheels/*.whl ||
        { echo "gpu-pack: installing the vLLM 0.34 step's wheels failed" >&2; exit 1; }
      export KVTIER_VLLM034_PYTHONPATH="$v/vllm-py:$v/kvtier-py:$v/site"
      ldpath="$ldpath:$v/lib"
      missing=$(LD_LIBRARY_PATH=$v/lib ldd "$v"/kvtier-py/kvtier/_kvtier*.so | grep 'not found' || true)
      [ -z "$missing" ] || { echo "gpu-pack: libraries missing there: $missing" >&2; exit 1; }
    fi
    LD_LIBRARY_PATH=$ldpath exec bench/gpu.sh --no-build "${@:2}"
    ;;
  pack-vllm034)
    pack_vllm034
    ;;
  *)
    sed -n '2,30p' "$0"
    exit 2
    ;;
esac

#!/usr/bin/env bash
# bench/gpu-pack.sh: runs bench/gpu.sh on a GPU machine that cannot build kvtier (no liburing,
# hiredis, zmq, xxhash, toml++, openblas, GoogleTest development packages, no package registry:
# the device machines lent to sessions are so). Build here, carry the binaries, run there.
#
#   bench/gpu-pack.sh pack     (here) builds the release targets with the CUDA backend, strips
#                              them, copies the shared libraries they need beyond glibc and
#                              libstdc++ and writes .gpu/pkg.tar.xz (~10 MB). Keep .gpu/ out of
#                              git (.git/info/exclude) and carry it to the machine.
#   bench/gpu-pack.sh run      (there) unpacks into build/ and /tmp/kvtier-gpu-lib and runs
#                              bench/gpu.sh --no-build with LD_LIBRARY_PATH set; gpu.sh's own
#                              output goes to $OUT (or ./gpu-results) as usual.
# The binaries need a glibc at least as new as the build machine's (Debian 12: 2.36).
set -euo pipefail
cd "$(dirname "$0")/.."
readonly TARGETS=(kvtier cuda_backend_test device_copy_plan_test transfer_engine_test)
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
    ldd build/kvtier build/tests/cuda_backend_test build/tests/transfer_engine_test |
      awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
        case "$(basename "$lib")" in
          libc.so* | libm.so* | libpthread* | libresolv* | libdl.so* | librt.so* | libgcc_s* | \
            libstdc++* | ld-linux*) ;;
          *) cp -L "$lib" "$stage/lib/" ;;
        esac
      done
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
    LD_LIBRARY_PATH=$lib/lib exec bench/gpu.sh --no-build
    ;;
  *)
    sed -n '2,15p' "$0"
    exit 2
    ;;
esac

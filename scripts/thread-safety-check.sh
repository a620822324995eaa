#!/usr/bin/env bash
# Compiles every kvtier source with clang -Wthread-safety -Werror (syntax only: no objects),
# so the GUARDED_BY/REQUIRES annotations are checked by a compiler on every CI run.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CLANG:-clang++}
flags=(-std=c++20 -fsyntax-only -Wthread-safety -Werror -Iinclude -Isrc -Itools -Ilab)
failed=0
count=0
# The CUDA backend's host code (cuda_backend*.cc but the stub) includes the CUDA runtime API
# header: checked when the toolkit is installed, skipped (and said so) otherwise.
cuda_inc="${CUDA_HOME:-/usr/local/cuda}/include"
for f in $(git ls-files 'src/*.cc' 'tools/*.cc' 'lab/*.cc'); do
  if [[ $f == src/transfer/cuda_backend*.cc && $f != src/transfer/cuda_backend_stub.cc ]]; then
    if [ ! -f "$cuda_inc/cuda_runtime_api.h" ]; then
      echo "thread-safety: skipping $f (no CUDA toolkit at $cuda_inc)"
      continue
    fi
    count=$((count + 1))
    if ! "$CXX" "${flags[@]}" -isystem "$cuda_inc" "$f"; then
      echo "thread-safety: $f failed" >&2
      failed=1
    fi
    continue
  fi
  count=$((count + 1))
  if ! "$CXX" "${flags[@]}" "$f"; then
    echo "thread-safety: $f failed" >&2
    failed=1
  fi
done
if [ $failed -ne 0 ]; then exit 1; fi
echo "thread-safety: $count files clean under $CXX -Wthread-safety"

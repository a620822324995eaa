#!/usr/bin/env bash
# Compiles every kvtier source with clang -Wthread-safety -Werror (syntax only: no objects),
# so the GUARDED_BY/REQUIRES annotations are checked by a compiler on every CI run.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CLANG:-clang++}
flags=(-std=c++20 -fsyntax-only -Wthread-safety -Werror -Iinclude -Isrc -Itools)
failed=0
count=0
for f in $(git ls-files 'src/*.cc' 'tools/*.cc'); do
  count=$((count + 1))
  if ! "$CXX" "${flags[@]}" "$f"; then
    echo "thread-safety: $f failed" >&2
    failed=1
  fi
done
if [ $failed -ne 0 ]; then exit 1; fi
echo "thread-safety: $count files clean under $CXX -Wthread-safety"

#!/usr/bin/env bash
# Before `make test`: says how much disk the tests have, and warns loudly when it is less than
# they need. The suite makes real G3 slot files (fallocate'd to their capacity) and fs G4
# objects under /tmp, and two tests run at once: about 3 GiB at its peak beyond the build and
# the cached vLLM environments (measured: docs/status.md). Below that, tests fail with
# "NoSpace ... the filesystem has 0 bytes free" and the cause is this machine's disk, not the
# code. Usage: check-disk.sh [DIR...] (default: /tmp and the current directory).
# KVTIER_TEST_MIN_FREE_GIB overrides the threshold (4).
set -uo pipefail
min_gib="${KVTIER_TEST_MIN_FREE_GIB:-4}"
[ $# -gt 0 ] || set -- /tmp .
status=0
for dir in "$@"; do
  avail_kib="$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 {print $4}')"
  if [ -z "$avail_kib" ]; then
    echo "check-disk: cannot read the free space of $dir" >&2
    continue
  fi
  avail_gib=$((avail_kib / 1024 / 1024))
  if [ "$avail_gib" -lt "$min_gib" ]; then
    echo "check-disk: WARNING: only $avail_gib GiB free on the filesystem of $dir; the tests" \
         "need about $min_gib GiB there (G3 slot files, G4 objects). Tests that fail with" \
         "NoSpace are this machine's disk: free space and run again." >&2
    status=1
  else
    echo "check-disk: $avail_gib GiB free on the filesystem of $dir"
  fi
done
# A warning, not a refusal: the tests that do not need the space still run and say so.
[ "${KVTIER_CHECK_DISK_STRICT:-0}" = 1 ] && exit "$status"
exit 0

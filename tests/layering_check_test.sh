#!/usr/bin/env bash
# ctest layering_check: scripts/check-layering.py passes on the real tree, and fails, naming the
# problem, on small fake trees that each break one rule (an upward include and the cycle it
# makes, a tool reaching a private header, a stale include path, a docs table that is not the
# script's). A clean fake tree passes, so each failure is the rule's, not the fake tree's.
# Usage: layering_check_test.sh SOURCE_DIR
set -euo pipefail
src=$1
check="$src/scripts/check-layering.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "--- the real tree"
python3 "$check" --root "$src"

# A fake tree that keeps every rule: public API <- core <- manager <- daemon, tools.
fake() {
  local r=$1
  mkdir -p "$r"/include/kvtier "$r"/src/core "$r"/src/manager "$r"/src/daemon "$r"/tools/cli "$r"/docs
  cp "$src/docs/architecture.md" "$r/docs/"
  echo '#pragma once' >"$r/include/kvtier/status.h"
  printf '#pragma once\n#include "kvtier/status.h"\n' >"$r/src/core/log.h"
  printf '#pragma once\n#include "core/log.h"\n' >"$r/src/manager/block_manager_impl.h"
  printf '#pragma once\n#include "core/log.h"\n' >"$r/src/manager/shared_manager.h"
  printf '#include "manager/block_manager_impl.h"\n#include "manager/shared_manager.h"\n' \
    >"$r/src/manager/shared_manager.cc"
  printf '#include "manager/shared_manager.h"\n' >"$r/src/daemon/server.cc"
  printf '#include "kvtier/status.h"\n#include "manager/shared_manager.h"\n' \
    >"$r/tools/cli/serve_command.cc"
}

failures=0
# expect_fail NAME PATTERN: the check on $tmp/NAME must fail and print PATTERN.
expect_fail() {
  local name=$1 pattern=$2 out rc=0
  out=$(python3 "$check" --root "$tmp/$name" 2>&1) || rc=$?
  if [ "$rc" -ne 1 ]; then
    echo "FAIL: $name: the check exited $rc, not 1"; echo "$out"; failures=$((failures + 1))
  elif ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAIL: $name: the check failed without saying: $pattern"; echo "$out"
    failures=$((failures + 1))
  else
    echo "ok: $name fails: $(grep -F -- "$pattern" <<<"$out" | head -1)"
  fi
}

echo "--- a clean fake tree"
fake "$tmp/clean"
python3 "$check" --root "$tmp/clean" --quiet

echo "--- fake trees that break one rule each"
fake "$tmp/upward"
printf '#pragma once\n#include "kvtier/status.h"\n#include "manager/shared_manager.h"\n' \
  >"$tmp/upward/src/core/log.h"
expect_fail upward 'core includes manager ("manager/shared_manager.h")'
expect_fail upward 'cycle between folders: core <-> manager'

fake "$tmp/private"
printf '#include "manager/block_manager_impl.h"\n' >>"$tmp/private/tools/cli/serve_command.cc"
expect_fail private 'includes "manager/block_manager_impl.h", a header private to manager'

fake "$tmp/sideways"
printf '#include "manager/block_manager_impl.h"\n' >>"$tmp/sideways/src/daemon/server.cc"
expect_fail sideways 'a header private to manager'

fake "$tmp/stale"
printf '#include "service/server.h"\n' >>"$tmp/stale/tools/cli/serve_command.cc"
expect_fail stale 'includes "service/server.h", which is in no folder'

fake "$tmp/docs"
sed -i 's/^core .*<- kvtier$/core       <- kvtier, manager/' "$tmp/docs/docs/architecture.md"
expect_fail docs 'docs: the table in'

if [ "$failures" -ne 0 ]; then
  echo "layering_check: $failures case(s) wrong"
  exit 1
fi
echo "layering_check: the real tree passes; each broken fake tree fails, naming its problem"

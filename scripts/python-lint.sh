#!/usr/bin/env bash
# Lints kvtier's Python: ruff over python/ (the rules in pyproject.toml's [tool.ruff]) and mypy,
# strict, over python/kvtier/ ([tool.mypy]). `make lint` runs it after the thread-safety check.
#
# The tools are the versions pinned in scripts/lint-requirements.txt, installed from PyPI once
# into ${KVTIER_CACHE:-$HOME/.cache/kvtier}/lint-<key>, outside the clone, where <key> is the
# first 12 hex digits of the SHA-256 of that file plus INSTALL_LOGIC_VERSION below (as
# scripts/setup-vllm.sh keys vLLM's environment). A marker written after a complete install
# makes later runs skip pip. The third-party packages kvtier's Python imports (vLLM, torch,
# aiohttp, ...) are not installed there: mypy reads them as Any (pyproject.toml says which).
#
# Exit status: 0 when both tools pass; 1 when either reports something or the install failed;
# when PyPI cannot be reached for a first install it says so loudly and exits 0 (nothing was
# checked), so that `make lint` still runs its other checks on a machine without network.
set -euo pipefail

INSTALL_LOGIC_VERSION=1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQS="$ROOT/scripts/lint-requirements.txt"
CACHE="$(realpath -m "${KVTIER_CACHE:-$HOME/.cache/kvtier}")"
BASE_PY="${KVTIER_BASE_PYTHON:-python3}"
KEY="$({ cat "$REQS"; echo "install-logic-version=$INSTALL_LOGIC_VERSION"; } | sha256sum | cut -c1-12)"
VENV="$CACHE/lint-$KEY"
MARKER="$VENV/.kvtier-lint-complete"
LOG="$CACHE/lint-$KEY.log"

log() { echo "python-lint: $*" >&2; }

# pip's own connection errors, or "no matching distribution" while the index does not answer
# either (pip says only the latter when the index is unreachable from the start).
NET_RE='NewConnectionError|Max retries exceeded|Temporary failure in name resolution|Name or service not known|Network is unreachable|No route to host|Connection refused|Connection reset|timed out|ProxyError|SSLError'
pypi_unreachable() {
  local index="${PIP_INDEX_URL:-https://pypi.org/simple/}"
  grep -qE "$NET_RE" "$LOG" && return 0
  grep -qE 'No matching distribution found|Could not find a version that satisfies' "$LOG" &&
    ! "$BASE_PY" - "${index%/}/ruff/" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=20).read(1)
PY
}

if [ ! -f "$MARKER" ] || [ "$(cat "$MARKER")" != "key=$KEY" ]; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.lint-setup.lock"
  flock 9
  if [ ! -f "$MARKER" ] || [ "$(cat "$MARKER")" != "key=$KEY" ]; then
    log "installing the pinned linters (scripts/lint-requirements.txt) into $VENV"
    rm -rf "$VENV"
    : >"$LOG"
    if ! "$BASE_PY" -m venv "$VENV" >>"$LOG" 2>&1 ||
        ! "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input \
            --progress-bar off --no-deps -r "$REQS" >>"$LOG" 2>&1; then
      rm -rf "$VENV"
      if pypi_unreachable; then
        log "SKIPPED: PyPI could not be reached to install ruff and mypy (log: $LOG);" \
            "the Python code was NOT checked"
        exit 0
      fi
      log "installing the linters failed (log: $LOG):"
      tail -n 20 "$LOG" >&2
      exit 1
    fi
    echo "key=$KEY" >"$MARKER"
  fi
fi

cd "$ROOT"
failed=0
echo "python-lint: ruff $("$VENV/bin/ruff" --version | cut -d' ' -f2) over python/"
"$VENV/bin/ruff" check --no-cache python || failed=1
echo "python-lint: mypy $("$VENV/bin/mypy" --version | cut -d' ' -f2) (strict) over python/kvtier"
"$VENV/bin/mypy" --no-incremental python/kvtier || failed=1
if [ $failed -ne 0 ]; then
  echo "python-lint: FAILED (see above)" >&2
fi
exit $failed

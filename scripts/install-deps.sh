#!/usr/bin/env bash
# Installs the Debian packages kvtier needs to build and test; a no-op (no apt call at all)
# when every one of them is already present. Safe to run repeatedly.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libssl-dev libxxhash-dev liburing-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang clang-format python3 python3-pip
  fio
  libopenblas-dev
  gnuplot-nox
  libhiredis-dev redis-server redis-tools
  python3-dev python3-venv pybind11-dev python3-pytest
  python3-prometheus-client tmux
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev python3-zmq python3-msgpack python3-aiohttp
)
# The CUDA toolkit is optional and not installed here: CMake builds the CUDA backend when it
# finds nvcc (e.g. /usr/local/cuda), and without it builds and tests everything else.

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing missing Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "install-deps: not root and no sudo; install these packages first: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

# The redis-server package enables, and starts where the init system lets it, a system-wide
# server on port 6379. kvtier never uses it (its tests and benches start their own servers on
# free ports), so it is stopped and disabled rather than left holding memory and a well-known
# port. In a container whose policy-rc.d refuses service starts (as here), nothing was started
# and the stop is a no-op.
if [[ " ${missing[*]} " == *" redis-server "* ]]; then
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/redis-server ]; then
    $SUDO /etc/init.d/redis-server stop >/dev/null 2>&1 || true
    $SUDO update-rc.d redis-server disable >/dev/null 2>&1 || true
  fi
fi

#!/usr/bin/env bash
# Installs this build of kvtier into a fresh prefix, then builds tests/install_consumer against
# that prefix alone (find_package(kvtier) and, separately, pkg-config) and runs it. Checks:
#   - cmake --install puts the headers, libkvtier.so and the CMake/pkg-config files in place;
#   - the consumer finds kvtier in the prefix (not the build tree), and its compile lines name
#     nothing from kvtier's source or build tree;
#   - the program loads libkvtier.so from the prefix, with LD_LIBRARY_PATH unset, and prints
#     its verification line after checking saved-and-loaded bytes;
#   - find_package(kvtier 99) fails.
# Usage (tests/CMakeLists.txt passes these): install_consumer_test.sh CMAKE BUILD_DIR SOURCE_DIR
#   GENERATOR CXX_COMPILER BUILD_TYPE
set -euo pipefail

CMAKE=$1 BUILD_DIR=$2 SOURCE_DIR=$3 GENERATOR=$4 CXX=$5 BUILD_TYPE=$6
CONSUMER_SRC="$SOURCE_DIR/tests/install_consumer"

fail() {
  echo "install_consumer_test: FAILED: $*" >&2
  exit 1
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-install-test-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
PREFIX="$WORK/prefix"
step() { echo "--- $*"; }

step "cmake --install $BUILD_DIR --prefix $PREFIX"
"$CMAKE" --install "$BUILD_DIR" --prefix "$PREFIX" >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log"; fail "cmake --install failed"; }
# Where GNUInstallDirs put the library (lib, or lib/<multiarch> for /usr prefixes).
LIB=$(find "$PREFIX" -name 'libkvtier.so.*.*.*' -type f | head -n 1)
[ -n "$LIB" ] || fail "no libkvtier.so.X.Y.Z under $PREFIX"
LIBDIR=$(dirname "$LIB")
SONAME=$(objdump -p "$LIB" | awk '$1 == "SONAME" {print $2}')
[[ "$SONAME" == libkvtier.so.* ]] || fail "$LIB has SONAME '$SONAME', not libkvtier.so.N"
for f in "$LIBDIR/libkvtier.so" "$PREFIX/include/kvtier/connector.h" \
         "$LIBDIR/cmake/kvtier/kvtierConfig.cmake" "$LIBDIR/cmake/kvtier/kvtierConfigVersion.cmake" \
         "$LIBDIR/cmake/kvtier/kvtierTargets.cmake" "$LIBDIR/pkgconfig/kvtier.pc"; do
  [ -e "$f" ] || fail "$f was not installed"
done
# Every installed header includes only standard headers and other installed kvtier headers.
for inc in $(grep -ho '#include "[^"]*"' "$PREFIX"/include/kvtier/*.h | cut -d'"' -f2 | sort -u); do
  [ -f "$PREFIX/include/$inc" ] || fail "an installed header includes \"$inc\", which is not installed"
done
if grep -rlF -e "$SOURCE_DIR" -e "$BUILD_DIR" --include='*.cmake' --include='*.pc' "$PREFIX"; then
  fail "an installed package file names the source or build tree"
fi
echo "installed: $(cd "$PREFIX" && find . -type f -o -type l | sort | tr '\n' ' ')"

# Configure and build with nothing but the prefix: no user or system package registry, no
# kvtier_DIR from the environment.
configure() {  # configure BUILD_SUBDIR [extra cmake args...]
  local dir=$1
  shift
  env -u kvtier_DIR -u kvtier_ROOT -u CMAKE_PREFIX_PATH -u CPATH -u CPLUS_INCLUDE_PATH \
    -u LIBRARY_PATH -u LD_LIBRARY_PATH \
    "$CMAKE" -S "$CONSUMER_SRC" -B "$WORK/$dir" -G "$GENERATOR" \
    -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
    -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
    -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "$@"
}

step "configure and build tests/install_consumer against $PREFIX"
configure consumer >"$WORK/configure.log" 2>&1 ||
  { cat "$WORK/configure.log"; fail "the consumer did not configure against the prefix"; }
grep -q "install_consumer: kvtier .* from $LIBDIR/cmake/kvtier" "$WORK/configure.log" ||
  { cat "$WORK/configure.log"; fail "find_package(kvtier) did not find the package in $PREFIX"; }
"$CMAKE" --build "$WORK/consumer" >"$WORK/build.log" 2>&1 ||
  { cat "$WORK/build.log"; fail "the consumer did not build against the prefix"; }
if grep -F -e "$SOURCE_DIR/include" -e "$SOURCE_DIR/src" -e "$BUILD_DIR" \
    "$WORK/consumer/compile_commands.json"; then
  fail "the consumer's compile line names kvtier's source or build tree"
fi

run_consumer() {  # run_consumer EXE LABEL
  local exe=$1 label=$2
  local resolved
  resolved=$(env -u LD_LIBRARY_PATH ldd "$exe" | awk '/libkvtier\.so/ {print $3}')
  [ "$resolved" = "$LIBDIR/$SONAME" ] ||
    fail "$label: libkvtier resolves to '$resolved', not the installed $LIBDIR/$SONAME"
  # Run from inside $WORK: whatever it writes stays in the temp dir.
  local out rc=0
  out=$(cd "$WORK" && env -u LD_LIBRARY_PATH -u LD_PRELOAD "$exe" 2>&1) || rc=$?
  echo "$out"
  [ "$rc" -eq 0 ] || fail "$label exited $rc"
  grep -q '^install_consumer: OK: ' <<<"$out" || fail "$label did not print its verification line"
}
step "run the CMake-built consumer (LD_LIBRARY_PATH unset)"
run_consumer "$WORK/consumer/install_consumer" "the CMake-built consumer"

# pkg-config: the same program, compiled with the flags kvtier.pc gives and nothing else.
if command -v pkg-config >/dev/null; then
  step "build the consumer with pkg-config --cflags --libs kvtier"
  PC_FLAGS=$(PKG_CONFIG_PATH="$LIBDIR/pkgconfig" PKG_CONFIG_LIBDIR="$LIBDIR/pkgconfig" \
    pkg-config --cflags --libs kvtier) || fail "pkg-config does not read the installed kvtier.pc"
  echo "pkg-config: $PC_FLAGS"
  # shellcheck disable=SC2086  # the flags are words
  env -u CPATH -u CPLUS_INCLUDE_PATH -u LIBRARY_PATH \
    "$CXX" -std=c++20 -O1 "$CONSUMER_SRC/main.cc" -o "$WORK/consumer_pc" $PC_FLAGS \
    -Wl,-rpath,"$LIBDIR" || fail "the consumer did not build with pkg-config's flags"
  run_consumer "$WORK/consumer_pc" "the pkg-config-built consumer"
else
  echo "--- pkg-config not installed: kvtier.pc not checked"
fi

step "find_package(kvtier 99) must fail"
if configure consumer99 -DKVTIER_WANTED_VERSION=99 >"$WORK/configure99.log" 2>&1; then
  cat "$WORK/configure99.log"
  fail "find_package(kvtier 99) succeeded against kvtier $(grep -o 'kvtier [0-9.]*' "$WORK/configure.log" | head -n 1)"
fi
grep -q 'kvtierConfig.cmake, version: ' "$WORK/configure99.log" ||
  { cat "$WORK/configure99.log"; fail "find_package(kvtier 99) failed, but not for the version"; }
grep -A3 'kvtierConfig.cmake, version: ' "$WORK/configure99.log" | head -n 2

echo "install_consumer_test: OK"

#!/usr/bin/env bash
# bench/gpu.sh: the CUDA backend's check on a machine with a GPU (issue 8). In under 5 minutes:
#   1. checks that nvcc and a usable GPU are there (fails clearly otherwise);
#   2. configures and builds the release build with the CUDA backend (-j$(nproc));
#   3. runs the GPU tests (byte-exact round trips of scattered blocks in both G1 arrangements
#      with every copy method, per-layer completion in order, WaitLayer before later layers
#      land; StartSave/StartLoad(engine_stream) ordered after a slow kernel on an engine
#      stream, CudaStreamOrderTest) and FAILS if any of them skips: on a GPU machine a skip
#      means the probe is wrong;
#   4. runs `kvtier bench copy --device cuda --json` for both G1 arrangements;
#   5. prints a summary, including whether d2h_gbps and h2d_gbps reach 0.85 x cuda_memcpy_gbps;
#   6. when KVTIER_VLLM034_PYTHONPATH names vLLM 0.34's Python, kvtier's package built for this
#      Python and their dependencies (bench/gpu-pack.sh run sets it from .gpu/vllm034.tar.xz):
#      vLLM 0.34's extensible KV cache registered with kvtier, a byte-exact save/load round trip
#      per KV cache layout, and vLLM creating KvtierConnector (bench/gpu_vllm034.py); a skip
#      there FAILS. Without it the step says it did not run.
# Everything it produces goes to $OUT when set (the device tool collects it), else ./gpu-results.
#
# usage: bench/gpu.sh [--no-build] [--vllm034-only]
#        --no-build: use the binaries already in build/
#        --vllm034-only: only step 6 (after checking the GPU), e.g. on a short lease
# env:   CUDACXX (nvcc path), KVTIER_CUDA_ARCHS (default 90, i.e. H100/H200), BLOCKS (512),
#        KVTIER_VLLM034_PYTHONPATH (step 6), KVTIER_GPU_PYTHON (step 6's python; python3)
set -euo pipefail
cd "$(dirname "$0")/.."
readonly T0=$(date +%s)
RESULTS=${OUT:-$PWD/gpu-results}
mkdir -p "$RESULTS"
LOG="$RESULTS/gpu.log"
: >"$LOG"

say() { echo "gpu.sh [$(($(date +%s) - T0))s]: $*" | tee -a "$LOG"; }
fail() {
  say "FAILED: $*"
  exit 1
}

build=1
vllm_only=0
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    --vllm034-only) vllm_only=1 build=0 ;;
    -h | --help)
      sed -n '2,26p' "$0"
      exit 0
      ;;
    *) fail "unknown argument '$a' (see --help)" ;;
  esac
done

# 6. vLLM 0.34's extensible KV cache handed to kvtier (bench/gpu_vllm034.py).
vllm034_step() {
  if [ -z "${KVTIER_VLLM034_PYTHONPATH:-}" ]; then
    say "vLLM 0.34 step NOT RUN: no KVTIER_VLLM034_PYTHONPATH (bench/gpu-pack.sh pack-vllm034, then run)"
    [ "$vllm_only" = 0 ] || fail "--vllm034-only without KVTIER_VLLM034_PYTHONPATH"
    return 0
  fi
  say "vLLM 0.34 extensible KV cache -> kvtier (bench/gpu_vllm034.py)"
  set +e
  PYTHONPATH="$KVTIER_VLLM034_PYTHONPATH" PYTHONUNBUFFERED=1 timeout 300 \
    "${KVTIER_GPU_PYTHON:-python3}" bench/gpu_vllm034.py --json "$RESULTS/vllm034.json" \
    >"$RESULTS/vllm034.log" 2>&1
  rc=$?
  set -e
  grep 'gpu_vllm034:' "$RESULTS/vllm034.log" | cut -c1-600 | tee -a "$LOG"
  case "$rc" in
    0) say "vLLM 0.34 step: every check passed" ;;
    77) fail "vLLM 0.34 step SKIPPED on a GPU machine (torch sees no GPU): $RESULTS/vllm034.log" ;;
    *) tail -n 30 "$RESULTS/vllm034.log"
       fail "vLLM 0.34 step failed (exit $rc; $RESULTS/vllm034.log, $RESULTS/vllm034.json)" ;;
  esac
}

# 1. nvcc and the GPU.
NVCC=${CUDACXX:-$(command -v nvcc || true)}
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ "$build" = 1 ]; then
  [ -n "$NVCC" ] && [ -x "$NVCC" ] ||
    fail "no nvcc (looked at \$CUDACXX, PATH, /usr/local/cuda/bin): install the CUDA toolkit"
  say "nvcc: $("$NVCC" --version | tail -n 2 | head -n 1)"
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
    --format=csv 2>&1 | tee -a "$LOG" || fail "nvidia-smi cannot talk to the driver: no usable GPU"
else
  say "no nvidia-smi; the backend's own probe (with --vllm034-only: torch) decides below"
fi

if [ "$vllm_only" = 1 ]; then
  vllm034_step
  say "done in $(($(date +%s) - T0)) s; results in $RESULTS"
  exit 0
fi

# 2. Build.
if [ "$build" = 1 ]; then
  say "configuring (release, KVTIER_CUDA=ON, architectures ${KVTIER_CUDA_ARCHS:-90})"
  cmake --preset release -DKVTIER_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" \
    -DCMAKE_CUDA_ARCHITECTURES="${KVTIER_CUDA_ARCHS:-90}" >"$RESULTS/configure.log" 2>&1 ||
    { tail -n 30 "$RESULTS/configure.log"; fail "cmake configure failed (log: $RESULTS/configure.log)"; }
  grep -q "CUDA backend ON" "$RESULTS/configure.log" ||
    fail "cmake did not enable the CUDA backend: $(grep 'CUDA backend' "$RESULTS/configure.log")"
  say "building (-j$(nproc))"
  timeout 240 cmake --build build -j"$(nproc)" --target kvtier cuda_backend_test \
    device_copy_plan_test transfer_engine_test >"$RESULTS/build.log" 2>&1 ||
    { tail -n 40 "$RESULTS/build.log"; fail "build failed (log: $RESULTS/build.log)"; }
fi
for b in build/kvtier build/tests/cuda_backend_test build/tests/device_copy_plan_test \
  build/tests/transfer_engine_test; do
  [ -x "$b" ] || fail "$b is missing (run without --no-build)"
done

# The backend's own probe (the same one the library runs at start-up).
set +e
probe=$(build/kvtier bench copy --device cuda --blocks 1 --reps 1 --json 2>/dev/null)
rc=$?
set -e
if [ "$rc" = 3 ]; then
  fail "no usable GPU: $(echo "$probe" | sed -n 's/.*"error": "\([^"]*\)".*/\1/p')"
fi
[ "$rc" = 0 ] || fail "the probe run of kvtier bench copy --device cuda exited $rc: $probe"

# 3. Tests. The GPU ones must run, not skip.
say "CPU-side tests (planner, kernel body, transfer engine)"
timeout 60 build/tests/device_copy_plan_test >"$RESULTS/device_copy_plan_test.log" 2>&1 ||
  { tail -n 30 "$RESULTS/device_copy_plan_test.log"; fail "device_copy_plan_test"; }
timeout 60 build/tests/transfer_engine_test >"$RESULTS/transfer_engine_test.log" 2>&1 ||
  { tail -n 30 "$RESULTS/transfer_engine_test.log"; fail "transfer_engine_test"; }
say "GPU tests"
GPU_FILTER='*CudaRoundTrip*:*CudaLayerOrder*:CudaBackendTest.*:*CudaStreamOrderTest.*:CudaStreamOrderCapture.*'
set +e
timeout 120 build/tests/cuda_backend_test --gtest_filter="$GPU_FILTER" \
  --gtest_output=json:"$RESULTS/gpu_tests.json" >"$RESULTS/gpu_tests.log" 2>&1
rc=$?
set -e
tail -n 25 "$RESULTS/gpu_tests.log" | tee -a "$LOG"
[ "$rc" = 0 ] || fail "GPU tests failed (exit $rc; log: $RESULTS/gpu_tests.log)"
read -r ran skipped <<<"$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
r = [t["result"] for s in d["testsuites"] for t in s["testsuite"]]
print(sum(x == "COMPLETED" for x in r), sum(x == "SKIPPED" for x in r))' "$RESULTS/gpu_tests.json")"
# The only acceptable skip: the batch method on a CUDA older than 12.8 (no cudaMemcpyBatchAsync).
old_cuda=$(grep -c 'the batch method needs cudaMemcpyBatchAsync' "$RESULTS/gpu_tests.log" || true)
if [ "$old_cuda" -gt 0 ]; then
  say "note: $old_cuda batch-method test(s) skipped: this CUDA has no cudaMemcpyBatchAsync (< 12.8)"
fi
[ "$(grep -c 'OK \] .*CudaStreamOrder' "$RESULTS/gpu_tests.log" || true)" -ge 5 ] ||
  fail "not all 5 CudaStreamOrder tests ran (is cuda_backend_test built with the CUDA backend?)"
[ "$((skipped - old_cuda))" -le 0 ] ||
  fail "$skipped GPU test(s) SKIPPED on a GPU machine: $(grep -m1 -A1 'Skipped$' "$RESULTS/gpu_tests.log" | tail -n 1)"
[ "$ran" -gt 0 ] || fail "no GPU test ran"
say "GPU tests: $ran ran and passed, $skipped skipped"
timeout 60 build/tests/cuda_backend_test >"$RESULTS/cuda_backend_test_all.log" 2>&1 ||
  { tail -n 30 "$RESULTS/cuda_backend_test_all.log"; fail "cuda_backend_test (all)"; }

# 4. The benchmark, both G1 arrangements.
for arr in layer-separate block-contiguous; do
  say "kvtier bench copy --device cuda --json --arrangement $arr --blocks ${BLOCKS:-512}"
  set +e
  timeout 150 build/kvtier bench copy --device cuda --json --arrangement "$arr" \
    --blocks "${BLOCKS:-512}" >"$RESULTS/bench_copy_cuda_$arr.json" 2>"$RESULTS/bench_copy_cuda_$arr.err"
  rc=$?
  set -e
  cat "$RESULTS/bench_copy_cuda_$arr.json" | tee -a "$LOG"
  [ "$rc" = 0 ] || { cat "$RESULTS/bench_copy_cuda_$arr.err"; fail "bench copy --device cuda ($arr) exited $rc"; }
done

# 5. Summary.
python3 - "$RESULTS" <<'EOF' | tee -a "$LOG" "$RESULTS/summary.txt"
import json, sys
d = sys.argv[1]
for arr in ("layer-separate", "block-contiguous"):
    r = json.load(open(f"{d}/bench_copy_cuda_{arr}.json"))
    print(f"{arr}: {r['device']}")
    print(f"  cuda_memcpy_gbps {r['cuda_memcpy_gbps']:.2f} (d2h {r['cuda_memcpy_d2h_gbps']:.2f}, "
          f"h2d {r['cuda_memcpy_h2d_gbps']:.2f}); {r['blocks']} blocks of {r['block_bytes']} B")
    for name, m in r["methods"].items():
        ok = lambda x: "MET" if x >= 0.85 else "NOT MET"
        print(f"  {name:7s} d2h {m['d2h_gbps']:6.2f} GB/s ({m['d2h_ratio']:.3f}x, {ok(m['d2h_ratio'])})"
              f"  h2d {m['h2d_gbps']:6.2f} GB/s ({m['h2d_ratio']:.3f}x, {ok(m['h2d_ratio'])})"
              f"  mismatched bytes {m['mismatched_bytes']}")
    for s in r.get("skipped_methods", []):
        print(f"  skipped {s}")
EOF
vllm034_step
say "done in $(($(date +%s) - T0)) s; results in $RESULTS"

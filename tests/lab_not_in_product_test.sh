#!/usr/bin/env bash
# The product never links the lab (docs/architecture.md, "The product and the lab"): fails when
# libkvtier.so defines a symbol that the lab library defines (its own code: strong symbols only,
# since inline functions and template instances of the standard library may be in both), or a
# symbol named after the simulator, Belady's oracle, the trace readers or the lab's eviction
# policies (lineage-lru and leaf-first-lru, s3fifo: lab/policies; docs/policies.md) (the
# header-only JSONL reader leaves only weak symbols behind, which the first check cannot tell
# from the standard library's).
# Usage: lab_not_in_product_test.sh LIBKVTIER_SO LIBKVTIER_LAB_A. Exit 77 (skip) without nm.
set -euo pipefail
so=$1
lab=$2
if ! command -v nm >/dev/null; then
  echo "lab_not_in_product: SKIP: nm not found (binutils)"
  exit 77
fi
for f in "$so" "$lab"; do
  [ -f "$f" ] || { echo "lab_not_in_product: $f does not exist; build kvtier_shared and kvtier_lab" >&2; exit 1; }
done

# Strong (T, D, B, R) symbols the lab defines, by mangled name.
lab_syms=$(nm --defined-only "$lab" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[TDBR]$/ { print $3 }' | sort -u)
if [ -z "$lab_syms" ]; then
  echo "lab_not_in_product: nm lists no symbol of $lab; the check would pass on nothing" >&2
  exit 1
fi
so_syms=$(nm --defined-only "$so" | awk 'NF == 3 { print $3 }' | sort -u)
shared=$(comm -12 <(echo "$lab_syms") <(echo "$so_syms"))

# The lab's names, demangled, wherever they are defined in the .so (any binding).
names='BeladyPolicy|MakeBeladyPolicy|SimulatePolicy|SimulateUnbounded|MooncakeTrace|TraceReferences|TraceBlockKey|TraceRootKey|CapacityForFraction|SimResult|JsonLineParser|OpenTraceFile|kMaxTraceLine|ReplayTrace|MooncakeToken|kvtier::Trace\b|LineageLruPolicy|S3FifoPolicy|MakeLabEvictionPolicy|EnableLabPolicies'
named=$(nm -C --defined-only "$so" | grep -E "$names" || true)

if [ -n "$shared" ] || [ -n "$named" ]; then
  echo "lab_not_in_product: FAIL: $so defines lab code (lab/, kvtier_lab); the product must not link it" >&2
  [ -n "$shared" ] && { echo "symbols kvtier_lab also defines:"; echo "$shared" | c++filt | head -20; } >&2
  [ -n "$named" ] && { echo "symbols named after the lab:"; echo "$named" | head -20; } >&2
  exit 1
fi
echo "lab_not_in_product: $so defines none of the $(echo "$lab_syms" | wc -l) symbols of $lab, nor any named after the lab"

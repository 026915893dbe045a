#!/usr/bin/env bash
# Where a limiter's instructions go besides its own code: heap allocations
# per request, and the instructions spent in the allocator and in memcpy
# (moves of large values), each (at 2N requests - at N requests) / N, as in
# run.sh. Usage: benches/overhead/allocs.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-10000}
. benches/overhead/bench-bin.sh
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# measure MODE N: "allocations memcpy-instructions allocator-instructions"
measure() {
  valgrind --tool=callgrind --toggle-collect=overhead::serve --callgrind-out-file="$out/cg" "$bin" "$1" "$2" \
    >/dev/null 2>&1
  local allocs
  # the calls into `__rust_alloc`, summed over its callers
  allocs=$(callgrind_annotate --tree=caller --threshold=100 "$out/cg" 2>/dev/null | awk '
    /^$/ { calls = 0; next }
    / < / { if (match($0, /\(([0-9,]+)x\)/)) { c = substr($0, RSTART + 1, RLENGTH - 3); gsub(",", "", c); calls += c } }
    /\* / && /__rust_alloc / && !done { print calls; done = 1 }')
  callgrind_annotate --inclusive=no --threshold=100 "$out/cg" 2>/dev/null | awk -v a="${allocs:-0}" '
    { v = $1; gsub(",", "", v) }
    /__memcpy_avx_unaligned_erms/ { m += v }
    /malloc\.c:|arena\.c:free|__rdl_alloc|__rdl_dealloc/ { f += v }
    END { print a, m, f }'
}
printf '%-15s %12s %12s %12s\n' mode allocations memcpy allocator
for mode in none governor-plain governor ours-none ours-ietf ours ours-unit ours-concurrency; do
  read -r a1 m1 f1 < <(measure "$mode" "$n")
  read -r a2 m2 f2 < <(measure "$mode" $((2 * n)))
  awk -v mode="$mode" -v n="$n" -v a1="$a1" -v a2="$a2" -v m1="$m1" -v m2="$m2" -v f1="$f1" -v f2="$f2" \
    'BEGIN { printf "%-15s %12.2f %12d %12d\n", mode, (a2 - a1) / n, (m2 - m1) / n, (f2 - f1) / n }'
done

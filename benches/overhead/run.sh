#!/usr/bin/env bash
# Instructions per request added by each limiter, counted by callgrind:
# (instructions at 2N requests - at N requests) / N, minus the same for the
# router without a limiter. Only the request loop is counted (see `serve` in
# overhead.rs); then the bare check of ours and governor. Usage:
# benches/overhead/run.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-20000}
. benches/overhead/bench-bin.sh
count() {
  valgrind --tool=callgrind --toggle-collect=overhead::serve --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
declare -A per
for mode in none noop fields fields+id ours ours-ietf ours-none ours-unlimited governor governor-plain; do
  a=$(count "$mode" "$n"); b=$(count "$mode" $((2 * n)))
  per[$mode]=$(( (b - a) / n ))
done
printf '%-10s %14s %14s\n' mode "instr/request" "added/request"
for mode in none noop fields fields+id ours ours-ietf ours-none ours-unlimited governor governor-plain; do
  printf '%-10s %14d %14d\n' "$mode" "${per[$mode]}" $(( ${per[$mode]} - ${per[none]} ))
done
ours=$(( ${per[ours]} - ${per[none]} )); gov=$(( ${per[governor]} - ${per[none]} ))
ietf=$(( ${per[ours-ietf]} - ${per[none]} ))
plain=$(( ${per[governor-plain]} - ${per[none]} )); none=$(( ${per[ours-none]} - ${per[none]} ))
awk -v o="$ours" -v g="$gov" 'BEGIN { printf "ours (five fields) / tower_governor = %.2f\n", o / g }'
awk -v o="$ietf" -v g="$gov" 'BEGIN { printf "ours (IETF fields) / tower_governor = %.2f\n", o / g }'
awk -v o="$none" -v g="$plain" 'BEGIN { printf "ours without fields / tower_governor without headers = %.2f\n", o / g }'
# The bare check: instructions per check inside the loop functions alone
# (the clocks' calibration and the first insertion of every key cancel out).
# core LOOP MODE N: the loop function LOOP counted, in the bench's MODE
core() {
  valgrind --tool=callgrind --toggle-collect="overhead::core_loop_$1" --callgrind-out-file=/dev/null \
    "$bin" "$2" "$3" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
# (a tier with a unit runs the loop of ours: the two would be one function)
for subject in "ours core-ours" "governor core-governor" "governor_state core-governor-state" \
  "ours core-ours-unit" "record core-record" "new_keys core-new-keys"; do
  set -- $subject
  a=$(core "$1" "$2" 100000); b=$(core "$1" "$2" 200000)
  printf '%-22s %6d instructions\n' "$2" $(( (b - a) / 100000 ))
done
# Customers on contracts of their own: the first ones, and the same after
# 20,000 other distinct contracts (a decision's cost must not grow with them).
for mode in contracts-first contracts-late; do
  a=$(count "$mode" "$n"); b=$(count "$mode" $((2 * n)))
  printf '%-16s %8d instructions added per request\n' "$mode" $(( (b - a) / n - ${per[none]} ))
done
# A tier with a concurrency limit: a slot taken and given back per request
# (its extra RateLimit item included), against the same tier without one.
a=$(count ours-concurrency "$n"); b=$(count ours-concurrency $((2 * n)))
with=$(( (b - a) / n - ${per[none]} ))
printf '%-16s %8d instructions added per request (%+d against ours)\n' ours-concurrency "$with" $(( with - ours ))
# A tier with a unit (tokens): each request requires the unit's band and
# charges its request band, against the same tier without the unit.
a=$(count ours-unit "$n"); b=$(count ours-unit $((2 * n)))
with=$(( (b - a) / n - ${per[none]} ))
printf '%-16s %8d instructions added per request (%+d against ours)\n' ours-unit "$with" $(( with - ours ))

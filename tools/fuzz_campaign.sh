#!/usr/bin/env bash
# Fuzzing campaign: every libFuzzer harness at once, each with a share of
# the cores, until it has run its executions (default 10^7) or the time
# is up. Prints one line per harness (executions, coverage, findings) and
# copies any crashing input to OUT/crashes/.
#
#   tools/fuzz_campaign.sh BUILD OUT [SECONDS] [EXECS]
#
# BUILD holds the fuzz_* binaries (scripts/test.sh builds them in
# build-fuzz), OUT receives the logs. fuzz_http needs a model: SLUICE_MODEL
# (a small random one serves, e.g. tools/make_random_model.py --type q8_0
# --layers 2 --embd 64 --ff 128 --heads 2 --kv-heads 1 --vocab 0).
# Jobs per harness follow their speed (HARNESS:JOBS in FUZZ_PLAN); the
# default plan fills 16 cores. Corpora start from tests/fuzz/corpus/.
set -u
build=$(cd "$1" && pwd); mkdir -p "$2"; out=$(cd "$2" && pwd)
secs=${3:-560}; execs=${4:-10000000}
here=$(cd "$(dirname "$0")/.." && pwd)
plan=${FUZZ_PLAN:-"gguf:1 jinja:2 server_json:2 stop:2 tokenizer:5 http:4"}
mkdir -p "$out/crashes"
pids=()
for item in $plan; do
  name=${item%%:*}; jobs=${item#*:}
  bin="$build/fuzz_$name"
  [ -x "$bin" ] || { echo "no $bin" >&2; continue; }
  work="$out/$name"; mkdir -p "$work/corpus"
  seeds=()
  [ -d "$here/tests/fuzz/corpus/$name" ] && seeds+=("$here/tests/fuzz/corpus/$name")
  [ "$name" = jinja ] && seeds+=("$here/tests/fixtures/templates")
  runs=$(( (execs + jobs - 1) / jobs ))
  ( cd "$work" && "$bin" -jobs="$jobs" -workers="$jobs" -runs="$runs" \
      -max_total_time="$secs" -print_final_stats=1 \
      -artifact_prefix="$out/crashes/${name}-" \
      corpus "${seeds[@]}" > driver.log 2>&1 ) &
  pids+=($!)
done
wait "${pids[@]}"
printf "%-12s %5s %12s %7s %8s\n" harness jobs executions cov crashes
for item in $plan; do
  name=${item%%:*}; jobs=${item#*:}; work="$out/$name"
  [ -d "$work" ] || continue
  n=$(cat "$work"/fuzz-*.log 2>/dev/null |
      awk '/stat::number_of_executed_units/ {s += $2} END {print s + 0}')
  cov=$(cat "$work"/fuzz-*.log 2>/dev/null |
        grep -o 'cov: [0-9]*' | awk '{if ($2 > m) m = $2} END {print m + 0}')
  crashes=$(ls "$out/crashes" | grep -c "^${name}-" || true)
  printf "%-12s %5s %12s %7s %8s\n" "$name" "$jobs" "$n" "$cov" "$crashes"
done

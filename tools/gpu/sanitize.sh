#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck) over a short `sluice
# serve --device cuda` run under tools/gpu/load.py: 8 concurrent clients, a
# prefix-cache hit, an abort, and clears during decode (every 8 tokens).
# The three tools run at once, each on its own server and port (they share
# the GPU; each run is independent). Prints each tool's summary line; logs
# in $OUT/sanitize-<tool>.log (on a failure, their tails).
. tools/gpu/env.sh
CS=${CS:-/usr/local/cuda/bin/compute-sanitizer}
one() {
  local tool=$1 port=$2 log=$OUT/sanitize-$1.log rc=0
  $CS --tool $tool --print-limit 20 \
    build-gpu/sluice serve --device cuda --port $port -c 1024 \
    --clear-every-tokens 8 --max-seqs 16 >"$log" 2>&1 &
  local pid=$!
  for i in $(seq 1 480); do
    grep -q "sluice: serving" "$log" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  timeout ${LOAD_TIMEOUT:-300} python3 tools/gpu/load.py $port 8 \
    ${MAX_TOKENS:-24} >>"$log" 2>&1 || rc=1
  # stop sluice itself (its graceful exit lets the tool print its summary),
  # not the tool
  pkill -TERM -P $pid 2>/dev/null || kill -TERM $pid
  wait $pid
  echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|load ok|FAILED' "$log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || { echo "--- $tool log tail"; tail -15 "$log"; }
  return $rc
}
rc=0
pids=()
p=$((18000 + RANDOM % 1000))
for tool in ${TOOLS:-memcheck racecheck synccheck}; do
  one $tool $p >"$OUT/sanitize-$tool.sum" 2>&1 &
  pids+=($!)
  p=$((p + 1))
done
for pid in "${pids[@]}"; do wait $pid || rc=1; done
cat "$OUT"/sanitize-*.sum
exit $rc

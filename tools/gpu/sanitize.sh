#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck) over a short `sluice
# serve --device cuda` run under tools/gpu/load.py: 8 concurrent clients, a
# prefix-cache hit, an abort, and clears during decode (every 8 tokens).
# Prints each tool's summary line; logs in $OUT/sanitize-<tool>.log.
. tools/gpu/env.sh
CS=${CS:-/usr/local/cuda/bin/compute-sanitizer}
rc=0
for tool in ${TOOLS:-memcheck racecheck synccheck}; do
  port=$((18000 + RANDOM % 1000))
  log=$OUT/sanitize-$tool.log
  $CS --tool $tool --print-limit 20 \
    build-gpu/sluice serve --device cuda --port $port -c 1024 --clear-every-tokens 8 \
    --max-seqs 16 >"$log" 2>&1 &
  pid=$!
  for i in $(seq 1 600); do
    grep -q "sluice: serving" "$log" && break
    sleep 0.5
  done
  timeout 500 python3 tools/gpu/load.py $port 8 >>"$log" 2>&1 || rc=1
  # stop sluice itself (its graceful exit lets the tool print its summary),
  # not the tool
  pkill -TERM -P $pid 2>/dev/null || kill -TERM $pid
  wait $pid
  echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|load ok|FAILED' "$log" | tr '\n' ' ')"
done
exit $rc

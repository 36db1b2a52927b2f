#!/usr/bin/env bash
# The clears' share of decode time (issue 8: < 1%), measured: `sluice serve
# --device cuda` on MODEL (default: the default model, whose short steps make clears weigh most)
# under tools/gpu/load.py (16 clients, 128 tokens each), with a clear every
# EVERY tokens (default 1: the worst case) and every 256 (the default);
# prints load.py's line on the clears (ms of clears / ms of steps).
. tools/gpu/env.sh
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
for every in ${EVERY:-1 256}; do
  port=$((19000 + RANDOM % 1000))
  log=$OUT/clears-$every.log
  build-gpu/sluice serve --device cuda -m "$MODEL" --port $port -c 2048 \
    --clear-every-tokens $every --max-seqs 32 >"$log" 2>&1 &
  pid=$!
  for i in $(seq 1 600); do
    grep -q "sluice: serving" "$log" && break
    sleep 0.5
  done
  timeout 300 python3 tools/gpu/load.py $port 16 128 >>"$log" 2>&1
  kill -TERM $pid; wait $pid
  echo "clear every $every: $(grep -E '^clears:|load ok|FAILED' "$log" | tr '\n' ' ')"
done

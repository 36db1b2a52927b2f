#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck) over a short `sluice
# serve --device cuda` run under tools/gpu/load.py: 8 concurrent clients, a
# prefix-cache hit, an abort, and clears during decode (every 8 tokens).
# The three tools run at once, each on its own server and port (they share
# the GPU; each run is independent). Prints each tool's summary line; logs
# in $OUT/sanitize-<tool>.log (on a failure, their tails).
. tools/gpu/env.sh
CS=${CS:-/usr/local/cuda/bin/compute-sanitizer}
desc() { local c; for c in $(pgrep -P "$1"); do echo "$c"; desc "$c"; done; }
one() {
  local tool=$1 port=$2 log=$OUT/sanitize-$1.log rc=0
  # racecheck: SLUICE_CUDA_GEMM=0, every product on sluice's own kernels.
  # cuBLAS's Hopper GEMM kernels (nvjet_*, NVIDIA's code) made the tool's
  # tracking grow the process by ~1.5 GB/s until the kernel's OOM killer
  # ended it, and with them excluded (--kernel-name-exclude) the tool
  # failed on a hardware exception (docs/PERF.md, 2026-12-04).
  # Even so the tool's memory grows with every kernel it checks (~1.3 GB a
  # second of checked work, never given back): graphs off (no warm-up
  # captures), a shorter load (MAX_TOKENS, CLEAR_EVERY) keep it in the
  # machine's memory.
  local genv=""
  [ $tool = racecheck ] &&
    genv=${RACE_ENV:-"SLUICE_CUDA_GEMM=0 SLUICE_CUDA_GRAPHS=0"}
  env $genv $CS --tool $tool --print-limit 20 \
    build-gpu/sluice serve --device cuda ${MODEL:+-m $MODEL} --port $port -c 1024 \
    --clear-every-tokens ${CLEAR_EVERY:-8} --max-seqs 16 >"$log" 2>&1 &
  local pid=$!
  # every 2 s: the sanitized process's state and resident size (a death
  # under a tool leaves no exit code; this shows when and at what size)
  (while kill -0 $pid 2>/dev/null; do
    for c in $(desc $pid); do ps -o pid=,stat=,rss=,etime=,comm= -p $c; done |
      sed "s/^/$(date +%T) /"
    sleep 2
  done) >"$OUT/sanitize-$tool.ps" 2>&1 &
  for i in $(seq 1 480); do
    grep -q "sluice: serving" "$log" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  timeout ${LOAD_TIMEOUT:-300} python3 tools/gpu/load.py $port 8 \
    ${MAX_TOKENS:-24} >>"$log" 2>&1 || rc=1
  # stop sluice itself (its graceful exit lets the tool print its summary),
  # not the tool
  local sp
  sp=$(for c in $(desc $pid); do ps -o pid=,comm= -p $c; done |
    awk '$2=="sluice"{print $1}' | head -1)
  kill -TERM ${sp:-$pid}
  wait $pid
  local st=$? # 128 + N: the tool was killed by signal N (137: SIGKILL)
  echo "$tool: exit $st $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|load ok|FAILED' "$log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || {
    echo "--- $tool log tail"; tail -15 "$log"
    echo "--- $tool process samples (last)"; tail -4 "$OUT/sanitize-$tool.ps"
    echo "--- kernel log"; dmesg 2>/dev/null | grep -iE "oom|killed|segfault" | tail -5
  }
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

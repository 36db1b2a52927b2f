#!/usr/bin/env bash
# Peak host memory of `sluice run --device cuda` under a compute-sanitizer
# tool, with switches (why racecheck over serve was OOM-killed at ~130 GB).
# Usage: race_probe.sh NAME [ENV=VAL ...]; env TOOL (racecheck), CSARGS.
. tools/gpu/env.sh
CS=${CS:-/usr/local/cuda/bin/compute-sanitizer}
name=$1; shift
log=$OUT/probe-$name.log
env "$@" timeout ${PROBE_TIMEOUT:-150} $CS --tool ${TOOL:-racecheck} ${CSARGS:-} \
  ${CMD:-build-gpu/sluice run --device cuda -m ${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf} -n ${N:-16} --temp 0 -p "Once upon a time"} >"$log" 2>&1 &
pid=$!
desc() { local c; for c in $(pgrep -P "$1"); do echo "$c"; desc "$c"; done; }
peak=0 t0=$(date +%s)
while kill -0 $pid 2>/dev/null; do
  sp=$(for c in $(desc $pid); do ps -o pid=,comm= -p $c; done | awk -v comm=$(basename ${CMD:-sluice} | cut -d' ' -f1) '$2==substr(comm,1,15){print $1}' | head -1)
  r=$([ -n "$sp" ] && ps -o rss= -p $sp)
  r=${r:-0}
  [ "$r" -gt "$peak" ] && peak=$r
  if [ "$r" -gt $((${GUARD_GB:-30} * 1024 * 1024)) ]; then kill -KILL $sp; echo "$name: killed at ${GUARD_GB:-30} GB" >>"$log"; fi
  sleep 1
done
wait $pid
echo "$name [$*]: exit $? peak_rss $((peak / 1024)) MB $(( $(date +%s) - t0 )) s $(grep -E 'SUMMARY|killed' "$log" | tr '\n' ' ')"

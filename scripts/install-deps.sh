#!/usr/bin/env bash
# Installs everything sluice needs to build and test on a fresh Debian machine:
# the C toolchain and -dev libraries (apt-get) and the Python test tools (pip).
# Idempotent; needs root (or sudo) for apt-get.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

pkgs=(build-essential cmake ninja-build pkg-config clang clang-format
      libclang-rt-14-dev
      unzip libopenblas-dev libpcre2-dev libutf8proc-dev libjansson-dev
      libmicrohttpd-dev libxxhash-dev libzstd-dev liblz4-dev python3-pip
      chromium chromium-driver)  # the dashboard's test drives a real browser
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "${SLUICE_SKIP_PIP:-0}" != 1 ]; then
  # llama-cpp-python builds llama.cpp from source (minutes, once): only
  # libllama and ggml, on every core; its multimodal library (mtmd), which
  # no test loads, is left out (LLAVA_BUILD=OFF).
  CMAKE_ARGS="${CMAKE_ARGS:-} -DLLAVA_BUILD=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    python3 -m pip install -q --disable-pip-version-check \
    -r "$here/requirements-dev.txt" 2>&1 | grep -v "Running pip as the 'root'" || true
  # fail loudly if pip failed (the llama.cpp comparisons skip without llama_cpp)
  python3 -c "import pytest, numpy, gguf, jinja2, openai, anthropic, jsonschema, agents, llama_cpp, langchain_openai, langchain_anthropic"
fi

# Sourced by tools/gpu/*.sh on a GPU machine without Debian's -dev packages
# (the H200 lent to sessions): extracts the .deb files carried in .devdeps
# into /tmp/deps, installs the wheels carried in .whl into /tmp/site, puts
# both on the search paths, and reassembles the default model from the parts
# carried in .m1 and .m2 (the model is larger than one call may carry).
set -u
if [ -d .devdeps ] && [ ! -d /tmp/deps/usr ]; then
  mkdir -p /tmp/deps
  for f in .devdeps/*.deb; do dpkg -x "$f" /tmp/deps; done
fi
if [ -d /tmp/deps/usr ]; then
  # libmicrohttpd.pc names gnutls in Requires.private, and no gnutls.pc is
  # there: pkg-config would then refuse libmicrohttpd (and no `sluice serve`
  # is built); the shared library needs no gnutls flags to link
  sed -i '/^Requires.private:/d' \
    /tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig/libmicrohttpd.pc 2>/dev/null
  export PKG_CONFIG_SYSROOT_DIR=/tmp/deps
  export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig
  export LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  export C_INCLUDE_PATH=/tmp/deps/usr/include
fi
if [ -d .whl ] && [ ! -d /tmp/site/gguf ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
mkdir -p /tmp/m
[ -f .m1/part1 ] && cp .m1/part1 /tmp/m/part1
[ -f .m2/part2 ] && cp .m2/part2 /tmp/m/part2
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$M" ] && [ -f /tmp/m/part1 ] && [ -f /tmp/m/part2 ]; then
  mkdir -p models && cat /tmp/m/part1 /tmp/m/part2 > "$M"
fi
# the llama.cpp peer (CUDA build of ../shared/peers/build-llama-server.sh),
# stripped and xz-compressed (the GPU machine has no zstd), one binary per
# call (.peer1, .peer2)
mkdir -p /tmp/peer
for f in .peer1/llama-bench.xz .peer2/llama-server.xz; do
  b=/tmp/peer/$(basename "$f" .xz)
  [ -f "$f" ] && [ ! -x "$b" ] && xz -d -c "$f" > "$b" && chmod +x "$b"
done
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

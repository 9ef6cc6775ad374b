#!/usr/bin/env bash
# `make wheelhouse`: every distribution the images install, fetched by pip on the host with the
# pins of constraints.txt and checked against the hashes of requirements.lock, into
# build/wheelhouse/ (inside the build context, outside git and outside Ray's job upload: build/
# is gitignored). The image builds then run pip with
# --no-index against it: same versions as the tested environment, and offline builds work.
#
#   docker/wheelhouse.sh                       CPU flavour: this machine's Python and torch build
#   WHEEL_PYTHON=3.12 TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 docker/wheelhouse.sh
#                                              GPU flavour for a CUDA base on Ubuntu 24.04
#
# Env: PYTHON (host interpreter running pip, default .venv/bin/python), WHEELHOUSE (out dir),
# WHEEL_PYTHON (target Python X.Y when it differs from the host's: binary wheels only, for
# manylinux x86_64), TORCH_INDEX_URL (extra index holding the torch build to ship).
# DeepSpeed is published as an sdist only: it is kept as one, and each image compiles it with
# exactly the op its training uses (docker/Dockerfile).
set -euo pipefail
cd "$(dirname "$0")/.."

py="${PYTHON:-.venv/bin/python}"
out="${WHEELHOUSE:-build/wheelhouse}"
lock=constraints.txt
tmp="$out.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"

pin() {  # the lock's version of a package
  local v
  v=$(grep -iE "^$1==" "$lock" | head -n1 | cut -d= -f3)
  [ -n "$v" ] || { echo "error: $lock pins no $1" >&2; exit 2; }
  echo "$v"
}

target=()
if [ -n "${WHEEL_PYTHON:-}" ]; then
  target=(--only-binary=:all: --python-version "$WHEEL_PYTHON" --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform linux_x86_64)
fi
index=()
[ -n "${TORCH_INDEX_URL:-}" ] && index=(--extra-index-url "$TORCH_INDEX_URL")

# 1. DeepSpeed's sdist; its own requirements join the list below (resolved as wheels).
"$py" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" "deepspeed==$(pin deepspeed)"
tar -xzOf "$tmp/deepspeed-$(pin deepspeed).tar.gz" "deepspeed-$(pin deepspeed)/requirements/requirements.txt" \
  | grep -vE '^\s*(#|$)' >"$tmp/deepspeed-requirements.txt"

# 2. Everything else: the training dependencies, the MLflow server extra, the build tools
#    DeepSpeed's --no-build-isolation build needs.
#    (The list stays outside the wheelhouse: the images' layer cache keys on its content.)
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
"$py" docker/requirements.py --extra server --exclude deepspeed >"$reqs"
cat "$tmp/deepspeed-requirements.txt" >>"$reqs"
printf 'pip\nsetuptools\n' >>"$reqs"
"$py" -m pip download -q --prefer-binary "${target[@]}" "${index[@]}" -c "$lock" -r "$reqs" -d "$tmp"

# 3. Every file fetched must carry a sha256 of the hashed lock of its flavour: requirements.lock
#    (make lock) for the CPU wheelhouse, requirements-gpu.lock (make lock-gpu) for one with
#    TORCH_INDEX_URL; without that file the GPU wheelhouse is pinned by version only (a warning).
hashed=requirements.lock
[ -n "${TORCH_INDEX_URL:-}" ] && hashed=requirements-gpu.lock
if [ -f "$hashed" ]; then
  "$py" - "$hashed" "$tmp" <<'EOF'
import hashlib
import re
import sys
from pathlib import Path

known = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", Path(sys.argv[1]).read_text()))
files = [f for f in sorted(Path(sys.argv[2]).iterdir()) if f.name.endswith((".whl", ".tar.gz", ".zip"))]
bad = [f.name for f in files if hashlib.sha256(f.read_bytes()).hexdigest() not in known]
if bad:
    sys.exit(f"error: {len(bad)} of {len(files)} downloaded files have no sha256 in {sys.argv[1]} (make lock): {' '.join(bad)}")
print(f"wheelhouse: all {len(files)} files match a sha256 of {sys.argv[1]}")
EOF
else
  echo "warning: no $hashed (make lock-gpu, where $TORCH_INDEX_URL answers): this wheelhouse is pinned by version, not by hash" >&2
fi

cp "$lock" "$tmp/constraints.txt"
rm -rf "$out"
mv "$tmp" "$out"
echo "wheelhouse: $(find "$out" -name '*.whl' | wc -l) wheels + deepspeed sdist, $(du -sh "$out" | cut -f1) in $out"

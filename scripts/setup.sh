#!/usr/bin/env bash
# Set up hetsync on a fresh Debian/Ubuntu machine: a virtual environment in .venv with torch,
# the package and its test tools, and real Fashion-MNIST (Debian's dataset-fashion-mnist).
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
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "setup: installing Debian's chromium (the live page's browser test)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
    || echo "setup: chromium not installed; the live page's browser test will be skipped"
fi
echo "setup: done ($(.venv/bin/hetsync --version), torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"

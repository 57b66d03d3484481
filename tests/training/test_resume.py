"""Killing an RL round mid-way and re-running it resumes from its last state checkpoint and ends
bitwise where an uninterrupted round ends (issue 5, acceptance 4)."""

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).parents[1] / "workers" / "rl_round_worker.py"
DETERMINISTIC = lambda key: not key.startswith("perf/") and "latency" not in key and "seconds" not in key  # noqa: E731


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(WORKER), *args], capture_output=True, text=True, timeout=timeout, check=True
    )


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_killed_round_resumes_to_the_same_state(algorithm, tmp_path):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup.sh installs it)")
    _run(["--algorithm", algorithm, "--out", str(tmp_path / "straight.pt")])

    state = tmp_path / "state"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            "--algorithm",
            algorithm,
            "--state-dir",
            str(state),
            "--out",
            str(tmp_path / "killed.pt"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not (state / "LATEST").exists():  # the step-2 state is complete: kill the round inside step 3
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "no state checkpoint within 300 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "killed.pt").exists()  # it really died before finishing

    _run(["--algorithm", algorithm, "--state-dir", str(state), "--out", str(tmp_path / "resumed.pt")])
    straight, resumed = (
        torch.load(tmp_path / "straight.pt", weights_only=False),
        torch.load(tmp_path / "resumed.pt", weights_only=False),
    )
    assert 2 <= resumed["resumed_from_step"] < 6
    for name, value in straight["params"].items():
        assert torch.equal(value, resumed["params"][name]), f"{name} differs after resume"
    assert resumed["trajectory_ids"] == straight["trajectory_ids"]  # the data cursor continued where it stopped
    for a, b in zip(straight["history"], resumed["history"], strict=True):
        assert {k: v for k, v in a.items() if DETERMINISTIC(k)} == {k: v for k, v in b.items() if DETERMINISTIC(k)}


def test_state_of_another_config_is_not_resumed(tmp_path):
    from training.rl.loop import RoundResult, load_state, save_state

    class Engine:
        def save_state(self, path):
            Path(path).mkdir(parents=True)

    import random

    save_state(tmp_path, 2, "fingerprint-a", {"policy": Engine()}, random.Random(0), torch.Generator(), RoundResult())
    assert load_state(tmp_path, "fingerprint-a")[1]["step"] == 2
    assert load_state(tmp_path, "fingerprint-b") is None
    save_state(tmp_path, 4, "fingerprint-a", {"policy": Engine()}, random.Random(0), torch.Generator(), RoundResult())
    assert [p.name for p in tmp_path.glob("step-*")] == ["step-00004"]  # older states are pruned


def test_state_written_by_code_that_has_moved_starts_the_loop_over(tmp_path, monkeypatch):
    """A state whose pickled classes no longer import (a module renamed since, as training.rl_loop
    became training.rl.loop) is not an error: the loop starts over, with a warning."""
    import random
    import sys

    from training.rl.loop import RoundResult
    from training.state import load_state, save_state

    class Engine:
        def save_state(self, path):
            Path(path).mkdir(parents=True)

    code = tmp_path / "code"
    code.mkdir()
    (code / "moved_module.py").write_text("class Record:\n    pass\n")
    monkeypatch.syspath_prepend(str(code))
    import moved_module

    result = RoundResult(rollouts=[moved_module.Record()])
    save_state(tmp_path / "state", 2, "key", {"policy": Engine()}, random.Random(0), torch.Generator(), result)
    assert load_state(tmp_path / "state", "key")[1]["step"] == 2
    (code / "moved_module.py").unlink()
    monkeypatch.delitem(sys.modules, "moved_module")
    with pytest.warns(UserWarning, match="written by another version of the code.*moved_module.*starts over"):
        assert load_state(tmp_path / "state", "key") is None


@pytest.mark.parametrize("damage", ["altered", "truncated", "missing", "extra"])
def test_damaged_state_is_refused_naming_the_file(tmp_path, damage):
    import random

    from training.rl.loop import RoundResult
    from training.state import CorruptState, load_state, save_state

    class Engine:
        def save_state(self, path):
            Path(path).mkdir(parents=True)
            torch.save({"weights": torch.arange(1000.0)}, Path(path) / "engine.pt")

    save_state(tmp_path, 3, "key", {"policy": Engine()}, random.Random(0), torch.Generator(), RoundResult())
    target = tmp_path / "step-00003" / "policy" / "engine.pt"
    if damage == "altered":
        data = bytearray(target.read_bytes())
        data[-10] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "truncated":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "missing":
        target.unlink()
    else:
        (target.parent / "stray.bin").write_bytes(b"x")
    with pytest.raises(CorruptState, match="stray.bin" if damage == "extra" else "policy/engine.pt") as error:
        load_state(tmp_path, "key")
    assert f"delete {tmp_path}" in str(error.value)

"""Multi-process steps (issue 23): the SFT loop and the data-parallel RL round on 2 ranks under
torchrun (ZeRO-2 and ZeRO-3, gloo on CPU) end within 1e-5 of 1 rank on the same batch; a launched
job's rank that dies fails the step naming the rank and its last lines."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from assets.launcher import JobLauncher, failed_ranks, rank_failure_message
from training.data_parallel import DataParallel, interleave
from training.engines import DIST_ENV

pytestmark = pytest.mark.scaleout
REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "workers" / "rl_round_worker.py"
TOLERANCE = 1e-5


def run_worker(out: Path, *args: str, nproc: int = 1, timeout: float = 420) -> dict:
    launch = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        if nproc > 1
        else [sys.executable]
    )
    # not this process's world
    proc = subprocess.run(
        [*launch, str(WORKER), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**{k: v for k, v in os.environ.items() if k not in DIST_ENV}, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


def assert_close_training(one: dict, two: dict) -> None:
    """Parameter norms and every weight within 1e-5 (a sample would do; all of them is cheap here)."""
    assert one["params"].keys() == two["params"].keys()
    for name, value in one["params"].items():
        other = two["params"][name]
        assert abs(float(value.norm()) - float(other.norm())) < TOLERANCE, name
        assert float((value - other).abs().max()) < TOLERANCE, name


def test_interleave_undoes_the_strided_split():
    items = list(range(11))
    shares = [DataParallel(rank, 3).mine(items) for rank in range(3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]
    assert interleave(shares) == items
    with pytest.raises(ValueError, match="rank 0 returned 3 items for the 4"):  # a rank that lost an item
        interleave([[0, 3, 6], [1, 4, 7, 10], [2, 5, 8]])


@pytest.fixture(scope="module")
def warm_folder(warm_policy, tmp_path_factory) -> Path:
    """The warm-started micro policy and its arithmetic tasks, for the workers to start from."""
    import json

    from training.model import save_checkpoint

    folder = tmp_path_factory.mktemp("warm")
    save_checkpoint(warm_policy.model, warm_policy.tokenizer, folder)
    (folder / "tasks.json").write_text(json.dumps([t for t in warm_policy.tasks if t["family"] == "arithmetic"][:60]))
    return folder


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")  # 2 ranks each: not next to another 2-rank job
@pytest.mark.parametrize("stage", [2, 3])
def test_two_rank_rl_round_ends_where_one_rank_does(stage, tmp_path, warm_folder):
    """Two RL steps (rollouts, advantages on whole groups, ZeRO update, weights back to the
    sampler) on 2 ranks: each rank rolls out half of the groups; the global batch, the sampled
    ids and the weights match the 1-rank round."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup.sh installs it)")
    args = (
        "--engine",
        "deepspeed",
        "--zero-stage",
        str(stage),
        "--steps",
        "2",
        "--micro-batch-size",
        "2",
        "--init",
        str(warm_folder),
    )
    one = run_worker(tmp_path / "one.pt", *args)
    two = run_worker(tmp_path / "two.pt", *args, nproc=2)
    assert two["trajectory_ids"] == one["trajectory_ids"] and two["completion_ids"] == one["completion_ids"]
    trained = [h for h in one["history"] if h["rollout/trained_trajectories"] > 0]
    assert trained, "no step trained: nothing was compared"
    for a, b in zip(one["history"], two["history"], strict=True):
        for key in (
            "reward/total/mean",
            "rollout/zero_variance_frac",
            "rollout/trained_trajectories",
            "rollout/repeat_rate",
        ):
            assert a[key] == b[key], key  # global-batch metrics, not one rank's half
        for key in ("actor/grad_norm", "loss/policy", "actor/entropy"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert_close_training(one, two)


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
@pytest.mark.parametrize("stage", [2, 3])
def test_two_rank_sft_ends_where_one_rank_does(stage, tmp_path):
    args = (
        "--loop",
        "sft",
        "--engine",
        "deepspeed",
        "--zero-stage",
        str(stage),
        "--steps",
        "3",
        "--micro-batch-size",
        "2",
    )
    one = run_worker(tmp_path / "one.pt", *args)
    two = run_worker(tmp_path / "two.pt", *args, nproc=2)
    assert [h["loss/sft"] for h in two["history"]] == pytest.approx([h["loss/sft"] for h in one["history"]], rel=1e-5)
    assert_close_training(one, two)


def test_a_failed_rank_is_named_with_its_last_lines(tmp_path):
    """torchrun's per-rank log folder -> the step's error: the rank that raised (its error.json),
    with the tail of what it wrote."""
    for rank, text, error in (
        (0, "step 1\nstep 2\n", False),
        (1, "step 1\nTraceback (most recent call last):\nValueError: boom\n", True),
    ):
        folder = tmp_path / "run-1" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(text)
        if error:
            (folder / "error.json").write_text("{}")
    failed = failed_ranks(tmp_path)
    assert list(failed) == [1] and failed[1].endswith("ValueError: boom")
    message = rank_failure_message("rl_round", failed)
    assert "job 'rl_round': rank 1 failed" in message and "ValueError: boom" in message and "resume" in message


@pytest.mark.xdist_group("torchrun")
def test_a_launched_job_whose_rank_dies_fails_naming_that_rank(tmp_path):
    """Through the real launcher: a 2-rank torchrun job whose ranks raise. The step's error names
    the ranks that failed and shows their last lines (here, the job refusing a context it cannot
    read)."""
    from dagster import asset, materialize

    from assets.launcher import RankFailed

    @asset
    def launched(context) -> None:
        JobLauncher(kind="subprocess", nproc_per_node=2).launch(
            context,
            "benchmark",
            {
                "profile": "micro",
                "overrides_json": "{}",
                "storage_root": str(tmp_path / "nowhere"),
                "cache_dir": str(tmp_path / "cache"),
                "pointer": {"uri": "x"},
                "tasks_asset": "benchmark_tasks",
            },
        )

    with pytest.raises(RankFailed) as info:
        materialize([launched], raise_on_error=True)
    message = str(info.value)
    # Both ranks raise, but torchrun stops the survivor once one fails: whichever got to write its
    # error file first is named, so the message names rank 0, rank 1 or both (a race, not a choice).
    assert re.search(r"job 'benchmark': rank (0, 1|0|1) failed", message), message
    assert "no stored benchmark_tasks" in message


def test_every_rank_writes_its_own_vllm_engine_folder(warm_policy, tmp_path, monkeypatch):
    """transformers' save_pretrained writes on rank 0 only once a process group exists, which left
    rank 1's vLLM engine an empty folder. The engine folder is written by whichever rank asks."""
    import transformers.distributed.mixin as mixin
    from transformers import AutoModelForCausalLM

    from training.agent.engines import save_engine_folder

    monkeypatch.setattr(mixin, "_is_torch_distributed_initialized", lambda: True)
    monkeypatch.setattr(mixin, "_get_torch_distributed_rank", lambda: 1)
    warm_policy.model.save_pretrained(tmp_path / "gated")
    assert not (tmp_path / "gated" / "model.safetensors").exists()  # the failure this guards against
    save_engine_folder(warm_policy.model, warm_policy.tokenizer, tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, tensor in warm_policy.model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_a_killed_two_rank_round_resumes_from_its_state_checkpoint(tmp_path, warm_folder):
    """Kill a 2-rank round (torchrun and both ranks) after its step-2 state is saved; the re-run
    resumes from that state and ends exactly where an uninterrupted 2-rank round ends."""
    import signal
    import time

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup.sh installs it)")
    args = ("--steps", "4", "--init", str(warm_folder))
    straight = run_worker(tmp_path / "straight.pt", *args, nproc=2)
    state = tmp_path / "state"
    env = {**{k: v for k, v in os.environ.items() if k not in DIST_ENV}, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(WORKER),
            *args,
            "--state-dir",
            str(state),
            "--out",
            str(tmp_path / "killed.pt"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not (state / "LATEST").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "no state checkpoint"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks, as a lost node would
    proc.wait()
    assert not (tmp_path / "killed.pt").exists()
    resumed = run_worker(tmp_path / "resumed.pt", *args, "--state-dir", str(state), nproc=2)
    assert 2 <= resumed["resumed_from_step"] < 4
    assert resumed["trajectory_ids"] == straight["trajectory_ids"]
    for name, value in straight["params"].items():
        assert torch.equal(value, resumed["params"][name]), f"{name} differs after resume"

"""The resume state's size does not grow with the step count (issue 26): what a loop produces step by
step goes to the journal beside the step folder, written once per entry, and `loop.pt` holds only
fixed-size state. A checkpointing step's `perf/step_s` includes its save."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

from training.state import CorruptState, load_state, save_state

pytestmark = pytest.mark.perf


class Engine:
    def save_state(self, path):
        Path(path).mkdir(parents=True)
        torch.save({"weights": torch.arange(100.0)}, Path(path) / "engine.pt")


def entry(step: int) -> dict:
    # about an RL step's worth of rollouts: rows of token ids
    return {"step": step, "rollouts": [{"completion_ids": list(range(200))} for _ in range(16)]}


def save(state_dir: Path, step: int, journal: list, key: str = "key") -> None:
    save_state(state_dir, step, key, {"policy": Engine()}, random.Random(0), torch.Generator(), None, journal=journal)


def test_loop_pt_does_not_grow_with_the_step_count(tmp_path):
    journal, sizes = [], []
    for step in range(1, 11):
        journal.append(entry(step))
        save(tmp_path, step, journal)
        sizes.append((tmp_path / f"step-{step:05d}" / "loop.pt").stat().st_size)
        # each save writes only what is new: the journal holds one file per entry
        assert len(list((tmp_path / "journal").glob("*.pt"))) == step
    assert len(set(sizes)) == 1, sizes
    folder, loop = load_state(tmp_path, "key")
    assert folder.name == "step-00010" and loop["journal"] == journal


def test_entries_past_the_saved_count_are_dropped_on_resume(tmp_path):
    # A save killed after its journal entries were written but before LATEST moved.
    journal = [entry(1), entry(2)]
    save(tmp_path, 2, journal)
    torch.save(entry(3), tmp_path / "journal" / "00002.pt")
    (tmp_path / "journal" / "00002.sha256").write_text("0" * 64)
    _, loop = load_state(tmp_path, "key")
    assert loop["journal"] == journal
    assert sorted(p.name for p in (tmp_path / "journal").glob("*.pt")) == ["00000.pt", "00001.pt"]
    # the resumed loop's next save writes its own entry 3
    save(tmp_path, 3, [*journal, entry(30)])
    assert load_state(tmp_path, "key")[1]["journal"][-1] == entry(30)


def test_another_loops_journal_is_rewritten_not_reused(tmp_path):
    save(tmp_path, 2, [entry(1), entry(2)], key="a")
    assert load_state(tmp_path, "b") is None  # another config: starts fresh
    save(tmp_path, 1, [entry(100)], key="b")
    assert load_state(tmp_path, "b")[1]["journal"] == [entry(100)]


@pytest.mark.parametrize("damage", ["altered", "missing"])
def test_a_damaged_journal_is_refused(tmp_path, damage):
    save(tmp_path, 2, [entry(1), entry(2)])
    target = tmp_path / "journal" / "00000.pt"
    if damage == "altered":
        target.write_bytes(target.read_bytes()[:-8] + b"\0" * 8)
    else:
        target.unlink()
    with pytest.raises(CorruptState, match="journal"):
        load_state(tmp_path, "key")


def test_rl_round_state_stays_one_size_and_step_time_includes_the_save(tmp_path):
    """A real round (micro profile, GRPO) saving at every step."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup.sh installs it)")
    from configs import load_profile
    from configs.schema import RewardConfig
    from environments.arithmetic import generate_tasks
    from environments.tools import CodeInterpreter, toolbox
    from training.model import build_model
    from training.rl.loop import train_round
    from training.tokenizer import train_tokenizer
    from training.trajectories import tokenizer_corpus
    from verifiers.cascade import Cascade
    from verifiers.sandbox import BubblewrapSandbox, SandboxLimits

    cfg = load_profile("micro")
    tasks = generate_tasks(100, seed=7, split="train")
    tok = train_tokenizer(tokenizer_corpus(tasks), 300)
    policy = build_model(cfg.model, len(tok), tok.eos_token_id, seed=2)
    rl = cfg.rl.model_copy(update={"steps_per_round": 6, "checkpoint_every": 1, "prompts_per_step": 2, "group_size": 4})
    state_dir = tmp_path / "state"
    sizes, seen = {}, []

    def on_step(step, metrics):
        seen.append(metrics)
        if step < rl.steps_per_round:  # the last step saves nothing: the round's output follows
            sizes[step] = (state_dir / f"step-{step:05d}" / "loop.pt").stat().st_size

    box = BubblewrapSandbox(SandboxLimits(), pool_size=1)
    try:
        result = train_round(
            policy,
            build_model(cfg.model, len(tok), tok.eos_token_id, seed=2).requires_grad_(False),
            tok,
            tasks,
            toolbox(CodeInterpreter(box)),
            rl=rl,
            rollout=cfg.rollout,
            cascade=Cascade(RewardConfig(), box, concurrency=1),
            round_index=1,
            policy_version="t",
            seed=11,
            state_dir=state_dir,
            on_step=on_step,
        )
    finally:
        box.close()
    assert len(result.rollouts) == 6 * 2 * 4
    assert len(set(sizes.values())) == 1, sizes  # loop.pt: one size at every step
    assert len(list((state_dir / "journal").glob("*.pt"))) == 5
    for metrics in seen[:-1]:
        assert 0 < metrics["perf/save_s"] < metrics["perf/step_s"]
        assert metrics["perf/step_s"] >= metrics["perf/generate_s"] + metrics["perf/save_s"]
    assert "perf/save_s" not in seen[-1]
    # what the round reports is what the callback saw, times included
    assert [h["perf/step_s"] for h in result.history] == [m["perf/step_s"] for m in seen]

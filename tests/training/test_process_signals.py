"""Process signals from tools (issue 29, item 2): per-turn penalties from tool results, capped so
the outcome keeps most of the reward, credited to the turn that caused them."""

import json

import pytest

from configs.schema import ProcessConfig, RewardConfig
from training.rl.process import (
    on_turn_tokens,
    process_total,
    signal_kind,
    turn_advantages,
    turn_returns,
    turn_signals,
)

pytestmark = pytest.mark.methods

PENALTIES = {"error": 0.1, "timeout": 0.2, "empty_search": 0.05}


def test_each_tool_result_is_a_signal_on_its_turn_and_infrastructure_failures_are_not():
    calls = [
        {"name": "code", "error": "nonzero_exit"},  # a traceback / SyntaxError
        {"name": "code", "error": None},
        {"name": "search", "error": "no_results"},
        {"name": "code", "error": "cpu_limit"},
        {"name": "code", "error": "sandbox_failure: worker died"},  # not the policy's doing
        {"name": "code", "error": "killed:SIGKILL"},
    ]
    assert turn_signals(calls, PENALTIES) == [-0.1, 0.0, -0.05, -0.2, 0.0, -0.1]
    assert signal_kind(None) is None and signal_kind("sandbox_failure: x") is None
    assert turn_signals(calls, {"error": 0.1}) == [-0.1, 0.0, 0.0, 0.0, 0.0, -0.1]  # unlisted kinds cost nothing


def test_no_number_of_clean_calls_earns_anything():
    """The policy's way to farm a per-call term is to call more: clean calls are worth 0."""
    clean = [{"name": "code", "error": None}] * 50
    assert process_total(turn_signals(clean, PENALTIES), 0.15) == 0.0
    assert max(turn_returns(turn_signals(clean, PENALTIES), 0.9, 0.15)) == 0.0


def test_the_total_and_every_turn_return_are_capped():
    assert process_total([], 0.15) == 0.0
    assert process_total([-0.1, 0.0], 0.15) == pytest.approx(-0.1)
    assert process_total([-0.1] * 10, 0.15) == pytest.approx(-0.15)
    # G_k = s_k + gamma * G_{k+1}; the answer turn (last) gets 0
    assert turn_returns([-0.1, 0.0, -0.1], gamma=0.5, cap=1.0) == pytest.approx([-0.125, -0.05, -0.1, 0.0])
    assert turn_returns([-0.1] * 5, gamma=1.0, cap=0.25) == pytest.approx([-0.25, -0.25, -0.25, -0.2, -0.1, 0.0])
    assert turn_returns([], gamma=0.9, cap=0.15) == [0.0]


def test_turn_advantages_are_normalized_over_the_groups_turns():
    returns = [[-0.1, 0.0], [0.0, 0.0], [0.0, 0.0, 0.0]]  # group a: one erroring turn; group b: none
    adv = turn_advantages(returns, ["a", "a", "b"])
    assert adv[2] == [0.0, 0.0, 0.0]  # no signal in the group: nothing added
    flat = adv[0] + adv[1]
    assert sum(flat) == pytest.approx(0.0, abs=1e-6)
    assert adv[0][0] < 0 < adv[0][1] and adv[0][1] == pytest.approx(adv[1][0])
    assert adv[0][0] == pytest.approx(-3 / 3**0.5, rel=1e-4)  # (G - mean) / std with mean -0.025, std 0.0433


def test_a_turn_value_lands_on_that_turns_tokens_only():
    #        turn 0       tool  turn 1   tool  turn 2
    mask = [1, 1, 1, 0, 0, 1, 1, 0, 1, 1]
    assert on_turn_tokens([0.5, -1.0, 2.0], mask) == [0.5, 0.5, 0.5, 0, 0, -1.0, -1.0, 0, 2.0, 2.0]
    assert on_turn_tokens([0.5], mask) == [0.5, 0.5, 0.5, 0, 0, 0.5, 0.5, 0, 0.5, 0.5]
    assert on_turn_tokens([], mask) == [0.0] * len(mask)


def test_the_process_cap_counts_among_the_shaping_caps_and_penalties_cannot_be_bonuses():
    RewardConfig(process={"enabled": True, "cap": 0.15})  # 0.8 + 0.15 < 1
    with pytest.raises(ValueError, match=r"process.cap 0.3 included"):
        RewardConfig(process={"enabled": True, "cap": 0.3})
    RewardConfig(process={"enabled": False, "cap": 0.3})  # off: not counted
    with pytest.raises(ValueError, match="a bonus per call"):
        ProcessConfig(penalties={"error": -0.1})
    with pytest.raises(ValueError):
        ProcessConfig(turn_weight=1.5)


def test_score_records_adds_the_process_term_as_a_component_or_reports_it_for_turn_credit(tokenizer_and_tasks, sandbox):
    """Through the real cascade: with `trajectory` credit the total is in the reward and its
    components still sum to it; with `turn` credit the reward is untouched."""
    from training.rl.scoring import score_records
    from verifiers.cascade import Cascade

    tok, tasks = tokenizer_and_tasks
    task = tasks[0]
    text = f"<code>1/0</code><interpreter>ZeroDivisionError</interpreter><answer>{task['answer']}</answer>"
    ids = tok.encode(text)
    record = {
        "trajectory_id": "g-0",
        "task_id": task["task_id"],
        "group_id": "g",
        "family": task["family"],
        "level": task["level"],
        "round": 1,
        "step": 0,
        "completion_ids": ids,
        "tool_mask": [1] * len(ids),
        "num_tool_calls": 1,
        "tool_calls": json.dumps([{"name": "code", "args": "1/0", "error": "nonzero_exit"}]),
    }
    by_id = {task["task_id"]: task}
    plain = score_records([record], by_id, tok, Cascade(RewardConfig(), sandbox))[0]
    on = {"enabled": True, "penalties": {"error": 0.1}}
    traj = score_records([record], by_id, tok, Cascade(RewardConfig(process={**on, "credit": "trajectory"}), sandbox))[
        0
    ]
    assert traj["reward_process"] == pytest.approx(-0.1)
    assert traj["reward"] == pytest.approx(plain["reward"] - 0.1)
    components = [v for k, v in traj.items() if k.startswith("reward_")]
    assert sum(components) == pytest.approx(traj["reward"])
    turn = score_records([record], by_id, tok, Cascade(RewardConfig(process={**on, "credit": "turn"}), sandbox))[0]
    assert turn["reward"] == pytest.approx(plain["reward"]) and turn["process_total"] == pytest.approx(-0.1)
    assert "reward_process" not in turn


def test_turn_credit_moves_the_advantage_of_the_turn_whose_call_failed(warm_policy, micro_cfg, sandbox):
    """prepare_samples on real episodes: with `turn` credit each policy turn's tokens get the
    sequence advantage plus turn_weight times its turn-level advantage; tool output gets nothing."""
    import torch

    from configs.schema import RLConfig
    from training.agent.engines import HFEngine
    from training.agent.loop import run_episodes
    from training.rl.algorithms import resolve_algorithm
    from training.rl.loop import prepare_samples
    from training.rl.scoring import episode_record, score_records
    from verifiers.cascade import Cascade

    tasks = [
        t for f in ("arithmetic", "code", "search") for t in [x for x in warm_policy.tasks if x["family"] == f][:3]
    ]
    episodes = run_episodes(
        HFEngine(warm_policy.model),
        warm_policy.tokenizer,
        tasks,
        group_size=4,
        tools=warm_policy.tools,
        cfg=micro_cfg.rollout,
        generator=torch.Generator().manual_seed(0),
    )
    records = [
        episode_record(e, round_index=1, step=1, policy_version="t", tokenizer=warm_policy.tokenizer) for e in episodes
    ]
    calling = [r for r in records if r["num_tool_calls"] > 0]
    assert len(calling) >= 4, "the warm policy should call its tools"
    for i, r in enumerate(calling):  # every other call fails, so groups differ in their signals
        calls = json.loads(r["tool_calls"])
        calls[0]["error"] = "nonzero_exit" if i % 2 == 0 else None
        r["tool_calls"] = json.dumps(calls)
    process = ProcessConfig(enabled=True, penalties={"error": 0.1}, credit="turn", turn_weight=0.5)
    cascade = Cascade(RewardConfig(process=process), sandbox)
    scores = score_records(records, {t["task_id"]: t for t in tasks}, warm_policy.tokenizer, cascade)
    for i, s in enumerate(scores):  # every group informative, deterministically
        s["reward"] = float(i % 2)
    algo = resolve_algorithm(RLConfig(algorithm="grpo", kl_coef=0.0, drop_zero_variance_groups=False))
    common = dict(policy=warm_policy.model, reference=None, critic=None, temperature=1.0, pad_id=0)
    plain, _ = prepare_samples(records, scores, algo, **common)
    credited, metrics = prepare_samples(records, scores, algo, **common, process=process)
    returns = [
        turn_returns(turn_signals(json.loads(r["tool_calls"]), process.penalties), 0.9, process.cap) for r in records
    ]
    per_turn = turn_advantages(returns, [r["group_id"] for r in records])
    moved = 0
    for p, c, r, turns in zip(plain, credited, records, per_turn):
        n = len(r["tool_mask"])
        expected = torch.tensor(on_turn_tokens(turns, r["tool_mask"]))
        torch.testing.assert_close(c.advantages[:n] - p.advantages[:n], 0.5 * expected, atol=1e-5, rtol=0)
        assert all(float(x) == 0.0 for x, m in zip(expected, r["tool_mask"]) if m == 0)
        moved += bool(expected.abs().sum() > 0)
    assert moved >= 4 and metrics["actor/turn_advantage_abs_mean"] > 0

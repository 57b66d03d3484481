"""RL algorithms as presets: resolution, loop-vs-vectorized estimators, KL placement, dynamic
sampling, and every algorithm running a real round on the micro model."""

import math
import statistics

import pytest
import torch

from configs import ConfigError, load_profile
from configs.schema import RewardConfig, RLConfig
from environments.tools import CodeInterpreter, toolbox
from training.agent.engines import HFEngine
from training.agent.loop import run_episodes
from training.model import build_model
from training.rl.algorithms import ALGORITHMS, Algorithm, resolve_algorithm
from training.rl.batch import Sample
from training.rl.loop import (
    _first_spread_groups,
    informative_groups,
    on_policy_metrics,
    policy_loss_fn,
    prepare_samples,
    recorded_logprobs,
    reuses_update_logprobs,
    run_update,
    token_rewards,
    train_round,
)
from training.rl.math import ADVANTAGE_ESTIMATORS, get_advantage_estimator, gspo_loss, kl_penalty, ppo_clip_loss
from training.rl.scoring import episode_record, score_records
from verifiers.cascade import Cascade


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_every_preset_resolves(name):
    algo = resolve_algorithm(RLConfig(algorithm=name))
    assert algo.critic == (name == "ppo")
    assert algo.dynamic_sampling == (name == "dapo")
    assert algo.needs_reference == (name not in ("dapo", "gspo"))


def test_explicit_fields_override_the_preset():
    algo = resolve_algorithm(RLConfig(algorithm="dapo", loss_agg_mode="seq_mean_token_mean", kl_coef=0.05))
    assert (algo.loss_agg_mode, algo.kl_coef, algo.clip_high, algo.dynamic_sampling) == (
        "seq_mean_token_mean",
        0.05,
        0.28,
        True,
    )
    # the critic follows the estimator, whatever the preset
    assert resolve_algorithm(RLConfig(algorithm="grpo", advantage_estimator="gae")).critic
    assert not resolve_algorithm(RLConfig(algorithm="ppo", advantage_estimator="rloo")).critic


def test_preset_values_follow_the_papers():
    dapo, gspo, drgrpo, ppo = (resolve_algorithm(RLConfig(algorithm=n)) for n in ("dapo", "gspo", "dr_grpo", "ppo"))
    assert dapo.clip_high > dapo.clip_low and dapo.loss_agg_mode == "token_mean" and dapo.kl_coef == 0
    assert gspo.policy_loss == "gspo" and gspo.loss_agg_mode == "seq_mean_token_mean"
    assert drgrpo.advantage_estimator == "dr_grpo" and drgrpo.loss_agg_mode == "seq_mean_token_sum_norm"
    assert ppo.advantage_estimator == "gae" and ppo.kl_placement == "reward"


# ----------------------------------------------------------------------------- numerical bounds (issue 21)
BOUND_DEFAULTS = {"k3_clamp": 10.0, "clip_ratio_c": 3.0, "seq_log_ratio_max": 10.0}  # verl's core_algos


@pytest.mark.integrity
def test_bound_defaults_are_verls_everywhere():
    import dataclasses
    import inspect

    assert {k: getattr(RLConfig(), k) for k in BOUND_DEFAULTS} == BOUND_DEFAULTS
    assert {f.name: f.default for f in dataclasses.fields(Algorithm) if f.name in BOUND_DEFAULTS} == BOUND_DEFAULTS
    params = {
        **inspect.signature(ppo_clip_loss).parameters,
        **inspect.signature(gspo_loss).parameters,
        **inspect.signature(kl_penalty).parameters,
    }
    assert {k: params[k].default for k in BOUND_DEFAULTS} == BOUND_DEFAULTS
    for name in ALGORITHMS.names():  # the same for every preset, whatever it overrides
        algo = resolve_algorithm(RLConfig(algorithm=name))
        assert {k: getattr(algo, k) for k in BOUND_DEFAULTS} == BOUND_DEFAULTS, name
    # None switches the two optional bounds off; it does not mean "the preset's value" here
    off = resolve_algorithm(RLConfig(algorithm="dapo", k3_clamp=None, clip_ratio_c=None, seq_log_ratio_max=20.0))
    assert (off.k3_clamp, off.clip_ratio_c, off.seq_log_ratio_max) == (None, None, 20.0)


@pytest.mark.integrity
@pytest.mark.parametrize(
    "field, bad, reason",
    [
        ("k3_clamp", 0, "greater than 0"),
        # verl asserts clip_ratio_c > 1: at 1 every A < 0 token would be capped
        (
            "clip_ratio_c",
            1.0,
            "greater than 1",
        ),
        ("seq_log_ratio_max", 0, "greater than 0"),
        ("seq_log_ratio_max", 25, "less than or equal to 20"),  # rl_math.LOG_RATIO_CLAMP, the finite-exp guard
    ],
)
def test_bounds_are_validated_at_load_time_naming_the_field(field, bad, reason):
    with pytest.raises(ConfigError) as err:
        load_profile("tiny", {f"rl.{field}": bad})
    assert f"rl.{field}" in str(err.value) and reason in str(err.value) and str(bad) in str(err.value)


@pytest.mark.integrity
@pytest.mark.parametrize(
    "algorithm, bounds, policy, kl",
    [
        # 3 tokens, A = -1, V = 4 uniform logits: logp = -ln 4; old = logp - ln 5 (r = 5); ref = logp + 3, so
        # k3 = e^3 - 3 - 1 = 16.0855. kl_coef .5, token mean over 3 tokens. loss = policy + .5 * kl.
        ("grpo", {}, 3.0, 10.0),  # dual-clip -A*3 = 3; k3 clamped at 10: 3 + 5 = 8
        ("grpo", {"clip_ratio_c": 2.5, "k3_clamp": 4.0}, 2.5, 4.0),  # 2.5 + 2 = 4.5
        # both off (the old behaviour): -A r = 5; 5 + 8.0428 = 13.0428
        (
            "grpo",
            {"clip_ratio_c": None, "k3_clamp": None},
            5.0,
            math.exp(3) - 4,
        ),
        # GSPO: s = exp(mean log r) = 5; a cap of 1 gives s = e (dual-clip off), A = -1: loss e per token
        ("gspo", {"clip_ratio_c": None, "seq_log_ratio_max": 1.0}, math.e, 10.0),
        ("gspo", {"clip_ratio_c": None}, 5.0, 10.0),  # the default cap (10) does not bind at ln 5
    ],
)
def test_the_bounds_flow_from_the_config_to_the_loss(monkeypatch, algorithm, bounds, policy, kl):
    from types import SimpleNamespace

    import training.rl.loop as rl_loop

    # uniform logits over 4 tokens: every log-prob is -log 4 and every entropy log 4
    monkeypatch.setattr(
        rl_loop,
        "completion_logprobs",
        lambda module, batch, temperature, **kw: (
            torch.full(batch.completion_ids.shape, -math.log(4)),
            torch.full(batch.completion_ids.shape, math.log(4)),
        ),
    )
    logp = -math.log(4)
    record = {"prompt_ids": [5, 6], "completion_ids": [0, 1, 2], "tool_mask": [1, 1, 1], "logprobs": [logp] * 3}
    sample = Sample(record, [-1.0] * 3, [logp - math.log(5)] * 3, ref_logprobs=[logp + 3.0] * 3)
    algo = resolve_algorithm(
        RLConfig(algorithm=algorithm, kl_coef=0.5, kl_estimator="k3", kl_placement="loss", **bounds)
    )
    loss_fn = policy_loss_fn(
        SimpleNamespace(module=None, device=torch.device("cpu")), algo, temperature=1.0, pad_id=0, loss_norm_tokens=8
    )
    loss, out = loss_fn([sample], torch.tensor([3.0, 1.0]))
    assert out["loss/policy"] == pytest.approx(policy, rel=1e-5) and out["loss/kl"] == pytest.approx(kl, rel=1e-5)
    assert loss.item() == pytest.approx(policy + 0.5 * kl, rel=1e-5)
    assert out["actor/dual_clip_frac"] == (1.0 if bounds.get("clip_ratio_c", 3.0) else 0.0)


# ----------------------------------------------------------------------------- loop == vectorized
def _loop_estimator(name: str, rewards: list[float], groups: list[int]) -> list[float]:
    """Straight-from-the-paper loops, one trajectory at a time."""
    members = {g: [r for r, h in zip(rewards, groups) if h == g] for g in set(groups)}
    out = []
    for r, g in zip(rewards, groups):
        rs = members[g]
        constant = max(rs) == min(rs)
        mean = sum(rs) / len(rs)
        if name == "grpo":
            out.append(0.0 if constant else (r - mean) / (statistics.stdev(rs) + 1e-6))
        elif name == "dr_grpo":
            out.append(0.0 if constant else r - mean)
        elif name == "rloo":
            out.append(0.0 if constant else r - (sum(rs) - r) / (len(rs) - 1))
        elif name == "reinforce_pp":
            out.append((r - statistics.mean(rewards)) / (statistics.stdev(rewards) + 1e-6))
        elif name == "reinforce_pp_baseline":
            out.append(0.0 if constant else r - mean)
    if name == "reinforce_pp_baseline":
        live = [a for a, r, g in zip(out, rewards, groups) if max(members[g]) != min(members[g])]
        scale = statistics.stdev(live)
        out = [a / (scale + 1e-6) for a in out]
    return out


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_estimator_matches_its_loop_form(name):
    g = torch.Generator().manual_seed(3)
    groups = torch.randint(0, 7, (48,), generator=g).tolist()
    rewards = (torch.randint(0, 3, (48,), generator=g).float() / 2).tolist()  # ties and constant groups happen
    expected = _loop_estimator(name, rewards, groups)
    actual = get_advantage_estimator(name)(torch.tensor(rewards), torch.tensor(groups))
    torch.testing.assert_close(actual, torch.tensor(expected), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- KL placement, sampling
def test_token_rewards_by_hand():
    # policy tokens at 0, 1, 3 (2 is a tool observation): -beta*kl there, outcome on the last (3)
    assert token_rewards(1.0, [0.2, 0.4, 9.0, 0.1], [1, 1, 0, 1], 0.5) == pytest.approx([-0.1, -0.2, 0.0, 1.0 - 0.05])
    assert token_rewards(1.0, [0.0, 0.0], [0, 0], 0.5) == [0.0, 0.0]  # no policy token: nothing to reward


def test_dynamic_sampling_keeps_the_first_groups_with_spread():
    records = [{"group_id": g} for g in "aabbccdd"]
    scores = [{"reward": r} for r in (1, 1, 0, 1, 0, 0, 1, 0)]
    assert informative_groups([s["reward"] for s in scores], [r["group_id"] for r in records]).tolist() == [
        False,
        False,
        True,
        True,
        False,
        False,
        True,
        True,
    ]
    kept, _ = _first_spread_groups(records, scores, 1)
    assert [r["group_id"] for r in kept] == ["b", "b"]


def test_the_outcome_filter_ignores_shaping_only_spread():
    """DAPO's accuracy filter: group a's samples all fail and differ only by a tool-cost term, group b's
    all succeed; under the reward filter both would train (their std-normalized advantages are +-1),
    under the outcome filter only c, whose outcomes differ, does."""
    records = [{"group_id": g} for g in "aabbcc"]
    scores = [
        {"reward": r, "outcome": o}
        for r, o in ((-0.1, 0.0), (-0.2, 0.0), (1.0, 1.0), (0.9, 1.0), (1.0, 1.0), (-0.1, 0.0))
    ]
    assert [r["group_id"] for r in _first_spread_groups(records, scores, 3)[0]] == list("aabbcc")
    assert [r["group_id"] for r in _first_spread_groups(records, scores, 3, "outcome")[0]] == ["c", "c"]
    scores[0]["outcome"] = None  # unscorable counts as no success, as the collapse metrics read it
    assert [r["group_id"] for r in _first_spread_groups(records, scores, 3, "outcome")[0]] == ["c", "c"]


@pytest.fixture(scope="module")
def rollout_batch(tokenizer_and_tasks, micro_cfg, sandbox):
    tok, tasks = tokenizer_and_tasks
    policy = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=4)
    episodes = run_episodes(
        HFEngine(policy),
        tok,
        tasks[:3],
        group_size=4,
        tools=toolbox(CodeInterpreter(sandbox)),
        cfg=micro_cfg.rollout,
        generator=torch.Generator().manual_seed(0),
    )
    records = [episode_record(e, round_index=1, step=1, policy_version="t", tokenizer=tok) for e in episodes]
    scores = score_records(records, {t["task_id"]: t for t in tasks}, tok, Cascade(RewardConfig(), sandbox))
    for i, s in enumerate(scores):  # make every group informative, deterministically
        s["reward"] = float(i % 2)
    return policy, tok, records, scores


def test_kl_in_the_reward_lowers_each_sequence_reward_by_beta_times_its_kl(rollout_batch, micro_cfg):
    policy, tok, records, scores = rollout_batch
    reference = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=5)
    rl = RLConfig(algorithm="rloo", kl_coef=0.5, drop_zero_variance_groups=False)
    samples, metrics = prepare_samples(
        records,
        scores,
        resolve_algorithm(rl),
        policy=policy,
        reference=reference,
        critic=None,
        temperature=1.0,
        pad_id=tok.eos_token_id,
    )
    ref = recorded_logprobs(reference, records, temperature=1.0, pad_id=tok.eos_token_id)
    # the trainer's, not the engine's
    old = recorded_logprobs(policy, records, temperature=1.0, pad_id=tok.eos_token_id)
    adjusted = []
    for r, s, ref_i, old_i in zip(records, scores, ref, old):
        kl = kl_penalty(torch.tensor(old_i), torch.tensor(ref_i), "k1")
        adjusted.append(s["reward"] - 0.5 * float((kl * torch.tensor(r["tool_mask"])).sum()))
    expected = get_advantage_estimator("rloo")(
        torch.tensor(adjusted), torch.tensor([i // 4 for i in range(len(records))])
    )
    torch.testing.assert_close(torch.stack([s.advantages[0] for s in samples]), expected, atol=1e-4, rtol=1e-4)
    assert metrics["actor/kl_ref"] > 0
    # in the loss instead: the advantages are the plain outcome ones
    rl_loss = RLConfig(algorithm="rloo", kl_coef=0.5, kl_placement="loss", drop_zero_variance_groups=False)
    samples_loss, _ = prepare_samples(
        records,
        scores,
        resolve_algorithm(rl_loss),
        policy=policy,
        reference=reference,
        critic=None,
        temperature=1.0,
        pad_id=tok.eos_token_id,
    )
    plain = get_advantage_estimator("rloo")(
        torch.tensor([s["reward"] for s in scores]), torch.tensor([i // 4 for i in range(len(records))])
    )
    torch.testing.assert_close(torch.stack([s.advantages[0] for s in samples_loss]), plain)
    assert samples_loss[0].ref_logprobs.tolist() == pytest.approx(ref[0])


def test_without_dynamic_sampling_the_outcome_filter_drops_constant_outcome_groups(rollout_batch):
    policy, tok, records, scores = rollout_batch
    # group 0 all solved, rewards still spread
    scores = [dict(s, outcome=1.0 if i < 4 else float(i % 2)) for i, s in enumerate(scores)]
    rl = RLConfig(algorithm="grpo", kl_coef=0.0, group_filter="outcome")
    samples, metrics = prepare_samples(
        records,
        scores,
        resolve_algorithm(rl),
        policy=policy,
        reference=None,
        critic=None,
        temperature=1.0,
        pad_id=tok.eos_token_id,
    )
    assert {s.record["group_id"] for s in samples} == {r["group_id"] for r in records[4:]}
    assert metrics["rollout/no_outcome_spread_dropped"] == 4
    by_reward, _ = prepare_samples(
        records,
        scores,
        resolve_algorithm(RLConfig(algorithm="grpo", kl_coef=0.0)),
        policy=policy,
        reference=None,
        critic=None,
        temperature=1.0,
        pad_id=tok.eos_token_id,
    )
    assert len(by_reward) == len(records)


def test_a_strictly_on_policy_update_reuses_its_own_logprobs(rollout_batch, micro_cfg):
    """One optimizer step per batch: no separate old-log-prob pass, and the same update, mismatch
    and KL as with it (the recomputed old log-probs are the update's own, up to batching noise)."""
    import copy

    from configs.schema import EngineConfig
    from training.engines import build_engine

    policy, tok, records, scores = rollout_batch
    reference = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=5).requires_grad_(False)
    rl = RLConfig(algorithm="grpo", minibatches=1, drop_zero_variance_groups=False)
    algo = resolve_algorithm(rl)
    assert reuses_update_logprobs(algo)
    # the second minibatch is off-policy
    assert not reuses_update_logprobs(resolve_algorithm(rl.model_copy(update={"minibatches": 2})))
    assert not reuses_update_logprobs(resolve_algorithm(rl.model_copy(update={"tis_cap": 2.0})))
    assert not reuses_update_logprobs(resolve_algorithm(RLConfig(algorithm="rloo", minibatches=1)))  # KL in the reward
    runs = {}
    for name, cfg in (("reuse", rl), ("recompute", rl.model_copy(update={"minibatches": 2}))):
        model = copy.deepcopy(policy)
        samples, metrics = prepare_samples(
            records,
            scores,
            resolve_algorithm(cfg),
            policy=model,
            reference=reference,
            critic=None,
            temperature=1.0,
            pad_id=tok.eos_token_id,
        )
        engine = build_engine(model, EngineConfig(), lr=1e-2, grad_clip=1.0)
        stats: dict = {}
        update = run_update(
            engine,
            samples,
            policy_loss_fn(engine, algo, temperature=1.0, pad_id=tok.eos_token_id, loss_norm_tokens=256, stats=stats),
            minibatches=1,
            micro_batch_size=None,
            generator=torch.Generator().manual_seed(0),
            prefix="actor",
        )
        runs[name] = (samples, metrics | on_policy_metrics(stats), update, model)
    (reuse_samples, reuse_metrics, reuse_update, reuse_model), (old_samples, old_metrics, old_update, old_model) = (
        runs["reuse"],
        runs["recompute"],
    )
    assert all(s.old_logprobs is None for s in reuse_samples) and all(s.old_logprobs is not None for s in old_samples)
    assert reuse_update["loss/policy"] == pytest.approx(old_update["loss/policy"], abs=1e-5)
    for a, b in zip(reuse_model.parameters(), old_model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert not torch.equal(next(reuse_model.parameters()), next(policy.parameters()))  # the update did move the weights
    for key in ("rollout/logprob_mismatch_max", "rollout/logprob_mismatch_mean", "actor/kl_ref"):
        assert reuse_metrics[key] == pytest.approx(old_metrics[key], abs=1e-5), key
    assert reuse_metrics["actor/kl_ref"] > 0


def test_ppo_advantages_are_per_token_and_zero_on_tool_output(rollout_batch):
    from training.rl.critic import critic_from_policy

    policy, tok, records, scores = rollout_batch
    rl = RLConfig(algorithm="ppo", kl_coef=0.0)
    samples, metrics = prepare_samples(
        records,
        scores,
        resolve_algorithm(rl),
        policy=policy,
        reference=None,
        critic=critic_from_policy(policy),
        temperature=1.0,
        pad_id=tok.eos_token_id,
    )
    assert metrics["critic/values_mean"] == 0.0  # zero-initialized head
    for s in samples:
        assert len(s.advantages) == len(s.record["tool_mask"]) == len(s.returns)
        assert all(a == 0.0 for a, m in zip(s.advantages.tolist(), s.record["tool_mask"]) if not m)
    # with V = 0, gamma = 1: the return at every policy token is the outcome (no KL)
    s = samples[0]
    outcome = next(sc["reward"] for sc in scores if sc["trajectory_id"] == s.record["trajectory_id"])
    assert [rt for rt, m in zip(s.returns.tolist(), s.record["tool_mask"]) if m][-1] == pytest.approx(outcome)


# ----------------------------------------------------------------------------- a real round each
@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_every_algorithm_runs_a_round(name, tokenizer_and_tasks, micro_cfg, sandbox):
    tok, tasks = tokenizer_and_tasks
    policy = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=2)
    before = [p.detach().clone() for p in policy.parameters()]
    rl = micro_cfg.rl.model_copy(
        update={"algorithm": name, "steps_per_round": 2, "prompts_per_step": 3, "group_size": 4}
    )
    algo = resolve_algorithm(rl)
    reference = (
        build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=2).requires_grad_(False)
        if algo.needs_reference
        else None
    )
    # a shaped reward so that groups have spread even for an untrained model
    result = train_round(
        policy,
        reference,
        tok,
        tasks,
        toolbox(CodeInterpreter(sandbox)),
        rl=rl,
        rollout=micro_cfg.rollout,
        cascade=Cascade(RewardConfig(), sandbox),
        round_index=1,
        policy_version="t",
        seed=0,
    )
    last = result.history[-1]
    assert [h["step"] for h in result.history] == [1, 2]
    assert all(math.isfinite(v) for h in result.history for v in h.values())
    if any(h["rollout/trained_trajectories"] for h in result.history):
        assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters())), "the policy never moved"
    assert ("critic/value_loss" in last) == (algo.critic and last["rollout/trained_trajectories"] > 0)
    assert ("actor/kl_ref" in last) == algo.needs_reference
    assert ("loss/kl" in last) == (
        algo.needs_reference and algo.kl_placement == "loss" and last["rollout/trained_trajectories"] > 0
    )
    if algo.dynamic_sampling:
        assert last["rollout/sampling_passes"] >= 1


def test_ppo_round_on_the_deepspeed_engine_matches_torch(tokenizer_and_tasks, micro_cfg, sandbox):
    """Policy and critic on DeepSpeed ZeRO-2 (one process, gloo): same rollouts, same losses and
    weights within the engines' fp32 tolerance (tests/training/test_engines.py)."""
    from configs.schema import EngineConfig

    tok, tasks = tokenizer_and_tasks
    rl = micro_cfg.rl.model_copy(
        update={
            "algorithm": "ppo",
            "steps_per_round": 2,
            "prompts_per_step": 3,
            "group_size": 4,
            "kl_coef": 0.0,
            "drop_zero_variance_groups": False,
        }
    )
    finals = {}
    for label, engine in [
        ("torch", EngineConfig()),
        ("zero2", EngineConfig(kind="deepspeed", zero_stage=2, micro_batch_size=2)),
    ]:
        policy = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=2)
        result = train_round(
            policy,
            None,
            tok,
            tasks,
            toolbox(CodeInterpreter(sandbox)),
            rl=rl,
            rollout=micro_cfg.rollout,
            cascade=Cascade(RewardConfig(), sandbox),
            round_index=1,
            policy_version="t",
            seed=0,
            engine_cfg=engine,
        )
        finals[label] = (torch.cat([p.detach().flatten() for p in policy.parameters()]), result)
    (a, ra), (b, rb) = finals["torch"], finals["zero2"]
    assert [r["trajectory_id"] for r in ra.rollouts] == [r["trajectory_id"] for r in rb.rollouts]
    assert ra.rollouts[0]["completion_ids"] == rb.rollouts[0]["completion_ids"]  # step 1 samples from identical weights
    trained = [(x, y) for x, y in zip(ra.history, rb.history) if "critic/value_loss" in x]
    assert trained, "no step trained"
    assert trained[0][0]["critic/value_loss"] == pytest.approx(trained[0][1]["critic/value_loss"], rel=1e-4)
    assert (a - b).abs().max() < 1e-3


def test_echo_trap_signals_count_only_unsolved_groups():
    from training.rl.loop import unsolved_group_metrics

    records = [
        {"group_id": g, "completion_ids": ids}
        for g, ids in [
            ("solved", [1]),
            ("solved", [1]),
            ("echo", [2]),
            ("echo", [2]),
            ("mixed", [3]),
            ("mixed", [4]),
            ("stuck", [5]),
            ("stuck", [6]),
        ]
    ]
    outcomes = [1, 1, 0, 0, 1, 0, 0, 0]
    scores = [{"outcome": o, "reward": float(o)} for o in outcomes]
    m = unsolved_group_metrics(records, scores)
    # failed trajectories: echo (2 identical), mixed (1), stuck (2 different) -> 2 echoed out of 5; solved repeats do not count
    assert m["rollout/repeat_rate_failed"] == pytest.approx(2 / 5)
    assert m["rollout/unsolved_groups"] == pytest.approx(3 / 4)
    assert m["rollout/stuck_frac"] == pytest.approx(2 / 4)  # echo and stuck failed alike
    assert m["reward/group_std_unsolved"] == pytest.approx(statistics.stdev([1.0, 0.0]) / 3)
    solved_only = unsolved_group_metrics(records[:2], scores[:2])
    assert "rollout/repeat_rate_failed" not in solved_only and "reward/group_std_unsolved" not in solved_only

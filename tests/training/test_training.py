import pytest
import torch

from configs.schema import EngineConfig, RewardConfig, TeacherConfig
from environments.arithmetic import generate_tasks
from environments.tools import CodeInterpreter, toolbox
from training.agent.engines import HFEngine
from training.agent.loop import run_episodes
from training.engines import build_engine
from training.model import build_model
from training.rl.algorithms import resolve_algorithm
from training.rl.batch import Sample
from training.rl.loop import informative_groups, policy_loss_fn, run_update, train_round
from training.rl.math import get_advantage_estimator
from training.rl.scoring import episode_record
from training.sequences import collate, completion_logits, token_logprobs
from training.sft import Example, sft_loss, train_sft, warmup_cosine
from training.trajectories import build_sft_trajectories
from verifiers.cascade import Cascade


@pytest.fixture(scope="module")
def sft_rows(tokenizer_and_tasks, sandbox):
    tok, tasks = tokenizer_and_tasks
    teacher = TeacherConfig(num_trajectories=120, arithmetic={"p_direct": 0.5, "hard_levels": (3, 4)})
    return build_sft_trajectories(tasks, tok, toolbox(CodeInterpreter(sandbox)), teacher=teacher, seed=0)


def test_teacher_trajectories_use_the_real_tool(sft_rows, tokenizer_and_tasks):
    tok, tasks = tokenizer_and_tasks
    by_id = {t["task_id"]: t for t in tasks}
    tool_rows = [r for r in sft_rows if r["strategy"] == "tool"]
    assert tool_rows and any(r["strategy"] == "direct" for r in sft_rows)
    for r in tool_rows:
        assert f"<interpreter>{by_id[r['task_id']]['answer']}\n</interpreter>" in r["completion"]
        assert 0 in r["tool_mask"] and r["correct"]
    wrong = [r for r in sft_rows if not r["correct"]]
    assert wrong and all(r["strategy"] == "direct" and r["level"] in (3, 4) for r in wrong)


def test_sft_loss_counts_policy_tokens_only(sft_rows, tokenizer_and_tasks, micro_cfg):
    """Hand-check: the loss equals the mean NLL over tool_mask == 1 positions, computed row by row."""
    tok, _ = tokenizer_and_tasks
    model = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=0)
    rows = [r for r in sft_rows if r["strategy"] == "tool"][:3]
    examples = [Example(r["prompt_ids"], r["completion_ids"], r["tool_mask"]) for r in rows]
    loss, n_tokens = sft_loss(model, examples, tok.eos_token_id)
    total, count = 0.0, 0
    for e in examples:
        ids = torch.tensor([e.prompt_ids + e.completion_ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        for j, (token, m) in enumerate(zip(e.completion_ids, e.tool_mask)):
            if m:
                total -= float(logp[len(e.prompt_ids) + j - 1, token])
                count += 1
    assert n_tokens == count
    assert float(loss) == pytest.approx(total / count, rel=1e-4)


def test_sft_learns(sft_rows, tokenizer_and_tasks, micro_cfg):
    tok, _ = tokenizer_and_tasks
    model = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    examples = [Example(r["prompt_ids"], r["completion_ids"], r["tool_mask"]) for r in sft_rows]
    cfg = micro_cfg.sft.model_copy(update={"steps": 60, "log_every": 10, "learning_rate": 1e-2, "warmup_steps": 5})
    history = train_sft(model, examples, cfg, pad_id=tok.eos_token_id, seed=0)
    assert history[-1]["loss/sft"] < 0.6 * history[0]["loss/sft"]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_warmup_cosine_schedule():
    assert warmup_cosine(0, 10, 100) == pytest.approx(0.1)
    assert warmup_cosine(9, 10, 100) == pytest.approx(1.0)
    assert warmup_cosine(100, 10, 100) == pytest.approx(0.1)


def test_zero_variance_groups_are_dropped():
    rewards, groups = [1.0, 0.0, 0.5, 0.5, 1.0, 1.0], ["a", "a", "b", "b", "c", "c"]
    adv = get_advantage_estimator("grpo")(torch.tensor(rewards), torch.tensor([0, 0, 1, 1, 2, 2]))
    keep = informative_groups(rewards, groups)
    assert keep.tolist() == [True, True, False, False, False, False]
    assert adv[0] > 0 > adv[1] and adv[2:].abs().max() == 0


def test_policy_update_moves_toward_positive_advantage(tokenizer_and_tasks, micro_cfg, sandbox):
    """After one update, the log-prob of the trajectory with positive advantage rises and the
    negative one falls (the sign of the policy gradient, end to end through the real model)."""
    tok, tasks = tokenizer_and_tasks
    policy = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=1)
    episodes = run_episodes(
        HFEngine(policy),
        tok,
        tasks[:1],
        group_size=2,
        tools=toolbox(CodeInterpreter(sandbox)),
        cfg=micro_cfg.rollout,
        generator=torch.Generator().manual_seed(0),
    )
    records = [episode_record(e, round_index=1, step=1, policy_version="t", tokenizer=tok) for e in episodes]

    def seq_logprob():
        batch = collate(
            [r["prompt_ids"] for r in records],
            [r["completion_ids"] for r in records],
            [r["tool_mask"] for r in records],
            tok.eos_token_id,
        )
        with torch.no_grad():
            return (token_logprobs(completion_logits(policy, batch), batch.completion_ids) * batch.loss_mask).sum(-1)

    before = seq_logprob()
    rl = micro_cfg.rl.model_copy(update={"kl_coef": 0.0})
    # kl_coef = 0: no reference model at all (None), as rl_round does
    engine = build_engine(policy, EngineConfig(), lr=1e-2, grad_clip=1.0)
    samples = [Sample(r, [a] * len(r["completion_ids"]), r["logprobs"]) for r, a in zip(records, (1.0, -1.0))]
    metrics = run_update(
        engine,
        samples,
        policy_loss_fn(engine, resolve_algorithm(rl), temperature=1.0, pad_id=tok.eos_token_id, loss_norm_tokens=160),
        minibatches=1,
        micro_batch_size=None,
        generator=torch.Generator().manual_seed(0),
        prefix="actor",
    )
    after = seq_logprob()
    assert after[0] > before[0] and after[1] < before[1]
    assert {"loss/policy", "actor/entropy", "actor/grad_norm", "actor/clip_frac"} <= set(metrics)


@pytest.mark.parametrize("agg_mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_train_round_logs_every_step(tokenizer_and_tasks, micro_cfg, sandbox, agg_mode):
    tok, tasks = tokenizer_and_tasks
    policy = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=2)
    reference = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=2).requires_grad_(False)
    rl = micro_cfg.rl.model_copy(update={"loss_agg_mode": agg_mode})
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
    n = micro_cfg.rl.steps_per_round * micro_cfg.rl.prompts_per_step * micro_cfg.rl.group_size
    assert len(result.rollouts) == len(result.rewards) == n
    assert [h["step"] for h in result.history] == list(range(1, micro_cfg.rl.steps_per_round + 1))
    for key in (
        "reward/total/mean",
        "reward/total/std",
        "reward/outcome/pass_rate",
        "rollout/tool_call_rate",
        "rollout/completion_len",
        "reward/format/contribution",
        "verifier/fast/calls",
        "verifier/verify/latency_ms",
    ):
        assert key in result.history[0]


def test_generated_tasks_are_distinct_and_disjoint():
    bench = generate_tasks(200, seed=1, split="benchmark")
    train = generate_tasks(500, seed=2, split="train", exclude_ids=frozenset(t["task_id"] for t in bench))
    assert len({t["task_id"] for t in train}) == 500
    assert not {t["task_id"] for t in train} & {t["task_id"] for t in bench}
    assert {t["level"] for t in train} == {1, 2, 3, 4}


def test_repeat_rate_counts_trajectories_identical_within_their_group():
    from training.rl.loop import repeat_rate

    rows = [
        {"group_id": "a", "completion_ids": [1, 2]},
        {"group_id": "a", "completion_ids": [1, 2]},
        {"group_id": "a", "completion_ids": [3]},
        {"group_id": "b", "completion_ids": [3]},
    ]
    assert repeat_rate(rows) == 0.5 and repeat_rate([]) == 0.0


def test_sft_through_deepspeed_matches_torch_and_micro_batching(sft_rows, tokenizer_and_tasks, micro_cfg):
    """The SFT loop on the DeepSpeed engine (ZeRO-2 and 3, one process, gloo) and micro-batched on
    the torch engine ends where the plain torch loop ends (same global batch per step)."""
    tok, _ = tokenizer_and_tasks
    examples = [Example(r["prompt_ids"], r["completion_ids"], r["tool_mask"]) for r in sft_rows]
    cfg = micro_cfg.sft.model_copy(update={"steps": 4, "log_every": 1, "warmup_steps": 1})
    finals = {}
    for label, engine in [
        ("torch", EngineConfig()),
        ("torch-micro4", EngineConfig(micro_batch_size=4)),
        ("zero2", EngineConfig(kind="deepspeed", zero_stage=2)),
        ("zero3", EngineConfig(kind="deepspeed", zero_stage=3)),
    ]:
        model = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=0)
        history = train_sft(model, examples, cfg, pad_id=tok.eos_token_id, seed=0, engine_cfg=engine)
        finals[label] = (torch.cat([p.detach().flatten() for p in model.parameters()]), history)
    reference, history = finals["torch"]
    for label in ("torch-micro4", "zero2", "zero3"):  # ZeRO-3 partitioned the weights; train_sft gives them back whole
        params, other = finals[label]
        # fp32 + Adam: see tests/training/test_engines.py for the tolerance
        assert (params - reference).abs().max() < 1e-4, label
        assert [h["loss/sft"] for h in other] == pytest.approx([h["loss/sft"] for h in history], rel=1e-4)

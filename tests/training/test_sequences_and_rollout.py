import json

import pytest
import torch

from configs.schema import RewardConfig
from environments.arithmetic import answer_turn, code_turn
from environments.tools import CodeInterpreter, toolbox
from training.agent.engines import HFEngine
from training.agent.loop import run_episodes
from training.model import build_model
from training.rl.scoring import episode_record, score_records
from training.sequences import (
    collate,
    completion_logits,
    encode,
    encode_observation,
    encode_segments,
    policy_spans,
    token_logprobs,
)
from verifiers.cascade import Cascade
from verifiers.protocol import OBSERVATION_TAGS


def test_encode_segments_masks_tool_output(tokenizer_and_tasks):
    tok, _ = tokenizer_and_tasks
    ids, mask = encode_segments(
        tok,
        [("policy", code_turn("print(2)")), ("tool", "<interpreter>2\n</interpreter>"), ("policy", answer_turn("2"))],
    )
    policy_a, tool, policy_b = (
        encode(tok, code_turn("print(2)")),
        encode_observation(tok, "2\n"),
        encode(tok, answer_turn("2")),
    )
    assert ids == policy_a + tool + policy_b
    assert mask == [1] * len(policy_a) + [0] * len(tool) + [1] * len(policy_b)
    with pytest.raises(ValueError, match="role"):
        encode_segments(tok, [("user", "x")])


def test_policy_spans_split_on_tool_output():
    assert policy_spans([1, 2, 3, 4, 5, 6], [1, 1, 0, 0, 1, 0]) == [[1, 2], [5]]
    assert policy_spans([1, 2], [0, 0]) == []


def test_collate_aligns_completions_hand_computed():
    batch = collate([[5, 6], [7]], [[1, 2, 3], [4]], [[1, 0, 1], [1]], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 1, 2, 3], [0, 7, 4, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 0, 1, 1, 1]]  # padding positions are never attended
    assert batch.completion_ids.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert batch.loss_mask.tolist() == [[1, 0, 1], [1, 0, 0]]
    with pytest.raises(ValueError, match="row 0: tool_mask has 1 entries for 2"):
        collate([[1]], [[1, 2]], [[1]], pad_id=0)


def test_encode_through_the_rust_backend_gives_the_tokenizers_own_ids(tokenizer_and_tasks):
    """`encode` skips transformers' wrapper for speed; it must not change a single id."""
    tok, tasks = tokenizer_and_tasks
    texts = [t["prompt"] for t in tasks[:50]] + [
        "<code>print(1+2)</code>",
        "<interpreter>3\n</interpreter>",
        "  leading and trailing  ",
        "tabs\tand\nnewlines\r\n",
        "unicode: café ñ 数学 🚀",
        "<answer>42</answer><|endoftext|>",
        "",
        "x" * 3000,
    ]
    for text in texts:
        assert encode(tok, text) == tok.encode(text, add_special_tokens=False), text[:80]


@pytest.fixture(scope="module")
def random_policy(tokenizer_and_tasks, micro_cfg):
    tok, _ = tokenizer_and_tasks
    return build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=3).eval()


def test_multi_turn_rollout_is_token_exact(tokenizer_and_tasks, micro_cfg, sandbox):
    """(a) completion ids = sampled ids + tokenized observations in order; (b) tool_mask is 1
    exactly on sampled ids; (c) the trainer's recomputed logprobs match the behaviour logprobs."""
    tok, tasks = tokenizer_and_tasks
    random_policy = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=3).eval()
    # A random model rarely closes a tool tag by itself; bias it towards the protocol's tags so
    # the test sees multi-turn episodes with real tool calls.
    bias = torch.zeros(len(tok))
    for tag in ("<code>", "</code>"):
        bias[tok.convert_tokens_to_ids(tag)] = 4.0
    random_policy.lm_head.bias = torch.nn.Parameter(bias)
    cfg = micro_cfg.rollout.model_copy(update={"max_new_tokens_per_turn": 12, "max_turns": 3})
    episodes = run_episodes(
        HFEngine(random_policy),
        tok,
        tasks[:6],
        group_size=4,
        tools=toolbox(CodeInterpreter(sandbox)),
        cfg=cfg,
        generator=torch.Generator().manual_seed(0),
    )
    assert len(episodes) == 24
    assert sum(len(e.tool_calls) for e in episodes) > 0, "expected some tool calls"
    for e in episodes:
        assert len(e.completion_ids) == len(e.tool_mask) == len(e.logprobs)
        assert e.stop_reason in {"answer", "eos", "max_turns", "max_tokens"}
        observations = []
        for c in e.tool_calls:  # each observation in its tool's tags; a tool the family lacks answers "unknown tool"
            o, close = (
                encode_observation(tok, c["result"], c["name"]),
                tok.convert_tokens_to_ids(OBSERVATION_TAGS[c["name"]][1]),
            )
            observations.append(
                o if len(o) <= cfg.max_observation_tokens else o[: cfg.max_observation_tokens - 1] + [close]
            )
            assert (c["error"] == "unknown_tool") == (c["name"] != "code")
        tool_ids = [i for i, m in zip(e.completion_ids, e.tool_mask) if m == 0]
        assert tool_ids == [t for obs in observations for t in obs]
        assert all(lp == 0.0 for lp, m in zip(e.logprobs, e.tool_mask) if m == 0)
        assert all(lp < 0.0 for lp, m in zip(e.logprobs, e.tool_mask) if m == 1)
        assert len(e.prompt_ids) + len(e.completion_ids) <= cfg.max_total_tokens + cfg.max_observation_tokens
    batch = collate(
        [e.prompt_ids for e in episodes],
        [e.completion_ids for e in episodes],
        [e.tool_mask for e in episodes],
        tok.eos_token_id,
    )
    with torch.no_grad():
        recomputed = token_logprobs(completion_logits(random_policy, batch), batch.completion_ids)
    behaviour = torch.zeros_like(recomputed)
    for i, e in enumerate(episodes):
        behaviour[i, : len(e.logprobs)] = torch.tensor(e.logprobs)
    diff = ((recomputed - behaviour).abs() * batch.loss_mask).max()
    assert float(diff) < 1e-4


def test_records_and_rewards_recompute_from_storage(random_policy, tokenizer_and_tasks, micro_cfg, sandbox):
    tok, tasks = tokenizer_and_tasks
    episodes = run_episodes(
        HFEngine(random_policy),
        tok,
        tasks[:3],
        group_size=2,
        tools=toolbox(CodeInterpreter(sandbox)),
        cfg=micro_cfg.rollout,
        generator=torch.Generator().manual_seed(1),
    )
    records = [episode_record(e, round_index=1, step=1, policy_version="test", tokenizer=tok) for e in episodes]
    by_id = {t["task_id"]: t for t in tasks}
    first = score_records(records, by_id, tok, Cascade(RewardConfig()))
    round_tripped = [json.loads(json.dumps(r)) for r in records]  # ids survive storage unchanged
    assert [r["completion_ids"] for r in round_tripped] == [e.completion_ids for e in episodes]
    again = score_records(round_tripped, by_id, tok, Cascade(RewardConfig()))
    assert first == again


def test_answer_inside_observation_is_not_the_policys(tokenizer_and_tasks):
    """A tool output that contains <answer>…</answer> must not count as the policy's answer."""
    tok, tasks = tokenizer_and_tasks
    task = tasks[0]
    ids, mask = encode_segments(
        tok,
        [("policy", code_turn("print(1)")), ("tool", f"<interpreter><answer>{task['answer']}</answer></interpreter>")],
    )
    record = {
        "trajectory_id": "t",
        "task_id": task["task_id"],
        "group_id": "g",
        "family": task["family"],
        "level": 1,
        "round": 1,
        "step": 1,
        "completion_ids": ids,
        "tool_mask": mask,
        "num_tool_calls": 1,
    }
    assert score_records([record], {task["task_id"]: task}, tok, Cascade(RewardConfig()))[0]["outcome"] == 0.0

"""Hindsight relabeling (issue 29, item 4): a failed trajectory whose own tool output showed the
answer becomes a corrected example, trained by an auxiliary NLL in the RL update."""

import json

import pytest
import torch

from environments.arithmetic import answer_turn
from training.rl.hindsight import observation_spans, relabel, relabel_all, shows_answer
from training.sequences import encode_observation, encode_segments
from training.trajectories import call_turn

pytestmark = pytest.mark.methods

TASK = {"task_id": "a1", "family": "arithmetic", "level": 2, "prompt": "compute 17*23\n", "answer": "391"}


def episode(tok, turns: list[tuple[str, str, str | None]], final: str) -> dict:
    """A stored trajectory: (code, printed output, error) per call, then the policy's last turn."""
    ids, mask, calls = [], [], []
    for code, output, error in turns:
        call_ids, call_mask = encode_segments(tok, [("policy", call_turn("code", code))])
        obs = encode_observation(tok, output, "code")
        ids, mask = ids + call_ids + obs, mask + call_mask + [0] * len(obs)
        calls.append({"name": "code", "args": code, "result": output, "error": error, "truncated": False})
    last_ids, last_mask = encode_segments(tok, [("policy", final)])
    return {
        "trajectory_id": "r1-s1-g0-0",
        "task_id": TASK["task_id"],
        "family": TASK["family"],
        "prompt_ids": [5, 6, 7],
        "completion_ids": ids + last_ids,
        "tool_mask": mask + last_mask,
        "tool_calls": json.dumps(calls),
    }


def test_a_failure_whose_output_was_the_answer_ends_with_the_gold_answer_after_that_output(warm_policy):
    tok = warm_policy.tokenizer
    record = episode(tok, [("print(17*23)", "391\n", None)], "<answer>319</answer>")
    fixed = relabel(record, 0.0, TASK, tok)
    [(start, end)] = observation_spans(record["tool_mask"])
    answer_ids, answer_mask = encode_segments(tok, [("policy", answer_turn("391"))])
    assert fixed["completion_ids"] == record["completion_ids"][:end] + answer_ids
    assert fixed["tool_mask"] == record["tool_mask"][:end] + answer_mask  # the call trained, the output not
    assert fixed["prompt_ids"] == record["prompt_ids"] and fixed["trajectory_id"].endswith("-hindsight")
    assert tok.decode(fixed["completion_ids"]).endswith("<answer>391</answer>")


def test_a_failed_call_before_the_fix_stays_in_the_example_but_leaves_the_loss(warm_policy):
    tok = warm_policy.tokenizer
    record = episode(
        tok,
        [("print(17*23", "SyntaxError: '(' was never closed\n", "nonzero_exit"), ("print(17*23)", "391\n", None)],
        "<code>print(1)</code>",  # it went on instead of answering, and ran out of turns
    )
    fixed = relabel(record, 0.0, TASK, tok)
    (first_start, first_end), (second_start, second_end) = observation_spans(record["tool_mask"])
    mask = fixed["tool_mask"]
    assert fixed["completion_ids"][:second_end] == record["completion_ids"][:second_end]
    assert sum(mask[:first_start]) == 0  # the broken call: seen, not imitated
    assert mask[first_end:second_start] == [1] * (second_start - first_end)  # the retry: trained
    assert sum(mask[second_start:second_end]) == 0


def test_what_does_not_count_as_showing_the_answer(warm_policy):
    tok = warm_policy.tokenizer
    assert shows_answer("12\n391\n", "391", "code") and shows_answer("391.0\n", "391", "code")
    assert not shows_answer("391\n12\n", "391", "code")  # printing every candidate shows only the last
    assert not shows_answer("1391\n", "391", "code") and not shows_answer("5\n", "-5", "code")
    assert not shows_answer("[0, 1, 2, 391]\n", "391", "code")
    assert shows_answer("Ada Lovelace was born in London.", "london", "search")
    assert not shows_answer("Ada Lovelace was born in Londonderry.", "london", "search")
    failed = episode(tok, [("print(17*23)", "391\n", "nonzero_exit")], "<answer>1</answer>")
    assert relabel(failed, 0.0, TASK, tok) is None  # an error's output is not a result
    truncated = episode(tok, [("print(17*23)", "391\n", None)], "<answer>1</answer>")
    calls = json.loads(truncated["tool_calls"])
    calls[0]["truncated"] = True  # the policy never saw the whole output
    assert relabel({**truncated, "tool_calls": json.dumps(calls)}, 0.0, TASK, tok) is None
    solved = episode(tok, [("print(17*23)", "391\n", None)], "<answer>391</answer>")
    assert relabel(solved, 1.0, TASK, tok) is None
    code_task = {**TASK, "family": "code", "answer": "391", "metadata": json.dumps({"tests": [{"code": "assert 1"}]})}
    assert relabel(solved, 0.0, code_task, tok) is None  # graded by tests: nothing an output can show
    assert relabel_all([solved, failed], [{"outcome": 0.0}, {"outcome": 0.0}], {"a1": TASK}, tok) != []


def test_the_auxiliary_loss_joins_the_rl_gradient_in_one_optimizer_step(warm_policy):
    """accumulate_step with auxiliary rows makes the update one step on main + aux would make,
    each loss normalized by its own token count, split into micro-batches or not."""
    import copy

    from configs.schema import EngineConfig
    from training.engines import Auxiliary, accumulate_step, build_engine
    from training.rl.batch import Sample
    from training.rl.loop import _counts, _sample_shape, hindsight_loss_fn

    tok, pad = warm_policy.tokenizer, warm_policy.tokenizer.eos_token_id
    examples = [
        relabel(
            episode(tok, [(f"print({a}+{b})", f"{a + b}\n", None)], "<answer>0</answer>"),
            0.0,
            {**TASK, "answer": str(a + b)},
            tok,
        )
        for a, b in [(2, 2), (17, 23), (100, 5), (7, 9), (31, 8)]
    ]
    rows = [Sample(record=e, advantages=[], old_logprobs=None) for e in examples]
    main_rows, aux_rows = rows[:2], rows[2:]

    def engine_of():
        return build_engine(copy.deepcopy(warm_policy.model), EngineConfig(), lr=0.01, grad_clip=1.0)

    # one step through accumulate_step's auxiliary rows, one micro-batch per row
    split = engine_of()
    metrics = accumulate_step(
        split,
        main_rows,
        hindsight_loss_fn(split, 1.0, pad),
        _counts,
        micro_batch_size=1,
        shape=_sample_shape,
        auxiliary=Auxiliary(aux_rows, hindsight_loss_fn(split, 0.5, pad), _counts, ("loss/hindsight",)),
    )
    # the same step written as one loss over both sets
    whole = engine_of()
    main_fn, aux_fn = hindsight_loss_fn(whole, 1.0, pad), hindsight_loss_fn(whole, 0.5, pad)

    def both(_chunk, _counts_unused):
        main_loss, _ = main_fn(main_rows, _counts(main_rows))
        aux_loss, aux_metrics = aux_fn(aux_rows, _counts(aux_rows))
        return main_loss + aux_loss, {"aux": aux_metrics["loss/hindsight"], "main": float(main_loss.detach())}

    reference = accumulate_step(whole, [0], both, lambda chunk: torch.ones(1), micro_batch_size=None)
    # Adam divides by sqrt(v): a weight whose gradient is near zero moves by up to lr (0.01) on the
    # rounding of its gradient alone, and micro-batches sum in another order than the one batch
    # (seen: 1 of 4,096 weights 2e-5 apart). An auxiliary loss left out of the step moves weights by
    # ~lr, far past this bound.
    for a, b in zip(split.module.parameters(), whole.module.parameters()):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    assert metrics["loss/hindsight"] == pytest.approx(reference["aux"], rel=1e-5)  # the unweighted NLL
    assert metrics["loss"] == pytest.approx(reference["main"] + 0.5 * reference["aux"], rel=1e-5)
    assert any((a - b).abs().max() > 0 for a, b in zip(split.module.parameters(), warm_policy.model.parameters()))


def test_a_round_with_hindsight_trains_its_relabels_and_relabels_its_own_failures(warm_policy, micro_cfg, sandbox):
    """The same round (seed, prompts) with and without `rl.hindsight`: with it, every step's update
    carries the newest corrected examples, and their NLL ends lower than the plain round leaves it."""
    import copy

    from configs.schema import RewardConfig
    from training.rl.loop import train_round
    from training.sft import Example, sft_loss
    from verifiers.cascade import Cascade

    tok = warm_policy.tokenizer
    tasks = [t for t in warm_policy.tasks if t["family"] == "arithmetic"][:16]
    # the previous round's relabels: each task's right product printed, then a wrong answer
    examples = [
        relabel(
            {**episode(tok, [("print(0)", f"{t['answer']}\n", None)], "<answer>0</answer>"), "task_id": t["task_id"]},
            0.0,
            t,
            tok,
        )
        for t in tasks[:6]
    ]

    def nll(model) -> float:
        rows = [Example(e["prompt_ids"], e["completion_ids"], e["tool_mask"]) for e in examples]
        with torch.no_grad():
            return float(sft_loss(model, rows, tok.eos_token_id)[0])

    def round_with(enabled: bool):
        rl = micro_cfg.rl.model_copy(
            update={
                "steps_per_round": 3,
                "prompts_per_step": 4,
                "group_size": 4,
                "hindsight": micro_cfg.rl.hindsight.model_copy(update={"enabled": enabled, "coef": 1.0, "per_step": 6}),
            }
        )
        return train_round(
            copy.deepcopy(warm_policy.model),
            None,
            tok,
            tasks,
            warm_policy.tools,
            rl=rl.model_copy(update={"kl_coef": 0.0}),
            rollout=micro_cfg.rollout,
            cascade=Cascade(RewardConfig(), sandbox),
            round_index=2,
            policy_version="t",
            seed=0,
            hindsight_examples=examples if enabled else None,
        )

    before = nll(warm_policy.model)
    with_relabels, plain = round_with(True), round_with(False)
    trained = [h for h in with_relabels.history if h["rollout/trained_trajectories"] > 0]
    assert trained and all(h["hindsight/trained"] == 6 and h["loss/hindsight"] > 0 for h in trained)
    assert all("hindsight/relabeled" in h for h in with_relabels.history)
    assert not any(k.startswith("hindsight/") or k == "loss/hindsight" for h in plain.history for k in h)
    assert nll(with_relabels.policy) < min(before, nll(plain.policy)) - 0.05


def test_a_round_starts_from_the_previous_rounds_stored_failures(warm_policy, tmp_path):
    """assets/rl.py reads the previous round's stored rollout_batches and verified_rewards (parquet,
    as the round wrote them) and relabels them as the loop would."""
    import pandas as pd

    from assets.artifacts import write_bytes
    from assets.resources import ArtifactStore
    from assets.rl import hindsight_examples

    tok = warm_policy.tokenizer
    showed = episode(tok, [("print(17*23)", "391\n", None)], "<answer>319</answer>")
    missed = {**episode(tok, [("print(17+23)", "40\n", None)], "<answer>40</answer>"), "trajectory_id": "r1-s1-g0-1"}
    store = ArtifactStore(root=str(tmp_path / "store"), cache_dir=str(tmp_path / "cache"))
    frames = {
        "rollout_batches": pd.DataFrame([showed, missed]),
        "verified_rewards": pd.DataFrame(
            [
                {"trajectory_id": showed["trajectory_id"], "outcome": 0.0},
                {"trajectory_id": "r1-s1-g0-1", "outcome": 0.0},
            ]
        ),
    }
    for asset, frame in frames.items():
        write_bytes(store.uri("assets", asset, "1.parquet"), frame.to_parquet(index=False), f"{asset}[1]")
    [example] = hindsight_examples(store, 1, [TASK], tok)
    expected = relabel(showed, 0.0, TASK, tok)
    assert [int(i) for i in example["completion_ids"]] == expected["completion_ids"]
    assert [int(m) for m in example["tool_mask"]] == expected["tool_mask"]
    assert hindsight_examples(store, None, [TASK], tok) == [] and hindsight_examples(store, 2, [TASK], tok) == []

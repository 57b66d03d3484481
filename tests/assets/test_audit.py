"""Re-scoring stored rollouts with another verifier configuration finds what the lenient one let through."""

import pandas as pd

from configs.schema import RewardConfig, VerifierSpec
from environments.arithmetic import answer_turn
from training.rl.scoring import disagreements, score_records
from training.sequences import encode_segments
from verifiers.cascade import Cascade


def _record(tok, i: int, answer: str) -> dict:
    ids, mask = encode_segments(tok, [("policy", answer_turn(answer))])
    return {
        "trajectory_id": f"g-{i}",
        "task_id": "t",
        "group_id": "g",
        "family": "arithmetic",
        "level": 1,
        "round": 1,
        "step": 1,
        "completion_ids": ids,
        "tool_mask": mask,
        "num_tool_calls": 0,
    }


def test_audit_reports_what_only_the_lenient_verifier_rewarded(tokenizer_and_tasks):
    tok, _ = tokenizer_and_tasks
    task = {"task_id": "t", "family": "arithmetic", "answer": "1000", "level": 1}
    rows = [_record(tok, i, a) for i, a in enumerate(["1000", "1004", "7", "1000.0"])]
    lenient = RewardConfig(
        verifiers={"arithmetic": VerifierSpec(name="numeric", params={"rel_tol": 0.01, "exact_integers": False})}
    )
    strict = RewardConfig(verifiers={"arithmetic": VerifierSpec(name="numeric", params={"rel_tol": 0.0})})
    trained = score_records(rows, {"t": task}, tok, Cascade(lenient))
    # stored and loaded back as Parquet, as the asset does (None outcomes become NaN there)
    trained = pd.DataFrame(trained).to_dict("records")
    audited = score_records(rows, {"t": task}, tok, Cascade(strict))
    found = disagreements(trained, audited, rows, tok)
    assert [(d["trajectory_id"], d["kind"]) for d in found] == [("g-1", "training_only")]
    assert "1004" in found[0]["completion"] and found[0]["baseline_outcome"] == 1.0 and found[0]["audit_outcome"] == 0.0


def test_audit_reports_scorability_changes(tokenizer_and_tasks):
    tok, _ = tokenizer_and_tasks
    rows = [_record(tok, 0, "5")]
    good, bad = (
        {"task_id": "t", "family": "arithmetic", "answer": "5"},
        {"task_id": "t", "family": "arithmetic", "answer": "five"},
    )
    before = pd.DataFrame(score_records(rows, {"t": bad}, tok, Cascade(RewardConfig()))).to_dict("records")
    after = score_records(rows, {"t": good}, tok, Cascade(RewardConfig()))
    assert [d["kind"] for d in disagreements(before, after, rows, tok)] == ["scorability"]

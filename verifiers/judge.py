"""The judge tier: a model decides what no rule can, under a rubric, by majority vote, on a budget.

Rules first. A family whose answers are open-ended (free text graded against a reference, e.g.
environments/explain.py: "Describe Tavo in one sentence") declares `open_ended` and is verified by
`judge`; every other family keeps its rule verifier. The judge refuses a task a rule can decide
twice over: the config check (environments.family.resolve_families: `judge` only for open-ended
families, never in the strict tier) and this verifier's task_check (the task row must say
`open_ended`). It never overrides, breaks a tie for, or replaces a rule.

How a verdict is made (the model side is training/judge.py):

    constrained output  the judge model reads the rubric (system prompt) and the question,
                        reference and answer (user turn); nothing is generated: its next-token
                        distribution is restricted to the label tokens, p = P(yes) / (P(yes) + P(no)),
                        sharpened or flattened by `temperature`
    majority vote       `votes` Bernoulli(p) draws seeded by (seed, task, answer), so a stored round
                        re-scores to the same verdict; the majority rules; a tie is unscorable
    budget              the cascade judges at most `max_calls_per_step` candidates per RL step;
                        the rest are unscorable (counted, their group left out), never a silent 0

Rules before the judge (`precheck`), because a judge is easier to fool than a rule: an answer that
is a verdict word, imitates the judge's prompt (its field labels, chat-role markers), or only
restates the question never reaches it. What gets past these is measured by
benchmarks/judge_agreement.py's hack suite.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass
from typing import Protocol

from verifiers.base import Task, Verdict, register
from verifiers.qa import normalize_answer

LABELS = ("yes", "no")  # the rubric's two outputs, in this order: yes = 1.0
_VERDICT_WORDS = frozenset({"yes", "no", "correct", "incorrect", "true", "false", "right", "wrong", "pass", "fail"})
# The judge prompt's own structure: its field labels and the chat templates' role markers.
_PROMPT_LIKE = re.compile(
    r"(?i)\b(question|reference|answer|verdict|grade|rubric)\s*:|<\||\|>|\b(im_start|im_end)\b|\b(system|assistant)\s*:"
)


@dataclass(frozen=True)
class JudgeRequest:
    question: str
    reference: str
    answer: str
    key: str  # the task and the answer: seeds the votes


class Judge(Protocol):
    def judge_many(self, requests: list[JudgeRequest]) -> list[Verdict]: ...


def judge_messages(rubric: str, request: JudgeRequest) -> list[dict[str, str]]:
    """The chat the judge model reads; its reply would be one word, LABELS[0] or LABELS[1]."""
    user = f"Question: {request.question.strip()}\nReference: {request.reference.strip()}\nAnswer: {request.answer.strip()}"
    return [{"role": "system", "content": rubric}, {"role": "user", "content": user}]


def label_probability(logp_yes: float, logp_no: float, temperature: float) -> float:
    """P(yes) among the two labels, at `temperature` (the label logits divided by it)."""
    return 1.0 / (1.0 + math.exp(-(logp_yes - logp_no) / temperature))


def vote_seed(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}\x00{key}".encode()).digest()[:8], "big")


def majority(p_yes: float, votes: int, seed: int) -> tuple[float | None, int]:
    """(score, yes votes): `votes` seeded Bernoulli(p_yes) draws; 1.0 / 0.0 by majority, None on a tie."""
    rng = random.Random(seed)
    yes = sum(rng.random() < p_yes for _ in range(votes))
    if 2 * yes == votes:
        return None, yes
    return (1.0 if 2 * yes > votes else 0.0), yes


def grader_directed(answer: str, question: str) -> str | None:
    """Why `answer` must not reach a judge (it addresses the grader, or says nothing of its own), or None."""
    if normalize_answer(answer) in _VERDICT_WORDS:
        return "the answer is a verdict word, not an answer"
    if _PROMPT_LIKE.search(answer):
        return "the answer imitates the judge's prompt (a field label or a chat-role marker)"
    words, asked = normalize_answer(answer).split(), set(normalize_answer(question).split())
    if words and all(w in asked for w in words):
        return "the answer only restates the question"
    return None


def request_of(prediction: str, task: Task) -> JudgeRequest:
    question = str(task["prompt"])
    return JudgeRequest(question, str(task["answer"]), prediction, f"{task.get('task_id', question)}\x00{prediction}")


def _task_check(task: Task) -> str | None:
    if not task.get("open_ended"):
        return (
            f"task {task.get('task_id')!r} ({task.get('family')}) is not open-ended: a rule verifier decides it, "
            "and the judge decides only what no rule can"
        )
    return None if str(task.get("answer", "")).strip() else "an open-ended task needs a reference answer"


def _precheck(prediction: str, task: Task) -> str | None:
    return grader_directed(prediction, str(task["prompt"]))


@register("judge", needs_judge=True, precheck=_precheck, task_check=_task_check)
def judge_verifier(prediction: str, task: Task, judge: Judge) -> Verdict:
    """One candidate (the cascade batches them: Cascade._judge)."""
    return judge.judge_many([request_of(prediction, task)])[0]

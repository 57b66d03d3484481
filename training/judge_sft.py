"""A judge of our own: an instruct model fine-tuned to give the verdicts the rules give.

    .venv/bin/python -m training.judge_sft --profile smol --out DIR [--steps 150] [--tasks 400]

then `--set reward.judge.model=DIR` (or the profile's `reward.judge.model`). SmolLM2-135M-Instruct
as it ships is near chance as a judge (docs/verifiers.md#the-judge-tier); this is how a CPU
profile gets one that is not, and how a GPU user adapts theirs.

Data, from the training split only (the benchmark split, and every answer form of the hack suite,
are never seen; the task ids go into DIR/judge_training.json so benchmarks/judge_agreement.py
evaluates on others):
  * arithmetic and search: the teacher's answers, right and wrong (its guesses and early stops),
    each labelled by the family's rule verifier through the cascade: where rules exist, the judge
    learns their verdicts;
  * explain: the teacher's paraphrases of the entity's document, right or with one relation
    swapped, and sentences that name the entity and state nothing (CONTENT_FREE; labelled by
    construction). Without the last kind the judge learns "no wrong entity means yes" and rewards
    every injection and empty compliment (docs/verifiers.md#the-judge-tier); the hack suite's own
    content-free forms are different sentences, so it still measures generalization.
Each family's examples are balanced by label.

Objective: cross-entropy over the two label tokens at the one position the judge reads (after the
rubric prompt and the generation prompt), i.e. the very distribution training/judge.py draws its
votes from. Only the top `--train-layers` blocks and the final norm train, and the output layer is
applied at that position to the label rows only, so a step is a forward and a short backward.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from configs import load_profile
from configs.schema import FlywheelConfig
from environments import families
from environments.arithmetic import answer_turn
from environments.base import task_view
from environments.explain import describe
from environments.family import get_family, tools_of
from training.judge import ModelJudge
from training.model import save_checkpoint
from verifiers.cascade import Cascade
from verifiers.judge import LABELS, JudgeRequest, request_of
from verifiers.shaping import Candidate

RULE_FAMILIES = ("arithmetic", "search")
# Answers that name the entity and state nothing about it: "no" under the rubric. Not the hack
# suite's forms (benchmarks/judge_agreement.py::explain_attacks), which stay unseen.
CONTENT_FREE = (
    "{name} is mentioned in the corpus.",
    "This is about {name}.",
    "{name} has a document of its own.",
    "The corpus has an entry for {name}.",
)


def rule_examples(cfg: FlywheelConfig, family: str, n_tasks: int, seed: int, kb) -> list[tuple[JudgeRequest, int]]:
    """The teacher's answers to `n_tasks` training tasks, labelled by the family's rule verifier."""
    fam = cfg.data.families.get(family)
    rows = families.generate_tasks(family, n_tasks, seed=seed, split="train", levels=fam.levels if fam else None, kb=kb)
    by_id = {r["task_id"]: task_view(r) for r in rows}
    demos = list(families.demonstrations(family, rows, 3 * len(rows), seed=seed, teacher=cfg.teacher, kb=kb))
    items = [(Candidate([answer_turn(d.answer)], 8, tools_of(family)), by_id[d.task_id]) for d in demos]
    scored = Cascade(cfg.reward).score_many(items)
    return [
        (request_of(d.answer, by_id[d.task_id]), int(s.outcome > 0))
        for d, s in zip(demos, scored)
        if s.outcome is not None
    ]


def explain_examples(n_tasks: int, seed: int, kb) -> list[tuple[JudgeRequest, int]]:
    rows = get_family("explain").generate_tasks(
        n_tasks, seed=seed, split="train", levels=(1,), level_weights=None, exclude_ids=frozenset(), kb=kb
    )
    rng, out = random.Random(seed), []
    for row in rows:
        task, name = task_view(row), json.loads(row["metadata"])["entity"]
        for wrong in (False, True, False):
            out.append((request_of(describe(kb, name, rng, wrong=wrong), task), int(not wrong)))
        out.append((request_of(rng.choice(CONTENT_FREE).format(name=name), task), 0))
    return out


def balanced(examples: list[tuple[JudgeRequest, int]], rng: random.Random) -> list[tuple[JudgeRequest, int]]:
    by_label = {y: [e for e in examples if e[1] == y] for y in (0, 1)}
    n = min(map(len, by_label.values()))
    return [e for y in (0, 1) for e in rng.sample(by_label[y], n)]


def training_set(cfg: FlywheelConfig, n_tasks: int, seed: int) -> dict[str, list[tuple[JudgeRequest, int]]]:
    kb = families.make_kb(cfg.data.knowledge_base, cfg.data.seed)
    rng = random.Random(seed)
    sets = {f: balanced(rule_examples(cfg, f, n_tasks, seed, kb), rng) for f in RULE_FAMILIES}
    sets["explain"] = explain_examples(min(n_tasks, 200), seed, kb)
    return sets


def label_logits(judge: ModelJudge, prompts: list[list[int]]) -> torch.Tensor:
    """(batch, 2): the logsumexp of each label's spellings' logits at the next position."""
    hidden = judge.model.model(**judge.left_padded(prompts))
    last = hidden.last_hidden_state[:, -1]
    weight = judge.model.lm_head.weight
    return torch.stack([torch.logsumexp(last @ weight[judge.label_ids[label]].T, -1) for label in LABELS], -1)


def train(judge: ModelJudge, examples: list[tuple[JudgeRequest, int]], *, steps, batch_size, lr, train_layers, seed):
    model = judge.model
    model.requires_grad_(False)
    trained = [*model.model.layers[-train_layers:], model.model.norm]
    for module in trained:
        module.requires_grad_(True)
    params = [p for m in trained for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    prompts = [judge.prompt_ids(r) for r, _ in examples]
    labels = torch.tensor([0 if y else 1 for _, y in examples])  # index into LABELS: yes = 0
    rng, history, start = random.Random(seed), [], time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:  # linear warmup over the first 10%, then constant
            group["lr"] = lr * min(1.0, step / max(1, steps // 10))
        batch = rng.sample(range(len(examples)), min(batch_size, len(examples)))
        logits = label_logits(judge, [prompts[i] for i in batch])
        loss = torch.nn.functional.cross_entropy(logits, labels[batch])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        accuracy = float((logits.argmax(-1) == labels[batch]).float().mean())
        history.append({"step": step, "loss": loss.item(), "accuracy": accuracy})
        if step % 10 == 0 or step == steps:
            recent = history[-10:]
            print(
                f"[judge-sft] step {step}/{steps}: loss {sum(h['loss'] for h in recent) / len(recent):.3f}, "
                f"batch accuracy {sum(h['accuracy'] for h in recent) / len(recent):.2f}, "
                f"{time.perf_counter() - start:.0f} s",
                flush=True,
            )
    model.eval()
    return history


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="smol")
    parser.add_argument("--out", required=True, help="the judge checkpoint's folder (an HF folder)")
    parser.add_argument(
        "--base", default=None, help="the model to fine-tune (default: the profile's reward.judge.model)"
    )
    parser.add_argument("--tasks", type=int, default=400, help="training tasks per family")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--train-layers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out).expanduser()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"--out {out}: exists and is not empty; a judge checkpoint is written once")
    cfg = load_profile(args.profile)
    judge_cfg = cfg.reward.judge if args.base is None else cfg.reward.judge.model_copy(update={"model": args.base})
    torch.manual_seed(args.seed)
    judge = ModelJudge(judge_cfg)
    sets = training_set(cfg, args.tasks, args.seed)
    examples = [e for s in sets.values() for e in s]
    print(
        "[judge-sft] examples: " + ", ".join(f"{f} {len(s)} ({sum(y for _, y in s)} yes)" for f, s in sets.items()),
        flush=True,
    )
    history = train(
        judge,
        examples,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        train_layers=args.train_layers,
        seed=args.seed,
    )
    save_checkpoint(judge.model, judge.tokenizer, out)
    trained_on = sorted({r.key.split("\x00")[0] for s in sets.values() for r, _ in s})
    (out / "judge_training.json").write_text(
        json.dumps(
            {
                "base": judge_cfg.model,
                "rubric": judge_cfg.rubric,
                "args": vars(args),
                "examples": {f: {"n": len(s), "yes": sum(y for _, y in s)} for f, s in sets.items()},
                "final_loss_last10": sum(h["loss"] for h in history[-10:]) / min(10, len(history)),
                "task_ids": trained_on,
            },
            indent=1,
        )
    )
    print(f"[judge-sft] wrote {out} (judge_training.json lists the {len(trained_on)} training tasks)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Runs one small RL round (or SFT) in its own process, so tests/training/test_resume.py can SIGKILL it and
tests/training/test_scaleout.py can run it on several ranks and compare with one:

    python tests/workers/rl_round_worker.py --algorithm grpo --state-dir D --out result.pt
    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/workers/rl_round_worker.py \
        --engine deepspeed --zero-stage 3 --steps 2 --out result.pt        (rank 0 writes --out)
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from configs import load_profile  # noqa: E402
from configs.schema import EngineConfig, RewardConfig  # noqa: E402
from environments.arithmetic import generate_tasks  # noqa: E402
from environments.tools import CodeInterpreter, toolbox  # noqa: E402
from training.data_parallel import DataParallel, leave_together  # noqa: E402
from training.model import build_model, load_policy, load_tokenizer  # noqa: E402
from training.rl.algorithms import resolve_algorithm  # noqa: E402
from training.rl.loop import train_round  # noqa: E402
from training.sft import Example, train_sft  # noqa: E402
from training.tokenizer import train_tokenizer  # noqa: E402
from training.trajectories import tokenizer_corpus  # noqa: E402
from verifiers.cascade import Cascade  # noqa: E402
from verifiers.sandbox import BubblewrapSandbox, SandboxLimits  # noqa: E402

STEPS, EVERY = 6, 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algorithm", default="grpo")
    parser.add_argument("--loop", choices=["rl", "sft"], default="rl")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--engine", choices=["torch", "deepspeed"], default="torch")
    parser.add_argument("--zero-stage", type=int, default=0)
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument(
        "--init", type=Path, help="start from this checkpoint folder (with its tasks.json) instead of a fresh model"
    )
    parser.add_argument("--state-dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_profile("micro")
    engine = EngineConfig(kind=args.engine, zero_stage=args.zero_stage, micro_batch_size=args.micro_batch_size)
    if args.init:  # e.g. a warm-started policy, whose groups have reward spread to learn from
        tasks = json.loads((args.init / "tasks.json").read_text())
        tok, policy = load_tokenizer(args.init), load_policy(args.init)
    else:
        tasks = generate_tasks(300, seed=7, split="train")
        tok = train_tokenizer(tokenizer_corpus(tasks), 300)
        policy = build_model(cfg.model, len(tok), tok.eos_token_id, seed=2)
    if args.loop == "sft":
        examples = [
            Example(
                tok.encode(t["prompt"]),
                tok.encode(str(t["answer"])) + [tok.eos_token_id],
                [1] * (len(tok.encode(str(t["answer"]))) + 1),
            )
            for t in tasks[:64]
        ]
        history = train_sft(
            policy,
            examples,
            cfg.sft.model_copy(update={"steps": args.steps, "batch_size": 8, "log_every": 1}),
            pad_id=tok.eos_token_id,
            seed=3,
            engine_cfg=engine,
            state_dir=args.state_dir,
        )
        save(args.out, {"params": {k: v.clone() for k, v in policy.state_dict().items()}, "history": history})
        leave_together()
        return
    rl = cfg.rl.model_copy(
        update={
            "algorithm": args.algorithm,
            "steps_per_round": args.steps,
            "checkpoint_every": EVERY,
            "prompts_per_step": 3,
            "group_size": 4,
            "learning_rate": 1e-3,
        }
    )
    reference = (
        build_model(cfg.model, len(tok), tok.eos_token_id, seed=2).requires_grad_(False)
        if resolve_algorithm(rl).needs_reference
        else None
    )
    box = BubblewrapSandbox(SandboxLimits(), pool_size=1)
    try:
        result = train_round(
            policy,
            reference,
            tok,
            tasks,
            toolbox(CodeInterpreter(box)),
            rl=rl,
            rollout=cfg.rollout,
            cascade=Cascade(RewardConfig(), box, concurrency=1),
            round_index=1,
            policy_version="t",
            seed=11,
            state_dir=args.state_dir,
            on_step=lambda step, _: print(f"step {step}", flush=True),
            engine_cfg=engine,
        )
    finally:
        box.close()
    save(
        args.out,
        {
            "params": {k: v.clone() for k, v in result.policy.state_dict().items()},
            "history": result.history,
            "trajectory_ids": [r["trajectory_id"] for r in result.rollouts],
            "completion_ids": [r["completion_ids"] for r in result.rollouts],
            "resumed_from_step": result.resumed_from_step,
        },
    )
    leave_together()


def save(path: Path, payload: dict) -> None:
    """Rank 0 writes (ranks hold the same weights and history)."""
    if DataParallel.current().leader:
        torch.save(payload, path)


if __name__ == "__main__":
    main()

"""Runs one small RL round in its own process, so tests/test_resume.py can SIGKILL it.

    python tests/workers/rl_round_worker.py --algorithm grpo --state-dir D --out result.pt
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from configs import load_profile  # noqa: E402
from configs.schema import RewardConfig  # noqa: E402
from environments.arithmetic import generate_tasks  # noqa: E402
from environments.tools import CodeInterpreter, toolbox  # noqa: E402
from training.algorithms import resolve_algorithm  # noqa: E402
from training.model import build_model  # noqa: E402
from training.rl_loop import train_round  # noqa: E402
from training.tokenizer import train_tokenizer  # noqa: E402
from training.trajectories import tokenizer_corpus  # noqa: E402
from verifiers.cascade import Cascade  # noqa: E402
from verifiers.sandbox import BubblewrapSandbox, SandboxLimits  # noqa: E402

STEPS, EVERY = 6, 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algorithm", default="grpo")
    parser.add_argument("--state-dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_profile("micro")
    tasks = generate_tasks(300, seed=7, split="train")
    tok = train_tokenizer(tokenizer_corpus(tasks), 300)
    rl = cfg.rl.model_copy(update={"algorithm": args.algorithm, "steps_per_round": STEPS, "checkpoint_every": EVERY, "prompts_per_step": 3,
                                   "group_size": 4, "learning_rate": 1e-3})
    policy = build_model(cfg.model, len(tok), tok.eos_token_id, seed=2)
    reference = build_model(cfg.model, len(tok), tok.eos_token_id, seed=2).requires_grad_(False) if resolve_algorithm(rl).needs_reference else None
    box = BubblewrapSandbox(SandboxLimits(), pool_size=1)
    try:
        result = train_round(policy, reference, tok, tasks, toolbox(CodeInterpreter(box)), rl=rl, rollout=cfg.rollout,
                             cascade=Cascade(RewardConfig(), box, concurrency=1), round_index=1, policy_version="t", seed=11,
                             state_dir=args.state_dir, on_step=lambda step, _: print(f"step {step}", flush=True))
    finally:
        box.close()
    torch.save({"params": {k: v.clone() for k, v in policy.state_dict().items()}, "history": result.history,
                "trajectory_ids": [r["trajectory_id"] for r in result.rollouts], "resumed_from_step": result.resumed_from_step}, args.out)


if __name__ == "__main__":
    main()

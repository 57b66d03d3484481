"""Verification overlapping generation, before and after, in one run (issue 26).

    .venv/bin/python benchmarks/verify_overlap.py [--sizes tiny,20m] [--repeats 3] [--home /tmp/rollout-bench]

Per size, the warm-started policy (benchmarks/rollout_engines.py's `warm_model`) rolls out and the
verifier cascade scores two kinds of batch, each the product's own shape:

  rl step    the `tiny` profile's RL step: 32 prompts x 8 samples, the three families
  benchmark  one batch of the held-out benchmark: 512 tasks x 1 sample (`benchmark.batch_size`)

two ways, alternating (and who goes first):

  before  the whole batch is scored after the rollout (`rollout.verify_during_rollout: false`, the
          CPU profiles' setting)
  after   episodes are scored on a background thread as they finish, while the rest still
          generate; the step waits only for what is left (`verify_during_rollout: true`)

The tools and the cascade are the real ones (bubblewrap sandbox, BM25 search); both sides sample
the same episodes (same sampling key) and must get the same scores (checked, reported). Reported
per side: wall of rollout + verification (median, min-max), and the wait for verification after
the rollout. Writes benchmarks/results/verify-overlap.{json,md}.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.warm_bench import commit, families_in_turn, parse_args, warm_policies, write_results  # noqa: E402

SHAPES = {"rl step": (32, 8), "benchmark": (512, 1)}  # prompts x samples


def rollout_and_verify(background: bool, *, model, tok, prompts, group, tools, cfg, cascade):
    """(rewards, wall of rollout + verification, wait for verification after the rollout)."""
    from training.agent.engines import HFEngine
    from training.agent.loop import run_episodes
    from training.rl.scoring import Verifying, episode_record

    def to_record(episode):
        return episode_record(episode, round_index=1, step=1, policy_version="bench", tokenizer=tok)

    common = dict(group_size=group, tools=tools, cfg=cfg.rollout, sampling_key="bench")
    by_id = {t["task_id"]: t for t in prompts}
    start = time.perf_counter()
    with Verifying(to_record, by_id, tok, cascade, background=background) as verifying:
        episodes = run_episodes(HFEngine(model, tok), tok, prompts, on_finished=verifying, **common)
        rolled = time.perf_counter()
        _, scores = verifying.results(episodes)
    end = time.perf_counter()
    return [s["reward"] for s in scores], end - start, end - rolled


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)

    from assets.resources import SandboxResource
    from configs.schema import RewardConfig, SandboxConfig
    from verifiers.cascade import Cascade

    rows = []
    sandbox_cfg = SandboxConfig()
    with SandboxResource.from_config(sandbox_cfg).open() as sandbox:
        for size, cfg, model, tok, tasks, tools in warm_policies(args, sandbox):
            cascade = Cascade(RewardConfig(), sandbox, concurrency=sandbox_cfg.pool_size)
            for shape, (n, group) in SHAPES.items():
                prompts = families_in_turn(tasks, n)

                kw = dict(model=model, tok=tok, prompts=prompts, group=group, tools=tools, cfg=cfg, cascade=cascade)
                rollout_and_verify(False, **kw)  # warm-up
                walls: dict[str, list[float]] = {"before": [], "after": []}
                waits: dict[str, list[float]] = {"before": [], "after": []}
                rewards: dict[str, list] = {}
                for repeat in range(args.repeats):
                    for side in ("before", "after") if repeat % 2 == 0 else ("after", "before"):
                        scored, wall, wait = rollout_and_verify(side == "after", **kw)
                        walls[side].append(wall)
                        waits[side].append(wait)
                        rewards.setdefault(side, scored)
                        print(f"[bench] {size} {shape} {side}: {wall:.2f}s (verification wait {wait:.2f}s)", flush=True)
                for side in ("before", "after"):
                    rows.append(
                        {
                            "size": size,
                            "shape": shape,
                            "episodes": n * group,
                            "side": side,
                            "wall_median_s": statistics.median(walls[side]),
                            "wall_min_s": min(walls[side]),
                            "wall_max_s": max(walls[side]),
                            "verify_wait_median_s": statistics.median(waits[side]),
                            "same_rewards": rewards["after"] == rewards["before"],
                        }
                    )
                rows[-1]["ratio"] = rows[-1]["wall_median_s"] / rows[-2]["wall_median_s"]

    header = (
        f"# Verification overlapping generation, before and after (commit {commit()})\n\n"
        f"`.venv/bin/python benchmarks/verify_overlap.py --sizes {args.sizes} --repeats {args.repeats}`: "
        f"real tools and cascade, medians of {args.repeats} batches per side, alternating.\n\n"
        "| size | batch | episodes | side | rollout + verification, median (min-max) s | "
        "wait for verification after the rollout, s | same rewards | after / before |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['size']} | {r['shape']} | {r['episodes']} | {r['side']} | {r['wall_median_s']:.2f} "
        f"({r['wall_min_s']:.2f}-{r['wall_max_s']:.2f}) | {r['verify_wait_median_s']:.2f} | "
        f"{'yes' if r['same_rewards'] else 'NO'} | " + (f"**{r['ratio']:.2f}**" if "ratio" in r else "") + " |"
        for r in rows
    ]
    write_results("verify-overlap", header, lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

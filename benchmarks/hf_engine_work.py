"""The HF engine's work savings, before and after, in one run (issue 26).

    .venv/bin/python benchmarks/hf_engine_work.py [--sizes tiny,20m] [--repeats 3] [--home /tmp/rollout-bench]

Per size, one rollout batch of the `tiny` profile (32 prompts x 8 samples, the three families) of
the warm-started policy (benchmarks/rollout_engines.py's `warm_model`), through `run_episodes`,
by two HF engines on the same weights, alternating (and who goes first):

  before  re-prefills every turn of every episode, prefills each of a group's identical prompts,
          and drops stopped rows from the decode batch only once half of it has stopped (the
          engine as it was: `reuse_kv=False, share_prompts=False, drop_stopped_at=0.5`)
  after   the defaults: KV kept across an episode's turns, identical prompts prefilled once,
          stopped rows dropped at once

Both sample the same episodes (same sampling key; the check is reported). Tool results are
replayed from the first (warm-up) run, so the tools' CPU is out of both figures and the same
observations come back. Reported per side: rollout wall (median, min-max), prefill tokens
computed and the real ones among them, decode rows computed and the stopped share of them.
Writes benchmarks/results/hf-engine-work.{json,md}.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.warm_bench import commit, families_in_turn, parse_args, warm_policies, write_results  # noqa: E402

BEFORE = {"reuse_kv": False, "share_prompts": False, "drop_stopped_at": 0.5}
PROMPTS, GROUP = 32, 8


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)

    from assets.resources import SandboxResource
    from benchmarks.rollout_engines import Replay
    from configs.schema import SandboxConfig
    from training.agent.engines import HFEngine
    from training.agent.loop import run_episodes

    rows = []
    with SandboxResource.from_config(SandboxConfig()).open() as sandbox:
        for size, cfg, model, tok, tasks, real_tools in warm_policies(args, sandbox):
            tools = {name: Replay(tool) for name, tool in real_tools.items()}
            prompts = families_in_turn(tasks, PROMPTS)

            def rollout(engine, tok=tok, prompts=prompts, tools=tools, cfg=cfg):
                start = time.perf_counter()
                episodes = run_episodes(
                    engine, tok, prompts, group_size=GROUP, tools=tools, cfg=cfg.rollout, sampling_key="bench"
                )
                return episodes, time.perf_counter() - start

            reference, _ = rollout(HFEngine(model, tok, **BEFORE))  # warm-up; records the tool results
            for tool in tools.values():
                tool.replaying = True
            walls: dict[str, list[float]] = {"before": [], "after": []}
            counts: dict[str, dict] = {}
            same = {"before": 0, "after": 0}
            for repeat in range(args.repeats):
                order = ("before", "after") if repeat % 2 == 0 else ("after", "before")
                for side in order:
                    engine = HFEngine(model, tok, **(BEFORE if side == "before" else {}))
                    episodes, wall = rollout(engine)
                    walls[side].append(wall)
                    counts[side] = engine.counts  # the same work every repeat
                    same[side] += sum(a.completion_ids == b.completion_ids for a, b in zip(episodes, reference))
                    print(f"[bench] {size} {side}: {wall:.2f}s", flush=True)
            turns = sum(e.turns for e in reference) / len(reference)
            for side in ("before", "after"):
                c = counts[side]
                rows.append(
                    {
                        "size": size,
                        "side": side,
                        "wall_median_s": statistics.median(walls[side]),
                        "wall_min_s": min(walls[side]),
                        "wall_max_s": max(walls[side]),
                        "prefill_computed": c["prefill computed"],
                        "prefill_real": c["prefill real"],
                        "decode_computed": c["decode computed"],
                        "decode_real": c["decode real"],
                        "stopped_share": 1 - c["decode real"] / max(c["decode computed"], 1),
                        "episodes_identical": same[side] / (len(reference) * args.repeats),
                        "turns_per_episode": turns,
                        "tool_misses": sum(t.misses for t in tools.values()),
                    }
                )
            rows[-1]["speedup"] = rows[-2]["wall_median_s"] / rows[-1]["wall_median_s"]

    header = (
        f"# HF engine work, before and after (commit {commit()})\n\n"
        f"`.venv/bin/python benchmarks/hf_engine_work.py --sizes {args.sizes} --repeats {args.repeats}`: "
        f"{PROMPTS} prompts x {GROUP} samples, tool results replayed, medians of {args.repeats} rollouts per side, "
        "alternating.\n\n"
        "| size | side | rollout wall, median (min-max) s | prefill tokens computed | of which real | "
        "decode rows computed | on stopped rows | episodes identical to the warm-up | after / before |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['size']} | {r['side']} | {r['wall_median_s']:.2f} ({r['wall_min_s']:.2f}-{r['wall_max_s']:.2f}) | "
        f"{r['prefill_computed']:,} | {r['prefill_real'] / r['prefill_computed']:.0%} | {r['decode_computed']:,} | "
        f"{r['stopped_share']:.1%} | {r['episodes_identical']:.1%} | "
        + (f"**{1 / r['speedup']:.2f}** ({r['speedup']:.2f}x faster)" if "speedup" in r else "")
        + " |"
        for r in rows
    ]
    write_results("hf-engine-work", header, lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

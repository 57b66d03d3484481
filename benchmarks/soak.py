"""Soak: push 10,000 trajectories through rollout + verification and watch for leaks.

    .venv/bin/python benchmarks/soak.py --home /tmp/rollout-bench [--trajectories 10000] [--prompts 32] [--group 8] [--engine hf|vllm]

Batches are shaped like an RL step (--prompts tasks drawn as `train_round` draws them, --group
samples each; rounded up to whole batches): the real agent loop (`run_episodes` with the tools of
`environments.families.build_tools` on the bubblewrap sandbox), then `score_records` over a
`Cascade` on the same sandbox, as `train_round` does. The policy is the tiny warm-started one
(`warm_model` of benchmarks/rollout_engines.py, cached under --home) and is never updated, so
whatever grows is left behind by the loop.

After every batch: this process's RSS and peak (VmHWM); its live RSS, right after `malloc_trim(0)`
(glibc keeps what a batch freed, KV caches and logits, so RSS swings with what the last batch
needed; live RSS is what the process keeps); the sandbox workers' RSS (each worker's process
tree); open fds, OS threads, descendant processes; trajectories/s. At the end the pool must be
healthy: every worker alive and answering `print(1)` (the idle queue is FIFO, so consecutive calls
visit every worker; each prints its uid), process trees as small as at the start (no leftover code
processes), an empty private /tmp in each (no scratch dir left), and the same pool size.

Growth bounds compare the mean over the 10% of batches after a warm-up (--warmup: 10% of the
batches, 30% with vLLM, whose RSS climbs while it first touches its preallocated KV cache,
rollout.vllm.kv_cache_memory_mb = 256 MB, over ~2,800 trajectories here) with the mean over the
last 10%, ~6,000-8,000 trajectories later. A trajectory's record is ~5 KB on the tiny policy.
  --max-growth-mb 50 (RSS): batch-end RSS has an sd of ~11 MB here (~17 MB in a run without the
      trims), ~7 MB (~12) between two 4-batch means; 50 MB is 4-7 sd, so an allocator that keeps
      ratcheting up fails and noise does not.
  --max-live-growth-mb 10 (live RSS, sandbox RSS): live RSS moves ~0.1 MB a batch; 10 MB is
      ~1.5 KB a trajectory, a third of a record (in the workers, a few KB per sandbox call).
fds, threads and child processes must not grow (end max <= baseline max). Exit status 1 if a
check fails. Writes --out/soak.{json,md,png}.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.rollout_engines import warm_model  # noqa: E402
from verifiers.sandbox import _process_tree  # noqa: E402

HANDLES = ("fds", "threads", "children")


def _status(pid: int | str) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _mb(status: dict[str, str], key: str = "VmRSS") -> float:
    return int(status.get(key, "0 kB").split()[0]) / 1024


def sample(box) -> dict:
    own = _status("self")
    ctypes.CDLL(None).malloc_trim(0)  # after the RSS sample: what is left is live
    sandbox = [_status(p) for w in box.worker_pids() for p in _process_tree(w)]
    return {
        "rss_mb": _mb(own),
        "live_rss_mb": _mb(_status("self")),
        "peak_rss_mb": _mb(own, "VmHWM"),
        "sandbox_rss_mb": sum(map(_mb, sandbox)),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": int(own["Threads"]),
        "children": len(_process_tree(os.getpid())) - 1,
    }


def pool_health(box, start_pids: list[int], start_trees: list[int]) -> dict:
    pids = box.worker_pids()
    trees = [_process_tree(p) for p in pids]
    # the worker's own /tmp
    leftovers = [f"{q}:/tmp/{name}" for tree in trees for q in tree[1:] for name in os.listdir(f"/proc/{q}/root/tmp")]
    runs = [box.run_python("import os; print(1, os.getuid())") for _ in pids]
    h = {
        "pool_size": len(pids),
        "start_pool_size": len(start_pids),
        "restarted": sum(p not in start_pids for p in pids),
        "alive": sum(_status(p)["State"][0] not in "ZX" for p in pids),
        "print_1_ok": sum(r.ok and r.stdout.split()[0] == "1" for r in runs),
        "workers_answered": len({int(r.stdout.split()[1]) for r in runs if r.ok} & set(box.uids)),
        "tree_sizes": [len(t) for t in trees],
        "start_tree_sizes": start_trees,
        "leftover_tmp": leftovers,
    }
    h["healthy"] = (
        len(pids) == h["alive"] == h["print_1_ok"] == h["workers_answered"] == len(start_pids)
        and h["tree_sizes"] == start_trees
        and not leftovers
    )
    return h


def windows(n: int, warmup: float) -> tuple[slice, slice]:
    """Baseline (the 10% of the n batches after the `warmup` fraction) and end (the last 10%)."""
    k = max(1, n // 10)
    skip = min(max(1, round(warmup * n)), n - k)
    return slice(skip, skip + k), slice(n - k, n)


def growth(samples: list[dict], bounds: dict[str, float], warmup: float) -> dict:
    base, end = windows(len(samples), warmup)
    out = {"baseline_batches": [base.start + 1, base.stop], "end_batches": [end.start + 1, end.stop]}
    for key, bound in bounds.items():
        before, after = (statistics.fmean(s[key] for s in samples[w]) for w in (base, end))
        rest = samples[base.start :]  # the trend after warm-up: a diagnostic, not a check
        slope = (
            statistics.linear_regression([s["trajectories"] for s in rest], [s[key] for s in rest]).slope
            if len(rest) > 1
            else 0.0
        )
        out[key] = {
            "baseline": round(before, 1),
            "end": round(after, 1),
            "growth": round(after - before, 1),
            "bound": bound,
            "ok": after - before <= bound,
            "trend_mb_per_1k": round(1000 * slope, 2),
        }
    for key in HANDLES:
        before, after = (max(s[key] for s in samples[w]) for w in (base, end))
        out[key] = {"baseline": before, "end": after, "ok": after <= before}
    return out


def plot(samples: list[dict], warmup: float, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s["trajectories"] for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(7, 6.5), sharex=True)
    for ax, keys, label in zip(
        axes,
        (("rss_mb", "live_rss_mb", "peak_rss_mb"), ("sandbox_rss_mb",), ("trajectories_per_s",)),
        ("this process (MB)", "sandbox workers (MB)", "trajectories / s"),
    ):
        for key in keys:
            ax.plot(x, [s[key] for s in samples], marker=".", linewidth=1, label=key)
        for w in windows(len(samples), warmup):  # what the bounds compare
            ax.axvspan(x[w.start] - x[0], x[w.stop - 1], alpha=0.12, color="grey")
        ax.set_ylim(0, 1.15 * max(s[key] for s in samples for key in keys))
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="best")
    axes[-1].set_xlabel("trajectories processed (shaded: the baseline and end windows)", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def markdown(summary: dict) -> str:
    s, g, h = summary, summary["growth"], summary["pool"]
    rows = [
        ("trajectories", f"{s['trajectories']:,} ({s['batches']} batches of {s['batch']})"),
        ("engine", s["engine"]),
        ("wall time", f"{s['wall_s']:.0f} s"),
        (
            "trajectories/s, overall (median batch)",
            f"{s['trajectories_per_s']} ({s['median_batch_trajectories_per_s']})",
        ),
        (
            "tool calls; verifier calls",
            f"{s['tool_calls']:,}; " + ", ".join(f"{k} {v:,}" for k, v in s["verifier_calls"].items()),
        ),
        *[
            (f"{name} start / end / peak (MB)", " / ".join(f"{s[key][k]:.1f}" for k in ("start", "end", "peak")))
            for name, key in (("RSS", "rss_mb"), ("sandbox RSS", "sandbox_rss_mb"))
        ],
        *[
            (
                f"{k} growth, batches {g['baseline_batches']} -> {g['end_batches']}",
                f"{g[k]['baseline']} -> {g[k]['end']}: **{g[k]['growth']:+.1f} MB** "
                f"(bound {g[k]['bound']:g}; trend {g[k]['trend_mb_per_1k']:+.2f} MB/1k traj) {'ok' if g[k]['ok'] else 'FAIL'}",
            )
            for k in ("rss_mb", "live_rss_mb", "sandbox_rss_mb")
        ],
        (
            "fds / threads / children (baseline max -> end max)",
            ", ".join(f"{g[k]['baseline']} -> {g[k]['end']}" for k in HANDLES),
        ),
        (
            "sandbox pool",
            f"{h['alive']}/{h['start_pool_size']} alive, print(1) ok on {h['workers_answered']}, {h['restarted']} restarted, process trees "
            f"{h['tree_sizes']} (start {h['start_tree_sizes']}), {len(h['leftover_tmp'])} leftover /tmp entries: {'healthy' if h['healthy'] else 'UNHEALTHY'}",
        ),
        ("result", "**pass**" if s["passed"] else "**FAIL**"),
    ]
    return "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=10_000, help="at least this many, in whole batches")
    parser.add_argument("--prompts", type=int, default=32, help="tasks per batch (an RL step's prompts)")
    parser.add_argument("--group", type=int, default=8, help="samples per task; batch = prompts x group")
    parser.add_argument(
        "--home", type=Path, default=Path("/tmp/rollout-bench"), help="warm-started model cache (rollout_engines.py's)"
    )
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--max-growth-mb", type=float, default=50.0, help="RSS growth allowed, baseline to end window")
    parser.add_argument(
        "--max-live-growth-mb", type=float, default=10.0, help="live RSS and sandbox RSS growth allowed"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="fraction of batches before the baseline window (default 0.1; 0.3 with vllm)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else {"hf": 0.1, "vllm": 0.3}[args.engine]
    command = " ".join([".venv/bin/python benchmarks/soak.py", *(sys.argv[1:] if argv is None else argv)])

    import torch

    from assets.resources import SandboxResource
    from configs.schema import SandboxConfig
    from environments.base import KnowledgeBase
    from environments.families import build_tools
    from training.agent.engines import build_rollout_engine
    from training.agent.loop import run_episodes
    from training.rl.curriculum import sample_prompts
    from training.rl.scoring import episode_record, score_records
    from verifiers.cascade import Cascade, merge_stats

    rng, generator = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    batches, samples, tier_stats = -(-args.trajectories // (args.prompts * args.group)), [], {}
    with SandboxResource.from_config(
        SandboxConfig()
    ).open() as box:  # as rollout_engines.py: it may warm-start the model
        cfg, _, model, tok, tasks, documents = warm_model("tiny", 400, args.home, box)
        torch.set_num_threads(cfg.threads)
        rollout = cfg.rollout.model_copy(update={"engine": args.engine})
        tools = build_tools(sandbox=box, kb=KnowledgeBase([], {}, documents), top_k=cfg.data.knowledge_base.top_k)
        cascade, by_id = Cascade(cfg.reward, box, concurrency=len(box.worker_pids())), {t["task_id"]: t for t in tasks}
        engine = build_rollout_engine(rollout, model, tok, seed=args.seed)
        start_pids, before = box.worker_pids(), sample(box)
        start_trees = [len(_process_tree(p)) for p in start_pids]
        print(
            f"[soak] {batches} batches of {args.prompts} prompts x {args.group}, {args.engine} engine, {len(start_pids)} sandbox workers; before: {before}",
            flush=True,
        )
        start = time.perf_counter()
        try:
            for batch in range(1, batches + 1):
                t0 = time.perf_counter()
                episodes = run_episodes(
                    engine,
                    tok,
                    sample_prompts(tasks, {}, args.prompts, rng),
                    group_size=args.group,
                    tools=tools,
                    cfg=rollout,
                    generator=generator,
                    group_prefix=f"soak-b{batch}-",
                )
                t1 = time.perf_counter()
                records = [
                    episode_record(e, round_index=0, step=batch, policy_version="soak", tokenizer=tok) for e in episodes
                ]
                scores = score_records(records, by_id, tok, cascade)
                merge_stats(tier_stats, cascade.take_stats()[0])
                t2 = time.perf_counter()
                s = {
                    "batch": batch,
                    "trajectories": batch * len(records),
                    "rollout_s": round(t1 - t0, 3),
                    "verify_s": round(t2 - t1, 3),
                    "trajectories_per_s": round(len(records) / (t2 - t0), 1),
                    "tool_calls": sum(len(e.tool_calls) for e in episodes),
                    "pass_rate": round(statistics.fmean(x["outcome"] or 0.0 for x in scores), 3),
                    **sample(box),
                }
                samples.append(s)
                print(
                    f"[soak] batch {batch}/{batches} ({s['trajectories']} traj): {s['trajectories_per_s']} traj/s (rollout {s['rollout_s']}s, verify "
                    f"{s['verify_s']}s), {s['tool_calls']} tool calls, pass {s['pass_rate']} | RSS {s['rss_mb']:.1f} MB, live {s['live_rss_mb']:.1f}, "
                    f"peak {s['peak_rss_mb']:.1f}, sandbox {s['sandbox_rss_mb']:.1f} | fds {s['fds']}, threads {s['threads']}, children {s['children']}",
                    flush=True,
                )
        finally:
            engine.close()
        wall = time.perf_counter() - start
        health = pool_health(box, start_pids, start_trees)
    done = samples[-1]["trajectories"]
    summary = {
        "trajectories": done,
        "batches": batches,
        "batch": f"{args.prompts} prompts x {args.group}",
        "engine": args.engine,
        "wall_s": round(wall, 1),
        "trajectories_per_s": round(done / wall, 1),
        "median_batch_trajectories_per_s": round(statistics.median(s["trajectories_per_s"] for s in samples), 1),
        "tool_calls": sum(s["tool_calls"] for s in samples),
        "verifier_calls": {k: v.calls for k, v in tier_stats.items()},
        **{
            key: {"start": before[key], "end": samples[-1][key], "peak": max(s[peak] for s in samples)}
            for key, peak in (("rss_mb", "peak_rss_mb"), ("sandbox_rss_mb", "sandbox_rss_mb"))
        },
        "growth": growth(
            samples,
            {
                "rss_mb": args.max_growth_mb,
                "live_rss_mb": args.max_live_growth_mb,
                "sandbox_rss_mb": args.max_live_growth_mb,
            },
            warmup,
        ),
        "pool": health,
    }
    summary["passed"] = health["healthy"] and all(v["ok"] for v in summary["growth"].values() if isinstance(v, dict))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(
        json.dumps({"command": command, "summary": summary, "before": before, "samples": samples}, indent=1)
    )
    (args.out / "soak.md").write_text(
        f"# Soak: {done:,} trajectories\n\n`{command}`\n\n{markdown(summary)}\n\n![soak](soak.png)\n"
    )
    plot(
        samples,
        warmup,
        args.out / "soak.png",
        f"soak: {done:,} trajectories, tiny policy, {args.engine} engine, bubblewrap sandbox",
    )
    print(markdown(summary), flush=True)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

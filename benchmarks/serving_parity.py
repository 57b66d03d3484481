"""The served champion answers as well as the benchmark said it would (issue 27, acceptance 4).

    FLYWHEEL_HOME=H make run                                   # a home with a champion (tiny)
    .venv/bin/python benchmarks/serving_parity.py --home H     # then this

Starts `python -m pipelines.serve` (what `make serve` runs) on the home's champion, posts the
held-out tasks of one family (`--family`, default arithmetic; the first `--tasks`, default 400, in
the benchmark's order) over HTTP, one request per task at the agent's default sampling (the
benchmark's temperature, a seed per task), and scores each reply's policy text with the profile's
own verifier cascade, as the benchmark asset scores an episode. It reports the served pass@1, the
benchmark asset's pass@1 on the same tasks (its per-task scores, `benchmark.samples_per_task`
samples each) and the paired 95% CI of the difference, and writes
benchmarks/results/serving-parity.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.warm_bench import commit, write_results  # noqa: E402


def _post(port: int, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def _wait(port: int, server: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"the server did not answer on port {port} within {timeout_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, required=True, help="a FLYWHEEL_HOME with a champion")
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--family", default="arithmetic")
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--port", type=int, default=8391)
    args = parser.parse_args(argv)
    os.environ["FLYWHEEL_HOME"] = str(args.home)

    import pandas as pd

    from assets.tracking import CHAMPION
    from configs import load_profile
    from environments.base import task_view
    from environments.family import tools_of
    from pipelines.registry import tracker_for
    from training.evaluate import mean_ci, paired_difference
    from verifiers.cascade import Cascade
    from verifiers.sandboxes import sandbox_from_settings
    from verifiers.shaping import Candidate

    cfg = load_profile(args.profile)
    tracker = tracker_for(cfg)
    champion = tracker.version_by_alias(CHAMPION)
    if champion is None:
        raise SystemExit(f"{args.home} has no champion: run `make run` with FLYWHEEL_HOME={args.home} first")
    bench_scores = tracker.load_json(champion.run_id, "per_task_scores.json")
    if tracker.gate_k(champion.run_id) != 1:
        raise SystemExit("the champion's per-task scores are pass@k (benchmark.gate_k > 1), not pass@1")
    bench_metrics = tracker.client().get_run(champion.run_id).data.metrics
    tasks = pd.read_parquet(args.home / "artifacts" / "assets" / "benchmark_tasks" / "all.parquet")
    tasks = [
        t
        for t in tasks.to_dict("records")
        if t["family"] == args.family and t["split"] not in cfg.benchmark.suites and t["task_id"] in bench_scores
    ][: args.tasks]

    env = {**os.environ, "FLYWHEEL_PROFILE": args.profile}
    server = subprocess.Popen(
        [sys.executable, "-m", "pipelines.serve", "--profile", args.profile, "--port", str(args.port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    replies = []
    try:
        _wait(args.port, server)
        start = time.perf_counter()
        for i, task in enumerate(tasks):
            body = {
                "input": [{"role": "user", "content": task["prompt"]}],
                "custom_inputs": {"family": task["family"], "seed": i},
            }
            replies.append(_post(args.port, body)["custom_outputs"])
            if (i + 1) % 50 == 0:
                print(f"  {i + 1}/{len(tasks)} requests, {time.perf_counter() - start:.0f} s", flush=True)
        wall = time.perf_counter() - start
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)

    sandbox = sandbox_from_settings(cfg.sandbox)
    try:
        cascade = Cascade(cfg.reward, sandbox, concurrency=cfg.sandbox.pool_size)
        items = [
            (
                Candidate(r["policy_turns"], num_policy_tokens=r["policy_tokens"], tools=tools_of(t["family"])),
                task_view(t),
            )
            for r, t in zip(replies, tasks)
        ]
        breakdowns = cascade.score_many(items, keys=[t["task_id"] for t in tasks])
    finally:
        sandbox.close()
    served = {t["task_id"]: float(b.outcome or 0.0) for t, b in zip(tasks, breakdowns)}
    benchmark = {t["task_id"]: float(bench_scores[t["task_id"]]) for t in tasks}
    served_mean, served_low, served_high = mean_ci(list(served.values()), cfg.benchmark.confidence)
    bench_mean, bench_low, bench_high = mean_ci(list(benchmark.values()), cfg.benchmark.confidence)
    diff, diff_low, diff_high = paired_difference(served, benchmark, cfg.benchmark.confidence)
    versions = {r["model_version"] for r in replies}
    logged_at = tracker.client().get_run(champion.run_id).data.tags.get("mlflow.source.git.commit", "?")[:7]
    row = {
        "version": str(champion.version),
        "champion_logged_at": logged_at,
        "served_versions": sorted(versions),
        "family": args.family,
        "tasks": len(tasks),
        "served_pass_at_1": served_mean,
        "served_ci": [served_low, served_high],
        "benchmark_pass_at_1_same_tasks": bench_mean,
        "benchmark_ci_same_tasks": [bench_low, bench_high],
        "benchmark_samples_per_task": cfg.benchmark.samples_per_task,
        "benchmark_asset_family_pass_at_1": bench_metrics.get(f"{args.family}/pass_at_1"),
        "diff": diff,
        "diff_ci": [diff_low, diff_high],
        "within_ci": diff_low <= 0.0 <= diff_high,
        "tool_call_rate": sum(bool(r["tool_trace"]) for r in replies) / len(replies),
        "seconds_per_request": wall / len(replies),
    }
    header = (
        f"# Served champion vs the benchmark asset\n\n`.venv/bin/python benchmarks/serving_parity.py --home H "
        f"--profile {args.profile} --family {args.family} --tasks {args.tasks}` at {commit()}, on a home made by "
        f"`make run PROFILE={args.profile}` (the champion was benchmarked and logged at {logged_at}). Served: one "
        f"sampled request per task over HTTP (`make serve`'s server); benchmark: the champion's per-task scores "
        f"(benchmark.samples_per_task={cfg.benchmark.samples_per_task}). Paired 95% CI of served - benchmark over "
        f"the same tasks.\n\n"
    )
    lines = [
        "| version | family | tasks | served pass@1 [95% CI] | benchmark pass@1, same tasks [95% CI] | served - benchmark [95% CI] | 0 in CI | tool-call rate | s/request |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| v{row['version']} | {args.family} | {len(tasks)} | {served_mean:.3f} [{served_low:.3f}, {served_high:.3f}] | "
        f"{bench_mean:.3f} [{bench_low:.3f}, {bench_high:.3f}] | {diff:+.3f} [{diff_low:+.3f}, {diff_high:+.3f}] | "
        f"{'yes' if row['within_ci'] else 'no'} | {row['tool_call_rate']:.2f} | {row['seconds_per_request']:.2f} |",
    ]
    write_results("serving-parity", header, lines, [row])
    return 0 if row["within_ci"] and versions == {str(champion.version)} else 1


if __name__ == "__main__":
    raise SystemExit(main())

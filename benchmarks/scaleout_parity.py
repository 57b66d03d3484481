"""Does a flywheel with N processes per step learn what the 1-process flywheel learns? (issue 23)

    .venv/bin/python benchmarks/scaleout_parity.py                   # runs both flywheels (tiny, 2 processes), ~25 min here
    .venv/bin/python benchmarks/scaleout_parity.py --homes H1 H2     # compares two finished homes (1 process, N processes)

Runs `python -m pipelines.run` twice from empty homes, the second with
`--set orchestration.launcher=subprocess --set orchestration.nproc_per_node=N`, then pairs every
registered version of one with the version of the same stage and round of the other, task by task
on the same held-out benchmark: the N-process pass@1 minus the 1-process one, with its paired 95% CI.
Sampling is keyed to the episode, so the two differ only by float rounding in the update (and what
it changes downstream): the CIs should hold 0. Writes benchmarks/results/scaleout_parity.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from configs import load_profile  # noqa: E402
from training.evaluate import mean_ci, paired_difference  # noqa: E402


def run_flywheel(home: Path, profile: str, overrides: list[str]) -> float:
    """Wall seconds of one `pipelines.run` into `home`."""
    args = [sys.executable, "-m", "pipelines.run", "--profile", profile]
    for override in overrides:
        args += ["--set", override]
    start = time.perf_counter()
    subprocess.run(args, cwd=REPO, env={**os.environ, "FLYWHEEL_HOME": str(home)}, check=True)
    return time.perf_counter() - start


def version_scores(home: Path, profile: str) -> dict[str, dict[str, float]]:
    """{"sft" | "rl round K": per-task scores} of every registered version in `home`."""
    os.environ["FLYWHEEL_HOME"] = str(home)
    from pipelines.resources import resources_for

    tracker = resources_for(load_profile(profile))["tracker"]
    out = {}
    for v in tracker.versions():
        label = "sft" if v.tags.get("stage") == "sft" else f"rl round {v.tags.get('round')}"
        out[label] = tracker.load_json(v.run_id, "per_task_scores.json")
    return out


def compare(
    one: dict[str, dict[str, float]], many: dict[str, dict[str, float]], confidence: float = 0.95
) -> list[dict]:
    rows = []
    for label in one:
        if label not in many:
            continue
        diff, low, high = paired_difference(many[label], one[label], confidence)
        rows.append(
            {
                "version": label,
                "tasks": len(one[label]),
                "pass_at_1_one": mean_ci(list(one[label].values()), confidence)[0],
                "pass_at_1_many": mean_ci(list(many[label].values()), confidence)[0],
                "diff": diff,
                "ci_low": low,
                "ci_high": high,
                "identical_tasks": sum(one[label][t] == many[label].get(t) for t in one[label]) / len(one[label]),
            }
        )
    return rows


def markdown(rows: list[dict], nproc: int, meta: dict) -> str:
    lines = [
        f"| version | tasks | pass@1, 1 process | pass@1, {nproc} processes | {nproc} − 1 [paired 95% CI] | tasks scored alike |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['version']} | {r['tasks']} | {r['pass_at_1_one']:.3f} | {r['pass_at_1_many']:.3f} | "
            f"{r['diff']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['identical_tasks']:.3f} |"
        )
    walls = meta.get("wall_s")
    if walls:
        lines.append(
            f"\nWall time of `pipelines.run`: 1 process {walls['one'] / 60:.1f} min, {nproc} processes {walls['many'] / 60:.1f} min "
            f"({walls['many'] / walls['one']:.2f}x) on this {os.cpu_count()}-core machine."
        )
    lines.append(f"\nCommit `{meta['commit']}`, profile `{meta['profile']}`; `{meta['command']}`.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument(
        "--homes", nargs=2, type=Path, metavar=("ONE", "MANY"), help="compare finished homes instead of running"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "scaleout_parity")
    args = parser.parse_args()
    meta = {
        "profile": args.profile,
        "nproc": args.nproc,
        "command": " ".join(["benchmarks/scaleout_parity.py", *sys.argv[1:]]),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
    }
    if args.homes:
        one_home, many_home = args.homes
    else:
        root = Path(tempfile.mkdtemp(prefix="scaleout-parity-"))
        one_home, many_home = root / "one", root / "many"
        meta["wall_s"] = {
            "one": run_flywheel(one_home, args.profile, []),
            "many": run_flywheel(
                many_home,
                args.profile,
                ["orchestration.launcher=subprocess", f"orchestration.nproc_per_node={args.nproc}"],
            ),
        }
    rows = compare(version_scores(one_home, args.profile), version_scores(many_home, args.profile))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    text = markdown(rows, args.nproc, meta)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

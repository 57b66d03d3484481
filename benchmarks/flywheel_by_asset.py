"""Wall time and peak memory of `make run`'s flywheel, by asset step (issue 9, part 4).

    .venv/bin/python benchmarks/flywheel_by_asset.py [--profile tiny] [--home /tmp/flywheel-e2e] [--set rl.rounds=1 ...]

Runs `python -m pipelines.run` (what `make run` runs) in a fresh FLYWHEEL_HOME as a child process,
sampling the resident memory of its whole process tree (the sandbox workers included) every
0.2 s. Afterwards it reads each step's start and end from the Dagster event log of that home
(STEP_START, then STEP_SUCCESS or STEP_FAILURE) and reports per step: wall time, share of the
flywheel, and the peak memory sampled while it ran. Steps of the same asset in different runs (the
rounds) are listed per run. Writes benchmarks/results/flywheel-by-asset.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def tree_rss_mb(pid: int) -> float:
    """Resident memory of `pid` and all its descendants, in MB (a process gone meanwhile counts 0)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
    return total / 2**20


def sample(proc: subprocess.Popen, samples: list[tuple[float, float]], every_s: float = 0.2) -> None:
    while proc.poll() is None:
        samples.append((time.time(), tree_rss_mb(proc.pid)))
        time.sleep(every_s)


def step_spans(home: Path) -> list[dict]:
    """Every step of every run in the home's Dagster instance, in the order they started."""
    from dagster import DagsterEventType, DagsterInstance

    instance = DagsterInstance.from_config(str(home / "dagster"))
    spans = []
    for run in reversed(instance.get_runs()):
        partition = run.tags.get("dagster/partition", "")
        starts = {e.step_key: e.timestamp for e in instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START)}
        ends = {
            e.step_key: (e.timestamp, e.dagster_event.event_type_value)
            for e in instance.all_logs(
                run.run_id, of_type={DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE}
            )
        }
        for step, start in sorted(starts.items(), key=lambda kv: kv[1]):
            end, outcome = ends.get(step, (None, "unfinished"))
            spans.append(
                {
                    "job": run.job_name,
                    "partition": partition,
                    "step": step,
                    "start": start,
                    "end": end,
                    "outcome": outcome,
                }
            )
    return spans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--home", type=Path, default=Path("/tmp/flywheel-e2e"))
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    shutil.rmtree(args.home, ignore_errors=True)  # a fresh home: every asset is materialized once
    env = {**os.environ, "FLYWHEEL_HOME": str(args.home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    command = [
        sys.executable,
        "-m",
        "pipelines.run",
        "--profile",
        args.profile,
        *[a for s in args.set for a in ("--set", s)],
    ]
    samples: list[tuple[float, float]] = []
    started = time.time()
    proc = subprocess.Popen(command, cwd=ROOT, env=env)
    sampler = threading.Thread(target=sample, args=(proc, samples), daemon=True)
    sampler.start()
    if proc.wait() != 0:
        raise SystemExit(f"the flywheel failed (exit {proc.returncode}); its Dagster runs are in {args.home}/dagster")
    sampler.join()
    total = time.time() - started
    rows = []
    for span in step_spans(args.home):
        during = [mb for t, mb in samples if span["start"] <= t <= (span["end"] or t)]
        wall = (span["end"] or span["start"]) - span["start"]
        rows.append(
            {
                **{k: span[k] for k in ("job", "partition", "step", "outcome")},
                "wall_s": round(wall, 1),
                "share": round(wall / total, 3),
                "peak_rss_mb": round(max(during), 0) if during else None,
            }
        )
    steps_s = sum(r["wall_s"] for r in rows)
    summary = {
        "command": " ".join(["benchmarks/flywheel_by_asset.py", *(argv or sys.argv[1:])]),
        "flywheel_s": round(total, 1),
        "in_steps_s": round(steps_s, 1),
        "peak_rss_mb": round(max(mb for _, mb in samples), 0),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "flywheel-by-asset.json").write_text(json.dumps(summary, indent=1))
    lines = [
        f"`make run` flywheel (profile {args.profile}{', ' + ', '.join(args.set) if args.set else ''}): {total / 60:.1f} min, "
        f"{steps_s / total:.0%} of it inside steps (the rest: process start, imports, Dagster between steps); peak memory of the process tree "
        f"{summary['peak_rss_mb']:.0f} MB",
        "",
        "| job | round | step | wall (s) | share | peak RSS (MB) |",
        "|---|---|---|---|---|---|",
    ]
    # -: ended between two samples
    lines += [
        f"| {r['job']} | {r['partition'] or '-'} | {r['step']} | {r['wall_s']} | {r['share']:.1%} | {r['peak_rss_mb'] or '-'} |"
        for r in rows
    ]
    (args.out / "flywheel-by-asset.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`make run`: the default flywheel on this machine, through Dagster, recorded in MLflow.

    python -m pipelines.run --profile tiny [--seed 1] [--set rl.rounds=3 ...]
    python -m pipelines.run --resume      # `make resume`: continue the last flywheel after a kill or failure

1. validate the profile (fails before any work, naming field and value);
2. point Dagster (DAGSTER_HOME) and MLflow at FLYWHEEL_HOME, so `dagster dev` and
   `mlflow ui` show these runs;
3. materialize the foundation job (tasks -> SFT -> SFT benchmark), then each RL round as a
   new partition of the round job (rollouts -> rewards -> checkpoint -> benchmark -> gate);
4. print SFT vs final RL pass@1, the champion, and where the state is.

A flywheel killed at any point (SIGKILL, a crash, a reboot) is continued by `--resume`: its run is
marked failed, re-executed from failure by Dagster (steps that completed are not run again; SFT
and RL rounds continue from their last state checkpoint), then its remaining rounds run
(tests/pipelines/test_kill_resume.py).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path

from assets.locks import Busy
from configs import ConfigError, flywheel_home, load_profile, parse_override
from configs.failpoints import failpoint
from environments.family import resolve_families
from pipelines.home import HomeError, check_lineage, relocate, remember, remembered, run_lock, settings, writable_home
from pipelines.instance import LOCAL_SETTINGS

# What earlier versions wrote (without monitoring; without the run queue's one-run-per-round limit): upgraded in place.
OLD_INSTANCE_SETTINGS = (
    "telemetry:\n  enabled: false\n",
    "telemetry:\n  enabled: false\nrun_monitoring:\n  enabled: true\n  start_timeout_seconds: 300\n  poll_interval_seconds: 60\n"
    "run_retries:\n  enabled: true\n  max_retries: 1\n  retry_on_asset_or_op_failure: false\n",
)


def prepare_home(home: Path) -> None:
    """Dagster's sqlite instance lives in FLYWHEEL_HOME/dagster; created on first use."""
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    settings = dagster_home / "dagster.yaml"
    if not settings.exists() or settings.read_text() in OLD_INSTANCE_SETTINGS:
        settings.write_text(LOCAL_SETTINGS)
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight loading/saving bars would drown the progress lines


def console(log_file: Path) -> dict:
    """Run config for `make run`'s runs: progress lines (INFO) and one-line failures on the console,
    every event in full in `log_file` (pipelines/console.py); the UI's run log has them too."""
    return {"loggers": {"flywheel": {"config": {"log_level": "INFO", "log_file": str(log_file)}}}}


# Tags on every run a flywheel launches: which flywheel it belongs to, how to rebuild its
# definitions, and the process running it (to tell a killed run from a running one).
FLYWHEEL_TAG, PROFILE_TAG, OVERRIDES_TAG, PID_TAG, HOST_TAG = (
    "flywheel/id",
    "flywheel/profile",
    "flywheel/overrides",
    "flywheel/pid",
    "flywheel/host",
)


def run_flywheel(profile: str, overrides: dict, *, resume: bool = False) -> dict:
    """A new flywheel (foundation, then `rl.rounds` rounds); with `resume`, the last one continued:
    its failed or killed run re-executed from failure (completed steps are not run again), then
    the rounds it had still to run. Profile and overrides then come from that flywheel's runs."""
    home = flywheel_home()
    if not resume:  # 1. the home's own settings unless told otherwise; validated before anything starts
        profile, overrides = settings(home, profile, overrides)
        resolve_families(load_profile(profile, overrides))
    writable_home(home)
    with run_lock(home, "make resume" if resume else "make run"):  # one run or resume per home at a time
        moved = relocate(home)
        if moved:
            print(f"[flywheel] this home moved to {home}: rewrote the stored paths in {', '.join(moved)}", flush=True)
        return _run_flywheel(home, profile, overrides, resume=resume)


def _run_flywheel(home: Path, profile: str | None, overrides: dict, *, resume: bool) -> dict:
    if not resume:
        cfg = resolve_families(load_profile(profile, overrides))
        check_lineage(home, cfg)
    prepare_home(home)  # 2.
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    from assets.rl import next_round, rl_rounds
    from pipelines.definitions import FOUNDATION_JOB, RL_ROUND_JOB, build_definitions
    from pipelines.resources import resources_for
    from training.evaluate import paired_difference

    instance = DagsterInstance.get()
    dead = fail_dead_runs(instance)
    started = time.perf_counter()
    runs = flywheel_runs(instance) if resume else []
    if resume:
        if not runs:
            raise SystemExit(f"[flywheel] nothing to resume: no flywheel has run in {home}")
        profile, overrides = runs[0].tags[PROFILE_TAG], json.loads(runs[0].tags[OVERRIDES_TAG])
    elif remembered(home) is None and (earlier := flywheel_runs(instance)):
        # a home made before homes remembered their lineage: its last flywheel's settings are the record
        earlier_cfg = load_profile(earlier[0].tags[PROFILE_TAG], json.loads(earlier[0].tags[OVERRIDES_TAG]))
        founded = any(r.job_name == FOUNDATION_JOB and r.status == DagsterRunStatus.SUCCESS for r in earlier)
        remember(home, earlier_cfg.profile, json.loads(earlier[0].tags[OVERRIDES_TAG]), earlier_cfg, bind=founded)
        check_lineage(home, cfg)
    cfg = resolve_families(load_profile(profile, overrides))
    remember(home, profile, overrides, cfg)
    tracker = resources_for(cfg, overrides)["tracker"]
    ended = tracker.end_orphaned_runs(lambda run_id: _finished(instance, run_id))
    if dead or ended:
        print(
            f"[flywheel] found {len(dead)} Dagster run(s) whose process was gone (marked failed) and "
            f"{len(ended)} MLflow run(s) left RUNNING by them (marked KILLED)",
            flush=True,
        )
    # what a re-execution's job is rebuilt from (pipelines/definitions.py), as the Dagster UI does
    os.environ["FLYWHEEL_PROFILE"], os.environ["FLYWHEEL_OVERRIDES"] = profile, json.dumps(overrides)
    defs = build_definitions(profile, overrides)
    tags = {
        FLYWHEEL_TAG: runs[0].tags[FLYWHEEL_TAG] if runs else uuid.uuid4().hex[:12],
        PROFILE_TAG: profile,
        OVERRIDES_TAG: json.dumps(overrides, sort_keys=True),
        PID_TAG: str(os.getpid()),
        HOST_TAG: socket.gethostname(),
    }
    log_file = home / "logs" / f"flywheel-{tags[FLYWHEEL_TAG]}.log"
    print(f"[flywheel] full log (every event, tracebacks included): {log_file}", flush=True)
    live = (DagsterRunStatus.STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED)
    if runs and runs[0].status in live:
        raise SystemExit(
            f"[flywheel] the last flywheel is still running: run {runs[0].run_id[:8]} (pid {runs[0].tags.get(PID_TAG)})"
        )
    if runs and runs[0].status != DagsterRunStatus.SUCCESS:  # 3a. the killed or failed run, from where it stopped
        parent = runs[0]
        what = parent.job_name + (
            f" partition {parent.tags['dagster/partition']}" if "dagster/partition" in parent.tags else ""
        )
        print(
            f"[flywheel] profile={profile} home={home}: re-executing {what} (run {parent.run_id[:8]}) from failure",
            flush=True,
        )
        result = reexecute_from_failure(instance, parent, tags, log_file)
        if not result.success:
            raise SystemExit(failure_message(result, what, log_file))
        runs = flywheel_runs(instance)
    # 3b. foundation, then rounds
    if not any(r.job_name == FOUNDATION_JOB and r.status == DagsterRunStatus.SUCCESS for r in runs):
        print(
            f"[flywheel] profile={profile} home={home}: foundation (tasks, tokenizer, SFT, SFT benchmark)", flush=True
        )
        result = execute(defs.resolve_job_def(FOUNDATION_JOB), instance, tags, log_file)
        if not result.success:
            raise SystemExit(failure_message(result, FOUNDATION_JOB, log_file))
    remember(home, profile, overrides, cfg, bind=True)  # from here on, the home is this lineage
    done = rounds_of(runs, RL_ROUND_JOB)
    for _ in range(cfg.rl.rounds - len(done)):
        key = str(next_round(instance))
        instance.add_dynamic_partitions(rl_rounds.name, [key])
        print(f"[flywheel] RL round {key} ({cfg.rl.steps_per_round} steps)", flush=True)
        result = execute(defs.resolve_job_def(RL_ROUND_JOB), instance, tags, log_file, partition_key=key)
        if not result.success:
            raise SystemExit(failure_message(result, f"{RL_ROUND_JOB} partition {key}", log_file))
        done.append(key)
    sft_scores = defs.load_asset_value("sft_benchmark_scores", instance=instance)
    rounds = [defs.load_asset_value("benchmark_scores", partition_key=key, instance=instance) for key in done]
    champion = tracker.version_by_alias("champion")
    final = rounds[-1] if rounds else sft_scores
    final_scores, sft_per_task = (
        tracker.load_json(s["mlflow_run_id"], "per_task_scores.json") for s in (final, sft_scores)
    )
    gain = paired_difference(final_scores, sft_per_task, cfg.benchmark.confidence)
    bench_tasks = defs.load_asset_value("benchmark_tasks", instance=instance)
    # suites are reported apart, never in the gain
    bench_tasks = bench_tasks[~bench_tasks["split"].isin(list(cfg.benchmark.suites))]
    family_of = dict(zip(bench_tasks["task_id"], bench_tasks["family"]))
    level_of = {
        t: f"{f} level_{int(lv)}"
        for t, f, lv in zip(bench_tasks["task_id"], bench_tasks["family"], bench_tasks["level"])
    }
    champion_gain = None
    if champion is not None and champion.run_id not in (final["mlflow_run_id"], sft_scores["mlflow_run_id"]):
        # the champion is an earlier round (or an earlier flywheel's): its gain is not the last round's
        champion_scores = tracker.load_json(champion.run_id, "per_task_scores.json")
        champion_gain = paired_difference(champion_scores, sft_per_task, cfg.benchmark.confidence)
    starts = [
        r.start_time
        for r in instance.get_run_records(RunsFilter(tags={FLYWHEEL_TAG: tags[FLYWHEEL_TAG]}))
        if r.start_time
    ]
    outcome = {
        "sft": sft_scores,
        "rounds": rounds,
        "round_keys": done,
        "gain": gain,
        "champion_gain": champion_gain,
        "gains": paired_by(family_of, final_scores, sft_per_task, cfg.benchmark.confidence),
        "level_gains": paired_by(level_of, final_scores, sft_per_task, cfg.benchmark.confidence),
        "minutes": (time.perf_counter() - started) / 60,  # this invocation
        "flywheel_minutes": (time.time() - min(starts)) / 60 if starts else None,  # since its first run started
        "peak_rss_gb": peak_rss_gb(),
        "home": str(home),
        "cfg": cfg,
        "champion": champion_label(champion),
    }
    if cfg.benchmark.include_base:  # SFT's gain over the pretrained model it started from
        base = defs.load_asset_value("base_benchmark_scores", instance=instance)
        base_per_task = tracker.load_json(base["mlflow_run_id"], "per_task_scores.json")
        outcome.update(
            base=base,
            base_gain=paired_difference(sft_per_task, base_per_task, cfg.benchmark.confidence),
            base_gains=paired_by(family_of, sft_per_task, base_per_task, cfg.benchmark.confidence),
            base_level_gains=paired_by(level_of, sft_per_task, base_per_task, cfg.benchmark.confidence),
        )
    return outcome


def execute(job, instance, tags: dict, log_file: Path, partition_key: str | None = None):
    """Run `job` in this process. Its run id is chosen here so that the `run.created` failpoint can
    watch the run's first event: Dagster stores the run (NOT_STARTED) and logs its planned
    materializations before it starts it, the window a kill leaves a run that never started."""
    run_id = str(uuid.uuid4())
    instance.add_event_listener(run_id, lambda _event: failpoint("run.created"))
    return job.execute_in_process(
        instance=instance,
        partition_key=partition_key,
        run_config=console(log_file),
        tags=tags,
        raise_on_error=False,
        run_id=run_id,
    )


def crash_log(exc: BaseException) -> Path:
    """The traceback of `exc` in FLYWHEEL_HOME/logs (or the temp folder if the home cannot take it)."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(exc))
    name = f"crash-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    try:
        folder = flywheel_home() / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
        return folder / name
    except (OSError, ConfigError):
        path = Path(tempfile.gettempdir()) / f"flywheel-{name}"
        path.write_text(text)
        return path


def champion_label(champion) -> str:
    if champion is None:
        return "none"
    stage, round_ = champion.tags.get("stage"), champion.tags.get("round")
    return f"version {champion.version} ({'RL round ' + round_ if round_ else stage})"


def peak_rss_gb() -> float:
    """Peak resident memory of this process (the in-process executor runs every step here) and of
    its largest waited-for child (a multiprocess step, an SFT launched through Pipes), in GB."""
    import resource

    return max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 2**20


def paired_by(
    group_of: dict[str, str], after: dict[str, float], before: dict[str, float], confidence: float
) -> dict[str, tuple]:
    """paired_difference(after - before) within each group of tasks (a family, a family's level)."""
    from training.evaluate import paired_difference

    return {
        group: paired_difference(
            {t: s for t, s in after.items() if group_of[t] == group},
            {t: s for t, s in before.items() if group_of[t] == group},
            confidence,
        )
        for group in sorted(set(group_of.values()))
    }


def flywheel_runs(instance) -> list:
    """The runs of the latest flywheel (the one the newest tagged run belongs to), newest first."""
    from dagster import RunsFilter

    latest = next((r for r in instance.get_runs(limit=100) if FLYWHEEL_TAG in r.tags), None)
    return instance.get_runs(filters=RunsFilter(tags={FLYWHEEL_TAG: latest.tags[FLYWHEEL_TAG]})) if latest else []


def rounds_of(runs: list, job_name: str) -> list[str]:
    """Round partitions the flywheel completed, in the order it ran them (a round re-executed
    after a failure counts once)."""
    from dagster import DagsterRunStatus

    keys = [
        r.tags["dagster/partition"]
        for r in reversed(runs)
        if r.job_name == job_name and r.status == DagsterRunStatus.SUCCESS
    ]
    return list(dict.fromkeys(keys))


def fail_dead_runs(instance) -> list[str]:
    """Mark failed the runs this machine started whose process is gone (killed, crashed, machine
    restarted): Dagster's run monitoring does this for runs its daemon launched; `make run`
    executes in its own process. A failed run can then be re-executed from failure, here
    (`--resume`) or in the Dagster UI."""
    from dagster import DagsterRunStatus, RunsFilter

    failed = []
    # NOT_STARTED too: a process killed in the moment between Dagster creating its run and starting
    # it leaves the run NOT_STARTED forever, and such a run can be neither resumed nor re-executed
    statuses = [DagsterRunStatus.STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.NOT_STARTED]
    for run in instance.get_runs(filters=RunsFilter(statuses=statuses)):
        pid = run.tags.get(PID_TAG)
        if pid is None or run.tags.get(HOST_TAG) != socket.gethostname() or _alive(int(pid)):
            continue
        instance.report_run_failed(
            run, message=f"the process running it (pid {pid} on {run.tags[HOST_TAG]}) is gone: killed or crashed"
        )
        failed.append(run.run_id)
    return failed


def _finished(instance, run_id: str) -> bool:
    """Whether the Dagster run `run_id` is over (succeeded, failed, canceled) or unknown here."""
    run = instance.get_run_by_id(run_id)
    return run is None or run.is_finished


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def reexecute_from_failure(instance, parent, tags: dict, log_file: Path):
    """Dagster's re-execution from failure: the steps that did not succeed in `parent` (and what
    depends on them) run again, reading the others' stored outputs. The job is rebuilt from
    pipelines/definitions.py, as the UI's "Re-execute from failure" does."""
    from dagster import ReexecutionOptions, execute_job, reconstructable

    from pipelines import definitions

    job = definitions.foundation_job if parent.job_name == definitions.FOUNDATION_JOB else definitions.rl_round_job
    return execute_job(
        reconstructable(job),
        instance,
        run_config=console(log_file),
        tags={**{k: v for k, v in parent.tags.items() if not k.endswith("_run_id")}, **tags},
        reexecution_options=ReexecutionOptions.from_failure(parent.run_id, instance),
    )


def failure_message(result, what: str, log_file: Path | None = None) -> str:
    lines = [
        f"[flywheel] {what} failed; nothing downstream of the failure was materialized. "
        "Fix the cause, then `make resume` continues from the failure."
    ]
    for event in result.all_events:
        if event.is_step_failure:
            error = event.event_specific_data.error
            lines.append(f"  step {event.step_key}: {(error.cause or error).message.strip()}")
        elif event.event_type_value == "ASSET_CHECK_EVALUATION" and not event.event_specific_data.passed:
            evaluation = event.event_specific_data
            details = "\n".join(f"    {line}" for line in (evaluation.description or "").splitlines())
            lines.append(
                f"  check {evaluation.check_name} on {evaluation.asset_key.to_user_string()} failed:\n{details}"
            )
    if log_file is not None:
        lines.append(f"  full text, tracebacks included: {log_file}")
    return "\n".join(lines)


def report(outcome: dict) -> str:
    sft, rounds = outcome["sft"], outcome["rounds"]
    final = rounds[-1] if rounds else sft
    cfg, home = outcome["cfg"], outcome["home"]
    keys = outcome.get("round_keys") or [str(i) for i in range(1, len(rounds) + 1)]
    last_label = f"last round (RL round {keys[-1]})" if rounds else "SFT"
    ks = [k for k in cfg.benchmark.pass_at_k if f"pass_at_{k}" in final]
    rows = [
        (
            "checkpoint",
            "version",
            "pass@1 (sampled) [95% CI]",
            *(f"pass@{k} [95% CI]" for k in ks),
            "greedy",
            "tool-call rate",
            "gate",
        )
    ]
    checkpoints = (
        ([("base (zero-shot)", outcome["base"])] if "base" in outcome else [])
        + [("SFT", sft)]
        + [(f"RL round {key}", r) for key, r in zip(outcome.get("round_keys") or range(1, len(rounds) + 1), rounds)]
    )
    for label, s in checkpoints:
        gate = ("promoted" if s["promoted"] else "not promoted") if "promoted" in s else "not registered"
        rows.append(
            (
                label,
                s.get("version", "-"),
                _with_ci(s, "pass_at_1"),
                *(_with_ci(s, f"pass_at_{k}") for k in ks),
                f"{s['greedy_pass_at_1']:.3f}",
                f"{s['tool_call_rate']:.2f}",
                gate,
            )
        )
    table = _columns(rows)
    tracking = cfg.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home}/mlflow.db"
    return "\n".join(
        [
            "",
            table,
            "",
            "{} - SFT pass@1: {:+.3f} [{:+.3f}, {:+.3f}] (paired 95% CI over the same tasks)".format(
                last_label, *outcome["gain"]
            ),
            *(
                [
                    "champion ({}) - SFT pass@1: {:+.3f} [{:+.3f}, {:+.3f}] (paired 95% CI)".format(
                        outcome["champion"], *outcome["champion_gain"]
                    )
                ]
                if outcome.get("champion_gain")
                else []
            ),
            took(outcome),
            *(
                ["SFT - base pass@1: {:+.3f} [{:+.3f}, {:+.3f}] (paired 95% CI)".format(*outcome["base_gain"])]
                if "base_gain" in outcome
                else []
            ),
            "",
            group_table(outcome),
            "",
            *([suite_table(cfg.benchmark.suites, checkpoints), ""] if cfg.benchmark.suites else []),
            f"champion: {cfg.tracking.registered_model}@champion -> {outcome['champion']}",
            f"MLflow:   {tracking}   (make mlflow-ui, then http://localhost:5000)",
            f"Dagster:  {home}/dagster   (make dagster-ui, then http://localhost:3000)",
        ]
    )


def took(outcome: dict) -> str:
    """Wall time: this invocation, and the flywheel's since its first run when it was resumed."""
    line = f"this run took {outcome['minutes']:.1f} min"
    whole = outcome.get("flywheel_minutes")
    if whole is not None and whole - outcome["minutes"] > 0.5:
        line += f" (the flywheel {whole:.1f} min since its first run started, with its stops)"
    return line + f", peak RSS {outcome.get('peak_rss_gb', float('nan')):.1f} GB"


def _with_ci(s: dict, metric: str) -> str:
    return f"{s[metric]:.3f} [{s[metric + '_ci_low']:.3f}, {s[metric + '_ci_high']:.3f}]" if metric in s else "-"


def _columns(rows: list) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows)


def suite_table(suites: dict, checkpoints: list[tuple[str, dict]]) -> str:
    """Each benchmark suite (e.g. HumanEval) by checkpoint: pass@1 and pass@k with 95% CIs, and the
    problems whose prompt did not fit the suite's budget (scored 0). Not part of the gate."""
    rows = [("suite (not gated)", "checkpoint", "pass@1 [95% CI]", "pass@k [95% CI]", "tasks", "over budget")]
    for name, suite in suites.items():
        for label, s in checkpoints:
            if f"{name}.pass_at_1" in s:
                at_k = ", ".join(f"@{k} {_with_ci(s, f'{name}.pass_at_{k}')}" for k in suite.pass_at_k) or "-"
                rows.append(
                    (
                        name,
                        label,
                        _with_ci(s, f"{name}.pass_at_1"),
                        at_k,
                        f"{s[f'{name}.num_tasks']:.0f}",
                        f"{s[f'{name}.over_budget']:.0f}",
                    )
                )
    return _columns(rows)


def group_table(outcome: dict) -> str:
    """pass@1 by family and by family level for each checkpoint, with the paired gains (95% CI)."""
    sft, final = outcome["sft"], (outcome["rounds"] or [outcome["sft"]])[-1]
    base = outcome.get("base")
    head = (
        ["tasks"]
        + (["base"] if base else [])
        + ["SFT", "last round", "tool calls SFT -> last round"]
        + (["SFT - base"] if base else [])
        + ["last round - SFT"]
    )
    rows = [head]
    for group, (d, lo, hi) in {**outcome["gains"], **outcome["level_gains"]}.items():
        key = group.replace(" ", "/")
        rows.append(
            [group]
            + ([f"{base[key + '/pass_at_1']:.3f}"] if base else [])
            + [
                f"{sft[key + '/pass_at_1']:.3f}",
                f"{final[key + '/pass_at_1']:.3f}",
                f"{sft[key + '/tool_call_rate']:.2f} -> {final[key + '/tool_call_rate']:.2f}",
            ]
            + (
                [
                    "{:+.3f} [{:+.3f}, {:+.3f}]".format(
                        *outcome["base_gains"].get(group) or outcome["base_level_gains"][group]
                    )
                ]
                if base
                else []
            )
            + [f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--profile",
        default=None,
        help="profile (default: the one this home's flywheel runs with; for a new home FLYWHEEL_PROFILE or tiny)",
    )
    parser.add_argument("--seed", type=int, help="seeds task generation, model init, SFT and RL")
    parser.add_argument(
        "--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override a profile value"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the last flywheel: re-execute its failed or killed run from "
        "failure, then run the rounds it had left (its own profile and overrides)",
    )
    args = parser.parse_args(argv)
    try:
        overrides = dict(parse_override(o) for o in args.set)
        if args.seed is not None:
            overrides.update({"seed": args.seed, "data.seed": args.seed})
        outcome = run_flywheel(args.profile, overrides, resume=args.resume)
    except (ConfigError, HomeError) as exc:
        print(f"[flywheel] {exc}", file=sys.stderr)
        return 2
    except Busy as exc:
        print(f"[flywheel] refused: {exc.description}", file=sys.stderr)
        return 3
    except Exception as exc:  # noqa: BLE001 - outside any step (a step's failure is a SystemExit with its summary)
        log = crash_log(exc)
        print(
            f"[flywheel] failed: {type(exc).__name__}: {exc}\n  traceback: {log}\n"
            "  Fix the cause, then `make resume` continues from where it stopped.",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print(
            "\n[flywheel] interrupted. `make resume` continues from where it stopped (completed steps are kept).",
            file=sys.stderr,
        )
        return 130
    print(report(outcome))
    Path(outcome["home"], "last_run.json").write_text(
        json.dumps({k: v for k, v in outcome.items() if k != "cfg"}, indent=1, default=str)
    )
    return 0


if __name__ == "__main__":
    from pipelines.console import relay_ctrl_c

    relay_ctrl_c()
    sys.exit(main())

"""`make run`: the default flywheel on this machine, through Dagster, recorded in MLflow.

    python -m pipelines.run --profile tiny [--seed 1] [--set rl.rounds=3 ...]

1. validate the profile (fails before any work, naming field and value);
2. point Dagster (DAGSTER_HOME) and MLflow at FLYWHEEL_HOME, so `dagster dev` and
   `mlflow ui` show these runs;
3. materialize the foundation job (tasks -> SFT -> SFT benchmark), then each RL round as a
   new partition of the round job (rollouts -> rewards -> checkpoint -> benchmark -> gate);
4. print SFT vs final RL pass@1, the champion, and where the state is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from configs import ConfigError, flywheel_home, load_profile, parse_override
from pipelines.instance import LOCAL_SETTINGS


OLD_INSTANCE_SETTINGS = "telemetry:\n  enabled: false\n"  # what earlier versions wrote; upgraded in place
def prepare_home(home: Path) -> None:
    """Dagster's sqlite instance lives in FLYWHEEL_HOME/dagster; created on first use."""
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    settings = dagster_home / "dagster.yaml"
    if not settings.exists() or settings.read_text() == OLD_INSTANCE_SETTINGS:
        settings.write_text(LOCAL_SETTINGS)
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight loading/saving bars would drown the progress lines


# Progress lines (INFO) on the console; Dagster's per-event DEBUG lines stay in the UI's run log.
CONSOLE = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


def run_flywheel(profile: str, overrides: dict) -> dict:
    cfg = load_profile(profile, overrides)  # 1. validate before anything starts
    home = flywheel_home()
    prepare_home(home)  # 2.
    from dagster import DagsterInstance

    from assets.rl import next_round, rl_rounds
    from pipelines.definitions import FOUNDATION_JOB, RL_ROUND_JOB, build_definitions
    from pipelines.resources import resources_for
    from training.evaluate import paired_difference

    defs = build_definitions(profile, overrides)
    instance = DagsterInstance.get()
    started = time.perf_counter()
    # 3. foundation, then rounds
    print(f"[flywheel] profile={profile} home={home}: foundation (tasks, tokenizer, SFT, SFT benchmark)", flush=True)
    result = defs.resolve_job_def(FOUNDATION_JOB).execute_in_process(instance=instance, run_config=CONSOLE, raise_on_error=False)
    if not result.success:
        raise SystemExit(failure_message(result, FOUNDATION_JOB))
    sft_scores = result.output_for_node("sft_benchmark_scores")
    rounds = []
    for _ in range(cfg.rl.rounds):
        key = str(next_round(instance))
        instance.add_dynamic_partitions(rl_rounds.name, [key])
        print(f"[flywheel] RL round {key} ({cfg.rl.steps_per_round} steps)", flush=True)
        result = defs.resolve_job_def(RL_ROUND_JOB).execute_in_process(instance=instance, partition_key=key, run_config=CONSOLE, raise_on_error=False)
        if not result.success:
            raise SystemExit(failure_message(result, f"{RL_ROUND_JOB} partition {key}"))
        rounds.append(result.output_for_node("benchmark_scores"))
    tracker = resources_for(cfg, overrides)["tracker"]
    champion = tracker.version_by_alias("champion")
    final = rounds[-1] if rounds else sft_scores
    final_scores, sft_per_task = (tracker.load_json(s["mlflow_run_id"], "per_task_scores.json") for s in (final, sft_scores))
    gain = paired_difference(final_scores, sft_per_task, cfg.benchmark.confidence)
    family_of = dict(zip(*defs.load_asset_value("benchmark_tasks", instance=instance)[["task_id", "family"]].T.values))
    gains = {family: paired_difference({t: s for t, s in final_scores.items() if family_of[t] == family},
                                       {t: s for t, s in sft_per_task.items() if family_of[t] == family}, cfg.benchmark.confidence)
             for family in sorted(set(family_of.values()))}
    return {"sft": sft_scores, "rounds": rounds, "gain": gain, "gains": gains, "minutes": (time.perf_counter() - started) / 60, "home": str(home), "cfg": cfg,
            "champion": f"version {champion.version} (stage {champion.tags.get('stage')}, round {champion.tags.get('round') or '-'})" if champion else "none"}


def failure_message(result, what: str) -> str:
    lines = [f"[flywheel] {what} failed; nothing downstream of the failure was materialized."]
    for event in result.all_events:
        if event.is_step_failure:
            error = event.event_specific_data.error
            lines.append(f"  step {event.step_key}: {(error.cause or error).message.strip()}")
        elif event.event_type_value == "ASSET_CHECK_EVALUATION" and not event.event_specific_data.passed:
            evaluation = event.event_specific_data
            details = "\n".join(f"    {line}" for line in (evaluation.description or "").splitlines())
            lines.append(f"  check {evaluation.check_name} on {evaluation.asset_key.to_user_string()} failed:\n{details}")
    return "\n".join(lines)


def report(outcome: dict) -> str:
    sft, rounds = outcome["sft"], outcome["rounds"]
    final = rounds[-1] if rounds else sft
    rows = [("checkpoint", "version", "pass@1 (sampled) [95% CI]", "greedy", "tool-call rate", "gate")]
    for label, s in [("SFT", sft)] + [(f"RL round {i + 1}", r) for i, r in enumerate(rounds)]:
        gate = "promoted" if s["promoted"] else "not promoted"
        rows.append((label, s["version"], f"{s['pass_at_1']:.3f} [{s['pass_at_1_ci_low']:.3f}, {s['pass_at_1_ci_high']:.3f}]",
                     f"{s['greedy_pass_at_1']:.3f}", f"{s['tool_call_rate']:.2f}", gate))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows)
    cfg, home = outcome["cfg"], outcome["home"]
    tracking = cfg.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home}/mlflow.db"
    return "\n".join([
        "", table, "",
        "final RL - SFT pass@1: {:+.3f} [{:+.3f}, {:+.3f}] (paired 95% CI over the same tasks); flywheel took {:.1f} min".format(*outcome["gain"], outcome["minutes"]),
        *(f"  {family:<10} pass@1 {sft[family + '/pass_at_1']:.3f} -> {final[family + '/pass_at_1']:.3f}: {d:+.3f} [{lo:+.3f}, {hi:+.3f}]; "
          f"tool-call rate {sft[family + '/tool_call_rate']:.2f} -> {final[family + '/tool_call_rate']:.2f}"
          for family, (d, lo, hi) in outcome["gains"].items()),
        f"champion: {cfg.tracking.registered_model}@champion -> {outcome['champion']}",
        f"MLflow:   {tracking}   (make mlflow-ui, then http://localhost:5000)",
        f"Dagster:  {home}/dagster   (make dagster-ui, then http://localhost:3000)",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=os.environ.get("FLYWHEEL_PROFILE", "tiny"))
    parser.add_argument("--seed", type=int, help="seeds task generation, model init, SFT and RL")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override a profile value")
    args = parser.parse_args(argv)
    try:
        overrides = dict(parse_override(o) for o in args.set)
        if args.seed is not None:
            overrides.update({"seed": args.seed, "data.seed": args.seed})
        outcome = run_flywheel(args.profile, overrides)
    except ConfigError as exc:
        print(f"[flywheel] {exc}", file=sys.stderr)
        return 2
    print(report(outcome))
    Path(outcome["home"], "last_run.json").write_text(json.dumps({k: v for k, v in outcome.items() if k != "cfg"}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

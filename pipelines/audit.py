"""`make audit`: re-score a stored round with a stricter verifier (assets/audit.py, docs/verifiers.md).

    python -m pipelines.audit --round 2 [--config-json '{"ops": {"reward_audit": {"config": {...}}}}']

It materializes the round's `reward_audit` partition through Dagster (the run is in the UI, its
metrics in MLflow) with the settings the home's flywheel runs with (pipelines/home.py), prints the
progress lines and then the result: how many outcomes the audit scored differently, by kind, and
where to read them. The full run log goes to FLYWHEEL_HOME/logs/audit-round-<N>.log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from assets.locks import Busy
from configs import ConfigError, load_profile, parse_override
from pipelines.home import HomeError, located, settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.audit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--round", required=True, help="the round (partition) to audit, e.g. 1")
    parser.add_argument(
        "--config-json", default=None, help="Dagster run config for the asset (its audit overrides, examples shown)"
    )
    parser.add_argument("--profile", default=None, help="profile (default: the one this home's flywheel runs with)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="profile override")
    args = parser.parse_args(argv)
    try:
        extra = json.loads(args.config_json) if args.config_json else {}
    except json.JSONDecodeError as exc:
        print(f"error: CONFIG is not valid JSON ({exc})", file=sys.stderr)
        return 2
    try:
        home = located()
        profile, overrides = settings(home, args.profile, dict(parse_override(item) for item in args.set))
        load_profile(profile, overrides)
        return audit(home, profile, overrides, args.round, extra)
    except (ConfigError, HomeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Busy as exc:
        print(f"error: {exc.description}", file=sys.stderr)
        return 3


def audit(home, profile: str, overrides: dict, round_key: str, extra: dict) -> int:
    from dagster import DagsterInstance

    from pipelines.definitions import AUDIT_JOB, build_definitions
    from pipelines.run import console, failure_message, prepare_home

    prepare_home(home)
    os.environ["FLYWHEEL_PROFILE"], os.environ["FLYWHEEL_OVERRIDES"] = profile, json.dumps(overrides)
    defs = build_definitions(profile, overrides)
    instance = DagsterInstance.get()
    rounds = instance.get_dynamic_partitions("rl_round")
    if round_key not in rounds:
        print(f"error: no round {round_key!r} in {home} (rounds: {', '.join(rounds) or 'none yet'})", file=sys.stderr)
        return 2
    log_file = home / "logs" / f"audit-round-{round_key}.log"
    result = defs.resolve_job_def(AUDIT_JOB).execute_in_process(
        instance=instance,
        partition_key=round_key,
        run_config={**extra, **console(log_file)},
        raise_on_error=False,
    )
    if not result.success:
        print(failure_message(result, f"audit of round {round_key}", log_file), file=sys.stderr)
        return 1
    metadata = result.asset_materializations_for_node("reward_audit")[0].metadata
    value = {k: getattr(v, "value", v) for k, v in metadata.items()}
    print(
        f"audit of round {round_key} ({profile}): {value['disagreements']} of {value['rows_rescored']} outcomes "
        f"scored differently (training only {value['training_only']}, audit only {value['audit_only']}, "
        f"scorability {value['scorability']})\n"
        f"  examples and the per-tier table: the reward_audit asset, partition {round_key}, in the Dagster UI "
        f"(make dagster-ui); metrics: MLflow run {value['mlflow_run_id']} (make mlflow-ui)"
    )
    return 0


if __name__ == "__main__":
    from pipelines.console import relay_ctrl_c

    relay_ctrl_c()
    sys.exit(main())

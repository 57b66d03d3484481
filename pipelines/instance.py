"""The Dagster instance (dagster.yaml) a profile runs on.

Local profiles: sqlite under FLYWHEEL_HOME/dagster, written on first use by `make run` and
`make dagster-ui` (run monitoring, run retries and the run queue's one-run-per-round limit act
where the daemon runs).

The `cluster` profile: run, event-log and schedule storage in Postgres (the RDS instance
infra/terraform creates; its address and credentials reach the pods as env vars from the
`orchestration.k8s.env_secret` secret), runs launched as Kubernetes jobs (K8sRunLauncher) through
the queued run coordinator (one run per round partition at a time), the same monitoring and
retries, and the `gpu` pool limited to the GPU node group's size so queued GPU steps wait for a
slot instead of a node. Print it with

    python -m pipelines.instance --profile cluster > dagster.yaml

(the Helm release's instance ConfigMap).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from configs import ConfigError, FlywheelConfig, load_profile, parse_override

DAGSTER_HOME_IN_POD = "/opt/dagster/dagster_home"
INSTANCE_CONFIG_MAP = (
    "dagster-instance"  # the ConfigMap holding this file, mounted at DAGSTER_HOME in run and step pods
)

# Shared by both: fail runs that exceed their dagster/max_runtime tag or hang while starting, and
# re-execute a crashed run from its failure once (completed steps are kept). Failing steps have
# their own RetryPolicy (assets/policies.py), so a step failure does not also retry the run.
RUN_MONITORING = {"enabled": True, "start_timeout_seconds": 300, "poll_interval_seconds": 60}
RUN_RETRIES = {"enabled": True, "max_retries": 1, "retry_on_asset_or_op_failure": False}

# One run per round at a time: a second launch of a round that is queued or running (from the UI,
# a backfill, the schedule, a sensor) waits in the run queue until the first is over, instead of
# training, writing and promoting the same round twice at once. `dagster/partition` is the tag
# Dagster puts on every partitioned run, and the only partitions are rounds (the round job and the
# reward audit, which so waits for the round it audits). Runs executed in-process (`make run`)
# bypass the queue; the round's lock (assets/locks.py) refuses them instead.
ROUND_RUN_LIMITS = [{"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}]

# The local instance. The daemon (`make dagster-ui` runs one) enforces what is here; `make run`
# executes in-process and relies on the assets' own retry policies and resumable state.
LOCAL_SETTINGS = yaml.safe_dump(
    {
        "telemetry": {"enabled": False},
        "run_monitoring": RUN_MONITORING,
        "run_retries": RUN_RETRIES,
        "concurrency": {"runs": {"tag_concurrency_limits": ROUND_RUN_LIMITS}},
    },
    sort_keys=False,
)


def cluster_settings(cfg: FlywheelConfig) -> dict[str, Any]:
    k8s = cfg.orchestration.k8s
    postgres = {field: {"env": var} for field, var in k8s.postgres_env.items()}
    launcher: dict[str, Any] = {
        "job_namespace": k8s.namespace,
        "service_account_name": k8s.service_account,
        "load_incluster_config": True,
        "instance_config_map": INSTANCE_CONFIG_MAP,
        "dagster_home": DAGSTER_HOME_IN_POD,
        "env_secrets": [k8s.env_secret] if k8s.env_secret else [],
    }
    if k8s.image:
        launcher["job_image"] = k8s.image
    return {
        "telemetry": {"enabled": False},
        "storage": {"postgres": {"postgres_db": {**postgres, "port": 5432}}},
        "run_launcher": {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": launcher},
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"},
        # `gpu` is the only pool the assets use
        "concurrency": {
            "runs": {"max_concurrent_runs": k8s.max_concurrent_runs, "tag_concurrency_limits": ROUND_RUN_LIMITS},
            "pools": {"granularity": "op", "default_limit": k8s.gpu_pool_limit},
        },
        "run_monitoring": RUN_MONITORING,
        "run_retries": RUN_RETRIES,
    }


def instance_yaml(cfg: FlywheelConfig) -> str:
    if cfg.orchestration.executor != "k8s":
        return LOCAL_SETTINGS
    return (
        f"# Dagster instance of the {cfg.profile!r} profile (python -m pipelines.instance --profile {cfg.profile})\n"
        + yaml.safe_dump(cluster_settings(cfg), sort_keys=False)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.instance", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default=None, help="profile (default: FLYWHEEL_PROFILE or tiny)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="profile override, e.g. orchestration.k8s.gpu_pool_limit=8",
    )
    args = parser.parse_args(argv)
    try:
        cfg = load_profile(args.profile, dict(parse_override(item) for item in args.set))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    sys.stdout.write(instance_yaml(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())

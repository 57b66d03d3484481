"""One launch of an RL round partition in its own process, so tests/assets/test_concurrency.py can start
two launches of the same round at the same moment (on the shared FLYWHEEL_HOME instance).

    python tests/workers/round_launch_worker.py --round 1 --go GO_FILE --out result.json [--set key=value ...]

DAGSTER_HOME and FLYWHEEL_HOME come from the environment. Everything is imported and the definitions are built first; the launch starts once GO_FILE exists,
so two workers released by one file reach the round within milliseconds of each other.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from configs import parse_override  # noqa: E402
from pipelines.definitions import RL_ROUND_JOB, build_definitions  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--round", required=True)
    parser.add_argument("--go", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    from dagster import DagsterInstance

    job = build_definitions("micro", dict(parse_override(item) for item in args.set)).resolve_job_def(RL_ROUND_JOB)
    instance = DagsterInstance.get()
    print("ready", flush=True)
    while not args.go.exists():
        time.sleep(0.01)
    result = job.execute_in_process(instance=instance, partition_key=args.round, raise_on_error=False)
    failures = [
        {"step": e.step_key, "class": e.step_failure_data.error.cls_name, "message": e.step_failure_data.error.message}
        for e in result.all_events
        if e.is_step_failure
    ]
    retried = [e.step_key for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    args.out.write_text(
        json.dumps({"success": result.success, "run_id": result.run_id, "failures": failures, "retried": retried})
    )


if __name__ == "__main__":
    main()

"""One registry operation in its own process, so tests/assets/test_concurrency.py can race several
against the same MLflow sqlite store (FLYWHEEL_HOME/mlflow.db, profile micro).

    python tests/workers/registry_worker.py --go GO_FILE promote VERSION...        # `make promote`, through the gate
    python tests/workers/registry_worker.py --go GO_FILE register FOLDER URI RUN   # the benchmark's registration

Everything is imported first; the operation starts once GO_FILE exists. `promote` promotes each
VERSION from its own thread, all at once, and prints `VERSION: promoted` or `VERSION: <refusal>`
per line; `register` prints the version number it got.
"""

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlflow  # noqa: E402

from configs import load_profile  # noqa: E402
from pipelines.resources import resources_for  # noqa: E402
from tests.registry_support import folder_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--go", type=Path, required=True)
    parser.add_argument("command", choices=["promote", "register"])
    parser.add_argument("args", nargs="+")
    args = parser.parse_args()
    cfg = load_profile("micro")
    tracker = resources_for(cfg)["tracker"]
    tracker.client()
    if args.command == "promote":
        # torch and transformers (the gate's module): only where needed
        from pipelines.registry import (
            RegistryError,
            promote,
        )
    print("ready", flush=True)
    while not args.go.exists():
        time.sleep(0.005)
    if args.command == "promote":
        outcome: dict[str, str] = {}
        start = threading.Barrier(len(args.args))

        def attempt(version: str) -> None:
            start.wait()
            try:
                promote(tracker, version, cfg)
                outcome[version] = "promoted"
            except RegistryError as exc:
                outcome[version] = str(exc)

        threads = [threading.Thread(target=attempt, args=(v,)) for v in args.args]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print("\n".join(f"{v}: {outcome[v]}" for v in args.args), flush=True)
        return 0
    folder, uri, run = args.args
    mlflow.set_experiment(tracker.experiment)
    with mlflow.start_run() as mlflow_run:  # each benchmark step registers from its own run
        version = tracker.register_model(
            mlflow_run.info.run_id,
            folder_model(tracker, mlflow_run.info.run_id, Path(folder)),
            {"stage": "rl", "round": "1", "checkpoint_uri": uri, "checkpoint_run": run},
        )
    print(f"version {version.version}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Serve a registry version as the agent over HTTP (`make serve`): MLflow's own scoring app (what
`mlflow models serve` runs) on the agent model (training/agent/served.py) of the version the alias
points at when the server starts, behind a front that caps, checks and times requests
(pipelines/serve_http.py: requests are hostile network input).

    python -m pipelines.serve [--alias champion | --version N] [--host 127.0.0.1] [--port 8080]

Every request the agent runs is traced (MLflow traces a ResponsesAgent) into the flywheel's
experiment: the MLflow UI's Traces tab shows each question, its tool calls and the answer. A
refused request (over --max-body-bytes: 413; not JSON, not a Responses-API request, or one the
agent refuses, such as a question longer than its context: 400) is answered `{"error": reason}`
before the agent sees it, and is not traced; no reply carries a stack trace. The version is resolved once, at start: the server keeps serving it, and says which it is in every
response (`custom_outputs.model_version`). After `make rollback`, a new `make serve` serves the
previous champion. The engine is the one the version's profile rolled out with (`rollout.engine`:
HF on the CPU profiles, vLLM where the profile says so), or `--engine`.

    curl -s http://127.0.0.1:8080/invocations -H 'Content-Type: application/json' \\
      -d '{"input": [{"role": "user", "content": "What is 17 * 23 + 4?"}], "custom_inputs": {"family": "arithmetic"}}'

Versions registered before versions were MLflow models (their source is a plain checkpoint folder)
cannot be served; the command says so and names the versions that can.
"""

from __future__ import annotations

import argparse
import os
import sys

from assets.locks import Busy
from assets.tracking import CHAMPION, MLflowTracker
from configs import ConfigError, parse_override
from pipelines.home import HomeError, config_for, located
from pipelines.registry import RegistryError, tracker_for, version_named
from pipelines.serve_http import DEFAULT_MAX_BODY_BYTES
from training.agent.served import ENGINE_ENV, VERSION_ENV

REQUEST_TIMEOUT_S = 600  # one request is one whole episode: several turns and tool calls


def is_agent_model(version) -> bool:
    """Registered from a logged model (assets/agent_model.py), not from a plain checkpoint folder."""
    return version.source.startswith("models:/m-")


def servable_version(tracker: MLflowTracker, alias: str | None, version: str | None):
    """The version to serve: `version`, or the one `alias` points at."""
    if version is not None:
        chosen = version_named(tracker, version)
    else:
        chosen = tracker.version_by_alias(alias)
        if chosen is None:
            raise RegistryError(
                f"registered model {tracker.registered_model!r} has no {alias!r} alias yet (run `make run`)"
            )
    if not is_agent_model(chosen):
        servable = [str(v.version) for v in tracker.versions() if is_agent_model(v)]
        raise RegistryError(
            f"version {chosen.version} was registered before versions were MLflow models (its source "
            f"{chosen.source} is a plain checkpoint folder) and cannot be served; versions that can: "
            f"{', '.join(servable) or 'none yet (the next benchmarked checkpoint will be one)'}"
        )
    return chosen


def serve_command(
    tracker: MLflowTracker,
    version,
    host: str,
    port: int,
    workers: int,
    engine: str | None = None,
    *,
    model_path: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> tuple[list[str], dict]:
    """The server's command line and its environment (`model_path`: the version's model,
    downloaded; `engine`: instead of the profile's)."""
    env = {
        **os.environ,
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "MLFLOW_TRACKING_URI": tracker.tracking_uri,
        # each request's trace (MLflow traces a ResponsesAgent's predict) goes to the flywheel's
        # experiment, under the home's artifacts, not to a Default experiment in the working directory
        "MLFLOW_EXPERIMENT_NAME": tracker.experiment,
        # written before the reply goes out: a server stopped right after a request keeps its trace
        "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "false",
        VERSION_ENV: str(version.version),
        "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S),
        **({ENGINE_ENV: engine} if engine else {}),
    }
    # this environment, as `mlflow models serve --env-manager local`: the model's requirements are
    # pinned to it (assets/agent_model.py)
    command = [
        sys.executable,
        "-m",
        "pipelines.serve_http",
        "--model-path",
        model_path,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--max-body-bytes",
        str(max_body_bytes),
    ]
    return command, env


def downloaded(tracker: MLflowTracker, version) -> str:
    """The version's model folder, downloaded from the registry (as `mlflow models serve` does)."""
    import mlflow.artifacts

    return mlflow.artifacts.download_artifacts(
        artifact_uri=f"models:/{tracker.registered_model}/{version.version}", tracking_uri=tracker.tracking_uri
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="profile (default: the one this home's flywheel runs with, its overrides too; else FLYWHEEL_PROFILE or tiny)",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="profile override")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--alias", default=CHAMPION, help="serve the version this alias points at (default: champion)")
    which.add_argument("--version", default=None, help="serve this version")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default: this machine only)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=1, help="server processes, each with its own model copy")
    parser.add_argument(
        "--engine",
        choices=("hf", "vllm"),
        default=None,
        help="rollout engine to serve with (default: the version's profile's rollout.engine)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="a request body over this is refused (413) before anything reads it",
    )
    args = parser.parse_args(argv)
    try:
        located()  # a moved home's stored paths rewritten before MLflow reads them
        cfg = config_for(args.profile, dict(parse_override(item) for item in args.set))
        tracker = tracker_for(cfg)
        version = servable_version(tracker, None if args.version else args.alias, args.version)
    except (RegistryError, LookupError, ConfigError, HomeError, Busy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    model_path = downloaded(tracker, version)
    command, env = serve_command(
        tracker,
        version,
        args.host,
        args.port,
        args.workers,
        args.engine,
        model_path=model_path,
        max_body_bytes=args.max_body_bytes,
    )
    print(
        f"serving models:/{tracker.registered_model}/{version.version}"
        + (f" ({args.alias})" if not args.version else "")
        + f" on http://{args.host}:{args.port}/invocations",
        flush=True,
    )
    os.execve(command[0], command, env)  # the server is this process: Ctrl-C and signals reach it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

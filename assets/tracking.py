"""MLflow as a Dagster resource: one run per asset materialization, the model registry with
aliases (`champion`, `challenger`), and the per-task scores the promotion gate compares.

Runs nest under one parent per round (`round-3`: the RL round, its benchmark, any reward audit)
or per foundation run (`foundation-1a2b3c4d`: SFT and its benchmark), so the MLflow UI shows the
flywheel as rounds that expand into their steps, and the parent carries the round's headline
figures and the benchmark table.

Every call to the store is retried while the store is unavailable (a sqlite file another process
holds locked, a tracking server restarting): exponential back-off, bounded in attempts and time
(assets/retry.py), then `StoreUnavailable` naming the tracking URI and the operation. Metrics are
never dropped: a write either lands or fails the step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from dagster import ConfigurableResource

from assets.locks import exclusive
from assets.retry import Backoff, StoreUnavailable, call_with_retries

CHAMPION, CHALLENGER = "champion", "challenger"
CHAMPION_HISTORY_TAG = "champion_history"  # registered-model tag: JSON list of champion versions, oldest first
HISTORY_KEPT = 200  # entries; MLflow tag values are capped at a few thousand characters
GROUP_TAG = "flywheel.group"  # on a parent run and its children: round-N or foundation-<dagster run>
PARENT_RUN_ID_TAG = "mlflow.parentRunId"  # what the MLflow UI nests by
MODEL_VERSIONS_TAG = "mlflow.modelVersions"  # on a logged model: the registry versions made from it
# A checkpoint's identity in the registry: where it is stored and the Dagster run that wrote it (its manifest's `dagster_run_id`).
CHECKPOINT_KEY = ("checkpoint_uri", "checkpoint_run")
UNCHECKED = object()  # `promote(expected=...)` left out: move the alias whoever holds it (`--force`)
# The registry's critical sections take well under a second; a holder retrying an unavailable store (RETRY) can take longer.
REGISTRY_LOCK_WAIT_S = 300.0
# How long a call keeps trying an unavailable store. Each attempt over HTTP already includes
# MLflow's own per-request retries (MLFLOW_HTTP_REQUEST_MAX_RETRIES, 7 by default, ~4 min), and
# each attempt on sqlite waits up to 20 s for a lock (MLflow's busy_timeout).
RETRY = Backoff(attempts=6, first_delay_s=1.0, max_delay_s=30.0, budget_s=120.0)
# MLflow error codes that say the store is unavailable, not that the request was wrong: sqlite's
# "database is locked" / "unable to open database file" arrive as TEMPORARILY_UNAVAILABLE, a server
# that cannot be reached as INTERNAL_ERROR, HTTP 503/504/429 as the codes they map to.
TRANSIENT_CODES = frozenset(
    {
        "TEMPORARILY_UNAVAILABLE",
        "INTERNAL_ERROR",
        "IO_ERROR",
        "DEADLINE_EXCEEDED",
        "REQUEST_LIMIT_EXCEEDED",
        "RESOURCE_EXHAUSTED",
        "SERVICE_UNDER_MAINTENANCE",
        "COULD_NOT_ACQUIRE_LOCK",
    }
)
T = TypeVar("T")


def store_unavailable(exc: BaseException) -> bool:
    """Is `exc` the store being unavailable (worth retrying), rather than an answer (not found,
    already exists, invalid) that a retry would only repeat?"""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import OperationalError

    if isinstance(exc, MlflowException):
        return exc.error_code in TRANSIENT_CODES
    return isinstance(exc, (OperationalError, ConnectionError, TimeoutError))


class ChampionChanged(RuntimeError):
    """A compare-and-set promotion whose comparison is stale: the champion moved after the gate
    compared against it. The message names both versions; the refusal is also on the version."""


def _v(version) -> str:
    return f"v{version}" if version else "no champion"


def group_of(context) -> str:
    """The parent a materialization's run nests under: its round, or the foundation run that made
    it (a re-execution from failure shares its root run, so it joins the same parent)."""
    if context.has_partition_key:
        return f"round-{context.partition_key}"
    run = context.dagster_run
    return f"foundation-{(run.root_run_id or run.run_id)[:8]}"


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


class RetryingClient:
    """MLflow's client with every call retried while the store is unavailable (`MLflowTracker.retry`).
    A retried call that creates something may, if the store committed it but the reply was lost,
    create it twice. The creations that matter are find-or-create (experiment, registered model,
    model version); a run created twice leaves an empty one behind, and two group runs converge on
    the oldest, as when two steps race to create it."""

    def __init__(self, tracker: "MLflowTracker"):
        self._tracker = tracker

    def __getattr__(self, name: str):
        from mlflow import MlflowClient

        if not callable(getattr(MlflowClient, name, None)):
            return getattr(self._tracker.raw_client(), name)

        def call(*args, **kwargs):
            # run ids, model names: which call it was
            named = ", ".join(repr(a)[:40] for a in args if isinstance(a, str))
            return self._tracker.retry(
                f"{name}({named})", lambda: getattr(self._tracker.raw_client(), name)(*args, **kwargs)
            )

        return call


class MLflowTracker(ConfigurableResource):
    tracking_uri: str
    experiment: str = "agentic-flywheel"
    registered_model: str = "agentic-policy"
    # Where a newly created experiment stores artifacts. With a local sqlite store MLflow would
    # otherwise use ./mlruns under the *current directory*; None leaves it to the server.
    artifact_location: str | None = None
    ui_url: str = "http://localhost:5000"  # for links in Dagster metadata
    retry_attempts: int = RETRY.attempts  # per store call, while the store is unavailable (RETRY)
    retry_first_delay_s: float = RETRY.first_delay_s
    retry_budget_s: float = RETRY.budget_s

    def raw_client(self):
        """MLflow's own client: calls on it are not retried."""
        from mlflow import MlflowClient

        return MlflowClient(self.tracking_uri)

    def client(self) -> RetryingClient:
        """MLflow's client, each call retried while the store is unavailable. Also points the
        fluent API at the tracking URI (`mlflow.artifacts` and `models:/` URIs use it)."""
        import mlflow

        mlflow.set_tracking_uri(self.tracking_uri)
        return RetryingClient(self)

    def retry(self, operation: str, fn: Callable[[], T]) -> T:
        """`fn()` (calls on the store), retried while the store is unavailable; StoreUnavailable
        naming the tracking URI and `operation` once the back-off is spent."""
        policy = Backoff(
            self.retry_attempts,
            self.retry_first_delay_s,
            max(RETRY.max_delay_s, self.retry_first_delay_s),
            self.retry_budget_s,
        )
        return call_with_retries(
            fn,
            operation=operation,
            store=f"MLflow tracking store {self.tracking_uri}",
            is_transient=store_unavailable,
            policy=policy,
        )

    def experiment_id(self) -> str:
        """The experiment's id, created on first use. Two steps (or an attempt whose reply was
        lost) may both create it: the one that finds it already there reads it back."""
        from mlflow.exceptions import MlflowException

        client = self.client()
        experiment = client.get_experiment_by_name(self.experiment)
        if experiment:
            return experiment.experiment_id
        try:
            return client.create_experiment(self.experiment, artifact_location=self.artifact_location)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return client.get_experiment_by_name(self.experiment).experiment_id

    def group_run(self, group: str) -> str:
        """The id of the parent run for `group`, created on first use. It is closed at once: its
        children run later, possibly in other processes, and it only holds their summary."""
        client = self.client()
        experiment_id = self.experiment_id()
        found = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{GROUP_TAG}` = '{group}' and tags.`flywheel.role` = 'group'",
            order_by=["attributes.start_time ASC"],
            max_results=1,
        )
        if found:  # the oldest: two steps racing to create it converge on one next time
            return found[0].info.run_id
        run = client.create_run(experiment_id, run_name=group, tags={GROUP_TAG: group, "flywheel.role": "group"})
        client.set_terminated(run.info.run_id)
        return run.info.run_id

    def end_orphaned_runs(self, dagster_run_over: Callable[[str], bool]) -> list[str]:
        """Mark KILLED the MLflow runs still RUNNING whose Dagster run is over (`dagster_run_over`
        says so): what a killed process leaves behind, since only a live step ends its run. Returns
        their ids."""
        client = self.client()
        ended = []
        for run in client.search_runs([self.experiment_id()], filter_string="attributes.status = 'RUNNING'"):
            dagster_run = run.data.tags.get("dagster.run_id")
            if dagster_run and dagster_run_over(dagster_run):
                client.set_terminated(run.info.run_id, "KILLED")
                ended.append(run.info.run_id)
        return ended

    def parent_of(self, run_id: str) -> str | None:
        return self.client().get_run(run_id).data.tags.get(PARENT_RUN_ID_TAG)

    @contextlib.contextmanager
    def run(self, context, name: str, params: dict[str, Any] | None = None) -> Iterator[str]:
        """Start a run tagged with the Dagster run id, asset and partition, nested under its round
        (or foundation) parent; yield its id. Through the client rather than `mlflow.start_run`, so
        every call is retried and no process-wide active run is left behind when the store fails."""
        from mlflow.entities import Param
        from mlflow.tracking.context.registry import resolve_tags

        group = group_of(context)
        parent = self.group_run(group)
        partition = context.partition_key if context.has_partition_key else ""
        tags = {
            "dagster.run_id": context.run_id,
            "dagster.asset": name,
            "dagster.partition": partition,
            GROUP_TAG: group,
            PARENT_RUN_ID_TAG: parent,
        }
        client = self.client()
        run_id = client.create_run(
            self.experiment_id(), run_name=f"{name}{'-' + partition if partition else ''}", tags=resolve_tags(tags)
        ).info.run_id  # resolve_tags: the user and source tags start_run adds
        try:
            if params:
                client.log_batch(run_id, params=[Param(k, str(v)[:500]) for k, v in flatten(params).items()])
            yield run_id
        except BaseException as exc:
            if not isinstance(exc, StoreUnavailable):  # with the store gone, marking the run would only wait again
                try:
                    client.set_terminated(run_id, "FAILED")
                except StoreUnavailable as lost:  # the step's own error is the one to report
                    exc.add_note(f"(MLflow run {run_id} could not be marked FAILED: {lost})")
            raise
        client.set_terminated(run_id, "FINISHED")

    def run_link(self, run_id: str):
        """The run's page in the MLflow UI, as Dagster metadata."""
        from dagster import MetadataValue

        experiment_id = self.client().get_run(run_id).info.experiment_id
        return MetadataValue.url(f"{self.ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}")

    def version_link(self, version: str):
        from dagster import MetadataValue

        return MetadataValue.url(f"{self.ui_url.rstrip('/')}/#/models/{self.registered_model}/versions/{version}")

    def log_history(self, run_id: str, history: list[dict[str, float]]) -> None:
        """Per-step metrics in one batch call (a call per value is slow on sqlite)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(k, float(v), now, int(h["step"]))
            for h in history
            for k, v in h.items()
            if k != "step" and v is not None
        ]
        client = self.client()
        for i in range(0, len(metrics), 900):
            client.log_batch(run_id, metrics=metrics[i : i + 900])

    def log_metrics(self, run_id: str, metrics: dict[str, float]) -> None:
        self.log_history(run_id, [{"step": 0, **metrics}])

    def log_png(self, run_id: str, png: bytes, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_bytes(png)
            self.client().log_artifact(run_id, str(path), "plots")

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.client().log_text(run_id, text, name)

    def log_json(self, run_id: str, obj: Any, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(obj))
            self.client().log_artifact(run_id, str(path))

    def gate_k(self, run_id: str) -> int:
        """The k of the per-task pass@k a benchmark run's per_task_scores.json holds (runs from
        before benchmark.gate_k: 1, the mean outcome)."""
        return int(self.client().get_run(run_id).data.tags.get("gate_k", "1"))

    def load_json(self, run_id: str, name: str) -> Any:
        import mlflow

        self.client()
        path = self.retry(
            f"download_artifacts({run_id!r}, {name!r})",
            lambda: mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=name),
        )
        return json.loads(Path(path).read_text())

    @contextlib.contextmanager
    def registry_lock(self) -> Iterator[None]:
        """One process at a time in the registry's read-compare-write sections (registration,
        promotion, rollback): MLflow has no conditional update, so "set the alias if the champion
        is still v3" needs a lock around the read and the write (assets/locks.py). The lock file
        sits next to a sqlite store; for a tracking server it serializes this machine's processes,
        and the run queue keeps two runs of one round apart across machines (pipelines/instance.py)."""
        prefix = "sqlite:///"
        if self.tracking_uri.startswith(prefix):
            path = Path(self.tracking_uri[len(prefix) :] + ".lock")
        else:
            path = (
                Path(tempfile.gettempdir())
                / f"mlflow-registry-{hashlib.sha256(self.tracking_uri.encode()).hexdigest()[:12]}.lock"
            )
        with exclusive(
            path,
            f"the model registry {self.registered_model!r}",
            {"store": self.tracking_uri},
            wait_s=REGISTRY_LOCK_WAIT_S,
        ):
            yield

    def registered_version(self, tags: dict[str, str]):
        """The version already registered for the checkpoint `tags` identify (CHECKPOINT_KEY), or None."""
        key = {k: tags[k] for k in CHECKPOINT_KEY if k in tags}
        if len(key) < len(CHECKPOINT_KEY):
            return None
        return next((v for v in self.versions() if all(v.tags.get(k) == value for k, value in key.items())), None)

    def register_model(self, run_id: str, log_model: Callable[[], tuple[str, str | None]], tags: dict[str, str]):
        """Make the model `log_model()` logs under `run_id` a new version of the registered model,
        once per checkpoint: if `tags` identify it (CHECKPOINT_KEY) and it already has a version (a
        retried or re-executed benchmark step, another run benchmarking the same checkpoint), that
        version is returned and nothing is logged. `log_model` returns the version's source and the
        MLflow logged model's id (`models:/<model_id>` and the id for an agent model,
        assets/agent_model.py; None for a plain artifact folder). The last look-up and the creation
        happen together under the registry lock."""
        from mlflow.exceptions import MlflowException

        existing = self.registered_version(tags)
        if existing is not None:
            return existing
        source, model_id = log_model()  # a retry logs another model; only one is registered
        client = self.client()
        try:
            client.create_registered_model(self.registered_model)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise

        attempts = 0

        def create_once():  # a retry first looks for the version an attempt whose reply was lost may have made
            nonlocal attempts
            attempts += 1
            raw = self.raw_client()
            made = (
                [
                    v
                    for v in raw.search_model_versions(f"name='{self.registered_model}' and run_id='{run_id}'")
                    if v.source == source
                ]
                if attempts > 1
                else []
            )
            return (
                made[0]
                if made
                else raw.create_model_version(
                    self.registered_model, source, run_id=run_id, tags=tags, model_id=model_id
                )
            )

        with self.registry_lock():  # registered meanwhile by another run? then that version, not a second one
            version = self.registered_version(tags) or self.retry(
                f"create_model_version({self.registered_model!r}, run {run_id!r})", create_once
            )
        if (
            model_id is not None
        ):  # the logged model's page lists the versions made from it (as mlflow.register_model does)
            client.set_logged_model_tags(
                model_id,
                {MODEL_VERSIONS_TAG: json.dumps([{"name": self.registered_model, "version": str(version.version)}])},
            )
        return version

    def version_by_alias(self, alias: str):
        from mlflow.exceptions import MlflowException

        try:
            return self.client().get_model_version_by_alias(self.registered_model, alias)
        except MlflowException:
            return None

    def set_alias(self, alias: str, version: str) -> None:
        self.client().set_registered_model_alias(self.registered_model, alias, version)

    def champion_history(self) -> list[str]:
        from mlflow.exceptions import MlflowException

        try:
            model = self.client().get_registered_model(self.registered_model)
        except MlflowException:
            return []
        return json.loads(model.tags.get(CHAMPION_HISTORY_TAG, "[]"))

    def promote(self, version: str, reason: str, *, expected=UNCHECKED) -> None:
        """Make `version` the champion, recording why (the gate, or a forced promotion) on the
        version and appending it to the champion history that `rollback` walks back.

        Compare-and-set: `expected` is the champion version the caller's gate compared against
        (None: there was none). Under the registry lock the champion is read again right before
        the alias moves; if it is no longer `expected`, nothing moves, the version is tagged
        `promotion_skipped` with why, and ChampionChanged is raised: a gate must have compared
        against the champion it replaces."""
        with self.registry_lock():
            client = self.client()
            history, current = self.champion_history(), self.version_by_alias(CHAMPION)
            now = str(current.version) if current is not None else None
            if expected is not UNCHECKED and now != (None if expected is None else str(expected)):
                why = f"the champion changed from {_v(expected)} to {_v(now)} after the gate compared v{version} against {_v(expected)}"
                client.set_model_version_tag(self.registered_model, str(version), "promotion_skipped", why)
                raise ChampionChanged(why)
            if current is not None and (not history or history[-1] != now):
                history.append(now)  # a champion set without history (by hand in the UI, or an older home)
            history = [*history, str(version)][-HISTORY_KEPT:]
            client.set_registered_model_alias(self.registered_model, CHAMPION, str(version))
            client.set_registered_model_tag(self.registered_model, CHAMPION_HISTORY_TAG, json.dumps(history))
            client.set_model_version_tag(self.registered_model, str(version), "promoted_by", reason)

    def rollback(self) -> tuple[str, str]:
        """Give the champion alias back to the previous champion; returns (from, to)."""
        with self.registry_lock():  # the history read and rewritten is the one promote appends to
            current = self.version_by_alias(CHAMPION)
            if current is None:
                raise LookupError(f"registered model {self.registered_model!r} has no champion to roll back")
            history, was = self.champion_history(), str(current.version)
            earlier = [i for i, v in enumerate(history) if v != was]
            if not earlier:
                raise LookupError(
                    f"version {was} is the only champion {self.registered_model!r} has had: nothing to roll back to"
                )
            target = history[earlier[-1]]
            client = self.client()
            client.set_registered_model_alias(self.registered_model, CHAMPION, target)
            client.set_registered_model_tag(
                self.registered_model, CHAMPION_HISTORY_TAG, json.dumps(history[: earlier[-1] + 1])
            )
            client.set_model_version_tag(self.registered_model, was, "rolled_back", "true")
        return was, target

    def version_rows(self) -> list[dict]:
        """Every version with its benchmark summary and the aliases pointing at it: the
        benchmark table (`make models`, and an artifact of each benchmark run)."""
        client, versions = self.client(), self.versions()
        aliases: dict[str, list[str]] = {}
        if versions:  # version search results carry no aliases; the registered model does
            for alias, version in client.get_registered_model(self.registered_model).aliases.items():
                aliases.setdefault(str(version), []).append(alias)
        rows = []
        for v in versions:
            metrics = client.get_run(v.run_id).data.metrics if v.run_id else {}
            rows.append(
                {
                    "version": str(v.version),
                    "stage": v.tags.get("stage", ""),
                    "round": v.tags.get("round", ""),
                    "pass_at_1": metrics.get("pass_at_1", math.nan),
                    "ci_low": metrics.get("pass_at_1_ci_low", math.nan),
                    "ci_high": metrics.get("pass_at_1_ci_high", math.nan),
                    "aliases": ",".join(sorted(aliases.get(str(v.version), []))),
                    "promoted_by": v.tags.get("promoted_by", ""),
                    "blocked_by": v.tags.get("blocked_by", ""),
                }
            )
        return rows

    def versions(self) -> list:
        from mlflow.exceptions import MlflowException

        try:
            found = self.client().search_model_versions(f"name='{self.registered_model}'")
        except MlflowException:
            return []
        return sorted(found, key=lambda v: int(v.version))

"""Two launches of the same round at once: one trains it, the other is refused naming the run in
its way; promotions racing on one registry change the champion once; a checkpoint is registered
once however many steps register it; the run queue holds a second run of a round. Real processes
on a real MLflow sqlite store and a real Dagster instance (issue 10, concurrency)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml

from assets.locks import Busy, exclusive
from tests.registry_support import folder_model

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).parents[1] / "workers"
TASKS = [f"t{i}" for i in range(60)]
# The micro profile, cut further: the round test runs the foundation and a round in well under a minute.
FAST = {
    "data.families.arithmetic.benchmark_tasks": 12,
    "data.families.search.benchmark_tasks": 6,
    "data.families.code.benchmark_tasks": 6,
    "teacher.num_trajectories": 48,
    "sft.steps": 5,
    "rl.steps_per_round": 1,
    "rl.prompts_per_step": 2,
}


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "FLYWHEEL_FAILPOINT")}
    return {**env, "FLYWHEEL_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"), "FLYWHEEL_PROFILE": "micro"}


def start(commands: list[list[str]], home: Path, logs: Path) -> list[subprocess.Popen]:
    """Start every command; stderr goes to a file each (a full pipe would stall a worker
    mid-race), stdout stays a pipe for its "ready" line and its answer."""
    logs.mkdir(exist_ok=True)
    procs = []
    for i, cmd in enumerate(commands):
        with open(logs / f"worker-{i}.err", "w") as err:  # the child keeps its own descriptor
            procs.append(subprocess.Popen(cmd, cwd=home, env=_env(home), stdout=subprocess.PIPE, stderr=err, text=True))
    return procs


def release(
    procs: list[subprocess.Popen], go: Path, logs: Path, timeout: float = 300
) -> list[subprocess.CompletedProcess]:
    """Wait until every worker has imported everything and says "ready", then release them all
    at once by creating `go`; their completed processes (stderr from their files), in order."""
    try:
        for i, proc in enumerate(procs):
            line = proc.stdout.readline()
            assert line.strip() == "ready", (
                f"worker {i} did not start: {line!r} {(logs / f'worker-{i}.err').read_text()[-3000:]}"
            )
        go.touch()
        outs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out, (logs / f"worker-{i}.err").read_text())
        for i, (p, out) in enumerate(zip(procs, outs))
    ]


def race(commands: list[list[str]], home: Path, go: Path) -> list[subprocess.CompletedProcess]:
    return release(start(commands, home, go.parent / "logs"), go, go.parent / "logs")


# --- the lock itself -----------------------------------------------------------------------------------


HOLDER = """
import sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from assets.locks import exclusive
with exclusive(Path({path!r}), "RL round 7", {{"run_id": "run-a", "step": "rl_round"}}):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_held_round_is_refused_naming_the_holder_and_a_killed_holder_leaves_no_lock(tmp_path):
    path = tmp_path / "locks" / "rl-round-7.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(repo=str(REPO), path=str(path))], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Busy) as refused:
            with exclusive(path, "RL round 7", {"run_id": "run-b"}, then="Launch round 7 again later."):
                pytest.fail("two holders of one lock")
        assert str(refused.value) == (
            f"RL round 7 is held by Dagster run run-a (step rl_round, pid {holder.pid} on {socket.gethostname()}, "
            f"since {json.loads(path.read_text())['since']}). Launch round 7 again later."
        )
        # a retry would redo (or wait on) the other run's work behind the user's back
        assert not refused.value.allow_retries
        holder.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel drops the lock with the process
        holder.wait(timeout=30)
        with exclusive(path, "RL round 7", {"run_id": "run-b"}):  # at once: no stale lock, no waiting
            assert json.loads(path.read_text())["run_id"] == "run-b"
    finally:
        holder.kill()
        holder.wait()


# --- the registry: compare-and-set promotion, one version per checkpoint ------------------------------


@pytest.fixture()
def store(tmp_path, monkeypatch):
    """A flywheel home whose registry has v1 (pass@1 0.5, the champion) and v2 to v5 with the
    same per-task scores (0.8 each): any of them clears the gate against v1, and none clears it
    against another, so exactly one champion change is right whatever the order."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("FLYWHEEL_PROFILE", "micro")
    from configs import load_profile
    from pipelines.registry import tracker_for

    tracker = tracker_for(load_profile("micro"))
    tracker.client()
    mlflow.create_experiment(tracker.experiment, artifact_location=str(tmp_path / "mlartifacts"))
    mlflow.set_experiment(tracker.experiment)
    for version, rate in enumerate([0.5, 0.8, 0.8, 0.8, 0.8], start=1):
        folder = tmp_path / f"ckpt{version}"  # what is registered is not loaded here: any folder will do
        folder.mkdir()
        (folder / "weights.txt").write_text(f"version {version}")
        with mlflow.start_run() as run:
            mlflow.log_metrics({"pass_at_1": rate})
            tracker.log_json(
                run.info.run_id, {t: float(i < rate * len(TASKS)) for i, t in enumerate(TASKS)}, "per_task_scores.json"
            )
            tracker.register_model(
                run.info.run_id, folder_model(tracker, run.info.run_id, folder), {"stage": "rl", "round": str(version)}
            )
    tracker.promote("1", "gate")
    return tracker


def test_a_promotion_over_a_champion_that_moved_is_refused_and_recorded(store):
    from assets.benchmark import apply_gate
    from assets.tracking import ChampionChanged

    store.promote("3", "force")  # another promotion lands after v2's gate compared against v1
    with pytest.raises(
        ChampionChanged, match="the champion changed from v1 to v3 after the gate compared v2 against v1"
    ):
        store.promote("2", "gate", expected="1")
    assert str(store.version_by_alias("champion").version) == "3" and store.champion_history() == ["1", "3"]
    assert (
        "changed from v1 to v3"
        in store.client().get_model_version(store.registered_model, "2").tags["promotion_skipped"]
    )

    # the benchmark asset's gate: a stale "promote" becomes challenger, with the reason returned and tagged
    applied, skipped = apply_gate(store, "4", "1", {"promote": True, "diff": 0.3})
    assert not applied["promote"] and "changed from v1 to v3" in skipped
    tags = store.client().get_model_version(store.registered_model, "4").tags
    assert tags["promoted"] == "false" and "promoted_by" not in tags
    assert str(store.version_by_alias("challenger").version) == "4" and store.champion_history() == ["1", "3"]
    # a first champion is compared against "none": a champion appearing meanwhile refuses it too
    with pytest.raises(ChampionChanged, match="from no champion to v3"):
        store.promote("4", "gate", expected=None)
    # and the gate over the champion it did compare against goes through
    applied, skipped = apply_gate(store, "4", "3", {"promote": True, "diff": 0.0})
    assert applied["promote"] and not skipped and store.champion_history() == ["1", "3", "4"]
    # a retried benchmark step finds its checkpoint's version already champion: it stays so, challenger untouched
    store.set_alias("challenger", "2")
    applied, skipped = apply_gate(store, "4", "4", {"promote": False, "diff": 0.0})
    assert applied["promote"] and not skipped and store.champion_history() == ["1", "3", "4"]
    assert str(store.version_by_alias("challenger").version) == "2"


def test_racing_promotions_change_the_champion_exactly_once(store, tmp_path):
    """`make promote` of v2, v3, v4 and v5 at the same moment (each passes the gate against v1):
    two processes, two threads each."""
    pairs = [("2", "3"), ("4", "5")]
    done = race(
        [
            [sys.executable, str(WORKERS / "registry_worker.py"), "--go", str(tmp_path / "go"), "promote", *pair]
            for pair in pairs
        ],
        tmp_path,
        tmp_path / "go",
    )
    assert all(p.returncode == 0 for p in done), [p.stderr[-2000:] for p in done]
    outcome = dict(line.split(": ", 1) for p in done for line in p.stdout.splitlines())
    won = [v for v, said in outcome.items() if said == "promoted"]
    assert len(won) == 1, outcome
    for (
        v,
        said,
    ) in outcome.items():  # the others: refused by the gate against the new champion, or by the compare-and-set
        assert said == "promoted" or said.startswith("refused: "), (v, said)
    assert store.champion_history() == ["1", won[0]]
    assert str(store.version_by_alias("champion").version) == won[0]
    tags = {v: store.client().get_model_version(store.registered_model, v).tags for v in outcome}
    assert [v for v, t in tags.items() if t.get("promoted_by") == "gate"] == won


def test_a_checkpoint_registered_by_racing_steps_gets_one_version(store, tmp_path):
    """Three benchmark steps registering one checkpoint (same URI, written by the same run) at once."""
    folder = tmp_path / "round-5"
    folder.mkdir()
    (folder / "weights.txt").write_text("round 5")
    uri = str(folder)
    cmd = [
        sys.executable,
        str(WORKERS / "registry_worker.py"),
        "--go",
        str(tmp_path / "go"),
        "register",
        str(folder),
        uri,
        "run-r5",
    ]
    done = race([cmd] * 3, tmp_path, tmp_path / "go")
    assert all(p.returncode == 0 for p in done), [p.stderr[-2000:] for p in done]
    got = {p.stdout.strip() for p in done}
    versions = [v for v in store.versions() if v.tags.get("checkpoint_uri") == uri]
    assert len(versions) == 1 and got == {f"version {versions[0].version}"}
    # a checkpoint of the same round written by another run is another version
    with mlflow.start_run() as run:
        other = store.register_model(
            run.info.run_id,
            folder_model(store, run.info.run_id, folder),
            {"stage": "rl", "round": "5", "checkpoint_uri": uri, "checkpoint_run": "run-r5b"},
        )
    assert str(other.version) != str(versions[0].version)


# --- the run queue -----------------------------------------------------------------------------------


def test_the_run_queue_holds_a_second_run_of_a_round_until_the_first_is_over(cluster_env):
    """Dagster's own queue daemon, deciding on the local instance's settings: a queued run of a
    round whose run is in progress stays queued; another round's run goes."""
    from dagster import DagsterRunStatus
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.test_utils import create_run_for_test, instance_for_test
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

    from configs import load_profile
    from pipelines.definitions import RL_ROUND_JOB
    from pipelines.instance import LOCAL_SETTINGS, ROUND_RUN_LIMITS, cluster_settings

    assert (
        cluster_settings(load_profile("cluster", {}))["concurrency"]["runs"]["tag_concurrency_limits"]
        == ROUND_RUN_LIMITS
    )
    settings = yaml.safe_load(LOCAL_SETTINGS)
    # where the queued runs' job lives, as the UI records it for a launch (queued runs must say)
    origin = RemoteJobOrigin(
        RemoteRepositoryOrigin(
            InProcessCodeLocationOrigin(
                LoadableTargetOrigin(module_name="pipelines.definitions", working_directory=str(REPO))
            ),
            "__repository__",
        ),
        RL_ROUND_JOB,
    )
    with instance_for_test(overrides={"concurrency": settings["concurrency"]}) as instance:

        def run(status, partition):
            return create_run_for_test(
                instance,
                job_name=RL_ROUND_JOB,
                status=status,
                tags={"dagster/partition": partition},
                remote_job_origin=origin,
            )

        run(DagsterRunStatus.STARTED, "3")
        second, other = run(DagsterRunStatus.QUEUED, "3"), run(DagsterRunStatus.QUEUED, "4")
        daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
        dequeued = daemon._get_runs_to_dequeue(instance, instance.get_concurrency_config(), fixed_iteration_time=None)
        assert [r.run_id for r in dequeued] == [other.run_id]
        assert second.run_id not in {r.run_id for r in dequeued}


# --- two launches of one round, end to end ---------------------------------------------------------------


@pytest.mark.slow
def test_two_launches_of_one_round_train_it_once_and_the_other_is_refused(tmp_path, monkeypatch):
    if subprocess.run(["which", "bwrap"], capture_output=True).returncode != 0:
        pytest.skip("bubblewrap is not installed (scripts/setup.sh installs it)")
    from dagster import DagsterInstance
    from mlflow import MlflowClient

    from assets.artifacts import verify_folder
    from assets.rl import rl_rounds
    from pipelines.definitions import FOUNDATION_JOB, build_definitions
    from pipelines.instance import LOCAL_SETTINGS

    home = tmp_path / "fw"
    (home / "dagster").mkdir(parents=True)
    (home / "dagster" / "dagster.yaml").write_text(LOCAL_SETTINGS)
    for name, value in _env(home).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    overrides = [f"--set={key}={value}" for key, value in FAST.items()]
    launches = [
        [
            sys.executable,
            str(WORKERS / "round_launch_worker.py"),
            "--round",
            "1",
            "--go",
            str(tmp_path / "go"),
            "--out",
            str(tmp_path / f"launch-{i}.json"),
            *overrides,
        ]
        for i in (1, 2)
    ]
    # the two launches import while the foundation runs here; then both are released together
    procs = start(launches, home, tmp_path / "logs")
    try:
        instance = DagsterInstance.get()
        assert (
            build_definitions("micro", FAST)
            .resolve_job_def(FOUNDATION_JOB)
            .execute_in_process(instance=instance)
            .success
        )
        instance.add_dynamic_partitions(rl_rounds.name, ["1"])
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    release(procs, tmp_path / "go", tmp_path / "logs")
    results = [json.loads((tmp_path / f"launch-{i}.json").read_text()) for i in (1, 2)]
    winners = [r for r in results if r["success"]]
    assert len(winners) == 1, results
    winner, loser = winners[0], next(r for r in results if not r["success"])
    [failure] = loser["failures"]
    assert failure["step"] == "rl_round" and failure["class"] == "Busy"
    assert f"RL round 1 is held by Dagster run {winner['run_id']} (step rl_round" in failure["message"]
    assert "launch round 1 again" in failure["message"] and not loser["retried"]

    # the round's checkpoint is the winner's, whole; nothing half-written or spent is left behind
    round_dir = home / "artifacts" / "checkpoints" / "rl" / "round-1"
    assert verify_folder(round_dir, "checkpoints/rl/round-1")["dagster_run_id"] == winner["run_id"]
    assert not list(round_dir.parent.glob(".round-1.*")) and not (home / "cache" / "rl-state" / "round-1").exists()
    # the loser trained nothing and registered nothing: one MLflow round run, one version of the round
    client = MlflowClient(f"sqlite:///{home}/mlflow.db")
    experiment = client.get_experiment_by_name("agentic-flywheel").experiment_id
    round_runs = client.search_runs([experiment], filter_string="tags.`dagster.asset` = 'rl_round'")
    assert [r.data.tags["dagster.run_id"] for r in round_runs] == [winner["run_id"]]
    versions = client.search_model_versions("name='agentic-policy'")
    [round_version] = [v for v in versions if v.tags.get("round") == "1"]
    assert round_version.tags["checkpoint_run"] == winner["run_id"]
    history = json.loads(client.get_registered_model("agentic-policy").tags["champion_history"])
    champion = str(client.get_model_version_by_alias("agentic-policy", "champion").version)
    assert history[0] == "1" and history[-1] == champion and len(history) == len(set(history)) <= 2

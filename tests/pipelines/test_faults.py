"""Fault injection: each fault the platform must survive, or fail clearly on, made to happen for real.

| fault | how it is made here |
|---|---|
| MLflow store unavailable | another process holds the sqlite store locked; the tracking server process is killed and restarted; nothing listens at the URI |
| S3 endpoint failing | an HTTP proxy in front of the moto server answers 503 to some requests, or to all from a given one on |
| rollout engine dying mid-batch | the HF model's forward raises on the second turn; the vLLM engine is closed while a tool batch runs |
| tool timeouts and crashes | policy code that loops, segfaults or raises, and a sandbox worker killed mid-call, in a real sandbox |
| sandbox pool exhaustion | more concurrent calls than workers, and a worker killed while calls queue |
| verifier exceptions | a sandboxed verifier that raises on some outputs |

The disk-full write is in tests/assets/test_artifacts.py; the kill of a whole step in tests/pipelines/test_kill_resume.py.
"""

from __future__ import annotations

import copy
import http.client
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from dagster import build_asset_context
from test_storage import s3_bucket  # noqa: F401  (the moto S3 server fixture)

from assets.artifacts import CorruptArtifact, StorageUnavailable, exists, read_verified_bytes, write_bytes
from assets.resources import ArtifactStore
from assets.retry import Backoff, StoreUnavailable, backoff_delays, call_with_retries
from assets.tracking import MLflowTracker, store_unavailable
from configs.schema import RewardConfig, VerifierSpec
from environments.tools import CodeInterpreter
from training.agent.engines import Generation, HFEngine, VLLMEngine
from training.agent.loop import RolloutEngineError, run_episodes
from verifiers.base import Verdict, register
from verifiers.cascade import Cascade
from verifiers.sandbox import DEFAULT_UID_BASE, BubblewrapSandbox, SandboxLimits
from verifiers.shaping import Candidate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Sandbox pools of this file run as uids of their own (see tests/verifiers/test_sandbox.py).
_uid_bases = itertools.count(DEFAULT_UID_BASE + 5_000_000 + os.getpid() % 100_000 * 40, 4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc/<pid>/task/<tid>/children)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
                found += children
                todo += children
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def processes_under(box: BubblewrapSandbox) -> int:
    """Processes below the sandbox's bwrap processes: bwrap's init and the worker at rest, plus the
    code of every call still running."""
    return sum(len(descendants(pid)) for pid in box.worker_pids())


def sandbox_pool(limits: SandboxLimits, pool_size: int) -> BubblewrapSandbox:
    return BubblewrapSandbox(limits, pool_size, uid_base=next(_uid_bases))


def mlflow_error(message: str, code: str):
    """The exception MLflow's stores raise, with the error code they set (e.g. sqlite's "database is
    locked" comes as TEMPORARILY_UNAVAILABLE)."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import ErrorCode

    return MlflowException(message, error_code=ErrorCode.Value(code))


# =============================================================================== retry helper (pure)
def test_backoff_doubles_up_to_the_cap_with_each_pause_in_the_upper_half_of_its_step():
    policy = Backoff(attempts=7, first_delay_s=1.0, max_delay_s=10.0, budget_s=100.0)
    caps = [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    for seed in range(20):
        delays = backoff_delays(policy, random.Random(seed))
        assert len(delays) == 6
        assert all(cap / 2 <= d <= cap for d, cap in zip(delays, caps)), delays
    with pytest.raises(ValueError, match="attempts >= 1"):
        Backoff(attempts=0)


class Clock:
    """Time for call_with_retries that moves only when it sleeps (or a call takes time)."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_transient_errors_are_retried_until_the_call_succeeds():
    clock, calls = Clock(), []

    def flaky():
        calls.append(clock.now)
        if len(calls) < 4:
            raise ConnectionError("connection refused")
        return "logged"

    result = call_with_retries(
        flaky,
        operation="log_batch('run-1')",
        store="MLflow tracking store http://x",
        is_transient=store_unavailable,
        policy=Backoff(attempts=6, first_delay_s=1.0),
        sleep=clock.sleep,
        clock=lambda: clock.now,
        rng=random.Random(0),
    )
    assert result == "logged" and len(calls) == 4 and len(clock.sleeps) == 3
    assert clock.sleeps[0] < clock.sleeps[1] < clock.sleeps[2]  # exponential: each step doubles


def test_an_answer_is_not_retried_and_a_lasting_outage_fails_naming_store_operation_and_attempts():
    from mlflow.exceptions import MlflowException

    clock = Clock()
    store = "MLflow tracking store http://flywheel:s3cret@mlflow:5000"
    kwargs = dict(
        store=store, is_transient=store_unavailable, sleep=clock.sleep, clock=lambda: clock.now, rng=random.Random(0)
    )

    def missing():
        raise mlflow_error("Run 'r1' not found", "RESOURCE_DOES_NOT_EXIST")

    with pytest.raises(MlflowException, match="not found"):  # an answer: unchanged, at once
        call_with_retries(missing, operation="get_run('r1')", **kwargs)
    assert clock.sleeps == []

    def locked():
        raise mlflow_error("(sqlite3.OperationalError) database is locked", "TEMPORARILY_UNAVAILABLE")

    with pytest.raises(StoreUnavailable) as err:
        call_with_retries(locked, operation="log_batch('r1')", policy=Backoff(attempts=4, first_delay_s=1.0), **kwargs)
    message = str(err.value)
    assert "MLflow tracking store http://***@mlflow:5000 unavailable: log_batch('r1') failed 4 time(s)" in message
    assert "database is locked" in message and "s3cret" not in message
    assert len(clock.sleeps) == 3 and isinstance(err.value.__cause__, MlflowException)

    # the time budget ends it before the attempts do: no pause may end past budget_s (the first
    # pause is 1-2 s; after it, the second, 2-4 s, would end past 2.5 s whatever the jitter draws)
    clock = Clock()
    with pytest.raises(StoreUnavailable, match=r"failed 2 time\(s\) over"):
        call_with_retries(
            locked,
            operation="log_batch('r1')",
            store=store,
            is_transient=store_unavailable,
            sleep=clock.sleep,
            clock=lambda: clock.now,
            policy=Backoff(attempts=10, first_delay_s=2.0, max_delay_s=60.0, budget_s=2.5),
        )
    assert len(clock.sleeps) == 1 and clock.now <= 2.5


@pytest.mark.parametrize(
    "code, transient",
    [
        ("TEMPORARILY_UNAVAILABLE", True),  # sqlite locked / unreadable, HTTP 503
        ("INTERNAL_ERROR", True),  # a server that cannot be reached
        ("REQUEST_LIMIT_EXCEEDED", True),  # HTTP 429
        ("RESOURCE_DOES_NOT_EXIST", False),
        ("RESOURCE_ALREADY_EXISTS", False),
        ("INVALID_PARAMETER_VALUE", False),  # e.g. an alias that is not set: "no champion" is an answer
    ],
)
def test_which_mlflow_errors_mean_the_store_is_unavailable(code, transient):
    assert store_unavailable(mlflow_error("x", code)) is transient


# =============================================================================== MLflow store unavailable
LOCKER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")  # what a writer in another process holds while it commits
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def history(steps) -> list[dict[str, float]]:
    return [{"step": s, "loss/policy": 1.0 / s, "reward/total/mean": s / 100} for s in steps]


def logged_steps(tracker: MLflowTracker, run_id: str, key: str = "loss/policy") -> list[int]:
    return sorted(m.step for m in tracker.raw_client().get_metric_history(run_id, key))


def test_metrics_logged_while_another_process_holds_the_sqlite_store_locked_arrive_once_it_lets_go(tmp_path):
    """The local store: MLflow waits 20 s for a sqlite lock (its busy_timeout) and then gives up;
    a lock held longer (a long commit, a stuck writer) is ridden out by the tracker's retries."""
    db = tmp_path / "mlflow.db"
    tracker = MLflowTracker(
        tracking_uri=f"sqlite:///{db}", artifact_location=str(tmp_path / "mlartifacts"), retry_first_delay_s=0.5
    )
    with tracker.run(build_asset_context(partition_key="1"), "rl_round", {"rl": {"learning_rate": 1e-5}}) as run_id:
        tracker.log_history(run_id, history(range(1, 11)))
        locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(db), "22"], stdout=subprocess.PIPE, text=True)
        try:
            assert locker.stdout.readline().strip() == "locked"
            start = time.monotonic()
            tracker.log_history(run_id, history(range(11, 21)))
            waited = time.monotonic() - start
        finally:
            locker.kill()
            locker.wait()
    assert waited > 20, "the store was locked for longer than MLflow waits on its own"
    assert logged_steps(tracker, run_id) == list(range(1, 21))
    run = tracker.raw_client().get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"rl.learning_rate": "1e-05"}


SERVER = """
import sys
from mlflow.server import app
from werkzeug.serving import make_server

server = make_server("127.0.0.1", int(sys.argv[1]), app, threaded=True)
print("listening", flush=True)
server.serve_forever()
"""


class TrackingServer:
    """MLflow's tracking server (its Flask app, what `mlflow server` runs under uvicorn) in a
    process of its own, served by werkzeug: it starts in ~5 s where `mlflow server` takes ~16."""

    def __init__(self, tmp_path):
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "_MLFLOW_SERVER_FILE_STORE": f"sqlite:///{tmp_path}/server.db",
            "_MLFLOW_SERVER_ARTIFACT_ROOT": str(tmp_path / "server-artifacts"),
        }
        self.proc = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(self.port)],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "listening"

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def test_metrics_logged_while_the_tracking_server_is_down_arrive_once_it_is_back(tmp_path, monkeypatch):
    """The cluster's store: the server process dies mid-run and comes back ~5 s later. MLflow's own
    per-request HTTP retries are turned off, so this stands for an outage that outlasts them
    (they give up after ~4 min): only the tracker's retries carry the metrics through."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    server = TrackingServer(tmp_path)
    server.start()
    tracker = MLflowTracker(tracking_uri=server.uri, retry_attempts=10, retry_first_delay_s=0.5, retry_budget_s=50)
    try:
        with tracker.run(build_asset_context(partition_key="2"), "rl_round", {"rl": {"group_size": 8}}) as run_id:
            tracker.log_history(run_id, history(range(1, 21)))
            server.kill()
            restart = threading.Thread(target=server.start)
            start = time.monotonic()
            restart.start()
            tracker.log_history(run_id, history(range(21, 41)))  # sent while nothing listens
            outage = time.monotonic() - start
            restart.join()
            tracker.log_metrics(run_id, {"round/pass_at_1": 0.25})
        assert outage > 1.0, "the call did wait for the server"
        assert logged_steps(tracker, run_id) == list(range(1, 41))
        run = tracker.raw_client().get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.metrics["round/pass_at_1"] == 0.25
    finally:
        server.kill()


def test_a_tracking_server_that_stays_down_fails_the_call_naming_the_uri_and_the_operation(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # as above: only the tracker's retries
    port = free_port()  # nothing listens there: a server that is gone for good
    tracker = MLflowTracker(
        tracking_uri=f"http://flywheel:s3cret@127.0.0.1:{port}",
        retry_attempts=3,
        retry_first_delay_s=0.2,
        retry_budget_s=10,
    )
    start = time.monotonic()
    with pytest.raises(StoreUnavailable) as err:
        tracker.log_metrics("0123abcd", {"reward/total/mean": 0.5})
    message = str(err.value)
    assert (
        f"MLflow tracking store http://***@127.0.0.1:{port} unavailable: log_batch('0123abcd') failed 3 time(s)"
        in message
    ), message
    assert "s3cret" not in message
    assert time.monotonic() - start < 10
    # An outage is never taken for an answer: "no champion" would let the benchmark gate promote
    # a new version without comparing it to anything.
    with pytest.raises(StoreUnavailable, match=r"get_model_version_by_alias\('agentic-policy', 'champion'\)"):
        tracker.version_by_alias("champion")
    with pytest.raises(StoreUnavailable, match="get_experiment_by_name"):  # a step cannot start a run without the store
        with tracker.run(build_asset_context(partition_key="3"), "rl_round"):
            pass


# =============================================================================== S3 endpoint failing
UNAVAILABLE = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ServiceUnavailable</Code>'
    b"<Message>Service is unable to handle the request.</Message><RequestId>flaky</RequestId></Error>"
)
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade", "expect"}


class FlakyEndpoint:
    """An HTTP proxy in front of an S3 endpoint (the moto server): it answers 503 ServiceUnavailable
    to the next `fail_next(n)` requests, or to every request once it is down, and forwards the rest
    unchanged. What an S3 endpoint having a bad minute, or going away, looks like to botocore."""

    def __init__(self, upstream: str):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.lock = threading.Lock()
        self.to_fail, self.down, self.trigger = 0, False, None
        self.forwarded = self.failed = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients use it

            def log_message(self, *args):
                pass

            def handle_any(self):
                proxy.serve(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fail_next(self, n: int) -> None:
        with self.lock:
            self.to_fail = n

    def go_down_at(self, matches) -> None:
        """Fail every request from the first one `matches(method, path)` accepts on, until `up()`."""
        with self.lock:
            self.trigger = matches

    def up(self) -> None:
        with self.lock:
            self.down, self.trigger = False, None

    def serve(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        with self.lock:
            if self.trigger is not None and self.trigger(handler.command, handler.path):
                self.down, self.trigger = True, None
            fail = self.down or self.to_fail > 0
            self.to_fail = max(0, self.to_fail - 1)
            self.failed, self.forwarded = self.failed + fail, self.forwarded + (not fail)
        if fail:
            payload = b"" if handler.command == "HEAD" else UNAVAILABLE
            handler.send_response(503)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
            return
        upstream = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        try:  # the Host header goes through unchanged: the request's signature covers it
            upstream.request(
                handler.command,
                handler.path,
                body=body,
                headers={k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP},
            )
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        handler.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP | {"content-length", "server", "date"}:
                handler.send_header(key, value)
        head = handler.command == "HEAD"  # a HEAD reply carries the object's length and no body
        handler.send_header("Content-Length", response.getheader("Content-Length", "0") if head else str(len(data)))
        handler.end_headers()
        if not head:
            handler.wfile.write(data)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def flaky_s3(s3_bucket, monkeypatch):  # noqa: F811 (s3_bucket is the imported fixture)
    """The moto bucket, reached through a FlakyEndpoint."""
    import s3fs

    proxy = FlakyEndpoint(os.environ["AWS_ENDPOINT_URL_S3"])
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(name, proxy.url)
    s3fs.S3FileSystem.clear_instance_cache()
    yield s3_bucket, proxy
    proxy.close()


def _write_checkpoint(store: ArtifactStore, weights: bytes) -> str:
    with store.writable_dir("checkpoints", "sft") as (path, uri):
        (path / "config.json").write_text('{"hidden_size": 8}')
        (path / "model.safetensors").write_bytes(weights)
    return uri


def test_s3_failing_for_a_while_is_retried_and_artifacts_are_written_and_read_whole(flaky_s3, tmp_path):
    """Five 503s in a row on one request: more than botocore's default (legacy mode, 5 attempts)
    rides out, fewer than the store's 10 attempts in standard mode."""
    root, proxy = flaky_s3
    store = ArtifactStore(root=root, cache_dir=str(tmp_path / "cache"))
    proxy.fail_next(5)
    uri = _write_checkpoint(store, b"\x07" * 4096)
    assert proxy.failed == 5
    proxy.fail_next(2)
    local = store.local_path(uri)  # downloaded through the failures, then verified against its manifest
    assert (local / "model.safetensors").read_bytes() == b"\x07" * 4096
    proxy.fail_next(2)  # datasets and records (the IO manager's path)
    write_bytes(f"{root}/assets/verified_rewards/1.parquet", b"PAR1" + b"r" * 300, "verified_rewards[1]")
    proxy.fail_next(2)
    assert (
        read_verified_bytes(f"{root}/assets/verified_rewards/1.parquet", "verified_rewards[1]") == b"PAR1" + b"r" * 300
    )
    assert proxy.failed == 11


def test_an_s3_endpoint_that_goes_down_mid_upload_fails_naming_key_and_endpoint_and_no_reader_accepts_the_rest(
    flaky_s3, tmp_path, monkeypatch
):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # botocore's own setting, which the store honours: keeps the test short
    root, proxy = flaky_s3
    store = ArtifactStore(root=root, cache_dir=str(tmp_path / "cache"))
    uri = _write_checkpoint(store, b"v1" * 2048)
    # the endpoint goes away after the old manifest was removed and config.json uploaded
    proxy.go_down_at(lambda method, path: method == "PUT" and path.endswith("/model.safetensors"))
    with pytest.raises(StorageUnavailable) as err:
        _write_checkpoint(store, b"v2" * 2048)
    message = str(err.value)
    assert (
        f"upload of artifact checkpoints/sft: file {root}/checkpoints/sft/model.safetensors failed at endpoint {proxy.url}"
        in message
    ), message
    assert "mode, 2 attempts)" in message
    proxy.up()
    with pytest.raises(CorruptArtifact, match="no manifest"):  # half old, half new: refused, never trusted
        ArtifactStore(root=root, cache_dir=str(tmp_path / "fresh-cache")).local_path(uri)
    _write_checkpoint(store, b"v2" * 2048)  # the step's retry, once S3 is back, writes it whole
    assert (
        ArtifactStore(root=root, cache_dir=str(tmp_path / "cache-2")).local_path(uri) / "model.safetensors"
    ).read_bytes() == b"v2" * 2048

    url = f"{root}/assets/rollout_batches/1.parquet"  # a dataset: its data lands, its manifest does not
    write_bytes(url, b"PAR1" + b"a" * 100, "rollout_batches[1]")
    proxy.go_down_at(lambda method, path: method == "PUT" and path.endswith(".manifest.json"))
    with pytest.raises(
        StorageUnavailable, match=rf"writing artifact rollout_batches\[1\] to {url} failed at endpoint {proxy.url}"
    ):
        write_bytes(url, b"PAR1" + b"b" * 100, "rollout_batches[1]")
    proxy.up()
    with pytest.raises(CorruptArtifact, match="no manifest"):
        read_verified_bytes(url, "rollout_batches[1]")
    proxy.go_down_at(lambda method, path: True)  # reads name the object and the endpoint too
    with pytest.raises(StorageUnavailable, match=rf"looking for {url} failed at endpoint {proxy.url}"):
        exists(url)  # never False for an object S3 could not be asked about
    proxy.up()


# =============================================================================== rollout engine dying mid-batch
def arithmetic_tasks(warm_policy, n: int) -> list[dict]:
    return [t for t in warm_policy.tasks if t["family"] == "arithmetic"][:n]


def test_an_hf_engine_dying_mid_batch_fails_the_rollout_naming_the_engine_and_leaves_nothing_running(
    warm_policy, micro_cfg, sandbox
):
    model, tok = warm_policy.model, warm_policy.tokenizer
    prefills = []

    def dies_on_the_second_turn(module, args, kwargs):
        if kwargs["input_ids"].shape[1] > 1:  # a prefill: one per engine call, i.e. per turn
            prefills.append(1)
            if len(prefills) == 2:  # after the first turn's tool calls ran
                raise RuntimeError("CUDA error: an illegal memory access was encountered")  # what a dying GPU raises

    resting, was_training = processes_under(sandbox), model.training
    handle = model.register_forward_pre_hook(dies_on_the_second_turn, with_kwargs=True)
    try:
        with pytest.raises(RolloutEngineError) as err:
            # seed 2: two of the 8 episodes call the tool on their first turn, so there is a second turn to die in
            run_episodes(
                HFEngine(model),
                tok,
                arithmetic_tasks(warm_policy, 4),
                group_size=2,
                tools={"code": CodeInterpreter(sandbox)},
                cfg=micro_cfg.rollout,
                generator=torch.Generator().manual_seed(2),
            )
    finally:
        handle.remove()
    assert "rollout engine 'hf' failed in generate with" in str(err.value) and "of 8 episodes unfinished" in str(
        err.value
    )
    assert "illegal memory access" in str(err.value) and isinstance(err.value.__cause__, RuntimeError)
    assert model.training == was_training, "the model goes back to the trainer in the mode it came in"
    assert processes_under(sandbox) == resting and sandbox.run_python("print(1)").ok


@pytest.mark.xdist_group("vllm")
def test_a_vllm_engine_closed_mid_batch_fails_the_rollout_ends_every_session_and_waits_for_its_tools(
    warm_policy, micro_cfg, sandbox
):
    engine = VLLMEngine.from_model(warm_policy.model, warm_policy.tokenizer, micro_cfg.rollout, seed=0)
    tool_running, tool_done, closed_mid_tool = threading.Event(), threading.Event(), []

    class SlowCode(CodeInterpreter):
        def call_many(self, codes):
            tool_running.set()
            self.sandbox.run_many(["import time; time.sleep(1)"] * len(codes))  # real processes in flight
            results = super().call_many(codes)
            tool_done.set()
            return results

    poll = engine.poll

    def poll_until_closed():  # the engine goes away while a tool batch runs (an OOM kill, a crashed worker)
        if tool_running.is_set() and engine.llm is not None:
            closed_mid_tool.append(not tool_done.is_set())
            engine.close()
        return poll()

    engine.poll = poll_until_closed
    resting = processes_under(sandbox)
    try:
        with pytest.raises(
            RolloutEngineError,
            match=r"rollout engine 'vllm' failed in poll with \d+ of 8 episodes unfinished.*AttributeError",
        ):
            run_episodes(
                engine,
                warm_policy.tokenizer,
                arithmetic_tasks(warm_policy, 4),
                group_size=2,
                tools={"code": SlowCode(sandbox)},
                cfg=micro_cfg.rollout,
                generator=torch.Generator().manual_seed(0),
            )
        assert closed_mid_tool == [True], "the engine died while a tool batch was running"
        assert engine._sessions == {} and engine._running == {}, "every session and turn in flight was ended"
        assert processes_under(sandbox) == resting, "run_episodes returned only after the tool batch in flight finished"
    finally:
        engine.close()


def test_an_rl_step_whose_engine_dies_fails_naming_it_and_reports_nothing_of_that_step(warm_policy, micro_cfg):
    from training.rl.loop import train_round

    policy, armed, reported = copy.deepcopy(warm_policy.model), [], []

    def dies_once_armed(module, args, kwargs):
        if armed:
            raise RuntimeError("CUDA error: out of memory")

    def on_step(step, metrics):
        reported.append(step)
        armed.append(True)  # the next forward is step 2's first rollout turn

    policy.register_forward_pre_hook(dies_once_armed, with_kwargs=True)
    rl = micro_cfg.rl.model_copy(update={"steps_per_round": 2, "prompts_per_step": 2, "group_size": 2, "kl_coef": 0.0})
    with pytest.raises(RolloutEngineError, match="rollout engine 'hf' failed in generate.*out of memory"):
        train_round(
            policy,
            None,
            warm_policy.tokenizer,
            warm_policy.tasks,
            warm_policy.tools,
            rl=rl,
            rollout=micro_cfg.rollout.model_copy(update={"engine": "hf"}),
            cascade=Cascade(RewardConfig()),
            round_index=1,
            policy_version="t",
            seed=0,
            on_step=on_step,
        )
    assert reported == [1], "the failed step reported no metrics and returned no rollouts"


# =============================================================================== tool timeouts and crashes
class ScriptedPolicy:
    """Stands in for the policy so the tool calls are known: turn 1 of an episode runs its task's
    script in the code tool, turn 2 answers. The tool, the sandbox and the agent loop are real."""

    name = "scripted"

    def __init__(self, tok, scripts: dict[str, str], tasks: list[dict]):
        self.tok = tok
        self.scripts = {tuple(tok.encode(t["prompt"], add_special_tokens=False)): scripts[t["task_id"]] for t in tasks}

    def generate(self, sequences, budgets, **_):
        out = []
        for seq in sequences:
            prompt = next(p for p in self.scripts if tuple(seq[: len(p)]) == p)
            text = f"<code>{self.scripts[prompt]}</code>" if len(seq) == len(prompt) else "<answer>1</answer>"
            ids = self.tok.encode(text, add_special_tokens=False)
            out.append(Generation(ids, [-0.1] * len(ids)))
        return out


def test_tool_timeouts_and_crashes_become_error_observations_and_the_episodes_go_on(tokenizer_and_tasks, micro_cfg):
    tok, tasks = tokenizer_and_tasks
    tasks = list({t["prompt"]: t for t in tasks}.values())[:4]
    scripts = dict(
        zip(
            [t["task_id"] for t in tasks],
            [
                "while True:\n    pass",  # runs past the wall clock
                "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",  # crashes
                "raise ValueError('bad input')",  # raises
                "print(6 * 7)",  # and one that works, in the same batch
            ],
        )
    )
    with sandbox_pool(SandboxLimits(timeout_s=1.0, cpu_s=2), pool_size=2) as box:
        start = time.monotonic()
        episodes = run_episodes(
            ScriptedPolicy(tok, scripts, tasks),
            tok,
            tasks,
            group_size=1,
            tools={"code": CodeInterpreter(box)},
            cfg=micro_cfg.rollout,
        )
        assert time.monotonic() - start < 10
        calls = [e.tool_calls[0] for e in episodes]
        assert [c["error"] for c in calls] == ["timeout", "killed:SIGSEGV", "nonzero_exit", None]
        assert (
            calls[0]["result"] == "timeout\n"
            and calls[2]["result"] == "ValueError: bad input\n"
            and calls[3]["result"] == "42\n"
        )
        assert all(e.stop_reason == "answer" and e.turns == 2 for e in episodes), "each episode went on to its answer"

        # the sandbox worker itself dies mid-call (OOM-killed, say): an error observation too
        sleeper = {tasks[0]["task_id"]: "import time\ntime.sleep(5)"}
        resting = {pid: len(descendants(pid)) for pid in box.worker_pids()}

        def kill_the_busy_worker():
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                busy = [pid for pid in box.worker_pids() if len(descendants(pid)) > resting.get(pid, 2)]
                if busy:
                    os.kill(busy[0], signal.SIGKILL)
                    return
                time.sleep(0.01)

        killer = threading.Thread(target=kill_the_busy_worker)
        killer.start()
        [episode] = run_episodes(
            ScriptedPolicy(tok, sleeper, tasks[:1]),
            tok,
            tasks[:1],
            group_size=1,
            tools={"code": CodeInterpreter(box)},
            cfg=micro_cfg.rollout,
        )
        killer.join()
        assert episode.tool_calls[0]["error"].startswith("sandbox_failure: worker died"), episode.tool_calls
        assert episode.stop_reason == "answer"
        assert box.run_python("print('still serving')").ok


# =============================================================================== sandbox pool exhaustion
CALL = "import time\nstart = time.time()\ntime.sleep({seconds})\nprint(start, time.time())"


def test_more_concurrent_calls_than_workers_queue_and_all_complete_two_at_a_time():
    with sandbox_pool(SandboxLimits(timeout_s=5.0), pool_size=2) as box:
        start = time.monotonic()
        with ThreadPoolExecutor(8) as callers:  # e.g. the verifier cascade and the rollout's tools at once
            results = list(callers.map(lambda _: box.run_python(CALL.format(seconds=0.3)), range(8)))
        elapsed = time.monotonic() - start
    assert all(r.ok for r in results), results
    spans = [tuple(map(float, r.stdout.split())) for r in results]
    at_once = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert at_once == 2, f"{at_once} calls ran at once on a pool of 2"
    assert elapsed >= 4 * 0.3, "8 calls of 0.3 s on 2 workers take at least 1.2 s"


def test_a_worker_killed_while_calls_queue_fails_only_its_call_and_is_replaced():
    with sandbox_pool(SandboxLimits(timeout_s=5.0), pool_size=2) as box:
        resting = {pid: len(descendants(pid)) for pid in box.worker_pids()}
        with ThreadPoolExecutor(8) as callers:
            futures = [callers.submit(box.run_python, CALL.format(seconds=0.5)) for _ in range(8)]
            deadline = time.monotonic() + 10
            while not all(len(descendants(pid)) > n for pid, n in resting.items()) and time.monotonic() < deadline:
                time.sleep(0.01)  # until both workers run a call, six more waiting
            victim = box.worker_pids()[0]
            os.kill(victim, signal.SIGKILL)
            results = [f.result() for f in futures]
        failed = [r for r in results if not r.ok]
        assert len(failed) == 1 and failed[0].error.startswith("sandbox_failure: worker died"), results
        assert sum(r.ok for r in results) == 7, "every queued call still ran"
        pids = box.worker_pids()
        assert len(pids) == 2 and victim not in pids
        assert all(r.ok for r in box.run_many(["print(1)"] * 4))


# =============================================================================== verifier exceptions
@register("fault_test_sandboxed_equals", needs_sandbox=True)
def _sandboxed_equals(prediction, task, *, sandbox):
    """A verifier with a bug: it runs the comparison in the sandbox and looks its printout up,
    which raises KeyError when the program printed nothing (it crashed on the candidate)."""
    result = sandbox.run_python(f"print(int({prediction!r}) == {task['answer']})")
    return Verdict({"True": 1.0, "False": 0.0}[result.stdout.strip()], "compared in the sandbox")


def test_a_verifier_raising_in_the_sandboxed_tier_is_unscorable_and_earns_nothing(sandbox):
    task = {"task_id": "t1", "family": "arithmetic", "answer": "42", "level": 1}
    cascade = Cascade(
        RewardConfig(verifiers={"arithmetic": VerifierSpec(name="fault_test_sandboxed_equals")}), sandbox, concurrency=4
    )
    answers = ["42", "41", "forty-two", "42"]
    rewards = cascade.score_many([(Candidate([f"<answer>{a}</answer>"], 8, ("code",)), task) for a in answers])
    assert [r.outcome for r in rewards] == [1.0, 0.0, None, 1.0]
    assert rewards[2].components["outcome"] == 0.0 and "raised KeyError" in rewards[2].details["outcome"]
    assert rewards[2].reward < rewards[1].reward + 1e-9, "a crash earns no more than a wrong answer"
    assert cascade.metrics()["verifier/verify/unscorable"] == 1.0


def test_an_unscorable_trajectory_moves_no_advantage_its_whole_group_leaves_the_update(
    tokenizer_and_tasks, micro_cfg, sandbox
):
    from configs.schema import RLConfig
    from training.model import build_model
    from training.rl.algorithms import resolve_algorithm
    from training.rl.loop import prepare_samples
    from training.rl.scoring import episode_record, score_records

    tok, tasks = tokenizer_and_tasks
    policy = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=4)
    episodes = run_episodes(
        HFEngine(policy),
        tok,
        tasks[:2],
        group_size=4,
        tools={"code": CodeInterpreter(sandbox)},
        cfg=micro_cfg.rollout,
        generator=torch.Generator().manual_seed(0),
    )
    records = [episode_record(e, round_index=1, step=1, policy_version="t", tokenizer=tok) for e in episodes]
    scores = score_records(records, {t["task_id"]: t for t in tasks}, tok, Cascade(RewardConfig(), sandbox))
    for i, score in enumerate(scores):  # two informative groups
        score["outcome"], score["reward"] = float(i % 2), float(i % 2)
    scores[0]["outcome"], scores[0]["reward"] = None, 0.1  # its verifier crashed; 0.1 of shaping remains
    rl = RLConfig(algorithm="grpo", kl_coef=0.0, drop_zero_variance_groups=False)
    samples, _ = prepare_samples(
        records,
        scores,
        resolve_algorithm(rl),
        policy=policy,
        reference=None,
        critic=None,
        temperature=1.0,
        pad_id=tok.eos_token_id,
    )
    trained_groups = {s.record["group_id"] for s in samples}
    assert records[4]["group_id"] in trained_groups  # the other group trains
    assert records[0]["group_id"] not in trained_groups, (
        "the crashed verifier's group must not train on a baseline it set"
    )

"""The sandbox service (issue 23): the real service, started with uvicorn on 127.0.0.1 in a
subprocess with a real bubblewrap pool, and HTTPSandbox against it. Refusals (token, size,
batch, load), health and metrics, results, concurrent clients, and a service killed mid-batch:
its calls become error observations and unscorable verdicts, never reward."""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.scaleout

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap (`bwrap`) is not installed; the sandbox needs it", allow_module_level=True)

import httpx  # noqa: E402  (after the module-level skip)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from configs import ConfigError, load_profile  # noqa: E402
from configs.schema import RewardConfig, VerifierSpec  # noqa: E402
from environments.tools import CodeInterpreter  # noqa: E402
from tests.servers import read_until_closed  # noqa: E402
from verifiers.cascade import Cascade  # noqa: E402
from verifiers.code_tests import DEFAULT_ALLOWED_IMPORTS  # noqa: E402
from verifiers.sandbox import DEFAULT_UID_BASE, Sandbox, SandboxLimits  # noqa: E402
from verifiers.sandbox_client import HTTPSandbox, _batches  # noqa: E402
from verifiers.sandbox_service import TOKEN_ENV, _process_alive  # noqa: E402
from verifiers.sandboxes import make_sandbox  # noqa: E402
from verifiers.shaping import Candidate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOKEN = secrets.token_hex(16)
MAX_BYTES, MAX_BATCH, MAX_PENDING = 64 * 1024, 8, 16
LIMITS = SandboxLimits(timeout_s=1.0, cpu_s=1)  # what the services below run with (--timeout-s 1)
AUTH = {"authorization": f"Bearer {TOKEN}"}
# Pools of their own uids (RLIMIT_NPROC counts per uid, host-wide), apart from other tests' pools.
_uid_bases = itertools.count(DEFAULT_UID_BASE + 20_000_000 + os.getpid() % 100_000 * 100, 4)
CODE_TASK = {
    "task_id": "c",
    "family": "code",
    "entry_point": "add",
    "answer": "",
    "tests": [{"name": f"t{i}", "code": f"assert add({i}, 2) == {i + 2}", "group": "fail_to_pass"} for i in range(3)],
}
# Small retry budgets: a dead service must fail calls in well under a second here.
FAST_FAILING = {"retries": 2, "backoff_s": 0.1, "connect_timeout_s": 1.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def token_file(token: str = TOKEN) -> str:
    """The token in a file only this user can read (mkstemp makes it 0600), as the service takes it."""
    fd, path = tempfile.mkstemp(prefix="sandbox-token-")
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return path


class Service:
    """`python -m verifiers.sandbox_service` in a subprocess, ready when /healthz answers."""

    def __init__(
        self,
        *,
        port: int | None = None,
        timeout_s: float = 1.0,
        keep_alive_s: float = 5.0,
        max_bytes: int = MAX_BYTES,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # a file, not a pipe: can never block the service
        argv = [
            sys.executable,
            "-m",
            "verifiers.sandbox_service",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--pool-size",
            "2",
            "--timeout-s",
            str(timeout_s),
            "--uid-base",
            str(next(_uid_bases)),
            "--token-file",
            token_file(),
            "--max-request-bytes",
            str(max_bytes),
            "--max-batch",
            str(MAX_BATCH),
            "--max-pending",
            str(MAX_PENDING),
            "--keep-alive-s",
            str(keep_alive_s),
            "--log-level",
            "warning",
            *extra,
        ]
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}  # refused: the file is the way
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                self.log.seek(0)
                pytest.fail(f"sandbox service did not come up: {self.log.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    def worker_pids(self) -> list[int]:
        """The bwrap processes: the service's children."""
        pids = []
        for task in os.listdir(f"/proc/{self.proc.pid}/task"):
            with open(f"/proc/{self.proc.pid}/task/{task}/children") as fh:
                pids += [int(p) for p in fh.read().split()]
        return pids

    def wait_until_pending(self) -> None:
        """Until the service has admitted a call (it is in the pool, or queued for it)."""
        deadline = time.monotonic() + 20
        while metric(self.url, "flywheel_sandbox_pending_calls") < 1:
            assert time.monotonic() < deadline, "no call reached the service"
            time.sleep(0.01)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # uvicorn shuts down gracefully, then the pool closes
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples on /metrics that carry `labels`."""
    text = httpx.get(f"{url}/metrics", timeout=5.0).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


@pytest.fixture(scope="module")
def service():
    with Service() as svc:
        yield svc


@pytest.fixture
def box(service):
    with HTTPSandbox(service.url, TOKEN, LIMITS) as client:
        yield client


# ============================================================================ refusals


def test_requests_without_the_right_token_are_refused_and_run_nothing(service):
    calls_before = metric(service.url, "flywheel_sandbox_calls_total")
    wrong = [
        {},
        {"authorization": "Bearer " + secrets.token_hex(16)},
        {"authorization": f"Basic {TOKEN}"},
        {"authorization": f"Bearer {TOKEN}x"},
        {"authorization": TOKEN},
    ]
    for headers in wrong:
        for method, path, body in (
            ("POST", "/v1/run", {"code": "print(1)"}),
            ("POST", "/v1/run_many", {"codes": ["print(1)"]}),
            ("GET", "/v1/info", None),
            ("GET", "/docs", None),
        ):
            r = httpx.request(method, service.url + path, json=body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (headers, path, r.text)
    assert metric(service.url, "flywheel_sandbox_calls_total") == calls_before, "a refused request ran code"
    assert metric(service.url, "flywheel_sandbox_requests_total", endpoint="/v1/run", status="401") >= len(wrong)
    ok = httpx.post(service.url + "/v1/run", json={"code": "print(6*7)"}, headers=AUTH)
    assert ok.status_code == 200 and ok.json()["stdout"] == "42\n"
    with pytest.raises(RuntimeError, match="HTTP 401"):
        HTTPSandbox(service.url, secrets.token_hex(16))


def test_oversized_requests_are_refused_before_parsing(service, box):
    big = {"code": "x = '" + "a" * MAX_BYTES + "'"}
    r = httpx.post(service.url + "/v1/run", json=big, headers=AUTH)
    assert r.status_code == 413 and f"max_request_bytes={MAX_BYTES}" in r.json()["detail"]
    # No Content-Length (chunked): counted as it streams in, refused past the limit.
    chunks = (b"a" * 4096 for _ in range(64))
    r = httpx.post(service.url + "/v1/run", content=chunks, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 413
    # The client does not send what the service would refuse; the call is a sandbox failure.
    result = box.run_python(big["code"])
    assert (
        not result.ok and result.error.startswith("sandbox_failure: request of") and "max_request_bytes" in result.error
    )
    # A 413 from the service is a failure too, and not retried (4xx would fail the same way again).
    refused_before = metric(service.url, "flywheel_sandbox_requests_total", endpoint="/v1/run", status="413")
    box.max_request_bytes = 10 * MAX_BYTES
    result = box.run_python(big["code"])
    assert result.error.startswith("sandbox_failure: sandbox service refused the request: HTTP 413"), result
    assert (
        metric(service.url, "flywheel_sandbox_requests_total", endpoint="/v1/run", status="413") == refused_before + 1
    )


def test_a_batch_over_max_batch_is_refused_and_the_client_splits_batches(service, box):
    r = httpx.post(service.url + "/v1/run_many", json={"codes": ["print(1)"] * (MAX_BATCH + 1)}, headers=AUTH)
    assert r.status_code == 413 and f"max_batch={MAX_BATCH}" in r.json()["detail"]
    for malformed in ({"codes": "print(1)"}, {"codes": [1]}, {"code": "print(1)", "extra": 1}):
        assert httpx.post(service.url + "/v1/run_many", json=malformed, headers=AUTH).status_code == 422
    results = box.run_many([f"print({i})" for i in range(2 * MAX_BATCH + 3)])  # 3 requests
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(2 * MAX_BATCH + 3)]
    assert box.run_many([]) == []
    # Batches split by count and by size; a program too big to send goes alone (and fails alone).
    assert _batches([b"x" * 10] * 5, 2, 1000) == [(0, 2), (2, 4), (4, 5)]
    assert _batches([b"x" * 10, b"y" * 500, b"z"], 64, 100) == [(0, 1), (1, 2), (2, 3)]
    mixed = box.run_many(["print('a')", "x = '" + "a" * MAX_BYTES + "'", "print('b')"])
    assert [r.stdout for r in mixed] == ["a\n", "", "b\n"] and "max_request_bytes" in mixed[1].error


def test_a_busy_service_answers_503_and_the_client_retries(service):
    batch = ["import time; time.sleep(0.1); print('done')"] * MAX_BATCH
    start = threading.Barrier(3)

    def post() -> int:
        start.wait()
        return httpx.post(service.url + "/v1/run_many", json={"codes": batch}, headers=AUTH, timeout=30).status_code

    with ThreadPoolExecutor(3) as callers:  # 3 x 8 programs > max_pending 16
        statuses = list(callers.map(lambda _: post(), range(3)))
    assert sorted(statuses) == [200, 200, 503], statuses
    clients = [HTTPSandbox(service.url, TOKEN, LIMITS, retries=5) for _ in range(3)]  # up to 7.75 s of backoff
    with ThreadPoolExecutor(3) as callers:
        results = list(callers.map(lambda client: client.run_many(batch), clients))
    assert all(r.stdout == "done\n" for batch_results in results for r in batch_results)
    for client in clients:
        client.close()


# ============================================================================ serving


def test_health_and_metrics_need_no_token(service, box):
    health = httpx.get(service.url + "/healthz")
    assert health.status_code == 200 and health.json()["workers_alive"] == 2
    box.run_many(["print(1)", "raise SystemExit(3)", "import time; time.sleep(5)"])
    scrape = httpx.get(service.url + "/metrics")
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    assert metric(service.url, "flywheel_sandbox_calls_total", result="ok") >= 1
    assert metric(service.url, "flywheel_sandbox_calls_total", result="nonzero_exit") >= 1
    assert metric(service.url, "flywheel_sandbox_calls_total", result="timeout") >= 1
    assert metric(service.url, "flywheel_sandbox_call_seconds_count") >= 3
    assert metric(service.url, "flywheel_sandbox_request_seconds_count", endpoint="/v1/run_many") >= 1
    assert metric(service.url, "flywheel_sandbox_workers_alive") == 2


def test_health_fails_while_no_worker_is_alive_and_a_call_restarts_them(service, box):
    for pid in service.worker_pids():
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while httpx.get(service.url + "/healthz").status_code != 503:
        assert time.monotonic() < deadline, "health stayed ok with every worker killed"
        time.sleep(0.02)
    assert all(r.stdout == "back\n" for r in box.run_many(["print('back')"] * 4))
    health = httpx.get(service.url + "/healthz")
    assert health.status_code == 200 and health.json()["workers_alive"] >= 1


def test_results_through_the_service(box):
    assert isinstance(box, Sandbox) and box.limits == LIMITS
    ok = box.run_python("import sys; print(sys.stdin.read().upper())", stdin="hello")
    assert (ok.stdout, ok.exit_code, ok.error, ok.ok) == ("HELLO\n", 0, None, True)
    exits = box.run_python("raise SystemExit(3)")
    assert (exits.exit_code, exits.error, exits.ok) == (3, "nonzero_exit", False)
    raises = box.run_python("1/0")
    assert raises.error == "nonzero_exit" and "ZeroDivisionError" in raises.stderr
    slow = box.run_python("import time; time.sleep(5)")
    assert (slow.timed_out, slow.exit_code, slow.error) == (True, None, "timeout")
    assert 0.9 < slow.duration_s < 3.0


def test_the_unit_test_verifier_scores_through_the_service(box):
    cascade = Cascade(RewardConfig(verifiers={"code": VerifierSpec(name="unit_tests")}, terms={}), box, concurrency=2)
    right, wrong = (
        Candidate([f"<answer>def add(a, b):\n    return {body}</answer>"], 20, ()) for body in ("a + b", "a - b")
    )
    scored = cascade.score_many([(right, CODE_TASK), (wrong, CODE_TASK)])
    assert [s.outcome for s in scored] == [1.0, 0.0]


def test_concurrent_clients_all_get_their_own_results(service):
    def client_work(k: int) -> None:
        with HTTPSandbox(service.url, TOKEN, LIMITS) as client:
            for i in range(12):
                result = client.run_python(f"import sys; print({k} * 1000 + {i}, sys.stdin.read())", stdin=f"c{k}")
                assert result.stdout == f"{k * 1000 + i} c{k}\n", result
            many = client.run_many([f"print({k}, {i})" for i in range(6)])
            assert [r.stdout for r in many] == [f"{k} {i}\n" for i in range(6)]

    with ThreadPoolExecutor(4) as clients:
        list(clients.map(client_work, range(4)))  # re-raises the first failed assertion


# ============================================================================ failures


def test_a_service_killed_mid_batch_gives_error_observations():
    with Service() as svc, HTTPSandbox(svc.url, TOKEN, LIMITS, **FAST_FAILING) as client:
        tool = CodeInterpreter(client)
        workers = svc.worker_pids()
        with ThreadPoolExecutor(1) as runner:
            batch = runner.submit(tool.call_many, [f"import time; time.sleep(0.8); print({i})" for i in range(6)])
            svc.wait_until_pending()
            svc.kill()
            killed_at = time.monotonic()
            results = batch.result(timeout=30)
        assert time.monotonic() - killed_at < 5, "bounded retries"
        assert all(r.error.startswith("sandbox_failure: sandbox service unreachable") for r in results), results
        assert all(r.observation.startswith("sandbox_failure: sandbox service") for r in results)
        deadline = time.monotonic() + 10  # the bwrap workers die with the service (--die-with-parent)
        while any(_process_alive(pid) for pid in workers):
            assert time.monotonic() < deadline, "sandbox workers outlived the killed service"
            time.sleep(0.05)


def test_a_service_killed_mid_verification_earns_no_reward():
    # The candidate is right and takes 0.5 s per run: a run in flight when the service dies
    # cannot have finished, and every verdict after the kill must be unscorable, never 1.
    params = {"allowed_imports": [*DEFAULT_ALLOWED_IMPORTS, "time"]}
    cascade_cfg = RewardConfig(verifiers={"code": VerifierSpec(name="unit_tests", params=params)}, terms={})
    slow_right = Candidate(
        ["<answer>import time\n\ndef add(a, b):\n    time.sleep(0.5)\n    return a + b</answer>"], 20, ()
    )
    with Service(timeout_s=3.0) as svc, HTTPSandbox(svc.url, TOKEN, **FAST_FAILING) as client:
        cascade = Cascade(cascade_cfg, client, concurrency=2)
        assert cascade.score(slow_right, CODE_TASK).outcome == 1.0  # with the service up it passes
        cascade.take_stats()
        with ThreadPoolExecutor(1) as runner:
            scoring = runner.submit(cascade.score_many, [(slow_right, CODE_TASK)] * 6)
            svc.wait_until_pending()
            svc.kill()
            scored = scoring.result(timeout=60)
    assert [s.outcome for s in scored] == [None] * 6, [s.details for s in scored]
    assert all(s.reward == 0.0 and "sandbox service unreachable" in s.details["outcome"] for s in scored)
    stats = cascade.stats["verify"]
    assert (stats.calls, stats.passed, stats.unscorable) == (6, 0, 6)


@pytest.mark.serial  # a call within 0.2 s of wall clock, through a service process and a sandbox fork
def test_a_connection_the_service_closed_while_idle_is_replaced_at_once():
    # Between RL steps a client idles longer than the service keeps connections open.
    with Service(keep_alive_s=0.5) as svc, HTTPSandbox(svc.url, TOKEN, LIMITS) as client:
        assert client.run_python("print(1)").ok
        time.sleep(1.0)  # the service has closed the connection the client keeps
        start = time.monotonic()
        result = client.run_python("print(2)")
        assert result.ok and result.stdout == "2\n", result
        assert time.monotonic() - start < 0.2, "reconnected without waiting for a retry's backoff"


def test_a_restarted_service_is_retried():
    port = free_port()
    with Service(port=port) as first, HTTPSandbox(first.url, TOKEN, LIMITS, retries=8, backoff_s=0.25) as client:
        first.kill()
        with ThreadPoolExecutor(1) as runner:
            call = runner.submit(client.run_python, "print('after the restart')")
            with Service(port=port):  # same address, as a Deployment's Service keeps it
                result = call.result(timeout=60)
    assert result.ok and result.stdout == "after the restart\n", result


# ============================================================================ hostile connections


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


@pytest.mark.integrity
def test_public_routes_refuse_a_body_before_reading_it(service):
    """/healthz and /metrics need no token: a body sent there is refused unread (the service
    used to buffer it up to max_request_bytes first)."""
    for head in (
        b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n",
    ):
        with socket.create_connection(("127.0.0.1", service.port)) as sock:
            sock.sendall(head + b"a" * 1000)
            seconds, reply = read_until_closed(sock, 5.0)
        assert reply.startswith(b"HTTP/1.1 400") and b"takes no request body" in reply, reply[:300]
        assert seconds < 2.0
    assert httpx.get(service.url + "/healthz").status_code == 200  # without a body, as before


@pytest.mark.integrity
def test_half_sent_headers_and_a_stalled_body_are_disconnected_within_the_timeouts():
    """Slowloris: headers sent in part and then nothing, or a body that stops, used to hold a
    connection for minutes; here they are cut at --header-timeout-s / --body-timeout-s."""
    with Service(extra=("--header-timeout-s", "1", "--body-timeout-s", "1")) as svc:
        times = {}
        with socket.create_connection(("127.0.0.1", svc.port)) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow")
            times["half-sent headers"], reply = read_until_closed(sock, 10.0)
        assert reply.startswith(b"HTTP/1.1 408"), reply
        with socket.create_connection(("127.0.0.1", svc.port)) as sock:
            times["nothing sent"], reply = read_until_closed(sock, 10.0)
        with socket.create_connection(("127.0.0.1", svc.port)) as sock:
            start = time.monotonic()
            try:  # one byte every 0.2 s: each keeps the connection busy, the deadline still holds
                for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" * 4:
                    sock.sendall(bytes([byte]))
                    time.sleep(0.2)
                    if _readable(sock):  # the service answered or closed
                        break
            except OSError:
                pass
            read_until_closed(sock, 10.0)
            times["dripped headers"] = time.monotonic() - start
        with socket.create_connection(("127.0.0.1", svc.port)) as sock:
            head = f"POST /v1/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n"
            sock.sendall(head.encode() + b'{"code": "print(1)"')
            times["stalled body"], reply = read_until_closed(sock, 10.0)
        assert reply.startswith(b"HTTP/1.1 408"), reply
        assert all(seconds < 3.0 for seconds in times.values()), times
        assert httpx.get(svc.url + "/healthz").status_code == 200  # a well-behaved client is unaffected
        print("seconds to disconnect:", {k: round(v, 2) for k, v in times.items()})


def _readable(sock: socket.socket) -> bool:
    import select

    return bool(select.select([sock], [], [], 0)[0])


@pytest.mark.integrity
def test_300_connections_sending_bodies_to_healthz_do_not_grow_the_service(tmp_path):
    """300 unauthenticated connections each send 256 KiB (all but the last byte) to /healthz and
    hold: the service used to buffer every one (+75 MB, never given back); now each is refused
    unread and the service's memory stays within a small bound."""
    size = 256 * 1024
    with Service(max_bytes=size) as svc:
        for _ in range(20):  # warm: the first requests allocate what every request reuses
            httpx.get(svc.url + "/healthz")
        before = _rss_kib(svc.proc.pid)
        head = f"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode()

        def attack(_: int) -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", svc.port))
            sock.settimeout(2.0)
            try:
                sock.sendall(head + b"a" * (size - 1))
            except OSError:  # refused and closed mid-upload
                pass
            return sock

        with ThreadPoolExecutor(16) as senders:
            socks = list(senders.map(attack, range(300)))
        time.sleep(1.0)
        during = _rss_kib(svc.proc.pid)
        for sock in socks:
            sock.close()
        time.sleep(0.5)
        after = _rss_kib(svc.proc.pid)
        assert httpx.get(svc.url + "/healthz").status_code == 200
    print(
        f"service RSS: {before / 1024:.1f} MiB before, {during / 1024:.1f} MiB with 300 connections, {after / 1024:.1f} after"
    )
    assert during - before < 16 * 1024 and after - before < 16 * 1024, (before, during, after)


# ============================================================================ configuration


@pytest.mark.integrity
def test_the_service_takes_its_token_from_a_private_file_or_stdin_never_the_environment(tmp_path):
    """A token in the environment stays readable in /proc/<pid>/environ after os.environ.pop (the
    kernel keeps the process's initial environment): the service refuses it, naming the file way."""
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    argv = [sys.executable, "-m", "verifiers.sandbox_service", "--port", str(free_port())]
    readable = tmp_path / "readable"
    readable.write_text(TOKEN)
    readable.chmod(0o644)
    short = token_file("short")
    for extra, environ, named in (
        ([], env, "--token-file"),
        (["--token-file", token_file()], {**env, TOKEN_ENV: TOKEN}, f"{TOKEN_ENV} is set in the environment"),
        (["--token-file", str(readable)], env, "chmod 600"),
        (["--token-file", short], env, "characters, got 5"),
        (["--token-file", str(tmp_path / "missing")], env, "cannot read token file"),
    ):
        run = subprocess.run(argv + extra, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and named in run.stderr, (extra, run.stderr)
    # stdin works too: a pipe leaves nothing on disk
    port = free_port()
    proc = subprocess.Popen(
        [*argv[:3], "--port", str(port), "--token-file", "-", "--uid-base", str(next(_uid_bases))],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        proc.stdin.write(TOKEN.encode())
        proc.stdin.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v1/info", headers=AUTH, timeout=1.0)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "the service did not come up"
                time.sleep(0.1)
        assert r.status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.mark.integrity
def test_the_running_service_holds_no_token_in_its_environment(service):
    with open(f"/proc/{service.proc.pid}/environ", "rb") as fh:
        assert TOKEN.encode() not in fh.read()


def test_config_builds_the_client_and_names_what_is_missing(service, monkeypatch):
    from assets.resources import SandboxResource

    resource = SandboxResource(kind="http", url=service.url, timeout_s=1.0)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match=f"{TOKEN_ENV} \\(sandbox.token_env\\) is not set"):
        with resource.open():
            pass
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with resource.open() as sandbox:
        assert isinstance(sandbox, HTTPSandbox) and sandbox.run_python("print('via config')").stdout == "via config\n"
    with pytest.raises(ValueError, match="timeout_s: service 1.0, config 2.0"):
        with SandboxResource(kind="http", url=service.url).open():
            pass
    with pytest.raises(ValueError, match="sandbox.url"):
        make_sandbox("http", LIMITS, token=TOKEN)
    with pytest.raises(ConfigError, match="sandbox.url"):
        load_profile("tiny", {"sandbox.kind": "http"})
    assert load_profile("tiny", {"sandbox.kind": "http", "sandbox.url": service.url}).sandbox.url == service.url


@pytest.mark.integrity
def test_code_run_through_the_service_can_neither_reach_it_nor_read_its_token(service, box):
    """A policy's code, run by the service, tries what would let it run code outside the limits or
    forge results: call the service itself on its own port, and read the shared secret the
    service was started with. It has no network and the secret is not in its environment."""
    port = service.url.rsplit(":", 1)[1]
    result = box.run_python(
        "import os, socket\n"
        f"print('token' if any('{TOKEN}' in v for v in os.environ.values()) else 'no token')\n"
        f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('reached the service')\n"
        "except OSError as exc:\n    print('unreachable', type(exc).__name__)\n"
    )
    assert result.ok, result
    assert "no token" in result.stdout and "unreachable" in result.stdout and "reached the service" not in result.stdout

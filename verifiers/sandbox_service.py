"""The sandbox as a service: a Sandbox (the bubblewrap pool) behind a small HTTP API.

    python -m verifiers.sandbox_service --token-file /run/secrets/sandbox-token --host 127.0.0.1 --port 8790
    printf %s "$TOKEN" | python -m verifiers.sandbox_service --token-file -     # or on stdin

Every /v1 endpoint needs `Authorization: Bearer <token>`; bodies and replies are JSON. The token
comes from a file only the service's user can read (mode 0600 or tighter; in a pod, the Secret
mounted as a file: pipelines/k8s_manifests.py), or from stdin; never from the environment, where
it would stay readable in /proc/<pid>/environ for the service's whole life (os.environ.pop does
not clear it there): with FLYWHEEL_SANDBOX_TOKEN set, the service refuses to start.

    POST /v1/run       {"code": str, "stdin": str}  -> the SandboxResult's fields
    POST /v1/run_many  {"codes": [str, ...]}         -> {"results": [SandboxResult fields, ...]}, in order
    GET  /v1/info      the limits, max_batch, max_request_bytes, max_pending (a client checks them)
    GET  /healthz      no token: 200 while a pool worker is alive, else 503
    GET  /metrics      no token: Prometheus text (calls by result, durations, refusals)

Refusals: 400 a body sent to /healthz or /metrics (refused unread); 401 missing or wrong token;
413 a body over max_request_bytes (counted as it streams in, before anything parses it) or a
batch over max_batch; 422 a malformed body; 503 when admitting the request would put more than
max_pending programs in the queue (Retry-After: 1); 408 (then the connection closes) headers not
complete within --header-timeout-s or a body not within --body-timeout-s, 431 headers over 64 KiB
(verifiers/http_guard.py). A refusal before the body is read closes the connection.
The client is verifiers/sandbox_client.py (HTTPSandbox); docs/sandbox.md, "The sandbox as a
service", says how a failed call is kept from becoming reward.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import os
import stat
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Protocol, runtime_checkable

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, ValidationError

from verifiers.http_guard import GuardedConfig, HttpLimits, body_declared, read_body, refuse, replay, run
from verifiers.sandbox import BubblewrapSandbox, Sandbox, SandboxLimits, SandboxResult

TOKEN_ENV = "FLYWHEEL_SANDBOX_TOKEN"  # what clients read (sandbox.token_env); refused here (module docstring)
TOKEN_FILE_ENV = "FLYWHEEL_SANDBOX_TOKEN_FILE"  # the default of --token-file: a path, not the secret
MAX_TOKEN_FILE_BYTES = 4096
MIN_TOKEN_CHARS = 16  # a guessable secret is no secret: refuse to serve with one
DEFAULT_PORT = 8790
DEFAULT_MAX_REQUEST_BYTES = 2 * 1024 * 1024  # a batch of 64 tool calls, or one 20 kB candidate + runner, fit easily
DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_PENDING = 256
_PUBLIC = ("/healthz", "/metrics")  # probes and scrapers carry no secret; they reveal counts only
_ENDPOINTS = ("/v1/run", "/v1/run_many", "/v1/info", *_PUBLIC)  # metric labels; anything else is "other"


@runtime_checkable
class ServedSandbox(Sandbox, Protocol):
    """What the service needs of a sandbox: the Sandbox calls and the limits it enforces."""

    limits: SandboxLimits


@runtime_checkable
class MonitoredPool(Protocol):
    """A pool whose worker processes can be watched (BubblewrapSandbox): /healthz checks them."""

    def worker_pids(self) -> list[int]: ...


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str
    stdin: str = ""


class RunManyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    codes: list[str]


class _Metrics:
    """Prometheus series of one app (its own registry, so two apps in one process don't clash)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "flywheel_sandbox_requests", "HTTP requests by endpoint and status code", ["endpoint", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "flywheel_sandbox_request_seconds", "Wall time of a request, queueing included", ["endpoint"], registry=r
        )
        self.calls = Counter(
            "flywheel_sandbox_calls",
            "Programs run, by result: ok, the error class "
            "(timeout, nonzero_exit, ...) or sandbox_failure (the sandbox failed, not the code)",
            ["result"],
            registry=r,
        )
        self.call_seconds = Histogram(
            "flywheel_sandbox_call_seconds",
            "duration_s of each program run",
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.pending = Gauge("flywheel_sandbox_pending_calls", "Programs admitted and not yet answered", registry=r)
        self.workers_alive = Gauge(
            "flywheel_sandbox_workers_alive", "Pool workers alive at the last scrape", registry=r
        )

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.request_seconds.labels(endpoint).observe(seconds)

    def results(self, results: list[SandboxResult]) -> None:
        for result in results:
            # "killed:SIGSEGV" -> "killed", "sandbox_failure: ..." -> "sandbox_failure": few labels
            self.calls.labels("ok" if result.error is None else result.error.split(":", 1)[0]).inc()
            self.call_seconds.observe(result.duration_s)


# --- the guard: auth and body size, before FastAPI reads or parses anything ------------------


class _Guard:
    """Pure ASGI middleware: FastAPI reads and parses the body before it runs dependencies, so
    the token and the size are checked here, first. The public routes take no body at all (a
    prober needs none; one that declares one is refused unread, so an unauthenticated sender
    cannot make the service buffer anything); a /v1 body is counted as it streams in (a missing or
    lying Content-Length does not help) and handed on only if it fits. A refusal closes the
    connection: the unread rest of the body is never waited for."""

    def __init__(self, app, *, token: str, max_request_bytes: int, metrics: _Metrics) -> None:
        self.app, self.metrics, self.max_request_bytes = app, metrics, max_request_bytes
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, start, status = scope["path"], time.perf_counter(), [500]

        async def send_and_note(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if path in _PUBLIC:
                if body_declared(scope):
                    await _refuse(send_and_note, 400, f"{path} takes no request body")
                else:
                    await self.app(scope, receive, send_and_note)
            elif not self._authorized(scope):
                await _refuse(send_and_note, 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")])
            elif (body := await read_body(scope, receive, self.max_request_bytes)) is None:
                await _refuse(send_and_note, 413, f"request body over max_request_bytes={self.max_request_bytes}")
            else:
                await self.app(scope, replay(body, receive), send_and_note)
        finally:
            self.metrics.request(path if path in _ENDPOINTS else "other", status[0], time.perf_counter() - start)

    def _authorized(self, scope) -> bool:
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        return hmac.compare_digest(given, self._expected)  # constant time: no token prefix leaks by timing


async def _refuse(send, status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    # `detail`, as FastAPI's own refusals; the connection closes (http_guard.refuse)
    await refuse(send, status, {"detail": detail}, headers)


# --- the app ----------------------------------------------------------------------------------


class _Admission:
    """Bounds the work in the service: at most max_pending programs admitted (else 503, which a
    client retries after a backoff) and at most `concurrency` threads calling into the pool, which
    itself runs one program per worker; the rest wait in the executor's queue, costing no thread."""

    def __init__(self, max_pending: int, concurrency: int, metrics: _Metrics) -> None:
        self.max_pending, self.pending, self.metrics = max_pending, 0, metrics
        # Threads of its own, not anyio's shared pool: they serve the pool and nothing else, and a
        # plain executor hop costs a little less CPU per call (measured: ~0.03 ms).
        self.threads = ThreadPoolExecutor(concurrency, thread_name_prefix="sandbox-service")

    async def run(self, call: Callable[[], list[SandboxResult]], n: int) -> list[SandboxResult]:
        # `pending` is only touched on the event loop's thread: no lock needed
        if self.pending + n > self.max_pending:
            raise HTTPException(
                503,
                f"busy: {self.pending} programs pending, max_pending={self.max_pending}",
                headers={"Retry-After": "1"},
            )
        self.pending += n
        self.metrics.pending.set(self.pending)
        try:
            results = await asyncio.get_running_loop().run_in_executor(self.threads, call)
        finally:
            self.pending -= n
            self.metrics.pending.set(self.pending)
        if len(results) != n:  # a broken sandbox; never pair results with the wrong programs
            raise RuntimeError(f"the sandbox answered {len(results)} programs of {n}")
        self.metrics.results(results)
        return results


def create_app(
    sandbox: ServedSandbox,
    *,
    token: str,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_pending: int = DEFAULT_MAX_PENDING,
    concurrency: int = 2,
) -> FastAPI:
    """The HTTP API over `sandbox` (module docstring). `concurrency`: threads calling into the
    sandbox at once, the pool size (more would only wait for a worker inside the pool)."""
    _check_settings(token, max_request_bytes, max_batch, max_pending, concurrency)
    metrics = _Metrics()
    admission = _Admission(max_pending, concurrency, metrics)
    # No /docs or /openapi.json: they would be served without the token.
    app = FastAPI(title="flywheel sandbox service", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_Guard, token=token, max_request_bytes=max_request_bytes, metrics=metrics)

    # The two calls are plain routes that parse their body with the pydantic model themselves:
    # FastAPI's per-request dependency and validation layer costs ~0.1 ms of CPU per call
    # (measured), which a verifier making one call per candidate pays every time.
    async def run(request: Request) -> Response:
        body = _parse(RunRequest, await request.body())
        [result] = await admission.run(lambda: [sandbox.run_python(body.code, stdin=body.stdin)], 1)
        return JSONResponse(asdict(result))

    async def run_many(request: Request) -> Response:
        codes = _parse(RunManyRequest, await request.body()).codes
        if len(codes) > max_batch:
            raise HTTPException(413, f"batch of {len(codes)} programs over max_batch={max_batch}; split it")
        results = await admission.run(lambda: sandbox.run_many(codes), len(codes)) if codes else []
        return JSONResponse({"results": [asdict(r) for r in results]})

    app.add_route("/v1/run", run, methods=["POST"])
    app.add_route("/v1/run_many", run_many, methods=["POST"])

    @app.get("/v1/info")
    async def info() -> Response:
        return JSONResponse(
            {
                "limits": asdict(sandbox.limits),
                "max_batch": max_batch,
                "max_request_bytes": max_request_bytes,
                "max_pending": max_pending,
            }
        )

    @app.get("/healthz")
    async def healthz() -> Response:
        alive = _workers_alive(sandbox)
        if alive is not None:
            metrics.workers_alive.set(alive)
        # A dead worker is restarted by the next call that needs it; with none alive the pool
        # cannot serve (a bwrap that no longer starts): fail, so the pod is replaced.
        ok = alive is None or alive > 0
        return JSONResponse(
            {"status": "ok" if ok else "no worker alive", "workers_alive": alive, "pending": admission.pending},
            status_code=200 if ok else 503,
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        alive = _workers_alive(sandbox)
        if alive is not None:
            metrics.workers_alive.set(alive)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _parse(model: type[BaseModel], body: bytes):
    """The body as `model`, or a 422 naming what is wrong (without echoing the programs back)."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise HTTPException(422, exc.errors(include_url=False, include_context=False, include_input=False)) from None


def _check_settings(token: str, max_request_bytes: int, max_batch: int, max_pending: int, concurrency: int) -> None:
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"the sandbox service's token must have at least {MIN_TOKEN_CHARS} characters, got {len(token)}"
        )
    for name, value in (
        ("max_request_bytes", max_request_bytes),
        ("max_batch", max_batch),
        ("max_pending", max_pending),
        ("concurrency", concurrency),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if max_batch > max_pending:  # such a batch could never be admitted
        raise ValueError(f"max_batch={max_batch} must not exceed max_pending={max_pending}")


def _workers_alive(sandbox: object) -> int | None:
    """Live worker processes of the pool; None if the sandbox does not expose them."""
    if not isinstance(sandbox, MonitoredPool):
        return None
    return sum(_process_alive(pid) for pid in sandbox.worker_pids())


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]  # after the name, which may hold spaces
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie is a worker that died and was not yet restarted


# --- entry point ------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m verifiers.sandbox_service",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 inside a pod (the Service routes to it)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument(
        "--token-file",
        default=os.environ.get(TOKEN_FILE_ENV),
        help=f"file holding the shared secret, mode 0600 or tighter, or - for stdin (default: ${TOKEN_FILE_ENV})",
    )
    # The limits mirror configs/schema.py::SandboxConfig; a client checks them against its own config.
    p.add_argument("--pool-size", type=int, default=2, help="bubblewrap workers (programs run at once)")
    p.add_argument("--timeout-s", type=float, default=2.0)
    p.add_argument("--memory-mb", type=int, default=256)
    p.add_argument("--max-processes", type=int, default=8)
    p.add_argument("--max-files", type=int, default=10_000)
    p.add_argument("--max-output-bytes", type=int, default=65_536)
    p.add_argument(
        "--uid-base", type=int, default=None, help="first sandbox uid (default: a range allocated for this pool)"
    )
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES)
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH)
    p.add_argument("--max-pending", type=int, default=DEFAULT_MAX_PENDING)
    p.add_argument("--keep-alive-s", type=float, default=5.0, help="how long an idle client connection is kept open")
    p.add_argument(
        "--header-timeout-s",
        type=float,
        default=HttpLimits.header_timeout_s,
        help="a request's headers must arrive within",
    )
    p.add_argument(
        "--body-timeout-s", type=float, default=HttpLimits.body_timeout_s, help="a request's body must arrive within"
    )
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


class TokenError(ValueError):
    """No usable token: the message says how to give one."""


def read_token(path: str | None) -> str:
    """The shared secret from `path` (a file only its owner can read) or stdin (`-`); TokenError
    naming the problem otherwise, and always while TOKEN_ENV is in this process's environment."""
    if os.environ.get(TOKEN_ENV) is not None:
        raise TokenError(
            f"{TOKEN_ENV} is set in the environment: a token there stays readable in /proc/<pid>/environ "
            "for the service's whole life. Give it by --token-file PATH (mode 0600) or --token-file - on stdin, "
            f"and start the service without the variable (env -u {TOKEN_ENV} ...)"
        )
    if not path:
        raise TokenError(f"no token: give --token-file PATH (mode 0600), --token-file - (stdin) or ${TOKEN_FILE_ENV}")
    if path == "-":
        token = sys.stdin.read(MAX_TOKEN_FILE_BYTES + 1)
    else:
        try:
            with open(path, "rb") as fh:  # follows links: a mounted Secret's file is one
                mode = os.fstat(fh.fileno()).st_mode
                if not stat.S_ISREG(mode):
                    raise TokenError(f"token file {path} is not a regular file")
                if mode & 0o077:
                    raise TokenError(
                        f"token file {path} has mode {stat.S_IMODE(mode):04o}: others can read it; chmod 600 {path}"
                    )
                token = fh.read(MAX_TOKEN_FILE_BYTES + 1).decode()
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenError(f"cannot read token file {path}: {exc}") from None
    token = token.strip()  # `echo secret > file` leaves a newline
    if len(token) > MAX_TOKEN_FILE_BYTES or len(token) < MIN_TOKEN_CHARS:
        raise TokenError(
            f"the token must have {MIN_TOKEN_CHARS} to {MAX_TOKEN_FILE_BYTES} characters, got {len(token)}"
        )
    return token


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        token = read_token(args.token_file)
        limits = HttpLimits(header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s)
    except (TokenError, ValueError) as exc:
        print(f"sandbox service: refusing to start: {exc}", file=sys.stderr)
        return 2

    sandbox_limits = SandboxLimits.of(args)  # as every other sandbox derives them from its config
    with BubblewrapSandbox(sandbox_limits, args.pool_size, uid_base=args.uid_base) as pool:
        app = create_app(
            pool,
            token=token,
            max_request_bytes=args.max_request_bytes,
            max_batch=args.max_batch,
            max_pending=args.max_pending,
            concurrency=args.pool_size,
        )
        # No access log: one line per call would cost more CPU than the call's HTTP handling.
        run(
            GuardedConfig(
                app,
                limits=limits,
                host=args.host,
                port=args.port,
                log_level=args.log_level,
                access_log=False,
                timeout_keep_alive=args.keep_alive_s,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

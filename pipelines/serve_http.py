"""The HTTP server of `make serve` (pipelines/serve.py execs it): MLflow's own scoring app (the one
`mlflow models serve` runs, `mlflow.pyfunc.scoring_server.init`) behind a front that treats every
request as hostile network input (docs/ARCHITECTURE.md, "Trust boundaries"):

- served by verifiers/http_guard.py: headers within 10 s and 64 KiB, a body within 30 s of them;
- a body over `--max-body-bytes` is refused with 413 by its Content-Length or as it streams in,
  before anything parses it; only POST /invocations takes a body, and only application/json;
- the request is checked before MLflow sees it (JSON, the Responses-API schema, then the agent's
  own checks: `ToolAgent.refusal`, which caps the question's length before tokenizing): a refused
  request is answered 400 here and never reaches the traced `predict`, so no trace holds it;
- every error is `{"error": reason}`: a reason the caller can act on, never a stack trace or a
  host path. What MLflow says about a failure after the checks (its message, the traceback) goes
  to the server's log under an id that the reply names.

    python -m pipelines.serve_http --model-path DIR [--host 127.0.0.1] [--port 8080] [--workers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
from typing import Protocol, runtime_checkable

from verifiers.http_guard import GuardedConfig, body_declared, read_body, refuse, replay, run

MODEL_PATH_ENV = "FLYWHEEL_SERVE_MODEL_PATH"  # the downloaded model folder (each worker loads it)
MAX_BODY_BYTES_ENV = "FLYWHEEL_SERVE_MAX_BODY_BYTES"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024  # a question, its conversation and options; the context holds far less
INVOCATIONS = "/invocations"
_log = logging.getLogger("uvicorn.error")  # uvicorn configures it: these lines reach the server's log


class Front:
    """ASGI app: the checks above, then `inner` (MLflow's scoring app) with the body it was checked on.
    `refusal(body) -> reason | None` runs in a thread (it parses and tokenizes)."""

    def __init__(self, inner, refusal, *, max_body_bytes: int) -> None:
        self.inner, self.refusal, self.max_body_bytes = inner, refusal, max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        if scope["path"] != INVOCATIONS:  # /ping, /health, /version, or a 404
            if body_declared(scope):
                await refuse(send, 400, {"error": f"{scope['path']} takes no request body"})
            else:
                await self.inner(scope, receive, send)
            return
        if scope["method"] != "POST":
            await refuse(send, 405, {"error": f"{INVOCATIONS} takes POST"}, [(b"allow", b"POST")])
            return
        content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"").decode("latin-1")
        if content_type.split(";")[0].strip().lower() != "application/json":
            await refuse(send, 415, {"error": f"Content-Type must be application/json, got {content_type[:100]!r}"})
            return
        body = await read_body(scope, receive, self.max_body_bytes)
        if body is None:
            await refuse(send, 413, {"error": f"request body over {self.max_body_bytes} bytes"})
            return
        try:
            reason = await asyncio.to_thread(self.refusal, body)
        except Exception:
            await self._failed(send, 500, "checking the request failed", exc_info=True)
            return
        if reason is not None:
            await refuse(send, 400, {"error": reason}, close=False)  # the body was read: keep-alive is fine
            return
        await self.inner(scope, replay(body, receive), _Sanitized(send, self))

    async def _failed(self, send, status: int, what: str, *, exc_info: bool = False, detail: bytes = b"") -> None:
        error_id = secrets.token_hex(6)
        _log.error(
            "request %s: %s (status %d): %s", error_id, what, status, detail.decode(errors="replace"), exc_info=exc_info
        )
        await refuse(
            send, status, {"error": f"{what}; the server's log has the details under id {error_id}"}, close=False
        )


class _Sanitized:
    """The send() of MLflow's app for one request: a reply of 400 or more is held back, logged
    whole (its message and stack trace), and replaced by {"error": reason, ...}."""

    REASONS = {504: "the agent did not answer in time (MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT)"}

    def __init__(self, send, front: Front) -> None:
        self.send, self.front, self.status, self.held = send, front, None, []

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            self.status = message["status"]
            return
        if self.status is None:
            await self.send(message)
            return
        if message["type"] == "http.response.body":
            self.held.append(message.get("body", b""))
            if not message.get("more_body", False):
                # after the checks a failure is the server's, not the request's: 500 (MLflow says 400)
                status = self.status if self.status >= 500 else 500
                what = self.REASONS.get(self.status, "the agent failed on this request")
                await self.front._failed(self.send, status, what, detail=b"".join(self.held)[:100_000])


@runtime_checkable
class ChecksRequests(Protocol):
    """An agent that says why it would refuse a request without running it (ToolAgent); a version
    registered before agents could (its own code is what serves it) gets the schema checks only."""

    def refusal(self, request) -> str | None: ...


def agent_refusal(agent):
    """`refusal(body)` for `agent`: None if the request would be run, else why not."""
    from mlflow.types.responses import ResponsesAgentRequest
    from pydantic import ValidationError

    def refusal(body: bytes) -> str | None:
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return f"the body is not JSON: {exc}"[:300]
        if not isinstance(payload, dict):
            return "the body must be a JSON object: a Responses-API request ({'input': [...], 'custom_inputs': {...}})"
        try:
            request = ResponsesAgentRequest(**payload)
        except ValidationError as exc:
            problems = exc.errors(include_url=False, include_context=False, include_input=False)
            return "not a Responses-API request: " + "; ".join(
                f"{'.'.join(map(str, p['loc'])) or 'body'}: {p['msg']}" for p in problems[:5]
            )
        return agent.refusal(request) if isinstance(agent, ChecksRequests) else None

    return refusal


def create_app():
    """The app a worker serves (uvicorn factory): the model at $FLYWHEEL_SERVE_MODEL_PATH, loaded
    as `mlflow models serve` loads it, behind the Front."""
    import mlflow.pyfunc
    from mlflow.pyfunc import scoring_server

    model = mlflow.pyfunc.load_model(os.environ[MODEL_PATH_ENV])
    agent = model.get_raw_model()  # the ResponsesAgent (ToolAgent) that MLflow wraps
    max_body_bytes = int(os.environ.get(MAX_BODY_BYTES_ENV, DEFAULT_MAX_BODY_BYTES))
    return Front(scoring_server.init(model), agent_refusal(agent), max_body_bytes=max_body_bytes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.serve_http", description=__doc__)
    parser.add_argument("--model-path", required=True, help="the model's local folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    args = parser.parse_args(argv)
    # the workers (and the factory in this process) read these; a child process inherits them
    os.environ[MODEL_PATH_ENV] = args.model_path
    os.environ[MAX_BODY_BYTES_ENV] = str(args.max_body_bytes)
    run(
        GuardedConfig(
            "pipelines.serve_http:create_app",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            timeout_keep_alive=5,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

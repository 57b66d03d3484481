"""What every HTTP server of the project puts between the network and its app (the sandbox
service, `make serve`, the Dagster UI): requests there are hostile input (docs/sandbox.md,
"Trust boundaries"), so nothing is buffered or parsed before it is known to be small, and nothing
waits on a slow sender for long.

uvicorn (0.54) has no deadline for a request's headers or its body: a client that sends half its
headers and stalls, or drips a body a byte at a time, holds a connection (and what it sent) for as
long as it likes, and it has no bound on a request head's size. `GuardedProtocol` is uvicorn's
httptools protocol with three limits (`HttpLimits`), served by `run(GuardedConfig(...))`:

- the head (request line and headers) must be complete within `header_timeout_s` of the
  connection opening or of the request's first byte, and fit in `max_header_bytes`
  (else 408 / 431, and the connection closes);
- the body must be complete within `body_timeout_s` of the last header (else 408 if the app has
  not answered yet; the connection closes either way, and the app's receive() says disconnected).

The body's size is the app's to cap (it knows its routes): `body_declared`, `read_body` and
`refuse` are the pieces for an ASGI middleware that refuses before reading.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# GuardedProtocol overrides uvicorn's protocol internals (its parser callbacks and timers): checked
# against the version it was written for, so an upgrade fails here, by name, not in a server.
WRITTEN_FOR = "0.54.0"
if uvicorn.__version__ != WRITTEN_FOR:
    raise ImportError(
        f"verifiers/http_guard.py was written for uvicorn {WRITTEN_FOR}, this is {uvicorn.__version__}: "
        "re-check GuardedProtocol against its HttpToolsProtocol, then update WRITTEN_FOR"
    )

__all__ = ["GuardedConfig", "GuardedProtocol", "HttpLimits", "body_declared", "read_body", "refuse", "replay", "run"]


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    """From the connection opening (or a request's first byte) to the end of its headers."""
    body_timeout_s: float = 30.0
    """From the end of the headers to the last byte of the body (2 MiB at 1 Mbit/s takes 17 s)."""
    max_header_bytes: int = 64 * 1024
    """Request line and headers; checked per read, so at most one read (256 KiB) more is held."""

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "max_header_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")


class GuardedConfig(uvicorn.Config):
    """uvicorn's Config, served with GuardedProtocol under `limits` (picklable: workers get it)."""

    def __init__(self, app, *, limits: HttpLimits | None = None, **kwargs) -> None:
        super().__init__(app, http=GuardedProtocol, **kwargs)
        self.limits = limits or HttpLimits()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on each request's head and body, and a cap on
    the head's size (module docstring). One timer per connection: the phase says which it is."""

    def __init__(self, config, server_state, app_state, _loop=None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = config.limits if isinstance(config, GuardedConfig) else HttpLimits()
        self._timer: asyncio.TimerHandle | None = None
        self._phase = "head"  # "head": waiting for headers; "body": for the body; "" neither
        self._head_bytes = 0
        self._head_started = False  # a byte of this request's head has arrived

    # -- the deadlines ---------------------------------------------------------------------------
    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase = phase
        self._timer = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = ""

    def _expired(self) -> None:
        self._timer = None
        if self.transport is None or self.transport.is_closing():
            return
        if self._phase == "head":
            self._close_with(408, "request headers not received in time") if self._head_started else self._drop()
        elif self._phase == "body":
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                self._close_with(408, "request body not received in time")
            else:
                self._drop()

    def _drop(self) -> None:
        """Close now; a request in flight sees a disconnect (and its late reply goes nowhere)."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self._phase = ""
        self.transport.close()

    def _close_with(self, status: int, reason: str) -> None:
        body = json.dumps({"error": reason}).encode()
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
            % (status, {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status], len(body), body)
        )
        self._drop()

    # -- uvicorn's hooks ---------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm("head", self.limits.header_timeout_s)  # a connection that sends nothing is closed too

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase == "head":
            self._head_bytes += len(data)
        super().data_received(data)
        if (
            self._phase == "head"
            and self._head_bytes > self.limits.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._close_with(431, f"request head over {self.limits.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes, self._head_started = 0, True
        if self._phase != "head":  # a keep-alive connection's next request: the clock starts now
            self._arm("head", self.limits.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._head_started = False
        super().on_headers_complete()
        upgrading = self.parser.should_upgrade() and self._should_upgrade()  # a WebSocket keeps its own time
        if not upgrading and not self.transport.is_closing():
            self._arm("body", self.limits.body_timeout_s)

    def handle_websocket_upgrade(self) -> None:
        self._disarm()  # the transport is the WebSocket protocol's from here on
        super().handle_websocket_upgrade()

    def on_message_complete(self) -> None:
        if self._phase == "body":
            self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # the keep-alive timer (uvicorn's) now waits for the next request; the head timer starts
        # with its first byte (on_message_begin)


def run(config: GuardedConfig) -> None:
    """uvicorn.run for a Config built here (uvicorn.run builds its own): one process, or
    `config.workers` processes sharing the socket (the app must then be an import string)."""
    from uvicorn.supervisors import Multiprocess

    server = uvicorn.Server(config)
    if config.workers > 1:
        Multiprocess(config, sockets=[config.bind_socket()]).run()
    else:
        server.run()
        if not server.started:
            raise SystemExit(3)  # uvicorn's STARTUP_FAILURE: the port is taken, the app failed to load


# --- pieces for an ASGI middleware that caps bodies -------------------------------------------


def body_declared(scope) -> bool:
    """Whether the request says it has a body (a Content-Length other than 0, or any Transfer-Encoding)."""
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


async def read_body(scope, receive, max_bytes: int) -> bytes | None:
    """The whole body, or None as soon as it is known to exceed `max_bytes` (by its Content-Length,
    or counted as it streams in: a missing or lying length does not help); nothing more is read."""
    declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
    if declared is not None and (not declared.isdigit() or int(declared) > max_bytes):
        return None
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk, more = message.get("body", b""), message.get("more_body", False)
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def replay(body: bytes, receive):
    """A receive() that hands the buffered body over once, then waits on the real one (disconnects)."""
    sent = [False]

    async def replayed() -> dict:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def refuse(send, status: int, payload: dict, headers=(), *, close: bool = True) -> None:
    """A JSON reply. `close`: the connection closes after it (the request's unread body is not
    waited for: a hostile sender gets no more of the server's time)."""
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *([(b"connection", b"close")] if close else []),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

"""`make dagster-ui`: the Dagster UI (dagster-webserver) and the Dagster daemon, as `dagster dev`
runs them, with the webserver behind a host and origin check.

    python -m pipelines.ui [--host 127.0.0.1] [--port 3000] [--allow-host NAME ...]

The UI has no login and can launch runs. Bound to 127.0.0.1 it is still reachable from any web
page the machine's browser opens, by DNS rebinding: evil.example.com resolves to 127.0.0.1, and
the page's requests carry `Host: evil.example.com`. So a request is answered only if its Host
names this machine (localhost, 127.0.0.1, [::1]), the --host it listens on, or an --allow-host
(also $UI_ALLOWED_HOSTS, comma-separated: the names a proxy in front uses); else 403. A request that carries an Origin (every cross-site POST, every WebSocket
handshake a browser makes) must come from the UI's own origin; else 403. The connection limits of
verifiers/http_guard.py apply (header and body deadlines, header size).

dagster-webserver builds and serves its app inside its CLI; this module hands that CLI a
`uvicorn` whose `run` wraps the app first (the one place that reaches into dagster-webserver,
checked against the version it was written for).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from urllib.parse import urlsplit

from verifiers.http_guard import GuardedConfig, refuse, run

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
ALLOWED_HOSTS_ENV = "UI_ALLOWED_HOSTS"
WRITTEN_FOR = "1.13.27"  # dagster-webserver: its cli module calls uvicorn.run(app, host=, port=, log_level=)


def allowed_hosts(host: str, extra: list[str]) -> frozenset[str]:
    """The Host names the UI answers to: this machine's, the address it listens on (unless it is a
    wildcard, which names no host), and `extra`; lower case, an IPv6 literal without brackets."""
    names = [*LOCAL_HOSTS, *([host] if host not in ("0.0.0.0", "::", "") else []), *extra]
    return frozenset(n.strip().strip("[]").lower() for n in names if n.strip())


def host_name(value: str) -> str:
    """The name in a Host header or an origin's netloc, without the port: `[::1]:3000` -> `::1`."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else ""
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class UIGuard:
    """ASGI middleware: refuses (403) a request whose Host is not one of `hosts` (DNS rebinding),
    and one with an Origin other than the origin it was addressed to (a cross-site request; for a
    WebSocket handshake the close code 1008). Plain ASGI, so it holds for WebSockets too.
    (Not Starlette's TrustedHostMiddleware: it reads `[::1]:3000` as the host `[`.)"""

    def __init__(self, app, hosts: frozenset[str]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        origin = headers.get(b"origin")
        reason = None
        if host_name(host) not in self.hosts:
            reason = f"Host {host[:100]!r} is not one this UI answers to (UI_ALLOWED_HOSTS)"
        elif origin is not None and urlsplit(origin.decode("latin-1")).netloc.lower() != host.lower():
            reason = "cross-origin request refused"
        if reason is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await refuse(send, 403, {"error": reason})


class _GuardedUvicorn:
    """Stands in for the `uvicorn` module inside dagster_webserver.cli: its `run` serves the app guarded."""

    def __init__(self, hosts: frozenset[str]) -> None:
        self.hosts = hosts

    def run(self, app, *, host: str, port: int, log_level: str = "warning", **_: object) -> None:
        run(GuardedConfig(UIGuard(app, self.hosts), host=host, port=port, log_level=log_level))


def serve_webserver(host: str, port: int, hosts: frozenset[str]) -> None:
    """dagster-webserver's own CLI (the workspace from pyproject.toml, as `dagster dev` reads it), guarded."""
    import dagster_webserver.cli as webserver_cli
    from dagster_webserver.version import __version__

    if __version__ != WRITTEN_FOR:
        raise SystemExit(
            f"pipelines/ui.py was written for dagster-webserver {WRITTEN_FOR}, this is {__version__}: "
            "check that its cli module still serves with uvicorn.run(app, host=, port=, log_level=), then update WRITTEN_FOR"
        )
    webserver_cli.uvicorn = _GuardedUvicorn(hosts)
    webserver_cli.cli.main(
        args=["--host", host, "--port", str(port)],
        prog_name="dagster-webserver",
        auto_envvar_prefix="DAGSTER_WEBSERVER",
        standalone_mode=False,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.ui", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="listen address (0.0.0.0: the network; see the docstring)")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[h for h in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if h],
        help="another Host name to answer to (repeatable)",
    )
    parser.add_argument(
        "--no-daemon", action="store_true", help="the webserver only (no schedules, sensors, run queue)"
    )
    args = parser.parse_args(argv)
    hosts = allowed_hosts(args.host, args.allow_host)
    daemon = None
    if not args.no_daemon:  # as `dagster dev`: it dequeues the runs the UI launches, runs sensors and schedules
        daemon = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "dagster-daemon"), "run"])
    try:
        print(f"Dagster UI on http://{args.host}:{args.port} (answering Host: {', '.join(sorted(hosts))})", flush=True)
        serve_webserver(args.host, args.port, hosts)
    finally:
        if daemon is not None:
            daemon.terminate()
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

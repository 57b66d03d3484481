"""Servers the tests start on a free local port, each in its own process group, and stop whole."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}"
            )
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f}s")


def start_server(cmd: list[str], env: dict, ready_url: str):
    # its own process group: `mlflow ui` starts uvicorn workers and a job runner that outlive a
    # killed parent, so shutdown signals the whole group
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        wait_http(ready_url, proc)
    except Exception:
        stop_server(proc)
        raise
    return proc


def stop_server(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def read_until_closed(sock: socket.socket, seconds: float) -> tuple[float, bytes]:
    """Seconds until the server closed `sock`, and what it sent first; fails the test when the
    connection is still open after `seconds` (a server that waits on a stalled client)."""
    import pytest

    start, got = time.monotonic(), b""
    sock.settimeout(seconds)
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {seconds} s (got {got[:200]!r})")
    except ConnectionResetError:
        pass
    return time.monotonic() - start, got

"""The sandbox tiers, chosen in one place: `sandbox.kind` names one of them.

* `bubblewrap` (verifiers/sandbox.py): pre-forked workers in a bubblewrap namespace, seccomp and
  rlimits; the local default and what the service runs.
* `docker` (verifiers/docker_sandbox.py): a throwaway container per call.
* `http` (verifiers/sandbox_client.py): the sandbox service (verifiers/sandbox_service.py) over HTTP.

The tiers import their shared types from verifiers/sandbox.py, and only this module imports the
tiers: verifiers/sandbox.py must stand alone, because its source is what the sandboxed worker runs.
"""

from __future__ import annotations

import os

from verifiers.docker_sandbox import DockerSandbox
from verifiers.sandbox import BubblewrapSandbox, Sandbox, SandboxLimits
from verifiers.sandbox_client import HTTPSandbox

SANDBOX_KINDS = ("bubblewrap", "docker", "http")


def make_sandbox(
    kind: str,
    limits: SandboxLimits,
    pool_size: int = 2,
    *,
    image: str | None = None,
    url: str | None = None,
    token: str | None = None,
) -> Sandbox:
    """Build the sandbox named in config; "docker" needs a reachable engine (and runs `image`),
    "http" a sandbox service at `url` that accepts `token` and runs with `limits`."""
    if kind == "bubblewrap":
        return BubblewrapSandbox(limits, pool_size)
    if kind == "docker":
        return DockerSandbox(limits, pool_size, **({"image": image} if image else {}))
    if kind == "http":
        if not url:
            raise ValueError(
                "sandbox.url is required when sandbox.kind is 'http' (the sandbox service, e.g. http://sandbox:8790)"
            )
        if not token:
            raise ValueError(
                f"sandbox kind 'http' needs the sandbox service's token (see sandbox.token_env); got {token!r}"
            )
        return HTTPSandbox(url, token, limits, concurrency=pool_size)
    raise ValueError(f"unknown sandbox kind {kind!r}; expected one of {SANDBOX_KINDS}")


def sandbox_from_settings(settings) -> Sandbox:
    """The sandbox `settings` describe (a `SandboxConfig`, or the Dagster resource with the same
    fields): its limits, tier and pool, and for the http tier the token from `settings.token_env`."""
    return make_sandbox(
        settings.kind,
        SandboxLimits.of(settings),
        settings.pool_size,
        image=settings.image,
        url=settings.url,
        token=sandbox_token(settings.kind, settings.token_env),
    )


def sandbox_token(kind: str, token_env: str) -> str | None:
    """The sandbox service's secret (kind http), from the environment; never part of the config."""
    if kind != "http":
        return None
    token = os.environ.get(token_env)
    if not token:
        raise ValueError(
            f"sandbox.kind is 'http' but the environment variable {token_env} (sandbox.token_env) is not set: "
            "it must hold the sandbox service's token"
        )
    return token

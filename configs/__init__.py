"""Profiles: `configs/<name>.yaml` values validated against `configs.schema.FlywheelConfig`.

`load_profile("tiny", overrides={"rl.rounds": 3})` returns a frozen, validated config or raises
`ConfigError` naming the file, the field path and the bad value, before any work starts.

String values may name environment variables, `${VAR}` or `${VAR:-default}` (as in a shell or
docker compose): the `cluster` profile takes its bucket, images and MLflow address from the
variables the Terraform outputs fill in (docs/deploy.md). A variable that is unset and has no
default is an error naming the profile, the field and the variable.

FLYWHEEL_THREADS, when set, replaces the profile's `threads` (torch's intra-op threads) in every
process that loads a profile, child processes included; an explicit `threads=` override still
wins. It is how processes that share the cores ask for fewer threads each without editing a
profile: the test suite under pytest-xdist sets it to 1 (tests/conftest.py), since two processes
with 2 threads each on 2 cores slow each other down several times.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from configs.schema import FlywheelConfig

PROFILE_DIR = Path(__file__).resolve().parent
DEFAULT_PROFILE = "tiny"
THREADS_VARIABLE = "FLYWHEEL_THREADS"


class ConfigError(ValueError):
    """A profile or override that does not validate; the message names field and value."""


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def flywheel_home() -> Path:
    """Root of all local state (Dagster instance, artifacts, MLflow sqlite): FLYWHEEL_HOME, or
    ./.flywheel when it is unset. Set but empty (`FLYWHEEL_HOME= make run`) is refused: it would
    make the current directory (the repository) the home."""
    value = os.environ.get("FLYWHEEL_HOME")
    if value is not None and not value.strip():
        raise ConfigError(
            "FLYWHEEL_HOME is set but empty: unset it to use ./.flywheel, or give the folder the flywheel keeps its state in"
        )
    return Path(value or "./.flywheel").resolve()


def _set_path(tree: dict[str, Any], dotted: str, value: Any, defaults: dict[str, Any]) -> None:
    """Set `a.b.c` in the profile tree. A section missing from the profile is first filled from
    the schema's defaults, so `reward.terms.format.weight=0.2` changes one weight of the default
    terms instead of replacing the whole mapping with a one-entry dict."""
    node, default = tree, defaults
    *parents, leaf = dotted.split(".")
    for key in parents:
        default = default.get(key, {}) if isinstance(default, dict) else {}
        node = node.setdefault(key, copy.deepcopy(default) if isinstance(default, dict) else {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a section")
    node[leaf] = value


ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def env_references(text: str) -> list[tuple[str, str | None]]:
    """The `(VAR, default or None)` references in a profile value, in order."""
    return [(m.group(1), m.group(2)) for m in ENV_REFERENCE.finditer(text)]


def _interpolate(node: Any, source: str, field: str = "") -> Any:
    """A copy of the profile tree with every `${VAR}` / `${VAR:-default}` in a string replaced."""
    if isinstance(node, dict):
        return {
            key: _interpolate(value, source, f"{field}.{key}" if field else str(key)) for key, value in node.items()
        }
    if isinstance(node, list):
        return [_interpolate(value, source, f"{field}[{i}]") for i, value in enumerate(node)]
    if not isinstance(node, str):
        return node

    def resolve(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        value = os.environ.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                raise ConfigError(
                    f"{source}: {field} reads environment variable {name}, which is not set "
                    f"(the cluster profile's variables are listed in docs/deploy.md)"
                )
            return default
        return value

    return ENV_REFERENCE.sub(resolve, node)


def threads_from_environment() -> int | None:
    """FLYWHEEL_THREADS as a thread count, None when it is unset or empty (see the module's docstring)."""
    raw = os.environ.get(THREADS_VARIABLE, "").strip()
    if not raw:
        return None
    if not re.fullmatch(r"[0-9]+", raw) or int(raw) < 1:
        raise ConfigError(f"{THREADS_VARIABLE} must be a whole number of threads >= 1 (got {raw!r})")
    return int(raw)


def parse_override(text: str) -> tuple[str, Any]:
    """`rl.rounds=3` -> ("rl.rounds", 3); the value is parsed as YAML (numbers, lists, null)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.field=value")
    key, raw = text.split("=", 1)
    return key.strip(), yaml.safe_load(raw)


def _describe(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "<root>"
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  - {field}: {e['msg']}{shown}")
    return "\n".join(lines)


def load_profile(name: str | None = None, overrides: dict[str, Any] | None = None) -> FlywheelConfig:
    name = name or os.environ.get("FLYWHEEL_PROFILE", DEFAULT_PROFILE)
    path = PROFILE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown profile {name!r}: no file {path}; available: {', '.join(available_profiles())}")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(tree, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, got {type(tree).__name__}")
    tree.setdefault("profile", name)
    if (threads := threads_from_environment()) is not None:
        tree["threads"] = threads  # before the overrides: an explicit `threads=` wins
    defaults = FlywheelConfig().model_dump()
    for key, value in (overrides or {}).items():
        _set_path(tree, key, value, defaults)
    tree = _interpolate(tree, str(path))
    try:
        return FlywheelConfig.model_validate(tree)
    except ValidationError as exc:
        source = str(path) + (f" with overrides {overrides}" if overrides else "")
        raise ConfigError(_describe(exc, source)) from None


__all__ = [
    "ConfigError",
    "FlywheelConfig",
    "available_profiles",
    "env_references",
    "flywheel_home",
    "load_profile",
    "parse_override",
    "threads_from_environment",
]

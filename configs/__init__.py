"""Profiles: `configs/<name>.yaml` values validated against `configs.schema.FlywheelConfig`.

`load_profile("tiny", overrides={"rl.rounds": 3})` returns a frozen, validated config or raises
`ConfigError` naming the file, the field path and the bad value, before any work starts.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from configs.schema import FlywheelConfig

PROFILE_DIR = Path(__file__).resolve().parent
DEFAULT_PROFILE = "tiny"


class ConfigError(ValueError):
    """A profile or override that does not validate; the message names field and value."""


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def flywheel_home() -> Path:
    """Root of all local state (Dagster instance, artifacts, MLflow sqlite)."""
    return Path(os.environ.get("FLYWHEEL_HOME", "./.flywheel")).resolve()


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
    defaults = FlywheelConfig().model_dump()
    for key, value in (overrides or {}).items():
        _set_path(tree, key, value, defaults)
    try:
        return FlywheelConfig.model_validate(tree)
    except ValidationError as exc:
        source = str(path) + (f" with overrides {overrides}" if overrides else "")
        raise ConfigError(_describe(exc, source)) from None


__all__ = ["ConfigError", "FlywheelConfig", "available_profiles", "flywheel_home", "load_profile", "parse_override"]

"""A flywheel home (FLYWHEEL_HOME): what it is, who may work on it at once, and where it lives.

A home is **one flywheel lineage**: one profile with one seed, task data and model. Its
registered versions are all benchmarked on the same held-out tasks, so the promotion gate can
compare any two of them; a run that would benchmark on other tasks or continue another model
(another seed, other data, another model) belongs in another home and is refused here, naming
what differs. What a user tunes between runs (RL, SFT, reward, rollout, benchmark scoring) may
change.

`flywheel.json` remembers the lineage and the settings of the last `make run`; every command
that reads the home (`make models/promote/rollback/audit/serve`, `make resume`) uses them unless
told otherwise (`PROFILE=`, `ARGS='--set …'`), so a micro home is audited with micro's verifiers and
the CLI gate is the gate the run applied.

One `make run` or `make resume` at a time: each holds `flywheel.lock` (an `fcntl.flock`, released
by the kernel however the process ends) for as long as it runs; a second is refused naming the
holder and its pid.

A home moves: MLflow keeps absolute paths (artifact locations, version storage locations) and so
do the checkpoint pointers under `artifacts/assets/`. `flywheel.json` records where the home was;
opened somewhere else (copied or moved), the home rewrites those paths to where it is now, under
the lock, before anything reads them (`relocate`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from assets.locks import exclusive
from configs import FlywheelConfig, flywheel_home, load_profile

HOME_FILE = "flywheel.json"
LOCK_FILE = "flywheel.lock"
# What every run of one home must share: the seed and data decide the training and benchmark tasks,
# the model what a round continues from, so the gate's paired comparison of two versions is over
# the same tasks. How the benchmark scores and gates (`benchmark.*`: temperature, margin, k) may
# change; the gate itself refuses versions scored with different `gate_k`.
LINEAGE_SECTIONS = ("seed", "data", "model")


class HomeError(RuntimeError):
    """The home cannot be used as asked; the message says why and what to do."""


def writable_home(home: Path | None = None) -> Path:
    """FLYWHEEL_HOME, created if missing; HomeError if it cannot be written (read-only, not a folder)."""
    home = home or flywheel_home()
    try:
        home.mkdir(parents=True, exist_ok=True)
        probe = home / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise HomeError(
            f"FLYWHEEL_HOME {home} cannot be written ({exc.strerror or exc}): give a folder you can write, "
            "e.g. FLYWHEEL_HOME=$HOME/flywheel make run"
        ) from None
    return home


def run_lock(home: Path, command: str) -> contextlib.AbstractContextManager[None]:
    """Held by `make run` / `make resume` for as long as they run; a second is refused at once."""
    return exclusive(
        home / LOCK_FILE,
        f"FLYWHEEL_HOME {home}",
        {"command": command},
        then="One `make run` or `make resume` at a time works on a home: wait for it to finish (or stop it), "
        "or run this one in another home (FLYWHEEL_HOME=<folder>).",
    )


def remembered(home: Path) -> dict[str, Any] | None:
    """The home's record: {"profile", "overrides", "lineage", "path"}, or None for a new home."""
    path = home / HOME_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HomeError(f"{path} is not readable JSON ({exc}); it records this home's settings") from None
    if not isinstance(record, dict) or "profile" not in record:
        raise HomeError(f"{path} does not hold a home record (no 'profile')")
    return record


def lineage(cfg: FlywheelConfig) -> dict[str, Any]:
    dumped = cfg.model_dump(mode="json")
    return {"profile": cfg.profile, **{k: dumped[k] for k in LINEAGE_SECTIONS}}


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


def lineage_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`field: old -> new` for each lineage field that differs."""
    a, b = _flat(old), _flat(new)
    keys = sorted(set(a) | set(b), key=lambda k: (k not in ("profile", "seed"), k))  # the profile and seed first
    return [f"{key}: {a.get(key)!r} -> {b.get(key)!r}" for key in keys if a.get(key) != b.get(key)]


def check_lineage(home: Path, cfg: FlywheelConfig) -> None:
    """HomeError if the home holds another lineage than `cfg`'s, naming every field that differs."""
    record = remembered(home)
    if record is None or "lineage" not in record:
        return
    differences = lineage_differences(record["lineage"], lineage(cfg))
    if differences:
        listed = "\n".join(f"  {d}" for d in differences[:12]) + (
            f"\n  … and {len(differences) - 12} more" if len(differences) > 12 else ""
        )
        bound = record["lineage"]
        example = (
            f"FLYWHEEL_HOME={home}-seed{cfg.seed} make run PROFILE={cfg.profile} SEED={cfg.seed}"
            if bound.get("seed") != cfg.seed
            else f"FLYWHEEL_HOME={home}-2 make run …  (the same arguments)"
        )
        raise HomeError(
            f"FLYWHEEL_HOME {home} holds a flywheel of profile {bound['profile']!r} (seed {bound.get('seed')}); "
            f"this run differs in what all runs of a home share (its tasks and model):\n{listed}\n"
            "A home is one lineage: its versions are gated against each other on the same benchmark tasks. "
            f"Run this one in its own home, e.g.\n  {example}\nor delete this one first (make clean)."
        )


def remember(home: Path, profile: str, overrides: dict[str, Any], cfg: FlywheelConfig, *, bind: bool = False) -> None:
    """Record the settings of the run starting on the home (what later commands use). The lineage
    binds the home once `bind` says its foundation succeeded: a first run that failed before it
    (a bad task file, say) does not tie the home to the settings that failed."""
    record = remembered(home) or {}
    record.update(profile=profile, overrides=overrides, path=str(home))
    if bind and "lineage" not in record:
        record["lineage"] = lineage(cfg)
    _write_record(home, record)


def settings(home: Path, profile: str | None, overrides: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The profile and overrides a command on this home uses: the home's own (those of its last
    `make run`), with `overrides` on top; an explicit `profile` other than the home's replaces
    both. A home with no record: `profile` or FLYWHEEL_PROFILE or tiny, and `overrides`."""
    record = remembered(home) if home.is_dir() else None
    if record is None or (profile and profile != record["profile"]):
        return profile or os.environ.get("FLYWHEEL_PROFILE") or "tiny", overrides
    return record["profile"], {**record.get("overrides", {}), **overrides}


def config_for(profile: str | None, overrides: dict[str, Any]) -> FlywheelConfig:
    """The configuration a registry, audit or serve command uses on FLYWHEEL_HOME (see `settings`)."""
    home = flywheel_home()
    profile, overrides = settings(home, profile, overrides)
    return load_profile(profile, overrides)


# --- relocation ---------------------------------------------------------------------------------


def relocate(home: Path) -> list[str]:
    """If the home was recorded elsewhere, rewrite the absolute paths it holds (MLflow's sqlite
    store, the checkpoint pointers) from there to here; returns what was rewritten. Run under
    the home's lock, before anything reads those paths."""
    record = remembered(home) or {}
    old, new = record.get("path") or _path_in_mlflow(home), str(home)
    if not old or old == new:
        return []
    changed = []
    db = home / "mlflow.db"
    if db.is_file():
        changed += [f"mlflow.db {what}" for what in _rewrite_sqlite(db, old, new)]
    changed += [str(p.relative_to(home)) for p in _rewrite_pointers(home / "artifacts" / "assets", old, new)]
    if record:
        record["path"] = new
        _write_record(home, record)
    return changed


def _path_in_mlflow(home: Path) -> str | None:
    """Where a home without a record (made before homes had one) was: its MLflow experiments'
    artifact location is `<home>/mlartifacts`."""
    db = home / "mlflow.db"
    if not db.is_file():
        return None
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        try:
            rows = conn.execute("SELECT artifact_location FROM experiments").fetchall()
        except sqlite3.Error:
            return None
    for (location,) in rows:
        path = str(location or "").removeprefix("file://")
        if path.endswith("/mlartifacts"):
            return path.removesuffix("/mlartifacts")
    return None


def _write_record(home: Path, record: dict[str, Any]) -> None:
    tmp = home / f".{HOME_FILE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, home / HOME_FILE)


def _rewrite_sqlite(db: Path, old: str, new: str) -> list[str]:
    """Every text value under `old/` (or equal to it) in every table, rewritten under `new`: the
    experiments' and runs' artifact locations, model versions' storage locations and sources,
    logged models, traces, params and tags that name a checkpoint."""
    changed = []
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn, conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            columns = [
                r[1]
                for r in conn.execute(f'PRAGMA table_info("{table}")')
                if "CHAR" in r[2].upper() or "TEXT" in r[2].upper()
            ]
            for column in columns:
                count = conn.execute(
                    f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?) WHERE instr("{column}", ?) > 0',
                    (old + "/", new + "/", old + "/"),
                ).rowcount
                count += conn.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE "{column}" = ?', (new, old)).rowcount
                if count:
                    changed.append(f"{table}.{column} ({count})")
    return changed


def _rewrite_pointers(assets_dir: Path, old: str, new: str) -> Iterator[Path]:
    """JSON records under artifacts/assets that name paths under `old`, rewritten with a new
    manifest (each is verified first: a corrupt record is left for its reader to report)."""
    from assets.artifacts import SIDECAR_SUFFIX, verify_file, write_bytes

    if not assets_dir.is_dir():
        return
    for path in sorted(assets_dir.rglob("*.json")):
        if path.name.endswith(SIDECAR_SUFFIX):
            continue
        text = path.read_text()
        if old + "/" not in text and f'"{old}"' not in text:
            continue
        try:
            manifest = verify_file(path, path.parent.name)
        except Exception:  # noqa: BLE001 - its reader names the corruption; relocation must not hide it
            continue
        provenance = {
            k: v for k, v in manifest.items() if k not in ("schema_version", "artifact", "created_at", "files")
        }
        rewritten = text.replace(old + "/", new + "/").replace(f'"{old}"', f'"{new}"')
        write_bytes(str(path), rewritten.encode(), manifest["artifact"], provenance)
        yield path


def located(home: Path | None = None) -> Path:
    """The home, its stored paths rewritten first if it moved: what a command that reads the home
    (`make models/promote/rollback/serve/audit`, the Dagster definitions) calls before it opens
    MLflow. A home that did not move is not locked (a run may be going on); one that moved is
    relocated under its lock (waiting up to a minute for a run that holds it)."""
    home = home or flywheel_home()
    if not home.is_dir():
        return home
    was = (remembered(home) or {}).get("path") or _path_in_mlflow(home)
    if not was or was == str(home):
        return home
    writable_home(home)
    with exclusive(home / LOCK_FILE, f"FLYWHEEL_HOME {home}", {"command": "relocate"}, wait_s=60):
        moved = relocate(home)
    if moved:
        print(f"[flywheel] this home moved to {home}: rewrote the stored paths in {', '.join(moved)}", file=sys.stderr)
    return home

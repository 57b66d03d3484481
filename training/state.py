"""Resumable training state: what a loop killed mid-way (SFT, an RL round) needs to continue bit
for bit on re-execution. Kept on local disk next to the artifact cache (`cache/sft-state`,
`cache/rl-state/round-N`), one folder per saved step, and removed once the loop's output exists.
Each folder carries a MANIFEST.json (sha256 and size per file), checked before it is resumed."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import warnings
from pathlib import Path

import torch

from training.data_parallel import DataParallel

MANIFEST = "MANIFEST.json"


class CorruptState(RuntimeError):
    """A saved state no longer matches its manifest: resuming from it would train on damaged weights."""


def _digests(folder: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        h = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        out[path.relative_to(folder).as_posix()] = {"sha256": h.hexdigest(), "bytes": path.stat().st_size}
    return out


def fingerprint(**parts) -> str:
    """What identifies a loop's run (its config, seed, inputs): state of another one is never resumed."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_state(
    state_dir: Path,
    step: int,
    key: str,
    engines: dict,
    rng: random.Random | None,
    generator: torch.Generator,
    progress,
    dp: DataParallel = DataParallel(),
) -> None:
    """Everything a resumed loop needs to continue bitwise: engines (weights, optimizer,
    scheduler), RNG states, the step counter and `progress` (what the loop has produced so far).
    Written to a temporary folder and renamed, then LATEST is replaced: a kill at any moment
    leaves the previous state intact. Collective under data parallelism: every rank writes its
    engines' shards (DeepSpeed's ZeRO partitions), rank 0 the rest; ranks hold the same loop state."""
    state_dir.mkdir(parents=True, exist_ok=True)
    final = state_dir / f"step-{step:05d}"
    tmp = state_dir / f".tmp-step-{step:05d}"
    if dp.leader:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    dp.barrier()
    for name, engine in engines.items():
        engine.save_state(tmp / name)
    dp.barrier()
    if dp.leader:
        torch.save(
            {
                "step": step,
                "fingerprint": key,
                "python_rng": rng.getstate() if rng else None,
                "generator": generator.get_state(),
                "torch_rng": torch.get_rng_state(),
                "result": progress,
            },
            tmp / "loop.pt",
        )
        (tmp / MANIFEST).write_text(json.dumps(_digests(tmp), indent=1))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        latest_tmp = state_dir / ".LATEST.tmp"
        latest_tmp.write_text(final.name)
        latest_tmp.replace(state_dir / "LATEST")
        for old in state_dir.glob("step-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    dp.barrier()


def load_state(state_dir: Path | None, key: str) -> tuple[Path, dict] | None:
    """The latest complete state of this same loop (same fingerprint), or None."""
    if state_dir is None or not (state_dir / "LATEST").exists():
        return None
    folder = state_dir / (state_dir / "LATEST").read_text().strip()
    expected = json.loads((folder / MANIFEST).read_text()) if (folder / MANIFEST).exists() else None
    found = _digests(folder) if folder.is_dir() else {}
    if expected != found:
        damaged = sorted(name for name in {*(expected or {}), *found} if (expected or {}).get(name) != found.get(name))
        raise CorruptState(
            f"resume state {folder} does not match its manifest ({'no manifest' if expected is None else 'files ' + ', '.join(damaged)}): "
            f"delete {state_dir} to start this loop over, then re-execute"
        )
    try:
        loop = torch.load(folder / "loop.pt", weights_only=False)  # our own file, written by save_state, checked above
    except (
        ModuleNotFoundError,
        AttributeError,
    ) as exc:  # its classes moved since (e.g. training.rl_loop -> training.rl.loop)
        warnings.warn(
            f"resume state {folder} was written by another version of the code ({exc}); the loop starts over",
            stacklevel=2,
        )
        return None
    if loop["fingerprint"] != key:
        return None  # another config or run: never resume across them
    return folder, loop

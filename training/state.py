"""Resumable training state: what a loop killed mid-way (SFT, an RL round) needs to continue bit
for bit on re-execution. Kept on local disk next to the artifact cache (`cache/sft-state`,
`cache/rl-state/round-N`), one folder per saved step, and removed once the loop's output exists.
Each folder carries a MANIFEST.json (sha256 and size per file), checked before it is resumed.

What a loop has produced so far (an RL round's rollouts, a history) grows with every step, so it
is not in the step folder: it goes to a journal beside it, one file per entry (`journal/00000.pt`),
each written once. A save writes only the entries added since the last one and records how many
there are and a digest over them, so a save's size and time do not grow with the step count."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from training.data_parallel import DataParallel

MANIFEST = "MANIFEST.json"
JOURNAL = "journal"


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
    journal: Sequence = (),
) -> None:
    """Everything a resumed loop needs to continue bitwise: engines (weights, optimizer,
    scheduler), RNG states, the step counter, `progress` (the loop's small state, of fixed size)
    and `journal` (what the loop has produced so far, one entry per item, appended to only).
    Written to a temporary folder and renamed, then LATEST is replaced: a kill at any moment
    leaves the previous state intact (journal entries past its count are ignored, then rewritten).
    Collective under data parallelism: every rank writes its engines' shards (DeepSpeed's ZeRO
    partitions), rank 0 the rest; ranks hold the same loop state."""
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
        _append_journal(state_dir / JOURNAL, journal, _saved_entries(state_dir, key))
        torch.save(
            {
                "step": step,
                "fingerprint": key,
                "python_rng": rng.getstate() if rng else None,
                "generator": generator.get_state(),
                "torch_rng": torch.get_rng_state(),
                "result": progress,
                "journal_entries": len(journal),
                "journal_digest": _journal_digest(state_dir / JOURNAL, len(journal)),
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
        if loop["fingerprint"] != key:
            return None  # another config or run: never resume across them
        loop["journal"] = _read_journal(state_dir / JOURNAL, loop["journal_entries"], loop["journal_digest"])
    except (ModuleNotFoundError, AttributeError, KeyError) as exc:
        # its classes moved since (e.g. training.rl_loop -> training.rl.loop), or it predates the journal
        warnings.warn(
            f"resume state {folder} was written by another version of the code ({exc!r}); the loop starts over",
            stacklevel=2,
        )
        return None
    return folder, loop


# The journal. Each entry is `NNNNN.pt` plus `NNNNN.sha256` (its digest, so that a save can compute
# the digest over all entries without reading them). Only the leader writes it.


def _entry(journal_dir: Path, index: int) -> Path:
    return journal_dir / f"{index:05d}.pt"


def _saved_entries(state_dir: Path, key: str) -> int:
    """How many entries the latest saved state of this same loop counts (0: none, or another loop's)."""
    if not (state_dir / "LATEST").exists():
        return 0
    try:
        loop = torch.load(state_dir / (state_dir / "LATEST").read_text().strip() / "loop.pt", weights_only=False)
    except (OSError, ModuleNotFoundError, AttributeError, RuntimeError):
        return 0
    return loop.get("journal_entries", 0) if loop.get("fingerprint") == key else 0


def _append_journal(journal_dir: Path, journal: Sequence, saved: int) -> None:
    """Write entries `saved`.. (those after the last save, or all of them for a new loop)."""
    journal_dir.mkdir(parents=True, exist_ok=True)
    for index in range(min(saved, len(journal)), len(journal)):
        path = _entry(journal_dir, index)
        tmp = path.with_suffix(".tmp")
        torch.save(journal[index], tmp)
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        tmp.replace(path)
        path.with_suffix(".sha256").write_text(digest)


def _journal_digest(journal_dir: Path, count: int) -> str:
    parts = [_entry(journal_dir, i).with_suffix(".sha256").read_text() for i in range(count)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _read_journal(journal_dir: Path, count: int, expected: str | None) -> list:
    """The first `count` entries, checked against the digest the state recorded; entries past
    `count` (written by a save that was killed before it completed) are removed."""
    digests = []
    for i in range(count):
        path = _entry(journal_dir, i)
        if not path.exists():
            raise CorruptState(
                f"resume state journal {journal_dir} lacks entry {path.name}: delete {journal_dir.parent}"
            )
        digests.append(hashlib.sha256(path.read_bytes()).hexdigest())
    if count and hashlib.sha256("\n".join(digests).encode()).hexdigest() != expected:
        raise CorruptState(
            f"resume state journal {journal_dir} does not match the digest its state recorded: "
            f"delete {journal_dir.parent} to start this loop over, then re-execute"
        )
    for stale in journal_dir.glob("*") if journal_dir.is_dir() else []:
        if stale.suffix in (".pt", ".sha256", ".tmp") and (not stale.stem.isdigit() or int(stale.stem) >= count):
            stale.unlink()
    return [torch.load(_entry(journal_dir, i), weights_only=False) for i in range(count)]

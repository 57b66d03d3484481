"""`make clean`: delete FLYWHEEL_HOME, but only a flywheel home that no run holds.

A home is a folder `make run` made: it holds `flywheel.json` (pipelines/home.py), a JSON object
with the home's `profile`. Any other folder (a typo'd or pasted FLYWHEEL_HOME=$HOME) is refused
and nothing is deleted; so is a home that a `make run` or `make resume` holds (its
`flywheel.lock`, taken here for the whole deletion so none can start half-way) and a home that
is a symbolic link (`rm -rf` would delete the link, and rmtree refuses one). A home that does not
exist or is an empty folder leaves nothing to do.

Exit status: 0 deleted or nothing to do; 2 FLYWHEEL_HOME set but empty; 3 held by a run; 4 not
a flywheel home; 1 the deletion failed. Standard library only (it runs before set-up, with the
system python3).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from pathlib import Path

HOME_FILE = "flywheel.json"  # pipelines.home.HOME_FILE
LOCK_FILE = "flywheel.lock"  # pipelines.home.LOCK_FILE
NOT_DELETED = "nothing deleted"


def is_home(home: Path) -> bool:
    try:
        record = json.loads((home / HOME_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and "profile" in record


def take_lock(path: Path) -> int | bool:
    """The lock's file descriptor, held until it is closed; False if a run holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    return fd


def held(home: Path, lock_path: Path) -> int:
    holder = lock_path.read_text(errors="replace").strip()
    print(f"FLYWHEEL_HOME {home} is held by a make run or resume ({holder}): {NOT_DELETED}")
    return 3


def clean(raw: str | None) -> int:
    if not raw:
        print(f"FLYWHEEL_HOME is {'set but empty' if raw == '' else 'not set'}: {NOT_DELETED}")
        return 2
    home = Path(raw)
    if home.is_symlink():
        print(
            f"FLYWHEEL_HOME {home} is a symbolic link (to {os.readlink(home)}): {NOT_DELETED}; "
            "give the folder it points to"
        )
        return 4
    if not home.exists():
        print(f"FLYWHEEL_HOME {home} does not exist: nothing to delete")
        return 0
    if not home.is_dir():
        print(f"FLYWHEEL_HOME {home} is not a folder: {NOT_DELETED}")
        return 4
    lock_path = home / LOCK_FILE
    # the lock first: a run in its first seconds holds it before it writes the home's record
    lock = take_lock(lock_path) if lock_path.is_file() else None
    if lock is False:
        return held(home, lock_path)
    if not is_home(home):
        entries = sorted(p.name for p in home.iterdir())
        if not entries:
            print(f"FLYWHEEL_HOME {home} is an empty folder: nothing to delete")
            return 0
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        print(
            f"FLYWHEEL_HOME {home} is not a flywheel home: it has no {HOME_FILE} with the home's profile, which "
            f"`make run` writes into every home it makes. It holds {shown}: {NOT_DELETED}. "
            "Check FLYWHEEL_HOME; if this folder is what you want gone, delete it yourself."
        )
        return 4
    if lock is None:  # a home from before locks: taken all the same, so no run starts half-way
        lock = take_lock(lock_path)
    if lock is False:
        return held(home, lock_path)
    try:
        shutil.rmtree(home)
    except OSError as exc:
        print(f"FLYWHEEL_HOME {home}: deleting failed at {exc.filename} ({exc.strerror or exc})")
        return 1
    finally:
        os.close(lock)
    print(f"deleted FLYWHEEL_HOME {home}")
    return 0


if __name__ == "__main__":
    sys.exit(clean(os.environ.get("FLYWHEEL_HOME")))

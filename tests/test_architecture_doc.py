"""docs/architecture.md matches the tree: its package table names every product module, and every
module path or `module::name` it cites exists (issue 25)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
PACKAGES = ("configs", "verifiers", "environments", "training", "assets", "pipelines")


def _table_row(package: str) -> str:
    rows = [line for line in DOC.splitlines() if line.startswith(f"| `{package}/` |")]
    assert len(rows) == 1, f"docs/architecture.md: one row of the package table for {package}/, found {len(rows)}"
    return rows[0]


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_table_names_exactly_the_modules_of_each_package(package):
    named = set(re.findall(r"`([a-z0-9_/]+\.py)`", _table_row(package)))
    on_disk = {
        p.relative_to(ROOT / package).as_posix() for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py"
    }
    assert not on_disk - named, (
        f"docs/architecture.md: {package}/ modules missing from its row: {sorted(on_disk - named)}"
    )
    assert not named - on_disk, (
        f"docs/architecture.md: {package}/ row names modules that do not exist: {sorted(named - on_disk)}"
    )


def _defines(path: Path, name: str) -> bool:
    pattern = rf"^\s*(def|class|async def)\s+{re.escape(name)}\b|^{re.escape(name)}\s*[:=]|^\s*{re.escape(name)}\s*[:=]"
    return re.search(pattern, path.read_text(), flags=re.M) is not None


def test_every_path_and_name_the_doc_cites_exists():
    missing = []
    for path, name in re.findall(r"`((?:[a-z_]+/)+[a-zA-Z0-9_.-]+\.py)(?:::([A-Za-z_][A-Za-z0-9_]*))?", DOC):
        # a path from the repository root, or (in the package table) from its package
        file = next((f for f in [ROOT / path, *(ROOT / p / path for p in PACKAGES)] if f.exists()), ROOT / path)
        if not file.exists():
            missing.append(path)
        elif name and not _defines(file, name):
            missing.append(f"{path}::{name}")
    for module, name in re.findall(
        r"`((?:%s)(?:\.[a-z_]+)+)(?:::([A-Za-z_][A-Za-z0-9_]*))?`" % "|".join(PACKAGES), DOC
    ):
        file = ROOT / (module.replace(".", "/") + ".py")
        package = ROOT / module.replace(".", "/")
        if not file.exists() and not package.is_dir():
            # `pkg.module.attr`: the longest prefix that is a module must define the rest
            parts = module.split(".")
            owner = next(
                (i for i in range(len(parts) - 1, 0, -1) if (ROOT / ("/".join(parts[:i]) + ".py")).exists()), None
            )
            if owner is None or not _defines(ROOT / ("/".join(parts[:owner]) + ".py"), parts[owner]):
                missing.append(module)
        elif name and file.exists() and not _defines(file, name):
            missing.append(f"{module}::{name}")
    assert not missing, f"docs/architecture.md cites what the tree does not have: {sorted(set(missing))}"

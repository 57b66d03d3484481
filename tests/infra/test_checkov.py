"""checkov over the Terraform tree (infra/terraform) and the Dockerfiles (docker/), offline.

checkov lives in a venv of its own, .venv-tools (`scripts/setup.sh --tools`, which `make test`
runs): it ships a module named `hcl2` that would shadow the python-hcl2 the other Terraform tests
import from .venv. It runs as a subprocess with everything that calls home switched off:
`--skip-download` and BC_SKIP_MAPPING (no policy metadata or guideline mapping from the Prisma
Cloud platform), CKV_SKIP_PACKAGE_UPDATE_CHECK (no PyPI version check), no API key, and a scratch
HOME and working directory so that no stray .checkov.yaml can add a `skip-check`.

Terraform is scanned twice. Once over infra/terraform/modules, where each module is evaluated on
its own, with its defaults: every module must be secure as it stands. Once over the whole tree,
where checkov evaluates a called module only through its caller, with the values the
environments pass: the platform as deployed must pass too.

The rules:
* no failed check, reported per module, for the whole tree, and per Dockerfile, each failure as
  `CHECK_ID resource file:line` (plus the module call it was evaluated through);
* the only suppressions are inline `#checkov:skip=CKV_ID:<reason>` comments whose reason is a
  sentence that says why;
* the scan can fail: a copy of a module with one protection removed reports the matching check,
  and a skip whose reason is cut to "false positive" is refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM_DIR = ROOT / "infra" / "terraform"
DOCKER_DIR = ROOT / "docker"
CHECKOV = ROOT / ".venv-tools" / "bin" / "checkov"

pytestmark = pytest.mark.skipif(
    not CHECKOV.exists(),
    reason=f"checkov is not installed at {CHECKOV.relative_to(ROOT)}: `make test` installs it (scripts/setup.sh --tools)",
)

# Variables that would point checkov at the platform or change which checks run.
PLATFORM_PREFIXES = ("BC_", "CKV_", "PRISMA_", "CHECKOV_")
OFFLINE = {"BC_SKIP_MAPPING": "TRUE", "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true", "LOG_LEVEL": "WARNING"}
MIN_REASON_WORDS = 5
PLACEHOLDER_REASONS = {
    "skip",
    "skipped",
    "ignore",
    "ignored",
    "false positive",
    "not needed",
    "not applicable",
    "n/a",
    "na",
    "todo",
}


@dataclass(frozen=True)
class Finding:
    check_id: str
    resource: str
    path: Path  # absolute
    line: int
    result: str  # "failed", "skipped" or "passed"
    reason: str | None  # an inline skip's justification
    caller: str | None  # the module call a module resource was evaluated through, if any

    def where(self, base: Path) -> str:
        path = self.path.relative_to(base) if self.path.is_relative_to(base) else self.path
        via = f" (through the module call in {self.caller.lstrip('/')})" if self.caller else ""
        return f"{self.check_id} {self.resource} {path}:{self.line}{via}"


@dataclass(frozen=True)
class Scan:
    findings: list[Finding]
    parsing_errors: list[str]

    def of(self, result: str, under: Path | None = None) -> list[Finding]:
        return [f for f in self.findings if f.result == result and (under is None or f.path.is_relative_to(under))]


def run_checkov(directory: Path, framework: str, scratch: Path) -> Scan:
    env = (
        {k: v for k, v in os.environ.items() if not k.startswith(PLATFORM_PREFIXES)} | OFFLINE | {"HOME": str(scratch)}
    )
    command = [
        str(CHECKOV),
        "--directory",
        str(directory),
        "--framework",
        framework,
        "--skip-download",
        "--download-external-modules",
        "false",
        "--output",
        "json",
        "--compact",
    ]
    done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
    # 0: every check passed, 1: some failed; anything else is a crash.
    assert done.returncode in (0, 1), f"checkov exited {done.returncode}:\n{done.stderr[-4000:]}"
    reports = json.loads(done.stdout)
    findings, errors = [], []
    for report in reports if isinstance(reports, list) else [reports]:
        results = report.get("results", {})  # absent when the directory held nothing to scan
        errors += results.get("parsing_errors", [])
        for result in ("failed", "skipped", "passed"):
            for check in results.get(f"{result}_checks", []):
                findings.append(
                    Finding(
                        check_id=check["check_id"],
                        resource=check["resource"],
                        path=Path(check["file_abs_path"]),
                        line=check["file_line_range"][0],
                        result=result,
                        reason=(check.get("check_result") or {}).get("suppress_comment"),
                        caller=check.get("caller_file_path"),
                    )
                )
    return Scan(findings, errors)


def unjustified(reason: str | None) -> str | None:
    """Why an inline skip's reason does not justify it, or None when it does."""
    if reason is None:
        return "not an inline #checkov:skip (no suppress_comment): suppress in the file, next to the code"
    text = reason.strip().rstrip(".").lower()
    if text in PLACEHOLDER_REASONS or text.startswith(("todo", "fixme")):
        return f"placeholder reason {reason!r}"
    if len(text.split()) < MIN_REASON_WORDS:
        return f"reason {reason!r} is shorter than {MIN_REASON_WORDS} words: say why the check does not apply"
    return None


def module_dirs() -> list[Path]:
    return sorted(p for p in (TERRAFORM_DIR / "modules").iterdir() if p.is_dir() and list(p.glob("*.tf")))


def failures(findings: list[Finding]) -> str:
    return f"{len(findings)} failed checkov checks:\n" + "\n".join(sorted(f.where(ROOT) for f in findings))


@pytest.fixture(scope="module")
def modules_scan(tmp_path_factory) -> Scan:
    return run_checkov(TERRAFORM_DIR / "modules", "terraform", tmp_path_factory.mktemp("checkov-home"))


@pytest.fixture(scope="module")
def tree_scan(tmp_path_factory) -> Scan:
    return run_checkov(TERRAFORM_DIR, "terraform", tmp_path_factory.mktemp("checkov-home"))


@pytest.fixture(scope="module")
def docker_scan(tmp_path_factory) -> Scan:
    return run_checkov(DOCKER_DIR, "dockerfile", tmp_path_factory.mktemp("checkov-home"))


@pytest.mark.xdist_group("checkov")  # the tests of the module's three scans: each scan once, on one worker
def test_checkov_parses_every_file(modules_scan, tree_scan, docker_scan):
    # A file checkov cannot parse is silently left out of every check.
    assert not modules_scan.parsing_errors + tree_scan.parsing_errors + docker_scan.parsing_errors


@pytest.mark.xdist_group("checkov")
@pytest.mark.parametrize("directory", module_dirs(), ids=lambda d: d.name)
def test_module_passes_checkov_with_its_defaults(modules_scan, directory):
    if any(re.search(r'^(resource|data) "', p.read_text(), re.M) for p in directory.glob("*.tf")):
        assert modules_scan.of("passed", directory) + modules_scan.of("failed", directory), (
            f"checkov checked nothing in {directory}"
        )
    failed = modules_scan.of("failed", directory)
    assert not failed, failures(failed)


@pytest.mark.xdist_group("checkov")
def test_terraform_tree_as_deployed_passes_checkov(tree_scan):
    failed = tree_scan.of("failed")
    assert not failed, failures(failed)


@pytest.mark.xdist_group("checkov")
@pytest.mark.parametrize("dockerfile", sorted(DOCKER_DIR.glob("*.Dockerfile")), ids=lambda p: p.name)
def test_dockerfile_passes_checkov(docker_scan, dockerfile):
    assert [f for f in docker_scan.findings if f.path == dockerfile], f"checkov checked nothing in {dockerfile}"
    failed = [f for f in docker_scan.of("failed") if f.path == dockerfile]
    assert not failed, failures(failed)


@pytest.mark.xdist_group("checkov")
def test_every_skip_is_inline_and_justified(modules_scan, tree_scan, docker_scan):
    skipped = modules_scan.of("skipped") + tree_scan.of("skipped") + docker_scan.of("skipped")
    bad = sorted(f"{f.where(ROOT)}: {why}" for f in skipped if (why := unjustified(f.reason)))
    assert not bad, "checkov suppressions without a justification:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("reason", "ok"),
    [
        (None, False),
        ("skip", False),
        ("False positive.", False),
        ("TODO: look at this later", False),
        ("not used here", False),
        ('A KMS key policy\'s Resource "*" means the key the policy is attached to.', True),
    ],
)
def test_unjustified_reasons_are_refused(reason, ok):
    assert (unjustified(reason) is None) is ok


# The scan is not vacuous: break one protection in a copy of a module and checkov must say so.
# Each case: module, (pattern, replacement) edits to its main.tf, the check that must then fail,
# and the check whose inline skip must then be refused (None: no skip edited).
BREAKAGES = {
    "bucket-public-policy-allowed": (
        "storage",
        [
            (r"block_public_policy\s*=\s*true", "block_public_policy = false"),
            (r"(checkov:skip=CKV_AWS_144):[^\n]*", r"\1:false positive"),
        ],
        "CKV_AWS_54",
        "CKV_AWS_144",
    ),
    "database-unencrypted": (
        "database",
        [(r"storage_encrypted\s*=\s*true", "storage_encrypted = false")],
        "CKV_AWS_16",
        None,
    ),
}


@pytest.mark.parametrize("case", BREAKAGES)
def test_checkov_catches_a_broken_module(case, tmp_path):
    name, edits, must_fail, must_refuse = BREAKAGES[case]
    copy = tmp_path / name
    shutil.copytree(TERRAFORM_DIR / "modules" / name, copy)
    main = copy / "main.tf"
    text = main.read_text()
    for pattern, replacement in edits:
        text, count = re.subn(pattern, replacement, text)
        assert count == 1, f"{pattern!r} matched {count} times in modules/{name}/main.tf: update this test's edit"
    main.write_text(text)
    (tmp_path / "home").mkdir()

    scan = run_checkov(copy, "terraform", tmp_path / "home")
    assert must_fail in {f.check_id for f in scan.of("failed")}, [f.where(tmp_path) for f in scan.of("failed")]
    if must_refuse:
        refused = {f.check_id for f in scan.of("skipped") if unjustified(f.reason)}
        assert refused == {must_refuse}

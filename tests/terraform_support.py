"""Shared helpers for the offline Terraform tests (tests/test_terraform_*.py).

Nothing here needs a provider, a plan or an AWS account: Terraform directories are parsed with
python-hcl2 into plain Python values, variable validations are evaluated by `terraform console`
in an empty directory (built-in functions only), and `terraform validate` runs only against
providers already on disk (`/opt/tf-plugins`, or TF_PLUGIN_DIR), never downloading one."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import hcl2
import pytest

ROOT = Path(__file__).resolve().parents[1]
TERRAFORM_DIR = ROOT / "infra" / "terraform"
MODULES_DIR = TERRAFORM_DIR / "modules"
ENVIRONMENTS_DIR = TERRAFORM_DIR / "environments"
PLUGIN_DIR = Path(os.environ.get("TF_PLUGIN_DIR", "/opt/tf-plugins"))

# Plain Python values: strings without their quotes, nested blocks as lists of dicts without
# round-trip markers, heredocs as text. Expressions stay strings such as "${var.gpu_max_nodes}".
PLAIN = hcl2.SerializationOptions(
    strip_string_quotes=True, explicit_blocks=False, with_comments=False, preserve_heredocs=False
)

needs_terraform = pytest.mark.skipif(shutil.which("terraform") is None, reason="the terraform CLI is not installed")


class Module:
    """All .tf files of one Terraform directory, merged by top-level block kind."""

    def __init__(self, path: Path):
        self.path = path
        self.name = path.name
        self.blocks: dict[str, list[dict]] = {}
        paths = sorted(path.glob("*.tf"))
        assert paths, f"no .tf files in {path}"
        for file in paths:
            with file.open() as f:
                for kind, entries in hcl2.load(f, serialization_options=PLAIN).items():
                    self.blocks.setdefault(kind, []).extend(entries)

    def _labelled(self, kind: str) -> dict:
        merged: dict = {}
        for entry in self.blocks.get(kind, []):
            for label, body in entry.items():
                merged.setdefault(label, {}).update(body)
        return merged

    def resources(self, rtype: str) -> dict[str, dict]:
        return self._labelled("resource").get(rtype, {})

    def resource(self, rtype: str, name: str) -> dict:
        found = self.resources(rtype)
        assert name in found, f"{self.name}: no resource {rtype}.{name} (has {sorted(found)})"
        return found[name]

    def data(self, dtype: str) -> dict[str, dict]:
        return self._labelled("data").get(dtype, {})

    @property
    def modules(self) -> dict[str, dict]:
        return self._labelled("module")

    @property
    def variables(self) -> dict[str, dict]:
        return self._labelled("variable")

    @property
    def outputs(self) -> dict[str, dict]:
        return self._labelled("output")

    @property
    def locals(self) -> dict:
        merged: dict = {}
        for entry in self.blocks.get("locals", []):
            merged.update(entry)
        return merged

    def default(self, variable: str):
        assert "default" in self.variables[variable], f"{self.name}: variable {variable} has no default"
        return self.variables[variable]["default"]


@cache
def load(path: Path) -> Module:
    # Parsing is the slow part (~0.5 s a module); many tests read the same files.
    return Module(path)


def module(name: str) -> Module:
    return load(MODULES_DIR / name)


def one(body: dict, block: str) -> dict:
    """The single nested block `block` of a resource body."""
    blocks = body.get(block)
    assert isinstance(blocks, list) and len(blocks) == 1, f"expected exactly one {block} block, got {blocks!r}"
    return blocks[0]


def references(expression, address: str) -> bool:
    """Whether an HCL expression string mentions `address` (e.g. "local.gpu_node_template_tags")."""
    return isinstance(expression, str) and re.search(rf"(?<![\w.]){re.escape(address)}(?![\w])", expression) is not None


def ref(address: str) -> str:
    """How python-hcl2 renders an attribute set to a bare reference."""
    return "${" + address + "}"


# --- Terraform CLI (offline) -----------------------------------------------------------------------


def terraform_env() -> dict[str, str]:
    # No version check call home: CI and developers' machines may have no route out.
    return {**os.environ, "CHECKPOINT_DISABLE": "1"}


def hcl_literal(value) -> str:
    """A Python value as an HCL expression (JSON literals are valid HCL)."""
    return json.dumps(value)


def substitute(condition: str, values: dict) -> str:
    expression = condition.removeprefix("${").removesuffix("}")
    for name, value in values.items():
        expression = re.sub(rf"\bvar\.{name}\b", lambda _, value=value: hcl_literal(value), expression)
    assert "var." not in expression, f"unsubstituted variable in {expression}"
    return expression


def evaluate(conditions: list[str], cwd: Path) -> list[str]:
    """Evaluates boolean HCL expressions in one `terraform console` run: "true", "false" or "error"
    (a condition that fails to evaluate rejects the value, as in a real plan)."""
    wrapped = ", ".join(f'try(({c}) ? "true" : "false", "error")' for c in conditions)
    done = subprocess.run(
        ["terraform", "console"],
        input=f"[{wrapped}]\n",
        cwd=cwd,
        env=terraform_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    results = re.findall(r'"(true|false|error)"', done.stdout)
    assert len(results) == len(conditions), done.stdout
    return results


def required_providers(directory: Path) -> dict[str, dict]:
    """source/version of every provider a directory and the local modules it calls require."""
    found: dict[str, dict] = {}
    seen: set[Path] = set()

    def walk(path: Path) -> None:
        if path in seen:
            return
        seen.add(path)
        parsed = load(path)
        for settings in parsed.blocks.get("terraform", []):
            for providers in settings.get("required_providers", []):
                found.update(providers)
        for body in parsed.modules.values():
            source = body.get("source", "")
            if source.startswith("."):
                walk((path / source).resolve())

    walk(directory.resolve())
    return found


def missing_providers(directory: Path) -> list[str]:
    """Providers of `directory` that are not in PLUGIN_DIR (so `validate` would need the network)."""
    missing = []
    for name, spec in sorted(required_providers(directory).items()):
        source = spec["source"] if "/" in spec["source"] else f"hashicorp/{spec['source']}"
        if not list((PLUGIN_DIR / "registry.terraform.io" / source).glob("*/linux_amd64")):
            missing.append(f"{name} ({source})")
    return missing


def validate(directory: Path, workdir: Path) -> subprocess.CompletedProcess:
    """`terraform init -backend=false` from the local plugin mirror, then `terraform validate`, on a
    copy of the tree (so no .terraform/ or lock file lands in the repo). Skips, naming them, when
    providers are missing from the mirror: fetching them needs registry.terraform.io."""
    missing = missing_providers(directory)
    if missing:
        pytest.skip(f"providers not in {PLUGIN_DIR}: {', '.join(missing)} (terraform validate would download them)")
    copy_root = workdir / "terraform"
    shutil.copytree(
        TERRAFORM_DIR, copy_root, ignore=shutil.ignore_patterns(".terraform", "*.tfstate*", ".terraform.lock.hcl")
    )
    target = copy_root / directory.resolve().relative_to(TERRAFORM_DIR)
    init = subprocess.run(
        ["terraform", "init", "-backend=false", "-input=false", f"-plugin-dir={PLUGIN_DIR}"],
        cwd=target,
        env=terraform_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert init.returncode == 0, f"terraform init in {directory}:\n{init.stdout}{init.stderr}"
    return subprocess.run(
        ["terraform", "validate", "-json"], cwd=target, env=terraform_env(), capture_output=True, text=True, timeout=300
    )


class Validations:
    """Variable validations and preconditions to evaluate together in one `terraform console` run
    (a few seconds each; one per test file instead of one per case)."""

    def __init__(self, modules: dict[str, Module]):
        self.modules = modules
        self.conditions: list[str] = []
        self.expectations: list[tuple[str, bool]] = []

    def expect_conditions(self, label: str, condition_values: list[tuple[str, dict]], accepted: bool) -> None:
        """All of `(condition, {variable: value})` hold together, or (accepted=False) not."""
        self.conditions.append(" && ".join(f"({substitute(c, v)})" for c, v in condition_values))
        self.expectations.append((label, accepted))

    def expect(self, module_name: str, variable: str, value, accepted: bool, label: str | None = None) -> None:
        """`variable` of `module_name` with `value` passes every validation it has (or not)."""
        validations = self.modules[module_name].variables[variable].get("validation", [])
        assert validations, f"{module_name}: variable {variable} has no validation"
        self.expect_conditions(
            label or f"{module_name}.{variable}={value!r}",
            [(v["condition"], {variable: value}) for v in validations],
            accepted,
        )

    def cases(self, cases: list[tuple[str, str, object, bool]]) -> None:
        for module_name, variable, value, accepted in cases:
            self.expect(module_name, variable, value, accepted)

    def defaults(self, *module_names: str) -> None:
        # A default its own validation rejects would fail every plan that does not override it.
        for module_name in module_names or tuple(self.modules):
            for variable, body in self.modules[module_name].variables.items():
                if "default" in body and body.get("validation"):
                    self.expect(module_name, variable, body["default"], True, label=f"{module_name}.{variable} default")

    def check(self, workdir: Path) -> None:
        results = evaluate(self.conditions, workdir)
        wrong = [
            f"{label}: expected {'accepted' if accepted else 'rejected'}, got {result}"
            for (label, accepted), result in zip(self.expectations, results)
            if (result == "true") != accepted
        ]
        assert not wrong, "\n".join(wrong)

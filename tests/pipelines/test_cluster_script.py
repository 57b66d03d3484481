"""scripts/cluster.sh, the deployment guide's commands, run against recording stand-ins for
terraform, aws, docker and kubectl: which commands it issues, with which Terraform outputs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CLUSTER_ENV

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster.sh"
FLYWHEEL_ENV = {k: v for k, v in CLUSTER_ENV.items() if k != "DAGSTER_PG_PASSWORD"}

# `terraform -chdir=DIR output [-raw|-json] NAME` answers from these; anything else fails like a
# root module that was never applied.
FAKE_TERRAFORM = r"""#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
chdir = args.pop(0).split("=", 1)[1]
with open(os.environ["CALLS"], "a") as log:
    log.write(json.dumps(["terraform", chdir] + args) + "\n")
outputs = json.loads(os.environ["TF_OUTPUTS"]).get(os.path.basename(chdir), {})
if args[0] != "output" or args[-1] not in outputs:
    sys.exit("Error: Output not found")
value = outputs[args[-1]]
print(json.dumps(value) if "-json" in args else value)
"""

RECORDER = r"""#!/usr/bin/env python3
import json, os, sys
with open(os.environ["CALLS"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\n")
"""


def run(tmp_path: Path, *args: str, applied: bool = True) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in {"terraform": FAKE_TERRAFORM, "aws": RECORDER, "docker": RECORDER, "kubectl": RECORDER}.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    outputs = (
        {
            "infra": {
                "region": "us-east-1",
                "cluster_name": "flywheel",
                "namespace": "flywheel",
                "flywheel_env": FLYWHEEL_ENV,
            },
            "platform": {
                "dagster_port_forward_command": "kubectl -n flywheel port-forward svc/dagster-webserver 3000:3000",
                "mlflow_port_forward_command": "kubectl -n flywheel port-forward svc/mlflow 5000:5000",
            },
        }
        if applied
        else {}
    )
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "TF_OUTPUTS": json.dumps(outputs),
    }
    done = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    recorded = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return done, recorded


def test_images_are_built_for_x86_and_pushed_to_the_refs_the_profile_reads(tmp_path):
    done, calls = run(tmp_path, "images")
    assert done.returncode == 0, done.stderr
    builds = [c for c in calls if c[:2] == ["docker", "build"]]
    pushes = [c[2] for c in calls if c[:2] == ["docker", "push"]]
    assert {(c[c.index("-f") + 1], c[c.index("-t") + 1]) for c in builds} == {
        ("docker/trainer.Dockerfile", FLYWHEEL_ENV["FLYWHEEL_TRAINER_IMAGE"]),
        ("docker/dagster.Dockerfile", FLYWHEEL_ENV["FLYWHEEL_IMAGE"]),
        ("docker/sandbox.Dockerfile", FLYWHEEL_ENV["FLYWHEEL_SANDBOX_IMAGE"]),
    }
    assert all("--platform" in c and c[c.index("--platform") + 1] == "linux/amd64" and c[-1] == "." for c in builds)
    assert sorted(pushes) == sorted(
        FLYWHEEL_ENV[k] for k in ("FLYWHEEL_TRAINER_IMAGE", "FLYWHEEL_IMAGE", "FLYWHEEL_SANDBOX_IMAGE")
    )
    login = next(c for c in calls if c[0] == "docker" and c[1] == "login")
    assert login[-1] == "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    assert ["aws", "ecr", "get-login-password", "--region", "us-east-1"] in calls
    for file in ("trainer", "dagster", "sandbox"):
        assert (ROOT / "docker" / f"{file}.Dockerfile").is_file()


def test_kubeconfig_names_the_cluster_and_region_from_the_outputs(tmp_path):
    done, calls = run(tmp_path, "kubeconfig")
    assert done.returncode == 0, done.stderr
    assert ["aws", "eks", "update-kubeconfig", "--region", "us-east-1", "--name", "flywheel"] in calls


def test_env_prints_exports_that_load_the_cluster_profile(tmp_path):
    done, _ = run(tmp_path, "env")
    assert done.returncode == 0, done.stderr
    script = done.stdout + "export DAGSTER_PG_PASSWORD=x\n"
    loaded = subprocess.run(
        [
            "bash",
            "-c",
            script + 'exec "$0" -c "from configs import load_profile; '
            "c = load_profile('cluster'); print(c.storage.root, c.orchestration.k8s.gpu_image)\"",
            os.sys.executable,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k not in CLUSTER_ENV},
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == [FLYWHEEL_ENV["FLYWHEEL_ARTIFACT_ROOT"], FLYWHEEL_ENV["FLYWHEEL_TRAINER_IMAGE"]]


def test_ui_forwards_the_webserver_and_mlflow(tmp_path):
    done, calls = run(tmp_path, "ui")
    assert done.returncode == 0, done.stderr
    forwards = sorted(c[1:] for c in calls if c[0] == "kubectl")
    assert forwards == [
        ["-n", "flywheel", "port-forward", "svc/dagster-webserver", "3000:3000"],
        ["-n", "flywheel", "port-forward", "svc/mlflow", "5000:5000"],
    ]
    assert "Dagster UI on http://localhost:3000, MLflow on http://localhost:5000" in done.stdout


@pytest.mark.parametrize("command", ["images", "kubeconfig", "env"])
def test_before_terraform_apply_it_says_which_step_is_missing(tmp_path, command):
    done, calls = run(tmp_path, command, applied=False)
    assert done.returncode != 0
    assert "run terraform apply there first" in done.stderr and "infra/terraform/environments/aws/infra" in done.stderr
    assert not [c for c in calls if c[0] in ("docker", "kubectl")]


def test_an_unknown_command_prints_the_usage(tmp_path):
    done, _ = run(tmp_path, "deploy")
    assert done.returncode == 2 and "scripts/cluster.sh images" in done.stderr


# --- The deployment guide (docs/deploy.md): every repo command it gives exists -------------------

GUIDE = ROOT / "docs" / "deploy.md"


def guide_commands() -> list[tuple[str, str]]:
    """(working directory, command) of every line in the guide's bash blocks; `cd DIR` moves the
    working directory as it would in the reader's shell."""
    import re
    import shlex

    commands, cwd = [], "."
    for block in re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():  # a line continued with `\` is one command
            line = line.split(" #")[0].strip()
            if not line:
                continue
            words = shlex.split(line)
            if words[0] == "cd":
                cwd = "." if words[1] == "-" else str(Path(cwd) / words[1])
                continue
            commands.append((cwd, line))
    return commands


def test_every_repo_command_in_the_deployment_guide_exists():
    import re
    import shlex

    from tests.terraform_support import load

    make_targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    script = SCRIPT.read_text()
    infra_outputs = set(load(ROOT / "infra/terraform/environments/aws/infra").outputs)
    commands = guide_commands()
    assert len(commands) > 15
    for cwd, line in commands:
        words = shlex.split(line)
        here = (ROOT / cwd).resolve()
        assert here.is_dir(), f"docs/deploy.md: `cd {cwd}` does not exist"
        if words[0] == "scripts/cluster.sh":
            assert f"\n  {words[1]})" in script, f"docs/deploy.md: scripts/cluster.sh has no `{words[1]}` command"
        elif words[0] == "make":
            assert words[1] in make_targets, f"docs/deploy.md: no make target {words[1]!r}"
        elif words[0] == "cp":
            assert (here / words[1]).is_file(), f"docs/deploy.md: `cp {words[1]}` in {cwd}: no such file"
        elif words[0] == "terraform":
            chdir = next((w.split("=", 1)[1] for w in words if w.startswith("-chdir=")), None)
            target = ROOT / chdir if chdir else here
            assert list(target.glob("*.tf")), f"docs/deploy.md: `{line}` runs where there is no Terraform"
            if "output" in words:
                assert words[-1] in infra_outputs, f"docs/deploy.md: no output {words[-1]!r}"
            for var in [w.split("=", 1)[0] for i, w in enumerate(words) if i and words[i - 1] == "-var"]:
                assert var in load(target).variables, f"docs/deploy.md: {target.name} has no variable {var!r}"
        elif words[0].startswith(".venv/") and words[1] == "-m":  # python -m package.module
            assert (ROOT / (words[2].replace(".", "/") + ".py")).is_file(), f"docs/deploy.md: {line}"
        elif words[0].startswith((".venv/", "scripts/", "benchmarks/")):
            assert (ROOT / words[1 if words[0].startswith(".venv/") else 0]).is_file(), f"docs/deploy.md: {line}"
        elif words[0] in ("eval", "export"):
            continue
        else:
            assert words[0] in ("kubectl", "aws", "docker", "curl"), f"docs/deploy.md: unchecked command {line!r}"


def test_the_script_reads_only_outputs_the_layers_have():
    import re

    from tests.terraform_support import load

    infra = set(load(ROOT / "infra/terraform/environments/aws/infra").outputs)
    platform = set(load(ROOT / "infra/terraform/environments/aws/platform").outputs)
    script = SCRIPT.read_text()
    read_infra = set(re.findall(r"infra_output (?:-raw|-json) (\w+)", script))
    read_platform = set(re.findall(r'-chdir="\$PLATFORM_DIR" output -raw (\w+)', script))
    assert read_infra == {"region", "cluster_name", "flywheel_env"} and read_infra <= infra, read_infra - infra
    assert (
        read_platform == {"dagster_port_forward_command", "mlflow_port_forward_command"} and read_platform <= platform
    )
    # the stand-in outputs above are the real output's keys
    assert set(FLYWHEEL_ENV) == set(load(ROOT / "infra/terraform/environments/aws/infra").locals["flywheel_env"])

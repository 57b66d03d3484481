"""Operating a home safely (issue 28): paths with spaces, one `make run` at a time, one lineage per
home, homes that move, the home's own settings for every command, and the smaller refusals.

The costly part, a micro flywheel run through `make run` while a second `make run` tries the same
home, is done once (the module's `operated_home`) in a home whose path holds a space; the tests
below read it or a copy of it."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.operations


def _env(home: Path | str | None, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MLFLOW_TRACKING_URI", "FLYWHEEL_FAILPOINT", "FLYWHEEL_PROFILE", "FLYWHEEL_OVERRIDES", "MAKELEVEL")
        and not k.startswith("MAKE")
    }
    if home is not None:
        env["FLYWHEEL_HOME"] = str(home)
    return {**env, **extra}


def make(home: Path | str | None, *args: str, timeout: float = 900, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), *args],
        env=_env(home, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- 1. paths with spaces ------------------------------------------------------------------------


def test_make_clean_on_a_home_with_a_space_deletes_the_home_and_nothing_else(tmp_path):
    """The issue's reproduction: `make clean` used to run `rm -rf /tmp/x/a b/h`, deleting
    /tmp/x/a and ./b/h and leaving the home."""
    home, neighbour, relative = tmp_path / "a b" / "h", tmp_path / "a", REPO / "b" / "h"
    home.mkdir(parents=True)
    neighbour.mkdir(exist_ok=True)
    assert not (REPO / "b").exists(), "the repository has a ./b: this test would delete it if the recipe broke"
    (home / "state").write_text("x")
    (home / "flywheel.json").write_text(json.dumps({"profile": "micro"}))  # what makes it a home `make clean` deletes
    try:
        proc = make(home, "clean")
        assert proc.returncode == 0, proc.stderr
        assert not home.exists() and neighbour.is_dir() and not relative.exists()
    finally:
        shutil.rmtree(REPO / "b", ignore_errors=True)


def test_every_recipe_quotes_the_home_and_the_shell_lint_refuses_one_that_does_not(tmp_path):
    """`make dagster-ui`, `mlflow-ui` and `audit` build commands whose home path is one word; the
    lint (`make lint` runs scripts/lint_shell.sh) passes on the Makefile and fails, naming the
    target, on one with the old unquoted `rm -rf $(FLYWHEEL_HOME)`."""
    home = tmp_path / "a b" / "h"
    # make runs each recipe for real, on a stand-in `python` (the UI's `-m pipelines.ui`) and `mlflow`
    # that record what they got
    fake = tmp_path / "venv"
    (fake / "bin").mkdir(parents=True)
    for tool in ("python", "mlflow"):
        script = fake / "bin" / tool
        script.write_text('#!/bin/sh\nprintf "%s\\n" "DAGSTER_HOME=$DAGSTER_HOME" "$@" > "$RECORD"\n')
        script.chmod(0o755)
    for target, expected in (
        ("dagster-ui", f"DAGSTER_HOME={home}/dagster"),
        ("mlflow-ui", f"sqlite:///{home}/mlflow.db"),
    ):
        record = tmp_path / f"{target}.args"
        proc = make(home, target, f"VENV={fake}", RECORD=str(record))
        assert proc.returncode == 0, proc.stderr
        assert expected in record.read_text().splitlines(), (target, record.read_text())

    tools = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    lint = subprocess.run(
        ["bash", "scripts/lint_shell.sh"], cwd=REPO, env={**_env(None), "PATH": tools}, capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    copy = tmp_path / "repo"
    copy.mkdir()
    for part in ("Makefile", "scripts", "configs", ".ci"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, copy / part)
    makefile = copy / "Makefile"
    recipe = "\t@python3 scripts/clean_home.py\n"  # the old recipe, unquoted, in its place
    assert recipe in makefile.read_text()
    makefile.write_text(makefile.read_text().replace(recipe, "\trm -rf $(FLYWHEEL_HOME)\n"))
    broken = subprocess.run(
        ["bash", "scripts/lint_shell.sh"], cwd=copy, env={**_env(None), "PATH": tools}, capture_output=True, text=True
    )
    assert broken.returncode == 1
    assert "unquoted FLYWHEEL_HOME: rm -rf /tmp/lint home/h" in broken.stdout
    assert "^ in the recipe of make clean" in broken.stdout


# --- 8. the smaller refusals ---------------------------------------------------------------------


@pytest.mark.integrity
def test_make_clean_deletes_only_a_flywheel_home(tmp_path):
    """`make clean` used to delete whatever FLYWHEEL_HOME named (a folder with precious.txt: rc 0,
    gone). Now only a home `make run` made (its flywheel.json with the home's profile); any other
    folder is refused naming what it holds, and nothing is deleted."""
    precious = tmp_path / "documents"
    precious.mkdir()
    (precious / "precious.txt").write_text("years of work")
    not_a_record = tmp_path / "not-a-record"
    not_a_record.mkdir()
    (not_a_record / "flywheel.json").write_text("[]")
    link = tmp_path / "link"
    link.symlink_to(precious)
    for folder, says in (
        (precious, f"FLYWHEEL_HOME {precious} is not a flywheel home: it has no flywheel.json"),
        (not_a_record, "is not a flywheel home"),
        (link, f"FLYWHEEL_HOME {link} is a symbolic link (to {precious})"),
    ):
        proc = make(folder, "clean", timeout=60)
        assert proc.returncode != 0 and says in proc.stdout and "nothing deleted" in proc.stdout, proc.stdout
    assert (precious / "precious.txt").read_text() == "years of work" and (not_a_record / "flywheel.json").exists()
    assert link.is_symlink()
    # nothing to do: an absent home, an empty folder (left as it is)
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder, says in ((tmp_path / "absent", "does not exist"), (empty, "is an empty folder")):
        proc = make(folder, "clean", timeout=60)
        assert proc.returncode == 0 and f"{says}: nothing to delete" in proc.stdout, proc.stdout
    assert empty.is_dir()
    # a home is deleted, unless a run holds it
    import fcntl

    home = tmp_path / "home"
    (home / "dagster").mkdir(parents=True)
    (home / "flywheel.json").write_text(json.dumps({"profile": "micro", "lineage": {}}))
    with open(home / "flywheel.lock", "w") as lock:
        lock.write('{"command": "make run", "pid": 1}')
        lock.flush()
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = make(home, "clean", timeout=60)
    assert proc.returncode != 0 and "is held by a make run or resume" in proc.stdout and home.is_dir(), proc.stdout
    proc = make(home, "clean", timeout=60)
    assert proc.returncode == 0 and f"deleted FLYWHEEL_HOME {home}" in proc.stdout and not home.exists()


def test_an_empty_flywheel_home_is_refused_not_taken_for_the_current_directory(tmp_path, capsys, monkeypatch):
    from pipelines.run import main

    monkeypatch.setenv("FLYWHEEL_HOME", "")
    monkeypatch.chdir(tmp_path)
    assert main(["--profile", "micro"]) == 2
    assert "FLYWHEEL_HOME is set but empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written where it would have put the home
    proc = make("", "clean")
    assert proc.returncode == 2 and "FLYWHEEL_HOME is set but empty: nothing deleted" in proc.stdout + proc.stderr


def test_a_negative_seed_is_refused_naming_the_field_before_the_home_is_made(tmp_path, capsys, monkeypatch):
    """random.Random(-3) is random.Random(3): a negative seed used to be silently another seed."""
    from pipelines.run import main

    home = tmp_path / "h"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    assert main(["--profile", "micro", "--seed", "-3"]) == 2
    err = capsys.readouterr().err
    assert "seed: Input should be greater than or equal to 0 (got -3)" in err
    assert "data.seed: Input should be greater than or equal to 0 (got -3)" in err
    assert not home.exists()


# --- 2, 3, 6: one run at a time, one lineage, the home's own settings -------------------------------


def _holder(home: Path, timeout_s: float = 300) -> dict:
    """The lock holder's record once `make run` has taken the home."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            text = (home / "flywheel.lock").read_text()
        except OSError:
            text = ""
        if text:
            return json.loads(text)
        time.sleep(0.2)
    raise AssertionError("the first make run never took the home's lock")


@pytest.fixture(scope="module")
def operated_home(tmp_path_factory):
    """A micro flywheel made by `make run` (margin 0.5, so its round is not promoted) while a second
    `make run` tries the same home, then a `make run SEED=1` on it; in a path with a space. Its
    tests are in the xdist group `operated_home`, so that one worker makes it."""
    home = tmp_path_factory.mktemp("ops") / "my home" / "fw"
    out = home.parent / "first.log"
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as log:
        first = subprocess.Popen(
            [
                "make",
                "--no-print-directory",
                "-C",
                str(REPO),
                "run",
                "PROFILE=micro",
                "ARGS=--set benchmark.promotion_margin=0.5",
            ],
            env=_env(home),
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        holder = _holder(home)
        second = make(home, "run", "PROFILE=micro", timeout=300)
        clean = make(home, "clean", timeout=60)
        first_rc = first.wait(timeout=900)
    other_seed = make(home, "run", "PROFILE=micro", "SEED=1", timeout=300)
    return {
        "home": home,
        "holder": holder,
        "first": (first_rc, out.read_text()),
        "second": second,
        "clean": clean,
        "other_seed": other_seed,
    }


def _dagster_runs(home: Path) -> list:
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(home / "dagster")) as instance:
        return list(instance.get_runs())


@pytest.mark.xdist_group("operated_home")
def test_a_second_make_run_on_a_busy_home_is_refused_naming_the_holder_and_its_pid(operated_home):
    home, holder = operated_home["home"], operated_home["holder"]
    rc, log = operated_home["first"]
    assert rc == 0, log[-3000:]
    second = operated_home["second"]
    assert second.returncode != 0
    assert f"FLYWHEEL_HOME {home} is held by another process (pid {holder['pid']} on" in second.stderr, second.stderr
    assert "One `make run` or `make resume` at a time works on a home" in second.stderr
    assert holder["command"] == "make run"
    clean = operated_home["clean"]  # `make clean` under the running flywheel deletes nothing
    assert clean.returncode != 0 and "is held by a make run or resume" in clean.stdout, clean.stdout + clean.stderr
    # the home holds one run's work: every Dagster run is the first's, and so is every registered version
    runs = _dagster_runs(home)
    assert runs and {r.tags["flywheel/pid"] for r in runs} == {str(holder["pid"])}
    assert len({r.tags["flywheel/id"] for r in runs}) == 1
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home}/mlflow.db")
    versions = client.search_model_versions("name='agentic-policy'")
    assert sorted(int(v.version) for v in versions) == [1, 2]  # SFT, round 1
    dagster_ids = {r.run_id for r in runs}
    assert {client.get_run(v.run_id).data.tags["dagster.run_id"] for v in versions} <= dagster_ids


@pytest.mark.xdist_group("operated_home")
def test_another_seed_in_a_used_home_is_refused_naming_what_differs_and_changes_nothing(operated_home):
    """A home is one lineage: its versions are gated on the same benchmark tasks. SEED=1 used to
    train SFT and then fail in the gate ("the two score sets share no task ids")."""
    home, refused = operated_home["home"], operated_home["other_seed"]
    assert refused.returncode != 0, refused.stderr
    err = refused.stderr
    assert f"FLYWHEEL_HOME {home} holds a flywheel of profile 'micro' (seed 0)" in err
    assert "  seed: 0 -> 1" in err and "  data.seed: 0 -> 1" in err
    assert f"FLYWHEEL_HOME={home}-seed1 make run PROFILE=micro SEED=1" in err
    assert len(_dagster_runs(home)) == 2  # the foundation and the round of the first run, nothing more


@pytest.mark.xdist_group("operated_home")
def test_the_registry_commands_use_the_settings_the_home_ran_with(operated_home, tmp_path):
    """`make promote` without PROFILE applies the gate the run applied (its promotion_margin 0.5),
    and `make models` lists the home's registry; PROFILE=tiny is an explicit other choice."""
    home = tmp_path / "copy"
    shutil.copytree(operated_home["home"], home)
    record = json.loads((home / "flywheel.json").read_text())
    assert record["profile"] == "micro" and record["overrides"] == {"benchmark.promotion_margin": 0.5}
    refused = make(home, "promote", "VERSION=2")
    assert refused.returncode != 0
    assert "is not above benchmark.promotion_margin +0.500" in refused.stderr, refused.stderr
    assert "To promote anyway: make promote VERSION=2 FORCE=1." in refused.stderr
    listed = make(home, "models")
    table = listed.stdout[listed.stdout.index("version  stage") :].splitlines()
    assert listed.returncode == 0 and [row.split()[0] for row in table[1:]] == ["1", "2"], listed.stdout


@pytest.mark.xdist_group("operated_home")
def test_the_dagster_definitions_of_a_home_use_its_profile_unless_told(operated_home, monkeypatch):
    """`make dagster-ui` and `make audit` load pipelines.definitions with no FLYWHEEL_PROFILE: a
    micro home is shown and audited with micro's settings, not tiny's."""
    from pipelines.definitions import build_definitions

    monkeypatch.setenv("FLYWHEEL_HOME", str(operated_home["home"]))
    monkeypatch.delenv("FLYWHEEL_PROFILE", raising=False)
    monkeypatch.delenv("FLYWHEEL_OVERRIDES", raising=False)
    settings = build_definitions().resources["settings"]  # the resource every asset of the jobs gets
    assert settings.config.profile == "micro" and settings.config.benchmark.promotion_margin == 0.5
    monkeypatch.setenv("FLYWHEEL_PROFILE", "tiny")
    assert build_definitions().resources["settings"].config.profile == "tiny"


# --- 5. homes that move --------------------------------------------------------------------------


@pytest.mark.xdist_group("operated_home")
def test_a_moved_home_works_with_the_original_deleted(operated_home, tmp_path):
    """Copied elsewhere and the original deleted, the home still lists, promotes, audits and
    loads: its stored absolute paths are rewritten to where it is now on first use."""
    original = tmp_path / "original place"
    shutil.copytree(operated_home["home"], original)
    assert make(original, "models").returncode == 0  # the copy settles in its own place first
    moved = tmp_path / "new place" / "fw"
    shutil.copytree(original, moved)
    shutil.rmtree(original)

    listed = make(moved, "models")
    assert listed.returncode == 0, listed.stderr
    assert f"this home moved to {moved}" in listed.stderr
    promoted = make(moved, "promote", "VERSION=2", "FORCE=1")
    assert promoted.returncode == 0 and "promoted v2 to champion" in promoted.stdout, promoted.stderr
    audited = make(moved, "audit", "ROUND=1")
    assert audited.returncode == 0, audited.stderr[-3000:]
    # with the home's profile (micro, not make's old default tiny); its result line not buried in DEBUG lines
    assert "audit of round 1 (micro): " in audited.stdout and "outcomes scored differently" in audited.stdout
    assert "DEBUG" not in audited.stdout + audited.stderr and len(audited.stdout.splitlines()) < 12, audited.stdout
    loaded = subprocess.run(
        [sys.executable, "-m", "pipelines.registry", "load", "--out", str(tmp_path / "out")],
        cwd=REPO,
        env=_env(moved),
        capture_output=True,
        text=True,
    )
    assert loaded.returncode == 0 and "loaded models:/agentic-policy@champion" in loaded.stdout, loaded.stderr
    # nothing in the store or the pointers names the deleted place any more
    with sqlite3.connect(moved / "mlflow.db") as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for column in [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]:
                hit = conn.execute(
                    f'SELECT count(*) FROM "{table}" WHERE instr(cast("{column}" as text), ?) > 0', (str(original),)
                ).fetchone()[0]
                assert hit == 0, f"{table}.{column} still names {original}"
    for pointer in (moved / "artifacts" / "assets").rglob("*.json"):
        assert str(original) not in pointer.read_text(), pointer


# --- 7. errors a person can read ------------------------------------------------------------------


def _run(home: Path, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.run", *args],
        cwd=REPO,
        env=_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def test_a_bad_task_file_prints_a_short_failure_and_the_summary_with_the_traceback_in_the_log(tmp_path):
    """It used to print ~85 lines of Dagster traceback before the summary."""
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"task_id": "t1", "family": "arithmetic", "level": 9, "prompt": "compute 1+2\\n", "answer": "3"}\n')
    proc = _run(tmp_path / "h", "--profile", "micro", "--set", f"data.task_file={bad}")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out
    assert "Traceback" not in out and "Stack Trace" not in out, out
    assert len(out.splitlines()) < 40, out
    summary = out[out.index("[flywheel] foundation failed") :]
    assert "row 1: field 'level': 9 is not a level of arithmetic" in summary
    assert "`make resume` continues from the failure" in summary
    log = Path(summary.split("full text, tracebacks included: ")[1].split()[0])
    assert log.is_file() and "Stack Trace" in log.read_text() and "TaskFileError" in log.read_text()
    # the step's one console line names the step and the error, and where the rest is
    failed = [line for line in out.splitlines() if "STEP_FAILURE" in line]
    assert failed and all("TaskFileError" in line and str(log) in line for line in failed), failed


@pytest.mark.parametrize("when", ["foundation (tasks", "sft step 5/20"], ids=["starting", "in-sft"])
def test_ctrl_c_ends_with_a_message_not_a_traceback(tmp_path, when):
    """Ctrl-C as a terminal sends it: SIGINT to the whole process group, Dagster's helper processes
    included (each used to print a KeyboardInterrupt traceback); as the run starts, and inside SFT."""
    proc = _run(tmp_path / "h", "--profile", "micro", start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if when in line:
            break
    os.killpg(proc.pid, 2)
    rest, _ = proc.communicate(timeout=300)
    out = "".join(lines) + rest
    assert proc.returncode != 0
    assert "Traceback" not in out, out[-3000:]
    after = out[out.index("foundation (tasks") :]
    assert "interrupted. `make resume` continues" in after or "`make resume` continues from the failure" in after, after


def test_an_unwritable_home_ends_with_a_message_not_a_traceback(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = _run(blocker / "home", "--profile", "micro")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" not in out
    assert f"FLYWHEEL_HOME {blocker / 'home'} cannot be written" in out, out


# --- 8. the summary after a resume -----------------------------------------------------------------


def _scores(pass_at_1: float, version: str, promoted: bool | None = None) -> dict:
    scores = {
        "pass_at_1": pass_at_1,
        "pass_at_1_ci_low": pass_at_1 - 0.05,
        "pass_at_1_ci_high": pass_at_1 + 0.05,
        "greedy_pass_at_1": pass_at_1,
        "tool_call_rate": 0.5,
        "version": version,
        "arithmetic/pass_at_1": pass_at_1,
        "arithmetic/tool_call_rate": 0.5,
        "arithmetic/level_1/pass_at_1": pass_at_1,
        "arithmetic/level_1/tool_call_rate": 0.5,
    }
    return {**scores, **({"promoted": promoted} if promoted is not None else {})}


def test_the_summary_names_rounds_by_partition_and_labels_the_last_rounds_and_the_champions_gain():
    """After a resume that ran only partition 2, the table said "RL round 1", "flywheel took"
    counted the resumed part only, and "final RL - SFT" was the last round's gain even when the
    champion was an earlier round."""
    from configs import load_profile
    from pipelines.run import report

    outcome = {
        "sft": _scores(0.40, "1", promoted=True),
        "rounds": [_scores(0.60, "2", promoted=True), _scores(0.55, "3", promoted=False)],
        "round_keys": ["1", "2"],
        "gain": (0.15, 0.10, 0.20),
        "champion_gain": (0.20, 0.15, 0.25),
        "champion": "version 2 (RL round 1)",
        "gains": {"arithmetic": (0.15, 0.10, 0.20)},
        "level_gains": {"arithmetic level_1": (0.15, 0.10, 0.20)},
        "minutes": 3.0,
        "flywheel_minutes": 12.5,
        "peak_rss_gb": 1.0,
        "home": "/h",
        "cfg": load_profile("micro"),
    }
    text = report(outcome)
    rows = [line.split("  ")[0] for line in text.splitlines()]
    assert "RL round 1" in rows and "RL round 2" in rows
    assert "last round (RL round 2) - SFT pass@1: +0.150 [+0.100, +0.200]" in text
    assert "champion (version 2 (RL round 1)) - SFT pass@1: +0.200 [+0.150, +0.250]" in text
    assert "this run took 3.0 min (the flywheel 12.5 min since its first run started, with its stops)" in text

    resumed = {**outcome, "rounds": outcome["rounds"][1:], "round_keys": ["2"], "champion_gain": None}
    text = report(resumed)
    assert "RL round 2" in [line.split("  ")[0] for line in text.splitlines()]
    assert "RL round 1 " not in text and "champion (" not in text


def test_what_a_lineage_binds_and_when(tmp_path):
    """Tuning (RL, benchmark scoring) may change between runs of a home; tasks and model may not,
    and a home binds only once its first foundation succeeded."""
    from configs import load_profile
    from pipelines.home import HomeError, check_lineage, remember

    micro = load_profile("micro")
    remember(tmp_path, "micro", {}, micro)  # a first run starting: not bound yet
    check_lineage(tmp_path, load_profile("micro", {"data.seed": 5}))
    remember(tmp_path, "micro", {}, micro, bind=True)  # its foundation succeeded
    check_lineage(tmp_path, load_profile("micro", {"rl.steps_per_round": 9, "benchmark.promotion_margin": 0.2}))
    for override, field in (
        ({"data.families.arithmetic.train_tasks": 7}, "data.families.arithmetic.train_tasks: 200 -> 7"),
        ({"model.hidden_size": 32}, "model.hidden_size: 64 -> 32"),
    ):
        with pytest.raises(HomeError, match=f"differs in what all runs of a home share.*\n  {field}\n") as refused:
            check_lineage(tmp_path, load_profile("micro", override))
        assert f"FLYWHEEL_HOME={tmp_path}-2 make run" in str(refused.value)
    with pytest.raises(HomeError, match="holds a flywheel of profile 'micro' .*\n  profile: 'micro' -> 'tiny'"):
        check_lineage(tmp_path, load_profile("tiny"))

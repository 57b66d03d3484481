"""Registry workflows from the command line: list, promote through the gate (refusal, --force),
rollback, and loading models:/agentic-policy@champion, on a real MLflow sqlite store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch

from pipelines.registry import main
from tests.registry_support import folder_model
from training.model import build_model, save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TASKS = [f"t{i}" for i in range(60)]


@pytest.fixture()
def registry(tmp_path, monkeypatch, micro_cfg, tokenizer_and_tasks):
    """A flywheel home with four benchmarked versions, registered as the benchmark asset does:
    v1 (pass@1 0.5), v2 (0.8: clearly better), v3 (0.75: not measurably better than v2),
    v4 (0.9, but its round was blocked by the collapse detector)."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    # mlflow.set_tracking_uri exports it; restored after the test
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("FLYWHEEL_PROFILE", "micro")
    from configs import load_profile
    from pipelines.registry import tracker_for

    tracker = tracker_for(load_profile("micro"))
    tok, _ = tokenizer_and_tasks
    for version, (rate, tags) in enumerate(
        [(0.5, {}), (0.8, {}), (0.75, {}), (0.9, {"blocked_by": "entropy collapse"})], start=1
    ):
        model = build_model(micro_cfg.model, len(tok), tok.eos_token_id, seed=version)
        folder = save_checkpoint(model, tok, tmp_path / f"ckpt{version}")
        scores = {t: float(i < rate * len(TASKS)) for i, t in enumerate(TASKS)}
        tracker.client()
        if mlflow.get_experiment_by_name(tracker.experiment) is None:
            mlflow.create_experiment(tracker.experiment, artifact_location=str(tmp_path / "mlartifacts"))
        mlflow.set_experiment(tracker.experiment)
        with mlflow.start_run() as run:
            mlflow.log_metrics({"pass_at_1": rate, "pass_at_1_ci_low": rate - 0.1, "pass_at_1_ci_high": rate + 0.1})
            tracker.log_json(run.info.run_id, scores, "per_task_scores.json")
            tracker.register_model(
                run.info.run_id,
                folder_model(tracker, run.info.run_id, folder),
                {"stage": "rl", "round": str(version), **tags},
            )
    return tracker


def champion(tracker) -> str:
    return str(tracker.version_by_alias("champion").version)


@pytest.mark.operations  # issue 28: under make, the refusal names FORCE=1
def test_promote_refuse_force_and_roll_back(registry, capsys, monkeypatch):
    monkeypatch.delenv("MAKELEVEL", raising=False)  # `make test` runs pytest under make
    assert main(["promote", "1"]) == 0 and champion(registry) == "1"  # no champion yet: the gate passes
    assert main(["promote", "2"]) == 0 and champion(registry) == "2"
    assert "promoted v2" in capsys.readouterr().out

    # v3 is not measurably better than v2: refused, with the figures, and nothing changes
    assert main(["promote", "3"]) == 1
    err = capsys.readouterr().err
    assert "refused: v3 vs champion v2" in err and "-0.050" in err and "promotion_margin" in err and "--force" in err
    assert champion(registry) == "2"
    # under make (issue 28) the way to force is the make variable, not the flag
    monkeypatch.setenv("MAKELEVEL", "1")
    assert main(["promote", "3"]) == 1
    assert "To promote anyway: make promote VERSION=3 FORCE=1." in capsys.readouterr().err
    monkeypatch.delenv("MAKELEVEL")
    # v4 scores best but its round was blocked: refused too, whatever its score
    assert main(["promote", "4"]) == 1
    assert "blocked (entropy collapse)" in capsys.readouterr().err and champion(registry) == "2"

    assert main(["promote", "3", "--force"]) == 0 and champion(registry) == "3"
    assert "forced over" in capsys.readouterr().out
    assert registry.client().get_model_version(registry.registered_model, "3").tags["promoted_by"] == "force"
    assert registry.champion_history() == ["1", "2", "3"]

    assert main(["rollback"]) == 0 and champion(registry) == "2"
    assert "v3 -> v2" in capsys.readouterr().out
    assert registry.client().get_model_version(registry.registered_model, "3").tags["rolled_back"] == "true"
    assert main(["rollback"]) == 0 and champion(registry) == "1"
    assert main(["rollback"]) == 1 and "nothing to roll back to" in capsys.readouterr().err
    assert champion(registry) == "1"


def test_a_champion_set_without_history_can_be_rolled_back_to(registry):
    """Homes from before the history existed, or an alias moved by hand in the MLflow UI."""
    registry.set_alias("champion", "2")
    assert main(["promote", "3", "--force"]) == 0
    assert registry.champion_history() == ["2", "3"]
    assert main(["rollback"]) == 0 and champion(registry) == "2"


def test_list_shows_scores_and_aliases(registry, capsys):
    main(["promote", "2"])
    capsys.readouterr()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(lines) == {"1", "2", "3", "4"}, out
    assert "0.800" in lines["2"] and "champion" in lines["2"] and "gate" in lines["2"]
    assert "entropy collapse" in lines["4"]


def test_unknown_version_and_bad_override_are_named(registry, capsys):
    assert main(["promote", "9"]) == 1
    assert "no version '9' (versions: 1, 2, 3, 4)" in capsys.readouterr().err
    assert main(["--set", "benchmark.confidence=2", "list"]) == 1
    assert "benchmark.confidence" in capsys.readouterr().err


def test_load_champion_gives_the_promoted_weights(registry, tmp_path, micro_cfg, tokenizer_and_tasks):
    from pipelines.registry import load

    main(["promote", "2"])
    model, tok, folder = load(registry, "champion", tmp_path / "served")
    tok_expected, _ = tokenizer_and_tasks
    expected = build_model(micro_cfg.model, len(tok_expected), tok_expected.eos_token_id, seed=2)
    for (name, a), b in zip(model.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(a, b), name
    assert len(tok) == len(tok_expected)


def test_the_command_line_entry_point(registry, tmp_path):
    """What `make models` runs, as a separate process on the same store."""
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.registry", "list"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 5

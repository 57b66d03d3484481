"""A task family is one module plus one config entry (environments/family.py): the registry checks
every family name a profile uses, and a toy family added from the test folder runs the flywheel."""

import json

import pytest

from configs import ConfigError, load_profile
from environments.family import get_family, resolve_families

pytestmark = pytest.mark.yourdata

REVERSE = {"module": "tests.families.reverse", "train_tasks": 60, "benchmark_tasks": 24}


def test_a_family_named_by_module_is_registered_with_its_default_verifier():
    cfg = resolve_families(load_profile("micro", {"data.families.reverse": REVERSE}))
    assert get_family("reverse").tools == ("code",)
    assert cfg.reward.verifiers["reverse"].name == "exact_match"
    # configured ones kept
    assert cfg.reward.verifiers["arithmetic"] == load_profile("micro").reward.verifiers["arithmetic"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"data.families.revers": {"train_tasks": 5, "benchmark_tasks": 5}},
            r"data.families.revers: 'revers' is not a registered task family \(registered: arithmetic, code.*search",
        ),
        ({"teacher.mixture": {"arithmetic": 1, "serch": 1}}, r"teacher.mixture.serch: 'serch' is not a registered"),
        ({"reward.verifiers.cod": {"name": "unit_tests"}}, r"reward.verifiers.cod: 'cod' is not a registered"),
        ({"teacher.arithmetc": {"p_direct": 0.1}}, r"teacher.arithmetc: 'arithmetc' is not a registered"),
        (
            {"data.families.toy": {"module": "tests.families.nothing_here", "train_tasks": 5, "benchmark_tasks": 5}},
            r"data.families.toy.module: cannot import 'tests.families.nothing_here' \(ModuleNotFoundError",
        ),
        (
            {"data.families.toy": {"module": "tests.families.reverse", "train_tasks": 5, "benchmark_tasks": 5}},
            r"data.families.toy.module: 'tests.families.reverse' registers no task family named 'toy'",
        ),
        (
            {"data.families.search.levels": [1, 4]},
            r"data.families.search.levels: \[4\] do not exist; search has levels \(1, 2, 3\)",
        ),
        ({"teacher.code.p_direct": 2.0}, r"teacher.code.p_direct: Input should be less than or equal to 1"),
        ({"teacher.search.p_sideways": 0.1}, r"teacher.search.p_sideways: Extra inputs are not permitted"),
    ],
)
def test_every_family_name_a_profile_uses_is_checked(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_families(load_profile("micro", overrides))


def test_a_user_task_file_may_hold_rows_of_a_family_of_their_own(tmp_path):
    from environments.task_files import TaskFileError, load_task_file

    resolve_families(load_profile("micro", {"data.families.reverse": REVERSE}))
    rows = [
        {
            "task_id": "r1",
            "family": "reverse",
            "level": 1,
            "prompt": "reverse the word kab",
            "answer": "bak",
            "metadata": {"word": "kab"},
        },
        {
            "task_id": "r2",
            "family": "reverse",
            "level": 3,
            "prompt": "reverse the word kab",
            "answer": "bak",
            "metadata": {"word": "kab"},
        },
        {
            "task_id": "r3",
            "family": "reverse",
            "level": 1,
            "prompt": "reverse the word kab",
            "answer": "kab",
            "metadata": {"word": "kab"},
        },
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(TaskFileError) as err:
        load_task_file(str(tmp_path / "t.jsonl"))
    assert "row 2: field 'level': 3 is not a level of reverse (1, 2)" in str(err.value)
    assert "row 3: field 'metadata': needs metadata word, reversed in answer" in str(err.value)
    assert "row 1" not in str(err.value)


@pytest.mark.slow
def test_a_toy_family_from_the_test_folder_runs_the_micro_flywheel(tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "fw"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from pipelines.run import run_flywheel

    outcome = run_flywheel("micro", {"data.families.reverse": REVERSE})
    assert outcome["sft"]["version"] == "1" and len(outcome["rounds"]) == 1
    stored = tmp_path / "fw" / "artifacts" / "assets"
    for asset, partition in (
        ("training_tasks", "all"),
        ("benchmark_tasks", "all"),
        ("sft_trajectories", "all"),
        ("rollout_batches", "1"),
    ):
        frame = pd.read_parquet(stored / asset / f"{partition}.parquet")
        assert "reverse" in set(frame["family"]), asset
    sft = pd.read_parquet(stored / "sft_trajectories" / "all.parquet")
    assert {"tool", "direct"} <= set(sft[sft["family"] == "reverse"]["strategy"])
    assert "reverse" in outcome["gains"]  # benchmarked, and in the summary table by family

"""Tests for assets/contracts.py: GE data contracts and their blocking Dagster asset checks."""

from __future__ import annotations

import os

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import pandas as pd
import pytest
from dagster import (
    AssetCheckKey,
    AssetIn,
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    StaticPartitionsDefinition,
    asset,
    materialize,
)

from assets.contract_specs import CONTRACT_COLUMNS, CONTRACTS, ContractReport, derive_columns
from assets.contracts import contract_check, validate_contract

# --------------------------------------------------------------------------------------------
# Valid frames
# --------------------------------------------------------------------------------------------


def tasks_frame(n: int = 3) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "task_id": [f"t{i}" for i in range(n)],
            "family": ["arithmetic"] * n,
            "level": [1 + i % 4 for i in range(n)],
            "prompt": [f"What is {i} + {i}?" for i in range(n)],
            "answer": [str(2 * i) for i in range(n)],
            "split": ["train"] * n,
            "metadata": ['{"seed": %d}' % i for i in range(n)],
        }
    )


def sft_frame(n: int = 3) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "trajectory_id": [f"s{i}" for i in range(n)],
            "task_id": [f"t{i}" for i in range(n)],
            "family": ["arithmetic"] * n,
            "level": [1 + i % 4 for i in range(n)],
            "strategy": ["tool_first"] * n,
            "prompt_ids": [[1, 2, 3] for _ in range(n)],
            "completion_ids": [[4, 5, 6, 7] for _ in range(n)],
            "tool_mask": [[1, 0, 0, 1] for _ in range(n)],
            "completion": ["<call>2+2</call>4"] * n,
            "correct": [True, False, True][:n] + [True] * max(0, n - 3),
        }
    )


def rollout_frame(n: int = 4) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "trajectory_id": [f"r{i}" for i in range(n)],
            "task_id": [f"t{i // 2}" for i in range(n)],
            "family": ["arithmetic"] * n,
            "level": [2] * n,
            "group_id": [f"g{i // 2}" for i in range(n)],
            "sample_index": [i % 2 for i in range(n)],
            "round": [1] * n,
            "step": [0] * n,
            "policy_version": ["sft-v1"] * n,
            "prompt_ids": [[1, 2, 3] for _ in range(n)],
            "completion_ids": [[4, 5, 6, 7] for _ in range(n)],
            "tool_mask": [[1, 0, 0, 1] for _ in range(n)],
            "logprobs": [[-0.5, 0.0, 0.0, -1.25] for _ in range(n)],
            "completion": ["<call>2+2</call>4"] * n,
            "turns": [2] * n,
            "num_tool_calls": [1] * n,
            "tool_calls": ['[{"name": "calc", "args": "2+2"}]'] * n,
            "stop_reason": ["answer", "eos", "max_turns", "max_tokens"][:n] + ["answer"] * max(0, n - 4),
        }
    )


VALID = {"tasks": tasks_frame, "sft_trajectories": sft_frame, "rollout_batches": rollout_frame}


def set_cell(df: pd.DataFrame, row: int, column: str, value) -> pd.DataFrame:
    """Copy of df with one cell replaced (works for list-valued cells)."""
    out = df.copy()
    values = out[column].tolist()
    values[row] = value
    out[column] = pd.Series(values, index=out.index, dtype=object if isinstance(value, list) else None)
    return out


def failed(report: ContractReport) -> set[tuple[str, str | None]]:
    return {(f.expectation, f.column) for f in report.failures}


def assert_fails(report: ContractReport, expectation: str, column: str | None) -> None:
    assert not report.success
    assert (expectation, column) in failed(report), report.message()
    assert expectation in report.message()
    if column is not None:
        assert f"'{column}'" in report.message()


# --------------------------------------------------------------------------------------------
# Pure validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("contract", ["tasks", "sft_trajectories", "rollout_batches"])
def test_valid_frame_passes(contract):
    df = VALID[contract]()
    assert list(df.columns) == list(CONTRACT_COLUMNS[contract])
    report = validate_contract(contract, df)
    assert report.success, report.message()
    assert report.failures == ()
    assert report.message() == ""
    assert report.rows == len(df)
    assert report.evaluated > len(CONTRACT_COLUMNS[contract])


def test_unknown_contract_lists_available():
    with pytest.raises(ValueError, match="nope") as err:
        validate_contract("nope", tasks_frame())
    for name in CONTRACTS:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="nope"):
        contract_check("training_tasks", "nope")


def test_empty_frame_fails():
    report = validate_contract("tasks", tasks_frame().iloc[0:0])
    assert_fails(report, "expect_table_row_count_to_be_between", None)


# tasks ---------------------------------------------------------------------------------------


def test_tasks_missing_column_named_not_keyerror():
    report = validate_contract("tasks", tasks_frame().drop(columns=["answer"]))
    assert_fails(report, "expect_column_to_exist", "answer")
    # the other columns are still validated and pass
    assert {c for _, c in failed(report)} <= {"answer", None}


def test_tasks_extra_column_fails_exact_match():
    report = validate_contract("tasks", tasks_frame().assign(reward=1.0))
    assert_fails(report, "expect_table_columns_to_match_set", None)
    assert "reward" in report.message()


def test_tasks_duplicate_task_id():
    report = validate_contract("tasks", set_cell(tasks_frame(), 1, "task_id", "t0"))
    assert_fails(report, "expect_column_values_to_be_unique", "task_id")
    assert "t0" in report.message()


def test_tasks_level_out_of_range_and_max_level_respected():
    df = set_cell(tasks_frame(), 2, "level", 9)
    report = validate_contract("tasks", df)
    assert_fails(report, "expect_column_values_to_be_between", "level")
    assert "9" in report.message()
    assert validate_contract("tasks", df, max_level=9).success


def test_without_families_the_registered_families_and_their_levels_are_accepted():
    df = tasks_frame().assign(family=["arithmetic", "search", "code"], level=[4, 3, 5])
    assert validate_contract("tasks", df).success  # code goes to level 5 (problem files)
    assert not validate_contract("tasks", df, families=["arithmetic"], max_level=4).success


def test_tasks_null_task_id():
    report = validate_contract("tasks", set_cell(tasks_frame(), 0, "task_id", None))
    assert_fails(report, "expect_column_values_to_not_be_null", "task_id")


def test_tasks_unknown_family_and_families_param():
    df = set_cell(tasks_frame(), 0, "family", "geometry")
    report = validate_contract("tasks", df)
    assert_fails(report, "expect_column_values_to_be_in_set", "family")
    assert "geometry" in report.message()
    assert validate_contract("tasks", df, families=["arithmetic", "geometry"]).success


def test_tasks_bad_split_blank_prompt_bad_json_wrong_type():
    df = tasks_frame()
    df = set_cell(df, 0, "split", "test")
    df = set_cell(df, 1, "prompt", "   ")
    df = set_cell(df, 2, "metadata", "{not json")
    df["level"] = df["level"].astype(float)
    report = validate_contract("tasks", df)
    assert_fails(report, "expect_column_values_to_be_in_set", "split")
    assert_fails(report, "expect_column_values_to_match_regex", "prompt")
    assert_fails(report, "expect_column_values_to_be_json_parseable", "metadata")
    assert_fails(report, "expect_column_values_to_be_in_set", "level__type")


# sft_trajectories ------------------------------------------------------------------------------


def test_sft_tool_mask_length_mismatch_names_pair():
    report = validate_contract("sft_trajectories", set_cell(sft_frame(), 1, "tool_mask", [1, 0, 1]))
    assert_fails(report, "expect_column_pair_values_to_be_equal", "tool_mask_len, completion_ids_len")


def test_sft_tool_mask_non_binary_value():
    report = validate_contract("sft_trajectories", set_cell(sft_frame(), 0, "tool_mask", [1, 2, 0, 1]))
    assert_fails(report, "expect_column_values_to_be_between", "tool_mask_non_binary")
    assert "tool_mask" in report.message()


def test_sft_all_zero_tool_mask():
    report = validate_contract("sft_trajectories", set_cell(sft_frame(), 2, "tool_mask", [0, 0, 0, 0]))
    assert_fails(report, "expect_column_values_to_be_between", "policy_token_count")


def test_sft_empty_completion_and_non_list_prompt():
    df = set_cell(sft_frame(), 0, "completion_ids", [])
    df = set_cell(df, 0, "tool_mask", [])
    df = set_cell(df, 1, "prompt_ids", "1 2 3")
    report = validate_contract("sft_trajectories", df)
    assert_fails(report, "expect_column_values_to_be_between", "completion_ids_len")
    assert_fails(report, "expect_column_values_to_not_be_null", "prompt_ids_len")


def test_sft_missing_list_column_skips_derived_checks():
    report = validate_contract("sft_trajectories", sft_frame().drop(columns=["completion_ids"]))
    assert_fails(report, "expect_column_to_exist", "completion_ids")
    assert all("completion_ids_len" not in (f.column or "") for f in report.failures)


# rollout_batches -------------------------------------------------------------------------------


def test_rollout_positive_logprob():
    report = validate_contract("rollout_batches", set_cell(rollout_frame(), 0, "logprobs", [0.3, 0.0, 0.0, -1.0]))
    assert_fails(report, "expect_column_values_to_be_between", "logprob_max")


def test_rollout_nonzero_logprob_on_tool_token():
    report = validate_contract("rollout_batches", set_cell(rollout_frame(), 1, "logprobs", [-0.5, -0.1, 0.0, -1.0]))
    assert_fails(report, "expect_column_values_to_be_between", "logprob_nonzero_on_tool")
    assert len(report.failures) == 1, report.message()


def test_rollout_nonfinite_logprob():
    report = validate_contract(
        "rollout_batches", set_cell(rollout_frame(), 1, "logprobs", [float("-inf"), 0.0, 0.0, float("nan")])
    )
    assert_fails(report, "expect_column_values_to_be_between", "logprobs_nonfinite")


def test_rollout_bad_stop_reason():
    report = validate_contract("rollout_batches", set_cell(rollout_frame(), 3, "stop_reason", "timeout"))
    assert_fails(report, "expect_column_values_to_be_in_set", "stop_reason")
    assert "timeout" in report.message()


def test_rollout_misaligned_logprobs_length():
    report = validate_contract("rollout_batches", set_cell(rollout_frame(), 2, "logprobs", [-0.5, 0.0, 0.0]))
    assert_fails(report, "expect_column_pair_values_to_be_equal", "logprobs_len, completion_ids_len")


def test_rollout_duplicate_group_sample_and_negative_step():
    df = set_cell(rollout_frame(), 1, "sample_index", 0)
    df = set_cell(df, 0, "step", -1)
    report = validate_contract("rollout_batches", df)
    assert_fails(report, "expect_compound_columns_to_be_unique", "group_id, sample_index")
    assert_fails(report, "expect_column_values_to_be_between", "step")


def test_derive_columns_is_pure_and_aligned():
    df = rollout_frame()
    before = df.copy(deep=True)
    derived = derive_columns("rollout_batches", df)
    pd.testing.assert_frame_equal(df, before)
    assert derived.index.equals(df.index)
    row = derived.iloc[0]
    assert row["completion_ids_len"] == 4 and row["tool_mask_len"] == 4 and row["logprobs_len"] == 4
    assert row["policy_token_count"] == 2 and row["tool_mask_non_binary"] == 0
    assert row["logprob_max"] == 0.0 and row["logprob_nonzero_on_tool"] == 0


# --------------------------------------------------------------------------------------------
# Dagster: blocking checks
# --------------------------------------------------------------------------------------------


def _check_evaluations(result, check_name: str):
    return [
        e.event_specific_data
        for e in result.all_events
        if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION and e.event_specific_data.check_name == check_name
    ]


def _bad_tasks() -> pd.DataFrame:
    return set_cell(tasks_frame(), 1, "task_id", "t0")


def test_dagster_blocking_check_stops_downstream():
    @asset
    def training_tasks() -> pd.DataFrame:
        return _bad_tasks()

    @asset(ins={"tasks": AssetIn("training_tasks")})
    def task_stats(tasks: pd.DataFrame) -> int:
        return len(tasks)

    check = contract_check("training_tasks", "tasks", families=("arithmetic",))
    with DagsterInstance.ephemeral() as instance:
        result = materialize([training_tasks, task_stats, check], instance=instance, raise_on_error=False)
        assert not result.success
        failures = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
        assert any("DagsterAssetCheckFailedError" in (e.step_failure_data.error.cls_name or "") for e in failures), [
            e.step_failure_data.error for e in failures
        ]

        (evaluation,) = _check_evaluations(result, "tasks_contract")
        assert evaluation.asset_key == AssetKey("training_tasks")
        assert not evaluation.passed
        assert "expect_column_values_to_be_unique" in evaluation.description
        assert "'task_id'" in evaluation.description
        assert "expect_column_values_to_be_unique" in evaluation.metadata["failures"].value
        assert evaluation.metadata["rows"].value == 3

        materialized = {e.asset_key for e in result.get_asset_materialization_events()}
        assert AssetKey("training_tasks") in materialized
        assert AssetKey("task_stats") not in materialized
        assert instance.get_latest_materialization_event(AssetKey("task_stats")) is None
        record = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [AssetCheckKey(AssetKey("training_tasks"), "tasks_contract")]
        )
        assert record[AssetCheckKey(AssetKey("training_tasks"), "tasks_contract")].status.value == "FAILED"


def test_dagster_check_passes_on_valid_frame():
    @asset
    def benchmark_tasks() -> pd.DataFrame:
        return set_cell(tasks_frame(), 0, "split", "benchmark")

    @asset
    def benchmark_summary(benchmark_tasks: pd.DataFrame) -> int:
        return len(benchmark_tasks)

    check = contract_check("benchmark_tasks", "tasks", families=("arithmetic",), name="benchmark_tasks_contract")
    with DagsterInstance.ephemeral() as instance:
        result = materialize([benchmark_tasks, benchmark_summary, check], instance=instance)
        assert result.success
        (evaluation,) = _check_evaluations(result, "benchmark_tasks_contract")
        assert evaluation.passed
        assert evaluation.description == "all expectations met"
        materialized = {e.asset_key for e in result.get_asset_materialization_events()}
        assert AssetKey("benchmark_summary") in materialized


def test_dagster_partitioned_check():
    parts = StaticPartitionsDefinition(["good", "bad"])

    @asset(partitions_def=parts)
    def rollout_batches(context) -> pd.DataFrame:
        df = rollout_frame()
        if context.partition_key == "bad":
            df = set_cell(df, 0, "logprobs", [0.7, 0.0, 0.0, -1.0])
        return df

    @asset(partitions_def=parts)
    def policy_update(rollout_batches: pd.DataFrame) -> int:
        return len(rollout_batches)

    check = contract_check("rollout_batches", "rollout_batches", partitions_def=parts, families=("arithmetic",))
    assets = [rollout_batches, policy_update, check]
    with DagsterInstance.ephemeral() as instance:
        good = materialize(assets, instance=instance, partition_key="good")
        assert good.success
        assert _check_evaluations(good, "rollout_batches_contract")[0].passed

        bad = materialize(assets, instance=instance, partition_key="bad", raise_on_error=False)
        assert not bad.success
        (evaluation,) = _check_evaluations(bad, "rollout_batches_contract")
        assert not evaluation.passed
        assert evaluation.partition == "bad"
        assert "'logprob_max'" in evaluation.description
        materialized = {(e.asset_key, e.partition) for e in bad.get_asset_materialization_events()}
        assert (AssetKey("rollout_batches"), "bad") in materialized
        assert not any(key == AssetKey("policy_update") for key, _ in materialized)


def test_knowledge_base_contract_names_bad_columns():
    from environments.search import generate_kb, kb_to_rows

    df = pd.DataFrame(kb_to_rows(generate_kb(0, n_people=20, n_companies=5, n_cities=5, n_countries=3)))
    assert validate_contract("knowledge_base", df).success
    bad = df.copy()
    bad.loc[0, "type"], bad.loc[1, "name"], bad.loc[3, "relations"] = "planet", bad.loc[2, "name"], "{not json"
    report = validate_contract("knowledge_base", bad)
    assert_fails(report, "expect_column_values_to_be_unique", "name")
    assert_fails(report, "expect_column_values_to_be_in_set", "type")

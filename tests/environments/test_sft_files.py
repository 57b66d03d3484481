"""Bring your own SFT data: chat-messages trajectories (system/user/assistant/tool, OpenAI tool
calls or our tags) become sft_trajectories rows with the policy's tokens trained and tool outputs
masked; a malformed file stops at sft_trajectories naming row and field."""

import json

import pandas as pd
import pytest

from environments.sft_files import load_sft_file
from environments.task_files import TaskFileError
from training.trajectories import file_trajectory_rows

pytestmark = pytest.mark.yourdata

GOOD, BAD = "examples/sft/trajectories.jsonl", "examples/sft/malformed_trajectories.jsonl"


@pytest.fixture(scope="module")
def tok():
    from training.tokenizer import train_tokenizer

    return train_tokenizer(
        ["What is 47*38? <code>print(47*38)</code><interpreter>1786\n</interpreter><answer>1786</answer>"] * 20, 300
    )


def test_a_chat_messages_file_becomes_masked_trajectories(tok):
    rows = file_trajectory_rows(load_sft_file(GOOD), tok, system_prompt="Tools: {tools}.")
    assert [(r["task_id"], r["family"], r["level"], r["strategy"]) for r in rows[:3]] == [
        ("my-arith-1", "arithmetic", 3, "file"),
        ("my-arith-2", "arithmetic", 4, "file"),
        ("my-code-1", "code", 1, "file"),
    ]
    assert rows[3]["family"] == "search" and rows[3]["task_id"].startswith("sft-file-")
    first = rows[0]
    assert first["completion"] == "<code>print(47*38)</code><interpreter>1786\n</interpreter><answer>1786</answer>"
    policy = tok.decode([i for i, m in zip(first["completion_ids"], first["tool_mask"]) if m])
    tool = tok.decode([i for i, m in zip(first["completion_ids"], first["tool_mask"]) if not m])
    assert policy == "<code>print(47*38)</code><answer>1786</answer>" and tool == "<interpreter>1786\n</interpreter>"
    # tags kept as written
    assert (
        rows[1]["completion"] == "<code>print(347*52-18)</code><interpreter>18026\n</interpreter><answer>18026</answer>"
    )
    assert "<information>Quibble is an island" in rows[3]["completion"] and rows[3]["completion"].endswith(
        "<answer>Quiport</answer>"
    )
    # the profile's system prompt, as rollouts render it
    assert "careful assistant" not in tok.decode(first["prompt_ids"])


def test_a_malformed_file_names_every_row_and_field():
    with pytest.raises(TaskFileError) as err:
        load_sft_file(BAD)
    message = str(err.value)
    assert message.startswith(f"SFT file {BAD} has 3 problem(s)")
    assert "row 2: field 'messages[1].role': expected one of system, user, assistant, tool, got 'bot'" in message
    assert "row 3: field 'messages[1].tool_calls[0].function.name': 'calculator' is not a known tool" in message
    assert "row 4: field 'messages[1]': a tool message with no tool call before it" in message


@pytest.mark.parametrize(
    "messages, field",
    [
        ([{"role": "user", "content": "q"}], "the last message must be the assistant's answer"),
        ([{"role": "assistant", "content": "a"}], "expected the user's task"),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "<code>1</code>"},
                {"role": "assistant", "content": "1"},
            ],
            "the assistant speaks before the tool answered its call to code",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "type": "function",
                            "function": {"name": "python", "arguments": json.dumps({"code": "1", "timeout": "2"})},
                        }
                    ],
                },
                {"role": "tool", "content": "1"},
                {"role": "assistant", "content": "1"},
            ],
            "expected one string argument",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "again"},
                {"role": "assistant", "content": "b"},
            ],
            "'user' after the task",
        ),
    ],
)
def test_conversation_shapes_that_are_not_one_episode_are_refused(tmp_path, messages, field):
    (tmp_path / "s.jsonl").write_text(json.dumps({"messages": messages}) + "\n")
    with pytest.raises(TaskFileError, match="row 1: field 'messages") as err:
        load_sft_file(str(tmp_path / "s.jsonl"))
    assert field in str(err.value)


def test_family_and_level_are_checked(tmp_path):
    rows = [
        {"family": "poetry", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {
            "family": "code",
            "level": 9,
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        },
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "s.parquet")
    with pytest.raises(TaskFileError) as err:
        load_sft_file(str(tmp_path / "s.parquet"))
    assert "row 1: field 'family': 'poetry'" in str(
        err.value
    ) and "row 2: field 'level': 9 is not a level of code" in str(err.value)


@pytest.mark.slow
def test_make_run_trains_on_the_file_and_a_malformed_one_stops_at_its_asset(tmp_path, monkeypatch):
    from dagster import AssetKey, DagsterInstance

    from pipelines.run import run_flywheel

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "good"))
    outcome = run_flywheel("micro", {"data.sft_file": GOOD, "data.sft_file_mode": "replace"})
    assert outcome["sft"]["version"] == "1"
    sft = pd.read_parquet(tmp_path / "good" / "artifacts" / "assets" / "sft_trajectories" / "all.parquet")
    assert len(sft) == 4 and set(sft["strategy"]) == {"file"}  # replace: the file is the whole SFT set

    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "bad"))
    with pytest.raises(SystemExit) as err:
        run_flywheel("micro", {"data.sft_file": BAD})
    assert "sft_trajectories" in str(err.value) and "row 2: field 'messages[1].role'" in str(err.value)
    instance = DagsterInstance.get()
    assert instance.get_latest_materialization_event(AssetKey("training_tasks")) is not None
    for key in ("sft_trajectories", "sft_checkpoint", "sft_benchmark_scores"):
        assert instance.get_latest_materialization_event(AssetKey(key)) is None, (
            f"{key} was produced from a malformed file"
        )

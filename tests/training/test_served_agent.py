"""The served agent's request handling (training/agent/served.py): what a Responses-API request
becomes (the question, the sampling), what is refused and how the refusal names the field, and the
tools a question of no family may call. The whole agent over HTTP: tests/pipelines/test_serve.py."""

from __future__ import annotations

import pytest
from mlflow.types.responses import ResponsesAgentRequest

from environments.family import tools_offered
from training.agent.chat import messages
from training.agent.served import RequestError, answer_of, question_of, sampled_from

pytestmark = pytest.mark.serving


def request(*messages: dict, **custom) -> ResponsesAgentRequest:
    return ResponsesAgentRequest(input=list(messages), custom_inputs=custom or None)


def test_the_question_is_the_last_user_message_in_text_or_parts():
    asked = request(
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "What is "}, {"type": "input_text", "text": "2+2?"}],
        },
    )
    assert question_of(asked) == "What is 2+2?"
    with pytest.raises(RequestError, match="no user message"):
        question_of(request({"role": "system", "content": "be brief"}))
    with pytest.raises(RequestError, match="no user message"):
        question_of(request({"role": "user", "content": "   "}))


def test_sampling_defaults_to_the_benchmarks_temperature_and_a_fresh_seed():
    first, second = sampled_from({}, 0.8), sampled_from({}, 0.8)
    assert (first.greedy, first.temperature) == (False, 0.8) and first.seed != second.seed
    assert sampled_from({"greedy": True, "temperature": 1, "seed": 5}, 0.8) == type(first)(True, 1.0, 5)


@pytest.mark.parametrize(
    "options, named",
    [
        ({"greedy": "yes"}, "custom_inputs.greedy"),
        ({"temperature": 0}, "custom_inputs.temperature"),
        ({"temperature": 99}, "custom_inputs.temperature"),
        ({"temperature": True}, "custom_inputs.temperature"),
        ({"seed": "abc"}, "custom_inputs.seed"),
        ({"seed": 1.5}, "custom_inputs.seed"),
    ],
)
def test_bad_sampling_values_are_refused_naming_the_field(options, named):
    with pytest.raises(RequestError, match=named.replace(".", r"\.")):
        sampled_from(options, 0.8)


def test_a_question_of_no_family_may_call_every_tool_and_is_told_so():
    task = {"task_id": "q", "family": "any", "level": 0, "prompt": "hi", "tools": ("code", "search")}
    assert tools_offered(task) == ("code", "search")
    system = messages(task, "Tools: {tools}.")[0]["content"]
    assert "to run Python" in system and "to search the documents" in system
    assert tools_offered({"family": "arithmetic"}) == ("code",)  # a family's task: its family's tools


def test_the_answer_is_the_last_one_the_policy_wrote_outside_its_tool_calls():
    turns = ["<code>print('<answer>9</answer>')</code>", "<answer>41</answer>"]
    assert answer_of(turns) == "41" and answer_of(["no answer here"]) is None


def test_a_task_file_cannot_widen_the_tools_a_training_task_may_call(tmp_path):
    """`tools` on a task is how a served question is offered every tool; a user's task file (or a
    row's metadata) must not do the same for a training task: an arithmetic row that asks for
    search still offers only the interpreter, so a policy's search call there stays a misuse."""
    import json

    from environments.task_files import load_task_file

    path = tmp_path / "tasks.jsonl"
    row = {
        "task_id": "t1",
        "family": "arithmetic",
        "level": 1,
        "prompt": "compute 2+3\n",
        "answer": "5",
        "tools": ["code", "search"],
        "metadata": {"tools": ["code", "search"]},
    }
    path.write_text(json.dumps(row) + "\n")
    [task] = load_task_file(str(path)).to_dict("records")
    assert "tools" not in task and tools_offered(task) == ("code",)

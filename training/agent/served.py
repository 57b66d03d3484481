"""The trained agent as an MLflow model: a `ResponsesAgent` (MLflow 3's recommended agent
interface) that wraps the policy, its tokenizer and chat template, the system prompt, the
multi-turn loop (training/agent/loop.py) and the tools (the sandboxed interpreter, search over the
knowledge base the policy was trained with).

A request is a Responses-API request: the last user message is the question. `custom_inputs` may
name the task `family` (its tools and system prompt, as in training); without one the question may
call every tool. `temperature`, `greedy` and `seed` set the sampling (default: the benchmark's
temperature, a fresh seed per request). The response holds the tool calls and their outputs as
`function_call` / `function_call_output` items, then the answer as a message; `custom_outputs`
holds the answer, the tool trace, the policy's own text per turn, the stop reason, and which model
answered (`model_id`, and `model_version` when the server was started for a registry version:
pipelines/serve.py).

The model folder (assets/agent_model.py writes it) holds the checkpoint (an HF folder), the
agent's settings (`agent.json`: the rollout settings, sandbox limits, search top-k, sampling),
the knowledge base (`knowledge_base.json`), and this project's code, so a version serves with the
code it was benchmarked with.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from mlflow.pyfunc import ResponsesAgent
from mlflow.types.responses import ResponsesAgentRequest, ResponsesAgentResponse

from configs.schema import RolloutConfig, SandboxConfig
from environments.families import build_tools
from environments.search import kb_from_rows
from training.agent.chat import prompt_ids
from training.agent.engines import build_rollout_engine
from training.agent.loop import Episode, run_episodes
from training.engines import resolve_device
from training.model import load_policy, load_tokenizer
from training.sequences import policy_spans
from verifiers.protocol import extract_answers
from verifiers.sandboxes import sandbox_from_settings

SETTINGS_FILE, KB_FILE = "agent.json", "knowledge_base.json"
VERSION_ENV = "FLYWHEEL_SERVED_VERSION"  # the registry version a server was started for (pipelines/serve.py)
# The rollout engine to serve with instead of the profile's (`hf` or `vllm`): `make serve ENGINE=hf`
# serves a vLLM profile's version on a machine without a GPU; logging checks the agent with HF.
ENGINE_ENV = "FLYWHEEL_SERVE_ENGINE"
ANY_FAMILY = "any"  # a question that names no family: every tool the agent has
TOOL_ARGUMENT = {"code": "code", "search": "query"}  # the function-call argument each tool's call text is


OPTIONS = frozenset({"family", "greedy", "temperature", "seed"})  # what `custom_inputs` may hold
MIN_ANSWER_TOKENS = 8  # a question must leave the policy at least this much of the context
# A question longer than this many characters per token of the context cannot fit; it is refused
# before the tokenizer sees it (tokenizing a 10 MB question took 60 s and 1.7 GB).
MAX_QUESTION_CHARS_PER_TOKEN = 16
MAX_TEMPERATURE = 5.0


class RequestError(ValueError):
    """A request the agent cannot answer as asked; the message names the field."""


@dataclass(frozen=True)
class Sampled:
    greedy: bool
    temperature: float
    seed: int


def sampled_from(options: dict, default_temperature: float) -> Sampled:
    """The request's sampling: `greedy` (a boolean), `temperature` (0 < t <= MAX_TEMPERATURE; default:
    what the benchmark measured at), `seed` (an integer; default: a fresh one, returned in the reply)."""
    greedy = options.get("greedy", False)
    if not isinstance(greedy, bool):
        raise RequestError(f"custom_inputs.greedy: must be true or false, got {greedy!r}")
    temperature = options.get("temperature", default_temperature)
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not 0 < temperature <= MAX_TEMPERATURE
    ):
        raise RequestError(
            f"custom_inputs.temperature: must be a number in (0, {MAX_TEMPERATURE}], got {temperature!r}"
        )
    seed = options.get("seed", secrets.randbits(32))
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RequestError(f"custom_inputs.seed: must be an integer, got {seed!r}")
    return Sampled(greedy, float(temperature), seed)


def question_of(request: ResponsesAgentRequest) -> str:
    for message in reversed(request.input):
        item = message.model_dump()  # the request validated every item into a pydantic model
        if item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, list):  # content parts: [{"type": "input_text", "text": ...}]
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            if isinstance(content, str) and content.strip():
                return content
    raise RequestError("input: no user message with text (the last user message is the question)")


def answer_of(policy_turns: list[str]) -> str | None:
    answers = extract_answers("".join(policy_turns))
    return answers[-1] if answers else None


_LOADED: weakref.WeakSet = weakref.WeakSet()  # agents whose model, sandbox and engine are up


def close_agents() -> None:
    """Close every loaded agent of this process (MLflow loads one to validate a model it logs)."""
    for agent in list(_LOADED):
        agent.close()


class ToolAgent(ResponsesAgent):
    def __init__(self) -> None:
        super().__init__()
        # the sandbox's worker pool and the engine live as long as the model: closed by close()
        self._resources = contextlib.ExitStack()

    def close(self) -> None:
        self._resources.close()
        _LOADED.discard(self)

    def load_context(self, context) -> None:
        settings = json.loads(Path(context.artifacts["agent"]).read_text())
        engine = {"engine": os.environ[ENGINE_ENV]} if os.environ.get(ENGINE_ENV) else {}
        self.rollout = RolloutConfig.model_validate({**settings["rollout"], **engine})  # a bad engine name is named
        self.temperature = float(settings["temperature"])
        self.families = tuple(settings["families"])
        folder = context.artifacts["checkpoint"]
        model = load_policy(folder, settings["dtype"], resolve_device(settings["device"]))
        self.tokenizer = load_tokenizer(folder)
        kb = kb_from_rows(json.loads(Path(context.artifacts["knowledge_base"]).read_text()))
        sandbox = sandbox_from_settings(SandboxConfig.model_validate(settings["sandbox"]))
        self._resources.callback(sandbox.close)
        self.tools = build_tools(sandbox=sandbox, kb=kb if kb.documents else None, top_k=settings["top_k"])
        self.engine = build_rollout_engine(self.rollout, model, self.tokenizer, seed=0)
        self._resources.callback(self.engine.close)
        self.model_id = _logged_model_id(Path(context.artifacts["agent"]))
        self._one_at_a_time = threading.Lock()  # one engine: requests take turns (scale with server workers)
        _LOADED.add(self)

    def refusal(self, request: ResponsesAgentRequest) -> str | None:
        """Why this agent would refuse `request` without running it, or None. The server
        (pipelines/serve_http.py) asks before `predict`, which MLflow traces with its input: a
        refused request is answered there and never stored in a trace."""
        try:
            self.task_of(request)
        except RequestError as exc:
            return str(exc)
        return None

    def task_of(self, request: ResponsesAgentRequest) -> tuple[dict, Sampled]:
        options = dict(request.custom_inputs or {})
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            raise RequestError(f"custom_inputs: unknown {unknown} (known: {sorted(OPTIONS)})")
        question = question_of(request)
        max_chars = MAX_QUESTION_CHARS_PER_TOKEN * self.rollout.max_total_tokens
        if len(question) > max_chars:
            raise RequestError(
                f"input: the question is {len(question)} characters; this agent's context holds "
                f"{self.rollout.max_total_tokens} tokens (rollout.max_total_tokens), so at most {max_chars} are read"
            )
        family = options.get("family") or ANY_FAMILY
        if family != ANY_FAMILY and family not in self.families:
            raise RequestError(
                f"custom_inputs.family: {family!r} is not one of this agent's families {list(self.families)}"
            )
        task = {
            "task_id": "request-" + hashlib.sha256(question.encode()).hexdigest()[:12],
            "family": family,
            "level": 0,
            "prompt": question,
        }
        if family == ANY_FAMILY:
            task["tools"] = tuple(self.tools)
        # a question that leaves no room for an answer is refused, not run (and never truncated)
        length = len(prompt_ids(self.tokenizer, task, self.rollout.system_prompt))
        room = self.rollout.max_total_tokens - length
        if room < MIN_ANSWER_TOKENS:
            raise RequestError(
                f"input: the question is {length} tokens with the system prompt; this agent's context holds "
                f"{self.rollout.max_total_tokens} (rollout.max_total_tokens), which leaves no room for an answer"
            )
        return task, sampled_from(options, self.temperature)

    def predict(self, request: ResponsesAgentRequest) -> ResponsesAgentResponse:
        task, sampled = self.task_of(request)
        with self._one_at_a_time:
            [episode] = run_episodes(
                self.engine,
                self.tokenizer,
                [task],
                group_size=1,
                tools=self.tools,
                cfg=self.rollout,
                greedy=sampled.greedy,
                temperature=sampled.temperature,
                sampling_key=f"serve/seed={sampled.seed}",
            )
        return self.response(episode, str(sampled.seed))

    def response(self, episode: Episode, seed: str) -> ResponsesAgentResponse:
        turns = [self.tokenizer.decode(span) for span in policy_spans(episode.completion_ids, episode.tool_mask)]
        answer = answer_of(turns)
        items = []
        for i, call in enumerate(episode.tool_calls):
            call_id = f"call_{i}"
            arguments = json.dumps({TOOL_ARGUMENT.get(call["name"], "input"): call["args"]})
            items.append(self.create_function_call_item(f"fc_{i}", call_id, call["name"], arguments))
            items.append(self.create_function_call_output_item(call_id, call["result"]))
        items.append(self.create_text_output_item(answer if answer is not None else turns[-1] if turns else "", "msg"))
        return ResponsesAgentResponse(
            output=items,
            custom_outputs={
                "answer": answer,
                "tool_trace": episode.tool_calls,
                "policy_turns": turns,
                "policy_tokens": int(sum(episode.tool_mask)),
                "stop_reason": episode.stop_reason,
                "turns": episode.turns,
                "family": episode.task["family"],
                "seed": seed,
                "model_id": self.model_id,
                "model_version": os.environ.get(VERSION_ENV),
            },
        )


def _logged_model_id(artifact: Path) -> str | None:
    """The MLflow logged model this folder is (its MLmodel file's `model_id`), found from an artifact's path."""
    for folder in artifact.parents:
        mlmodel = folder / "MLmodel"
        if mlmodel.exists():
            import yaml

            return (yaml.safe_load(mlmodel.read_text()) or {}).get("model_id")
    return None

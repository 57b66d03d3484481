"""Registry versions as MLflow models, and the agent behind HTTP (issue 27): a micro flywheel's
champion loaded with `mlflow.pyfunc.load_model` in a fresh process; `make serve`'s command on a
free port answering arithmetic, search and code questions with the tool trace, every tool call
re-run here and giving the same observation (the sandbox ran the code, the search read the
corpus); rollback, then serving again, serves the previous champion and says so."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.registry_support import folder_model
from tests.servers import free_port, read_until_closed, start_server, stop_server

pytestmark = pytest.mark.serving

REPO = Path(__file__).resolve().parents[2]
FAMILY_TOOL = {"arithmetic": "code", "search": "search", "code": "code"}


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "DAGSTER_HOME")}
    return {**env, "FLYWHEEL_HOME": str(home), "FLYWHEEL_PROFILE": "micro"}


def _post(port: int, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def policy(micro_cfg, sandbox):
    """The micro model after 600 SFT steps (~25 s): greedy, it calls the interpreter on arithmetic
    and code and searches the corpus (the 200-step `policy` mostly answers without tools)."""
    from benchmarks.warm_start import warm_started_policy

    return warm_started_policy(micro_cfg, sandbox, sft_steps=600)


@pytest.fixture(scope="module")
def agent_home(tmp_path_factory, policy, micro_cfg):
    """A micro profile's home whose registry holds the warm-started policy as two agent models
    (v1, v2: champion v1, then v2) and one version registered the old way, from a plain folder (v3)."""
    from assets.agent_model import log_agent_model
    from environments.search import kb_to_rows
    from pipelines.registry import tracker_for
    from training.model import save_checkpoint

    home = tmp_path_factory.mktemp("serve") / "fw"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        tracker = tracker_for(micro_cfg)
        folder = save_checkpoint(policy.model, policy.tokenizer, home / "checkpoint")
        client = tracker.client()
        for version in (1, 2):
            run_id = client.create_run(tracker.experiment_id()).info.run_id
            client.log_metric(run_id, "pass_at_1", 0.25 * version)
            tracker.register_model(
                run_id,
                lambda run_id=run_id, version=version: log_agent_model(
                    run_id, folder, micro_cfg, kb_to_rows(policy.kb), {"pass_at_1": 0.25 * version}
                ),
                {"stage": "rl", "round": str(version)},
            )
            tracker.promote(str(version), "gate")
        run_id = client.create_run(tracker.experiment_id()).info.run_id
        tracker.register_model(run_id, folder_model(tracker, run_id, folder), {"stage": "rl", "round": "3"})
        client.set_terminated(run_id)
    return home, tracker


def _serve(home: Path, *args: str):
    port = free_port()
    server = start_server(
        [sys.executable, "-m", "pipelines.serve", "--profile", "micro", "--port", str(port), *args],
        _env(home),
        f"http://127.0.0.1:{port}/ping",
    )
    return server, port


def _question(task: dict) -> dict:
    return {
        "input": [{"role": "user", "content": task["prompt"]}],
        "custom_inputs": {"family": task["family"], "greedy": True},
    }


@pytest.mark.xdist_group("micro_flywheel")
def test_a_micro_flywheel_champion_loads_and_answers_in_a_fresh_process(micro_flywheel, tmp_path):
    """`mlflow.pyfunc.load_model("models:/agentic-policy@champion")` in a process that has never
    imported the project, started outside the repository."""
    import mlflow

    home, outcome = micro_flywheel
    script = (
        "import json, sys, mlflow\n"
        "model = mlflow.pyfunc.load_model('models:/agentic-policy@champion')\n"
        "reply = model.predict({'input': [{'role': 'user', 'content': sys.argv[1]}], 'custom_inputs': {'seed': 7}})\n"
        "print(json.dumps({'task': model.metadata.metadata['task'], 'flavors': sorted(model.metadata.flavors), "
        "'reply': reply}))\n"
    )
    uri = f"sqlite:///{home}/mlflow.db"
    done = subprocess.run(
        [sys.executable, "-c", script, "What is 6 * 7 + 1?"],
        cwd=tmp_path,
        env={**_env(home), "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["task"] == "agent/v1/responses" and got["flavors"] == ["python_function"]
    reply = got["reply"]
    assert reply["output"][-1]["type"] == "message"
    extra = reply["custom_outputs"]
    assert {"answer", "tool_trace", "policy_turns", "stop_reason", "model_id"} <= set(extra)
    assert all(item["type"] in ("function_call", "function_call_output", "message") for item in reply["output"])
    assert sum(item["type"] == "function_call" for item in reply["output"]) == len(extra["tool_trace"])

    client = mlflow.MlflowClient(uri)
    champion = client.get_model_version_by_alias("agentic-policy", "champion")
    assert champion.source == f"models:/{extra['model_id']}"  # the version is the logged model that answered
    assert f"version {champion.version} " in outcome["champion"]
    # the conventions of an MLflow 3 model: signature, input example, pinned requirements, linked metrics
    # this home's store: `models:/<id>` resolves through the process's tracking URI, which the last
    # in-process flywheel of the session (another test's home) may have set
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=champion.source, dst_path=str(tmp_path / "m")))
    finally:
        mlflow.set_tracking_uri(before)
    mlmodel = yaml.safe_load((folder / "MLmodel").read_text())
    assert mlmodel["signature"]["inputs"] and mlmodel["signature"]["outputs"]
    assert (folder / "input_example.json").exists()
    requirements = (folder / "requirements.txt").read_text().split()
    import torch
    import transformers

    assert f"torch=={torch.__version__}" in requirements and f"transformers=={transformers.__version__}" in requirements
    assert f"mlflow=={mlflow.__version__}" in requirements
    linked = {m.key: m.value for m in client.get_logged_model(extra["model_id"]).metrics}
    run_metrics = client.get_run(champion.run_id).data.metrics
    assert linked["pass_at_1"] == run_metrics["pass_at_1"] and "arithmetic/pass_at_1" in linked


@pytest.mark.xdist_group("serve_agent")  # the module's `policy` and `agent_home`
def test_the_served_agent_answers_with_its_tools_and_rollback_serves_the_previous_champion(agent_home, policy, sandbox):
    from environments.families import build_tools

    home, tracker = agent_home
    versions = {str(v.version): v for v in tracker.versions()}
    tasks = {family: [t for t in policy.tasks if t["family"] == family][:6] for family in FAMILY_TOOL}
    # the same tools the agent has, built here: a call re-run on them must observe what the agent observed
    tools = build_tools(sandbox=sandbox, kb=policy.kb, top_k=1)
    server, port = _serve(home)
    try:
        replies = {family: [_post(port, _question(t)) for t in chunk] for family, chunk in tasks.items()}
        with pytest.raises(urllib.error.HTTPError) as refused:
            _post(port, {"input": [{"role": "user", "content": "hi"}], "custom_inputs": {"family": "poetry"}})
        assert "custom_inputs.family: 'poetry' is not one of this agent's families" in refused.value.read().decode()
        # bad requests are refused naming the field; none of them runs an episode
        for body, named in [
            ({"input": [{"role": "system", "content": "be brief"}]}, "no user message"),
            (
                {"input": [{"role": "user", "content": "hi"}], "custom_inputs": {"temp": 1}},
                "custom_inputs: unknown ['temp']",
            ),
            (
                {"input": [{"role": "user", "content": "hi"}], "custom_inputs": {"temperature": "hot"}},
                "custom_inputs.temperature",
            ),
            ({"input": [{"role": "user", "content": "7 * 6 " * 600}]}, "leaves no room for an answer"),
            ({"input": [{"role": "user", "content": "7 * 6 " * 2000}]}, "characters; this agent's context holds"),
        ]:
            with pytest.raises(urllib.error.HTTPError) as refused:
                _post(port, body)
            assert refused.value.code == 400 and named in refused.value.read().decode(), named
    finally:
        stop_server(server)
    traces = {family: [] for family in FAMILY_TOOL}
    for family, chunk in replies.items():
        for reply in chunk:
            extra = reply["custom_outputs"]
            assert extra["model_version"] == "2" and versions["2"].source == f"models:/{extra['model_id']}"
            assert all(call["name"] == FAMILY_TOOL[family] for call in extra["tool_trace"]), (family, extra)
            for call in extra["tool_trace"]:
                [again] = tools[call["name"]].call_many([call["args"]])
                assert again.observation == call["result"], (family, call)
            calls = [item for item in reply["output"] if item["type"] == "function_call"]
            outputs = [item for item in reply["output"] if item["type"] == "function_call_output"]
            assert [c["call_id"] for c in calls] == [o["call_id"] for o in outputs]
            assert [json.loads(c["arguments"]) for c in calls] == [
                {"code" if call["name"] == "code" else "query": call["args"]} for call in extra["tool_trace"]
            ]
            assert reply["output"][-1]["type"] == "message"
            traces[family] += extra["tool_trace"]
    # the interpreter ran the policy's code (an arithmetic call printed a number), the search read the corpus
    assert any(call["result"].strip().lstrip("-").isdigit() for call in traces["arithmetic"]), traces["arithmetic"]
    assert traces["code"] and any(
        doc["text"][:20] in call["result"] for call in traces["search"] for doc in policy.kb.documents
    )
    assert sum(r["custom_outputs"]["answer"] is not None for chunk in replies.values() for r in chunk) >= 9
    # every request was traced into the flywheel's experiment (the MLflow UI's Traces tab), nothing in the repo
    logged = tracker.raw_client().search_traces(locations=[tracker.experiment_id()], max_results=100)
    assert len(logged) >= sum(len(chunk) for chunk in replies.values()) and not (REPO / "mlruns").exists()

    env = _env(home)
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.registry", "--profile", "micro", "rollback"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "v2 -> v1" in done.stdout, done.stderr
    server, port = _serve(home)
    try:
        reply = _post(port, _question(tasks["arithmetic"][0]))
    finally:
        stop_server(server)
    assert reply["custom_outputs"]["model_version"] == "1"
    assert versions["1"].source == f"models:/{reply['custom_outputs']['model_id']}"


@pytest.mark.xdist_group("serve_agent")
def test_a_version_registered_before_versions_were_models_is_named_not_served(agent_home, capsys):
    from pipelines.serve import main as serve

    home, _ = agent_home
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        assert serve(["--profile", "micro", "--version", "3"]) == 1
        assert serve(["--profile", "micro", "--version", "9"]) == 1
    err = capsys.readouterr().err
    assert "version 3 was registered before versions were MLflow models" in err
    assert "versions that can: 1, 2" in err and "has no version '9'" in err


@pytest.mark.xdist_group("serve_agent")
def test_registry_load_gives_the_policy_of_an_agent_model_and_of_an_old_folder_version(agent_home, tmp_path, policy):
    import torch

    from pipelines.registry import load

    home, tracker = agent_home
    expected = dict(policy.model.named_parameters())
    for alias, version in (("old", "3"), ("current", "1")):
        tracker.set_alias(alias, version)
        model, _, folder = load(tracker, alias, tmp_path / alias)
        assert (folder / "config.json").exists()
        assert all(torch.equal(p, expected[name]) for name, p in model.named_parameters())


# ============================================================================ hostile requests


def _raw(port: int, data: bytes, *, wait_s: float = 30.0) -> tuple[bytes, float]:
    """What the server sends back to `data` on one connection until it closes it, and how long that took."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(wait_s)
        try:
            sock.sendall(data)
        except OSError:  # refused and closed mid-upload (or stopped reading it)
            pass
        _, got = read_until_closed(sock, wait_s)
    return got, time.monotonic() - start


def _traces(tracker) -> int:
    return len(tracker.raw_client().search_traces(locations=[tracker.experiment_id()], max_results=1000))


@pytest.fixture(scope="module")
def untrained_home(tmp_path_factory, micro_cfg, sandbox):
    """A micro home whose champion (v1) is an agent model of a barely trained policy (one SFT
    step): the refusals below happen before the policy would run."""
    from assets.agent_model import log_agent_model
    from benchmarks.warm_start import warm_started_policy
    from environments.search import kb_to_rows
    from pipelines.registry import tracker_for
    from training.model import save_checkpoint

    policy = warm_started_policy(micro_cfg, sandbox, sft_steps=1)
    home = tmp_path_factory.mktemp("serve-hostile") / "fw"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        tracker = tracker_for(micro_cfg)
        folder = save_checkpoint(policy.model, policy.tokenizer, home / "checkpoint")
        run_id = tracker.client().create_run(tracker.experiment_id()).info.run_id
        tracker.register_model(
            run_id,
            lambda: log_agent_model(run_id, folder, micro_cfg, kb_to_rows(policy.kb), {"pass_at_1": 0.0}),
            {"stage": "rl", "round": "1"},
        )
        tracker.promote("1", "gate")
    return home, tracker


@pytest.mark.integrity
def test_hostile_requests_are_refused_before_the_agent_without_traces_or_stack_traces(untrained_home):
    """A 10 MB question used to take 60 s, grow the server by 1.7 GB and land in a 10.5 MB trace
    before its 400; errors came back as MLflow's stack trace with host paths. Now: a 413 before
    anything reads the body, a 400 `{"error": reason}` for what the agent refuses, no trace of
    either, and half-sent headers cut at the server's header timeout."""
    home, tracker = untrained_home
    traces_before = _traces(tracker)
    server, port = _serve(home)
    try:
        rss_before = _rss_mib(server.pid)
        question = json.dumps({"input": [{"role": "user", "content": "7 * 6 " * (10 * 2**20 // 6)}]}).encode()
        head = f"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(question)}\r\n\r\n"
        reply, seconds = _raw(port, head.encode() + question)
        assert reply.startswith(b"HTTP/1.1 413") and b'{"error": "request body over 1048576 bytes"}' in reply, reply
        assert seconds < 5
        # streamed without a length: counted as it arrives, refused past the cap
        chunked = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunked += b"".join(b"10000\r\n" + question[i : i + 0x10000] + b"\r\n" for i in range(0, 4 * 2**20, 0x10000))
        reply, seconds = _raw(port, chunked)
        assert reply.startswith(b"HTTP/1.1 413") and seconds < 5, reply[:300]
        assert _rss_mib(server.pid) - rss_before < 100
        # refused by the agent's own checks: the reason only, as JSON, no trace, no host path
        for body, named in (
            ({"input": [{"role": "user", "content": "x" * 100_000}]}, "characters; this agent's context holds"),
            ({"input": [{"role": "user", "content": "hi"}], "custom_inputs": {"family": "poetry"}}, "'poetry'"),
            ({"input": "not a list"}, "not a Responses-API request"),
        ):
            with pytest.raises(urllib.error.HTTPError) as refused:
                _post(port, body)
            text = refused.value.read().decode()
            assert refused.value.code == 400 and named in json.loads(text)["error"], text
            assert "Traceback" not in text and "stack_trace" not in text and str(REPO) not in text, text
        reply, _ = _raw(
            port,
            head.replace(str(len(question)), "9").encode()
            + b"not json!"
            + b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        assert reply.startswith(b"HTTP/1.1 400") and b"the body is not JSON" in reply, reply
        reply, _ = _raw(port, b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        assert reply.startswith(b"HTTP/1.1 400") and b"takes no request body" in reply, reply
        # slowloris: half the headers, then nothing
        reply, seconds = _raw(port, b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Ty", wait_s=30)
        assert reply.startswith(b"HTTP/1.1 408") and seconds < 15, (reply, seconds)
        print(f"half-sent headers disconnected after {seconds:.1f} s")
        assert _traces(tracker) == traces_before, "a refused request was traced"
        # and a request the agent takes still goes through the front to MLflow's app, traced
        reply = _post(
            port, {"input": [{"role": "user", "content": "What is 2 + 2?"}], "custom_inputs": {"greedy": True}}
        )
        assert reply["custom_outputs"]["model_version"] == "1" and reply["output"][-1]["type"] == "message"
    finally:
        stop_server(server)
    assert _traces(tracker) == traces_before + 1


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


@pytest.mark.integrity
def test_the_front_replaces_mlflow_errors_by_a_reason_and_logs_the_trace(caplog):
    """MLflow answers a failed predict with 400, "Verify that the serialized input Dataframe…" and
    the stack trace; the front logs that and answers 500 {"error": ...} naming an id in the log."""
    import asyncio

    from pipelines.serve_http import Front

    async def mlflow_like(scope, receive, send):
        await receive()
        body = json.dumps(
            {
                "error_code": "BAD_REQUEST",
                "message": "Verify that the serialized input Dataframe",
                "stack_trace": f"Traceback: {REPO}/x.py",
            }
        ).encode()
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    scope = {
        "type": "http",
        "path": "/invocations",
        "method": "POST",
        "headers": [(b"content-type", b"application/json")],
    }
    with caplog.at_level("ERROR", logger="uvicorn.error"):
        asyncio.run(Front(mlflow_like, lambda body: None, max_body_bytes=100)(scope, receive, send))
    assert sent[0]["status"] == 500
    reply = json.loads(sent[1]["body"])
    assert set(reply) == {"error"} and "the agent failed on this request" in reply["error"], reply
    assert "Traceback" not in sent[1]["body"].decode() and str(REPO) not in sent[1]["body"].decode()
    error_id = reply["error"].rsplit(" ", 1)[1]
    assert any(error_id in r.getMessage() and "stack_trace" in r.getMessage() for r in caplog.records)

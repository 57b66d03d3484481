"""Rollout engines (HF and vLLM's CPU build) behind one agent loop: token exactness per engine and
task family, sampling parameters, weight sync, the loop's batching and tool concurrency."""

import os
import threading

import pytest
import torch

from environments.tools import ToolResult
from tests.rollout_checks import RecordingContinuousEngine, RecordingEngine, check_token_exact
from training.agent.engines import ContinuousEngine, Generation, HFEngine, Sampling, VLLMEngine, processed_logprobs
from training.agent.loop import run_episodes
from training.rl.loop import trainer_gap
from training.rl.math import logprob_mismatch, tis_weights
from training.rl.scoring import episode_record

FAMILIES = ("arithmetic", "search", "code")
# Documented bounds (docs/rollout.md): |log pi_trainer - log pi_engine| per policy token, fp32.
MISMATCH_BOUND = {"hf": 1e-4, "vllm": 1e-3}
pytestmark = pytest.mark.xdist_group("vllm")  # the module's vLLM engine; rounds on vLLM


@pytest.fixture(scope="module")
def vllm_engine(warm_policy, micro_cfg):
    engine = VLLMEngine.from_model(warm_policy.model, warm_policy.tokenizer, micro_cfg.rollout, seed=0)
    yield engine
    engine.close()


def engine_of(kind, warm_policy, request):
    return HFEngine(warm_policy.model) if kind == "hf" else request.getfixturevalue("vllm_engine")


def tasks_of(warm_policy, family, n=8):
    return [t for t in warm_policy.tasks if t["family"] == family][:n]


# --------------------------------------------------------------------------- pure sampling math
def test_processed_logprobs_apply_temperature_then_top_k_then_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    plain = processed_logprobs(logits, Sampling(temperature=0.5))
    torch.testing.assert_close(plain, torch.log_softmax(logits / 0.5, -1))
    top2 = processed_logprobs(logits, Sampling(top_k=2)).exp()
    p = torch.softmax(logits[0, :2], -1)  # renormalized over the two kept tokens
    torch.testing.assert_close(top2[0], torch.tensor([p[0], p[1], 0.0, 0.0]))
    # softmax([2,1,0,-1]) = [.644, .237, .087, .032]: 0.85 of the mass needs the first two tokens
    nucleus = processed_logprobs(logits, Sampling(top_p=0.85)).exp()
    torch.testing.assert_close(nucleus[0], torch.tensor([p[0], p[1], 0.0, 0.0]))
    # always keeps the argmax
    assert processed_logprobs(logits, Sampling(top_p=0.5)).exp()[0].tolist() == [
        1.0,
        0.0,
        0.0,
        0.0,
    ]


def test_mismatch_and_truncated_importance_weights_hand_computed():
    trainer = torch.tensor([[-1.0, -2.0, -0.5]])
    engine = torch.tensor([[-1.5, -2.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert logprob_mismatch(trainer, engine, mask) == {"max": 0.5, "mean": 0.25}  # the masked 2.5 gap is ignored
    w = tis_weights(trainer, engine, mask, cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.0, 0.0]]))  # exp(0.5) = 1.65 truncated to 1.5


# --------------------------------------------------------------------------- token exactness
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_rollouts_are_token_exact(kind, family, warm_policy, micro_cfg, tmp_path, request):
    check_token_exact(
        engine_of(kind, warm_policy, request), warm_policy, family, micro_cfg.rollout, tmp_path, MISMATCH_BOUND[kind]
    )


# --------------------------------------------------------------------------- sampling parameters
@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_sampling_parameters_are_honoured(kind, warm_policy, request):
    tok = warm_policy.tokenizer
    engine = engine_of(kind, warm_policy, request)
    prompts = [tok.encode(t["prompt"], add_special_tokens=False) for t in warm_policy.tasks[:6]]
    stops, budgets = {tok.eos_token_id}, [12] * len(prompts)

    def run(sampling, seed=0):
        return [
            g.ids
            for g in engine.generate(
                prompts, budgets, stop_ids=stops, sampling=sampling, generator=torch.Generator().manual_seed(seed)
            )
        ]

    greedy = run(Sampling(greedy=True))
    assert run(Sampling(top_k=1)) == greedy  # top-k 1 leaves only the argmax
    assert run(Sampling(top_p=1e-6, temperature=2.0)) == greedy  # so does a vanishing nucleus
    assert run(Sampling(temperature=1.0), seed=3) == run(Sampling(temperature=1.0), seed=3)  # seeded: reproducible
    assert run(Sampling(temperature=1.0), seed=3) != run(Sampling(temperature=1.0), seed=4)
    assert all(len(ids) <= 12 for ids in run(Sampling(temperature=1.0)))
    exact = engine.generate(
        prompts, [3, 7, 1, 0, 5, 9], stop_ids=set(), sampling=Sampling(), generator=torch.Generator().manual_seed(0)
    )
    assert [len(g.ids) for g in exact] == [3, 7, 1, 0, 5, 9]  # no stop ids: exactly the budget, EOS included
    # top-k 3: every sampled token is among the 3 most likely, and its log-prob is renormalized over them
    out = engine.generate(
        prompts,
        budgets,
        stop_ids=stops,
        sampling=Sampling(top_k=3, temperature=0.7),
        generator=torch.Generator().manual_seed(1),
    )
    for prompt, gen in zip(prompts, out):
        with torch.no_grad():
            logits = warm_policy.model(torch.tensor([prompt + gen.ids])).logits[0, len(prompt) - 1 : -1]
        expected = processed_logprobs(logits, Sampling(top_k=3, temperature=0.7))
        ids = torch.tensor(gen.ids)
        assert torch.isfinite(expected[torch.arange(len(ids)), ids]).all()
        torch.testing.assert_close(
            torch.tensor(gen.logprobs), expected[torch.arange(len(ids)), ids], atol=MISMATCH_BOUND[kind], rtol=0
        )


def _by_episode(episodes) -> dict[tuple[str, int], list[int]]:
    return {(e.task["task_id"], e.sample_index): e.completion_ids for e in episodes}


@pytest.mark.scaleout
def test_vllm_episodes_are_keyed_too(warm_policy, micro_cfg, vllm_engine):
    """vLLM takes each turn's keyed seed as the request's seed: the batch an episode ran in and
    its position there do not change what it samples."""
    tasks = [t for family in ("arithmetic", "code") for t in tasks_of(warm_policy, family, 2)]
    common = dict(
        group_size=2,
        tools=warm_policy.tools,
        cfg=micro_cfg.rollout.model_copy(update={"temperature": 1.3}),
        sampling_key="seed=0/round=1/step=1",
    )
    together = _by_episode(run_episodes(vllm_engine, warm_policy.tokenizer, tasks, **common))
    apart = _by_episode(
        run_episodes(vllm_engine, warm_policy.tokenizer, tasks[2:], **common)
        + run_episodes(vllm_engine, warm_policy.tokenizer, tasks[:2], **common)
    )
    same = sum(together[k] == apart[k] for k in together)
    assert same == len(together), f"{same}/{len(together)} episodes sampled the same ids"


def test_hf_and_vllm_agree_on_greedy_rollouts(warm_policy, micro_cfg, vllm_engine):
    """Same weights, same prompts, argmax decoding: the two engines' episodes match (fp32 both;
    an exact tie could flip one token, so nearly all rather than all)."""
    tasks = [t for family in FAMILIES for t in tasks_of(warm_policy, family, 6)]
    common = dict(group_size=1, tools=warm_policy.tools, cfg=micro_cfg.rollout, greedy=True)
    hf = run_episodes(HFEngine(warm_policy.model), warm_policy.tokenizer, tasks, **common)
    vl = run_episodes(vllm_engine, warm_policy.tokenizer, tasks, **common)
    same = sum(a.completion_ids == b.completion_ids for a, b in zip(hf, vl))
    assert same >= 0.9 * len(tasks), f"{same}/{len(tasks)} identical"


# --------------------------------------------------------------------------- weight sync
@pytest.mark.parametrize("via", ["memory", "folder"])
def test_vllm_serves_new_weights_after_sync_without_restart(via, warm_policy, micro_cfg, vllm_engine):
    import copy

    tok = warm_policy.tokenizer
    moved = copy.deepcopy(warm_policy.model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    prompts = [tok.encode(t["prompt"], add_special_tokens=False) for t in warm_policy.tasks[:8]]
    kwargs = dict(stop_ids={tok.eos_token_id}, sampling=Sampling(temperature=1.0), generator=None)
    try:
        vllm_engine.sync_weights(moved, via=via)
        out = vllm_engine.generate(prompts, [10] * len(prompts), **kwargs)
        records = [
            {"prompt_ids": p, "completion_ids": g.ids, "tool_mask": [1] * len(g.ids), "logprobs": g.logprobs}
            for p, g in zip(prompts, out)
        ]
        assert (
            trainer_gap(moved, records, temperature=1.0, pad_id=tok.eos_token_id)[1]["rollout/logprob_mismatch_max"]
            < MISMATCH_BOUND["vllm"]
        )
        assert (
            trainer_gap(warm_policy.model, records, temperature=1.0, pad_id=tok.eos_token_id)[1][
                "rollout/logprob_mismatch_max"
            ]
            > 0.01
        )
    finally:
        vllm_engine.sync_weights(warm_policy.model)  # the module's engine serves the warm policy again


def test_hf_engine_serves_the_trainers_weights(warm_policy):
    import copy

    shared = HFEngine(warm_policy.model)
    assert shared.model is warm_policy.model  # the trainer's own tensors: an update is served at once
    served = HFEngine(copy.deepcopy(warm_policy.model))
    moved = copy.deepcopy(warm_policy.model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05)
    served.sync_weights(moved)  # another object: copied in place
    for a, b in zip(served.model.state_dict().values(), moved.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("drop_stopped_at", [0.0, 0.5])
def test_hf_engine_drops_stopped_rows_and_generates_as_each_row_alone(drop_stopped_at):
    """Rows stopping at different steps leave the batch (and its KV cache) as they stop, or once
    half have stopped; greedy output and log-probs stay those of each row generated alone."""
    from training.distributed_check import tiny_model

    engine = HFEngine(tiny_model(seed=3).eval(), drop_stopped_at=drop_stopped_at)
    g = torch.Generator().manual_seed(0)
    sequences = [torch.randint(1, 64, (int(n),), generator=g).tolist() for n in torch.randint(2, 9, (12,), generator=g)]
    budgets = [1, 2, 3, 24, 5, 24, 2, 7, 24, 1, 24, 4]  # most rows stop early, four run on
    greedy = Sampling(greedy=True)
    batched = engine.generate(sequences, budgets, stop_ids={63}, sampling=greedy, generator=None)
    for seq, budget, out in zip(sequences, budgets, batched):
        alone = engine.generate([seq], [budget], stop_ids={63}, sampling=greedy, generator=None)[0]
        assert out.ids == alone.ids and len(out.ids) == budget
        assert out.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


# --------------------------------------------------------------------------- the agent loop
def test_batch_cap_lets_waiting_episodes_join_as_others_finish(warm_policy, micro_cfg):
    tok = warm_policy.tokenizer
    tasks = [t for family in FAMILIES for t in tasks_of(warm_policy, family, 3)]
    full = run_episodes(
        HFEngine(warm_policy.model),
        tok,
        tasks,
        group_size=1,
        tools=warm_policy.tools,
        cfg=micro_cfg.rollout,
        greedy=True,
    )
    capped_engine = RecordingEngine(HFEngine(warm_policy.model))
    capped = run_episodes(
        capped_engine,
        tok,
        tasks,
        group_size=1,
        tools=warm_policy.tools,
        cfg=micro_cfg.rollout.model_copy(update={"max_batch_size": 4}),
        greedy=True,
    )
    assert max(len(sequences) for sequences, _, _ in capped_engine.calls) == 4  # HF: one call per turn
    assert [e.completion_ids for e in capped] == [e.completion_ids for e in full]  # greedy: batching changes nothing


def test_vllm_continuous_schedule_respects_the_batch_cap(warm_policy, micro_cfg, vllm_engine):
    tok = warm_policy.tokenizer
    tasks = [t for family in FAMILIES for t in tasks_of(warm_policy, family, 3)]
    seen = []

    class Counting(RecordingContinuousEngine):
        def submit(self, key, sequence, budget, **kwargs):
            super().submit(key, sequence, budget, **kwargs)
            seen.append(len(self.in_flight))  # turns in flight after this one

    full = run_episodes(
        vllm_engine,
        tok,
        tasks,
        group_size=2,
        tools=warm_policy.tools,
        cfg=micro_cfg.rollout,
        generator=torch.Generator().manual_seed(0),
    )
    capped = run_episodes(
        Counting(vllm_engine),
        tok,
        tasks,
        group_size=2,
        tools=warm_policy.tools,
        cfg=micro_cfg.rollout.model_copy(update={"max_batch_size": 4}),
        generator=torch.Generator().manual_seed(0),
    )
    assert max(seen) <= 4
    # seeds depend on the episode only, so who shared a step does not change what was sampled
    assert sum(a.completion_ids == b.completion_ids for a, b in zip(full, capped)) >= 0.9 * len(full)


def test_the_vllm_engine_is_a_continuous_engine(vllm_engine):
    assert isinstance(vllm_engine, ContinuousEngine)


@pytest.mark.parametrize("sessions", [True, False])
def test_vllm_sessions_prefill_only_what_a_turn_adds(sessions, warm_policy, micro_cfg, vllm_engine, monkeypatch):
    """With sessions an episode keeps its KV cache between turns: a later turn sends vLLM only the
    previous turn's last sampled id (whose KV vLLM has not computed yet) and the observation. Both
    modes stay token-exact (the trainer's log-probs match) and leave nothing open in the engine."""
    tok = warm_policy.tokenizer
    chunks = []
    monkeypatch.setattr(vllm_engine, "sessions", sessions)
    add_chunk = vllm_engine._add_session_chunk
    monkeypatch.setattr(
        vllm_engine,
        "_add_session_chunk",
        lambda key, ids, params: (chunks.append((key, list(ids))), add_chunk(key, ids, params)),
    )
    tasks = [t for family in FAMILIES for t in tasks_of(warm_policy, family, 3)]
    episodes = run_episodes(
        vllm_engine,
        tok,
        tasks,
        group_size=2,
        tools=warm_policy.tools,
        cfg=micro_cfg.rollout,
        generator=torch.Generator().manual_seed(0),
    )
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests() and not vllm_engine._sessions
    records = [episode_record(e, round_index=1, step=1, policy_version="t", tokenizer=tok) for e in episodes]
    assert (
        trainer_gap(warm_policy.model, records, temperature=micro_cfg.rollout.temperature, pad_id=tok.eos_token_id)[1][
            "rollout/logprob_mismatch_max"
        ]
        < MISMATCH_BOUND["vllm"]
    )
    if not sessions:
        assert not chunks
        return
    by_episode = {}
    for key, ids in chunks:  # keys are "<base seed>-<episode index>"
        by_episode.setdefault(int(key.split("-")[1]), []).append(ids)
    continued = 0
    for i, e in enumerate(episodes):
        sent = by_episode[i]
        assert sent[0] == e.prompt_ids and len(sent) == min(e.turns, len(e.tool_calls) + 1)
        for k, ids in enumerate(sent[1:]):  # turn k+1: the last id turn k sampled, then observation k
            start, end = _observation_span(e, k)
            assert ids == e.completion_ids[start - 1 : end]
            continued += 1
    assert continued > 0, "no episode had a second turn"


def _observation_span(episode, k):
    """(start, end) of observation k in completion_ids: the k-th run of mask-0 ids."""
    runs, start = [], None
    for i, m in enumerate(episode.tool_mask + [1]):
        if m == 0 and start is None:
            start = i
        elif m == 1 and start is not None:
            runs.append((start, i))
            start = None
    return runs[k]


def test_vllm_fails_clearly_when_no_turn_can_be_scheduled(warm_policy, micro_cfg, vllm_engine, monkeypatch):
    """Steps that yield nothing while turns are in flight (sessions holding the whole KV cache)
    must end the rollout with the settings to change, not spin forever."""
    monkeypatch.setattr(vllm_engine.llm.llm_engine, "step", lambda: [])
    vllm_engine._running["stuck"] = 0
    try:
        with pytest.raises(RuntimeError, match="kv_cache_memory_mb.*max_batch_size.*sessions"):
            while True:
                vllm_engine.poll()
    finally:
        vllm_engine._running.clear()
        vllm_engine._idle_steps, vllm_engine._progress_mark = 0, -1


class BarrierTool:
    """Returns only when the other tool's batch is running at the same time."""

    def __init__(self, name, barrier):
        self.name, self.barrier = name, barrier

    def call_many(self, args):
        self.barrier.wait()
        return [ToolResult(f"{self.name} ok\n", None, 0.0) for _ in args]


class ScriptedEngine:
    """Emits a fixed turn per row: a call of the tool its task's family offers, then an answer."""

    name = "scripted"

    def __init__(self, tok, tasks):
        self.tok = tok
        self.tool_of = {
            tuple(tok.encode(t["prompt"], add_special_tokens=False)): "search" if t["family"] == "search" else "code"
            for t in tasks
        }

    def generate(self, sequences, budgets, **kwargs):
        out = []
        for seq in sequences:
            tool = next(name for prompt, name in self.tool_of.items() if tuple(seq[: len(prompt)]) == prompt)
            called = len(seq) > max(len(p) for p in self.tool_of if tuple(seq[: len(p)]) == p)
            text = (
                "<answer>1</answer>"
                if called
                else ("<search>x</search>" if tool == "search" else "<code>print(1)</code>")
            )
            ids = self.tok.encode(text, add_special_tokens=False)
            out.append(Generation(ids, [-0.1] * len(ids)))
        return out

    def sync_weights(self, model):
        return 0.0

    def close(self):
        pass


def test_tool_batches_of_one_turn_run_concurrently_and_a_crashing_tool_becomes_an_observation(warm_policy, micro_cfg):
    tok = warm_policy.tokenizer
    tasks = [tasks_of(warm_policy, "arithmetic", 1)[0], tasks_of(warm_policy, "search", 1)[0]]
    # breaks (and the call raises) if the two batches ran one after the other
    barrier = threading.Barrier(2, timeout=10)
    tools = {"code": BarrierTool("code", barrier), "search": BarrierTool("search", barrier)}
    episodes = run_episodes(ScriptedEngine(tok, tasks), tok, tasks, group_size=1, tools=tools, cfg=micro_cfg.rollout)
    assert [e.tool_calls[0]["result"] for e in episodes] == ["code ok\n", "search ok\n"]
    assert all(e.stop_reason == "answer" for e in episodes)

    class Crashing:
        name = "code"

        def call_many(self, args):
            raise OSError("sandbox pool is gone")

    episodes = run_episodes(
        ScriptedEngine(tok, tasks), tok, tasks[:1], group_size=2, tools={"code": Crashing()}, cfg=micro_cfg.rollout
    )
    assert [e.tool_calls[0]["error"] for e in episodes] == ["tool_exception"] * 2
    assert all(e.stop_reason == "answer" for e in episodes)  # the episode went on after the error observation


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placing tools on their own core needs two CPUs")
def test_tool_cores_run_the_code_on_their_own_cores_during_a_rollout_and_restore_after(warm_policy, micro_cfg, sandbox):
    """rollout.tool_cores: the engine's thread and torch's threads on the first CPUs, the sandbox's
    workers (and the code they fork) on the last ones, for the rollout only."""
    from environments.tools import CodeInterpreter
    from training.agent.loop import split_cores

    cpus = sorted(os.sched_getaffinity(0))
    code = CodeInterpreter(sandbox)
    where = "import os; print(sorted(os.sched_getaffinity(0)))"
    threads = torch.get_num_threads()
    with split_cores(1, {"code": code}):
        assert code.call_many([where])[0].observation == f"{cpus[-1:]}\n"
        assert sorted(os.sched_getaffinity(0)) == cpus[:-1] and torch.get_num_threads() == len(cpus) - 1
    assert code.call_many([where])[0].observation == f"{cpus}\n"
    assert sorted(os.sched_getaffinity(0)) == cpus and torch.get_num_threads() == threads

    # through the agent loop: the engine generates on the engine's cores, the code runs
    seen = []

    class Placed(ScriptedEngine):
        def generate(self, sequences, budgets, **kwargs):
            seen.append((sorted(os.sched_getaffinity(0)), torch.get_num_threads()))
            return super().generate(sequences, budgets, **kwargs)

    tok, tasks = warm_policy.tokenizer, tasks_of(warm_policy, "arithmetic", 2)
    episodes = run_episodes(
        Placed(tok, tasks),
        tok,
        tasks,
        group_size=2,
        tools={"code": code},
        cfg=micro_cfg.rollout.model_copy(update={"tool_cores": 1}),
    )
    assert [c["result"] for e in episodes for c in e.tool_calls] == ["1\n"] * 4
    assert seen == [(cpus[:-1], len(cpus) - 1)] * 2  # the call turn and the answer turn
    assert sorted(os.sched_getaffinity(0)) == cpus and torch.get_num_threads() == threads

    with pytest.raises(ValueError, match=f"rollout.tool_cores={len(cpus)} leaves no core for the engine"):
        with split_cores(len(cpus), {"code": code}):
            pass
    assert sorted(os.sched_getaffinity(0)) == cpus


# --------------------------------------------------------------------------- in an RL round
@pytest.mark.parametrize("tis_cap", [None, 2.0])
def test_an_rl_round_on_vllm_logs_the_mismatch_every_step_and_syncs_weights(tis_cap, warm_policy, micro_cfg):
    import copy

    from configs.schema import RewardConfig
    from training.rl.loop import train_round
    from verifiers.cascade import Cascade

    policy = copy.deepcopy(warm_policy.model)
    rl = micro_cfg.rl.model_copy(
        update={"steps_per_round": 3, "prompts_per_step": 4, "group_size": 4, "kl_coef": 0.0, "tis_cap": tis_cap}
    )
    rollout = micro_cfg.rollout.model_copy(update={"engine": "vllm"})
    result = train_round(
        policy,
        None,
        warm_policy.tokenizer,
        warm_policy.tasks,
        warm_policy.tools,
        rl=rl,
        rollout=rollout,
        cascade=Cascade(RewardConfig()),
        round_index=1,
        policy_version="t",
        seed=0,
    )
    assert [h["step"] for h in result.history] == [1, 2, 3]
    for h in result.history:
        # after each sync, the engine serves the trainer's weights
        assert h["rollout/logprob_mismatch_max"] < MISMATCH_BOUND["vllm"], h
        assert h["rollout/logprob_mismatch_mean"] <= h["rollout/logprob_mismatch_max"]
        if h["rollout/trained_trajectories"]:
            assert h["perf/weight_sync_s"] >= 0
            assert ("rollout/tis_weight_mean" in h) == (tis_cap is not None)
    assert any(h["rollout/trained_trajectories"] for h in result.history), (
        "no step trained: the sync was never exercised"
    )

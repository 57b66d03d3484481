"""Checks shared by the engine tests on scratch and on real tokenizers (tests/training/test_rollout_engines.py,
tests/training/test_text_protocol.py, tests/training/test_real_model.py)."""

from __future__ import annotations

import pandas as pd
import torch

from training.agent.engines import ContinuousEngine, Generation
from training.agent.loop import run_episodes
from training.rl.loop import trainer_gap
from training.rl.scoring import episode_record
from training.sequences import encode, encode_observation
from verifiers.protocol import OBSERVATION_TAGS, first_stop


class RecordingEngine:
    """Passes calls through to a real batch engine and keeps every turn it served: the exact
    sequence it was given and what it sampled. `recording(engine)` picks this class or the
    continuous one, so the agent loop runs the schedule the real engine would get."""

    def __init__(self, inner):
        self.inner, self.name, self.calls, self.turns = inner, inner.name, [], []

    def generate(self, sequences, budgets, **kwargs):
        out = self.inner.generate(sequences, budgets, **kwargs)
        self.calls.append(
            ([list(s) for s in sequences], budgets, [Generation(list(g.ids), list(g.logprobs)) for g in out])
        )
        self.turns += [(list(s), Generation(list(g.ids), list(g.logprobs))) for s, g in zip(sequences, out)]
        return out

    def sync_weights(self, model):
        return self.inner.sync_weights(model)

    def close(self):
        pass


class RecordingContinuousEngine(RecordingEngine):
    """The same for a ContinuousEngine: the turns it served through submit / poll too."""

    def __init__(self, inner):
        super().__init__(inner)
        self.submitted, self.in_flight = {}, set()

    def submit(self, key, sequence, budget, **kwargs):
        self.submitted[key] = list(sequence)
        self.in_flight.add(key)
        self.inner.submit(key, sequence, budget, **kwargs)

    def poll(self):
        out = self.inner.poll()
        self.in_flight -= {key for key, _ in out}
        self.turns += [(self.submitted[key], Generation(list(g.ids), list(g.logprobs))) for key, g in out]
        return out

    def busy(self):
        return self.inner.busy()

    def end(self, key):
        self.inner.end(key)


def recording(inner) -> RecordingEngine:
    return RecordingContinuousEngine(inner) if isinstance(inner, ContinuousEngine) else RecordingEngine(inner)


def check_token_exact(
    inner_engine, policy, family: str, cfg, tmp_path, bound: float, *, tasks=None, group_size: int = 4
) -> list:
    """(a) completion ids = what the engine sampled + the tokenized observations, in order;
    (b) tool_mask is 1 exactly on sampled ids; (c) the trainer's log-probs of the recorded
    tokens match the engine's within `bound`; (d) ids survive Parquet storage; (e) a turn ends at
    the token that completes its first stop string, never later. Returns the episodes."""
    from dagster import build_input_context, build_output_context

    from assets.io import FrameIOManager

    tok = policy.tokenizer
    engine = recording(inner_engine)
    tasks = tasks if tasks is not None else [t for t in policy.tasks if t["family"] == family][:8]
    episodes = run_episodes(
        engine,
        tok,
        tasks,
        group_size=group_size,
        tools=policy.tools,
        cfg=cfg,
        generator=torch.Generator().manual_seed(0),
    )
    assert sum(len(e.tool_calls) for e in episodes) > 0, f"the warm-started policy made no {family} tool call"
    # (a) replay: each turn of each episode must be one engine answer, given exactly the recorded
    # history (each answer used once), followed by exactly the tokenized observation
    unused = list(engine.turns)
    for e in episodes:
        ids, mask, logprobs = [], [], []
        for k in range(e.turns):
            history = e.prompt_ids + ids
            match = next(
                (
                    t
                    for t in unused
                    if t[0] == history and e.completion_ids[len(ids) : len(ids) + len(t[1].ids)] == t[1].ids
                ),
                None,
            )
            assert match is not None, (
                f"turn {k} of {e.group_id}/{e.sample_index} is not what the engine sampled for that history"
            )
            unused.remove(match)
            gen = match[1]
            # (e) nothing sampled after the token that completed the turn's first stop
            if gen.ids:
                text = tok.decode(gen.ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
                stop = first_stop(text)
                if stop is not None:
                    before = len(
                        tok.decode(gen.ids[:-1], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                    )
                    assert stop[1] > before, f"turn {k} of {e.group_id} ran past {stop[0]!r}: {text!r}"
            ids += gen.ids
            mask += [1] * len(gen.ids)
            logprobs += gen.logprobs
            if k < len(e.tool_calls):
                call = e.tool_calls[k]
                full = encode_observation(tok, call["result"], call["name"])
                assert call["truncated"] == (len(full) > cfg.max_observation_tokens)
                close = encode(tok, OBSERVATION_TAGS[call["name"]][1])
                obs = full[: cfg.max_observation_tokens - len(close)] + close if call["truncated"] else full
                ids += obs
                mask += [0] * len(obs)
                logprobs += [0.0] * len(obs)
        assert e.completion_ids == ids
        assert e.tool_mask == mask  # (b)
        assert e.logprobs == logprobs
    assert not unused, "the engine sampled turns no episode recorded"
    # (c) what the trainer computes, as logged every RL step
    records = [episode_record(e, round_index=1, step=1, policy_version="t", tokenizer=tok) for e in episodes]
    _, gap = trainer_gap(policy.model, records, temperature=cfg.temperature, pad_id=tok.eos_token_id)
    assert gap["rollout/logprob_mismatch_max"] < bound, gap
    # (d) through the IO manager that stores rollout_batches
    io = FrameIOManager(root=str(tmp_path))
    io.handle_output(build_output_context(asset_key="rollout_batches", partition_key="1"), pd.DataFrame(records))
    back = io.load_input(build_input_context(asset_key="rollout_batches", partition_key="1")).to_dict("records")
    for before, after in zip(records, back):
        for column in ("prompt_ids", "completion_ids", "tool_mask"):
            assert [int(x) for x in after[column]] == before[column]
        assert [float(x) for x in after["logprobs"]] == before["logprobs"]
    return episodes

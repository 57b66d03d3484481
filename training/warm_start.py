"""A small policy that has learned the tool-call protocol, built in seconds to minutes.

An untrained model almost never closes a tool tag, so it cannot exercise multi-turn rollouts.
Engine tests and the rollout benchmark need a model that calls every family's tools; this builds
one the way the flywheel does (generated tasks and knowledge base, a tokenizer trained on them,
teacher trajectories through the real tools, SFT on policy tokens), only with fewer steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from configs.schema import FlywheelConfig
from environments.families import build_tools, generate_tasks, make_kb
from environments.search import KnowledgeBase
from environments.tools import Tool
from training.model import build_model
from training.sft import Example, train_sft
from training.tokenizer import train_tokenizer
from training.trajectories import build_sft_trajectories, tokenizer_corpus


@dataclass
class WarmStart:
    model: object
    tokenizer: object
    tasks: list[dict]  # every configured family's training tasks
    kb: KnowledgeBase
    tools: dict[str, Tool]
    sft_history: list[dict]


def warm_started_policy(cfg: FlywheelConfig, sandbox, *, sft_steps: int, seed: int = 0) -> WarmStart:
    kb = make_kb(cfg.data.knowledge_base, seed)
    tasks = [t for family, fam in cfg.data.families.items()
             for t in generate_tasks(family, fam.train_tasks, seed=seed, split="train", levels=fam.levels, level_weights=fam.level_weights, kb=kb)]
    tok = train_tokenizer(tokenizer_corpus(tasks, [d["text"] for d in kb.documents]), cfg.model.vocab_size)
    tools = build_tools(sandbox=sandbox, kb=kb, top_k=cfg.data.knowledge_base.top_k)
    rows = build_sft_trajectories(tasks, tok, tools, teacher=cfg.teacher, seed=seed, kb=kb)
    model = build_model(cfg.model, len(tok), tok.eos_token_id, seed)
    examples = [Example(r["prompt_ids"], r["completion_ids"], r["loss_mask"]) for r in rows]
    history = train_sft(model, examples, cfg.sft.model_copy(update={"steps": sft_steps}), pad_id=tok.eos_token_id, seed=seed)
    return WarmStart(model.eval(), tok, tasks, kb, tools, history)

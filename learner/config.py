"""The learner's sections of the config (which algorithm of the paper, which objective, how it trains) and
`TrainerConfig`, the tree a trainer needs: every section but the cluster's (cluster/ extends it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from diffusion.config import ExploreConfig, ModelConfig, PromptConfig, SamplerConfig
from diffusion.samplers import Solver
from learner.advantages import AdvantageMode
from learner.algorithms import Algorithm
from learner.art import TrustMask
from learner.objectives import Objective
from learner.schedules import DECAY_TYPES, linear_decay, nft_decay
from learner.selection import SelectionMode
from rewards.config import RewardConfig

# A rule of the config that a field's own type cannot say; `cluster.config` prints it with the preset
# line of the fields it names.
RULE_ERROR = "cross_field"

# A broken rule: the fields it involves (dotted paths from the top of the tree) and a one-line message.
Problem = tuple[tuple[str, ...], str]
ConfigT = TypeVar("ConfigT")


def rule_error(fields: tuple[str, ...], message: str) -> PydanticCustomError:
    """A broken rule as pydantic raises it: a custom error keeps the message as written (no "Value error, "
    prefix) and carries the fields, so `cluster.config` can point at the preset line that set them."""
    return PydanticCustomError(RULE_ERROR, "{message}", {"message": message, "fields": fields})


class Rules(Generic[ConfigT]):
    """One layer's rules across sections, in the order they are checked: small functions that return None
    or the `Problem`. A layer is one model validator that raises the first problem (`enforce`), so a new
    option's rule is one decorated function beside the others and nothing else to wire."""

    def __init__(self) -> None:
        self._rules: list[Callable[[ConfigT], Problem | None]] = []

    def rule(self, check: Callable[[ConfigT], Problem | None]) -> Callable[[ConfigT], Problem | None]:
        """Register `check` (a decorator), after the rules registered before it."""
        self._rules.append(check)
        return check

    def first_problem(self, config: ConfigT) -> Problem | None:
        return next((p for p in (check(config) for check in self._rules) if p is not None), None)

    def enforce(self, config: ConfigT) -> None:
        """Raise the first broken rule as a RULE_ERROR (inside a model validator: pydantic reports it)."""
        problem = self.first_problem(config)
        if problem is not None:
            raise rule_error(*problem)


# The rules across the trainer's sections (prompts, explore, learner, training, ...), below `TrainerConfig`;
# those that involve the cluster's section are `cluster.config.schema.CLUSTER_RULES`.
TRAINER_RULES: Rules[TrainerConfig] = Rules()

# Keys that were renamed: the old spelling fails with the new one in the message.
RENAMED_KEYS: dict[str, str] = {"learner.family": "learner.algorithm",
                                 "reward.digit_classifier_path": "reward.options.digit_alignment.path"}


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "embedded"
    seed: int = Field(0, ge=0, description="every seed of the run derives from it")
    iterations: int = Field(20, ge=0)
    checkpoint_every: int = Field(5, ge=0, description="iterations between checkpoints; 0: only at the end")
    keep_every: int = Field(0, ge=0, description="keep every N-th checkpoint for good in kept/iteration-N (a "
                            "multiple of checkpoint_every; verified like the rotating pair; `cluster.export "
                            "--checkpoint N` exports one); 0: only the last two")
    root: str | None = Field(None, description="absolute folder (shared storage on a cluster) that relative "
                             "--run-dir values and default run names resolve against; None: the current "
                             "directory (refused inside a Ray job, whose current directory is temporary)")


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    every: int = Field(5, ge=0, description="iterations between evaluations; 0: never")
    prompts: int = Field(10, ge=1, description="held-out prompts used")
    seeds_per_prompt: int = Field(16, ge=1)
    steps: int = Field(40, ge=1, description="sampler steps of evaluation, apart from the regeneration's "
                       "(the papers: 40; FLUX 28)")


class WandbConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(description="the W&B project the run is logged to")
    mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="offline (default: no network; `wandb sync <run dir>/wandb/offline-run-*` uploads "
        "it later), online, or disabled")
    entity: str | None = Field(None, description="the W&B team or user (None: the account's default)")


class LoggingConfig(BaseModel):
    """Experiment logging beside metrics.jsonl and the dashboard (`learner.experiment_log`): every iteration's
    scalars, and the held-out sample grid with each sample's reward every `eval.every` iterations. Only a
    run with a run directory logs (the learner's rank 0)."""

    model_config = ConfigDict(extra="forbid")

    wandb: WandbConfig | None = Field(None, description="Weights & Biases: {project, mode}; needs the wandb extra")
    tensorboard: bool = Field(False, description="TensorBoard event files in <run dir>/tensorboard; needs the "
                              "tensorboard extra")
    grid_prompts: int = Field(4, ge=1, description="held-out prompts (rows) of the logged sample grid")
    grid_seeds: int = Field(4, ge=1, description="seeds per prompt (columns) of the logged sample grid")


class NFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    beta: float = Field(1.0, gt=0)
    adv_clip_max: float = Field(5.0, gt=0)
    kl_weight: float = Field(1e-4, ge=0)


class ARTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    guidance_scale: float | None = Field(None, gt=0, description="EXTENSION, off by default: η in v* = v_old − "
                                         "η·G(c); the source normalises G so that no strength is needed")
    restore_weight: float = Field(0.0, ge=0, description="EXTENSION, off by default: λ of an explicit "
                                  "restoration in window 2 (its frozen-target replay already restores)")
    trust_threshold: float = Field(1e-5, gt=0, description="δ of the trust-region mask (SDE KL)")
    trust_mask: TrustMask = Field("trust_region", description="which reading of the source's mask "
                                  "(learner.art.TRUST_MASKS; docs/objectives.md): trust_region (the default, the "
                                  "reading the evidence runs measure bounding drift and holding accuracy) blocks, "
                                  "past δ, the update that would move the state further from θ_old; "
                                  "away_from_target blocks a state past δ whose drift points away from its target")
    noise_level: float = Field(0.7, gt=0, description="a of the ODE→SDE conversion")
    pairwise: bool = Field(False, description="replace rewards by winner 1 / loser 0 / tie 0.5 (K = 2)")


class ObjectiveDefaults(NamedTuple):
    """The defaults an objective's source runs with, where they differ by objective; a run that leaves the
    field unset (None) takes its objective's, written into config.yaml by `TrainerConfig`."""

    ema_every: int  # `training.ema_every`: optimizer steps between EMA folds
    timestep_fraction: float  # `learner.timestep_fraction`: the share of the sampler's steps trained


# nft: NVlabs/Sana `configs/sol_rl/base.py` (train.timestep_fraction 0.6; the EMA every step). art: the same
# (DiffusionART publishes no fraction of its own). flow_grpo: yifan123/flow_grpo `config/grpo.py`
# (timestep_fraction 0.99: the first 9 of 10 steps) and `scripts/train_sd3.py` (EMAModuleWrapper with
# update_step_interval=8).
OBJECTIVE_DEFAULTS: dict[str, ObjectiveDefaults] = {
    "nft": ObjectiveDefaults(ema_every=1, timestep_fraction=0.6),
    "art": ObjectiveDefaults(ema_every=1, timestep_fraction=0.6),
    "flow_grpo": ObjectiveDefaults(ema_every=8, timestep_fraction=0.99),
}

# yifan123/flow_grpo `config/grpo.py`: the KL weight β of each reward's SD3.5-M config (pickscore_sd3,
# clipscore_sd3, geneval_sd3, general_ocr_sd3). Other rewards, and weighted sums, take GRPO_KL_WEIGHT.
GRPO_KL_WEIGHTS: dict[str, float] = {"pickscore": 0.01, "clipscore": 0.02, "geneval": 0.04, "ocr": 0.04}
GRPO_KL_WEIGHT = 0.04


class GRPOConfig(BaseModel):
    """Flow-GRPO (`learner.flow_grpo`, `learner.updates.grpo_update`) as yifan123/flow_grpo runs it; each
    default is the source's (`config/base.py`, `config/grpo.py`, `scripts/train_sd3.py`). Its SDE's noise
    level is the sampler's `sde_noise_level` (0.7), its CFG the sampler's `cfg_scale` (the source: 4.5, in
    the rollout and in the training forward alike), the share of the rollout's steps trained
    `learner.timestep_fraction` (the source: 0.99 of 10 → the first 9), and the EMA's interval
    `training.ema_every` (the source: 8)."""

    model_config = ConfigDict(extra="forbid")

    clip_range: float = Field(1e-4, gt=0, description="ε of PPO's clipped ratio")
    adv_clip_max: float = Field(5.0, gt=0)
    kl_weight: float | None = Field(None, ge=0, description="β of the KL to the reference policy; None: the "
                                    "source's for the configured reward (pickscore 0.01, clipscore 0.02, geneval "
                                    "and ocr 0.04; others 0.04), recorded in the run's config")
    optimizer_steps: int = Field(2, ge=1, description="optimizer steps per rollout, each on its share of the "
                                 "shuffled samples (the source: gradient_accumulation_steps = num_batches_per_epoch"
                                 " // 2, two steps per epoch); from the second, θ ≠ θ_old and the clip binds")
    timesteps: Literal["first", "shuffled"] = Field("first", description="first: the rollout's first "
                                                    "⌊timestep_fraction·steps⌋ steps, in order (the source); "
                                                    "shuffled: a random share per sample, as DiffusionNFT")
    drop_zero_advantage: bool = Field(True, description="leave out samples whose advantage is exactly 0 (a "
                                      "prompt whose rewards are all equal), as the source does")
    cfg_gradient: Literal["conditional", "both"] = Field(
        "conditional", description="under CFG, which branches of v_u + s·(v_c − v_u) the gradient flows through: "
        "conditional (the source's compute_log_prob detaches v_u: s·∇v_c) or both ((1 − s)·∇v_u + s·∇v_c)")


class DecayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal[0, 1, 2, 3, "linear"] = 1
    custom_steps: int = Field(0, ge=0, description="type 3 only: steps to reach custom_value")
    custom_value: float = Field(0.0, ge=0.0, le=1.0, description="type 3 only: the decay it holds")
    start: float = Field(0.0, ge=0.0, le=1.0, description="linear only")
    end: float = Field(0.5, ge=0.0, le=1.0, description="linear only")
    ramp_steps: int = Field(100, ge=1, description="linear only")

    @model_validator(mode="after")
    def _custom_needs_values(self) -> DecayConfig:
        if self.type == 3 and not (self.custom_steps > 0 and self.custom_value > 0):
            raise ValueError(
                f"decay type 3 (custom) needs custom_steps > 0 and custom_value > 0 (given "
                f"{self.custom_steps} and {self.custom_value}); e.g. learner.decay.custom_steps=100 "
                "learner.decay.custom_value=0.9"
            )
        return self

    def decay(self, step: int) -> float:
        """d for the soft update that follows optimizer step number `step` (1 for the first)."""
        if self.type == "linear":
            return linear_decay(step, self.start, self.end, self.ramp_steps)
        if self.type == 3:
            return nft_decay(step, 0, self.custom_value / self.custom_steps, self.custom_value)
        return nft_decay(step, *DECAY_TYPES[self.type])


# How a LoRA adapter's A is first drawn: the keys of `learner.lora_adapters.LORA_INITS`.
LoraInit = Literal["gaussian", "kaiming"]


class TrainingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["lora", "full"] = "lora"
    lora_rank: int = Field(32, ge=1)
    lora_alpha: int = Field(64, ge=1)
    lora_init: LoraInit = Field(
        "gaussian", description="A's initial draw (B = 0): gaussian, A ~ N(0, (1/r)²), as every official config "
        "(peft init_lora_weights=\"gaussian\"); kaiming: peft's default kaiming-uniform (std 1/√(3·fan_in))")
    lora_targets: list[str] | None = Field(None, description="None: the model family's LoRA targets")
    lr: float = Field(3e-4, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(1e-4, ge=0)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, gt=0, description="max total grad L2 norm; inf disables clipping")
    ema: bool = Field(True, description="keep an EMA of θ and evaluate it (the official config.train.ema)")
    ema_decay: float = Field(0.9, ge=0, lt=1, description="the EMA's decay cap: min((1+s)/(10+s), ema_decay)")
    ema_every: int | None = Field(None, ge=1, description="fold θ into the EMA after every n-th optimizer step "
                                  "(when (s + 1) mod n = 0); None: the objective's source (flow_grpo 8, "
                                  "yifan123/flow_grpo; nft and art 1), recorded in the run's config")
    gradient_checkpointing: bool = Field(False, description="recompute the trained transformer's block "
                                         "activations in the backward pass (diffusers' "
                                         "enable_gradient_checkpointing): less memory, about one more forward")


class LearnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    algorithm: Algorithm = Field("sol_rl", description="the paper's variant: what is explored, what is trained on")
    objective: Objective = "nft"
    selection: SelectionMode = "best_worst"
    advantage_mode: AdvantageMode = "all"
    timestep_fraction: float | None = Field(None, gt=0, le=1, description="share of the sampler's timesteps "
                                            "trained; None: the objective's source (nft and art 0.6, NVlabs/Sana "
                                            "Sol-RL; flow_grpo 0.99, yifan123/flow_grpo), recorded in the run's "
                                            "config")
    micro_batch: int = Field(192, ge=1, description="samples per forward/backward")
    shuffle_rewards: bool = Field(False, description="control run: permute each prompt's rewards")
    nft: NFTConfig = NFTConfig()
    art: ARTConfig = ARTConfig()
    grpo: GRPOConfig = GRPOConfig()
    decay: DecayConfig = DecayConfig()


class TrainerConfig(BaseModel):
    """What the single-process trainer and the learner actor read; `cluster.config.schema.SolRLConfig` adds the
    `cluster` section and the rules that involve it. Validation checks `TRAINER_RULES` once every field is valid."""

    model_config = ConfigDict(extra="forbid")

    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    sampler: SamplerConfig = SamplerConfig()
    explore: ExploreConfig = ExploreConfig()
    reward: RewardConfig = RewardConfig()
    prompts: PromptConfig = PromptConfig()
    learner: LearnerConfig = LearnerConfig()
    training: TrainingConfig = TrainingConfig()
    eval: EvalConfig = EvalConfig()
    logging: LoggingConfig = LoggingConfig()

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        for old, new in RENAMED_KEYS.items():
            section, _, key = old.partition(".")
            if isinstance(data, dict) and isinstance(data.get(section), dict) and key in data[section]:
                raise rule_error((old,), f"{old} was renamed {new}; write {new}: {data[section][key]}")
        return data

    @property
    def explore_solver(self) -> Solver:
        """The solver the explorers sample with: `explore.solver`, or the sampler's when that is None (the paper
        explores with the solver it regenerates with). The one place that decides it; read this rather than
        `explore.solver`, which a config built without validation (`model_copy`) may leave None."""
        return self.explore.solver if self.explore.solver is not None else self.sampler.solver

    @model_validator(mode="after")
    def _record_explore_solver(self) -> TrainerConfig:
        # Validation writes `explore_solver` into the tree, so the run's config.yaml names the solver it explored
        # with and a resume keeps it. A new section rather than the given one changed: pydantic keeps a model
        # instance handed to it, which the caller may still hold or pass on.
        if self.explore.solver is None:
            self.explore = self.explore.model_copy(update={"solver": self.explore_solver})
        return self

    @model_validator(mode="after")
    def _record_objective_defaults(self) -> TrainerConfig:
        # As the explore solver: the objective's source defaults that depend on other sections are written
        # into the tree, so config.yaml says which KL weight and EMA interval the run trained with.
        if self.training.ema_every is None:
            every = OBJECTIVE_DEFAULTS[self.learner.objective].ema_every
            self.training = self.training.model_copy(update={"ema_every": every})
        if self.learner.timestep_fraction is None:
            fraction = OBJECTIVE_DEFAULTS[self.learner.objective].timestep_fraction
            self.learner = self.learner.model_copy(update={"timestep_fraction": fraction})
        if self.learner.grpo.kl_weight is None:
            names = list(self.reward.weights)
            weight = GRPO_KL_WEIGHTS.get(names[0], GRPO_KL_WEIGHT) if len(names) == 1 else GRPO_KL_WEIGHT
            grpo = self.learner.grpo.model_copy(update={"kl_weight": weight})
            self.learner = self.learner.model_copy(update={"grpo": grpo})
        return self

    @model_validator(mode="after")
    def _check_trainer_rules(self) -> TrainerConfig:
        TRAINER_RULES.enforce(self)
        return self


# ---- the rules across the trainer's sections, in the order they are checked ----------------------------
@TRAINER_RULES.rule
def _kept_checkpoints_are_written_ones(config: TrainerConfig) -> Problem | None:
    run = config.run
    if run.keep_every and (not run.checkpoint_every or run.keep_every % run.checkpoint_every):
        return ("run.keep_every", "run.checkpoint_every"), (
            f"run.keep_every ({run.keep_every}) must be a multiple of run.checkpoint_every ({run.checkpoint_every}): "
            "a kept checkpoint is a copy of one the run writes; set run.keep_every to a multiple of it")
    return None


@TRAINER_RULES.rule
def _keep_within_candidates(config: TrainerConfig) -> Problem | None:
    p = config.prompts
    if p.keep > p.candidates:
        return ("prompts.keep", "prompts.candidates"), (
            f"prompts.keep ({p.keep}) must be <= prompts.candidates ({p.candidates}): "
            "keep is how many of the candidates are regenerated"
        )
    return None


# Objectives whose update must start from the sampling policy itself (no EMA lag): why, in the message.
SAMPLES_FROM_THETA_OLD = {
    "art": "the target, the trust region and the restoration all refer to the policy at the iteration's start, "
           "which must be the sampling policy (ART replaces the EMA-lagged sampler)",
    "flow_grpo": "PPO's ratio compares θ with the policy that sampled, which an EMA-lagged θ_old is not",
}


@TRAINER_RULES.rule
def _objective_trains_on_policy(config: TrainerConfig) -> Problem | None:
    objective, decay = config.learner.objective, config.learner.decay.type
    if objective in SAMPLES_FROM_THETA_OLD and decay != 0:
        return ("learner.objective", "learner.decay.type"), (
            f"learner.objective ({objective}) needs learner.decay.type = 0 (given {decay}): "
            f"{SAMPLES_FROM_THETA_OLD[objective]}; set learner.decay.type=0")
    return None


@TRAINER_RULES.rule
def _halving_cuts_before_the_end(config: TrainerConfig) -> Problem | None:
    explore = config.explore
    if explore.schedule == "halving" and not explore.halving_steps < explore.steps:
        return ("explore.halving_steps", "explore.steps"), (
            f"explore.halving_steps ({explore.halving_steps}) must be < explore.steps ({explore.steps}): the "
            "cut comes before the pool finishes; lower halving_steps or use explore.schedule=fixed")
    return None


@TRAINER_RULES.rule
def _halving_survivors_cover_the_kept(config: TrainerConfig) -> Problem | None:
    p, explore = config.prompts, config.explore
    if explore.schedule == "halving" and not p.keep <= explore.halving_survivors <= p.candidates:
        return ("explore.halving_survivors", "prompts.keep", "prompts.candidates"), (
            f"explore.halving_survivors ({explore.halving_survivors}) must lie between prompts.keep ({p.keep}) "
            f"and prompts.candidates ({p.candidates}): the survivors are what selection picks from")
    return None


@TRAINER_RULES.rule
def _halving_needs_best_worst_sol_rl(config: TrainerConfig) -> Problem | None:
    learner = config.learner
    if config.explore.schedule == "halving" and (learner.selection != "best_worst" or learner.algorithm != "sol_rl"):
        return ("explore.schedule", "learner.selection", "learner.algorithm"), (
            f"explore.schedule (halving) needs learner.algorithm = sol_rl and learner.selection = best_worst "
            f"(given {learner.algorithm}, {learner.selection}): it keeps the two ends of the "
            "ranking, which only best_worst selection of a low-precision pool uses")
    return None


@TRAINER_RULES.rule
def _spread_first_chunk_covers_the_kept(config: TrainerConfig) -> Problem | None:
    p, explore = config.prompts, config.explore
    if explore.schedule == "spread" and not p.keep <= explore.spread_first < p.candidates:
        return ("explore.spread_first", "prompts.keep", "prompts.candidates"), (
            f"explore.spread_first ({explore.spread_first}) must be >= prompts.keep ({p.keep}) and < "
            f"prompts.candidates ({p.candidates}): the first chunk is the smallest pool selection picks from, "
            "and the rest is what a wide prompt adds; set explore.spread_first in that range")
    return None


@TRAINER_RULES.rule
def _spread_needs_sol_rl(config: TrainerConfig) -> Problem | None:
    algorithm = config.learner.algorithm
    if config.explore.schedule == "spread" and algorithm != "sol_rl":
        return ("explore.schedule", "learner.algorithm"), (
            f"explore.schedule (spread) needs learner.algorithm = sol_rl (given {algorithm}): only Sol-RL ranks "
            "a low-precision pool and regenerates what it keeps; set learner.algorithm=sol_rl or "
            "explore.schedule=fixed")
    return None


@TRAINER_RULES.rule
def _pairwise_keeps_two(config: TrainerConfig) -> Problem | None:
    keep = config.prompts.keep
    if config.learner.art.pairwise and keep != 2:
        return ("learner.art.pairwise", "prompts.keep"), (
            f"learner.art.pairwise (true) needs prompts.keep = 2 (given {keep}): pairwise scores compare one "
            "winner with one loser per prompt; set prompts.keep=2 or learner.art.pairwise=false"
        )
    return None

"""The learner's sections of the config (which algorithm of the paper, which objective, how it trains) and
`TrainerConfig`, the tree a trainer needs: every section but the cluster's (cluster/ extends it)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from diffusion.config import ExploreConfig, ModelConfig, SamplerConfig
from diffusion.prompts import PromptConfig
from learner.advantages import AdvantageMode
from learner.algorithms import Algorithm
from learner.objectives import Objective
from learner.schedules import DecayConfig
from learner.selection import SelectionMode
from learner.training_state import TrainingConfig
from rewards.config import RewardConfig

# A rule of the config that a field's own type cannot say; `cluster.config` prints it with the preset
# line of the fields it names.
RULE_ERROR = "cross_field"

# Keys that were renamed: the old spelling fails with the new one in the message.
RENAMED_KEYS: dict[str, str] = {"learner.family": "learner.algorithm"}


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "embedded"
    seed: int = Field(0, ge=0, description="every seed of the run derives from it")
    iterations: int = Field(20, ge=0)
    checkpoint_every: int = Field(5, ge=0, description="iterations between checkpoints; 0: only at the end")
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


class NFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    beta: float = Field(1.0, gt=0)
    adv_clip_max: float = Field(5.0, gt=0)
    kl_weight: float = Field(1e-4, ge=0)


class ARTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    guidance_scale: float = Field(1.0, gt=0, description="η in v* = v_start − η·G(c)")
    restore_weight: float = Field(1.0, ge=0, description="λ of the second window's restoration")
    trust_threshold: float = Field(1e-5, gt=0, description="δ of the trust-region mask (SDE KL)")
    noise_level: float = Field(0.7, gt=0, description="a of the ODE→SDE conversion")
    pairwise: bool = Field(False, description="replace rewards by winner 1 / loser 0 / tie 0.5 (K = 2)")


class LearnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    algorithm: Algorithm = Field("sol_rl", description="the paper's variant: what is explored, what is trained on")
    objective: Objective = "nft"
    selection: SelectionMode = "best_worst"
    advantage_mode: AdvantageMode = "all"
    timestep_fraction: float = Field(0.6, gt=0, le=1, description="share of the sampler's timesteps trained")
    micro_batch: int = Field(192, ge=1, description="samples per forward/backward")
    shuffle_rewards: bool = Field(False, description="control run: permute each prompt's rewards")
    nft: NFTConfig = NFTConfig()
    art: ARTConfig = ARTConfig()
    decay: DecayConfig = DecayConfig()


class TrainerConfig(BaseModel):
    """What the single-process trainer and the learner actor read; `cluster.config.SolRLConfig` adds the
    `cluster` section and the rules across sections."""

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

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        for old, new in RENAMED_KEYS.items():
            section, _, key = old.partition(".")
            if isinstance(data, dict) and isinstance(data.get(section), dict) and key in data[section]:
                raise PydanticCustomError(RULE_ERROR, "{message}", {
                    "message": f"{old} was renamed {new}; write {new}: {data[section][key]}", "fields": (old,)})
        return data

    @model_validator(mode="after")
    def _explore_solver(self) -> TrainerConfig:
        # The paper explores with the solver it regenerates with, unless told otherwise.
        if self.explore.solver is None:
            self.explore.solver = self.sampler.solver
        return self

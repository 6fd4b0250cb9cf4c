"""The learner's sections of the config (which family of the paper, which objective, how it trains) and
`TrainerConfig`, the tree a trainer needs: every section but the cluster's (cluster/ extends it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from diffusion.config import ExploreConfig, ModelConfig, SamplerConfig
from diffusion.prompts import PromptConfig
from learner.schedules import DecayConfig
from learner.training_state import TrainingConfig
from rewards.config import RewardConfig

Family = Literal["diffusionnft", "naive_scaling", "naive_quant", "sol_rl"]
FAMILIES: tuple[str, ...] = ("diffusionnft", "naive_scaling", "naive_quant", "sol_rl")


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

    family: Family = "sol_rl"
    objective: Literal["nft", "art"] = "nft"
    selection: Literal["best_worst", "random", "mean_deviation", "extremes_random"] = "best_worst"
    advantage_mode: Literal["all", "positive_only", "negative_only", "one_only", "binary"] = "all"
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

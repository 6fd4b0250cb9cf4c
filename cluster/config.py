"""The run's configuration tree, composed from the sections each package owns.

    config = load_config("configs/embedded.yaml", ["explore.precision=fp8", "run.seed=3"])

Invalid input fails here, before any model loads or any actor starts, with the field path, what
was given and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from diffusion.config import ExploreConfig, ModelConfig, SamplerConfig
from diffusion.prompts import PromptConfig
from learner.config import EvalConfig, LearnerConfig, RunConfig
from learner.training_state import TrainingConfig
from rewards.config import RewardConfig


class ActorResources(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0, description="on a CPU-only cluster, 0 (logical resources stand in)")
    threads: int = Field(1, ge=1, description="torch CPU threads inside the actor")


class ExplorersConfig(ActorResources):
    count: int = Field(1, ge=1, description="explorer actors; scales independently of the learner")


class ScorersConfig(ActorResources):
    count: int = Field(0, ge=0, description="RewardScorer actors; 0: explorers score on their own device")


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(None, description="None: RAY_ADDRESS if set (ray job submit), else a local Ray")
    mode: Literal["sync", "async"] = Field("sync", description="async: explorers run ahead of the learner")
    max_policy_lag: int = Field(1, ge=0, description="async: drop groups explored more versions ago than this")
    codec: Literal["auto", "dense", "nvfp4", "lora"] = Field(
        "auto", description="auto: nvfp4 for NVFP4 engines; lora ships only the sampling adapter")
    placement_strategy: Literal["PACK", "SPREAD"] = "PACK"
    explorers: ExplorersConfig = ExplorersConfig()
    learner: ActorResources = ActorResources()
    scorers: ScorersConfig = ScorersConfig()


class SolRLConfig(BaseModel):
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
    cluster: ClusterConfig = ClusterConfig()

    @model_validator(mode="after")
    def _check_shapes(self) -> SolRLConfig:
        if self.prompts.keep > self.prompts.candidates:
            raise ValueError(
                f"prompts.keep ({self.prompts.keep}) must be <= prompts.candidates ({self.prompts.candidates})"
            )
        if self.learner.art.pairwise and self.prompts.keep != 2:
            raise ValueError("learner.art.pairwise needs prompts.keep=2 (one winner, one loser per prompt)")
        return self


class ConfigError(ValueError):
    """A configuration problem, stated with the field path and the fix."""


def apply_override(tree: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"--set {override!r}: write it as key.path=value, e.g. explore.precision=fp8")
    key, raw = override.split("=", 1)
    value = yaml.safe_load(raw) if raw else ""
    node = tree
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {override!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        path = ".".join(str(p) for p in item["loc"]) or "(top level)"
        given = item.get("input")
        if item["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown field (given {given!r}); check the spelling against the docs")
        else:
            lines.append(f"{path}: {item['msg']} (given {given!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def parse_config(tree: dict[str, Any]) -> SolRLConfig:
    try:
        return SolRLConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> SolRLConfig:
    """Read a YAML preset (or the defaults), apply `key.path=value` overrides, validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file {file} does not exist; presets live in configs/")
        tree = yaml.safe_load(file.read_text()) or {}
        if not isinstance(tree, dict):
            raise ConfigError(f"{file}: the top level must be a mapping of sections")
    for override in overrides or []:
        apply_override(tree, override)
    return parse_config(tree)
